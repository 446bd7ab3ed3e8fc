"""The live recipe of chapter 7 (``attncircuits.train.live``): a smoke run and bad input.

The full run, the regression test of the recipe, runs once in ``make test``: chapter 7's live cell under
nbval, whose assert cell checks prefix matching >= 0.5 and the copy ratio <= 1/2 (and prints the time).
"""


import numpy as np
import pytest
import torch

from attncircuits.checkpoints.pretrained import load_validation_tokens
from attncircuits.train import live

SMALL = {"d_model": 32, "n_heads": 2, "d_head": 16, "d_vocab": 64, "n_ctx": 40, "steps": 12, "eval_every": 4,
         "batch_size": 4}


@pytest.fixture(scope="module")
def small_streams():
    """Validation tokens mapped to the smoke run's 64 ids (both streams: a smoke run learns nothing)."""
    v = live.vocab_map(SMALL["d_vocab"])[load_validation_tokens().numpy()]
    return v, v


def test_vocab_map():
    m = live.vocab_map(256)
    assert m.shape == (2048,) and m[0] == 0 and m.max() == 255
    assert len(np.unique(m)) == 256  # ids 0..254 kept, one each, and the merged id
    assert (np.bincount(m) > 1).sum() == 1 and np.bincount(m)[255] == 2048 - 255
    with pytest.raises(ValueError, match="between 2 and"):
        live.vocab_map(4096)


def test_smoke_run_callback_figure_and_early_stop(small_streams, monkeypatch):
    run = live.live_train(plot=True, max_minutes=None, streams=small_streams, **SMALL)
    assert run.log["step"] == [0, 4, 8, 12]  # one row per evaluation, the last at the step budget
    assert run.model.training is False and run.model.cfg.d_model == 32
    ax_bar, ax_score, ax_loss = run.figure.axes
    assert ax_bar.patches[0].get_width() == 12 and "step 12 of 12" in ax_bar.get_title()
    assert list(ax_score.lines[0].get_xdata()) == run.log["step"]
    assert list(ax_loss.lines[1].get_ydata()) == run.log["second"]
    # targets that any model meets: the run stops at the first evaluation and marks the moment
    monkeypatch.setattr(live, "TARGET_PREFIX_MATCHING", -1.0)
    monkeypatch.setattr(live, "TARGET_COPY_RATIO", 10.0)
    early = live.live_train(plot=True, max_minutes=None, streams=small_streams, **SMALL)
    assert early.formed_step == 0 and early.log["step"] == [0] and early.reached
    assert "heads formed at step 0" in early.figure.axes[0].get_title()
    assert any("heads formed" in t.get_text() for t in early.figure.axes[1].texts)
    full = live.live_train(plot=False, max_minutes=None, streams=small_streams, stop_at_targets=False, **SMALL)
    assert full.formed_step == 0 and full.log["step"][-1] == 12 and full.figure is None


def test_live_figure_updates_one_display_in_place():
    class Handle:
        def __init__(self):
            self.shown = []

        def update(self, obj):
            self.shown.append(obj)

    fig = live.LiveFigure(steps=10, n_layers=2, min_redraw_s=3600)
    fig.handle = Handle()
    log = {"step": [0], "wall_s": [0.0], "prev_token": [0.1], "prefix_matching": [0.1], "first": [5.0],
           "second": [4.0], "formed_step": None}
    fig.update(log)
    fig.update(log)  # within min_redraw_s: skipped
    fig.update({**log, "formed_step": 0}, done=True, note=": done")  # the last state always drawn
    assert fig.handle.shown == [fig.fig, fig.fig]
    assert fig.ax_bar.get_title().endswith(": done") and len(fig.ax_score.lines) == 4


def test_threads_and_gradients_restored(small_streams):
    before = torch.get_num_threads()
    with torch.no_grad():  # as in a chapter that analyses without gradients: the run still trains
        run = live.live_train(max_minutes=1.0, plot=False, streams=small_streams, threads=1, **{**SMALL, "steps": 4})
        assert not torch.is_grad_enabled()
    assert torch.get_num_threads() == before
    assert run.log["step"] == [0, 4] and run.prep_s > 0


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"n_ctx": 16}, "n_ctx >= 33"),
        ({"batch_size": 10**6}, "use batch_size <= "),
        ({"n_layers": 0}, "no heads to score"),
        ({"eval_every": 100, "steps": 10}, "use eval_every <= 10"),
        ({"repeat_frac": 0.8, "random_repeat_frac": 0.5}, "random_repeat_frac must be at most 1"),
        ({"steps": 0}, r"steps must be a whole number >= 1 \(got 0\)"),
        ({"batch_size": 0}, r"batch_size must be a whole number >= 1"),
    ],
)
def test_bad_input_is_refused_before_training(overrides, message):
    with pytest.raises(ValueError, match=message):
        live.live_train(plot=False, streams=(np.zeros(0), np.zeros(0)), **overrides)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"d_model": "128"}, TypeError, "d_model must be an int, got '128'"),
    ({"n_ctx": 64.5}, TypeError, "n_ctx must be an int, got 64.5"),
    ({"n_heads": True}, TypeError, "n_heads must be an int, got True"),
    ({"init_std_embed": float("nan")}, TypeError, "init_std_embed must be a finite number, got nan"),
    ({"init_std_embed": 0.0}, ValueError, "init_std_embed must be above 0"),
    ({"threads": -1}, ValueError, "threads must be at least 1, got -1"),
    ({"threads": 1.5}, TypeError, "threads must be an int, got 1.5"),
    ({"max_minutes": "5"}, TypeError, "max_minutes must be a finite number"),
    ({"max_minutes": 0}, ValueError, "max_minutes must be above 0"),
])
def test_argument_types_are_refused_in_one_line_before_training(kwargs, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(")) as err:
        live.live_train(plot=False, streams=(np.zeros(0), np.zeros(0)), **kwargs)
    assert "\n" not in str(err.value)


def test_run_that_will_not_fit_the_time(small_streams):
    with pytest.raises(ValueError, match=r"over max_minutes=0.0001; use steps <= \d+"):
        live.live_train(plot=False, max_minutes=1e-4, streams=small_streams, **{**SMALL, "steps": 10**6})


def test_other_bad_input(small_streams):
    with pytest.raises(TypeError, match="unknown setting"):
        live.live_train(plot=False, n_layer=1)
    with pytest.raises(ValueError, match="outside d_vocab=32"):
        live.live_train(plot=False, streams=small_streams, **{**SMALL, "d_vocab": 32})
    short = (small_streams[0][:30], small_streams[1][:30])
    with pytest.raises(ValueError, match="longer than the token streams"):
        live.live_train(plot=False, streams=short, **SMALL)
    cfgs = live.live_configs(batch_size=64)
    need = live.step_memory_bytes(cfgs[0], 64)
    assert live.step_memory_bytes(cfgs[0], 32) < need / 1.9  # activations dominate at this size
    with pytest.raises(ValueError, match=r"GiB allowed \(half this machine's memory\); use batch_size <= 3[01]$"):
        live.check_live_config(*cfgs, memory_limit=need // 2)
    with pytest.raises(ValueError, match="use a smaller model"):
        live.check_live_config(*cfgs, memory_limit=1000)


def test_cli_refuses_the_live_preset(capsys):
    from attncircuits.train.cli import main

    with pytest.raises(SystemExit):
        main(["--preset", live.LIVE_PRESET])
    assert "live_train()" in capsys.readouterr().err
