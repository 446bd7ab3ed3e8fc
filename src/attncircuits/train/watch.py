"""Watch your own model: a training callback that scores every head with the course's detectors and
says when induction heads form.

Works in any training loop, the course's or your own plain PyTorch or TransformerLens 4 one::

    watch = HeadWatch(model, every=100)
    for step in range(n_steps):
        ...  # your forward, backward and optimiser step
        watch(step)
    print(watch.report())  # in a notebook its display already shows this line

Every ``every`` steps it scores the heads on random tokens repeated (prefix matching) and, given
``text``, on real text (previous token), or with any other of the course's detectors (the
registry :data:`attncircuits.analysis.scores.DETECTORS`); keeps one row per step in ``rows``; shows
them (in a notebook one display, updated in place: a figure of each detector's best score over the
steps, the last rows and :meth:`HeadWatch.report`; in a terminal one plain line per step); and
reports the phase change once: the first step at which a head's prefix-matching score reaches
``threshold``, the heads that did, and the previous-token heads they compose with (their
K-composition, as chapter 5 reads it). Heads are named ``head 1.2`` (layer 1, head 2), so that a
name never reads as a score. The model is put back in the mode it was in.
"""

from __future__ import annotations

import base64
import sys
from dataclasses import dataclass, field
from html import escape

import matplotlib.pyplot as plt
import torch

from attncircuits.analysis import definitions as D
from attncircuits.analysis import quantities
from attncircuits.analysis.circuits import composition_scores
from attncircuits.analysis.scores import DETECTORS, Probe
from attncircuits.core import validate
from attncircuits.core.heads import Head, head_name
from attncircuits.models.interface import features
from attncircuits.models.interop import from_transformer_lens
from attncircuits.show.plotting import figure_png, phase_change_plot


#: what HeadWatch's prefix-matching score is measured on, as its display names it
PROBE = "HeadWatch's random tokens repeated"


def _head(layer: int, head: int) -> str:
    return f"head {head_name(layer, head)}"


@dataclass
class PhaseChange:
    """The first step a head's prefix-matching score reached the threshold."""

    step: int
    induction_heads: list[tuple[Head, float]]  # the heads at or over the threshold, best first
    writers: list[tuple[Head, Head, float]]  # (induction head, previous-token head, K-composition z)

    def describe(self) -> str:
        heads = ", ".join(f"{_head(*h)} (score {s:.2f})" for h, s in self.induction_heads)
        line = f"phase change at step {self.step:,}, induction heads formed: {heads}"
        if self.writers:
            line += "; K-composition from " + ", ".join(
                f"{_head(*w)} into {_head(*r)} (z {z:.1f})" for r, w, z in self.writers)
        return line


