"""Measure a circuit on a task: the numbers chapter 12's grader reads (and the mysteries' ground truth).

Three kinds of evidence, each from a chapter of the course:

- **roles** (chapters 3-6): a score per head for each role of :data:`ROLES`, measured on the
  task's own rows: where the head attends (its own token, the previous one, two back, an earlier
  copy of its token, the token after or two after one), whether it copies (chapter 4's copying score) and
  whether the token it attends to, read through its OV table ``W_E W_V W_O W_U``, is the task's
  answer without being that token itself (a skip-trigram, chapter 4);
- **compositions** (chapter 5): Q/K/V composition scores as z-scores against the random baseline;
- **ablation** (chapter 6): the task loss with heads mean-ablated (each replaced by its mean
  output over the task's rows). With ``L_clean`` the model's loss, ``L_none`` the loss with every
  head ablated (only the direct path left), ``L_keep`` with every head *but* the circuit's ablated
  and ``L_cut`` with only the circuit's ablated::

      faithfulness = (L_none - L_keep) / (L_none - L_clean)   # share the circuit alone recovers
      completeness = (L_cut - L_clean) / (L_none - L_clean)   # share that removing it destroys

:func:`derive_circuit` finds a circuit from these numbers alone (every head with a role, less the
roles adding under :data:`NEEDED` of the task; compositions above :data:`COMPOSES` between them):
each mystery's ground truth, a circuit that falls short meaning training gave no mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from attncircuits.analysis import definitions as D
from attncircuits.analysis import grammar_heads as GH
from attncircuits.analysis import scores as S
from attncircuits.analysis.circuits.composition import composition_scores
from attncircuits.analysis.circuits.factored import mean_attention_by_offset
from attncircuits.analysis.losses import mean_ablation
from attncircuits.core.heads import Head, head_name
from attncircuits.data.tasks import Repeated

FAITHFUL = 0.8  # the share of the task a circuit must recover with every other head ablated
COMPLETE = 0.8  # the share of the task that ablating the circuit must destroy
NEEDED = 0.05  # a named head must add at least this share of the task to the rest of the circuit
LEFT_OUT = 0.2  # removing heads from the circuit may lose at most this much more than from the model
COMPOSES = D.COMPOSES.value  # a composition's z over the random baseline (definitions.COMPOSES)
KINDS = ("Q", "K", "V")
# a head attends "where its role says" when this share of its attention goes there (definitions)
ATTENDS = D.ATTENDS.value


def scored_loss(logits: Tensor, batch) -> Tensor:
    """Mean cross-entropy of the next token at the task's scored positions (differentiable: the
    mysteries are trained on it)."""
    nll = -logits[:, :-1].log_softmax(-1).gather(-1, batch.tokens[:, 1:, None])[..., 0]
    mask = batch.scored[:, :-1]
    return (nll * mask).sum() / mask.sum()


def task_loss(model, batch, ablate: dict | None = None) -> float:
    """The model's :func:`scored_loss` on ``batch`` (``ablate``: a forward's ablations)."""
    with torch.no_grad():
        return float(scored_loss(model.forward_checked(batch.tokens, ablate=ablate), batch))


def task_accuracy(model, batch) -> float:
    """Share of the scored positions whose top prediction is the answer."""
    with torch.no_grad():
        pred = model.forward_checked(batch.tokens)[:, :-1].argmax(-1)
    mask = batch.scored[:, :-1]
    return float(((pred == batch.tokens[:, 1:]) & mask).sum() / mask.sum())


# ---- roles ---------------------------------------------------------------------------------------
def _patterns(model, tokens: Tensor) -> Tensor:
    with torch.no_grad():
        _, cache = model.forward_checked(tokens, return_cache=True)
    return torch.stack(cache.pattern)  # [layer, batch, head, q, k]


def copy_attention(pattern: Float[Tensor, "batch head q k"], tokens: Int[Tensor, "batch pos"],
                   shift: int) -> Float[Tensor, " head"]:
    """Mean attention from each query to the keys ``shift`` places after an earlier copy of the
    query's token (0: the copy itself, a duplicate-token head; 1: the token after it, chapter 6's
    prefix matching; 2: two after it), over the batch and the queries that have such a key
    (exercise 12.1). The start token (id 0) is no query."""
    return attention_to(pattern[None], match_targets(tokens, shift))[0]


def attention_to(pat: Tensor, targets: Tensor) -> Tensor:
    """Mean attention mass ``[layer, head]`` on ``targets`` ``[batch, q, k]`` (bool), over the
    queries that have at least one target."""
    has = targets.any(-1)  # [batch, q]
    mass = (pat * targets[None, :, None]).sum(-1)  # [layer, batch, head, q]
    return (mass * has[None, :, None]).sum((1, 3)) / has.sum().clamp(min=1)


def circuit_shares(clean: float, none: float, keep: float, cut: float) -> tuple[float, float]:
    """(faithfulness, completeness) from the task losses of the model (``clean``), with every head
    mean-ablated (``none``), every head but the circuit's (``keep``) and the circuit's (``cut``):
    the shares of the gap ``none - clean`` the circuit alone closes and its removal reopens (12.2)."""
    gap = none - clean
    return (none - keep) / gap, (cut - clean) / gap


def _offset_targets(tokens: Tensor, back: int) -> Tensor:
    b, n = tokens.shape
    q, k = torch.arange(n)[:, None], torch.arange(n)[None]
    return ((k == q - back) & (q > 0)).expand(b, n, n)  # the start token's attention to itself is no choice


def match_targets(tokens: Tensor, shift: int) -> Tensor:
    """Keys ``k <= q`` whose token ``shift`` places earlier is the query's token, an earlier copy."""
    b, n = tokens.shape
    src = torch.full_like(tokens, -1)
    src[:, shift:] = tokens[:, : n - shift] if shift else tokens
    q, k = torch.arange(n)[:, None], torch.arange(n)[None]
    causal = (k - shift < q) & (k <= q)
    return (src[:, None, :] == tokens[:, :, None]) & causal & (tokens[:, :, None] != 0)


