"""The chapters' explorers: each computes its tables once from the analysis modules, then hands a
drawing function and its controls to the generic :class:`~attncircuits.show.widgets.explorer.Explorer`."""

from __future__ import annotations

import html
from typing import Any, Iterable, Mapping

from attncircuits.analysis.circuits.bigrams import resolve_token, top_next_tokens
from attncircuits.analysis.circuits.factored import full_ov_circuit, full_qk_circuit
from attncircuits.analysis.circuits.skip_trigrams import resolve_tokens, top_skip_trigrams
from attncircuits.core import validate
from attncircuits.core.heads import head_name
from attncircuits.data import token_str, token_strs
from attncircuits.show.plotting import head_circuits_figure, head_patterns_grid, next_token_bars, pattern_windows
from attncircuits.show.widgets.explorer import Explorer, explorer

#: How many tokens the static next-token explorer draws in advance.
STATIC_TOKENS = 12


# ---- chapter 2: next tokens from the weights and from the counts ---------------------------------
class NextTokenExplorer(Explorer):
    """:class:`Explorer` over one control, ``token`` (a dropdown of token ids), plus a text box in
    which any one-token string can be typed; :meth:`type_token` does the same from code.

    A typed string that is not a single token, or an unknown id, shows the error message (which
    names the pieces it splits into) instead of a figure.
    """

    def __init__(self, draw, options, tokenizer, d_vocab: int, initial=None, title=None, static_options=None):
        super().__init__(draw, {"token": list(options)}, initial, title, static_options)
        self.tokenizer, self.d_vocab = tokenizer, d_vocab
        self.message = None  # an ipywidgets.HTML for typing errors, when interactive
        self.dropdown = None  # the token dropdown, when interactive

    def type_token(self, token: int | str) -> None:
        """Resolve ``token`` (an id or a one-token string, ``·`` for a space) and redraw for it."""
        tid = resolve_token(self.tokenizer, token, self.d_vocab)
        if tid not in self.options["token"]:  # a typed token joins the dropdown's options
            self.options["token"].append(tid)
            self.controls["token"].append((token_str(self.tokenizer, tid), tid))
            if self.dropdown is not None:
                self.dropdown.options = list(self.controls["token"])
        if self.dropdown is not None and self.dropdown.value != tid:
            self.dropdown.value = tid  # the dropdown's observer redraws
        else:
            self.redraw(token=tid)

    def _build_widget(self):
        import ipywidgets as W

        box = super()._build_widget()
        self.dropdown = box.children[-1].children[0]
        text = W.Text(placeholder="e.g. ·self  (· is a space)", description="or type", continuous_update=False)
        self.message = W.HTML()

        def on_text(change):
            if not change["new"]:
                return
            try:
                self.type_token(change["new"])
                self.message.value = ""
            except (ValueError, TypeError) as err:
                self.message.value = f"<span style='color:var(--pst-color-danger, #b00)'>{html.escape(str(err))}</span>"

        text.observe(on_text, names="value")
        return W.VBox([box, text, self.message])


def next_token_explorer(
    tokenizer,
    tables: Mapping[str, Any],
    tokens,
    k: int = 8,
    initial: int | None = None,
) -> NextTokenExplorer:
    """Pick (or type) a current token and compare its top-``k`` next tokens across bigram tables.

    ``tables`` maps a name to a ``[d_vocab, d_vocab]`` table of ``log p(next | current)`` (e.g. the
    model's ``W_E @ W_U`` and the counted one, chapter 2); ``tokens`` are the dropdown's token ids.
    The first state is ``initial`` (default the first of ``tokens``); a page without a kernel shows
    the first dozen of ``tokens`` (and ``initial``) drawn in advance.
    """
    if not tables:
        raise ValueError("pass at least one table: {name: log-prob table [d_vocab, d_vocab]}")
    d_vocab = next(iter(tables.values())).shape[0]

    def draw(token):
        panels = {}
        for name, logp in tables.items():
            ids, probs = top_next_tokens(logp, token, k)
            panels[name] = (token_strs(tokenizer, ids.tolist()), probs)
        return next_token_bars(panels, title=f"next tokens after {token_str(tokenizer, token)}")

    ids = [int(t) for t in tokens]
    options = [(token_str(tokenizer, t), t) for t in ids]
    static = ids[:STATIC_TOKENS] + ([int(initial)] if initial is not None else [])
    ex = NextTokenExplorer(draw, options, tokenizer, d_vocab, None if initial is None else {"token": int(initial)},
                           title="Top next tokens: read from the weights vs counted in the corpus",
                           static_options={"token": static})
    ex.show()
    return ex


