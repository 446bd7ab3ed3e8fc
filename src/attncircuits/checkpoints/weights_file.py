"""A checkpoint's weights file read safely: the shapes its config gives (computed without building a
model too large for this machine), then the file's header checked against them, then its tensors
(float, finite) loaded. Used by :mod:`attncircuits.checkpoints.pretrained`."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file


#: the dtypes a checkpoint's weights may have (loaded as float32)
WEIGHT_DTYPES = ("F16", "BF16", "F32", "F64")


#: models up to this many numbers (about 256 MB) are built on the CPU to read their shapes
SHAPES_ON_CPU = 2**26


def _size_bound(cfg) -> int:
    """More numbers than a model of ``cfg`` allocates (weights, masks, position tables)."""
    per_layer = (4 * cfg.n_heads * cfg.d_head * (cfg.d_model + 1) + 2 * cfg.d_mlp * (cfg.d_model + 1)
                 + 6 * cfg.d_model + 2 * cfg.n_ctx * (cfg.n_ctx + cfg.d_head))
    return 2 * (cfg.d_vocab * (2 * cfg.d_model + 1) + 2 * cfg.n_ctx * cfg.d_model + cfg.n_layers * per_layer)


def expected_shapes(config) -> dict[str, tuple]:
    """The shape of every tensor a checkpoint of ``config`` holds (the model's ``weights()``).
    A config too large to build here (a vocabulary of 10**9 tokens) is built on torch's meta
    device, which allocates nothing; the course's sizes are built on the CPU, a few milliseconds,
    as arithmetic on the meta device imports torch._dynamo and sympy on first use (about 2 s in
    every process that loads a checkpoint)."""
    device = "cpu" if _size_bound(config) <= SHAPES_ON_CPU else "meta"
    with torch.device(device), torch.random.fork_rng(devices=[]):
        return {k: tuple(v.shape) for k, v in config.build().weights().items()}


def read_weights(weights: Path, expected: dict[str, tuple]) -> dict:
    """The tensors of ``weights``, once its header shows each has the expected name, shape and a
    float dtype: nothing is allocated for a file that disagrees with its config."""
    fix = "restore it from git or retrain"
    try:
        with safe_open(weights, "pt") as f:
            header = {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}
    except Exception as err:  # noqa: BLE001 (safetensors raises several kinds for a damaged file)
        raise ValueError(f"{weights} is not a readable safetensors file ({err}); {fix}") from None
    got = {k: shape for k, (shape, _) in header.items()}
    if expected != got:
        diff = {k: (expected.get(k), got.get(k)) for k in sorted(set(expected) | set(got)) if expected.get(k) != got.get(k)}
        raise ValueError(f"config and weights in {weights.parent} disagree (name: (config shape, file shape)): {diff}")
    bad = sorted(f"{k} ({dtype})" for k, (_, dtype) in header.items() if dtype not in WEIGHT_DTYPES)
    if bad:
        raise ValueError(f"{weights} holds tensors that are not float weights: {', '.join(bad)}; {fix}")
    try:
        sd = load_file(weights)
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"{weights} is not a readable safetensors file ({err}); {fix}") from None
    nonfinite = [k for k, v in sd.items() if not torch.isfinite(v).all()]
    if nonfinite:
        raise ValueError(f"{weights} holds NaN or infinite weights ({', '.join(nonfinite)}); {fix}")
    return sd