@dataclass
class HeadWatch:
    """Scores every head every ``every`` steps and says when induction heads form (see the module)."""

    model: object
    every: int = 100
    text: torch.Tensor | None = None  # [batch, pos] token windows of real text, for the previous-token score
    seq_len: int | None = None  # random tokens per copy; None: the longest that fits 4 copies, at most 25
    n_repeats: int = 4
    threshold: float = D.FORMED.value  # the course's "formed" (analysis.definitions)
    # what is scored: prefix matching always (the phase change is read from it), previous-token when
    # ``text`` is given; any other registry entry may be added (each costs a forward pass)
    detectors: tuple[str, ...] = ("previous_token", "prefix_matching")
    display: str = "auto"  # "notebook", "terminal", "none", or "auto" (notebook when one is running)
    rows: list[dict] = field(default_factory=list)
    phase_change: PhaseChange | None = None

    def __post_init__(self):
        if not hasattr(self.model, "course_config"):
            # a TransformerLens TransformerBridge: read at each scoring as the family member it is
            # then (its weights copied); one it cannot represent is refused here, naming the part
            self._read = from_transformer_lens
            if type(self.model).__name__ != "TransformerBridge" and not hasattr(self.model, "original_model"):
                raise TypeError("model must be a course model or a TransformerLens TransformerBridge, got "
                                f"{type(self.model).__name__}")
        else:
            self._read = None
        if features(self._scored())["n_layers"] < 1:
            raise ValueError("this model has no attention layers (n_layers=0), so it has no heads to watch; "
                             "give a model with at least one layer")
        self.every = validate.count(self.every, "every")
        self.n_repeats = validate.count(self.n_repeats, "n_repeats", 2, why="prefix matching reads the later copies")
        n_ctx = self.model.cfg.n_ctx
        longest = validate.max_repeat_len(n_ctx, self.n_repeats)
        if longest < 2:
            raise ValueError(f"the context of {n_ctx} tokens holds no {self.n_repeats} copies of 2 random tokens after "
                             f"a start token; use n_repeats=2 or a context of at least {2 * self.n_repeats + 1}")
        self.seq_len = min(25, longest) if self.seq_len is None else self.seq_len
        validate.repeats(self.seq_len, self.n_repeats, n_ctx)  # one line naming the longest that fits
        self.threshold = validate.number(self.threshold, "threshold", 0, above=True)
        if self.display not in ("auto", "notebook", "terminal", "none"):
            raise ValueError(f"display={self.display!r}; use 'auto', 'notebook', 'terminal' or 'none'")
        unknown = [d for d in self.detectors if d not in DETECTORS]
        if unknown:
            raise ValueError(f"unknown detectors {unknown}; the registry has {', '.join(DETECTORS)}")
        self.detectors = tuple(dict.fromkeys(("prefix_matching", *self.detectors)))
        if self.display == "auto":
            self.display = "notebook" if "ipykernel" in sys.modules else "terminal"
        self._handle = None
        if self.display == "notebook":  # the display's lines name these windows
            quantities.Windows(PROBE, None)

    def __call__(self, step: int) -> dict | None:
        """Score the heads if ``step`` is a multiple of ``every`` (and step 0); returns the row or None."""
        if step % self.every:
            return None
        return self.score(step)

    def _scored(self):
        """The model the detectors read: the course's model itself, or a bridge's weights now."""
        return self.model if self._read is None else self._read(self.model)

    @torch.no_grad()
    def score(self, step: int) -> dict:
        was_training = self.model.training
        self.model.eval()
        try:
            model = self._scored()
            probe = Probe(self.text, self.seq_len, self.n_repeats, seed=0)
            names = [n for n in self.detectors if self.text is not None or not DETECTORS[n].needs_text]
            row = {"step": int(step), **{n: DETECTORS[n].fn(model, probe).cpu() for n in names}}
            self.rows.append(row)
            if self.phase_change is None and float(row["prefix_matching"].max()) >= self.threshold:
                self.phase_change = self._phase_change(row, model)
        finally:
            self.model.train(was_training)
        self._show(row)
        return row

    def _phase_change(self, row: dict, model) -> PhaseChange:
        pm = row["prefix_matching"]
        heads = sorted(((divmod(i, pm.shape[1]), float(v)) for i, v in enumerate(pm.flatten()) if v >= self.threshold),
                       key=lambda hs: -hs[1])
        writers, comps = [], {}
        for (layer, h), _ in heads:
            if layer == 0:
                continue
            if layer not in comps:  # one composition table per reader layer
                below = layer - 1 if "previous_token" not in row else int(row["previous_token"][:layer].max(-1).values.argmax())
                comps[layer] = composition_scores(model, below, layer, n_baseline=100)
            comp = comps[layer]
            z = comp.z("k")[:, h]
            writers.append(((layer, h), (comp.writer_layer, int(z.argmax())), float(z.max())))
        return PhaseChange(row["step"], heads, writers)

    def _line(self, row: dict) -> str:
        parts = [f"step {row['step']:>6,}"]
        for name in self.detectors:
            if name in row:
                s = row[name]
                best = divmod(int(s.argmax()), s.shape[1])
                parts.append(f"{DETECTORS[name].column} {float(s.max()):.2f} ({_head(*best)})")
        return ", ".join(parts)

    def _show(self, row: dict) -> None:
        if self.display == "none":
            return
        note = self.phase_change.describe() if self.phase_change and self.phase_change.step == row["step"] else ""
        if self.display == "terminal":
            print(self._line(row) + (f"\n{note}" if note else ""), flush=True)
            return
        from IPython.display import HTML, display

        html = HTML(self._html())
        if self._handle is None:
            self._handle = display(html, display_id=True)
        else:
            self._handle.update(html)

    def caption(self) -> str:
        """What the rows are measured on: one line, ending with a colon."""
        scored = [f"prefix-match on {PROBE} ({self.n_repeats} copies of {self.seq_len})"]
        if self.text is not None and "previous_token" in self.detectors:
            scored.append("prev-token on the text given")
        return f"every {self.every:,} steps, the best head of each detector; {', '.join(scored)}:"

    def _html(self) -> str:
        # one display: the figure, the last rows under their caption, and the report, once
        lines = "".join(f"<div>{escape(self._line(r))}</div>" for r in self.rows[-8:])
        note = f"<div><b>{escape(self.report())}</b></div>"
        figure = (f"<div><img src='data:image/png;base64,{self._figure_png()}' style='max-width:100%'/></div>"
                  if len(self.rows) > 1 else "")
        return (f"<div style='font-family:monospace'>{figure}<div>{escape(self.caption())}</div>{lines}{note}"
                "</div>")

    def curves(self) -> dict[str, list[float]]:
        """The best score of each detector watched, one value per row: ``{column: values}``."""
        return {DETECTORS[n].column: [float(r[n].max()) for r in self.rows] for n in self.detectors
                if all(n in r for r in self.rows)}

    def _figure_png(self) -> str:
        marks = {"phase change": self.phase_change.step} if self.phase_change else None
        fig = phase_change_plot([r["step"] for r in self.rows], {"best head's score": self.curves()},
                                xlabel="training step", vlines=marks)
        fig.set_size_inches(fig.get_figwidth(), 2.4)
        png = figure_png(fig)
        plt.close(fig)  # shown once, in the display updated in place, not again at the cell's end
        return base64.b64encode(png).decode()

    def report(self) -> str:
        """One line: the phase change, or that none happened in the steps watched."""
        if self.phase_change is not None:
            return self.phase_change.describe()
        last = self.rows[-1]["step"] if self.rows else None
        best = max((float(r["prefix_matching"].max()) for r in self.rows), default=float("nan"))
        return (f"no phase change in the steps watched (to step {last:,}): the best prefix-matching score was "
                f"{best:.2f}, under the threshold {self.threshold:g}" if self.rows else "no step watched yet: call watch(step)")
