"""Platt, vector, matrix, group temperature and isotonic calibrators against their oracles."""

import io
import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq, minimize
from scipy.special import expit, log_expit, logsumexp

from torchcal.functional.invariants import check_monotone_map
from torchcal.scaling import (
    CalibrationWarning,
    GroupTemperatureScaler,
    IsotonicCalibrator,
    MatrixScaler,
    NotFittedError,
    PlattScaler,
    TemperatureScaler,
    VectorScaler,
)


def _round_trip(module, fresh):
    buf = io.BytesIO()
    torch.save(module.state_dict(), buf)
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    return fresh


def _multiclass(n, c, seed, t=2.0, bias=None):
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(n, c, generator=g, dtype=torch.float64)
    zz = z / t + (0 if bias is None else torch.as_tensor(bias, dtype=torch.float64))
    y = torch.multinomial(torch.softmax(zz, 1), 1, generator=g).squeeze(1)
    return z, y


# ----------------------------------------------------------------------------- Platt
def _platt_numpy(params, s, y):
    a, b = params
    t = a * s + b
    f = np.mean(-(y * log_expit(t) + (1 - y) * log_expit(-t)))
    r = expit(t) - y
    return f, np.array([np.mean(r * s), np.mean(r)])


def _platt_targets(y):
    """Platt's (1999, section 2.2) smoothed targets, written out independently."""
    n_pos, n_neg = y.sum(), len(y) - y.sum()
    return np.where(y > 0.5, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2))


@pytest.mark.parametrize("smooth", [True, False])
def test_platt_reaches_scipy_optimum_and_keeps_ranking(smooth):
    sk = pytest.importorskip("sklearn.metrics")
    g = torch.Generator().manual_seed(0)
    s = 3 * torch.randn(5000, generator=g, dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(0.4 * s - 1.2), generator=g)
    platt = PlattScaler(smooth_targets=smooth)
    res = platt.fit(s, y)
    sn, yn = s.numpy(), y.numpy()
    tn = _platt_targets(yn) if smooth else yn
    ref = minimize(
        _platt_numpy, x0=[1.0, 0.0], args=(sn, tn), jac=True, method="BFGS", options={"gtol": 1e-12}
    )
    ours = np.array([platt.weight.item(), platt.bias.item()])
    f_ours, g_ours = _platt_numpy(ours, sn, tn)
    assert res.converged and res.grad_norm <= 1e-8
    assert res.passes >= res.iterations + 1  # one objective evaluation per pass, reported
    assert np.linalg.norm(g_ours) <= 1e-8
    assert f_ours <= ref.fun + 1e-12
    assert np.allclose(ours, ref.x, atol=1e-6)
    # nll_before / nll_after are the NLL of the 0/1 labels, whatever the fitted targets
    assert abs(res.nll_after - _platt_numpy(ours, sn, yn)[0]) <= 1e-12
    assert abs(res.nll_before - _platt_numpy([1.0, 0.0], sn, yn)[0]) <= 1e-12
    assert res.nll_after < res.nll_before
    out = platt(s).detach()
    check = check_monotone_map(s, out, decisions=False)
    assert check.ok and check.strict_inversions == 0
    assert sk.roc_auc_score(yn, out.numpy()) == sk.roc_auc_score(yn, sn)


def test_platt_default_matches_sklearn_sigmoid_calibration():
    """The default (smoothed targets) is scikit-learn's ``_sigmoid_calibration`` (its sign
    convention: P = 1 / (1 + exp(A f + B)), so a = -A, b = -B); scikit-learn stops its LBFGS
    at gtol 1e-6, hence the looser tolerance than against the tight scipy fit above."""
    cal = pytest.importorskip("sklearn.calibration")
    g = torch.Generator().manual_seed(3)
    s = 2 * torch.randn(800, generator=g, dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(1.5 * s + 0.3), generator=g)
    platt = PlattScaler()
    platt.fit(s, y)
    A, B = cal._sigmoid_calibration(s.numpy(), y.numpy())
    assert abs(platt.weight.item() + A) <= 1e-4 * abs(A)
    assert abs(platt.bias.item() + B) <= 1e-4 * max(1.0, abs(B))
    # and the plain 0/1 fit is a different (sharper) map: the smoothing is not a no-op
    plain = PlattScaler(smooth_targets=False)
    plain.fit(s, y)
    assert plain.weight.item() > platt.weight.item() * (1 + 1e-3)


