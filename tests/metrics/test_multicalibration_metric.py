"""The streaming MulticalibrationError equals the functional on all rows, whatever the batches
and their order; its checks name the argument; DDP (two gloo ranks, one of them empty) equals
one process."""

from __future__ import annotations

import pytest
import torch
from ddp_helpers import gathered

from torchcal.functional.multicalibration import multicalibration_error, segment_masks
from torchcal.metrics import MulticalibrationError


def _data(n: int = 3000):
    g = torch.Generator().manual_seed(5)
    p = torch.rand(n, generator=g, dtype=torch.float64)
    a = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    y = torch.bernoulli((p + 0.08 * (a - 1) * torch.sign(x)).clamp(0, 1), generator=g)
    w = torch.rand(n, generator=g, dtype=torch.float64) + 0.5
    return p, y, torch.stack([a.double(), x], 1), w


def _metric() -> MulticalibrationError:
    return MulticalibrationError(["a", "x"], numeric=["x"], depth=2, min_rows=100, bins=3)


def test_streamed_equals_the_functional_in_any_batch_order() -> None:
    p, y, f, w = _data()
    masks, labels = segment_masks(
        {"a": f[:, 0].long(), "x": f[:, 1]}, depth=2, min_rows=100, bins=3
    )
    ref = multicalibration_error(p, y, masks, weight=w)
    m = _metric()
    perm = torch.randperm(len(p), generator=torch.Generator().manual_seed(1))
    for part in torch.tensor_split(perm, 7):
        m.update(p[part], y[part], f[part], w[part])
    got = m.compute()
    assert m.segment_labels() == labels
    torch.testing.assert_close(got.ecce, ref.ecce, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(got.ecce_sigma, ref.ecce_sigma, rtol=1e-12, atol=1e-12)
    assert got.worst == ref.worst
    assert float(got.mce_sigma) > 4  # the planted +-8 point segments are found


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="^columns: expected distinct"):
        MulticalibrationError(["a", "a"])
    with pytest.raises(ValueError, match="^numeric: expected names among columns"):
        MulticalibrationError(["a"], numeric=["b"])
    with pytest.raises(TypeError, match="^depth: expected an int"):
        MulticalibrationError(["a"], depth=1.5)
    m = MulticalibrationError(["a", "b"])
    p = torch.rand(4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^features: expected shape \(4, 2\)"):
        m.update(p, torch.ones(4), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="^MulticalibrationError: compute"):
        m.compute()
    with pytest.raises(ValueError, match=r"^weight: expected shape \(4,\)"):
        m.update(p, torch.ones(4), torch.zeros(4, 2), torch.ones(3))
    m.update(p, torch.ones(4), torch.full((4, 2), 0.5))
    with pytest.raises(ValueError, match="^features: categorical column 'a' holds non-integer"):
        m.compute()


def _worker(rank: int) -> torch.Tensor:
    p, y, f, w = _data()
    m = _metric()
    if rank == 0:  # rank 1 sees no rows at all
        m.update(p, y, f, w)
    return m.compute().ecce


@pytest.mark.ddp
@pytest.mark.timeout(60)
def test_two_ranks_one_empty_equal_one_process(tmp_path):
    ranks = gathered(_worker, tmp_path)
    p, y, f, w = _data()
    m = _metric()
    m.update(p, y, f, w)
    want = m.compute().ecce
    for rank, got in enumerate(ranks):
        assert torch.equal(got, want), rank
