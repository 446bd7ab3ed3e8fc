"""Skip-trigram tables, copying scores and the bug finder against brute force and planted heads."""

import pytest
import torch

from attncircuits import ModelConfig, Transformer
from attncircuits.analysis.circuits.copying import copying_summary, eigen_copying_score
from attncircuits.analysis.circuits.factored import full_ov_circuit, full_qk_circuit
from attncircuits.analysis.circuits.skip_trigrams import (
    SkipTrigramRow,
    find_skip_trigram_bugs,
    resolve_tokens,
    skip_trigram_effects,
    top_skip_trigrams,
)
from attncircuits.checkpoints.pretrained import load_pretrained
from attncircuits.data import token_str

V = 20


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, d_vocab=50, n_ctx=16))


def brute_force_scores(model, layer, n_keys):
    """score[h, s, d, o] over every triple, from the dense circuits."""
    qk = full_qk_circuit(model, layer).dense()
    ov = full_ov_circuit(model, layer).dense()
    qk = qk - qk.mean(-1, keepdim=True)
    ov = ov - ov.mean(-1, keepdim=True)
    attn = qk.exp() / (qk.exp() + n_keys - 1)  # [h, d, s]
    return attn.transpose(-2, -1)[..., :, :, None] * ov[..., :, None, :]  # [h, s, d, o]


@pytest.mark.parametrize("layer", [0, 1])
def test_top_skip_trigrams_match_brute_force(model, layer):
    st = top_skip_trigrams(model, layer, k=7)
    full = brute_force_scores(model, layer, n_keys=8)
    ref = full.flatten(1).topk(7, dim=-1).values
    torch.testing.assert_close(st.score, ref, rtol=1e-4, atol=1e-5)
    for h in range(4):
        s, d, o = st.triples(h).T
        torch.testing.assert_close(full[h, s, d, o], st.score[h], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(st.score, st.attn * st.ov)


def test_top_skip_trigrams_on_a_subset(model):
    sub = torch.tensor([3, 5, 7, 11, 13, 17, 19, 23, 29, 31])
    st = top_skip_trigrams(model, 0, k=5, heads=[1, 3], tokens=sub, n_keys=4)
    full = brute_force_scores(model, 0, n_keys=4)[[1, 3]][:, sub][:, :, sub][:, :, :, sub]
    torch.testing.assert_close(st.score, full.flatten(1).topk(5, dim=-1).values, rtol=1e-4, atol=1e-5)
    assert set(st.source.flatten().tolist()) <= set(sub.tolist())
    assert set(st.out.flatten().tolist()) <= set(sub.tolist())
    with pytest.raises(IndexError, match=r"has heads \[1, 3\]"):
        st.triples(0)


def planted(copy_sign=1.0):
    """A 1-layer model whose head 0 plants two skip-trigrams on source 1:
    destinations 2 and 3 attend to 1; attending to 1 raises outputs 4 and 5 (and 1 itself)."""
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=2, d_head=V, d_vocab=V, n_ctx=16)
    m = Transformer(cfg)
    with torch.no_grad():
        m.W_E.copy_(10 * torch.eye(32)[:V])
        m.W_U.copy_(torch.eye(32)[:, :V] / 10)
        b = m.blocks[0]
        for w in (b.W_Q, b.W_K, b.W_V, b.W_O):
            w.zero_()
        b.W_Q[0, 2, 0] = b.W_Q[0, 3, 0] = 1.0  # destinations 2, 3 ...
        b.W_K[0, 1, 0] = 1.0  # ... look for source 1
        b.W_V[0, 1, 0] = 1.0
        b.W_O[0, 0, 4] = b.W_O[0, 0, 5] = 5.0  # source 1 raises outputs 4 and 5
        b.W_O[0, 0, 1] = 2.0 * copy_sign
        # head 1: a pure copying head (OV = identity on tokens) with uniform attention
        b.W_V[1] = torch.eye(32)[:, :V] / 10
        b.W_O[1] = torch.eye(32)[:V] * 10 * copy_sign
    return m