def test_platt_separated_set():
    """0/1 targets on a separated set: slope on its bound, warned, converged=False (no longer
    a finite 'converged' slope); the default smoothed targets have a finite optimum there."""
    s = torch.linspace(-3, 3, 200, dtype=torch.float64)
    y = (s > 0).double()
    with pytest.warns(CalibrationWarning, match="perfectly separated"):
        res = PlattScaler(smooth_targets=False).fit(s, y)
    assert not res.converged and math.isfinite(res.nll_after)
    # quasi-separation (a tie across the classes) is separation too
    s2 = torch.tensor([-2.0, 0.0, 0.0, 2.0], dtype=torch.float64)
    with pytest.warns(CalibrationWarning, match="perfectly separated"):
        PlattScaler(smooth_targets=False).fit(s2, torch.tensor([0.0, 0.0, 1.0, 1.0]))
    platt = PlattScaler()
    res = platt.fit(s, y)
    sn, yn = s.numpy(), y.numpy()
    ref = minimize(
        _platt_numpy,
        x0=[1.0, 0.0],
        args=(sn, _platt_targets(yn)),
        jac=True,
        method="BFGS",
        options={"gtol": 1e-12},
    )
    assert res.converged and not res.warnings
    assert np.allclose([platt.weight.item(), platt.bias.item()], ref.x, atol=1e-6)


def test_platt_saturated_scores_do_not_crash():
    """Issue 9: ``fit([1e3, -1e3, 2e3, -3e3], [1, 1, 0, 0])`` crashed in linalg.solve (every
    score saturated at a = 1: a zero Hessian). The optimum slope (scikit-learn: 6.8e-5) is
    below the bound 1 / t_max, so a stops there, with a warning."""
    s = torch.tensor([1e3, -1e3, 2e3, -3e3], dtype=torch.float64)
    y = torch.tensor([1.0, 1.0, 0.0, 0.0])
    with pytest.warns(CalibrationWarning, match="slope bound"):
        res = PlattScaler().fit(s, y)
    assert not res.converged and math.isfinite(res.nll_after)
    wide = PlattScaler(bounds=(1e-3, 1e6))
    res = wide.fit(s, y)  # the bound no longer binds: the smoothed optimum, interior
    tn = _platt_targets(y.numpy())
    ref = minimize(
        _platt_numpy,
        x0=[0.0, 0.0],
        args=(s.numpy() / 3e3, tn),
        jac=True,
        method="BFGS",
        options={"gtol": 1e-14},
    )
    assert res.converged
    assert abs(wide.weight.item() - ref.x[0] / 3e3) <= 1e-6 * abs(ref.x[0] / 3e3)
    assert abs(wide.bias.item() - ref.x[1]) <= 1e-6


def test_platt_degenerate_and_bad_input():
    s = torch.linspace(-3, 3, 200, dtype=torch.float64)
    with pytest.warns(CalibrationWarning, match="slope bound"):
        res = PlattScaler().fit(s, (s < 0).double())  # anti-correlated: a -> 1 / t_max
    assert not res.converged and math.isfinite(res.nll_after)
    with pytest.raises(ValueError, match="^target: expected both classes"):
        PlattScaler().fit(s, torch.ones(200))
    with pytest.raises(ValueError, match=r"^logits: expected \(N,\) binary"):
        PlattScaler().fit(torch.zeros(4, 2), torch.zeros(4))
    with pytest.raises(ValueError, match="^logits: expected finite"):
        PlattScaler().fit(torch.tensor([0.0, float("nan")]), torch.tensor([0.0, 1.0]))
    with pytest.raises(NotFittedError):
        PlattScaler()(s)


