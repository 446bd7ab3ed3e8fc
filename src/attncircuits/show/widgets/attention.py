"""The attention view: hover or click a token and see where every head looks from it, or which
tokens look at it, the heads side by side.

One cell output of plain HTML, CSS and some 90 lines of JavaScript, with the patterns inside it: no
kernel, no ipywidgets, nothing fetched. So the same view works in Jupyter, on Colab and in the
built book, offline. (CircuitsVis, the field's usual view, inlines its 1.3 MB bundle into every
view only when its probe of the network fails, and otherwise writes the address of a CDN into the
output, which the book would then need; a view here is a few kB plus its patterns.)

The view has three parts:

- the text, each token as a box; hovering a token selects it, clicking pins it (click again to
  unpin; the arrow keys move a pinned token), and the text is shaded by the *focused* head;
- a row of small multiples, one panel per head: its three strongest weights with their tokens and
  a strip of its weights over every position; clicking a panel focuses that head;
- two buttons: attention **from** the selected token (its row: the keys it reads, blue) or **to**
  it (its column: the queries that read it, orange).

A shade's opacity is the attention weight itself (full at 1), the same scale for every head, so a
head that spreads its attention is faint everywhere. The patterns travel as one byte per weight of
the causal triangle (weights rounded to 1/255), base64 in a JSON ``<script>`` block, so a view of
8 heads over 128 tokens is about 110 kB. The colours follow the book theme's light and dark
modes (its CSS variables), JupyterLab's and VS Code's, and otherwise the reader's
``prefers-color-scheme``; at a phone's width the panels wrap two to a row and the text wraps.
"""

from __future__ import annotations

import base64
import html
import json
import uuid
from typing import Sequence

import numpy as np
from jaxtyping import Float

from attncircuits.data import visible
from attncircuits.show.plotting.base import numpy

#: The class of the view's outer ``<div>`` (its CSS is scoped under it).
VIEW_CLASS = "attncircuits-attention"
#: Weights are stored as ``round(w * LEVELS)`` in one byte each.
LEVELS = 255
#: The two directions the buttons switch between.
MODES = ("from", "to")

_CSS = """
.attncircuits-attention{--ac-fg0:#24292f;--ac-bg0:#fff;--ac-line0:#d0d7de;
 --ac-fg:var(--pst-color-text-base,var(--jp-content-font-color1,var(--vscode-editor-foreground,var(--ac-fg0))));
 --ac-bg:var(--pst-color-background,var(--jp-layout-color0,var(--vscode-editor-background,var(--ac-bg0))));
 --ac-line:var(--pst-color-border,var(--jp-border-color1,var(--ac-line0)));
 color:var(--ac-fg);background:var(--ac-bg);max-width:100%;box-sizing:border-box;
 font-size:14px;line-height:1.4;margin:4px 0}
@media (prefers-color-scheme:dark){.attncircuits-attention{--ac-fg0:#e6edf3;--ac-bg0:#0d1117;
 --ac-line0:#3d444d}}
.attncircuits-attention .ac-title{font-weight:bold;margin-bottom:4px}
.attncircuits-attention .ac-bar{display:flex;flex-wrap:wrap;gap:6px;align-items:center;margin:4px 0}
.attncircuits-attention button{font:inherit;color:inherit;background:transparent;cursor:pointer;
 border:1px solid var(--ac-line);border-radius:4px;padding:1px 8px}
.attncircuits-attention button[aria-pressed=true]{border-color:currentColor;font-weight:bold}
.attncircuits-attention .ac-hint,.attncircuits-attention .ac-legend{font-size:12px;opacity:.8}
.attncircuits-attention .ac-text{position:relative;font-family:monospace;font-size:13px;line-height:1.9;
 max-height:22em;overflow-y:auto;overflow-wrap:anywhere;padding:2px 0;outline-offset:2px;
 border-top:1px solid var(--ac-line);border-bottom:1px solid var(--ac-line)}
.attncircuits-attention .ac-tok{border:1px solid var(--ac-line);border-radius:3px;padding:0 2px;
 margin:0 1px;white-space:pre;cursor:pointer}
.attncircuits-attention .ac-tok.ac-sel{outline:2px solid #ff7f0e;outline-offset:0}
.attncircuits-attention .ac-heads{display:grid;gap:6px;margin-top:6px;
 grid-template-columns:repeat(auto-fill,minmax(150px,1fr))}
.attncircuits-attention .ac-head{border:1px solid var(--ac-line);border-radius:4px;padding:3px 5px;
 cursor:pointer;min-width:0}
.attncircuits-attention .ac-head.ac-focus{border:2px solid currentColor;padding:2px 4px}
.attncircuits-attention .ac-name{font-weight:bold;font-size:13px}
.attncircuits-attention .ac-strip{display:flex;height:12px;border:1px solid var(--ac-line);margin:2px 0}
.attncircuits-attention .ac-strip>i{flex:1 1 0;min-width:0}
.attncircuits-attention .ac-strip>i.ac-sel{box-shadow:inset 0 -3px currentColor}
.attncircuits-attention .ac-top{font-family:monospace;font-size:12px;white-space:pre;overflow:hidden;
 text-overflow:ellipsis}
"""

