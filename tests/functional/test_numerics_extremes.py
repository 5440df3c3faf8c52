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
    dawid_sebastiani_score,
    dca,
    energy_score,
    interval_score,
    log_score,
    mdca,
    quantile_score,
    ranked_probability_score,
    spherical_score,
)
from torchcal.functional._checks import PARALLEL_GRAIN, fixed_mean, fixed_sum

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
    half = torch.rand(n, generator=g) + 0.1
    members = torch.randn(n // 4, 4, generator=g)
    return {
        "dca": lambda: dca(z, y),
        "mdca": lambda: mdca(z, y),
        "interval_score": lambda: interval_score(mu - half, mu + half, target, alpha=0.1),
        "dawid_sebastiani_score": lambda: dawid_sebastiani_score(mu, scale, target),
        "crps_ensemble": lambda: crps_ensemble(members, target[: n // 4]),
        "quantile_score": lambda: quantile_score(
            torch.stack([mu - half, mu, mu + half], dim=-1), target, [0.1, 0.5, 0.9]
        ),
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


def _at_threads(fn, threads):
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(1)


def test_a_plain_sum_does_depend_on_the_thread_count():
    """The control of the tests below: on this machine torch's own float32 sum of 200k values
    changes its last bit between 1 and 2 threads for some data (else they prove nothing)."""
    differ = 0
    for seed in range(8):
        x = torch.randn(200_000, generator=torch.Generator().manual_seed(seed)) * 10 + 3
        differ += not torch.equal(_at_threads(x.sum, 1), _at_threads(x.sum, 2))
    assert differ > 0


# one long row: one block plus three values (prime: no divisor fits, whole blocks + the
# rest), a divisor layout (128000 = 4 x 32000), whole blocks, a prime of a million; rows:
# (128, 1000) as a loss's batch, (3, 50000) rows longer than a block, (100000, 1) rows of
# one, (1, 100000) one row, (40, 30, 50) three dims, (50000, 2) more rows than a block
SHAPES = [
    (PARALLEL_GRAIN + 3,),
    (128_000,),
    (2 * PARALLEL_GRAIN,),
    (1_000_003,),
    (128, 1000),
    (3, 50_000),
    (100_000, 1),
    (1, 100_000),
    (40, 30, 50),
    (50_000, 2),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_fixed_sum_is_bitwise_the_same_at_1_and_2_threads(shape, dtype):
    """fixed_sum's bits do not depend on the thread count, it keeps the dtype and it is as
    accurate as a one-thread sum (float32: within 1e-6 of the sum of |x|, measured ~1e-9;
    float64: 1e-13; half types: one rounding of a float32 accumulation)."""
    g = torch.Generator().manual_seed(math.prod(shape))
    x = (torch.randn(shape, generator=g) * 10 + 3).to(dtype)
    one = _at_threads(lambda: fixed_sum(x), 1)
    two = _at_threads(lambda: fixed_sum(x), 2)
    assert one.dtype == dtype
    assert torch.equal(one, two), (one.item(), two.item())
    exact = math.fsum(x.double().flatten().tolist())
    scale = x.double().abs().sum().item()
    if dtype in (torch.float32, torch.float64):
        tol = 1e-6 if dtype == torch.float32 else 1e-13
        assert abs(one.item() - exact) <= tol * scale
    else:  # float32 accumulation (~1e-9), then one rounding to the half type
        assert one.item() == torch.tensor(exact).to(dtype).item() or abs(
            one.item() - exact
        ) <= torch.finfo(dtype).eps * abs(exact)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fixed_mean_is_bitwise_the_same_at_1_and_2_threads(shape, dtype):
    """fixed_mean (the mean of row means, or a long row's fixed_sum / n) likewise, within
    float32 rounding of the exact mean, with the gradient 1/n everywhere."""
    g = torch.Generator().manual_seed(math.prod(shape) + 1)
    x = (torch.randn(shape, generator=g) * 10 + 3).to(dtype)
    one = _at_threads(lambda: fixed_mean(x), 1)
    two = _at_threads(lambda: fixed_mean(x), 2)
    assert one.dtype == dtype
    assert torch.equal(one, two), (one.item(), two.item())
    exact = math.fsum(x.double().flatten().tolist()) / x.numel()
    scale = x.double().abs().mean().item()
    tol = {torch.float32: 1e-6, torch.float64: 1e-13, torch.bfloat16: 1e-2}[dtype]
    assert abs(one.item() - exact) <= tol * scale
    if dtype == torch.float64:
        leaf = x.clone().requires_grad_()
        fixed_mean(leaf).backward()
        torch.testing.assert_close(leaf.grad, torch.full_like(leaf, 1.0 / x.numel()))


@pytest.mark.parametrize("shape", [(100_000,), (100_000, 1), (100, 1000)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fixed_mean_of_half_values_does_not_overflow(shape, dtype):
    """The mean of 100k float16 ones is 1 (their float16 sum, 1e5, overflows to inf)."""
    x = torch.ones(shape, dtype=dtype)
    assert fixed_mean(x).item() == 1.0
    assert fixed_mean(x).dtype == dtype


def test_fixed_sum_of_a_small_tensor_is_sum_and_its_gradient_is_ones():
    x = torch.randn(100, generator=torch.Generator().manual_seed(1))
    assert torch.equal(fixed_sum(x), x.sum())
    for shape in [(3, PARALLEL_GRAIN + 5), (2 * PARALLEL_GRAIN + 1,)]:  # rows; one row
        big = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        fixed_sum(big).backward()
        assert torch.equal(big.grad, torch.ones_like(big))
    long_row = torch.randn(PARALLEL_GRAIN + 1, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fixed_sum, (long_row,), fast_mode=True)
    assert torch.autograd.gradgradcheck(fixed_sum, (long_row,), fast_mode=True)


@pytest.mark.parametrize("family", ["normal", "laplace", "logistic"])
def test_crps_scale_sums_do_not_depend_on_the_thread_count(family):
    """The one-factor sums of VarianceScaler(objective='crps'): bitwise at 1 and 2 threads
    (blocks of at most PARALLEL_GRAIN values, each summed on one thread)."""
    from torchcal.functional.crps_scale import crps_scale_sums

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
