"""VarianceScaler: the NLL / CRPS optimum against scipy, coverage, invariants, state, input."""

import io
import math
import warnings

import numpy as np
import properscoring as ps
import pytest
import scoringrules as sr
import torch
from scipy import optimize, stats

from torchcal.functional.invariants import check_monotone_map
from torchcal.scaling import CalibrationWarning, NotFittedError, VarianceScaler


def forecast(n: int, seed: int, factor: float = 2.0, family: str = "normal"):
    """loc, predicted scale b, and y drawn with scale factor * b (the model is off by factor)."""
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(n, generator=g, dtype=torch.float64)
    b = 0.5 + torch.rand(n, generator=g, dtype=torch.float64)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    if family == "normal":
        eps = torch.special.ndtri(u)
    elif family == "laplace":
        eps = -torch.sign(u - 0.5) * torch.log1p(-2 * (u - 0.5).abs())
    else:
        eps = torch.log(u) - torch.log1p(-u)
    return loc, b, loc + factor * b * eps


# --------------------------------------------------------------------- NLL: closed form
@pytest.mark.parametrize("family", ["normal", "laplace"])
def test_nll_recovers_factor_and_matches_scipy(family):
    loc, b, y = forecast(20000, 0, family=family)
    res = VarianceScaler(family=family).fit(loc, b, y)
    assert res.converged and res.method == "closed_form_nll"
    assert abs(res.temperature / 2 - 1) < 0.02
    d, bb = (y - loc).numpy(), b.numpy()
    logpdf = stats.norm.logpdf if family == "normal" else stats.laplace.logpdf

    def nll(log_s):
        return -np.mean(logpdf(d, scale=bb * math.exp(log_s)))

    ref = optimize.minimize_scalar(nll, bracket=(-1, 1), tol=1e-12)
    assert abs(math.log(res.temperature) - ref.x) < 1e-6
    assert res.nll_before == pytest.approx(nll(0.0), rel=1e-12, abs=0)
    assert res.nll_after == pytest.approx(nll(math.log(res.temperature)), rel=1e-12, abs=0)
    assert res.grad_norm < 1e-12


# --------------------------------------------------------------------- CRPS: Newton on log s
@pytest.mark.parametrize("family", ["normal", "laplace", "logistic"])
def test_crps_matches_scipy(family):
    loc, b, y = forecast(20000, 1, family=family)
    res = VarianceScaler(objective="crps", family=family).fit(loc, b, y)
    assert res.converged and res.method == "newton_crps"
    assert abs(res.temperature / 2 - 1) < 0.02  # CRPS is proper: the right family recovers 2
    yy, mu, bb = y.numpy(), loc.numpy(), b.numpy()

    def crps(log_s):  # independent references: properscoring / scoringrules
        s = bb * math.exp(log_s)
        if family == "normal":
            return np.mean(ps.crps_gaussian(yy, mu, s))
        if family == "laplace":
            return np.mean(sr.crps_laplace(yy, mu, s))
        return np.mean(sr.crps_logistic(yy, mu, s))

    ref = optimize.minimize_scalar(crps, bracket=(0, 1), tol=1e-12)
    assert abs(math.log(res.temperature) - ref.x) < 1e-6
    assert res.nll_after == pytest.approx(crps(math.log(res.temperature)), rel=1e-10)
    assert res.nll_before == pytest.approx(crps(0.0), rel=1e-10)
    assert res.grad_norm < 1e-9


def test_crps_newton_from_far_start_and_float32_input():
    loc, b, y = forecast(5000, 2, factor=300.0)
    r64 = VarianceScaler(objective="crps").fit(loc, b, y)
    r32 = VarianceScaler(objective="crps").fit(loc.float(), b.float(), y.float())
    assert r64.converged and abs(r64.temperature / 300 - 1) < 0.05
    assert r32.temperature == pytest.approx(r64.temperature, rel=1e-5)


@pytest.mark.parametrize("objective", ["nll", "crps"])
def test_restores_nominal_coverage_on_held_out_data(objective):
    loc, b, y = forecast(20000, 3)
    loc_t, b_t, y_t = forecast(20000, 4)
    vs = VarianceScaler(objective=objective)
    vs.fit(loc, b, y)
    for level in (0.5, 0.8, 0.9, 0.95):
        z = stats.norm.ppf(0.5 + level / 2)
        se = math.sqrt(level * (1 - level) / 20000)
        before = float(((y_t - loc_t).abs() <= z * b_t).double().mean())
        m, s = vs(loc_t, b_t)
        after = float(((y_t - m).abs() <= z * s).double().mean())
        assert abs(before - level) > 10 * se  # the test has teeth
        assert abs(after - level) <= 3 * se


