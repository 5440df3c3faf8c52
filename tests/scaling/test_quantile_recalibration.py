"""QuantileRecalibrator: the map against scikit-learn's isotonic fit, coverage, state, input."""

import io
import math

import numpy as np
import pytest
import torch
from sklearn.isotonic import IsotonicRegression

from torchcal.scaling import NotFittedError, QuantileRecalibrator


def laplace_truth_normal_forecast(n: int, seed: int):
    """y ~ Laplace(0, 1) forecast by N(0.3, 1): biased and mis-shaped (sd sqrt(2) vs 1)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5
    y = -torch.sign(u) * torch.log1p(-2 * u.abs())
    dist = torch.distributions.Normal(torch.full((n,), 0.3, dtype=torch.float64), torch.ones(n))
    return dist, y


def test_map_matches_sklearn_isotonic_with_ties():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(300, generator=g, dtype=torch.float64) ** 2
    p[:40] = p[40:80]  # ties
    p[80] = 0.0
    rec = QuantileRecalibrator()
    rec.fit(p)
    n = p.numel()
    ps = np.sort(p.numpy())
    rank = np.arange(1, n + 1) / (n + 1)
    inside = (ps > 0) & (ps < 1)  # a PIT value of exactly 0 is ranked but is no knot
    x = np.concatenate([[0.0], ps[inside], [1.0]])
    y = np.concatenate([[0.0], rank[inside], [1.0]])
    ref = IsotonicRegression(out_of_bounds="clip").fit(x, y)
    grid = torch.linspace(0, 1, 2001, dtype=torch.float64)
    np.testing.assert_allclose(rec.recalibrate(grid).numpy(), ref.predict(grid.numpy()), atol=1e-12)
    # the anchors stay: R(0) = 0, R(1) = 1, and R^{-1} inverts R on all of (0, 1)
    assert float(rec.recalibrate(torch.tensor([0.0], dtype=torch.float64))) == 0.0
    assert float(rec.recalibrate(torch.tensor([1.0], dtype=torch.float64))) == 1.0
    tau = torch.linspace(0.001, 0.999, 999, dtype=torch.float64)
    torch.testing.assert_close(rec.recalibrate(rec.levels_for(tau)), tau, rtol=0, atol=1e-12)


def test_pit_values_of_exactly_one_keep_the_quantiles_finite():
    # a float32 CDF rounds to exactly 1 in its far tail: 83 of these 2000 PIT values
    g = torch.Generator().manual_seed(0)
    y = 3 * torch.randn(2000, generator=g)
    p = torch.distributions.Normal(0.0, 1.0).cdf(y)
    assert int((p == 1).sum()) > 10
    rec = QuantileRecalibrator()
    rec.fit(p)
    assert float(rec.recalibrate(torch.tensor([1.0]))) == 1.0
    lo, hi = rec.interval(torch.distributions.Normal(torch.zeros(1), torch.ones(1)), 0.99)
    assert bool(torch.isfinite(lo).all() and torch.isfinite(hi).all())  # hi was +inf
    tau32 = np.float32(0.9)  # a numpy level is accepted, read as its float
    assert float(rec.levels_for(tau32)) == float(rec.levels_for(float(tau32)))


def test_hand_worked_small_case():
    rec = QuantileRecalibrator()
    rec.fit(torch.tensor([0.2, 0.6, 0.6, 0.9], dtype=torch.float64))
    # knots (0, 0), (0.2, 1/5), (0.6, mean(2/5, 3/5) = 1/2), (0.9, 4/5), (1, 1)
    assert rec.x_knots.tolist() == [0.0, 0.2, 0.6, 0.9, 1.0]
    torch.testing.assert_close(
        rec.y_knots, torch.tensor([0, 0.2, 0.5, 0.8, 1], dtype=torch.float64)
    )
    assert float(rec.recalibrate(torch.tensor([0.4]))) == pytest.approx(0.35)
    assert float(rec.levels_for(0.35)) == pytest.approx(0.4)


def test_restores_nominal_coverage_of_a_misshaped_forecast():
    dist, y = laplace_truth_normal_forecast(20000, 1)
    dist_t, y_t = laplace_truth_normal_forecast(20000, 2)
    rec = QuantileRecalibrator()
    res = rec.fit(dist.cdf(y))
    assert res.gap_after < res.gap_before
    n = y_t.numel()
    taus = torch.tensor([0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95], dtype=torch.float64)
    q = rec.quantile(dist_t, taus)
    assert q.shape == (n, 7) and bool((q.diff(dim=1) > 0).all())
    observed = (y_t[:, None] <= q).double().mean(0)
    raw = (y_t[:, None] <= dist_t.icdf(taus[:, None]).T).double().mean(0)
    se = torch.sqrt(taus * (1 - taus) / n)
    assert bool(((raw - taus).abs() > 5 * se).any())  # the forecast is miscalibrated
    assert bool(((observed - taus).abs() <= 3 * se).all()), (observed - taus) / se
    for level in (0.5, 0.8, 0.9, 0.95):
        lo, hi = rec.interval(dist_t, level)
        cov = float(((lo <= y_t) & (y_t <= hi)).double().mean())
        assert abs(cov - level) <= 3 * math.sqrt(level * (1 - level) / n)


def test_state_round_trip_and_validation():
    rec = QuantileRecalibrator()
    rec.fit(torch.rand(100, generator=torch.Generator().manual_seed(3)))
    buf = io.BytesIO()
    torch.save(rec.state_dict(), buf)
    buf.seek(0)
    other = QuantileRecalibrator()
    other.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(other.x_knots, rec.x_knots) and other.is_fitted
    other.half()
    assert other.y_knots.dtype == torch.float64
    bad = dict(rec.state_dict())
    bad["y_knots"] = bad["y_knots"].flip(0)
    with pytest.raises(ValueError, match="^y_knots"):
        QuantileRecalibrator().load_state_dict(bad)
    bad = dict(rec.state_dict())
    bad["x_knots"] = bad["x_knots"] * 2
    with pytest.raises(ValueError, match="^x_knots"):
        QuantileRecalibrator().load_state_dict(bad)
    with pytest.raises(NotFittedError):
        QuantileRecalibrator().levels_for(0.5)


def test_bad_input_names_the_argument():
    rec = QuantileRecalibrator()
    for pit in (torch.tensor([0.2, 1.5]), torch.tensor([0.2, float("nan")]), torch.zeros(0)):
        with pytest.raises(ValueError, match="^pit"):
            rec.fit(pit)
    with pytest.raises(ValueError, match="^pit"):
        rec.fit(torch.tensor([0, 1]))  # integer
    rec.fit(torch.tensor([0.1, 0.5, 0.7]))
    for tau in (0.0, 1.0, torch.tensor([0.5, 1.2]), float("nan")):
        with pytest.raises(ValueError, match="^tau"):
            rec.levels_for(tau)
    with pytest.raises(ValueError, match="^coverage"):
        rec.interval(torch.distributions.Normal(0.0, 1.0), 1.0)
    with pytest.raises(ValueError, match="^p"):
        rec.recalibrate(torch.tensor([-0.1]))
    with pytest.raises(ValueError, match="^distribution"):
        rec.quantile(object(), 0.5)  # type: ignore[arg-type]


def test_fits_on_the_functional_pit():
    from torchcal.functional import pit_normal

    dist, y = laplace_truth_normal_forecast(500, 5)
    a, b = QuantileRecalibrator(), QuantileRecalibrator()
    a.fit(pit_normal(dist.loc, dist.scale, y))
    b.fit(dist.cdf(y))
    torch.testing.assert_close(a.x_knots, b.x_knots, rtol=0, atol=1e-15)