def test_planted_skip_trigrams_found_and_used():
    m = planted()
    st = top_skip_trigrams(m, 0, k=4, heads=[0])
    top = {tuple(t) for t in st.triples(0).tolist()}
    assert top == {(1, 2, 4), (1, 2, 5), (1, 3, 4), (1, 3, 5)}
    contexts = torch.randint(6, V, (6, 10), generator=torch.Generator().manual_seed(0))
    eff = skip_trigram_effects(m, torch.tensor([[1, 2, 4], [1, 3, 5], [6, 2, 4], [1, 7, 4]]), contexts)
    assert eff.shape == (4, 6)
    assert (eff[:2] > 2).all()  # the planted triples raise their output
    assert eff[2].abs().max() < 0.5 and eff[3].abs().max() < 0.5  # wrong source / wrong destination do not
    near = skip_trigram_effects(m, torch.tensor([[1, 2, 4]]), contexts, gap=1)
    assert (near > 2).all()
    with pytest.raises(ValueError, match=r"gap must be in 1\.\.9"):
        skip_trigram_effects(m, torch.tensor([[1, 2, 4]]), contexts, gap=10)


def test_bug_finder_on_planted_head():
    m = planted()
    counts = torch.zeros(V, V, dtype=torch.long)
    counts[2, 4] = 50  # "keep … in → mind": the bigram "in mind" occurs
    counts[3, 5] = 30  # "keep … at → bay": "at bay" occurs; "in bay" and "at mind" never
    bugs = find_skip_trigram_bugs(m, 0, counts, k=4, min_count=5)
    unwanted = {(b.head, b.source, b.dest1, b.out2) for b in bugs}
    assert unwanted == {(0, 1, 2, 5), (0, 1, 3, 4)}
    bug = next(b for b in bugs if b.dest1 == 2)
    assert (bug.out1, bug.dest2, bug.count11, bug.count22) == (4, 3, 50, 30) and bug.predicted > 0.5
    contexts = torch.randint(6, V, (6, 10), generator=torch.Generator().manual_seed(0))
    eff = skip_trigram_effects(m, bug.triples, contexts).mean(1)
    assert eff[2] > 2  # the unwanted output really rises in the model's logits
    counts[2, 5] = 1  # once "in bay" occurs, it is no longer a bug
    assert (0, 1, 2, 5) not in {(b.head, b.source, b.dest1, b.out2) for b in find_skip_trigram_bugs(m, 0, counts, k=4)}


def test_copying_summary_on_copying_and_anticopying_heads():
    cs = copying_summary(planted(1.0), 0, k=3, n_shuffles=10)
    assert cs.eigen_score[1] > 0.99 and cs.self_topk[1] == 1.0 and cs.diagonal_z[1] > 3
    assert cs.copying.tolist()[1] == 1
    anti = copying_summary(planted(-1.0), 0, k=3, n_shuffles=10)
    assert anti.eigen_score[1] < -0.99 and anti.self_topk[1] == 0.0 and anti.diagonal_z[1] < -3
    assert anti.copying.tolist()[1] == 0


def test_copying_summary_matches_dense(model):
    cs = copying_summary(model, 1, k=5, n_shuffles=5)
    raw = full_ov_circuit(model, 1).dense()
    ov = raw - raw.mean(-1, keepdim=True)  # rows centred over the outputs
    for dense, ours in [(ov, cs.eigen_score), (raw, cs.eigen_score_raw)]:
        want = eigen_copying_score(torch.linalg.eigvals(dense.double())).float()
        torch.testing.assert_close(ours, want, rtol=1e-3, atol=1e-3)
    assert (cs.eigen_score - cs.eigen_score_raw).abs().max() > 0.01  # centring changes the spectrum
    z = (ov.diagonal(dim1=-2, dim2=-1) - ov.mean(-1)) / ov.std(-1, unbiased=False)
    torch.testing.assert_close(cs.diagonal_z, z.mean(-1), rtol=1e-3, atol=1e-3)
    self_top = (ov.topk(5, dim=-1).indices == torch.arange(50)[:, None]).any(-1).float().mean(-1)
    torch.testing.assert_close(cs.self_topk, self_top)
    assert (cs.shuffled_max >= 0).all() and cs.eigenvalues.shape == (4, 8)


def test_eigen_copying_score_range():
    lam = torch.tensor([[1 + 0j, 2 + 0j], [-1 + 0j, -3 + 0j], [1j, -1j]])
    torch.testing.assert_close(eigen_copying_score(lam), torch.tensor([1.0, -1.0, 0.0]))


class FakeTokenizer:
    def __init__(self):
        self.vocab = {"a": 1, "b": 2, " c": 3}

    def encode(self, text):
        class E:
            ids = [self.vocab[text]] if text in self.vocab else [self.vocab.get(ch, 9) for ch in text]

        return E()

    def get_vocab_size(self):
        return 50

    def decode(self, ids, skip_special_tokens=False):
        inv = {v: k for k, v in self.vocab.items()}
        return "".join(inv.get(i, "?") for i in ids)