def _skip_trigram_scores(model, batch, pat: Tensor, min_count: int = 16) -> Tensor:
    """For each query token that comes at ``min_count`` or more scored positions (a grammar's cue),
    the share of those positions where the token the head attends to most, read through the head's
    OV table ``W_E W_V W_O W_U``, gives the answer and is not the answer itself (not copying); the
    head's score is its best query token's (a skip-trigram head may serve one cue of several)."""
    out = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    rows, qs = batch.scored[:, :-1].nonzero(as_tuple=True)
    answer, query = batch.tokens[rows, qs + 1], batch.tokens[rows, qs]
    values, counts = query.unique(return_counts=True)
    groups = [query == v for v, c in zip(values, counts) if c >= min_count]
    if not groups:
        return out
    for layer in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            src = batch.tokens[rows, pat[layer, rows, h, qs].argmax(-1)]
            with torch.no_grad():
                ov = model.W_E[src] @ model.W_V[layer, h] @ model.W_O[layer, h] @ model.W_U
            right = ((ov.argmax(-1) == answer) & (src != answer)).float()
            out[layer, h] = max(float(right[g].mean()) for g in groups)
    return out


@dataclass(frozen=True)
class Role:
    name: str
    short: str  # its column in tables
    what: str  # what the score measures, for messages
    chapter: int  # where the course teaches it
    threshold: float


#: the roles a hypothesis may give a head, each with the score that must reach its threshold
ROLES: dict[str, Role] = {r.name: r for r in (
    Role("current-token", "self", "attention to itself, with an earlier copy there", 5, ATTENDS),
    Role("previous-token", "prev", "attention to the previous token", 6, D.PREVIOUS_TOKEN_HEAD.value),
    Role("two-back", "2-back", "attention to the token two back", 8, ATTENDS),
    Role("duplicate-token", "dup", "attention to an earlier copy of its own token", 6, D.DUPLICATE_TOKEN_HEAD.value),
    Role("induction", "induct", "attention to the token after an earlier copy", 6, D.INDUCTION_HEAD.value),
    Role("skip-induction", "skip-ind", "attention to the token two after an earlier copy", 6, ATTENDS),
    Role("copying", "copy", "the copying score of its OV circuit", 4, D.COPYING_HEAD.value),
    Role("skip-trigram", "skip-tri", "attended token -> answer through its OV table, for one cue", 4,
         D.SKIP_TRIGRAM_HEAD.value),
)}


