"""Checks for chapter 12 (Mystery models): attention to an earlier copy, the circuit's two shares, the
learner's hypotheses about two mystery models, mystery 2's grammar read from the model, and which
path of mystery 3's layer-1 heads copies.

The first two and the grammar run the learner's function against the references in
:mod:`attncircuits.analysis.circuit_check`; the grammar is checked on the shipped model and on
copies whose answer tokens' unembedding columns are permuted, so that a function that returns the
task's own table (or any table not read from the model it is given) fails, and on a copy in
which a token that is no answer has the largest logit, so that the largest logit over the whole
vocabulary fails, and on a copy whose heads write a twentieth as much, where the direct path
decides some answers. The hypothesis checks call the learner's function,
which returns a hypothesis dict, and grade it with :mod:`attncircuits.course.grader` against the
shipped mystery: there is no answer to compare with, only the model's measurements, and a wrong
hypothesis gets the grader's first failing part (what was measured, not what the answer is).
While the learner's function runs, the references (and, for a hypothesis, the package's own
``derive_circuit``, ``measure_ground_truth`` and skip-trigram lists, and the ground truth shipped
beside each mystery) are withheld: the package's own answers.
"""

from __future__ import annotations

import copy

import torch

from attncircuits.analysis.circuit_check import (
    match_targets,
    answer_paths,
    attention_to,
    circuit_shares,
    copy_attention,
    derive_circuit,
    measure_ground_truth,
    model_grammar,
)
from attncircuits.analysis.circuits import full_ov_circuit
from attncircuits.analysis.grammar_heads import SkipTrigrams, head_skip_trigrams
from attncircuits.checkpoints.mysteries import Mystery, read_ground_truth
from attncircuits.course import grader
from attncircuits.course.exercises import _draws
from attncircuits.course.exercises._core import Case, Diagnosis, Draw, Identity, guarded, run_check
from attncircuits.data.tasks import Repeated

__all__ = ["check_copy_attention", "check_circuit_shares", "check_mystery_2", "check_grammar_2", "check_mystery_3",
           "check_answer_paths"]