# ---- chapter 4: one head's skip-trigrams, OV and QK circuits ----------------------------------------
def head_explorer(model, tokenizer, tokens, layers=None, k: int = 10, initial=None) -> Explorer:
    """Pick a layer and a head: its top ``k`` skip-trigrams over the whole vocabulary (from the
    weights), above its OV and QK circuits on ``tokens`` (ids or one-token strings), row-centred.

    The tables for every head are computed once (factored, well under a second); each redraw only
    slices them. A page without a kernel shows every head, drawn in advance.
    """
    layers = list(range(model.cfg.n_layers)) if layers is None else list(layers)
    if not layers:
        raise ValueError("this model has no attention layers, so there are no heads to explore")
    layers = [validate.layer(model, layer, "layers") for layer in layers]
    ids = resolve_tokens(tokenizer, tokens, model.cfg.d_vocab)
    labels = token_strs(tokenizer, ids.tolist())
    tables = {layer: top_skip_trigrams(model, layer, k=k) for layer in layers}
    ov = {layer: full_ov_circuit(model, layer).centered(-1).restrict(ids, ids).dense() for layer in layers}
    qk = {layer: full_qk_circuit(model, layer).centered(-1).restrict(ids, ids).dense() for layer in layers}

    def draw(layer, head):
        return head_circuits_figure(tables[layer].rows(tokenizer, head), ov[layer][head], qk[layer][head], labels,
                                    title=f"head {head_name(layer, head)}")

    controls = {"layer": layers, "head": range(model.cfg.n_heads)}
    return explorer(draw, controls, initial, title="Head explorer: skip-trigrams, OV and QK circuits from the weights")


# ---- chapter 7: attention over the training snapshots ------------------------------------------
def snapshot_steps_control(steps) -> range | list:
    """A slider (``range``) when the snapshot steps are evenly spaced, otherwise a dropdown list."""
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
        raise TypeError(f"steps must be a list of training steps, got {steps!r}")
    steps = sorted(validate.count(s, "snapshot step", minimum=0) for s in steps)
    if not steps:
        raise ValueError("the checkpoint has no snapshots; train with --snapshot-steps to save some")
    gaps = {b - a for a, b in zip(steps, steps[1:])}
    if len(gaps) == 1:
        return range(steps[0], steps[-1] + 1, gaps.pop())
    return steps


def snapshot_explorer(checkpoint, tokens, layer: int = 1, boundaries=(), initial: int | None = None,
                      window: tuple[int, int, int, int] | None = None) -> Explorer:
    """Step through a checkpoint's training snapshots and watch every head of ``layer`` attend on
    ``tokens`` (one row, e.g. a repeated random sequence): the induction stripe appears at the
    phase change. The first state is ``initial`` (default: the last snapshot, where the stripe
    has formed); a page without a kernel shows every snapshot, drawn in advance. With ``window``
    (``(q0, q1, k0, k1)``) each head shows that block of its pattern with every position's token
    (:func:`attncircuits.show.plotting.pattern_windows`), large enough to read cell by cell."""
    control = snapshot_steps_control(checkpoint.snapshot_steps)
    layer = validate.layer(checkpoint.model, layer)
    tokens = checkpoint.model.check_tokens(tokens)  # [batch, pos]: a 1-D row is one row, not one token
    models: dict[int, Any] = {}
    labels = token_strs(checkpoint.tokenizer, tokens[0]) if window is not None else None

    def draw(step):
        if step not in models:
            models[step] = checkpoint.load_snapshot(step)
        _, cache = models[step].run_with_cache(tokens[:1])
        pats = cache.pattern[layer][0]
        titles = [f"head {head_name(layer, h)}" for h in range(pats.shape[0])]
        if window is not None:
            return pattern_windows(pats, labels, [window] * len(titles), titles,
                                   suptitle=f"layer {layer} at training step {step}")
        return head_patterns_grid(pats, titles, boundaries=boundaries, suptitle=f"layer {layer} at training step {step}")

    first = int(initial) if initial is not None else list(control)[-1]
    return explorer(draw, {"step": control}, {"step": first},
                    title=f"Training snapshots: attention of every layer-{layer} head on a repeated sequence")
