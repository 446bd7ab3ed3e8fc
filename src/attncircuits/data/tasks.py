"""Synthetic tasks the capstone's mystery models are trained on (chapter 12).

A task makes batches of token rows and says which positions it *scores*: the positions whose next
token the task's rule determines. The model's performance on a task is its loss (or accuracy) on
those next tokens alone, so that the rest of a row (random filler nobody can predict) does not
dilute it; the grader's faithfulness and completeness are shares of that performance.

Three kinds, each a rule a known mechanism solves:

- :class:`Grammar`: a hidden skip-trigram grammar. Each row holds one *trigger* token; wherever a
  *cue* token comes later, the next token is the answer that the grammar gives for that cue and
  that trigger (``[trigger] ... [cue] -> [answer]``).
- :class:`Recall`: a list of distinct tokens, ``SEP``, then queries: each query is a token of the list and
  the next token is the list's token ``offset`` places after it (``offset=-1``: the one before).
- :class:`Repeated`: random tokens repeated (chapter 6's induction task); the second copy is scored.

Token 0 starts every row (``BOS``). Every task names its tokens (:meth:`token_names`), so a
mystery's tables print ``cue1`` or ``t17`` instead of bare ids.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor

__all__ = ["Grammar", "Recall", "Repeated", "TaskBatch", "task_from_dict", "TASK_KINDS"]


@dataclass(frozen=True)
class TaskBatch:
    """Rows of a task and the positions it scores."""

    tokens: Tensor  # [batch, pos] int64
    scored: Tensor  # [batch, pos] bool: the next token after this position is the task's answer

    @property
    def answers(self) -> Tensor:
        """The answer token after every position (-1 where the position is not scored), ``[batch, pos]``."""
        out = torch.full_like(self.tokens, -1)
        out[:, :-1] = torch.where(self.scored[:, :-1], self.tokens[:, 1:], -1)
        return out


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


@dataclass(frozen=True)
class Grammar:
    """``n_cues`` cue tokens and ``n_triggers`` trigger tokens; the grammar maps each (cue, trigger)
    pair to an answer token (fixed by ``grammar_seed``). A row: BOS, fillers, one trigger in the
    first half, and ``n_queries`` cues later, each followed by its answer."""

    d_vocab: int = 48
    n_ctx: int = 24
    n_cues: int = 2
    n_triggers: int = 6
    n_queries: int = 3
    grammar_seed: int = 0
    kind: str = "grammar"

    def __post_init__(self):
        fillers = self.d_vocab - 1 - self.n_cues - 2 * self.n_triggers
        if fillers < 4:
            raise ValueError(f"Grammar needs d_vocab >= {1 + self.n_cues + 2 * self.n_triggers + 4} for {self.n_cues} cues "
                             f"and {self.n_triggers} triggers, got d_vocab={self.d_vocab}")
        if self.n_ctx < 2 + 2 * self.n_queries + 2:
            raise ValueError(f"Grammar needs n_ctx >= {4 + 2 * self.n_queries} for {self.n_queries} queries, got {self.n_ctx}")

    @property
    def cues(self) -> list[int]:
        return list(range(1, 1 + self.n_cues))

    @property
    def triggers(self) -> list[int]:
        return list(range(1 + self.n_cues, 1 + self.n_cues + self.n_triggers))

    @property
    def answer_tokens(self) -> list[int]:
        start = 1 + self.n_cues + self.n_triggers
        return list(range(start, start + self.n_triggers))

    def table(self) -> Tensor:
        """``[n_cues, n_triggers]``: the answer token of each (cue, trigger) pair; each cue's row is
        its own permutation of the answer tokens, so no answer follows from the trigger alone."""
        g = _gen(self.grammar_seed)
        answers = torch.tensor(self.answer_tokens)
        rows = [answers[torch.randperm(self.n_triggers, generator=g)] for _ in range(self.n_cues)]
        return torch.stack(rows)

    def token_names(self) -> list[str]:
        names = [f"t{i}" for i in range(self.d_vocab)]
        names[0] = "BOS"
        for i, t in enumerate(self.cues):
            names[t] = f"cue{i}"
        for i, t in enumerate(self.triggers):
            names[t] = f"T{i}"
        for i, t in enumerate(self.answer_tokens):
            names[t] = f"A{i}"
        return names

    def batch(self, n: int, seed: int = 0) -> TaskBatch:
        g = _gen(seed)
        first_filler = 1 + self.n_cues + 2 * self.n_triggers
        tokens = torch.randint(first_filler, self.d_vocab, (n, self.n_ctx), generator=g)
        tokens[:, 0] = 0
        scored = torch.zeros(n, self.n_ctx, dtype=torch.bool)
        table = self.table()
        half = self.n_ctx // 2
        for i in range(n):
            trig = int(torch.randint(self.n_triggers, (1,), generator=g))
            t_pos = int(torch.randint(1, half - 1, (1,), generator=g))
            tokens[i, t_pos] = self.triggers[trig]
            # queries: non-overlapping (cue, answer) slots after the trigger
            slots = torch.randperm((self.n_ctx - t_pos - 1) // 2, generator=g)[: self.n_queries]
            for s in slots.tolist():
                p = t_pos + 1 + 2 * s
                cue = int(torch.randint(self.n_cues, (1,), generator=g))
                tokens[i, p], tokens[i, p + 1] = self.cues[cue], table[cue, trig]
                scored[i, p] = True
        return TaskBatch(tokens, scored)

    def describe(self) -> str:
        return (f"skip-trigram grammar: {self.n_triggers} triggers, {self.n_cues} cues; after a cue comes the "
                "answer the grammar gives for that cue and the row's trigger")


@dataclass(frozen=True)
class Recall:
    """BOS, a list of distinct tokens (``min_keys`` to ``max_keys`` of them, so that no position
    says where the list ends), ``SEP``, then (query, answer) pairs to the end of the row: a query
    is a token of the list, its answer the list's token ``offset`` places after it."""

    d_vocab: int = 64
    n_ctx: int = 32
    min_keys: int = 8
    max_keys: int = 16
    offset: int = 2
    kind: str = "recall"

    def __post_init__(self):
        if not 0 < self.min_keys <= self.max_keys:
            raise ValueError(f"Recall needs 0 < min_keys <= max_keys, got {self.min_keys} and {self.max_keys}")
        if self.offset == 0 or abs(self.offset) >= self.min_keys:
            raise ValueError(f"Recall.offset must be a nonzero shift shorter than the list (|offset| < min_keys="
                             f"{self.min_keys}), got {self.offset}")
        if self.max_keys > self.d_vocab - 2:
            raise ValueError(f"Recall needs max_keys <= d_vocab - 2 distinct tokens, got max_keys={self.max_keys}, "
                             f"d_vocab={self.d_vocab}")
        if self.n_ctx < self.max_keys + 4:
            raise ValueError(f"Recall needs n_ctx >= max_keys + 4 (one query), got n_ctx={self.n_ctx}, "
                             f"max_keys={self.max_keys}")

    def token_names(self) -> list[str]:
        return ["BOS", "SEP"] + [f"t{i}" for i in range(2, self.d_vocab)]

    def batch(self, n: int, seed: int = 0) -> TaskBatch:
        g = _gen(seed)
        tokens = torch.zeros(n, self.n_ctx, dtype=torch.long)
        scored = torch.zeros(n, self.n_ctx, dtype=torch.bool)
        for i in range(n):
            k = int(torch.randint(self.min_keys, self.max_keys + 1, (1,), generator=g))
            keys = torch.randperm(self.d_vocab - 2, generator=g)[:k] + 2
            lo, hi = max(0, -self.offset), k - max(0, self.offset)  # list indices that have an answer
            tokens[i, 1 : 1 + k], tokens[i, 1 + k] = keys, 1
            for p in range(2 + k, self.n_ctx, 2):
                j = int(torch.randint(lo, hi, (1,), generator=g))
                tokens[i, p] = keys[j]
                if p + 1 < self.n_ctx:
                    tokens[i, p + 1] = keys[j + self.offset]
                    scored[i, p] = True
        return TaskBatch(tokens, scored)

    def describe(self) -> str:
        where = {1: "the token after it", -1: "the token before it"}.get(
            self.offset, f"the token {abs(self.offset)} places {'after' if self.offset > 0 else 'before'} it")
        return (f"recall: a list of {self.min_keys}-{self.max_keys} distinct tokens, SEP, then queries; after "
                f"a query comes {where} in the list")


