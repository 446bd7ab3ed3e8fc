"""The generic explorer: a drawing function, its controls, and two ways to show it.

With a kernel and ipywidgets, controls appear above one figure output, and every change redraws
that output in place. Without them (a plain script, a kernel without ipywidgets, or the environment
variable ``ATTNCIRCUITS_STATIC=1``, meant for the book build: ``ATTNCIRCUITS_STATIC=1 jupyter-book
build .``), the explorer draws a few states in advance and shows them with buttons that switch
between them in plain HTML (:mod:`attncircuits.show.widgets.static`), so a static page has controls that
work and no control that does nothing."""

from __future__ import annotations

import html
import os
from typing import Any, Callable, Mapping

from matplotlib.figure import Figure

from attncircuits.show.plotting.base import figure_png, release
from attncircuits.show.widgets.static import limit_states, selector_html

#: Set to ``1`` to show the static explorer (precomputed states) even in a live kernel.
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


def _labels(spec) -> list[tuple[str, Any]]:
    """``(label, value)`` for each option of a control."""
    if isinstance(spec, (list, tuple)) and not isinstance(spec, bool):
        return [o if isinstance(o, tuple) and len(o) == 2 else (str(o), o) for o in spec]
    return [(str(v), v) for v in _options(spec)]


def interactive_available() -> bool:
    """True when ipywidgets is installed and code runs in an IPython kernel (not a plain script),
    unless ``ATTNCIRCUITS_STATIC`` asks for the static explorer."""
    if os.environ.get(STATIC_ENV, "").strip() not in ("", "0"):
        return False
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def displayable(obj: Any) -> Any:
    """What to hand to ``display``: a figure becomes its PNG (and leaves pyplot, so the inline
    backend does not show it a second time); anything else is shown as it is."""
    if isinstance(obj, Figure):
        from IPython.display import Image

        png = figure_png(obj)
        release(obj)
        return Image(data=png)
    return obj


class Explorer:
    """A drawing function, its controls and its current state; :meth:`show` puts it on screen.

    ``draw(**values)`` must return a matplotlib ``Figure`` or any object a notebook can display.
    ``static_options`` chooses, per control, the options drawn in advance for a page without a
    kernel (default: up to a dozen, evenly spaced, always including the first state).
    """

    def __init__(
        self,
        draw: Callable[..., Any],
        controls: Mapping[str, Any],
        initial: Mapping[str, Any] | None = None,
        title: str | None = None,
        static_options: Mapping[str, list] | None = None,
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
        self.static_options = dict(static_options or {})
        for name, opts in self.static_options.items():
            if name not in self.options:
                raise KeyError(f"static options for unknown control {name!r}; controls: {sorted(self.controls)}")
            for value in opts:
                self._check(name, value)
        self.handle = None  # IPython DisplayHandle of the figure, once shown live
        self.widget = None  # the ipywidgets box of controls, when interactive
        self.shown = False

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
        out = displayable(self.render(**changes))
        if self.handle is not None:
            self.handle.update(out)

    def static_states(self) -> dict[str, list[tuple[str, Any]]]:
        """The ``(label, value)`` options of each control that the static explorer draws in advance."""
        chosen = {}
        for name, spec in self.controls.items():
            labelled = _labels(spec)
            keep = self.static_options.get(name)
            chosen[name] = [lv for lv in labelled if keep is None or lv[1] in keep]
            if self.values[name] not in [v for _, v in chosen[name]]:
                chosen[name].insert(0, next(lv for lv in labelled if lv[1] == self.values[name]))
        values = limit_states({n: [v for _, v in lv] for n, lv in chosen.items()}, self.values)
        return {n: [lv for lv in chosen[n] if lv[1] in values[n]] for n in chosen}

    def static_html(self) -> str:
        """The static explorer as HTML: every state of :meth:`static_states` drawn, buttons to switch."""
        return selector_html(self.static_states(), self.draw, self.values, self.title)

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
        """Live: the controls and the current state as one output they redraw. Static: every
        precomputed state with buttons that switch between them (see the module docstring)."""
        from IPython.display import HTML, display

        self.shown = True
        if interactive_available():
            first = displayable(self.render())
            self.widget = self._build_widget()
            display(self.widget)
            self.handle = display(first, display_id=True)
        else:
            display(HTML(self.static_html()))

    def _ipython_display_(self) -> None:
        # An Explorer left as a cell's last value shows itself once, and never twice.
        if not self.shown:
            self.show()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.title or ''} {self.values}>"


def explorer(
    draw: Callable[..., Any],
    controls: Mapping[str, Any],
    initial: Mapping[str, Any] | None = None,
    title: str | None = None,
    static_options: Mapping[str, list] | None = None,
) -> Explorer:
    """Show ``draw``'s states: live controls that redraw it where a kernel and ipywidgets are
    present, otherwise precomputed states with buttons (see :class:`Explorer`).

    Returns the :class:`Explorer` (``.values``, ``.redraw(**changes)``); left as a cell's last
    value it displays nothing more.
    """
    ex = Explorer(draw, controls, initial, title, static_options)
    ex.show()
    return ex
