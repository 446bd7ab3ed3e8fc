"""What each head of a one-layer grammar model (mystery 2) does, read from its circuits: its
skip-trigrams ``[source] ... [destination] -> [output]`` (chapter 4), here ``[trigger] ... [cue] ->
[answer]``.

A head *implements* the skip-trigram ``T ... cue -> A`` when

- **QK**: in the row ``BOS T cue`` (the task's shortest row, as in exercise 12.4) the cue's query
  puts more than :data:`ATTENDS` (half) of the head's attention on the trigger ``T``; and
- **OV**: among the answer tokens, ``T``'s row of the head's full OV circuit
  ``W_E W_OV W_U`` is largest at ``A`` (what the head writes when it attends to ``T``).

So a head implements at most one skip-trigram per (cue, trigger) pair, and its answer need not be
the model's: where another head or the cue's own paths write more, the head is overruled (chapter
12's "check yourself" on the sum of paths). Both conditions are read from the weights with one
forward pass of twelve three-token rows: no sampling, so a learner who measures the same way
gets the same list. On every trained mystery 2 so far the cue's attention on a trigger was under
0.15 or over 0.75, and no answer tied with another for first in a trigger's OV row: the list has
no knife edge at these levels.

Chapter 12's grader (:mod:`.grading`) asks a hypothesis about such a model to list each
skip-trigram head's skip-trigrams, and grades the list against this measurement.
"""

from __future__ import annotations

import torch

from attncircuits.analysis.circuits import full_ov_circuit
from attncircuits.core.heads import Head, head_name
from attncircuits.data.tasks import Grammar

__all__ = ["ATTENDS", "SkipTrigrams", "grammar_model", "head_skip_trigrams", "skip_trigram_names", "truth_entry"]

#: the cue's attention on the trigger, in the row BOS T cue, above which the head looks at it
ATTENDS = 0.5


def grammar_model(model, task) -> bool:
    """Whether ``model`` on ``task`` is a one-layer grammar model, whose skip-trigram heads a
    hypothesis describes by their skip-trigrams."""
    return isinstance(task, Grammar) and model.cfg.n_layers == 1


class SkipTrigrams:
    """The measurements behind :func:`head_skip_trigrams`: ``attention[h, i, j]``, head ``0.h``'s
    attention from cue ``i`` on trigger ``j`` in the row ``BOS T_j cue_i``, and ``ov[h, j]``, the
    logits of the answer tokens in trigger ``j``'s row of head ``0.h``'s full OV circuit."""

    @torch.no_grad()
    def __init__(self, model, task):
        self.task = task
        n_cues, n_trig = len(task.cues), len(task.triggers)
        rows = torch.tensor([[0, t, c] for c in task.cues for t in task.triggers])
        _, cache = model.forward_checked(rows, return_cache=True)
        pattern = cache.pattern[0][:, :, -1, 1]  # [row, head]: from the cue onto the trigger
        self.attention = pattern.T.reshape(model.cfg.n_heads, n_cues, n_trig).float()
        answers = torch.tensor(task.answer_tokens)
        self.ov = torch.stack([full_ov_circuit(model, 0, h).AB[task.triggers][:, answers]
                               for h in range(model.cfg.n_heads)]).float()  # [head, trigger, answer]

    def of(self, head: int) -> set[tuple[int, int, int]]:
        """Head ``0.head``'s skip-trigrams as token ids ``(trigger, cue, answer)``."""
        t = self.task
        best = self.ov[head].argmax(-1)
        return {(t.triggers[j], t.cues[i], t.answer_tokens[int(best[j])])
                for i in range(len(t.cues)) for j in range(len(t.triggers))
                if float(self.attention[head, i, j]) > ATTENDS}

    def why_not(self, head: int, triple: tuple[int, int, int]) -> str:
        """Why head ``0.head`` does not implement ``triple`` (one clause, the measurement that
        fails, not the answer)."""
        t, names = self.task, self.task.token_names()
        trig, cue, answer = triple
        i, j = t.cues.index(cue), t.triggers.index(trig)
        att = float(self.attention[head, i, j])
        if att <= ATTENDS:
            return (f"from {names[cue]} it puts {att:.2f} of its attention on {names[trig]} in the row BOS "
                    f"{names[trig]} {names[cue]}, needs over {ATTENDS:.2f} (its QK circuit)")
        row = self.ov[head, j]
        rank = 1 + int((row > row[t.answer_tokens.index(answer)]).sum())
        return (f"{names[trig]}'s row of its OV circuit ranks {names[answer]} {_ordinal(rank)} of the "
                f"{len(t.answer_tokens)} answer tokens, needs first")


def head_skip_trigrams(model, task) -> dict[Head, set[tuple[int, int, int]]]:
    """Every head's skip-trigrams ``(trigger, cue, answer)`` (token ids) on a one-layer grammar
    model: the module's definition, read from the weights."""
    st = SkipTrigrams(model, task)
    return {(0, h): st.of(h) for h in range(model.cfg.n_heads)}


def truth_entry(model, task, heads: dict[Head, str]) -> dict:
    """What a derived circuit (a mystery's ground truth) adds on a one-layer grammar model: the
    skip-trigrams of each of ``heads`` named skip-trigram, by token names; nothing on another."""
    if not grammar_model(model, task):
        return {}
    found = head_skip_trigrams(model, task)
    return {"skip_trigrams": {head_name(*h): skip_trigram_names(task, found[h])
                              for h in sorted(heads) if heads[h] == "skip-trigram"}}


def skip_trigram_names(task, triples) -> list[list[str]]:
    """``triples`` of token ids as sorted lists of the task's token names (``['T3', 'cue1', 'A2']``)."""
    names = task.token_names()
    return [[names[x] for x in triple] for triple in sorted(triples, key=lambda x: (x[1], x[0]))]


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 < 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