def test_platt_state_round_trip():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(300, generator=g)
    y = torch.bernoulli(torch.sigmoid(s + 0.5), generator=g)
    platt = PlattScaler()
    platt.fit(s, y)
    loaded = _round_trip(platt, PlattScaler())
    assert set(platt.state_dict()) == {"weight", "bias", "fitted"}
    assert loaded.is_fitted and torch.equal(loaded(s), platt(s))


# ----------------------------------------------------------------------------- vector / matrix
def _affine_numpy(params, z, y, kind, od, breg):
    n, c = z.shape
    if kind == "vector":
        w, b = params[:c], params[c:]
        a = z * w + b
    else:
        w, b = params[: c * c].reshape(c, c), params[c * c :]
        a = z @ w.T + b
    lse = logsumexp(a, axis=1)
    f = np.mean(lse - a[np.arange(n), y])
    p = np.exp(a - lse[:, None])
    p[np.arange(n), y] -= 1
    p /= n
    gb = p.sum(0) + 2 * breg / c * b
    if kind == "vector":
        gw = (p * z).sum(0)
        f += breg / c * np.sum(b * b)
    else:
        off = w - np.diag(np.diag(w))
        gw = p.T @ z + 2 * od / (c * (c - 1)) * off
        f += od / (c * (c - 1)) * np.sum(off * off) + breg / c * np.sum(b * b)
    return f, np.concatenate([gw.ravel(), gb])


@pytest.mark.parametrize("kind", ["vector", "matrix"])
def test_affine_scalers_reach_scipy_optimum(kind):
    c = 4
    z, y = _multiclass(3000, c, seed=2, bias=[0.5, 0.0, -0.5, 0.2])
    if kind == "vector":
        scaler, od, breg = VectorScaler(c, bias_reg=0.0), 0.0, 0.0
        x0 = np.concatenate([np.ones(c), np.zeros(c)])
    else:
        scaler, od, breg = MatrixScaler(c, off_diagonal_reg=0.05, bias_reg=0.01), 0.05, 0.01
        x0 = np.concatenate([np.eye(c).ravel(), np.zeros(c)])
    res = scaler.fit(z.float(), y)
    zn, yn = z.float().double().numpy(), y.numpy()
    ref = minimize(
        _affine_numpy,
        x0,
        args=(zn, yn, kind, od, breg),
        jac=True,
        method="L-BFGS-B",
        options={"gtol": 1e-13, "ftol": 1e-16, "maxiter": 5000},
    )
    ours = np.concatenate([scaler.weight.detach().numpy().ravel(), scaler.bias.detach().numpy()])
    f_ours, g_ours = _affine_numpy(ours, zn, yn, kind, od, breg)
    assert res.converged and res.grad_norm <= 1e-8
    assert np.linalg.norm(g_ours) <= 1e-8
    assert f_ours <= ref.fun + 1e-12
    if kind == "vector":  # without bias_reg the biases are defined up to a common shift
        ours[c:] -= ours[c:].mean()
        ref.x[c:] -= ref.x[c:].mean()
    assert np.allclose(ours, ref.x, atol=1e-5)
    assert res.nll_after < res.nll_before
    loaded = _round_trip(scaler, VectorScaler(c) if kind == "vector" else MatrixScaler(c))
    assert torch.equal(loaded(z), scaler(z))
    assert set(scaler.state_dict()) == {"weight", "bias", "fitted"}


def _perturbed_affine(kind):
    """A 4-class scaler and parameters near its identity: (scaler, w, b, w.numel(), flat x)."""
    sc = VectorScaler(4) if kind == "vector" else MatrixScaler(4)
    g = torch.Generator().manual_seed(10)
    w = sc.weight.detach() + 0.3 * torch.randn(sc.weight.shape, generator=g, dtype=torch.float64)
    b = 0.3 * torch.randn(4, generator=g, dtype=torch.float64)
    return sc, w, b, w.numel(), torch.cat([w.flatten(), b])


