"""Calibration of predictive distributions (issue 11, Build 1): PIT values, coverage, quantile
calibration, sharpness. Every formula against scipy/numpy float64 or a brute force; uniformity
of the true distribution's PIT with a KS test (20k draws, fixed seeds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _ensemble_layouts import shared_layouts
from scipy import stats

import torchcal.functional as TF
import torchcal.functional.coverage as TF_coverage
import torchcal.functional.regression as TF_regression
from torchcal.functional import (
    frequency_calibration_error,
    interval_coverage,
    observed_frequencies,
    pit,
    pit_calibration_error,
    pit_calibration_error_from_counts,
    pit_ensemble,
    pit_histogram,
    pit_laplace,
    pit_logistic,
    pit_normal,
    pit_quantiles,
    quantile_calibration_error,
    sharpness,
)

D64 = torch.float64
N = 20_000
KS_P = 0.01
LEVELS = (0.5, 0.8, 0.9, 0.95)


def _t(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a), dtype=D64)


def _hetero(seed: int, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """Heteroscedastic forecast parameters: loc = 2x, scale = 0.1 + 0.5x, x ~ U(0, 1)."""
    x = np.random.default_rng(seed).uniform(size=n)
    return 2 * x, 0.1 + 0.5 * x


def _ks_p(u: torch.Tensor) -> float:
    return stats.kstest(u.double().numpy().ravel(), "uniform").pvalue


# ------------------------------------------------------------------ closed forms vs scipy

SCIPY = {"normal": stats.norm, "laplace": stats.laplace, "logistic": stats.logistic}
CLOSED = {"normal": pit_normal, "laplace": pit_laplace, "logistic": pit_logistic}


@pytest.mark.parametrize("family", sorted(CLOSED))
def test_closed_form_matches_scipy(family):
    rng = np.random.default_rng(1)
    loc, scale = rng.normal(size=2000) * 5, np.exp(rng.normal(size=2000))
    z = np.concatenate([np.linspace(-40, 40, 1001), rng.normal(size=999) * 3])
    y = loc + scale * z
    got = CLOSED[family](_t(loc), _t(scale), _t(y)).numpy()
    ref = SCIPY[family].cdf(y, loc=loc, scale=scale)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)
    lower = ref < 0.5  # relative accuracy in the lower tail too (no 1 - cancellation)
    np.testing.assert_allclose(got[lower], ref[lower], rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("family", sorted(CLOSED))
def test_closed_form_true_distribution_uniform(family):
    loc, scale = _hetero(2)
    y = SCIPY[family].rvs(loc=loc, scale=scale, random_state=np.random.default_rng(3))
    u = CLOSED[family](_t(loc), _t(scale), _t(y))
    assert u.shape == (N,) and u.dtype == D64
    assert _ks_p(u) > KS_P
    # a forecast twice too narrow is detected (a U-shaped PIT)
    assert _ks_p(CLOSED[family](_t(loc), _t(scale / 2), _t(y))) < 1e-6


def test_closed_form_shapes_dtypes_and_broadcast():
    y = torch.randn(4, 3)
    u = pit_normal(torch.tensor(0.0), torch.ones(3), y)
    assert u.shape == (4, 3) and u.dtype == torch.float32
    torch.testing.assert_close(u, torch.distributions.Normal(0.0, 1.0).cdf(y))
    assert pit_logistic(torch.zeros(3), torch.ones(3), y.half()).dtype == torch.float32
    with pytest.raises(ValueError, match="^target"):
        pit_normal(torch.zeros(4, 3), torch.ones(4, 3), torch.zeros(4, 1))


def test_closed_form_gradient_is_the_density():
    loc = torch.tensor([0.3, -1.0], dtype=D64, requires_grad=True)
    y = torch.tensor([1.0, 2.0], dtype=D64)
    pit_normal(loc, torch.tensor([2.0, 0.5], dtype=D64), y).sum().backward()
    ref = -stats.norm.pdf([1.0, 2.0], loc=[0.3, -1.0], scale=[2.0, 0.5])
    np.testing.assert_allclose(loc.grad.numpy(), ref, rtol=1e-12)


# ----------------------------------------------------------------- torch distributions


def test_pit_of_torch_distributions_matches_scipy_and_is_uniform():
    loc, scale = _hetero(4)
    y = stats.norm.rvs(loc=loc, scale=scale, random_state=np.random.default_rng(5))
    u = pit(torch.distributions.Normal(_t(loc), _t(scale)), _t(y))
    np.testing.assert_allclose(u.numpy(), stats.norm.cdf(y, loc, scale), atol=1e-12, rtol=0)
    assert _ks_p(u) > KS_P
    shape = np.random.default_rng(6).uniform(0.5, 5, size=N)
    y = stats.gamma.rvs(shape, random_state=np.random.default_rng(7))
    u = pit(torch.distributions.Gamma(_t(shape), torch.ones(N, dtype=D64)), _t(y))
    np.testing.assert_allclose(u.numpy(), stats.gamma.cdf(y, shape), atol=1e-12, rtol=0)
    assert _ks_p(u) > KS_P


def test_pit_of_a_logistic_transformed_distribution_equals_the_closed_form():
    from torch.distributions import AffineTransform, SigmoidTransform, TransformedDistribution

    loc, scale = _t([0.0, 1.0, -2.0]), _t([1.0, 0.5, 3.0])
    base = torch.distributions.Uniform(torch.zeros(3, dtype=D64), torch.ones(3, dtype=D64))
    logistic = TransformedDistribution(base, [SigmoidTransform().inv, AffineTransform(loc, scale)])
    y = _t([0.3, 2.0, -9.0])
    torch.testing.assert_close(pit(logistic, y), pit_logistic(loc, scale, y), rtol=1e-12, atol=0)


def test_pit_validation():
    d = torch.distributions.Normal(torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="^target"):
        pit(d, torch.zeros(3, 1))
    with pytest.raises(ValueError, match="^target"):
        pit(d, torch.tensor([0.0, math.nan, 1.0]))
    with pytest.raises(ValueError, match="^target"):
        pit(torch.distributions.Exponential(torch.ones(2)), torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="^distribution"):
        pit(torch.distributions.MultivariateNormal(torch.zeros(2), torch.eye(2)), torch.zeros(2))
    with pytest.raises(TypeError, match="^distribution"):
        pit(torch.distributions.StudentT(torch.ones(2)), torch.zeros(2))
    with pytest.raises(TypeError, match="^distribution"):
        pit("normal", torch.zeros(2))


# ---------------------------------------------------------------------------- ensembles


def _ensemble_brute(x: np.ndarray, y: np.ndarray, u: np.ndarray) -> np.ndarray:
    out = np.empty(len(y))
    for i in range(len(y)):
        below = sum(1 for v in x[i] if v < y[i])
        ties = sum(1 for v in x[i] if v == y[i])
        out[i] = (below + u[i] * (ties + 1)) / (x.shape[1] + 1)
    return out


def test_pit_ensemble_matches_brute_force_with_ties():
    rng = np.random.default_rng(8)
    x = rng.integers(0, 4, size=(300, 7)).astype(float)
    y = rng.integers(-1, 5, size=300).astype(float)
    got = pit_ensemble(_t(x), _t(y), generator=torch.Generator().manual_seed(9))
    u = torch.rand(300, generator=torch.Generator().manual_seed(9), dtype=D64).numpy()
    np.testing.assert_allclose(got.numpy(), _ensemble_brute(x, y, u), rtol=0, atol=1e-15)
    mid = pit_ensemble(_t(x), _t(y), randomized=False)
    np.testing.assert_allclose(mid.numpy(), _ensemble_brute(x, y, np.full(300, 0.5)), atol=1e-15)
    # ensemble_dim and the members' layout
    moved = pit_ensemble(_t(x.T), _t(y), ensemble_dim=0, randomized=False)
    torch.testing.assert_close(moved, mid, rtol=0, atol=0)


# one ensemble shared by several targets: (samples shape, ensemble_dim, target shape)
SHARED = shared_layouts(37)


@pytest.mark.parametrize(("shape", "dim", "target_shape"), SHARED)
@pytest.mark.parametrize("dtype", [D64, torch.float32])
def test_pit_ensemble_shared_ensemble_is_the_expanded_one_bit_for_bit(
    shape, dim, target_shape, dtype
):
    # the sort-once path against the expanded (N, M) comparisons and a numpy brute force:
    # ties (integer values), targets below, above and on the ends of the members
    rng = np.random.default_rng(20)
    x = torch.as_tensor(rng.integers(0, 6, size=shape)).to(dtype)
    y = torch.as_tensor(rng.integers(-2, 8, size=target_shape)).to(dtype)
    y.view(-1)[:4] = torch.tensor([-50.0, 50.0, float(x.min()), float(x.max())])
    members = x.movedim(dim, -1)
    full = members.expand(*target_shape, members.shape[-1])
    flat_x = full.reshape(-1, members.shape[-1]).double().numpy()
    for randomized in (True, False):
        got = pit_ensemble(
            x,
            y,
            ensemble_dim=dim,
            randomized=randomized,
            generator=torch.Generator().manual_seed(5),
        )
        ref = pit_ensemble(
            full, y, randomized=randomized, generator=torch.Generator().manual_seed(5)
        )
        assert got.shape == y.shape and got.dtype == dtype
        assert torch.equal(got, ref)
        if randomized:
            u = torch.rand(target_shape, generator=torch.Generator().manual_seed(5), dtype=D64)
        else:
            u = torch.full(target_shape, 0.5, dtype=D64)
        brute = _ensemble_brute(flat_x, y.double().reshape(-1).numpy(), u.reshape(-1).numpy())
        np.testing.assert_array_equal(got.reshape(-1).numpy(), brute.astype(got.numpy().dtype))


def test_pit_ensemble_shared_ensemble_is_fast():
    # the climatology of the regression recipe: 20k members shared by 20k targets (the
    # expanded path compares 4e8 pairs, ~17 s); sorted once it takes milliseconds
    import time

    g = torch.Generator().manual_seed(21)
    x, y = torch.randn(20_000, generator=g, dtype=D64), torch.randn(20_000, generator=g, dtype=D64)
    start = time.perf_counter()
    u = pit_ensemble(x, y, randomized=False)
    assert time.perf_counter() - start < 1.0
    ref = pit_ensemble(x.expand(100, -1), y[:100], randomized=False)
    assert u.shape == y.shape and torch.equal(u[:100], ref)


def test_pit_ensemble_calibrated_continuous_is_uniform():
    loc, scale = _hetero(10)
    rng = np.random.default_rng(11)
    x = loc[:, None] + scale[:, None] * rng.normal(size=(N, 9))
    y = loc + scale * rng.normal(size=N)
    u = pit_ensemble(_t(x).float(), _t(y).float(), generator=torch.Generator().manual_seed(0))
    assert u.dtype == torch.float32 and _ks_p(u) > KS_P


@pytest.mark.parametrize("members", [1, 5, 20])
def test_pit_ensemble_discrete_with_many_ties_is_uniform_only_when_randomized(members):
    rng = np.random.default_rng(12 + members)
    lam = rng.uniform(0.5, 4.0, size=N)
    x = rng.poisson(lam[:, None], size=(N, members)).astype(float)
    y = rng.poisson(lam).astype(float)
    assert (x == y[:, None]).mean() > 0.15  # many ties
    u = pit_ensemble(_t(x), _t(y), generator=torch.Generator().manual_seed(members))
    assert _ks_p(u) > KS_P
    assert _ks_p(pit_ensemble(_t(x), _t(y), randomized=False)) < 1e-6


def test_pit_ensemble_generator_and_default_rng_are_reproducible():
    x, y = torch.randn(50, 4), torch.randn(50)
    a = pit_ensemble(x, y, generator=torch.Generator().manual_seed(3))
    b = pit_ensemble(x, y, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.manual_seed(4)
    c = pit_ensemble(x, y)
    torch.manual_seed(4)
    torch.testing.assert_close(pit_ensemble(x, y), c, rtol=0, atol=0)
    assert bool(((a > 0) & (a < 1)).all())


# ------------------------------------------------------------------------ quantile sets


def _quantile_brute(q: np.ndarray, tau: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = np.empty(len(y))
    for i in range(len(y)):
        qi = q[i]
        if y[i] < qi[0]:
            b = tau[0] * (qi[1] - qi[0]) / (tau[1] - tau[0])
            out[i] = tau[0] * math.exp((y[i] - qi[0]) / b)
        elif y[i] >= qi[-1]:
            b = (1 - tau[-1]) * (qi[-1] - qi[-2]) / (tau[-1] - tau[-2])
            out[i] = 1 - (1 - tau[-1]) * math.exp(-(y[i] - qi[-1]) / b)
        else:
            out[i] = np.interp(y[i], qi, tau)
    return out


def test_pit_quantiles_matches_brute_force():
    rng = np.random.default_rng(14)
    tau = np.array([0.05, 0.2, 0.5, 0.7, 0.95])
    q = np.sort(rng.normal(size=(500, 5)) * 2, axis=1)
    y = rng.normal(size=500) * 3
    got = pit_quantiles(_t(q), _t(tau), _t(y)).numpy()
    np.testing.assert_allclose(got, _quantile_brute(q, tau, y), rtol=1e-12, atol=1e-15)
    # at the knots the CDF is the level; a uniform law's true quantiles give F(y) = y inside
    np.testing.assert_allclose(pit_quantiles(_t(q), tau.tolist(), _t(q[:, 2])).numpy(), 0.5)
    u = rng.uniform(0.05, 0.95, size=300)
    got = pit_quantiles(_t(tau), _t(tau), _t(u))
    np.testing.assert_allclose(got.numpy(), u, rtol=0, atol=1e-15)


def test_pit_quantiles_ties_are_a_right_continuous_jump():
    q = _t([[0.0, 1.0, 1.0, 2.0]])
    tau = [0.2, 0.4, 0.6, 0.8]
    got = pit_quantiles(q.expand(3, 4), tau, _t([0.5, 1.0, 1.5])).tolist()
    np.testing.assert_allclose(got, [0.3, 0.6, 0.7], atol=1e-15)


def test_pit_quantiles_true_quantiles_are_uniform():
    loc, scale = _hetero(15)
    tau = np.linspace(0.01, 0.99, 99)
    q = loc[:, None] + scale[:, None] * stats.norm.ppf(tau)
    y = stats.norm.rvs(loc=loc, scale=scale, random_state=np.random.default_rng(16))
    u = pit_quantiles(_t(q), _t(tau), _t(y))
    assert _ks_p(u) > KS_P
    assert _ks_p(pit_quantiles(_t(q * 0.5), _t(tau), _t(y))) < 1e-6  # mis-scaled: detected


@pytest.mark.parametrize(("k", "bound"), [(24, 3.4e-3), (99, 1.0e-3), (199, 5.3e-4)])
def test_pit_quantiles_interpolation_error_of_true_normal_quantiles(k, bound):
    """sup_y |Phi(y) - F_K(y)| for K equally spaced levels in (0, 1): the distance of the PIT's
    law from uniform (the exponential tails dominate it), measured on a fine grid of y."""
    tau = np.linspace(0.0, 1.0, k + 2)[1:-1] if k != 99 else np.linspace(0.01, 0.99, 99)
    y = np.linspace(-8, 8, 40001)
    q = torch.as_tensor(stats.norm.ppf(tau), dtype=D64).expand(len(y), k)
    dev = np.abs(pit_quantiles(q, _t(tau), _t(y)).numpy() - stats.norm.cdf(y)).max()
    assert 0.5 * bound < dev < bound


# ------------------------------------------------------------------------------- coverage


def test_interval_coverage_of_the_true_distribution_is_nominal():
    loc, scale = _hetero(17)
    y = stats.norm.rvs(loc=loc, scale=scale, random_state=np.random.default_rng(18))
    for level in LEVELS:
        half = stats.norm.ppf(0.5 + level / 2) * scale
        cov = interval_coverage(_t(loc - half), _t(loc + half), _t(y)).item()
        assert abs(cov - level) <= 3 * math.sqrt(level * (1 - level) / N), level
        assert cov == np.mean((loc - half <= y) & (y <= loc + half))


def test_interval_coverage_brute_force_reductions_and_closed_ends():
    lower, upper = _t([0.0, 0.0, 0.0, -1.0]), _t([1.0, 1.0, 1.0, -1.0])
    y = _t([0.0, 1.0, 1.5, -1.0])  # both ends and a point interval are covered
    assert interval_coverage(lower, upper, y, reduction="none").tolist() == [1, 1, 0, 1]
    assert interval_coverage(lower, upper, y, reduction="sum").item() == 3.0
    assert interval_coverage(lower, upper, y).item() == 0.75
    # (N, L) bounds with the target expanded to (N, L)
    y2 = torch.randn(100)
    lo, hi = -torch.tensor([0.5, 1.0, 2.0]).expand(100, 3), torch.tensor([0.5, 1.0, 2.0])
    cov = interval_coverage(lo, hi.expand(100, 3), y2[:, None].expand(-1, 3), reduction="none")
    ref = (y2.abs()[:, None] <= torch.tensor([0.5, 1.0, 2.0])).double()
    torch.testing.assert_close(cov, ref, rtol=0, atol=0)


# ------------------------------------------------------------------- histogram and errors


def test_pit_histogram_bin_rule_golden_values():
    b = 10
    for dtype in (torch.float16, torch.bfloat16, torch.float32, D64):
        k = torch.arange(b + 1, dtype=D64)
        u = (k / b).to(dtype)
        ref = np.minimum(np.floor(u.double().numpy() * b), b - 1).astype(int)
        got = pit_histogram(u, b)
        assert got.dtype == torch.int64 and got.shape == (1, b)
        assert got[0].tolist() == np.bincount(ref, minlength=b).tolist()


def test_pit_histogram_groups_and_calibration_error_vs_numpy():
    rng = np.random.default_rng(19)
    u, g = rng.beta(2, 2, size=5000), rng.integers(0, 3, size=5000)
    got = pit_histogram(_t(u), 7, groups=torch.as_tensor(g), num_groups=4)
    ref = np.zeros((4, 7), dtype=int)
    for ui, gi in zip(u, g):
        ref[gi, min(int(math.floor(ui * 7)), 6)] += 1
    assert got.tolist() == ref.tolist()
    pooled = ref.sum(0)
    err = pit_calibration_error(_t(u), 7).item()
    assert err == pytest.approx(np.abs(pooled / 5000 - 1 / 7).sum(), abs=1e-14)
    per_group = pit_calibration_error_from_counts(got)
    assert math.isnan(per_group[3].item())
    for k in range(3):
        ref_k = np.abs(ref[k] / ref[k].sum() - 1 / 7).sum()
        assert per_group[k].item() == pytest.approx(ref_k, abs=1e-14)
    assert pit_calibration_error(torch.ones(10), 4).item() == pytest.approx(1.5)


def _utb_quantile_errors(mu, sigma, y, num_bins=100):
    """uncertainty-toolbox's get_proportion_lists_vectorized(prop_type='quantile') and its mean
    absolute / root mean squared calibration error, written out in numpy."""
    exp_props = np.linspace(0.0, 1.0, num_bins)
    norm_res = ((mu - y) / sigma).reshape(1, -1)
    upper = stats.norm.ppf(exp_props).reshape(-1, 1)
    within = (norm_res >= stats.norm.ppf(0.0)) * (norm_res <= upper)
    obs = within.sum(axis=1) / len(y)
    return np.mean(np.abs(obs - exp_props)), np.sqrt(np.mean((obs - exp_props) ** 2))


def test_quantile_calibration_error_vs_uncertainty_toolbox_definition():
    loc, scale = _hetero(20, 5000)
    y = stats.norm.rvs(loc=loc + 0.1, scale=scale * 1.3, random_state=np.random.default_rng(21))
    tau = np.linspace(0.0, 1.0, 100)[1:-1]
    q = loc[:, None] + scale[:, None] * stats.norm.ppf(tau)
    mace, rmsce = _utb_quantile_errors(loc, scale, y)
    l1 = quantile_calibration_error(_t(q), _t(tau), _t(y)).item()
    l2 = quantile_calibration_error(_t(q), _t(tau), _t(y), norm="l2").item()
    assert l1 * 98 / 100 == pytest.approx(mace, abs=1e-12)
    assert l2 * math.sqrt(98 / 100) == pytest.approx(rmsce, abs=1e-12)
    assert l1 > 0.02


def test_observed_frequencies_brute_force_and_reductions():
    rng = np.random.default_rng(22)
    tau = np.array([0.1, 0.5, 0.9])
    q = np.sort(rng.normal(size=(400, 3)), axis=1)
    y = rng.normal(size=400)
    ref = np.array([np.mean([y[i] <= q[i, k] for i in range(400)]) for k in range(3)])
    got = observed_frequencies(_t(q), _t(tau), _t(y))
    assert got.dtype == D64 and got.numpy().tolist() == pytest.approx(ref.tolist(), abs=1e-15)
    counts = observed_frequencies(_t(q), _t(tau), _t(y), reduction="sum")
    assert counts.tolist() == (ref * 400).round().tolist()
    ind = observed_frequencies(_t(q), _t(tau), _t(y), reduction="none")
    assert ind.shape == (400, 3) and ind.sum(0).tolist() == counts.tolist()
    batch = frequency_calibration_error(torch.stack([got, _t(tau)]), _t(tau), norm="l2")
    assert batch[1].item() == 0.0
    assert batch[0].item() == pytest.approx(np.sqrt(np.mean((ref - tau) ** 2)), abs=1e-15)
    # a shared quantile set broadcasts to the target's shape
    shared = observed_frequencies(_t([-1.0, 0.0, 1.0]), tau, _t(y))
    ref = [np.mean(y <= v) for v in (-1.0, 0.0, 1.0)]
    assert shared.tolist() == pytest.approx(ref, abs=1e-15)


def test_sharpness_vs_numpy():
    s = np.exp(np.random.default_rng(23).normal(size=1000))
    assert sharpness(_t(s).float()).item() == pytest.approx(np.sqrt(np.mean(s**2)), rel=1e-7)
    assert sharpness(_t(s)).dtype == D64


@pytest.mark.parametrize("module", [TF_regression, TF_coverage], ids=lambda m: m.__name__)
def test_everything_is_exported(module):
    """Every public name of the PIT and coverage modules is a callable of the namespace."""
    assert len(module.__all__) >= 7
    for name in module.__all__:
        assert name in TF.__all__ and callable(getattr(TF, name)), name
        assert getattr(TF, name) is getattr(module, name), name


@pytest.mark.parametrize(
    ("family", "ppf"),
    [
        ("normal", stats.norm.ppf),
        ("laplace", stats.laplace.ppf),
        ("logistic", stats.logistic.ppf),
    ],
)
def test_central_interval_factor_is_the_standard_quantile(family, ppf):
    levels = torch.tensor([0.1, 0.5, 0.8, 0.9, 0.95, 0.999], dtype=torch.float64)
    want = torch.from_numpy(ppf((1 + levels.numpy()) / 2))
    got = TF.central_interval_factor(family, levels)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="^family"):
        TF.central_interval_factor("cauchy", levels)
    with pytest.raises(ValueError, match="^levels"):
        TF.central_interval_factor(family, [0.5, 1.0])
