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
