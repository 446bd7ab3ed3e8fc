"""An explorer for a page without a kernel: a few precomputed states and buttons that switch between
them, in plain HTML and CSS. No script and nothing fetched, so it works in the built book offline.

Each control is a row of radio buttons; every state is drawn in advance (a figure becomes an inline
base64 PNG) and hidden, and one CSS rule per state shows it when its buttons are all checked
(``input:checked ~ input:checked ~ .states > .state``). The rules are scoped to one explorer by an
id made from its content, so several explorers on a page never interfere and a rebuild gives the
same page.
"""

from __future__ import annotations

import base64
import hashlib
import html
import itertools
from typing import Any, Sequence

from matplotlib.figure import Figure

from attncircuits.show.plotting.base import figure_png, release

#: At most this many options of one control are drawn in advance (evenly spaced, the first state kept).
MAX_OPTIONS = 12
#: At most this many states (combinations of options) in one static explorer.
MAX_STATES = 96


def pick(options: Sequence, keep, n: int) -> list:
    """``n`` options evenly spaced over ``options`` (all of them when there are no more than ``n``),
    always including ``keep``, in their original order."""
    opts = list(options)
    if len(opts) <= n:
        return opts
    idx = {round(i * (len(opts) - 1) / (n - 1)) for i in range(n)} if n > 1 else {0}
    idx.add(opts.index(keep))
    while len(idx) > n:  # keep's index pushed the count over: drop the evenly spaced one nearest to it
        k = opts.index(keep)
        idx.discard(min((i for i in idx if i != k), key=lambda i: abs(i - k)))
    return [opts[i] for i in sorted(idx)]


def limit_states(options: dict[str, list], initial: dict[str, Any], max_states: int = MAX_STATES) -> dict[str, list]:
    """Thin the longest option lists until the number of combinations is at most ``max_states``."""
    out = {k: pick(v, initial[k], MAX_OPTIONS) for k, v in options.items()}

    def count():
        n = 1
        for v in out.values():
            n *= len(v)
        return n

    while count() > max_states:
        name = max(out, key=lambda k: len(out[k]))
        if len(out[name]) <= 1:
            break
        out[name] = pick(out[name], initial[name], len(out[name]) - 1)
    return out


def state_html(obj: Any) -> str:
    """A drawn state as HTML: a figure as an inline PNG (then released from pyplot), an HTML view as
    itself, anything else as escaped text."""
    if isinstance(obj, Figure):
        png = base64.b64encode(figure_png(obj)).decode("ascii")
        release(obj)
        return f'<img src="data:image/png;base64,{png}" style="max-width:100%;height:auto" alt="">'
    if hasattr(obj, "_repr_html_"):
        return obj._repr_html_() or ""
    return f"<pre>{html.escape(str(obj))}</pre>"


def _css(uid: str) -> str:
    return (
        f"#{uid}>input{{position:absolute;opacity:0;width:1px;height:1px;margin:0}}"
        f"#{uid}>label{{display:inline-block;padding:0 7px;margin:2px 2px 2px 0;border:1px solid #bbb;"
        "border-radius:4px;cursor:pointer;font-size:0.9em;font-family:monospace;background:white}"
        f"#{uid}>input:checked+label{{background:#1f77b4;border-color:#1f77b4;color:white}}"
        f"#{uid}>input:focus-visible+label{{outline:2px solid #ff7f0e}}"
        f"#{uid}>.ac-name{{display:inline-block;min-width:4.5em;font-size:0.9em;font-weight:bold}}"
        f"#{uid}>.ac-states>div{{display:none;margin-top:6px}}"
    )


def selector_html(
    controls: dict[str, list[tuple[str, Any]]],
    draw,
    initial: dict[str, Any],
    title: str | None = None,
    note: str = "Precomputed states of this explorer; in a running notebook its controls are live.",
) -> str:
    """The static explorer: ``controls[name] = [(label, value), ...]`` (the options drawn in advance),
    ``draw(**values)`` called once per combination, ``initial`` the combination shown first."""
    names = list(controls)
    combos = list(itertools.product(*(range(len(controls[n])) for n in names)))
    states = []
    for combo in combos:
        values = {n: controls[n][i][1] for n, i in zip(names, combo)}
        states.append(state_html(draw(**values)))
    first = tuple(next(i for i, (_, v) in enumerate(controls[n]) if v == initial[n]) for n in names)
    uid = "ac-" + hashlib.sha1("".join(names + states).encode()).hexdigest()[:12]
    rules = []
    for combo in combos:
        key = "-".join(map(str, combo))
        checked = " ~ ".join(f"input.c{c}o{i}:checked" for c, i in enumerate(combo))
        rules.append(f"#{uid}>{checked} ~ .ac-states>.s{key}{{display:block}}")
    parts = [f'<div class="attncircuits-explorer" id="{uid}"><style>{_css(uid)}{"".join(rules)}</style>']
    if title:
        parts.append(f'<div style="font-weight:bold">{html.escape(title)}</div>')
    if note:
        parts.append(f'<div style="font-size:0.8em;opacity:.75;margin-bottom:4px">{html.escape(note)}</div>')
    for c, name in enumerate(names):
        parts.append(f'{"<br>" if c else ""}<span class="ac-name">{html.escape(name)}</span>')
        for i, (label, _) in enumerate(controls[name]):
            iid = f"{uid}-{c}-{i}"
            checked = " checked" if i == first[c] else ""
            parts.append(f'<input type="radio" name="{uid}-{c}" id="{iid}" class="c{c}o{i}"{checked}>'
                         f'<label for="{iid}">{html.escape(str(label))}</label>')
    parts.append('<div class="ac-states">')
    for combo, body in zip(combos, states):
        parts.append(f'<div class="s{"-".join(map(str, combo))}">{body}</div>')
    parts.append("</div></div>")
    return "".join(parts)
