"""The blocked CPU path of ``bin_ids`` (large inputs) bins exactly as the one-shot rule."""

from __future__ import annotations

import pytest
import torch

import torchcal.functional.calibration.binning as B


def _rule(conf: torch.Tensor, n_bins: int) -> torch.Tensor:
    return (conf.to(torch.float64) * n_bins).floor_().to(torch.int64).clamp_(0, n_bins - 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("n_bins", [1, 7, 10, 15])
def test_blocked_bin_ids_equal_the_rule_on_edges_and_odd_values(monkeypatch, dtype, n_bins):
    monkeypatch.setattr(B, "_BIN_BLOCK", 5)  # many blocks and a ragged last one
    edges = torch.tensor([k / n_bins for k in range(n_bins + 1)], dtype=torch.float64)
    odd = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.5, 2.0, 0.0, 1.0])
    x = torch.cat([edges, odd.double(), torch.rand(41, dtype=torch.float64)]).to(dtype)
    got = B.bin_ids(x.view(3, -1) if x.numel() % 3 == 0 else x, n_bins).reshape(-1)
    assert torch.equal(got, _rule(x, n_bins))
    assert B.bin_ids(x[:3], n_bins).tolist() == _rule(x[:3], n_bins).tolist()  # one block


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("n_bins", [1, 7, 10, 256])
def test_bin_counts_equal_bincount_of_the_rule(monkeypatch, dtype, n_bins):
    monkeypatch.setattr(B, "_BIN_BLOCK", 6)
    edges = torch.tensor([k / n_bins for k in range(n_bins + 1)], dtype=torch.float64)
    x = torch.cat([edges, torch.rand(53, dtype=torch.float64)]).to(dtype).view(-1, 1)
    ref = torch.bincount(_rule(x, n_bins).reshape(-1), minlength=n_bins)
    assert torch.equal(B.bin_counts(x, n_bins), ref)
    # unchecked input (validation off): NaN and values below 0 go to the first bin, above 1
    # to the last, as documented for bin_index
    odd = torch.tensor([float("nan"), -0.5, -1e30, 2.0, 1e30], dtype=dtype)
    want = torch.zeros(n_bins, dtype=torch.int64)
    want[0] += 3
    want[n_bins - 1] += 2
    assert torch.equal(B.bin_counts(odd, n_bins), want)
    big = torch.rand(70, dtype=dtype)
    assert torch.equal(  # more than 256 bins: the int64 path
        B.bin_counts(big, 300), torch.bincount(_rule(big, 300), minlength=300)
    )
