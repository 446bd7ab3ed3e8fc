import pytest
import torch

from attncircuits import ModelConfig, Transformer


@pytest.fixture
def tiny_cfg():
    return ModelConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, d_vocab=50, n_ctx=16)


@pytest.fixture
def tiny_model(tiny_cfg):
    torch.manual_seed(0)
    return Transformer(tiny_cfg).eval()


@pytest.fixture
def tiny_family(monkeypatch):
    """make family's recipe cut to 50 steps on small random streams (train, validation), returned."""
    import numpy as np

    from attncircuits.train import family

    monkeypatch.setattr(family, "RECIPE", {"steps": 50, "eval_every": 25, "eval_batches": 1})
    monkeypatch.setattr(family, "N_WINDOWS", 2)
    monkeypatch.setattr(family, "N_ICL_WINDOWS", 4)
    return tuple(np.random.default_rng(i).integers(0, 256, n).astype(np.uint16) for i, n in ((0, 20_000), (1, 4_000)))
