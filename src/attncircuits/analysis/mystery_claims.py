"""What chapter 12 states about each mystery as the task's own, checked on a trained model: the
mystery trainer (:mod:`attncircuits.train.mystery`) accepts a model only when these hold and its
derived ground truth passes the grader, so that any seed it accepts gives the chapter a gradeable
mystery whose text is true.

Each check returns the claims that fail, one line each, with what was measured (an empty list:
every claim holds). The chapter asserts the same claims on the shipped models (``claim()``
cells); the thresholds here are the chapter's.
"""

from __future__ import annotations

import torch

from attncircuits.analysis import circuit_check as cc
from attncircuits.analysis.circuits import full_ov_circuit
from attncircuits.core.heads import head_name
from attncircuits.analysis import grading as G
from attncircuits.analysis.hypothesis import from_truth


def _circuit(truth: dict, role: str, layer: int) -> list[tuple[int, int]]:
    """The heads of the derived circuit ``truth`` with ``role`` in ``layer``."""
    heads = [tuple(int(p) for p in h.split(".")) for h, r in truth["heads"].items() if r == role]
    return sorted(h for h in heads if h[0] == layer)


#: a layer-1 head "copies" through a path when that path maps at least this share of the list
#: tokens to themselves, and "not" through the other when it maps at most NOT_COPIES (exercise 12.6;
#: over five seeds a circuit head's other path mapped at most 0.15)
COPIES, NOT_COPIES = 0.5, 0.25


def _copying_paths(g: G.Grader, readers, direct_copies: bool) -> list[str]:
    """Each reader copies through its direct path and not layer 0 (``direct_copies``), or the
    reverse, as exercise 12.6 measures it."""
    direct, virtual = cc.answer_paths(g.model, torch.arange(2, g.model.cfg.d_vocab))
    bad = []
    for _, h in readers:
        yes, no = (direct[h], virtual[h]) if direct_copies else (virtual[h], direct[h])
        if not (float(yes) >= COPIES and float(no) <= NOT_COPIES):
            bad.append(f"1.{h} copies {float(direct[h]):.2f} directly and {float(virtual[h]):.2f} through layer 0")
    return bad


def _mystery_1(g: G.Grader, truth: dict) -> list[str]:
    out = []
    twoback, skipind = _circuit(truth, "two-back", 0), _circuit(truth, "skip-induction", 1)
    if not twoback or not skipind:
        return [f"two-back heads in layer 0: {len(twoback)}, skip-induction heads in layer 1: {len(skipind)}"]
    k = [g.z[(w, r, "K")] for w in twoback for r in skipind]
    qv = [g.z[(w, r, kind)] for kind in "QV" for w in twoback for r in skipind]
    if min(k) <= cc.COMPOSES:
        out.append(f"a two-back head does not K-compose with a skip-induction head (z {min(k):+.1f})")
    if max(qv) >= 0:
        out.append(f"a Q or V composition between them is not below the baseline (z {max(qv):+.1f})")
    layer1 = {head_name(*h): "skip-induction" for h in skipind}
    if (f := g.ablator.faithfulness(list(skipind))) >= 0.2:
        out.append(f"without its layer-0 heads the circuit recovers {f:.0%} of the task (the chapter: under 20%)")
    if len(skipind) > 1:  # one skip-induction head left out: faithful, and the left-out part fails
        last = head_name(*skipind[-1])
        hyp = {"model": g.name, "heads": {**{head_name(*h): "two-back" for h in twoback},
                                          **{h: r for h, r in layer1.items() if h != last}},
               "compositions": [(head_name(*w), head_name(*r), "K") for w in twoback for r in skipind[:-1]]}
        res = g.grade(hyp, show=False)
        if not (res.faithfulness is not None and res.faithfulness >= cc.FAITHFUL
                and any(x.startswith("left out") for x in res.failures)):
            out.append(f"with {last} left out the grader does not say a head was left out ({res.failures})")
    return out + _copying_paths(g, skipind, direct_copies=True)


def _mystery_2(g: G.Grader, truth: dict) -> list[str]:
    """The chapter's claim that is the task's: the trigger's paths alone miss some answers (the
    cue's and the start token's paths decide them). Which cue each head serves is not the task's:
    on 2 of 5 seeds both heads favour one cue, so the chapter states it of the shipped run only."""
    model, task = g.model, g.task
    answers = torch.tensor(task.answer_tokens)
    ov = sum(full_ov_circuit(model, 0, h).AB for h in range(model.cfg.n_heads))
    trigger_only = answers[ov[task.triggers][:, answers].argmax(-1)]
    if int((trigger_only[None] != cc.model_grammar(model, task)).sum()) == 0:
        return ["the trigger's paths alone give every answer (the chapter says they miss some)"]
    return []


def _mystery_3(g: G.Grader, truth: dict) -> list[str]:
    dup, prev = _circuit(truth, "duplicate-token", 1), _circuit(truth, "previous-token", 0)
    if not dup or not prev:
        return [f"previous-token heads in layer 0: {len(prev)}, duplicate-token heads in layer 1: {len(dup)}"]
    out = [f"{head_name(*r)} V-composes with no previous-token head at {cc.COMPOSES:.0f} sd" for r in dup
           if max(g.z[(w, r, "V")] for w in prev) < cc.COMPOSES]
    return out + _copying_paths(g, dup, direct_copies=False)


CLAIMS = {"mystery-1": _mystery_1, "mystery-2": _mystery_2, "mystery-3": _mystery_3}


def claim_problems(name: str, model, task, truth: dict | None = None) -> list[str]:
    """The claims chapter 12 states about mystery ``name`` that fail on ``model`` (empty: none),
    of the circuit ``truth`` (default: the one derived from the measurements)."""
    truth = cc.derive_circuit(model, task) if truth is None else truth
    return CLAIMS[name](G.Grader(name, model, task), truth) if name in CLAIMS else []


def accept_problem(name: str, model, task, truth: dict) -> str | None:
    """Why a trained mystery cannot be shipped (one line), or None: its derived ground truth
    (``truth``) fails the grader, or a claim the chapter makes about it fails."""
    if truth.get("accuracy", 1.0) <= 0.99:
        return f"accuracy {truth['accuracy']:.3f} on the task (the chapter: above 0.99)"
    g = G.Grader(name, model, task)
    result = g.grade(from_truth(name, truth), show=False) if truth["heads"] else None
    if result is None or not result.passed:
        return f"the derived circuit fails the grader ({result.first_failure if result else 'no head has a role'})"
    problems = CLAIMS[name](g, truth) if name in CLAIMS else []
    return f"a claim of chapter 12 fails: {problems[0]}" if problems else None