@pytest.mark.parametrize("kind", ["vector", "matrix"])
def test_closed_form_nll_hessian_matches_autograd(kind):
    z, y = _multiclass(200, 4, seed=9)
    sc, w, b, nw, x = _perturbed_affine(kind)
    ref = torch.autograd.functional.hessian(
        lambda v: sc.objective(z, y, v[:nw].reshape(w.shape), v[nw:])[1], x
    )
    assert torch.allclose(sc._nll_hessian(z, w, b), ref, rtol=1e-10, atol=1e-13)


def test_vector_scaling_may_change_the_argmax():
    """No argmax invariance is claimed: per-class biases can move the top-1 prediction."""
    z, y = _multiclass(3000, 3, seed=3, bias=[2.0, 0.0, -2.0])
    scaler = VectorScaler(3)
    scaler.fit(z, y)
    assert not torch.equal(scaler(z).argmax(1), z.argmax(1))


def _masked_affine_numpy(params, z, mask, y, kind, od, breg):
    """The masked objective, independently: masked inputs enter as 0, masked outputs -inf."""
    n, c = z.shape
    zf = np.where(mask, 0.0, z)
    if kind == "vector":
        a = zf * params[:c] + params[c:]
    else:
        a = zf @ params[: c * c].reshape(c, c).T + params[c * c :]
    a = np.where(mask, -np.inf, a)
    f = np.mean(logsumexp(a, axis=1) - a[np.arange(n), y])
    w = params[: c * c].reshape(c, c) if kind == "matrix" else None
    if kind == "vector":
        f += breg / c * np.sum(params[c:] ** 2)
    else:
        off = w - np.diag(np.diag(w))
        f += od / (c * (c - 1)) * np.sum(off * off) + breg / c * np.sum(params[c * c :] ** 2)
    return f


@pytest.mark.parametrize("kind", ["vector", "matrix"])
def test_affine_scalers_with_masked_logits(kind):
    """Issue 9: -inf masks made MatrixScaler's output NaN. A masked entry stays -inf
    (probability 0) and contributes nothing to the other classes; the fit minimises that
    masked objective (checked against an independent numpy objective: no lower value nearby,
    and the unmasked parameters' optimum matches scipy's)."""
    c = 4
    z, y = _multiclass(2000, c, seed=12, bias=[0.3, 0.0, -0.3, 0.1])
    g = torch.Generator().manual_seed(13)
    mask = torch.rand(z.shape, generator=g) < 0.2
    mask[torch.arange(2000), y] = False
    zm = z.masked_fill(mask, -math.inf)
    scaler = VectorScaler(c, bias_reg=0.01) if kind == "vector" else MatrixScaler(c, reg=0.01)
    od, breg = (0.0, 0.01) if kind == "vector" else (0.01, 0.01)
    res = scaler.fit(zm, y)
    assert res.converged and math.isfinite(res.nll_after)
    zn, mn, yn = z.numpy(), mask.numpy(), y.numpy()
    x0 = np.concatenate([np.ones(c) if kind == "vector" else np.eye(c).ravel(), np.zeros(c)])
    ref = minimize(
        _masked_affine_numpy,
        x0,
        args=(zn, mn, yn, kind, od, breg),
        method="BFGS",
        options={"gtol": 1e-10},
    )
    ours = np.concatenate([scaler.weight.detach().numpy().ravel(), scaler.bias.detach().numpy()])
    assert _masked_affine_numpy(ours, zn, mn, yn, kind, od, breg) <= ref.fun + 1e-10
    assert np.allclose(ours, ref.x, atol=1e-4)
    assert abs(res.nll_after - _masked_affine_numpy(ours, zn, mn, yn, kind, 0.0, 0.0)) <= 1e-12
    # forward: no NaN, masked entries -inf, also with a negative weight on a masked class
    out = scaler(zm)
    assert not bool(torch.isnan(out).any())
    assert torch.equal(torch.isneginf(out), mask)
    with torch.no_grad():
        scaler.weight.neg_()
    out = scaler(zm)
    assert torch.equal(torch.isneginf(out), mask) and not bool(torch.isnan(out).any())
    # the target class masked: likelihood 0, a clear error
    bad = zm.clone()
    bad[5, y[5]] = -math.inf
    with pytest.raises(ValueError, match=r"^logits: the target class is masked \(-inf\) at row 5"):
        (VectorScaler(c) if kind == "vector" else MatrixScaler(c)).fit(bad, y)


