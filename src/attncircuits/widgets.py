"""Interactive explorers (ipywidgets), each of which also draws its first state as a static figure,
so the built book shows the finding without a kernel while a live notebook makes it interactive.

The pattern, used by every chapter::

    def draw(layer, head):                  # returns a matplotlib Figure (or any displayable,
        return attention_heatmap(...)       # e.g. plotting.tokens_html(...))

    explorer(draw, {"layer": [0, 1], "head": range(8)})

:func:`explorer` draws ``draw(**first values)`` and displays it as an ordinary output (a PNG or
HTML that the book keeps) under a ``display_id``. When ipywidgets and a kernel are present, the
controls appear above it and every change redraws that same output in place, so a live notebook
shows one figure that follows the controls. Without ipywidgets, outside IPython, or with the
environment variable ``ATTNCIRCUITS_STATIC=1``, only the static figure appears and nothing errors.

Controls are plain data, so a chapter states them once whether or not ipywidgets is installed:
a list (or ``(label, value)`` pairs) becomes a dropdown, a ``range`` an integer slider, a bool a
checkbox. The first option (the range's start) is the first state unless ``initial`` says otherwise.
"""

from __future__ import annotations

import html
import os
from typing import Any, Callable, Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from .heads import head_name

#: Set to ``1`` to show only the static first state (e.g. when building a book without widgets).
STATIC_ENV = "ATTNCIRCUITS_STATIC"


def _options(spec) -> list:
    """The values a control can take (``(label, value)`` pairs give their values)."""
    if isinstance(spec, bool):
        return [spec, not spec]
    if isinstance(spec, range):
        return list(spec)
    if isinstance(spec, (list, tuple)):
        return [o[1] if isinstance(o, tuple) and len(o) == 2 else o for o in spec]
    raise TypeError(
        f"control spec {spec!r} is not understood; use a list of options, a range (integer slider) or a bool"
    )


def interactive_available() -> bool:
    """True when ipywidgets is installed and code runs in an IPython kernel (not a plain script)."""
    if os.environ.get(STATIC_ENV, "").strip() not in ("", "0"):
        return False
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class Explorer:
    """A drawing function, its controls and its current state; :meth:`show` puts it on screen.

    ``draw(**values)`` must return a matplotlib ``Figure`` or any object a notebook can display.
    Figures are closed after they are shown, so matplotlib's inline backend never shows them twice.
    """

    def __init__(
        self,
        draw: Callable[..., Any],
        controls: Mapping[str, Any],
        initial: Mapping[str, Any] | None = None,
        title: str | None = None,
    ):
        if not callable(draw):
            raise TypeError("draw must be a function that takes the control values as keyword arguments")
        self.draw, self.title = draw, title
        self.controls = dict(controls)
        self.options = {name: _options(spec) for name, spec in self.controls.items()}
        initial = dict(initial or {})
        unknown = set(initial) - set(self.controls)
        if unknown:
            raise KeyError(f"initial values for unknown controls {sorted(unknown)}; controls: {sorted(self.controls)}")
        self.values: dict[str, Any] = {}
        for name, opts in self.options.items():
            if not opts:
                raise ValueError(f"control {name!r} has no options")
            self.values[name] = initial.get(name, opts[0])
            self._check(name, self.values[name])
        self.handle = None  # IPython DisplayHandle of the figure, once shown
        self.widget = None  # the ipywidgets box of controls, when interactive

    def _check(self, name: str, value) -> None:
        if value not in self.options[name]:
            shown = self.options[name] if len(self.options[name]) <= 12 else f"{self.options[name][:12]}..."
            raise ValueError(f"{value!r} is not an option of control {name!r}; options: {shown}")

    def render(self, **changes) -> Any:
        """Apply ``changes`` to the current values and return ``draw``'s result (no display)."""
        for name, value in changes.items():
            if name not in self.options:
                raise KeyError(f"unknown control {name!r}; controls: {sorted(self.options)}")
            self._check(name, value)
        self.values.update(changes)
        return self.draw(**self.values)

    def redraw(self, **changes) -> None:
        """Redraw with new values, replacing the displayed figure in place."""
        out = self.render(**changes)
        if self.handle is not None:
            self.handle.update(out)
        _close(out)

    def _build_widget(self):
        import ipywidgets as W

        boxes = []
        for name, spec in self.controls.items():
            value = self.values[name]
            if isinstance(spec, bool):
                w = W.Checkbox(value=value, description=name)
            elif isinstance(spec, range):
                w = W.IntSlider(value=value, min=spec.start, max=spec[-1], step=spec.step, description=name,
                                continuous_update=False)
            else:
                w = W.Dropdown(options=list(spec), value=value, description=name)
            w.observe(lambda change, name=name: self.redraw(**{name: change["new"]}), names="value")
            boxes.append(w)
        header = [W.HTML(f"<b>{html.escape(self.title)}</b>")] if self.title else []
        return W.VBox(header + [W.HBox(boxes)])

    def show(self) -> None:
        """Display the controls (when interactive) and the first state as a static output."""
        from IPython.display import display

        first = self.render()
        if interactive_available():
            self.widget = self._build_widget()
            display(self.widget)
        self.handle = display(first, display_id=True)
        _close(first)

    def _ipython_display_(self) -> None:
        # An Explorer left as a cell's last value shows itself once, and never twice.
        if self.handle is None:
            self.show()


