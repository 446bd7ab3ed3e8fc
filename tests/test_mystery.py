"""Chapter 12's mysteries and grader: the tasks follow their rules, a tiny mystery trains and is
refused when its circuit is not the intended one, the shipped ground truth is what the
measurements give, the true circuit of each mystery passes and at least ten wrong ones fail (each
with a line saying what was measured), bad input is refused in one line, and the grader passes
chapters 5-6's circuit of the shipped 2-layer model and fails it with a wrong head swapped in."""

from __future__ import annotations

import json

import pytest
import torch

from attncircuits.analysis import circuit_check as cc
from attncircuits.analysis.hypothesis import from_truth
from attncircuits.checkpoints import mysteries as store
from attncircuits.core.heads import head_name
from attncircuits.course import grader
from attncircuits.data.tasks import Grammar, Recall, Repeated, task_from_dict, task_to_dict
from attncircuits.models.transformer import ModelConfig
from attncircuits.train import mystery as M

MYSTERIES = store.mystery_names()


# ---- the tasks -------------------------------------------------------------------------------------
def test_the_grammar_answers_follow_the_cue_and_the_rows_trigger():
    task = Grammar()
    b = task.batch(32, seed=5)
    table = task.table()
    assert sorted(table[0].tolist()) == task.answer_tokens and not torch.equal(table[0], table[1])
    for i in range(32):
        row = b.tokens[i]
        (trig_pos,) = [p for p, t in enumerate(row.tolist()) if t in task.triggers]
        trig = task.triggers.index(int(row[trig_pos]))
        for p in b.scored[i].nonzero().flatten().tolist():
            assert p > trig_pos and int(row[p + 1]) == int(table[task.cues.index(int(row[p])), trig])


@pytest.mark.parametrize("offset", [-1, 1, 2])
def test_a_recall_answer_is_the_lists_token_offset_places_on(offset):
    task = Recall(offset=offset)
    b = task.batch(32, seed=1)
    for i in range(32):
        row = b.tokens[i].tolist()
        sep = row.index(1)
        keys = row[1:sep]
        assert len(set(keys)) == len(keys) and task.min_keys <= len(keys) <= task.max_keys
        for p in b.scored[i].nonzero().flatten().tolist():
            assert p > sep and row[p + 1] == keys[keys.index(row[p]) + offset]
    assert (b.answers[b.scored] >= 2).all() and (b.answers[~b.scored] == -1).all()


def test_tasks_refuse_impossible_settings_naming_the_bound():
    with pytest.raises(ValueError, match="d_vocab >= "):
        Grammar(d_vocab=12)
    with pytest.raises(ValueError, match="offset"):
        Recall(offset=0)
    with pytest.raises(ValueError, match="n_ctx"):
        Repeated(d_vocab=10, n_ctx=8, seq_len=4)
    with pytest.raises(ValueError, match="the tasks are grammar, recall, repeated"):
        task_from_dict({"kind": "nope"})
    assert task_from_dict(json.loads(json.dumps(task_to_dict(Recall(offset=-1))))) == Recall(offset=-1)


# ---- training a tiny mystery -------------------------------------------------------------------------
TINY_TASK = Recall(d_vocab=16, n_ctx=16, min_keys=4, max_keys=6, offset=1)


def _tiny_spec(intended):
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=16, n_ctx=16)
    return M.MysterySpec(TINY_TASK, cfg, M._train_cfg(40), intended)


def test_a_tiny_mystery_trains_and_its_loss_falls():
    spec = _tiny_spec({})
    model, history = M.train_task(spec.model, spec.task, spec.train, progress=False)
    assert history["val_loss"][-1] < history["val_loss"][0] - 0.1, history["val_loss"]
    assert 0 <= history["val_accuracy"][-1] <= 1


def test_a_mystery_whose_circuit_is_not_the_intended_one_is_not_written(tmp_path, monkeypatch):
    monkeypatch.setitem(M.MYSTERIES, "tiny", _tiny_spec({"roles": ["skip-trigram"], "kinds": []}))
    with pytest.raises(M.MysteryNotFormed, match="training did not give the intended circuit") as err:
        M.train_mystery("tiny", tmp_path, progress=False, tries=2)
    assert not (tmp_path / "tiny").exists()
    assert "no seed of 0-1 was accepted (seed 0: " in str(err.value) and "; seed 1: " in str(err.value)


def test_a_mystery_whose_derived_circuit_fails_the_grader_is_retrained_with_the_next_seed(tmp_path, monkeypatch):
    """The trainer's acceptance: the derived truth must pass the grader and the chapter's claims
    hold; a refused seed is said, and the next one trained."""
    monkeypatch.setitem(M.MYSTERIES, "tiny", _tiny_spec({}))
    monkeypatch.setattr(M, "intended_problem", lambda truth, intended: None)
    said, seen = [], []

    def accept(name, model, task, truth):
        seen.append(truth["seed"])
        return "the derived circuit fails the grader (a test's refusal)" if len(seen) == 1 else None

    monkeypatch.setattr(M, "accept_problem", accept)
    path = M.train_mystery("tiny", tmp_path, progress=False, log=said.append, seed=5)
    m = store.load_mystery("tiny", tmp_path)
    assert seen == [5, 6] and m.ground_truth["seed"] == 6 and m.checkpoint.config["train"]["seed"] == 6
    assert m.checkpoint.config["refused"] == ["seed 5: the derived circuit fails the grader (a test's refusal)"]
    assert any("seed 5, not accepted: the derived circuit fails the grader" in x and "retraining with seed 6" in x
               for x in said), said
    assert path == tmp_path / "tiny"


