"""The attention view (show/widgets/attention.py): the HTML it writes holds the patterns and the
tokens exactly enough and escaped, bad inputs raise one line naming the fix, and in a real browser
hovering a token shades the text by that token's row, the "to" button by its column."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from browser import CHROMIUM, Browser

from attncircuits.show.widgets import attention_view
from attncircuits.show.widgets.attention import LEVELS, VIEW_CLASS, view_data

#: tokens a page could break on: markup, entities, quotes, whitespace, a script's end, non-ASCII
TRICKY = ["<b>", "&amp;", '"q"', "it's", "a\nb", " ", "</script>", "\t", "é→", "x"]
#: the same, as the view shows them (whitespace made visible)
SHOWN = ["<b>", "&amp;", '"q"', "it's", "a⏎b", "·", "</script>", "⇥", "é→", "x"]


def _patterns(n_heads: int = 3, n: int = len(TRICKY), seed: int = 0) -> np.ndarray:
    """Random causal attention [head, query, key]: rows sum to 1, nothing after the query."""
    g = np.random.default_rng(seed)
    s = g.random((n_heads, n, n)) ** 3 * np.tril(np.ones((n, n)))
    return s / s.sum(-1, keepdims=True)


def _view(p=None, tokens=TRICKY, **kw) -> str:
    return attention_view(_patterns() if p is None else p, tokens, **kw).data


def test_the_data_round_trips_within_half_a_level():
    p = _patterns()
    data = view_data(_view(p, heads=["0.0", "1.0", "1.3"], selected=4, focus="1.0", mode="to"))
    np.testing.assert_allclose(data["weights"], p, atol=0.5 / LEVELS + 1e-9)
    assert data["heads"] == ["0.0", "1.0", "1.3"]
    assert (data["selected"], data["focus"], data["mode"]) == (4, 1, "to")
    # tokens travel with whitespace made visible (as every token label of the course)
    assert data["tokens"][4] == "a⏎b" and data["tokens"][5] == "·"


def test_a_tensor_and_the_defaults():
    p = torch.tensor(_patterns(2, 4))
    data = view_data(_view(p, tokens=list("abcd")))
    assert data["heads"] == ["head 0", "head 1"] and data["selected"] == 3 and data["focus"] == 0
    np.testing.assert_allclose(data["weights"], p.numpy(), atol=0.5 / LEVELS + 1e-9)


def test_token_text_is_escaped_everywhere():
    markup = _view()
    # in the text: each token escaped once, inside its own span
    spans = re.findall(r'<span class="ac-tok" data-i="\d+">(.*?)</span>', markup)
    assert spans[:4] == ["&lt;b&gt;", "&amp;amp;", "&quot;q&quot;", "it&#x27;s"]
    assert spans[6] == "&lt;/script&gt;"
    # one closing script tag per script block: a token cannot end the data block early
    assert markup.count("</script>") == 2 and markup.count("<script") == 2
    data_block = markup[markup.index('class="ac-data">') : markup.index("</script>")]
    assert "<" not in data_block.split(">", 1)[1] and "&" not in data_block
    assert view_data(markup)["tokens"] == SHOWN
    # a title and head names are escaped too
    titled = _view(title="a <i>b</i> & c", heads=["<h>", "1", "2"])
    assert "a &lt;i&gt;b&lt;/i&gt; &amp; c" in titled and '<div class="ac-name">&lt;h&gt;</div>' in titled


def test_the_view_fetches_nothing():
    markup = _view()
    assert not re.search(r"(src|href)\s*=|https?:|@import|url\(|fetch\(|XMLHttpRequest", markup)


def test_two_views_on_one_page_have_their_own_ids():
    ids = [re.search(rf'class="{VIEW_CLASS}" id="([^"]+)"', _view()).group(1) for _ in range(2)]
    assert ids[0] != ids[1]


@pytest.mark.parametrize(
    "kwargs, error, says",
    [
        ({"p": _patterns()[None]}, ValueError, r"one sequence's patterns \[head, query, key\].*cache.pattern\[layer\]\[0\]"),
        ({"p": _patterns()[0]}, ValueError, r"has shape \(10, 10\); pass one sequence's patterns"),
        ({"p": _patterns()[:, :, :9]}, ValueError, "10 queries but 9 keys; pass square"),
        ({"tokens": TRICKY[:7]}, ValueError, r"7 tokens for patterns over 10 positions; pass one token string per"),
        ({"tokens": list(range(10))}, TypeError, r"tokens must be strings; .*token_strs\(tokenizer, ids\)"),
        ({"heads": ["a", "b"]}, ValueError, "2 head names for 3 heads; pass one name per head"),
        ({"focus": 3}, IndexError, r"focus=3 but there are 3 heads; use 0..2"),
        ({"focus": "1.7", "heads": ["0.0", "1.0", "1.1"]}, ValueError, "focus='1.7' is not one of the heads 0.0, 1.0, 1.1"),
        ({"selected": 10}, IndexError, r"selected=10 but there are 10 tokens; use 0..9"),
        ({"mode": "both"}, ValueError, "mode='both'; use one of from, to"),
        ({"p": _patterns() * 5 - 1}, ValueError, r"weights in \[0, 1\].*not the scores"),
        ({"p": _patterns().transpose(0, 2, 1)}, ValueError, "keys after their query.*not transposed"),
    ],
)
def test_bad_inputs_raise_one_line_naming_the_fix(kwargs, error, says):
    with pytest.raises(error, match=says) as info:
        _view(**kwargs)
    assert "\n" not in str(info.value)


# ---- in a browser ----------------------------------------------------------------------------
_STATE = """(() => {
  const v = document.querySelector(".%s");
  return {selected: +v.dataset.selected, mode: v.dataset.mode, focus: +v.dataset.focus,
          text: [...v.querySelectorAll(".ac-tok")].map(t => +t.dataset.w),
          top: [...v.querySelectorAll(".ac-top")].map(t => t.textContent),
          shaded: [...v.querySelectorAll(".ac-tok")].map(t => t.style.background)};
})()""" % VIEW_CLASS


def _centre(b: Browser, selector: str, i: int) -> tuple[float, float]:
    """The centre, in viewport pixels, of the i-th element matching ``selector`` (scrolled into view)."""
    return tuple(b.evaluate(
        f"(() => {{ const e = document.querySelectorAll('{selector}')[{i}]; e.scrollIntoView({{block: 'center'}});"
        "const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    ))


def hover_and_read(b: Browser, page) -> list[dict]:
    """Open a page holding one view, then read its state: as loaded, after hovering token 6, after
    the "to" button, after clicking head panel 2 (the DOM each time)."""
    b.open(page)
    states = [b.evaluate(_STATE)]
    b.hover(*_centre(b, ".ac-tok", 6))
    states.append(b.evaluate(_STATE))
    b.click(*_centre(b, ".ac-bar button", 1))
    states.append(b.evaluate(_STATE))
    b.click(*_centre(b, ".ac-head", 2))
    states.append(b.evaluate(_STATE))
    return states


def check_states(states: list[dict], p: np.ndarray, tokens: list[str], selected: int) -> None:
    """What :func:`hover_and_read` read is what the patterns say, to the stored precision."""
    tol = 0.5 / LEVELS + 1e-3  # stored to half a level, shown to 3 decimals
    loaded, hovered, to, head2 = states
    assert loaded["selected"] == selected and loaded["mode"] == "from"
    np.testing.assert_allclose(loaded["text"], p[0, selected], atol=tol)
    assert hovered["selected"] == 6, "hovering token 6 did not select it"
    np.testing.assert_allclose(hovered["text"], p[0, 6], atol=tol)  # its row: where it looks
    assert [bool(s) for s in hovered["shaded"]] == list(p[0, 6] >= 0.5 / LEVELS)
    for h, top in enumerate(hovered["top"]):  # each head's strongest key, with its token
        k = int(p[h, 6].argmax())
        assert top.split("\n")[0] == f"{p[h, 6, k]:.2f} {tokens[k]} ({k})"
    assert to["mode"] == "to"
    np.testing.assert_allclose(to["text"], p[0, :, 6], atol=tol)  # its column: who looks at it
    assert head2["focus"] == 2
    np.testing.assert_allclose(head2["text"], p[2, :, 6], atol=tol)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium) to load the view in")
def test_hovering_a_token_in_chromium_shows_each_heads_attention_from_and_to_it(tmp_path):
    p = _patterns()
    page = tmp_path / "view.html"
    page.write_text(
        '<!doctype html><html><head><meta charset="utf-8"></head><body>'
        + _view(p, selected=2) + _view(p) + "</body></html>",  # a second view: the first is read
        encoding="utf-8",
    )
    with Browser(width=800) as b:
        states = hover_and_read(b, page)
        n_tokens = b.evaluate("document.querySelectorAll('.ac-tok').length")
    assert n_tokens == 2 * len(TRICKY)  # every token, the tricky ones too, is one box
    check_states(states, p, SHOWN, selected=2)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium) to load the view in")
def test_the_view_fits_a_phone_and_follows_the_colour_scheme(tmp_path):
    page = tmp_path / "view.html"
    page.write_text(f'<!doctype html><html><head><meta charset="utf-8"></head><body style="margin:0">'
                    f"{_view(_patterns(8, 10))}</body></html>", encoding="utf-8")
    read = f"""(() => {{ const v = document.querySelector(".{VIEW_CLASS}"), s = getComputedStyle(v);
      return [document.documentElement.scrollWidth, v.getBoundingClientRect().width, s.color, s.backgroundColor,
              new Set([...v.querySelectorAll(".ac-head")].map(h => h.getBoundingClientRect().left)).size]; }})()"""
    with Browser(width=390, height=700) as b:
        b.open(page, dark=False)
        width, view_width, fg_light, bg_light, columns = b.evaluate(read)
        b.open(page, dark=True)
        _, _, fg_dark, bg_dark, _ = b.evaluate(read)
    assert width <= 390 and view_width <= 390, "the view is wider than a phone's screen"
    assert columns == 2, f"8 head panels at 390 px sit {columns} to a row, not 2"
    assert (fg_light, bg_light) == ("rgb(36, 41, 47)", "rgb(255, 255, 255)")
    assert (fg_dark, bg_dark) == ("rgb(230, 237, 243)", "rgb(13, 17, 23)")