@dataclass(frozen=True)
class Repeated:
    """BOS and ``seq_len`` random tokens (distinct within a row where the vocabulary allows),
    repeated once: chapter 6's induction task (the second copy after its first token is scored),
    and the probe the role scores of :mod:`attncircuits.analysis.circuit_check` run on."""

    d_vocab: int = 2048
    n_ctx: int = 128
    seq_len: int = 40
    kind: str = "repeated"

    def __post_init__(self):
        if 1 + 2 * self.seq_len > self.n_ctx:
            raise ValueError(f"Repeated needs 1 + 2 * seq_len <= n_ctx={self.n_ctx}, got seq_len={self.seq_len}")

    def token_names(self) -> list[str]:
        return ["BOS"] + [f"t{i}" for i in range(1, self.d_vocab)]

    def batch(self, n: int, seed: int = 0) -> TaskBatch:
        g = _gen(seed)
        if self.seq_len < self.d_vocab:
            half = torch.rand(n, self.d_vocab - 1, generator=g).argsort(-1)[:, : self.seq_len] + 1
        else:
            half = torch.randint(1, self.d_vocab, (n, self.seq_len), generator=g)
        tokens = torch.cat([torch.zeros(n, 1, dtype=torch.long), half, half], dim=1)
        scored = torch.zeros_like(tokens, dtype=torch.bool)
        scored[:, 1 + self.seq_len : 2 * self.seq_len] = True
        return TaskBatch(tokens, scored)

    def describe(self) -> str:
        return f"repeated random tokens: {self.seq_len} tokens, then the same again"


TASK_KINDS = {"grammar": Grammar, "recall": Recall, "repeated": Repeated}


def task_to_dict(task) -> dict:
    return asdict(task)


def task_from_dict(d: dict):
    """The task a mystery's config.json describes (``kind`` names its class)."""
    d = dict(d)
    kind = d.get("kind")
    if kind not in TASK_KINDS:
        raise ValueError(f"unknown task kind {kind!r}; the tasks are {', '.join(TASK_KINDS)}")
    return TASK_KINDS[kind](**d)
