"""One head type and one head label for the whole package."""

import pytest
import torch

from attncircuits.analysis import scores
from attncircuits.analysis.circuits import composition
from attncircuits.core import heads
from attncircuits.core.heads import head_name
from attncircuits.models import transformer as model


def test_head_name_is_layer_dot_head():
    assert head_name(1, 0) == "1.0"
    assert head_name(torch.tensor(0), torch.tensor(7)) == "0.7"  # tensor indices print as integers
    with pytest.raises(TypeError, match=r"head_name\(\*h\)"):
        head_name((1, 0), 0)


def test_one_head_type():
    assert model.Head is heads.Head and composition.Head is heads.Head and scores.Head is heads.Head


def test_every_label_comes_from_head_name():
    hs = scores.HeadScores(previous_token=torch.zeros(2, 3), prefix_matching=torch.zeros(2, 3), copying=torch.zeros(2, 3))
    assert [r["head"] for r in hs.rows()] == [head_name(l, h) for l in range(2) for h in range(3)]
    assert hs.table().splitlines()[5].split()[0] == "1.1"
