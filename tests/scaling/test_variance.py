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
    assert abs(res.scale / 2 - 1) < 0.02
    d, bb = (y - loc).numpy(), b.numpy()
    logpdf = stats.norm.logpdf if family == "normal" else stats.laplace.logpdf

    def nll(log_s):
        return -np.mean(logpdf(d, scale=bb * math.exp(log_s)))

    ref = optimize.minimize_scalar(nll, bracket=(-1, 1), tol=1e-12)
    assert abs(math.log(res.scale) - ref.x) < 1e-6
    assert res.before == pytest.approx(nll(0.0), rel=1e-12, abs=0)
    assert res.after == pytest.approx(nll(math.log(res.scale)), rel=1e-12, abs=0)
    assert res.grad_norm < 1e-12


# --------------------------------------------------------------------- CRPS: Newton on log s
@pytest.mark.parametrize("family", ["normal", "laplace", "logistic"])
def test_crps_matches_scipy(family):
    loc, b, y = forecast(20000, 1, family=family)
    res = VarianceScaler(objective="crps", family=family).fit(loc, b, y)
    assert res.converged and res.method == "newton_crps"
    assert abs(res.scale / 2 - 1) < 0.02  # CRPS is proper: the right family recovers 2
    yy, mu, bb = y.numpy(), loc.numpy(), b.numpy()

    def crps(log_s):  # independent references: properscoring / scoringrules
        s = bb * math.exp(log_s)
        if family == "normal":
            return np.mean(ps.crps_gaussian(yy, mu, s))
        if family == "laplace":
            return np.mean(sr.crps_laplace(yy, mu, s))
        return np.mean(sr.crps_logistic(yy, mu, s))

    ref = optimize.minimize_scalar(crps, bracket=(0, 1), tol=1e-12)
    assert abs(math.log(res.scale) - ref.x) < 1e-6
    assert res.after == pytest.approx(crps(math.log(res.scale)), rel=1e-10)
    assert res.before == pytest.approx(crps(0.0), rel=1e-10)
    assert res.grad_norm < 1e-9


def test_crps_newton_from_far_start_and_float32_input():
    loc, b, y = forecast(5000, 2, factor=300.0)
    r64 = VarianceScaler(objective="crps").fit(loc, b, y)
    r32 = VarianceScaler(objective="crps").fit(loc.float(), b.float(), y.float())
    assert r64.converged and abs(r64.scale / 300 - 1) < 0.05
    assert r32.scale == pytest.approx(r64.scale, rel=1e-5)


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
        assert not res.converged and res.scale == pytest.approx(1e-6)


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


# ------------------------------------------------- closed-form scale derivatives (CRPS fit)
@pytest.mark.parametrize("family", ["normal", "laplace", "logistic"])
def test_crps_scale_sums_match_autograd_of_the_closed_forms(family, monkeypatch):
    """Weighted sums of the CRPS and of d/ds, s d2/ds2 from crps_scale_sums == the closed-form
    CRPS and its double backward (an independent path: the custom backward, differentiated by
    autograd), across several blocks (a small block size) and extreme residuals."""
    import torchcal.functional.crps_scale as C
    from torchcal.functional import crps_laplace, crps_logistic, crps_normal

    monkeypatch.setattr(C, "SCALE_BLOCK", 6)  # 13 values: a last block of one
    crps = {"normal": crps_normal, "laplace": crps_laplace, "logistic": crps_logistic}[family]
    r = torch.tensor(
        [-30.0, -3.0, -1.0, -0.2, 0.0, 0.1, 0.7, 2.0, 5.0, 40.0, 1e-3, -7.5, 0.33],
        dtype=torch.float64,
    )
    w = torch.linspace(0.2, 3.0, r.numel(), dtype=torch.float64)
    for s0 in (0.3, 1.0, 2.5):
        s = torch.full_like(r, s0, requires_grad=True)
        per = crps(torch.zeros_like(r), s, r, reduction="none")
        (g,) = torch.autograd.grad((per * w).sum(), s, create_graph=True)
        (h,) = torch.autograd.grad(g.sum(), s)
        f, d, c = C.crps_scale_sums(family, r, s0, w)
        assert f == pytest.approx(float((per * w).sum().detach()), rel=1e-13)
        assert d == pytest.approx(float(g.sum().detach()), rel=1e-11, abs=1e-13)
        assert c == pytest.approx(float(s0 * h.sum()), rel=1e-10, abs=1e-13)
    huge = torch.tensor([1e200, -1e300], dtype=torch.float64)
    f, d, c = C.crps_scale_sums(family, huge, 1.0, torch.ones(2, dtype=torch.float64))
    assert math.isfinite(d) and c == 0.0
    with pytest.raises(ValueError, match="^family"):
        C.crps_scale_sums("gamma", r, 1.0, w)


