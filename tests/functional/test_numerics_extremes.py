"""Regressions of issue 18 (numerics): scores at the edge of float32's range, and reductions
whose last bit does not depend on the number of threads."""

from __future__ import annotations

import math

import pytest
import torch

from torchcal.functional import (
    brier_score,
    confidence_penalty,
    crps_ensemble,
    crps_normal,
    energy_score,
    log_score,
    ranked_probability_score,
    spherical_score,
)
from torchcal.functional._checks import PARALLEL_GRAIN, fixed_sum

BIG = 3e38  # 2 * BIG overflows float32


def test_spherical_binary_near_float_max():
    """A certain right forecast scores 0, a certain wrong one 1 (2z used to overflow: 1.0)."""
    z = torch.tensor([BIG, -BIG, BIG, -BIG], requires_grad=True)
    y = torch.tensor([1.0, 0.0, 0.0, 1.0])
    score = spherical_score(z, y, reduction="none")
    assert score.tolist() == [0.0, 0.0, 1.0, 1.0]
    score.sum().backward()
    assert torch.isfinite(z.grad).all()
    # unchanged in the ordinary range: 1 - p_y / ||p|| of the forecast (1 - p, p)
    t = torch.tensor([-3.0, 0.0, 0.5, 8.0], dtype=torch.float64)
    p = torch.sigmoid(t)
    expected = 1.0 - p / torch.sqrt(p**2 + (1 - p) ** 2)
    got = spherical_score(t, torch.ones(4, dtype=torch.float64), reduction="none")
    torch.testing.assert_close(got, expected, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize(
    "logits",
    [[BIG, -BIG], [BIG, 0.0, -BIG], [-BIG, BIG], [3.4e38, 3.4e38]],
)
def test_confidence_penalty_near_float_max(logits):
    """-H(p) of a (numerically) one-hot forecast is 0, of two equal maxima -log 2; no NaN in
    the value or the gradient (0 * log 0 used to be 0 * -inf)."""
    z = torch.tensor([logits], requires_grad=True)
    value = confidence_penalty(z)
    value.backward()
    expected = -math.log(2.0) if logits[0] == logits[1] else 0.0
    assert value.item() == pytest.approx(expected, abs=1e-6)
    assert torch.isfinite(z.grad).all()


def test_ensemble_scores_of_members_near_float_max():
    """Four members at 1e38 (their float32 sum overflows): CRPS and energy score are 0."""
    x = torch.full((1, 4), 1e38, requires_grad=True)
    value = crps_ensemble(x, torch.tensor([1e38]))
    value.backward()
    assert value.item() == 0.0
    assert torch.isfinite(x.grad).all()
    assert energy_score(torch.full((1, 4, 2), 1e38), torch.full((1, 2), 1e38)).item() == 0.0


def _cases(n: int):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(n, 5, generator=g)
    y = torch.randint(0, 5, (n,), generator=g)
    mu, target = torch.randn(n, generator=g), torch.randn(n, generator=g)
    scale = torch.rand(n, generator=g) + 0.5
    w = torch.rand(5, generator=g)
    return {
        "rps": lambda: ranked_probability_score(z, y),
        "brier_score": lambda: brier_score(z, y),
        "brier_score[weight]": lambda: brier_score(z, y, weight=w),
        "brier_score[sum]": lambda: brier_score(z, y, reduction="sum"),
        "log_score": lambda: log_score(z, y),
        "crps_normal": lambda: crps_normal(mu, scale, target),
        "crps_normal[sum]": lambda: crps_normal(mu, scale, target, reduction="sum"),
    }


@pytest.mark.parametrize("name", sorted(_cases(1)))
def test_reductions_do_not_depend_on_the_thread_count(name):
    """Bitwise the same value at 1 and 2 threads, at a size where torch splits a float32
    sum between threads (200k items); and within float64 rounding of the exact mean."""
    case = _cases(200_000)[name]
    torch.set_num_threads(1)
    one = case()
    torch.set_num_threads(2)
    two = case()
    torch.set_num_threads(1)
    assert one.dtype == torch.float32
    assert torch.equal(one, two), (one.item(), two.item())


def test_fixed_sum_is_the_float64_sum_rounded_once():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(PARALLEL_GRAIN * 3 + 7, generator=g) * 1e3
    exact = math.fsum(x.double().tolist())
    assert fixed_sum(x).item() == pytest.approx(exact, rel=1e-7)
    assert fixed_sum(x).item() == torch.tensor(x.double().sum().item()).float().item()
    small = x[:100]
    assert torch.equal(fixed_sum(small), small.sum())


@pytest.mark.parametrize("family", ["normal", "laplace", "logistic"])
def test_crps_scale_sums_do_not_depend_on_the_thread_count(family):
    """The one-factor sums of VarianceScaler(objective='crps'): bitwise at 1 and 2 threads
    (blocks of at most PARALLEL_GRAIN values, each summed on one thread)."""
    from torchcal.functional.crps import crps_scale_sums

    g = torch.Generator().manual_seed(4)
    r = torch.randn(300_000, dtype=torch.float64, generator=g)
    w = torch.rand(300_000, dtype=torch.float64, generator=g)
    torch.set_num_threads(1)
    one = crps_scale_sums(family, r, 1.3, w)
    torch.set_num_threads(2)
    two = crps_scale_sums(family, r, 1.3, w)
    torch.set_num_threads(1)
    assert one == two


def test_alpha_accepts_numpy_scalars():
    """alpha=np.float32(0.1) is a number (it raised TypeError)."""
    import numpy as np

    from torchcal.functional import interval_score

    lo, hi, y = torch.zeros(3), torch.ones(3), torch.tensor([0.5, 2.0, -1.0])
    expected = interval_score(lo, hi, y, alpha=float(np.float32(0.1)))
    torch.testing.assert_close(interval_score(lo, hi, y, alpha=np.float32(0.1)), expected)
    assert interval_score(lo, hi, y, alpha=np.float64(0.25)).item() == pytest.approx(
        interval_score(lo, hi, y, alpha=0.25).item()
    )
    with pytest.raises(TypeError, match="alpha: expected a float or a tensor"):
        interval_score(lo, hi, y, alpha=True)