def role_scores(model, task, n_rows: int = 64, seed: int = 1) -> dict[str, Tensor]:
    """Every role's score ``[layer, head]``. Where a head attends is measured as chapter 6 measures
    it, on random tokens repeated once (distinct within a copy, as long as the context allows):
    the previous-token and two-back scores on the first copy (random text, nothing repeated yet),
    the others over the queries that have an earlier copy, the current-token score included (a
    head that looks for an earlier copy of its token rests on itself where there is none, so
    only a query with a copy to look at tells the two apart). The skip-trigram score needs the task's answers, so it runs on the
    task's rows."""
    seq_len = (model.cfg.n_ctx - 1) // 2
    probe = Repeated(model.cfg.d_vocab, model.cfg.n_ctx, seq_len=seq_len).batch(n_rows, seed)
    pat = _patterns(model, probe.tokens)
    first = pat[..., : seq_len + 1, : seq_len + 1]  # the first copy: random tokens, nothing repeated yet
    t = probe.tokens
    task_rows = task.batch(n_rows, seed)
    copy_seq = min(25, model.cfg.n_ctx - 1)
    return {
        "current-token": attention_to(pat, _offset_targets(t, 0) & match_targets(t, 0).any(-1, keepdim=True)),
        "previous-token": torch.stack([mean_attention_by_offset(p, 2)[:, 1] for p in first]),
        "two-back": torch.stack([mean_attention_by_offset(p, 2)[:, 2] for p in first]),
        "duplicate-token": torch.stack([copy_attention(p, t, 0) for p in pat]),
        "induction": torch.stack([copy_attention(p, t, 1) for p in pat]),
        "skip-induction": torch.stack([copy_attention(p, t, 2) for p in pat]),
        "copying": S.copying_scores(model, seq_len=copy_seq),
        "skip-trigram": _skip_trigram_scores(model, task_rows, _patterns(model, task_rows.tokens)),
    }


# ---- compositions --------------------------------------------------------------------------------
def composition_z(model, n_baseline: int = 500) -> dict[tuple[Head, Head, str], float]:
    """Every Q/K/V composition score between heads of layers ``a < b``, in baseline deviations."""
    out = {}
    for a in range(model.cfg.n_layers):
        for b in range(a + 1, model.cfg.n_layers):
            cs = composition_scores(model, a, b, n_baseline=n_baseline)
            for kind in KINDS:
                z = cs.z(kind.lower())
                for w in range(model.cfg.n_heads):
                    for r in range(model.cfg.n_heads):
                        out[((a, w), (b, r), kind)] = float(z[w, r])
    return out