def test_keeps_mean_and_every_quantile_order():
    loc, b, y = forecast(2000, 5, factor=0.5)
    vs = VarianceScaler()
    vs.fit(loc, b, y)
    new_loc, new_b = vs(loc, b)
    assert new_loc is loc
    levels = torch.linspace(0.01, 0.99, 99, dtype=torch.float64)
    before = torch.distributions.Normal(loc[:, None], b[:, None]).icdf(levels)
    after = torch.distributions.Normal(new_loc[:, None], new_b[:, None]).icdf(levels)
    chk = check_monotone_map(before, after, decisions=False)
    assert chk.ok and chk.strict_inversions == 0
    assert torch.equal(after[:, 49], loc)  # the median is the mean
    torch.testing.assert_close(after - loc[:, None], vs.scale_factor * (before - loc[:, None]))


def test_zero_residuals_stop_on_bound_with_warning():
    loc = torch.randn(50, dtype=torch.float64)
    for objective in ("nll", "crps"):
        with pytest.warns(CalibrationWarning, match="^scale_factor"):
            res = VarianceScaler(objective=objective).fit(loc, torch.ones(50), loc.clone())
        assert not res.converged and res.temperature == pytest.approx(1e-6)


# --------------------------------------------------------------------- state
def test_state_round_trip_dtype_and_validation():
    loc, b, y = forecast(1000, 6)
    vs = VarianceScaler()
    vs.fit(loc, b, y)
    buf = io.BytesIO()
    torch.save(vs.state_dict(), buf)
    buf.seek(0)
    other = VarianceScaler()
    other.load_state_dict(torch.load(buf, weights_only=True))
    assert other.is_fitted and other.scale_factor == vs.scale_factor
    other.to(torch.bfloat16)
    assert other.log_scale_factor.dtype == torch.float64
    assert other(loc.float(), b.float())[1].dtype == torch.float32
    with pytest.raises(ValueError, match="^log_scale_factor"):
        VarianceScaler().load_state_dict(
            {"log_scale_factor": torch.tensor(float("nan")), "fitted": torch.tensor(True)}
        )
    with pytest.raises(ValueError, match="^log_scale_factor"):
        VarianceScaler().load_state_dict(
            {"log_scale_factor": torch.tensor(800.0), "fitted": torch.tensor(True)}
        )
    with pytest.raises(NotFittedError):
        VarianceScaler()(loc, b)
    vs2 = VarianceScaler()
    vs2.scale_factor = 3.0
    assert vs2.is_fitted and vs2(loc, b)[1][0] == pytest.approx(3 * float(b[0]))


# --------------------------------------------------------------------- bad input
def test_bad_input_names_the_argument():
    loc, b, y = forecast(100, 7)
    vs = VarianceScaler()
    cases = [
        ("^scale", lambda: vs.fit(loc, -b, y)),
        ("^scale", lambda: vs.fit(loc, torch.zeros_like(b), y)),
        ("^target", lambda: vs.fit(loc, b, torch.full_like(y, float("nan")))),
        ("^loc", lambda: vs.fit(torch.full_like(loc, float("inf")), b, y)),
        ("^target", lambda: vs.fit(loc, b, y[:, None])),  # the target never broadcasts
        ("^objective", lambda: VarianceScaler(objective="mse")),
        ("^family", lambda: VarianceScaler(family="cauchy")),
        ("^family", lambda: VarianceScaler(family="logistic")),  # no NLL closed form
        ("^bounds", lambda: VarianceScaler(bounds=(0.0, 1.0))),
        ("^scale_factor", lambda: setattr(vs, "scale_factor", -1.0)),
    ]
    for pattern, call in cases:
        with pytest.raises(ValueError, match=pattern):
            call()
    vs.fit(loc, b, y)
    with pytest.raises(ValueError, match="^scale"):
        vs(loc, -b)
    with pytest.raises(ValueError, match="^loc"):
        vs(torch.full_like(loc, float("nan")), b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vs.fit(loc, b, y)  # a clean fit warns nothing