def _mystery_case(name: str, layer: int, shift: int) -> Case:
    g = grader.grader_for(name)
    tokens = Repeated(g.model.cfg.d_vocab, g.model.cfg.n_ctx, (g.model.cfg.n_ctx - 1) // 2).batch(4, seed=7).tokens
    _, cache = g.model.forward_checked(tokens, return_cache=True)
    return Case(f"{name} layer {layer}, shift {shift}", (cache.pattern[layer].detach().clone(), tokens, shift))


def _targets(tokens, shift, causal=True, own=False):
    n = tokens.shape[1]
    src = torch.full_like(tokens, -1)
    src[:, shift:] = tokens[:, : n - shift]
    q, k = torch.arange(n)[:, None], torch.arange(n)[None]
    ok = ((k - shift < q) | (own & (k - shift == q))) & (k <= q) if causal else torch.ones(n, n, dtype=torch.bool)
    return (src[:, None, :] == tokens[:, :, None]) & ok & (tokens[:, :, None] != 0)


def _mass(pattern, targets, over_all=False):
    has = targets.any(-1) if not over_all else torch.ones(targets.shape[:2], dtype=torch.bool)
    mass = (pattern * targets[:, None]).sum(-1)  # [batch, head, q]
    return (mass * has[:, None]).sum((0, 2)) / has.sum().clamp(min=1)


@guarded
def check_copy_attention(fn) -> bool:
    """Exercise 12.1: ``copy_attention(pattern [batch, head, q, k], tokens [batch, pos], shift) -> [head]``."""
    cases = [_mystery_case("mystery-1", 1, 2), _mystery_case("mystery-3", 1, 0), _mystery_case("mystery-1", 1, 1)]
    return run_check(
        fn, cases, copy_attention,
        [
            Diagnosis("the shift is one too many: shift=1 is the token after the copy, shift=0 the copy itself",
                      lambda e, c: copy_attention(c.args[0], c.args[1], c.args[2] + 1)),
            Diagnosis("the shift is one too few: shift=1 is the token after the copy, shift=0 the copy itself",
                      lambda e, c: copy_attention(c.args[0], c.args[1], c.args[2] - 1) if c.args[2] else None),
            Diagnosis("the mean is over every query; average over the queries that have an earlier copy",
                      lambda e, c: _mass(c.args[0], _targets(c.args[1], c.args[2]), over_all=True)),
            Diagnosis("a query's own position counts as an earlier copy: keep keys k with k - shift < q",
                      lambda e, c: _mass(c.args[0], _targets(c.args[1], c.args[2], own=True))),
            Diagnosis("you summed over batch and queries: take the mean over the queries with a copy",
                      lambda e, c: (c.args[0] * _targets(c.args[1], c.args[2])[:, None]).sum((0, 2, 3))),
            Diagnosis("a start token (id 0) counted as a query: token 0 is never a query, wherever it "
                      "comes in the row (mask out the queries whose token is 0)",
                      lambda e, c: _mass(c.args[0], _targets(c.args[1] + 1, c.args[2]))),
        ],
        name="copy_attention",
        generate=_copy_case,
        withheld=[copy_attention, attention_to, match_targets],  # the reference's own body, too
    )


def _copy_case(draw: Draw):
    """The start token and two copies of 2-6 random tokens (ids 1-8), 1-2 rows, 1-3 heads, shift
    0-2; the edges first: a second start token between the copies (a row of two documents), with
    each shift."""
    edge = draw.edge(3)
    seq = draw.int(2, 6)
    half = torch.randint(1, 9, (draw.int(1, 2), seq), generator=draw.gen)
    bos = torch.zeros(half.shape[0], 1, dtype=torch.long)
    tokens = torch.cat([bos, half, bos, half] if edge is not None else [bos, half, half], 1)
    pattern = _draws.causal_pattern(draw, tokens.shape[0], draw.int(1, 3), tokens.shape[1])
    shift = edge if edge is not None else draw.int(0, 2)
    return Case("a second start token (id 0) between the copies" if edge is not None else "",
                (pattern, tokens, shift))


@guarded
def check_circuit_shares(fn) -> bool:
    """Exercise 12.2: ``circuit_shares(clean, none, keep, cut) -> (faithfulness, completeness)``."""
    cases = [
        Case("mystery-like losses", (0.05, 4.0, 0.45, 3.6), kind="hand-built"),
        Case("a circuit that explains nothing", (0.3, 2.0, 2.0, 0.3), kind="hand-built"),
        Case("a circuit that does better than the model", (1.0, 3.0, 0.8, 3.5), kind="hand-built"),
    ]
    return run_check(
        fn, cases, circuit_shares,
        [
            Diagnosis("faithfulness is measured from the ablated end: (none - keep) / (none - clean)",
                      lambda e, c: (1 - e[0], e[1])),
            Diagnosis("completeness is measured from the clean end: (cut - clean) / (none - clean)",
                      lambda e, c: (e[0], 1 - e[1])),
            Diagnosis("divide by the gap between the ablated and the clean model, none - clean",
                      lambda e, c: ((c.args[1] - c.args[2]) / c.args[1], (c.args[3] - c.args[0]) / c.args[1])),
            Diagnosis("the two are swapped: faithfulness comes first, from `keep`",
                      lambda e, c: (e[1], e[0])),
        ],
        name="circuit_shares",
        withheld=[circuit_shares],
        outputs=("faithfulness", "completeness"),
        generate=_shares_case,
        identities=[Identity("the ablated loss is above the clean one", lambda clean, none, *_: none > clean)],
    )


def _shares_case(draw: Draw):
    clean = float(draw.rand(1, lo=0.0, hi=1.0))
    none = clean + float(draw.rand(1, lo=0.1, hi=5.0))
    return clean, none, float(draw.rand(1, lo=0.0, hi=6.0)), float(draw.rand(1, lo=0.0, hi=6.0))


def _graded(name: str):
    """The case and the comparison of a hypothesis check: the learner's dict graded against ``name``."""
    g = grader.grader_for(name)

    def compare(got, expected, case):
        if not isinstance(got, dict):
            return f"your function returns {type(got).__name__}; it should return a hypothesis dict"
        result = g.grade(got, show=False)
        return None if result.passed else result.first_failure

    return [Case(name, (), expected=True)], compare


#: the package's own circuit of a mystery: found (derived, measured, each head's skip-trigrams) or
#: read (the ground truth stored beside the model, through ``Mystery.ground_truth`` or the store)
_CIRCUIT_FINDERS = [derive_circuit, measure_ground_truth, head_skip_trigrams, (SkipTrigrams, "of"),
                    (Mystery, "ground_truth"), read_ground_truth]


@guarded
def check_mystery_2(fn) -> bool:
    """Exercise 12.3: ``hypothesis_2() -> dict``, graded against mystery-2."""
    cases, compare = _graded("mystery-2")
    return run_check(fn, cases, compare=compare, withheld=_CIRCUIT_FINDERS)


def _permuted(model, task, seed: int):
    """A copy of ``model`` whose answer tokens' unembedding columns are permuted: its grammar is
    the shipped one with the answers renamed."""
    g = torch.Generator().manual_seed(seed)
    answers = torch.tensor(task.answer_tokens)
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.W_U[:, answers] = model.W_U[:, answers[torch.randperm(len(answers), generator=g)]]
    return other


def _decoy(model, task, answer: int, decoy: int, factor: float = 1.5):
    """A copy of ``model`` whose unembedding column of ``decoy``, a token that is no answer, is
    ``factor`` times that of ``answer``: wherever the model gives ``answer`` (with a positive
    logit), ``decoy``'s logit is the largest of the whole vocabulary; among the answer tokens,
    and so in the grammar, nothing changed."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.W_U[:, decoy] = factor * model.W_U[:, answer]
    return other


def _heads_scaled(model, factor: float = 0.05):
    """A copy of ``model`` whose heads write ``factor`` times as much (``W_O`` scaled; a one-layer
    model's patterns are unchanged): the cue's direct path, ``W_E[cue] @ W_U``, then decides
    some answers, so a sum of paths without it fails."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        for block in other.blocks:
            block.W_O.mul_(factor)
    return other


def _start_scaled(model, factor: float = 2.0):
    """A copy of ``model`` whose start token's embedding is ``factor`` times as large: the cue's
    heads attend to BOS and write from it more, so a sum of paths without the start token's own
    path gets some answers wrong (5 of 12 on the shipped mystery-2)."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.W_E[0] *= factor
    return other


def _without_start_path(model, task):
    """The mistake of the sum of paths without the start token's: on rows BOS, trigger, cue, the
    cue's direct path and each head's paths from the trigger and the cue, not from BOS."""
    answers = torch.tensor(task.answer_tokens)
    rows = torch.tensor([[0, t, c] for c in task.cues for t in task.triggers])
    ov = torch.stack([full_ov_circuit(model, 0, h).AB for h in range(model.cfg.n_heads)])  # [head, vocab, vocab]
    with torch.no_grad():
        _, cache = model.forward_checked(rows, return_cache=True)
        pattern = cache.pattern[0][:, :, -1, 1:]  # [row, head, key]: from the cue, BOS left out
        paths = torch.einsum("rhk,hrkv->rv", pattern, ov[:, rows[:, 1:]]) + model.W_E[rows[:, -1]] @ model.W_U
    return answers[paths[:, answers].argmax(-1)].reshape(len(task.cues), len(task.triggers))


def _heads_only(model, task):
    """The mistake of the heads' paths without the direct path: on rows BOS, trigger, cue, the
    answer the heads' OV circuits write most, weighted by the cue's attention."""
    answers = torch.tensor(task.answer_tokens)
    rows = torch.tensor([[0, t, c] for c in task.cues for t in task.triggers])
    ov = torch.stack([full_ov_circuit(model, 0, h).AB for h in range(model.cfg.n_heads)])  # [head, vocab, vocab]
    with torch.no_grad():
        _, cache = model.forward_checked(rows, return_cache=True)
        pattern = cache.pattern[0][:, :, -1]  # [row, head, key]: from the cue
        paths = torch.einsum("rhk,hrkv->rv", pattern, ov[:, rows])
    return answers[paths[:, answers].argmax(-1)].reshape(len(task.cues), len(task.triggers))


def _whole_vocab(model, task):
    """The mistake of the largest logit over the whole vocabulary, not among the answer tokens."""
    rows = torch.tensor([[0, t, c] for c in task.cues for t in task.triggers])
    with torch.no_grad():
        logits = model.forward_checked(rows)[:, -1]
    return logits.argmax(-1).reshape(len(task.cues), len(task.triggers))


def _trigger_ov_only(model, task):
    """The mistake of reading each trigger's OV rows alone: the answer its heads' OV circuits
    write most for the trigger, without what the cue and the start token write."""
    answers = torch.tensor(task.answer_tokens)
    ov = sum(full_ov_circuit(model, 0, h).AB for h in range(model.cfg.n_heads))
    row = answers[ov[task.triggers][:, answers].argmax(-1)]
    return row.expand(len(task.cues), -1).clone()


def _without_start(model, task):
    """The mistake of rows without the start token: the model's answer after [trigger, cue]."""
    answers = torch.tensor(task.answer_tokens)
    rows = torch.tensor([[t, c] for c in task.cues for t in task.triggers])
    with torch.no_grad():
        logits = model.forward_checked(rows)[:, -1, answers]
    return answers[logits.argmax(-1)].reshape(len(task.cues), len(task.triggers))


@guarded
def check_grammar_2(fn) -> bool:
    """Exercise 12.4: ``grammar_2(model, task) -> [n_cues, n_triggers]`` answer token ids."""
    m = grader.grader_for("mystery-2")
    task = m.task
    cases = [Case("mystery-2", (m.model, task))]
    cases += [Case(f"mystery-2 with its answers' unembedding permuted (seed {s})",
                   (_permuted(m.model, task, s), task), kind="hand-built") for s in (1, 2)]
    decoy = next(t for t in range(1, m.model.cfg.d_vocab)
                 if t not in {*task.answer_tokens, *task.cues, *task.triggers})
    cases.append(Case(f"mystery-2 with token {decoy}'s unembedding 1.5 times answer {task.answer_tokens[-1]}'s "
                      f"(token {decoy} is no answer)", (_decoy(m.model, task, task.answer_tokens[-1], decoy), task),
                      kind="hand-built"))
    cases.append(Case("mystery-2 with its heads' W_O times 0.05 (the direct path decides some answers)",
                      (_heads_scaled(m.model), task), kind="hand-built"))
    cases.append(Case("mystery-2 with the start token's embedding doubled (its own path decides some answers)",
                      (_start_scaled(m.model), task), kind="hand-built"))
    answers = torch.tensor(task.answer_tokens)
    return run_check(
        fn, cases, model_grammar,
        [
            Diagnosis("this is the task's own table, not the model's: read the grammar from the model "
                      "you are given (its weights, or its answers on rows you build)",
                      lambda e, c: c.args[1].table()),
            Diagnosis("these are indices into the answer tokens; return the answer token ids "
                      "(task.answer_tokens)",
                      lambda e, c: (e[..., None] == answers).int().argmax(-1)),
            Diagnosis("the trigger's OV rows alone miss what the cue and the start token write: add "
                      "every term of the path expansion (chapter 3)",
                      lambda e, c: _trigger_ov_only(*c.args)),
            Diagnosis("your rows have no start token: every row of the task begins with BOS (token 0), "
                      "and the cue's heads attend to it",
                      lambda e, c: _without_start(*c.args)),
            Diagnosis("that is the largest logit over the whole vocabulary; the grammar's answer is the "
                      "largest among task.answer_tokens",
                      lambda e, c: _whole_vocab(*c.args)),
            Diagnosis("the direct path is missing: the cue's own W_E[cue] @ W_U adds to the heads' paths "
                      "(chapter 3's path expansion has every term)",
                      lambda e, c: _heads_only(*c.args)),
            Diagnosis("the start token's path is missing: the cue's heads attend to BOS too, and what they "
                      "write from it (its row of each OV circuit, times that attention) is in the sum",
                      lambda e, c: _without_start_path(*c.args)),
        ],
        name="grammar_2",
        withheld=[model_grammar],
        time_limit=30.0,
        slow_hint="one short row per (cue, trigger) pair is enough: BOS, the trigger, the cue",
    )


@guarded
def check_mystery_3(fn) -> bool:
    """Exercise 12.4: ``hypothesis_3() -> dict``, graded against mystery-3."""
    cases, compare = _graded("mystery-3")
    return run_check(fn, cases, compare=compare, withheld=_CIRCUIT_FINDERS)


def _paths_wrong(model, tokens, how: str):
    """:func:`answer_paths` done in one of the ways a learner gets it wrong (``how``)."""
    b0, b1 = model.blocks
    embed, own = model.W_E[tokens], torch.arange(len(tokens))
    cols = slice(None) if how == "all-columns" else tokens
    target = tokens if how == "all-columns" else own
    ov = lambda b, h: b.W_V[h] @ b.W_O[h]  # noqa: E731
    with torch.no_grad():
        def share(rows, second):
            return ((rows @ second @ model.W_U[:, cols]).argmax(-1) == target).float().mean().item()
        heads = range(model.cfg.n_heads)
        layer0 = sum(ov(b0, w) for w in heads)
        direct = [share(embed, ov(b1, r)) for r in heads]
        if how == "each-alone":
            virtual = [sum(share(embed @ ov(b0, w), ov(b1, r)) for w in heads) / len(heads) for r in heads]
        elif how == "reversed":
            virtual = [share(embed @ ov(b1, r), layer0) for r in heads]
        else:
            virtual = [share(embed @ layer0, ov(b1, r)) for r in heads]
    return torch.tensor(direct), torch.tensor(virtual)


def _paths_case(name: str, tokens=None, permuted_seed: int | None = None, kind: str = "shipped") -> Case:
    model = grader.grader_for(name).model
    tokens = torch.arange(2, model.cfg.d_vocab) if tokens is None else tokens
    label = f"{name}, {len(tokens)} tokens"
    if permuted_seed is not None:
        model = copy.deepcopy(model)
        g = torch.Generator().manual_seed(permuted_seed)
        with torch.no_grad():
            model.W_U[:, tokens] = model.W_U[:, tokens[torch.randperm(len(tokens), generator=g)]].clone()
        label += f", its unembedding columns permuted (seed {permuted_seed})"
    return Case(label, (model, tokens), kind=kind)


@guarded
def check_answer_paths(fn) -> bool:
    """Exercise 12.6: ``answer_paths(model, tokens) -> (direct [n_heads], virtual [n_heads])``."""
    some = torch.randperm(62, generator=torch.Generator().manual_seed(3))[:20] + 2
    cases = [_paths_case("mystery-3"), _paths_case("mystery-1"),
             _paths_case("mystery-3", some.sort().values, kind="random"),
             _paths_case("mystery-1", permuted_seed=4, kind="hand-built")]
    return run_check(
        fn, cases, answer_paths,
        [
            Diagnosis("direct and virtual are swapped: return (direct, virtual)", lambda e, c: (e[1], e[0])),
            Diagnosis("each layer-0 head's virtual head was scored alone and the shares averaged: sum "
                      "the layer-0 heads' OV circuits first (the position holds what all of them "
                      "wrote), then score", lambda e, c: _paths_wrong(*c.args, "each-alone")),
            Diagnosis("the OV circuits are multiplied in the wrong order: layer 0 writes first, so "
                      "W_E W_OV^0 W_OV^1 W_U", lambda e, c: _paths_wrong(*c.args, "reversed")),
            Diagnosis("the largest logit was taken over the whole vocabulary: restrict the columns "
                      "to `tokens` too", lambda e, c: _paths_wrong(*c.args, "all-columns")),
        ],
        name="answer_paths",
        outputs=("direct", "virtual"),
        withheld=[answer_paths],
    )