# Reads its data block, then redraws on every hover, click, key and button. `w(h, q, k)` is head
# h's weight from query q to key k (0 above the diagonal: keys after the query).
_JS = """
(function () {
  var root = document.getElementById("__ID__");
  if (!root || root.dataset.ready) return;
  root.dataset.ready = "1";
  var d = JSON.parse(root.querySelector("script.ac-data").textContent);
  var raw = atob(d.weights), bytes = new Uint8Array(raw.length);
  for (var i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  var n = d.tokens.length, tri = n * (n + 1) / 2;
  var toks = root.querySelectorAll(".ac-tok"), panels = root.querySelectorAll(".ac-head");
  var rgb = {from: "31,119,180", to: "230,120,20"};
  var s = {sel: d.selected, pinned: false, focus: d.focus, mode: d.mode};
  function w(h, q, k) { return k > q ? 0 : bytes[h * tri + q * (q + 1) / 2 + k] / d.levels; }
  function weight(h, i) { return s.mode === "from" ? w(h, s.sel, i) : w(h, i, s.sel); }
  function shade(el, a) {
    el.style.background = a > 0 ? "rgba(" + rgb[s.mode] + "," + a.toFixed(3) + ")" : "";
    el.style.color = a > 0.55 ? "#fff" : "";
  }
  function draw() {
    root.dataset.mode = s.mode; root.dataset.selected = s.sel; root.dataset.focus = s.focus;
    toks.forEach(function (el, i) {
      var a = weight(s.focus, i);
      shade(el, a); el.dataset.w = a.toFixed(3);
      el.classList.toggle("ac-sel", i === s.sel);
      el.title = "position " + i + ": " + a.toFixed(3) + " (" + d.heads[s.focus] + ")";
    });
    panels.forEach(function (p, h) {
      p.classList.toggle("ac-focus", h === s.focus);
      p.setAttribute("aria-pressed", h === s.focus);
      var ws = [], strip = p.querySelector(".ac-strip");
      for (var i = 0; i < n; i++) ws.push([weight(h, i), i]);
      strip.querySelectorAll("i").forEach(function (c, i) {
        shade(c, ws[i][0]); c.classList.toggle("ac-sel", i === s.sel);
      });
      ws.sort(function (a, b) { return b[0] - a[0]; });
      p.querySelector(".ac-top").textContent = ws.slice(0, 3).map(function (x) {
        return x[0].toFixed(2) + " " + d.tokens[x[1]] + " (" + x[1] + ")";
      }).join("\\n");
    });
    root.querySelectorAll(".ac-bar button").forEach(function (b) {
      b.setAttribute("aria-pressed", b.dataset.mode === s.mode);
    });
    root.querySelector(".ac-what").textContent = (s.mode === "from"
      ? "where position " + s.sel + " looks (its keys)"
      : "which positions look at " + s.sel + " (its queries)") + (s.pinned ? ", pinned" : "");
  }
  function pick(e) { var t = e.target.closest(".ac-tok"); return t ? +t.dataset.i : -1; }
  var text = root.querySelector(".ac-text");
  text.addEventListener("mouseover", function (e) {
    var i = pick(e); if (i >= 0 && !s.pinned && i !== s.sel) { s.sel = i; draw(); }
  });
  text.addEventListener("click", function (e) {
    var i = pick(e); if (i < 0) return;
    s.pinned = !(s.pinned && i === s.sel); s.sel = i; text.focus(); draw();
  });
  text.addEventListener("keydown", function (e) {
    var step = {ArrowLeft: -1, ArrowRight: 1}[e.key];
    if (!step) return;
    e.preventDefault(); s.pinned = true; s.sel = Math.min(n - 1, Math.max(0, s.sel + step)); draw();
  });
  panels.forEach(function (p, h) {
    p.addEventListener("click", function () { s.focus = h; draw(); });
    p.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); s.focus = h; draw(); }
    });
  });
  root.querySelectorAll(".ac-bar button").forEach(function (b) {
    b.addEventListener("click", function () { s.mode = b.dataset.mode; draw(); });
  });
  draw();
  text.scrollTop = toks[s.sel].offsetTop - text.clientHeight / 3;  // the selected token in sight
})();
"""


