"""plotting.py: figures get the right shapes and labels; the token view is script-free HTML."""

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attncircuits.plotting import attention_heatmap, loss_curve, tokens_html  # noqa: E402


def test_attention_heatmap_labels_and_scale():
    pat = torch.tril(torch.rand(4, 4))
    fig = attention_heatmap(pat, ["a", " b", "\n", "c"], title="L0H1")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "·b", "⏎", "c"]
    assert ax.get_title() == "L0H1"
    assert ax.images[0].get_clim() == (0.0, 1.0)  # fixed scale: heads comparable by colour
    np.testing.assert_allclose(ax.images[0].get_array(), pat.numpy())
    plt.close(fig)


def test_attention_heatmap_bad_input():
    with pytest.raises(ValueError, match="one label per position"):
        attention_heatmap(np.eye(3), ["a", "b"])
    with pytest.raises(ValueError, match="pick one batch row and head"):
        attention_heatmap(np.ones((1, 3, 3)), ["a", "b", "c"])


def test_loss_curve_skips_missing_points_and_checks_keys():
    hist = {"tokens": [0, 10, 20], "train_loss": [None, 5.0, 4.0], "val_loss": [8.0, 6.0, 5.0]}
    fig = loss_curve(hist, hlines={"unigram": 7.0})
    lines = fig.axes[0].get_lines()
    assert list(lines[0].get_xdata()) == [10, 20] and list(lines[1].get_ydata()) == [8.0, 6.0, 5.0]
    plt.close(fig)
    with pytest.raises(KeyError, match="available"):
        loss_curve(hist, keys=("nope",))


def test_tokens_html_is_plain_html_with_visible_whitespace():
    out = tokens_html(["def", " f", "(", "):\n", "<b>"], [0.0, 0.5, 1.0, 0.25, 0.0], highlight=2, title="L0H0")
    text = out.data
    assert "<script" not in text.lower() and "javascript" not in text.lower()
    assert not re.search(r"\son\w+\s*=", text)  # no event handlers either
    assert "·f" in text and "):⏎" in text and "<br>" in text
    assert "&lt;b&gt;" in text  # token text is escaped, never interpreted as markup
    alphas = [float(a) for a in re.findall(r"rgba\(31,119,180,([0-9.]+)\)", text)]
    assert alphas == [0.0, 0.5, 1.0, 0.25, 0.0]  # shade is weight / max weight
    assert text.count("outline:") == 1 and 'title="position 2: 1.000"' in text
    assert out._repr_html_() == text  # displays as text/html in notebooks and the book


def test_tokens_html_signed_weights_and_bad_input():
    text = tokens_html(["a", "b"], torch.tensor([-2.0, 1.0])).data
    assert "rgba(214,39,40,1.000)" in text and "rgba(31,119,180,0.500)" in text
    with pytest.raises(ValueError, match="one weight per token"):
        tokens_html(["a", "b"], [1.0])
    with pytest.raises(IndexError, match="use 0..1"):
        tokens_html(["a", "b"], [1.0, 0.0], highlight=5)