@pytest.mark.parametrize("family", ["normal", "laplace", "logistic"])
def test_crps_fit_matches_a_bounded_scalar_minimiser(family):
    """The Newton fit on closed-form derivatives lands on the argmin of the mean CRPS found by
    scipy's bounded Brent on log s (float64), with per-row scales."""
    from scipy.optimize import minimize_scalar

    from torchcal.functional import crps_laplace, crps_logistic, crps_normal

    crps = {"normal": crps_normal, "laplace": crps_laplace, "logistic": crps_logistic}[family]
    g = torch.Generator().manual_seed(3)
    loc = torch.randn(5000, generator=g, dtype=torch.float64)
    scale = 0.2 + torch.rand(5000, generator=g, dtype=torch.float64)
    y = loc + 1.7 * scale * torch.randn(5000, generator=g, dtype=torch.float64)

    def mean_crps(u: float) -> float:
        return float(crps(loc, math.exp(u) * scale, y))

    ref = minimize_scalar(mean_crps, bounds=(-3, 3), method="bounded", options={"xatol": 1e-10})
    res = VarianceScaler(objective="crps", family=family).fit(loc, scale, y)
    assert res.converged and res.method == "newton_crps"
    assert abs(math.log(res.scale) - ref.x) < 1e-7
    assert res.after == pytest.approx(ref.fun, rel=1e-12, abs=0)
    assert res.before == pytest.approx(mean_crps(0.0), rel=1e-12)


@pytest.mark.parametrize("family", ["normal", "laplace", "logistic"])
def test_crps_one_newton_step_uses_the_exact_log_scale_derivatives(family):
    """max_iter=1: the fit takes one Newton step u1 = u0 - F'(u0) / F''(u0) on u = log s from
    u0 = log(rms(r) / sd of the unit family), F the summed CRPS, F' and F'' by autograd (double
    backward) of the closed form; grad_norm is |d mean CRPS / d log s| at u1 (scales with mean
    about 5, so a sum over scales is not confused with a count)."""
    from torchcal.functional import crps_laplace, crps_logistic, crps_normal

    crps = {"normal": crps_normal, "laplace": crps_laplace, "logistic": crps_logistic}[family]
    unit_sd = {"normal": 1.0, "laplace": math.sqrt(2.0), "logistic": math.pi / math.sqrt(3.0)}
    other = {"normal": "laplace", "laplace": "normal", "logistic": "laplace"}[family]
    loc, b, y = forecast(3000, 12, factor=3.0, family=other)  # the start is not the optimum
    b = 5.0 * b

    def derivatives(u0: float) -> tuple[float, float]:
        u = torch.tensor(u0, dtype=torch.float64, requires_grad=True)
        f = crps(loc, torch.exp(u) * b, y, reduction="sum")
        (g,) = torch.autograd.grad(f, u, create_graph=True)
        (h,) = torch.autograd.grad(g, u)
        return float(g.detach()), float(h)

    u0 = math.log(float(((y - loc) / b).square().mean().sqrt()) / unit_sd[family])
    g0, h0 = derivatives(u0)
    assert 1e-6 < abs(g0 / h0) < 1.0  # a real step, inside the step cap
    with pytest.warns(CalibrationWarning, match="^scale_factor: the CRPS fit stopped after 1"):
        res = VarianceScaler(objective="crps", family=family, max_iter=1).fit(loc, b, y)
    assert res.iterations == 1 and not res.converged
    u1 = u0 - g0 / h0
    assert math.log(res.scale) == pytest.approx(u1, rel=1e-12, abs=1e-13)
    g1, _ = derivatives(u1)
    assert res.grad_norm == pytest.approx(abs(g1) / y.numel(), rel=1e-8)
    assert res.after == pytest.approx(float(crps(loc, res.scale * b, y)), rel=1e-12)
    # quadratic convergence from there: a handful of steps, whatever the start
    for factor in (0.01, 2.0, 300.0):
        loc, b, y = forecast(3000, 13, factor=factor, family=family)
        assert VarianceScaler(objective="crps", family=family).fit(loc, b, y).iterations <= 4


def test_crps_optimum_above_the_upper_bound_stops_there_with_a_warning():
    loc, b, y = forecast(2000, 14, factor=2.0)
    with pytest.warns(CalibrationWarning, match="^scale_factor: the CRPS optimum lies outside"):
        res = VarianceScaler(objective="crps", bounds=(1e-3, 1.5)).fit(loc, b, y)
    assert res.scale == pytest.approx(1.5, rel=1e-14) and not res.converged