def _json_for_script(obj) -> str:
    """JSON that cannot end its ``<script>`` block: ``<``, ``>`` and ``&`` become ``\\u00XX``."""
    text = json.dumps(obj, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _check(p: np.ndarray, tokens: Sequence[str], heads: Sequence[str] | None) -> list[str]:
    """Head names after checking every input, each error one line naming the fix."""
    if p.ndim != 3:
        raise ValueError(
            f"patterns has shape {tuple(p.shape)}; pass one sequence's patterns [head, query, key], "
            "e.g. cache.pattern[layer][0]"
        )
    n_heads, n_q, n_k = p.shape
    if n_q != n_k:
        raise ValueError(f"patterns has {n_q} queries but {n_k} keys; pass square [head, query, key] patterns")
    if n_heads == 0 or n_q == 0:
        raise ValueError(f"patterns has shape {tuple(p.shape)}; pass at least one head and one token")
    if len(tokens) != n_q:
        raise ValueError(
            f"{len(tokens)} tokens for patterns over {n_q} positions; pass one token string per "
            "position (e.g. token_strs(tokenizer, ids) for the same ids)"
        )
    if not all(isinstance(t, str) for t in tokens):
        raise TypeError("tokens must be strings; turn ids into text with token_strs(tokenizer, ids)")
    if not np.isfinite(p).all() or p.min() < -1e-6 or p.max() > 1 + 1e-6:
        raise ValueError(
            "patterns must be attention weights in [0, 1]; pass the softmaxed pattern "
            "(cache.pattern), not the scores (cache.attn_scores)"
        )
    if np.triu(p, k=1).max(initial=0.0) > 1e-6:
        raise ValueError(
            "patterns put weight on keys after their query; the view shows causal attention: pass "
            "[head, query, key] patterns of a causal model (not transposed)"
        )
    names = [f"head {h}" for h in range(n_heads)] if heads is None else [str(h) for h in heads]
    if len(names) != n_heads:
        raise ValueError(f"{len(names)} head names for {n_heads} heads; pass one name per head")
    return names


def _index(value: int | str | None, what: str, count: int, noun: str, names: Sequence[str] = ()) -> int:
    """``value`` as an index below ``count``: an int, or one of ``names`` (a head's name)."""
    if value is None:
        return count - 1 if what == "selected" else 0
    if isinstance(value, str) and names:
        if value not in names:
            raise ValueError(f"{what}={value!r} is not one of the {noun} {', '.join(names)}; pass one of them")
        return list(names).index(value)
    if not 0 <= int(value) < count:
        raise IndexError(f"{what}={value} but there are {count} {noun}; use 0..{count - 1}")
    return int(value)


def attention_view(
    patterns: Float[np.ndarray, "head query key"],
    tokens: Sequence[str],
    heads: Sequence[str] | None = None,
    title: str | None = None,
    selected: int | None = None,
    focus: int | str | None = None,
    mode: str = "from",
):
    """The explorable view of ``patterns[head, query, key]`` (one sequence, e.g.
    ``cache.pattern[layer][0]``, or several layers' heads stacked) over ``tokens`` (one string per
    position, e.g. ``token_strs(tokenizer, ids)``; shown with whitespace made visible).

    ``heads`` names the heads (e.g. ``[head_name(1, h) for h in range(4)]``); ``selected`` is the
    token selected before any hover (default: the last), ``focus`` the head that shades the text
    (an index or one of ``heads``; default the first) and ``mode`` ``"from"`` or ``"to"``.

    Returns an ``IPython.display.HTML``: a notebook shows it when a cell ends in the call, and the
    built book keeps it as the cell's ``text/html`` output, script included.
    """
    p = numpy(patterns)
    names = _check(p, tokens, heads)
    n = p.shape[1]
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; use one of {', '.join(MODES)}")
    sel = _index(selected, "selected", n, "tokens")
    foc = _index(focus, "focus", len(names), "heads", names)
    rows, cols = np.tril_indices(n)  # row-major triangle: query q's keys start at q(q+1)/2
    levels = np.rint(np.clip(p[:, rows, cols], 0.0, 1.0) * LEVELS).astype(np.uint8)
    data = {
        "tokens": [visible(t) for t in tokens],
        "heads": names,
        "levels": LEVELS,
        "weights": base64.b64encode(levels.tobytes()).decode("ascii"),
        "selected": sel,
        "focus": foc,
        "mode": mode,
    }
    view_id = f"ac-attn-{uuid.uuid4().hex[:12]}"
    spans = []
    for i, tok in enumerate(data["tokens"]):
        spans.append(f'<span class="ac-tok" data-i="{i}">{html.escape(tok)}</span>')
        if "⏎" in tok:
            spans.append("<br>")
    strip = "<i></i>" * n
    panels = "".join(
        f'<div class="ac-head" role="button" tabindex="0" data-h="{h}"><div class="ac-name">{html.escape(name)}</div>'
        f'<div class="ac-strip">{strip}</div><div class="ac-top"></div></div>'
        for h, name in enumerate(names)
    )
    buttons = "".join(
        f'<button type="button" data-mode="{m}" aria-pressed="{str(m == mode).lower()}">{label}</button>'
        for m, label in zip(MODES, ("from the token", "to the token"))
    )
    title_div = f'<div class="ac-title">{html.escape(title)}</div>' if title else ""
    markup = (
        f'<div class="{VIEW_CLASS}" id="{view_id}"><style>{_CSS}</style>{title_div}'
        f'<div class="ac-bar">{buttons}<span class="ac-hint">hover a token (click pins it); click a '
        f'head to shade the text by it</span></div>'
        f'<div class="ac-text" tabindex="0">{"".join(spans)}</div>'
        f'<div class="ac-legend">shade: attention weight (full at 1) of the framed head; '
        f'<span class="ac-what"></span></div>'
        f'<div class="ac-heads">{panels}</div>'
        f'<noscript>This view needs JavaScript to follow the pointer.</noscript>'
        f'<script type="application/json" class="ac-data">{_json_for_script(data)}</script>'
        f"<script>{_JS.replace('__ID__', view_id)}</script></div>"
    )
    from IPython.display import HTML

    return HTML(markup)


def view_data(markup: str) -> dict:
    """The data block of a view's HTML, with ``weights`` decoded to ``[head, query, key]`` floats
    (the inverse of :func:`attention_view`'s encoding; used by the tests and by anyone checking what
    a page holds)."""
    start = markup.index('<script type="application/json" class="ac-data">')
    start = markup.index(">", start) + 1
    data = json.loads(markup[start : markup.index("</script>", start)])
    n, n_heads = len(data["tokens"]), len(data["heads"])
    flat = np.frombuffer(base64.b64decode(data["weights"]), dtype=np.uint8).reshape(n_heads, -1)
    full = np.zeros((n_heads, n, n))
    rows, cols = np.tril_indices(n)
    full[:, rows, cols] = flat / data["levels"]
    data["weights"] = full
    return data