@pytest.mark.parametrize("kind", ["vector", "matrix"])
def test_closed_form_masked_hessian_matches_autograd(kind):
    z, y = _multiclass(200, 4, seed=9)
    mask = torch.rand(z.shape, generator=torch.Generator().manual_seed(3)) < 0.25
    mask[torch.arange(200), y] = False
    zf = z.masked_fill(mask, 0.0)
    sc, w, b, nw, x = _perturbed_affine(kind)
    ref = torch.autograd.functional.hessian(
        lambda v: sc.objective(zf, y, v[:nw].reshape(w.shape), v[nw:], mask)[1], x
    )
    assert torch.allclose(sc._nll_hessian(zf, w, b, mask), ref, rtol=1e-10, atol=1e-13)


def test_affine_bad_input():
    with pytest.raises(ValueError, match="^logits: expected 3 columns"):
        VectorScaler(3).fit(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="^off_diagonal_reg:"):
        MatrixScaler(2, off_diagonal_reg=-1.0)
    with pytest.raises(NotFittedError):
        VectorScaler(2)(torch.zeros(1, 2))


# ----------------------------------------------------------------------------- groups
def _penalised_group_optimum(z, y, center_log_t, shrinkage):
    """Brent root of d/dlogT [sum NLL + s/2 (log T - log T0)^2] for one group (float64)."""

    def grad(lt):
        beta = math.exp(-lt)
        p = torch.softmax(beta * z, 1)
        gb = ((p * z).sum(1) - z.gather(1, y[:, None]).squeeze(1)).sum()
        return -beta * float(gb) + shrinkage * (lt - center_log_t)

    return math.exp(brentq(grad, -5.0, 5.0, xtol=1e-14, rtol=1e-14))


@pytest.mark.parametrize("shrinkage", [0.0, 50.0])
def test_group_temperatures_match_the_penalised_optimum(shrinkage):
    g = torch.Generator().manual_seed(4)
    n = 3000
    groups = torch.randint(0, 3, (n,), generator=g)
    groups[:5] = 2
    groups[5:] = torch.where(groups[5:] == 2, 0, groups[5:])  # group 2 has only 5 samples
    z = 3 * torch.randn(n, 6, generator=g, dtype=torch.float64)
    true_t = torch.tensor([1.0, 3.0, 2.0], dtype=torch.float64)[groups]
    y = torch.multinomial(torch.softmax(z / true_t[:, None], 1), 1, generator=g).squeeze(1)
    scaler = GroupTemperatureScaler(3, shrinkage=shrinkage)
    res = scaler.fit(z, y, groups)
    t_glob = TemperatureScaler(method="newton").fit(z, y).temperature
    assert res.temperature == t_glob
    assert abs(TemperatureScaler().fit(z, y).temperature / t_glob - 1) <= 1e-8
    for k in range(3):
        m = groups == k
        ref = _penalised_group_optimum(z[m], y[m], math.log(t_glob), shrinkage)
        assert abs(res.temperatures[k] / ref - 1) <= 1e-6
    assert res.converged and res.nll_after <= res.nll_before
    if shrinkage > 0:  # the 5-sample group is pulled toward the global T
        free = GroupTemperatureScaler(3, shrinkage=0.0).fit(z, y, groups).temperatures
        assert abs(math.log(res.temperatures[2] / t_glob)) < abs(math.log(free[2] / t_glob))
    out = scaler(z, groups).detach()
    check = check_monotone_map(z, out)  # per row: a division by a positive T_g
    assert check.ok and check.top1_kept and check.strict_inversions == 0