# ---- ablation ------------------------------------------------------------------------------------
class Ablator:
    """Task losses with heads mean-ablated, on one fixed batch of the task (means over that batch)."""

    def __init__(self, model, task, n_rows: int = 256, seed: int = 2):
        self.model, self.batch = model, task.batch(n_rows, seed)
        self.heads = [(l, h) for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
        self.means = mean_ablation(model, self.batch.tokens, self.heads)["ablate"]
        self._losses: dict[frozenset, float] = {}  # by the set ablated: the grader asks for some twice
        self.clean = task_loss(model, self.batch)
        self.none = self.loss_without(self.heads)

    def loss_without(self, heads) -> float:
        key = frozenset(heads)
        if key not in self._losses:
            self._losses[key] = task_loss(self.model, self.batch, {h: self.means[h] for h in sorted(key)})
        return self._losses[key]

    def faithfulness(self, circuit) -> float:
        keep = set(circuit)
        return circuit_shares(self.clean, self.none, self.loss_without([h for h in self.heads if h not in keep]), self.none)[0]

    def completeness(self, circuit) -> float:
        return circuit_shares(self.clean, self.none, self.none, self.loss_without(list(circuit)))[1]

    def single_effects(self) -> dict[Head, float]:
        """Share of the task each head alone destroys when ablated."""
        return {h: self.completeness([h]) for h in self.heads}


# ---- the ground truth ----------------------------------------------------------------------------
def best_roles(scores: dict[str, Tensor]) -> dict[Head, str]:
    """Each head's role: the one whose score is highest relative to its threshold, among those
    that reach it. ``copying`` says what a head writes, the other roles where it looks (or what it
    maps): a head gets ``copying`` only when no other role fits."""
    n_layers, n_heads = next(iter(scores.values())).shape
    out = {}
    for l in range(n_layers):
        for h in range(n_heads):
            rel = {name: float(s[l, h]) / ROLES[name].threshold for name, s in scores.items()}
            passing = [r for r in rel if rel[r] >= 1 and r != "copying"] or [r for r in rel if rel[r] >= 1]
            if passing:
                out[(l, h)] = max(passing, key=rel.get)
    return out


def group_shares(ab: "Ablator", heads: dict[Head, str]) -> dict[str, float]:
    """For each role of ``heads``, the share of the task lost when the heads of that role are
    ablated too, the rest of ``heads`` kept (the others ablated): what the role adds."""
    full = ab.faithfulness(heads)
    return {role: full - ab.faithfulness([h for h, r in heads.items() if r != role]) for role in sorted(set(heads.values()))}


@dataclass(frozen=True)
class LeftOut:
    """The named heads ``removed`` (one head, or one role's heads): the share of the task the rest
    of the circuit recovers, and the share the rest of the model recovers."""

    removed: tuple[Head, ...]
    in_circuit: float
    in_model: float

    @property
    def gap(self) -> float:
        return self.in_model - self.in_circuit


def left_out(ab: "Ablator", heads: dict[Head, str]) -> LeftOut:
    """The largest gap between removing named heads from the circuit and from the whole model,
    over each named head and each role's heads (the completeness test of Wang et al. (2023)'s IOI
    circuit). A head left out of the hypothesis that does the work of a named one shows here: the
    model without the named head still has it, the circuit does not."""
    groups = [(h,) for h in sorted(heads)]
    groups += [tuple(h for h in sorted(heads) if heads[h] == role) for role in sorted(set(heads.values()))]
    found = []
    for removed in dict.fromkeys(groups):
        kept = [h for h in heads if h not in removed]
        rest = [h for h in ab.heads if h not in removed]
        found.append(LeftOut(removed, ab.faithfulness(kept), ab.faithfulness(rest)))
    return max(found, key=lambda x: x.gap)


def _unlinked(heads: dict[Head, str], z: dict) -> Head | None:
    """The head of ``heads`` that after the first layer reads none of them, or before the last feeds
    none, at :data:`COMPOSES` (the least linked of such heads); None when every head is linked."""
    layers = sorted({layer for layer, _ in heads})
    loose = {}
    for h in heads:
        reads = [v for (w, r, _), v in z.items() if r == h and w in heads]
        feeds = [v for (w, r, _), v in z.items() if w == h and r in heads]
        for links, needed in ((reads, h[0] > layers[0]), (feeds, h[0] < layers[-1])):
            if needed and max(links, default=float("-inf")) < COMPOSES:
                loose[h] = min(loose.get(h, float("inf")), max(links, default=float("-inf")))
    return min(loose, key=loose.get) if loose else None


def derive_circuit(model, task) -> dict:
    """A circuit found from the measurements alone, as a hypothesis dict with its numbers: every
    head with a role (:func:`best_roles`), less the roles whose heads add under :data:`NEEDED` of
    the task (:func:`group_shares`) and the heads with no composition above :data:`COMPOSES`
    linking them to the rest (a head after the circuit's first layer that reads none of its
    heads, one before its last that feeds none: chapter 12's grader refuses both), and every
    composition above :data:`COMPOSES` into a head of a later layer from a head of the circuit."""
    ab = Ablator(model, task)
    heads = best_roles(role_scores(model, task))
    z = composition_z(model) if model.cfg.n_layers > 1 else {}
    while heads:
        shares = group_shares(ab, heads)
        weakest = min(shares, key=shares.get)
        if shares[weakest] < NEEDED:
            heads = {h: r for h, r in heads.items() if r != weakest}
        elif unlinked := _unlinked(heads, z):  # no edge into the circuit at COMPOSES: not on its path
            heads = {h: r for h, r in heads.items() if h != unlinked}
        else:
            break
    comps = [[head_name(*w), head_name(*r), k] for (w, r, k), v in z.items()  # z: {} on one layer
             if w in heads and r in heads and v >= COMPOSES]
    return {
        "heads": {head_name(*h): r for h, r in sorted(heads.items())},
        "compositions": comps,
        **GH.truth_entry(model, task, heads),  # a grammar model's: each head's skip-trigrams
        "faithfulness": round(ab.faithfulness(heads), 4),
        "completeness": round(ab.completeness(heads), 4),
        "clean_loss": round(ab.clean, 4),
        "ablated_loss": round(ab.none, 4),
        "single_effects": {head_name(*h): round(v, 4) for h, v in ab.single_effects().items()},
    }


def measure_ground_truth(model, task) -> dict:
    """Everything a mystery's ``ground_truth.json`` holds: the derived circuit, every head's role
    scores, every composition's z-score and the model's accuracy on the task."""
    truth = derive_circuit(model, task)
    rs = role_scores(model, task)
    truth["role_scores"] = {name: [[round(float(x), 4) for x in row] for row in s] for name, s in rs.items()}
    if model.cfg.n_layers > 1:
        truth["composition_z"] = {f"{head_name(*w)}->{head_name(*r)} {k}": round(v, 2) for (w, r, k), v in composition_z(model).items()}
    truth["accuracy"] = round(task_accuracy(model, task.batch(256, seed=3)), 4)
    return truth


def describe_ground_truth(truth: dict) -> str:
    heads, comps = (", ".join(" ".join(x) for x in truth["heads"].items()),
                    ", ".join(f"{w}->{r} {k}" for w, r, k in truth["compositions"]) or "none")
    return (f"accuracy {truth['accuracy']:.3f}; circuit: {heads}; compositions: {comps}; "
            f"faithfulness {truth['faithfulness']:.2f}, completeness {truth['completeness']:.2f}")


def model_grammar(model, task, n_rows: int = 32, seed: int = 5) -> Tensor:
    """``[n_cues, n_triggers]``: the answer token the model gives after each cue in a row holding
    each trigger (exercise 12.4), read from the model, not from the task's own table. Each
    (cue, trigger) pair is set into ``n_rows`` of the task's rows (their trigger and their first
    cue replaced; the earlier tokens only, so no answer of another pair precedes it), and the
    answer token the model ranks first there most often is the pair's."""
    batch = task.batch(n_rows, seed=seed)
    rows = torch.arange(n_rows)
    trig_pos = torch.isin(batch.tokens, torch.tensor(task.triggers)).int().argmax(-1)
    cue_pos = batch.scored.int().argmax(-1)
    answers = torch.tensor(task.answer_tokens)
    out = torch.zeros(len(task.cues), len(task.triggers), dtype=torch.long)
    for i, cue in enumerate(task.cues):
        for j, trig in enumerate(task.triggers):
            tokens = batch.tokens.clone()
            tokens[rows, trig_pos], tokens[rows, cue_pos] = trig, cue
            with torch.no_grad():
                logits = model.forward_checked(tokens)[rows, cue_pos]
            picks = logits[:, answers].argmax(-1)
            out[i, j] = answers[picks.bincount(minlength=len(answers)).argmax()]
    return out


@torch.no_grad()
def answer_paths(model, tokens: Int[Tensor, " n"]) -> tuple[Tensor, Tensor]:
    """Exercise 12.6: which path of a 2-layer model's layer-1 heads copies. For each head ``1.r``,
    the share of ``tokens`` whose largest logit, among ``tokens``, is the token itself: through its
    direct OV circuit ``W_E W_OV^{1,r} W_U`` (what it writes for the token it attends to), and
    through its virtual heads with every layer-0 head, summed,
    ``W_E (Σ_w W_OV^{0,w}) W_OV^{1,r} W_U`` (what it writes for what layer 0 moved into that
    position). Returns ``(direct [n_heads], virtual [n_heads])``."""
    if model.cfg.n_layers != 2:
        raise ValueError(f"answer_paths reads a 2-layer model's paths; this one has {model.cfg.n_layers} layers")
    b0, b1 = model.blocks
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    embed, unembed = model.W_E[tokens], model.W_U[:, tokens]
    layer0 = torch.einsum("hdk,hkm->dm", b0.W_V, b0.W_O)  # Σ_w W_OV^{0,w}, [d_model, d_model]
    own = torch.arange(len(tokens))

    def copies(rows: Tensor) -> Tensor:  # [head, n, d_model] -> share of rows whose own logit is largest
        logits = torch.einsum("hnd,hdk,hkm,mv->hnv", rows, b1.W_V, b1.W_O, unembed)
        return (logits.argmax(-1) == own).float().mean(-1)

    n_heads = model.cfg.n_heads
    return copies(embed.expand(n_heads, -1, -1)), copies((embed @ layer0).expand(n_heads, -1, -1))