def test_the_acceptance_grades_the_derived_truth_and_checks_the_chapters_claims():
    from attncircuits.analysis.mystery_claims import accept_problem, claim_problems
    for name in MYSTERIES:
        m = store.load_mystery(name)
        assert accept_problem(name, m.model, m.task, m.ground_truth) is None, name
    m = store.load_mystery("mystery-3")
    wrong = dict(m.ground_truth, compositions=[])  # a derived circuit the grader fails
    assert "the derived circuit fails the grader (composition: " in accept_problem("mystery-3", m.model, m.task, wrong)
    m1 = store.load_mystery("mystery-1")  # mystery 1's model under mystery 3's claims: they fail
    assert claim_problems("mystery-3", m1.model, m1.task) == [
        "previous-token heads in layer 0: 0, duplicate-token heads in layer 1: 0"]


def test_a_written_mystery_loads_with_its_task_and_ground_truth(tmp_path, monkeypatch):
    monkeypatch.setitem(M.MYSTERIES, "tiny", _tiny_spec({}))
    monkeypatch.setattr(M, "intended_problem", lambda truth, intended: None)
    monkeypatch.setattr(M, "accept_problem", lambda *a: None)
    path = M.train_mystery("tiny", tmp_path, progress=False)
    m = store.load_mystery("tiny", tmp_path)
    assert m.task == TINY_TASK and m.ground_truth["steps"] == 40 and path == tmp_path / "tiny"
    assert m.tokenizer.id_to_token(1) == "SEP" and m.model.cfg.d_vocab == 16
    with pytest.raises(KeyError, match="the mysteries are tiny"):
        store.load_mystery("nope", tmp_path)


def test_the_command_names_the_mysteries_when_given_another(capsys):
    assert M.main(["mystery-9"]) == 2
    assert "the mysteries are mystery-1, mystery-2, mystery-3" in capsys.readouterr().err