def test_bad_inputs(model):
    with pytest.raises(IndexError, match=r"valid layers: 0\.\.1"):
        top_skip_trigrams(model, 2)
    with pytest.raises(IndexError, match=r"valid heads: 0\.\.3"):
        top_skip_trigrams(model, 0, heads=[4])
    with pytest.raises(IndexError, match="valid layers"):
        copying_summary(model, -1)
    with pytest.raises(ValueError, match=r"dense \[50, 50\] table"):
        find_skip_trigram_bugs(model, 0, torch.zeros(10, 10))
    with pytest.raises(ValueError, match=r"triples must be \[n, 3\]"):
        skip_trigram_effects(model, torch.tensor([[1, 2]]), torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        skip_trigram_effects(model, torch.tensor([[1, 2, 99]]), torch.zeros(2, 8, dtype=torch.long))
    zero = Transformer(ModelConfig(n_layers=0, d_model=8, n_heads=2, d_head=4, d_vocab=10, n_ctx=4))
    with pytest.raises(ValueError, match="no attention layers"):
        top_skip_trigrams(zero, 0)


def test_resolve_tokens_lists_every_unknown():
    tok = FakeTokenizer()
    assert resolve_tokens(tok, ["a", "·c", 2], 50).tolist() == [1, 3, 2]
    with pytest.raises(ValueError, match=r"2 of the 4 tokens.*'xy'.*id 77"):
        resolve_tokens(tok, ["a", "xy", 77, "b"], 50)
    with pytest.raises(ValueError, match="empty"):
        resolve_tokens(tok, [], 50)


def test_head_explorer_and_one_layer_figures(model):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attncircuits.show import plotting
    from attncircuits.show.widgets import head_explorer

    tok = FakeTokenizer()
    ex = head_explorer(model, tok, [1, 2, "·c"], k=3)  # outside IPython: the static first state only
    assert ex.values == {"layer": 0, "head": 0}
    fig = ex.render(layer=1, head=3)
    assert (
        fig.axes[0].get_title() == "top skip-trigrams (whole vocabulary)"
        and len(fig.axes[0].tables[0].get_celld()) == 4 * 4
    )
    assert [t.get_text() for t in fig.axes[1].get_xticklabels()] == ["a", "b", "·c"]
    plt.close("all")
    with pytest.raises(ValueError, match="not in the vocabulary"):
        head_explorer(model, tok, ["a", "zz"])
    with pytest.raises(IndexError, match="valid layers"):
        head_explorer(model, tok, ["a"], layers=[2])
    cs = copying_summary(model, 0, n_shuffles=2)
    fig = plotting.eigenvalue_planes(
        cs.eigenvalues, cs.eigen_score, [f"h{h}" for h in range(4)], cs.copying.bool().tolist()
    )
    assert fig.axes[2].get_title().startswith("h2: ")
    with pytest.raises(ValueError, match="one of each per head"):
        plotting.eigenvalue_planes(cs.eigenvalues, cs.eigen_score[:2], ["a"] * 4)
    with pytest.raises(ValueError, match="2 position and 3 term labels"):
        plotting.path_terms_heatmap(torch.zeros(2, 4), ["a", "b", "c"], ["x", "y"])
    with pytest.raises(ValueError, match="3 cells for 2 columns"):
        plotting.skip_trigram_table_html([("a", "b", 1.0)], ["x", "y"])
    plt.close("all")


def test_rows_are_typed_records_that_match_the_table(model):
    """Rooms pass skip-trigram rows by field name, not by position: each row's fields are the
    table's tokens (as strings) and numbers for that head and rank."""
    tok = load_pretrained("attn-only-1l").tokenizer
    st = top_skip_trigrams(model, 0, k=4, heads=[1, 3])
    for h, i in ((1, 0), (3, 1)):
        rows = st.rows(tok, h)
        assert len(rows) == 4 and all(isinstance(r, SkipTrigramRow) for r in rows)
        assert len(st.rows(tok, h, n=2)) == 2
        for j, r in enumerate(rows):
            assert r.source == token_str(tok, int(st.source[i, j]))
            assert r.dest == token_str(tok, int(st.dest[i, j]))
            assert r.out == token_str(tok, int(st.out[i, j]))
            assert (r.attn, r.ov, r.score) == (float(st.attn[i, j]), float(st.ov[i, j]), float(st.score[i, j]))
        assert [r.score for r in rows] == sorted((r.score for r in rows), reverse=True)
        assert f"{rows[0].score:6.2f}" in st.format(tok, h, n=1)
