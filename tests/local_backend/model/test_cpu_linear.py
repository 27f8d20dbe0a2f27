"""Prepacked CPU linears compute what nn.Linear computes, for every batch size."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from local_backend.model.cpu_linear import PackedLinear, pack_linears


@pytest.mark.parametrize("rows", [1, 8, 16, 128, 200])
def test_packed_linear_matches_dense(rows: int) -> None:
    torch.manual_seed(0)
    dense = nn.Linear(64, 96, bias=True)
    model = nn.Sequential(nn.Linear(64, 64), dense)
    reference = model(torch.randn(1, 64))  # make sure the plain model runs first
    assert reference.shape == (1, 96)
    x = torch.randn(rows, 64)
    expected = model(x)
    if pack_linears(model) == 0:
        pytest.skip("oneDNN prepacking is not available in this torch build")
    assert isinstance(model[1], PackedLinear)
    with torch.inference_mode():
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


def test_packing_leaves_the_state_dict_unchanged() -> None:
    model = nn.Sequential(nn.Linear(32, 32))
    before = set(model.state_dict())
    pack_linears(model)
    assert set(model.state_dict()) == before
