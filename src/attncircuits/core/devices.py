"""The devices this machine has: one check for every place that takes a ``device``, one choice of
the best one where none is given."""

from __future__ import annotations

import torch


def available() -> list[str]:
    """The device types this machine can run on, ``cpu`` first."""
    mps = getattr(torch.backends, "mps", None)
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) + (["mps"] if mps and mps.is_available() else [])


def check(device, what: str = "device") -> torch.device:
    """``device`` (a name such as ``"cuda:1"`` or a torch.device) as a torch.device this machine has,
    or a one-line ValueError naming the ones it has (``what``: how the caller names the argument)."""
    have = available()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{what} {device!r} is not a device; use one of {', '.join(have)}") from None
    if dev.type not in have:
        raise ValueError(f"{what} {device!r} is not available here (torch {torch.__version__}); use one of {', '.join(have)}")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"{what} {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def pick(device=None) -> torch.device:
    """``device`` checked (see :func:`check`), or the best this machine has: CUDA, then MPS, then the CPU."""
    if device:
        return check(device)
    have = available()
    return torch.device("cuda" if "cuda" in have else "mps" if "mps" in have else "cpu")