def _close(obj) -> None:
    if isinstance(obj, Figure):
        plt.close(obj)


def explorer(
    draw: Callable[..., Any],
    controls: Mapping[str, Any],
    initial: Mapping[str, Any] | None = None,
    title: str | None = None,
) -> Explorer:
    """Show ``draw``'s first state as a static figure and, where possible, controls that redraw it.

    Returns the :class:`Explorer` (``.values``, ``.redraw(**changes)``); left as a cell's last
    value it displays nothing more.
    """
    ex = Explorer(draw, controls, initial, title)
    ex.show()
    return ex


# ---- chapter 2: next tokens from the weights and from the counts ---------------------------------
class NextTokenExplorer(Explorer):
    """:class:`Explorer` over one control, ``token`` (a dropdown of token ids), plus a text box in
    which any one-token string can be typed; :meth:`type_token` does the same from code.

    A typed string that is not a single token, or an unknown id, shows the error message (which
    names the pieces it splits into) instead of a figure.
    """

    def __init__(self, draw, options, tokenizer, d_vocab: int, initial=None, title=None):
        super().__init__(draw, {"token": list(options)}, initial, title)
        self.tokenizer, self.d_vocab = tokenizer, d_vocab
        self.message = None  # an ipywidgets.HTML for typing errors, when interactive
        self.dropdown = None  # the token dropdown, when interactive

    def type_token(self, token: int | str) -> None:
        """Resolve ``token`` (an id or a one-token string, ``·`` for a space) and redraw for it."""
        from .circuits.bigrams import resolve_token
        from .data import token_str

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
        import html

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
                self.message.value = f"<span style='color:#b00'>{html.escape(str(err))}</span>"

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
    The first state (``initial``, default the first of ``tokens``) is drawn as a static figure.
    """
    from .circuits.bigrams import top_next_tokens
    from .data import token_str, token_strs
    from .plotting import next_token_bars

    if not tables:
        raise ValueError("pass at least one table: {name: log-prob table [d_vocab, d_vocab]}")
    d_vocab = next(iter(tables.values())).shape[0]

    def draw(token):
        panels = {}
        for name, logp in tables.items():
            ids, probs = top_next_tokens(logp, token, k)
            panels[name] = (token_strs(tokenizer, ids.tolist()), probs)
        return next_token_bars(panels, title=f"next tokens after {token_str(tokenizer, token)}")

    options = [(token_str(tokenizer, t), int(t)) for t in tokens]
    ex = NextTokenExplorer(draw, options, tokenizer, d_vocab, None if initial is None else {"token": int(initial)},
                           title="Top next tokens: read from the weights vs counted in the corpus")
    ex.show()
    return ex


# ---- chapter 4: one head's skip-trigrams, OV and QK circuits ----------------------------------------
def head_explorer(model, tokenizer, tokens, layers=None, k: int = 10, initial=None) -> Explorer:
    """Pick a layer and a head: its top ``k`` skip-trigrams over the whole vocabulary (from the
    weights), beside its OV and QK circuits on ``tokens`` (ids or one-token strings), row-centred.

    The tables for every head are computed once (factored, well under a second); each redraw only
    slices them.
    """
    from .circuits.factored import full_ov_circuit, full_qk_circuit
    from .circuits.skip_trigrams import resolve_tokens, top_skip_trigrams
    from .data import token_strs
    from .plotting import head_circuits_figure

    layers = list(range(model.cfg.n_layers)) if layers is None else list(layers)
    if not layers:
        raise ValueError("this model has no attention layers, so there are no heads to explore")
    for layer in layers:
        model.check_head(layer, 0)
    ids = resolve_tokens(tokenizer, tokens, model.cfg.d_vocab)
    labels = token_strs(tokenizer, ids.tolist())
    tables = {layer: top_skip_trigrams(model, layer, k=k) for layer in layers}
    ov = {layer: full_ov_circuit(model, layer).centered(-1).restrict(ids, ids).dense() for layer in layers}
    qk = {layer: full_qk_circuit(model, layer).centered(-1).restrict(ids, ids).dense() for layer in layers}

    def draw(layer, head):
        rows = [(s, d, o, sc) for s, d, o, _, _, sc in tables[layer].rows(tokenizer, head)]
        return head_circuits_figure(rows, ov[layer][head], qk[layer][head], labels, title=f"head {head_name(layer, head)}")

    controls = {"layer": layers, "head": range(model.cfg.n_heads)}
    return explorer(draw, controls, initial, title="Head explorer: skip-trigrams, OV and QK circuits from the weights")


# ---- chapter 7: attention over the training snapshots ------------------------------------------
def snapshot_steps_control(steps) -> range | list:
    """A slider (``range``) when the snapshot steps are evenly spaced, otherwise a dropdown list."""
    steps = sorted(int(s) for s in steps)
    if not steps:
        raise ValueError("the checkpoint has no snapshots; train with --snapshot-steps to save some")
    gaps = {b - a for a, b in zip(steps, steps[1:])}
    if len(gaps) == 1:
        return range(steps[0], steps[-1] + 1, gaps.pop())
    return steps


def snapshot_explorer(checkpoint, tokens, layer: int = 1, boundaries=(), initial: int | None = None) -> Explorer:
    """Slide over a checkpoint's training snapshots and watch every head of ``layer`` attend on
    ``tokens`` (one row, e.g. a repeated random sequence): the induction stripe appears at the
    phase change. The first state (``initial``, default the first snapshot) is a static figure."""
    from .plotting import head_patterns_grid

    control = snapshot_steps_control(checkpoint.snapshot_steps)
    checkpoint.model.check_head(layer, 0)
    models: dict[int, Any] = {}

    def draw(step):
        if step not in models:
            models[step] = checkpoint.load_snapshot(step)
        _, cache = models[step].run_with_cache(tokens[:1])
        pats = cache.pattern[layer][0]
        titles = [f"head {head_name(layer, h)}" for h in range(pats.shape[0])]
        return head_patterns_grid(pats, titles, boundaries=boundaries, suptitle=f"layer {layer} at training step {step}")

    return explorer(draw, {"step": control}, None if initial is None else {"step": int(initial)},
                    title="Training snapshots: attention of every layer-1 head on a repeated sequence")