def test_group_binary_keeps_ranking_within_groups_and_round_trips():
    g = torch.Generator().manual_seed(5)
    s = 4 * torch.randn(2000, generator=g, dtype=torch.float64)
    groups = torch.arange(2000) % 2
    y = torch.bernoulli(
        torch.sigmoid(s / torch.tensor([1.0, 4.0], dtype=torch.float64)[groups]), generator=g
    )
    scaler = GroupTemperatureScaler(2, shrinkage=0.0)
    res = scaler.fit(s, y, groups)
    assert res.temperatures[1] / res.temperatures[0] > 2
    out = scaler(s, groups).detach()
    for k in range(2):
        m = groups == k
        check = check_monotone_map(s[m], out[m])
        assert check.ok and check.strict_inversions == 0 and check.decisions_kept
    loaded = _round_trip(scaler, GroupTemperatureScaler(2))
    assert set(scaler.state_dict()) == {"log_temperature", "log_temperature_global", "fitted"}
    assert torch.equal(loaded(s, groups), scaler(s, groups))


def test_group_empty_group_and_bad_input():
    z, y = _multiclass(200, 3, seed=6)
    groups = torch.zeros(200, dtype=torch.long)
    with pytest.warns(CalibrationWarning, match=r"no samples in group\(s\) \[1\]"):
        res = GroupTemperatureScaler(2, shrinkage=0.0).fit(z, y, groups)
    assert res.temperatures[1] == pytest.approx(res.temperature, rel=1e-12)
    with pytest.raises(ValueError, match=r"^groups: expected group ids in \[0, 1\], got 2"):
        GroupTemperatureScaler(2).fit(z, y, groups + 2)
    with pytest.raises(
        ValueError, match=r"^groups: expected one group id per sample, shape \(200,\)"
    ):
        GroupTemperatureScaler(2).fit(z, y, groups[:10])
    with pytest.raises(ValueError, match="^shrinkage:"):
        GroupTemperatureScaler(2, shrinkage=-1.0)
    with pytest.raises(NotFittedError):
        GroupTemperatureScaler(2)(z, groups)


# ----------------------------------------------------------------------------- isotonic
def test_isotonic_binary_equals_sklearn():
    isotonic = pytest.importorskip("sklearn.isotonic")
    g = torch.Generator().manual_seed(7)
    s = torch.round(30 * torch.randn(4000, generator=g, dtype=torch.float64)) / 10  # ties
    y = torch.bernoulli(torch.sigmoid(s), generator=g)
    iso = IsotonicCalibrator()
    res = iso.fit(s, y)
    ref = isotonic.IsotonicRegression(out_of_bounds="clip").fit(s.numpy(), y.numpy())
    q = torch.cat([s, torch.linspace(-20, 20, 2001, dtype=torch.float64)])
    p_ref = ref.predict(q.numpy())
    assert np.max(np.abs(iso.predict_proba(q).numpy() - p_ref)) <= 1e-12
    # forward: calibrated logits, logit(p) with p clamped to [1e-12, 1 - 1e-12]
    z_out = iso(q)
    assert z_out.dtype == q.dtype and z_out.shape == q.shape
    assert np.max(np.abs(torch.sigmoid(z_out).numpy() - np.clip(p_ref, 1e-12, 1 - 1e-12))) <= 1e-12
    assert res.converged and res.nll_after < res.nll_before
    # weakly monotone: no pair inverted (ties are created on purpose: flat runs)
    assert (
        check_monotone_map(
            q, iso.predict_proba(q), decisions=False, max_tie_gap_ulps=2**62
        ).strict_inversions
        == 0
    )
    assert (
        check_monotone_map(q, z_out, decisions=False, max_tie_gap_ulps=2**62).strict_inversions == 0
    )