@pytest.mark.parametrize("where, said", [
    ("a-file", "is a file, not a folder"),
    ("a-file/below", "is not a folder this user can write"),
    ("users", "a folder with files this program did not write"),
    ("loop", "is a symbolic link that does not resolve (a loop)"),
])
def test_the_command_refuses_an_output_it_cannot_write_before_training(tmp_path, capsys, monkeypatch, where, said):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "users" / "mystery-1").mkdir(parents=True)
    (tmp_path / "users" / "mystery-1" / "notes.txt").write_text("mine")
    monkeypatch.setattr(M, "train_mystery", lambda *a, **k: pytest.fail("trained before the output was checked"))
    assert M.main(["mystery-1", "--out", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1, err
    assert (tmp_path / "users" / "mystery-1" / "notes.txt").read_text() == "mine"


def test_a_link_to_a_missing_folder_as_out_names_the_folder_to_write(tmp_path, monkeypatch, capsys):
    (tmp_path / "link").symlink_to(tmp_path / "target")
    written = []

    def train(name, root, **kwargs):
        written.append(root)
        raise M.MysteryNotFormed("stopped here")

    monkeypatch.setattr(M, "train_mystery", train)
    assert M.main(["mystery-1", "--out", str(tmp_path / "link")]) == 1
    assert written == [tmp_path / "target"] and (tmp_path / "link").is_symlink()


# ---- a stopped `make mystery` never loses a finished mystery --------------------------------------
def _written_tiny(tmp_path, monkeypatch):
    monkeypatch.setitem(M.MYSTERIES, "tiny", _tiny_spec({}))
    monkeypatch.setattr(M, "intended_problem", lambda truth, intended: None)
    monkeypatch.setattr(M, "accept_problem", lambda *a, **k: None)
    return M.train_mystery("tiny", tmp_path, progress=False)


def test_the_ground_truth_is_part_of_the_one_save(tmp_path, monkeypatch):
    from attncircuits.core.manifest import read_manifest
    path = _written_tiny(tmp_path, monkeypatch)
    assert "ground_truth.json" in read_manifest(path)


@pytest.mark.parametrize("stop", ["while writing", "between the renames", "after the swap"])
def test_a_save_stopped_anywhere_leaves_a_whole_mystery_and_the_rerun_settles_it(tmp_path, monkeypatch, stop):
    from attncircuits.checkpoints import pretrained as P
    _written_tiny(tmp_path, monkeypatch)
    first = store.load_mystery("tiny", tmp_path).ground_truth
    real_swap, real_write = P.swap_into, P.write_checkpoint_files

    def killed_write(directory, *a, **k):
        real_write(directory, *a, **k)
        (directory / "model.safetensors").write_bytes(b"half")  # a kill during the write: an incomplete copy
        raise KeyboardInterrupt

    def killed_swap(target, new, aside, *a, **k):
        if stop == "between the renames":
            target.rename(aside)
            raise KeyboardInterrupt
        real_swap(target, new, aside, *a, **k)
        aside.mkdir(exist_ok=True)  # the old copy not yet removed
        raise KeyboardInterrupt

    monkeypatch.setattr(P, "write_checkpoint_files", killed_write if stop == "while writing" else real_write)
    monkeypatch.setattr(P, "swap_into", real_swap if stop == "while writing" else killed_swap)
    monkeypatch.setattr(P.shutil, "rmtree", lambda *a, **k: None)  # the kill also stops the tidying
    with pytest.raises(KeyboardInterrupt):
        M.train_mystery("tiny", tmp_path, progress=False, seed=3)
    monkeypatch.undo()
    assert (tmp_path / "tiny.partial").exists()
    said = store.resolve_partial("tiny", tmp_path)
    assert said and not (tmp_path / "tiny.partial").exists(), said
    m = store.load_mystery("tiny", tmp_path)  # whole: its weights, its manifest, its ground truth
    assert ("finished model" in said) == (stop == "between the renames"), said
    if stop == "while writing":
        assert m.ground_truth == first


def test_the_command_settles_a_leftover_partial_before_training_and_refuses_a_foreign_one(tmp_path, capsys,
                                                                                          monkeypatch):
    (tmp_path / "mystery-1.partial" / "final").mkdir(parents=True)
    trained = []
    monkeypatch.setattr(M, "train_mystery", lambda name, root, **k: trained.append(name) or
                        (_ for _ in ()).throw(M.MysteryNotFormed("stopped here")))
    assert M.main(["mystery-1", "--out", str(tmp_path)]) == 1
    assert trained == ["mystery-1"] and not (tmp_path / "mystery-1.partial").exists()
    assert "removed an unfinished save" in capsys.readouterr().err
    (tmp_path / "mystery-1.partial").mkdir()
    (tmp_path / "mystery-1.partial" / "notes.txt").write_text("mine")
    assert M.main(["mystery-1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds files this program did not write" in err and len(err.splitlines()) == 1, err
    assert (tmp_path / "mystery-1.partial" / "notes.txt").read_text() == "mine" and trained == ["mystery-1"]


def test_a_checkpoint_path_that_is_a_link_loop_is_named_as_one(tmp_path):
    from attncircuits.checkpoints.pretrained import load_checkpoint
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(FileNotFoundError, match="a symbolic link that does not resolve"):
        load_checkpoint(tmp_path / "loop")
    with pytest.raises(FileNotFoundError, match="not found; train one"):
        load_checkpoint(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="a symbolic link that does not resolve"):
        store.load_mystery("mystery-1", tmp_path / "loop")
    (tmp_path / "mysteries").mkdir()
    (tmp_path / "mysteries" / "mystery-1").symlink_to(tmp_path / "mysteries" / "mystery-1")
    with pytest.raises(FileNotFoundError, match="a symbolic link that does not resolve"):
        store.load_mystery("mystery-1", tmp_path / "mysteries")


# ---- the shipped mysteries ------------------------------------------------------------------------
def test_three_mysteries_are_shipped_each_a_different_kind_of_circuit():
    assert MYSTERIES == list(M.MYSTERIES) == ["mystery-1", "mystery-2", "mystery-3"]
    kinds = []
    for name in MYSTERIES:
        truth = store.load_mystery(name).ground_truth
        kinds.append((tuple(sorted(set(truth["heads"].values()))), tuple(sorted({k for *_, k in truth["compositions"]}))))
        assert truth["accuracy"] > 0.99 and truth["train_seconds"] < 600
    assert len(set(kinds)) == 3, kinds


@pytest.mark.parametrize("name", MYSTERIES)
def test_the_shipped_ground_truth_is_what_the_measurements_give(name):
    m = store.load_mystery(name)
    derived = cc.derive_circuit(m.model, m.task)
    assert derived["heads"] == m.ground_truth["heads"]
    assert sorted(map(tuple, derived["compositions"])) == sorted(map(tuple, m.ground_truth["compositions"]))
    assert M.intended_problem(m.ground_truth, M.MYSTERIES[name].intended) is None


def test_the_derived_circuit_leaves_out_a_head_no_composition_links():
    """A later head reading no head of the circuit at 3 sd (as on two retrainings of mystery 3: a
    duplicate-token head whose every composition with the previous-token heads stayed under 3 sd)
    is left out of the derived circuit, which the grader would otherwise refuse; so is an earlier
    head feeding none. The least linked goes first."""
    heads = {(0, 0): "previous-token", (0, 1): "previous-token", (1, 0): "duplicate-token", (1, 2): "duplicate-token"}
    z = {(w, r, k): -1.0 for w in [(0, 0), (0, 1)] for r in [(1, 0), (1, 2)] for k in cc.KINDS}
    z[((0, 0), (1, 0), "V")], z[((0, 1), (1, 0), "V")], z[((0, 1), (1, 2), "V")] = 6.0, 4.0, 2.1
    assert cc._unlinked(heads, z) == (1, 2)
    z[((0, 1), (1, 2), "V")] = 3.5
    assert cc._unlinked(heads, z) is None
    z[((0, 1), (1, 0), "V")], z[((0, 1), (1, 2), "V")] = 1.0, 1.0
    assert cc._unlinked(heads, z) in {(0, 1), (1, 2)}
    assert cc._unlinked({(0, 0): "skip-trigram", (0, 1): "skip-trigram"}, {}) is None  # one layer: no edges asked


def _truth(name):
    return from_truth(name, store.load_mystery(name).ground_truth)


@pytest.mark.parametrize("name", MYSTERIES)
def test_the_true_circuit_passes_and_the_grader_prints_its_numbers(name, capsys):
    result = grader.grade(_truth(name))
    out = capsys.readouterr().out
    assert result.passed and result.faithfulness >= cc.FAITHFUL and result.completeness >= cc.COMPLETE, out
    assert f"faithfulness {result.faithfulness:.2f}  completeness {result.completeness:.2f}" in out
    assert all(len(line) <= 79 for line in out.splitlines()), out


def wrong_hypotheses(name) -> list[tuple[str, dict]]:
    """At least ten wrong hypotheses built from the true one: another head, missing or wrong
    compositions, the right heads with wrong roles, a layer left out, everything named at once."""
    true = _truth(name)
    g = grader.grader_for(name)
    n_layers, n_heads = g.model.cfg.n_layers, g.model.cfg.n_heads
    heads, comps = true["heads"], true["compositions"]
    every = [head_name(l, h) for l in range(n_layers) for h in range(n_heads)]
    out = []

    def hyp(label, h, c=None):
        said = {"model": name, "heads": h, "compositions": comps if c is None else c}
        if "skip_trigrams" in true:  # each skip-trigram head named keeps its true list
            said["skip_trigrams"] = {k: v for k, v in true["skip_trigrams"].items() if h.get(k) == "skip-trigram"}
        out.append((label, said))

    idle = [x for x in every if x not in heads]
    for x in list(heads)[:2]:
        if idle:  # another head in its place, with the same role
            other = next((i for i in idle if i[0] == x[0]), idle[0])
            h = {other if k == x else k: r for k, r in heads.items()}
            c = [tuple(other if y == x else y for y in cc_[:2]) + (cc_[2],) for cc_ in comps]
            hyp(f"{other} instead of {x}", h, [cc_ for cc_ in c if int(cc_[0][0]) < int(cc_[1][0])])
    roles = sorted(set(heads.values()))
    for role in roles:  # the right heads, that role wrong
        for wrong in [r for r in cc.ROLES if r != role][: 3 if len(roles) > 1 else None]:
            hyp(f"the {role} heads as {wrong}", {k: wrong if r == role else r for k, r in heads.items()})
    for role in roles:  # one head of a role left out, with its compositions: another does its work
        of_role = [k for k, r in heads.items() if r == role]
        if len(of_role) > 1:
            x = of_role[-1]
            hyp(f"{x} left out", {k: r for k, r in heads.items() if k != x}, [c for c in comps if x not in c[:2]])
    for x in list(heads)[:2]:  # one head's role wrong
        hyp(f"{x} as copying", {**heads, x: "copying" if heads[x] != "copying" else "induction"})
    for x in list(heads)[:2]:
        hyp(f"{x} alone", {x: heads[x]}, [])
    if n_layers > 1:
        hyp("no composition", heads, [])
        readers = sorted({r for _, r, _ in comps})
        hyp(f"nothing said about {readers[0]}", heads, [c for c in comps if c[1] != readers[0]])
        for kind in [k for k in cc.KINDS if k not in {c[2] for c in comps}]:
            hyp(f"every composition as {kind}", heads, [(w, r, kind) for w, r, _ in comps])
        for layer in range(n_layers):
            hyp(f"layer {layer} only", {k: r for k, r in heads.items() if int(k[0]) == layer}, [])
        if len(roles) == 2:
            hyp("the two roles swapped", {k: roles[1 - roles.index(r)] for k, r in heads.items()})
    if "skip_trigrams" in true:  # a grammar model: each kind of wrong list of skip-trigrams
        out.extend(x for x in _wrong_skip_trigrams(name, true) if x[0] != "the cue first")  # refused, not graded
    if idle:  # everything named at once: each head with its best role, copying where none fits
        best = {head_name(*h): r for h, r in cc.best_roles(g.roles).items()}
        everything = {x: best.get(x, "copying") for x in every}
        all_comps = [(w, r, k) for (w_, r_, k), z in g.z.items() if z >= cc.COMPOSES
                     for w, r in [(head_name(*w_), head_name(*r_))]]
        hyp("every head named", everything, all_comps)
    return out


def _wrong_skip_trigrams(name, true) -> list[tuple[str, dict]]:
    """Mystery 2's heads right and their skip-trigrams wrong, each kind of way: the role alone (the
    task's own name), lists swapped between the heads, one left out, one with another answer or a
    trigger its cue does not attend to, the model's grammar (or the task's table) given as the
    heads', each trigger's OV answer with every cue (the QK circuit not read), the cue first,
    empty lists."""
    g = grader.grader_for(name)
    task, names = g.task, g.task.token_names()
    lists = {k: [tuple(x) for x in v] for k, v in true["skip_trigrams"].items()}
    first, second = sorted(lists)
    out = []

    def hyp(label, trigrams):
        out.append((label, {"model": name, "heads": true["heads"], "compositions": [], "skip_trigrams": trigrams}))

    out.append(("the role alone", {"model": name, "heads": true["heads"], "compositions": []}))
    hyp("the two lists swapped", {first: lists[second], second: lists[first]})
    hyp("one skip-trigram left out", {**lists, first: lists[first][1:]})
    t, c, a = lists[first][0]
    other = next(x for x in (names[y] for y in task.answer_tokens) if x != a)
    hyp("one skip-trigram with another answer", {**lists, first: [(t, c, other)] + lists[first][1:]})
    pairs = {(x[0], x[1]) for x in lists[first]}
    t2, c2 = next((names[t], names[c]) for c in task.cues for t in task.triggers if (names[t], names[c]) not in pairs)
    hyp("a trigger its cue does not attend to", {**lists, first: lists[first] + [(t2, c2, other)]})
    grammar = cc.model_grammar(g.model, task)
    model_table = [(names[t], names[c], names[int(grammar[i, j])]) for i, c in enumerate(task.cues)
                   for j, t in enumerate(task.triggers)]
    hyp("the model's grammar as every head's", {k: model_table for k in lists})
    table = task.table()
    task_table = [(names[t], names[c], names[int(table[i, j])]) for i, c in enumerate(task.cues)
                  for j, t in enumerate(task.triggers)]
    hyp("the task's table split between the heads", {first: task_table[:6], second: task_table[6:]})
    ov_only = {k: [(t_, names[c_], a_) for t_, _, a_ in {(x[0], None, x[2]) for x in v} for c_ in task.cues]
               for k, v in lists.items()}
    hyp("each listed trigger with every cue (the QK circuit not read)", ov_only)
    hyp("the cue first", {k: [(c_, t_, a_) for t_, c_, a_ in v] for k, v in lists.items()})
    hyp("an empty list for each head", {k: [] for k in lists})
    return out


def test_the_skip_trigram_rule_fails_each_kind_of_wrong_list_saying_which_measurement():
    """Mystery 2 needs each head's skip-trigrams (read from its QK and OV circuits): the role alone,
    the task's name, fails; each wrong list fails saying the attention or the OV rank measured, or
    how many are missing, never which; the cue put first is refused in one line naming the form."""
    true = _truth("mystery-2")
    assert grader.grade(true, show=False).passed
    said = {label: grader.grade(h, show=False).failures for label, h in _wrong_skip_trigrams("mystery-2", true)}
    assert all(said.values()), [k for k, v in said.items() if not v]
    alone = said["the role alone"]
    assert len(alone) == 2 and all("is named skip-trigram with no list of what it implements" in f for f in alone)
    assert any("needs first" in f for f in said["one skip-trigram with another answer"])
    assert any("needs over 0.50 (its QK circuit)" in f for f in said["a trigger its cue does not attend to"])
    left = said["one skip-trigram left out"]
    assert len(left) == 1 and "implements 1 skip-trigram your list leaves out" in left[0], left
    assert "is no trigger" in said["the cue first"][0] and len(said["the cue first"]) == 1
    assert all(f.startswith("skip-trigrams: ") for label, fails in said.items() if label != "the cue first"
               for f in fails), said
    for label, fails in said.items():  # what was measured, never the answer: a count, no token named
        assert not any("leaves out" in f and "->" in f for f in fails), (label, fails)


@pytest.mark.parametrize("bad, says", [
    ({"skip_trigrams": {"0.0": [("T0", "cue0")]}}, "is not a skip-trigram: a skip-trigram is (trigger, cue, answer)"),
    ({"skip_trigrams": {"0.0": [("T9", "cue0", "A0")]}}, "'T9' in ('T9', 'cue0', 'A0') (head 0.0) is no token"),
    ({"skip_trigrams": {"0.0": [("A0", "cue0", "A0")]}}, "'A0' in ('A0', 'cue0', 'A0') (head 0.0) is no trigger"),
    ({"skip_trigrams": {"0.0": [("T0", "T1", "A0")]}}, "is no cue"),
    ({"skip_trigrams": {"0.0": [(1, 3, 9)]}}, "1 (int) in (1, 3, 9) (head 0.0) (cue0) is no trigger"),
    ({"skip_trigrams": {"0.0": [("T0", "cue0", "cue1")]}}, "is no answer"),
    ({"skip_trigrams": {"0.0": [(3.0, "cue0", "A0")]}}, "is no token of the task"),
    ({"skip_trigrams": {"0.0": [(True, "cue0", "A0")]}}, "is no token of the task"),
    ({"skip_trigrams": {"0.0": [(["T0"], "cue0", "A0")]}}, "is no token of the task"),
    ({"skip_trigrams": {"0.0": [("T0", "cue0", "A0"), ["T0", "cue0", "A0"]]}}, "is listed twice"),
    ({"skip_trigrams": {"0.0": "T0 cue0 A0"}}, "are a list of (trigger, cue, answer)"),
    ({"skip_trigrams": {"0.0": 3}}, "are a list of (trigger, cue, answer)"),
    ({"skip_trigrams": [("T0", "cue0", "A0")]}, "'skip_trigrams' is a dict"),
    ({"skip_trigrams": {"1.0": []}}, "has no head 1.0"),
    ({"skip_trigrams": {"0.2": []}}, "has no head 0.2"),
    ({"skip_trigrams": {(0.0, 0): []}}, "is not a head"),
    ({"heads": {"0.0": "skip-trigram", "0.1": "copying"}, "skip_trigrams": {"0.1": []}},
     "which is named copying in 'heads'"),
    ({"heads": {"0.0": "skip-trigram"}, "skip_trigrams": {"0.1": []}}, "which has no role in 'heads'"),
])
def test_bad_skip_trigrams_are_refused_in_one_line_naming_the_form(bad, says):
    h = {"model": "mystery-2", "heads": {"0.0": "skip-trigram", "0.1": "skip-trigram"}, **bad}
    result = grader.grade(h, show=False)
    assert not result.passed and len(result.failures) == 1 and says in result.failures[0], result.failures


def test_no_json_like_value_in_the_skip_trigrams_raises_a_traceback():
    import numpy as np
    values = [None, True, 0, 3, -1, 1.5, float("nan"), "", "T0", "cue0", "A0", "x", [], ["T0"], [3, 1, 9], {},
              {"a": 1}, np.int64(3), np.float32(3.0), 10**30, ("T0", "cue0", "A0")]
    g = grader.grader_for("mystery-2")
    heads = {"0.0": "skip-trigram", "0.1": "skip-trigram"}
    seen = 0
    for v in values:
        for trigrams in (v, {"0.0": v}, {"0.0": [v]}, {"0.0": [(v, "cue0", "A0")]}, {"0.0": [("T0", v, "A0")]},
                         {"0.0": [("T0", "cue0", v)]}, {v: []} if isinstance(v, (str, int, float, tuple)) else {}):
            result = g.grade({"model": "mystery-2", "heads": heads, "skip_trigrams": trigrams}, show=False)
            assert not result.passed and result.failures and all("\n" not in f for f in result.failures)
            seen += 1
    assert seen > 100


def test_skip_trigrams_by_token_id_are_the_same_claim_and_other_models_refuse_the_key():
    true = _truth("mystery-2")
    names = grader.grader_for("mystery-2").task.token_names()
    by_id = {k: [tuple(names.index(x) for x in t) for t in v] for k, v in true["skip_trigrams"].items()}
    assert grader.grade(dict(true, skip_trigrams=by_id), show=False).passed
    result = grader.grade(dict(_truth("mystery-3"), skip_trigrams={}), show=False)
    says = "'skip_trigrams' describes the skip-trigram heads of a one-layer grammar model"
    assert not result.passed and says in result.failures[0], result.failures


def test_the_skip_trigram_lists_have_no_knife_edge_on_the_shipped_mystery():
    """The module's claim: the cue's attention on a trigger is far from 0.5 and no two answers tie
    for first in a trigger's OV row, so a learner measuring the same way gets the same list."""
    from attncircuits.analysis.grammar_heads import SkipTrigrams
    g = grader.grader_for("mystery-2")
    st = SkipTrigrams(g.model, g.task)
    assert ((st.attention < 0.15) | (st.attention > 0.75)).all(), st.attention
    top = st.ov.topk(2, -1).values
    assert (top[..., 0] - top[..., 1]).min() > 0.1, top


@pytest.mark.parametrize("name", MYSTERIES)
def test_at_least_ten_wrong_hypotheses_each_fail_saying_what_was_measured(name, capsys):
    wrong = wrong_hypotheses(name)
    assert len(wrong) >= 10, [label for label, _ in wrong]
    for label, h in wrong:
        result = grader.grade(h, show=False)
        assert not result.passed, f"{name}: the wrong hypothesis '{label}' passes"
        assert result.failures and all(any(ch.isdigit() for ch in f) for f in result.failures), (label, result.failures)
        assert result.lines[-1].startswith("✗ not yet:") and "explain " in result.lines[-1] and " of the task" in result.lines[-1], result.lines


@pytest.mark.parametrize("name", MYSTERIES)
def test_a_head_left_out_is_told_without_naming_it(name):
    """Where the head left out backs up a named one (mysteries 1 and 3: two heads of a role doing
    one job), the grader says a head does a named one's work (or, where the named heads are not
    faithful without it, that the task needs heads not named); never which head it is. (Mystery 2's
    two heads each do a different half of the grammar: one left out fails faithfulness.)"""
    true = _truth(name)
    for label, h in wrong_hypotheses(name):
        if label.endswith(" left out"):
            missing = label.split()[0]
            text = "\n".join(grader.grade(h, show=False).failures)
            if name != "mystery-2":  # faithful without it: the left-out line; else faithfulness says it
                assert ("left out: without " in text and "a head you did not name does" in text
                        or "faithfulness: " in text and "the task needs heads you did not name" in text), (label, text)
            assert missing not in text, (label, text)  # never the answer
    g = grader.grader_for(name)  # the true circuit: removing its heads costs it what it costs the model
    assert cc.left_out(g.ablator, g.parse(true).heads).gap < cc.LEFT_OUT / 4


def test_a_wrong_hypothesis_is_told_what_fails_not_the_answer():
    true = _truth("mystery-3")
    wrong = dict(true, heads={k: ("induction" if r == "duplicate-token" else r) for k, r in true["heads"].items()})
    result = grader.grade(wrong, show=False)
    assert not result.passed
    text = "\n".join(result.failures)
    assert "as induction: score" in text and "duplicate-token" not in text


# ---- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MYSTERIES)
@pytest.mark.parametrize("bad, says", [
    ({"heads": {"5.0": "induction"}}, "has no head 5.0"),
    ({"heads": {"0.0": "mover"}}, "is not a role of the course; the roles are current-token"),
    ({"heads": {}}, "names no head"),
    ({"heads": {"0.0": "copying"}, "model": "OTHER"}, "this grader grades"),
    ({"heads": {"zero": "copying"}}, "a head is 'L.H'"),
    ({"heads": {"0.0": "copying"}, "roles": {}}, "its keys are model, heads, compositions"),
    # parsed strictly: nothing is truncated, rounded or coerced into a head, a role or a kind
    ({"heads": {(0.9, 1): "copying"}}, "is not a head: a head is 'L.H'"),
    ({"heads": {(0, 1.7): "copying"}}, "is not a head: a head is 'L.H'"),
    ({"heads": {(True, 0): "copying"}}, "is not a head: a head is 'L.H'"),
    ({"heads": {"0.0.1": "copying"}}, "is not a head: a head is 'L.H'"),
    ({"heads": {"0.5e0": "copying"}}, "is not a head: a head is 'L.H'"),
    ({"heads": {((0, 0),): "copying"}}, "is not a head: a head is 'L.H'"),
    ({"heads": {"0.0": ["copying"]}}, "is not a role: a role is one string"),
    ({"heads": {"0.0": {"copying": 1}}}, "is not a role: a role is one string"),
    ({"heads": {"0.0": None}}, "is not a role: a role is one string"),
    ({"heads": [["0.0", "copying"]]}, "'heads' is a dict {'L.H': role}, got list"),
    ({"heads": {"0.0": "copying"}, "compositions": 3}, "'compositions' is a list of (writer, reader, kind)"),
    ({"heads": {"0.0": "copying"}, "compositions": "0.0 1.0 K"}, "'compositions' is a list of"),
    ({"heads": {"0.0": "copying"}, "model": ["OTHER"]}, "this grader grades"),
])
def test_bad_input_is_refused_in_one_line_naming_what_is_allowed(name, bad, says, capsys):
    other = next(n for n in MYSTERIES if n != name)
    h = {"model": name, **bad}
    if h["model"] == "OTHER":
        h["model"] = other
    result = grader.grader_for(name).grade(h)
    out = capsys.readouterr().out
    assert not result.passed and len(result.failures) == 1 and "\n" not in result.failures[0]
    assert says in result.failures[0] and out.startswith("✗ cannot grade:"), out


@pytest.mark.parametrize("comps, says", [
    ([("0.0", "0.1", "K")], "composes with a head of an earlier layer"),
    ([("1.0", "0.0", "K")], "composes with a head of an earlier layer"),
    ([("0.0", "1.0", "X")], "is not one of 'Q', 'K', 'V'"),
    ([("0.0", "1.2", "K")], "which has no role in 'heads'"),
    (["0.0->1.0"], "a composition is (writer, reader, kind)"),
    ([("0.0", "1.0", "V"), ("0.0", "1.0", "v")], "composition 0.0->1.0 V is named twice"),
    ([((0.0, 0), "1.0", "V")], "is not a head: a head is 'L.H'"),
    ([([0, [0]], "1.0", "V")], "is not a head: a head is 'L.H'"),
    ([("0.0", "1.0", 1)], "composition kind 1 (int) is not one of 'Q', 'K', 'V'"),
    ([("0.0", "1.0", ["V"])], "is not one of 'Q', 'K', 'V'"),
    ([["0.0", "1.0"]], "a composition is (writer, reader, kind)"),
])
def test_bad_compositions_are_refused_in_one_line(comps, says):
    h = {"model": "mystery-3", "heads": {"0.0": "previous-token", "0.1": "previous-token", "1.0": "duplicate-token"},
         "compositions": comps}
    result = grader.grade(h, show=False)
    assert not result.passed and says in result.failures[0], result.failures


def test_no_json_like_value_anywhere_in_a_hypothesis_raises_a_traceback():
    """Every JSON-like value (and a few of Python's and numpy's) in every place of a hypothesis:
    graded or refused in one line, never an exception out of the grader."""
    import numpy as np
    values = [None, True, 0, 1, -1, 1.5, float("nan"), "", "0.0", "1.0", "1.9", "x", "K", [], [0, 1], [0.5, 1],
              [[0, 1]], {}, {"a": 1}, "previous-token", np.int64(1), np.float32(1.0), 10**30]
    keys = [None, True, 0, 1.5, "", "0.0", "1.1", (0, 1), (0.0, 1), (1, np.int64(0)), ("0", "1")]
    g = grader.grader_for("mystery-3")
    seen = 0
    for v in values:
        hyps = [v, {"model": v}, {"model": "mystery-3", "heads": v},
                {"model": "mystery-3", "heads": {"0.0": v}}, {"model": "mystery-3", "heads": {"0.0": "previous-token"},
                                                             "compositions": v},
                {"model": "mystery-3", "heads": {"0.0": "previous-token", "1.0": "duplicate-token"},
                 "compositions": [v]},
                {"model": "mystery-3", "heads": {"0.0": "previous-token", "1.0": "duplicate-token"},
                 "compositions": [(v, "1.0", "V")]},
                {"model": "mystery-3", "heads": {"0.0": "previous-token", "1.0": "duplicate-token"},
                 "compositions": [("0.0", "1.0", v)]}]
        hyps += [{"model": "mystery-3", "heads": {k: v}} for k in keys]
        for h in hyps:
            try:
                g.parse(h)
            except grader.HypothesisError as err:
                assert "\n" not in str(err) and str(err), (h, err)
            seen += 1
            result = grader.grade(h, show=False) if not isinstance(h, dict) or "heads" not in h else None
            assert result is None or (not result.passed and len(result.failures) == 1)
    assert seen > 400


def test_grade_names_the_models_it_grades_for_a_hypothesis_without_one():
    for h in ({"heads": {"0.0": "copying"}}, "0.0 copying", {"model": "mystery-9"}):
        result = grader.grade(h, show=False)
        assert not result.passed and "set 'model' to one of mystery-1, mystery-2, mystery-3, attn-only-2l" in result.failures[0]


# ---- the second check of the method: the course's own 2-layer circuit ------------------------------
def _chapter_5_6_circuit():
    """Chapters 5-6's circuit of attn-only-2l, found as they find it: the previous-token head, the
    other layer-0 heads that K-compose with the induction heads (3 baseline deviations), and the
    induction heads of layer 1 (prefix matching above 0.3)."""
    g = grader.grader_for("attn-only-2l")
    ind = [(1, h) for h in range(4) if g.roles["induction"][1, h] > 0.3]
    k_writers = sorted({w for (w, r, kind), z in g.z.items() if kind == "K" and r in ind and z > 3})
    best = cc.best_roles(g.roles)
    heads = {head_name(*h): best[h] for h in k_writers + ind}
    comps = [(head_name(*w), head_name(*r), "K") for w in k_writers for r in ind]
    return g, {"model": "attn-only-2l", "heads": heads, "compositions": comps}, k_writers, ind


def test_the_grader_passes_chapters_5_and_6_circuit_of_the_shipped_2_layer_model():
    g, h, writers, ind = _chapter_5_6_circuit()
    assert "previous-token" in h["heads"].values() and len(ind) >= 2, h
    result = g.grade(h, show=False)
    assert result.passed, result.failures


def test_a_named_head_that_feeds_no_named_head_fails():
    """Chapters 5-6's circuit with only one layer-0 head's compositions named: the other layer-0
    heads are named with roles and feed no named head (it passed before the rule)."""
    g, h, writers, ind = _chapter_5_6_circuit()
    kept = writers[-1]
    comps = [c for c in h["compositions"] if c[0] == head_name(*kept)]
    result = g.grade({**h, "compositions": comps}, show=False)
    assert not result.passed
    fed = [f for f in result.failures if "feeds no named head" in f]
    assert len(fed) == len(writers) - 1, result.failures


def test_with_a_wrong_head_swapped_in_it_fails():
    g, h, writers, ind = _chapter_5_6_circuit()
    idle = [(0, x) for x in range(4) if (0, x) not in writers] + [(1, x) for x in range(4) if (1, x) not in ind]
    prev = next(k for k, r in h["heads"].items() if r == "previous-token")
    for bad in idle:
        name = head_name(*bad)
        for old in (prev, head_name(*ind[0])):
            heads = {(name if k == old else k): r for k, r in h["heads"].items()}
            comps = [tuple(name if x == old else x for x in c[:2]) + ("K",) for c in h["compositions"]]
            comps = [c for c in comps if c[0][0] < c[1][0]]
            result = g.grade({**h, "heads": heads, "compositions": comps}, show=False)
            assert not result.passed, (old, name)