def test_isotonic_confidence_reading_equals_sklearn_and_round_trips():
    isotonic = pytest.importorskip("sklearn.isotonic")
    z, y = _multiclass(3000, 5, seed=8, t=0.5)
    z[:10, 1:] = -math.inf  # fully confident rows (masks)
    y[:10] = 0
    iso = IsotonicCalibrator(reading="confidence")
    iso.fit(z, y)
    # the score: log-odds of the top class, -logsumexp_{j != top}(z_j - z_top), in numpy
    zn = z.numpy()
    top = zn.argmax(1)
    rest = zn - zn.max(1, keepdims=True)
    rest[np.arange(len(zn)), top] = -np.inf
    with np.errstate(divide="ignore"):
        score = np.clip(-logsumexp(rest, axis=1), -np.finfo(float).max, np.finfo(float).max)
    correct = (top == y.numpy()).astype(float)
    ref = isotonic.IsotonicRegression(out_of_bounds="clip").fit(score, correct)
    got = iso.predict_proba(z).numpy()
    assert np.max(np.abs(got - ref.predict(score))) <= 1e-12
    assert np.all(got[:10] == 1.0)
    logit = iso(z)
    assert logit.shape == (3000,) and logit.dtype == z.dtype
    assert np.max(np.abs(torch.sigmoid(logit).numpy() - np.clip(got, 1e-12, 1 - 1e-12))) <= 1e-12
    loaded = _round_trip(iso, IsotonicCalibrator(reading="confidence"))
    assert torch.equal(loaded(z), iso(z))
    assert loaded.x_thresholds.shape == iso.x_thresholds.shape


def test_isotonic_pav_adversarial_order_and_bad_input():
    from torchcal.functional.recalibration import pool_adjacent_violators

    v = torch.cat([torch.arange(300, dtype=torch.float64), torch.tensor([-1e5])])
    fitted, _ = pool_adjacent_violators(v, torch.ones_like(v))
    isotonic = pytest.importorskip("sklearn.isotonic")
    ref = isotonic.IsotonicRegression().fit_transform(np.arange(301.0), v.numpy())
    assert np.max(np.abs(fitted.numpy() - ref)) <= 1e-9
    with pytest.raises(ValueError, match="^reading:"):
        IsotonicCalibrator(reading="top_label")
    with pytest.raises(NotFittedError):
        IsotonicCalibrator()(torch.zeros(3))
    with pytest.raises(ValueError, match="^target: expected binary labels"):
        IsotonicCalibrator().fit(torch.zeros(3), torch.tensor([0.0, 2.0, 1.0]))


# ----------------------------------------------------------------------------- inference mode
def test_every_calibrator_fits_inside_inference_mode():
    """Built outside or inside ``torch.inference_mode()`` (a Lightning validation hook), every
    calibrator fits there and gives the same parameters as outside."""
    z, y = _multiclass(3000, 3, seed=11)
    groups = torch.arange(3000) % 2
    s = z[:, 0] - z[:, 1]
    b = (y == 0).double()
    cases = [
        (TemperatureScaler, (z, y)),
        (lambda: GroupTemperatureScaler(2), (z, y, groups)),
        (PlattScaler, (s, b)),
        (lambda: VectorScaler(3), (z, y)),
        (lambda: MatrixScaler(3), (z, y)),
        (IsotonicCalibrator, (s, b)),
    ]
    for make, args in cases:
        ref = make()
        ref.fit(*args)
        outside = make()
        with torch.inference_mode():
            inside = make()
            inside.fit(*args)
            outside.fit(*args)
        for mod in (inside, outside):
            assert mod.is_fitted
            for key, value in ref.state_dict().items():
                assert torch.equal(mod.state_dict()[key], value), (type(mod).__name__, key)
