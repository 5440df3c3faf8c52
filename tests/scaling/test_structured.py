"""StructuredScaler (issue 28 item 4): against probmetrics' SMS on the same logits, against one
temperature where it is the Bayes map and where a structured map is the truth, the guard, the
cross-validated strength, state, masks and bad input."""

import io
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchcal.functional.structured import structured_basis
from torchcal.scaling import (
    CalibrationWarning,
    CVFit,
    NLLFit,
    NotFittedError,
    StructuredScaler,
    TemperatureScaler,
)


def _data(n, c, kind, seed=0):
    """float32 logits and labels with a known truth: labels from softmax(t); the model's
    logits are 2 t (one temperature is the Bayes map) or 2 a_c t_c + b_c (a per-class
    temperature and bias are)."""
    g = torch.Generator().manual_seed(seed)
    t = 3.0 * torch.randn(n, c, generator=g, dtype=torch.float64)
    u = torch.rand(n, c, generator=g, dtype=torch.float64).clamp_min(1e-300)
    y = (t - torch.log(-torch.log(u))).argmax(1)
    if kind == "ts":
        return (2.0 * t).float(), y
    g2 = torch.Generator().manual_seed(1234)
    a = torch.exp(0.4 * torch.randn(c, generator=g2, dtype=torch.float64))
    b = torch.randn(c, generator=g2, dtype=torch.float64)
    return (2.0 * a * t + b).float(), y


def _split(n_fit, n_test, c, kind, seed=0):
    z, y = _data(n_fit + n_test, c, kind, seed)
    return z[:n_fit], y[:n_fit], z[n_fit:], y[n_fit:]


def _nll_acc(logits, y):
    logits = logits.detach().double()
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).double().mean())


def _quiet_fit(scaler, z, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        return scaler.fit(z, y)


@pytest.mark.parametrize("c, n_fit", [(10, 3000), (100, 5000)])
def test_within_0002_of_probmetrics_sms(c, n_fit):
    """Test NLL on the same logits: ours <= probmetrics' SMS (its defaults) + 0.002."""
    pytest.importorskip("probmetrics")
    from probmetrics.calibrators import get_calibrator

    zf, yf, zt, yt = _split(n_fit, 5000, c, "vec")
    sms = get_calibrator("sms")
    sms.fit(torch.softmax(zf.double(), 1).numpy(), yf.numpy())
    q = sms.predict_proba(torch.softmax(zt.double(), 1).numpy())
    theirs = float(-np.mean(np.log(q[np.arange(len(yt)), yt.numpy()])))
    scaler = StructuredScaler(c)
    res = _quiet_fit(scaler, zf, yf)
    ours = _nll_acc(scaler(zt), yt)[0]
    assert not res.fallback
    assert ours <= theirs + 0.002, (ours, theirs)


@pytest.mark.parametrize(
    "c, n_fit, cv_rows, seed",
    [(10, 3000, None, 1), (100, 5000, None, 1), (100, 6000, 2000, 8)],
)
def test_close_to_temperature_where_it_is_the_bayes_map(c, n_fit, cv_rows, seed):
    """The default promise: within 0.005 test NLL and accuracy of TemperatureScaler, also where
    the subsample rule is active (6,000 x 100, strengths on 2,000 rows)."""
    zf, yf, zt, yt = _split(n_fit, 5000, c, "ts", seed=seed)
    ts = TemperatureScaler()
    ts.fit(zf, yf)
    nll_ts, acc_ts = _nll_acc(ts(zt), yt)
    scaler = StructuredScaler(c, cv_rows=cv_rows)
    _quiet_fit(scaler, zf, yf)
    nll, acc = _nll_acc(scaler(zt), yt)
    assert nll <= nll_ts + 0.005, (nll, nll_ts)
    assert acc >= acc_ts - 0.005, (acc, acc_ts)


def test_beats_one_temperature_where_a_structured_map_is_the_truth():
    zf, yf, zt, yt = _split(3000, 5000, 10, "vec", seed=2)
    ts = TemperatureScaler()
    ts.fit(zf, yf)
    scaler = StructuredScaler(10)
    res = scaler.fit(zf, yf)
    assert not res.fallback and res.converged
    assert min(res.cv_nll) < res.temperature_cv_nll - 0.05
    assert _nll_acc(scaler(zt), yt)[0] < _nll_acc(ts(zt), yt)[0] - 0.05


def test_fit_result_and_the_strength_path():
    zf, yf, _, _ = _split(2000, 0, 10, "vec", seed=3)
    res = StructuredScaler(10).fit(zf, yf)
    assert isinstance(res, CVFit) and res.chosen == "map" and res.temperature is None
    assert {1.0, 0.25} <= set(res.strengths)
    cv = dict(zip(res.strengths, res.cv_nll))
    # 4 is scored only where 1/4 does not improve on 1 (the walk's direction)
    assert (4.0 in cv) == (cv[0.25] >= cv[1.0])
    assert list(res.strengths) == sorted(res.strengths, reverse=True)  # strongest first
    assert len(res.cv_nll) == len(res.strengths) == len(res.fold_nll)
    assert all(len(f) == 5 for f in res.fold_nll) and len(res.temperature_fold_nll) == 5
    assert res.reg == res.strengths[int(np.argmin(res.cv_nll))]
    assert res.nll_after < res.nll_before and res.passes > 0 and res.method == "lbfgs"
    # the walk went on toward the better side until the held-out NLL rose (or the cap)
    nlls = list(reversed(res.cv_nll))  # weakest first
    best = int(np.argmin(nlls))
    assert all(nlls[i] > nlls[i + 1] for i in range(best))
    assert all(nlls[i] < nlls[i + 1] for i in range(best, len(nlls) - 1))


def test_guard_falls_back_to_the_temperature_map():
    """Labels independent of the logits' per-class structure, few rows per parameter: the
    map cannot beat one temperature on held-out folds, so the fit returns the temperature map
    (a warning, the flag, and the output equals softmax(z / T) up to a row constant)."""
    zf, yf, zt, _ = _split(400, 200, 10, "ts", seed=4)
    scaler = StructuredScaler(10)
    with pytest.warns(CalibrationWarning, match="not below one temperature"):
        res = scaler.fit(zf, yf)
    assert res.fallback and res.converged and res.chosen == "temperature" and res.reg is None
    assert min(res.cv_nll) >= res.temperature_cv_nll
    assert any("not below" in w for w in res.warnings)
    ts = TemperatureScaler()
    ts.fit(zf, yf)
    assert res.temperature == pytest.approx(ts.temperature, rel=1e-12)
    assert float((scaler.scale - 1).abs().max()) == 0.0
    assert float(scaler.bias.abs().max()) == 0.0 and float(scaler.coef.abs().max()) == 0.0
    p = torch.softmax(scaler(zt).double(), 1)
    torch.testing.assert_close(p, torch.softmax(ts(zt).double(), 1), atol=1e-6, rtol=0)


def test_explicit_strength_has_no_cross_validation():
    zf, yf, _, _ = _split(1500, 0, 10, "vec", seed=5)
    res = StructuredScaler(10, reg=1.0).fit(zf, yf)
    assert type(res) is NLLFit and res.converged and res.nll_after < res.nll_before
    strong = StructuredScaler(10, reg=1e6)
    strong.fit(zf, yf)
    assert float(strong.bias.abs().max()) < 1e-3  # pulled onto the temperature map


def test_deterministic_and_state_round_trip():
    zf, yf, zt, _ = _split(1500, 300, 10, "vec", seed=6)
    a, b = StructuredScaler(10, seed=3), StructuredScaler(10, seed=3)
    a.fit(zf, yf)
    b.fit(zf, yf)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    c = StructuredScaler(10)
    c.load_state_dict(torch.load(buf, weights_only=True))
    assert c.is_fitted
    assert torch.equal(c(zt), a(zt))
    assert a.scale.dtype == torch.float64 and a.to(torch.float16).scale.dtype == torch.float64
    assert a(zt.half()).dtype == torch.float16


def test_low_rank_basis_is_the_top_singular_subspace():
    g = torch.Generator().manual_seed(0)
    spectrum = torch.logspace(1, -2, 40)
    rot = torch.linalg.qr(torch.randn(40, 40, generator=g)).Q
    x = (torch.randn(500, 40, generator=g) * spectrum) @ rot.T
    q = structured_basis(x, 5, seed=0)
    assert q.shape == (40, 5)
    torch.testing.assert_close(q.T @ q, torch.eye(5, dtype=torch.float64), atol=1e-5, rtol=0)
    v = torch.linalg.svd(x.double(), full_matrices=False).Vh[:5].T
    # the same subspace: the projector of one onto the other is the identity on it
    torch.testing.assert_close(
        v.T @ q @ q.T @ v, torch.eye(5, dtype=torch.float64), atol=1e-3, rtol=0
    )
    assert torch.equal(structured_basis(x, 40), torch.eye(40, dtype=torch.float64))


def test_low_rank_and_rank_zero_fit():
    zf, yf, zt, yt = _split(3000, 3000, 30, "vec", seed=7)
    for rank in (0, 4):
        scaler = StructuredScaler(30, rank=rank)
        res = _quiet_fit(scaler, zf, yf)
        assert scaler.coef.shape == (30, rank) and not res.fallback
        assert _nll_acc(scaler(zt), yt)[0] < res.nll_before


def test_masked_logits():
    zf, yf, zt, yt = _split(2000, 500, 6, "vec", seed=8)
    zf, zt = zf.clone(), zt.clone()
    rows = torch.arange(0, 2000, 7)
    col = (yf[rows] + 1) % 6
    zf[rows, col] = float("-inf")
    zt[:5, 0] = float("-inf")
    zt[:5, 1] = 0.0
    scaler = StructuredScaler(6)
    _quiet_fit(scaler, zf, yf)
    out = scaler(zt)
    assert torch.isneginf(out[:5, 0]).all() and torch.isfinite(out[:5, 1:]).all()
    assert torch.isfinite(out[5:]).all()
    bad = zf.clone()
    bad[0, yf[0]] = float("-inf")
    with pytest.raises(ValueError, match="target class is masked"):
        StructuredScaler(6).fit(bad, yf)


def test_bad_input():
    z, y = _data(50, 4, "vec")
    s = StructuredScaler(4)
    with pytest.raises(NotFittedError):
        s(z)
    with pytest.raises(ValueError, match="^logits: expected 4 columns"):
        s.fit(z[:, :3], y)
    with pytest.raises(ValueError, match="^target"):
        s.fit(z, y.float())
    with pytest.raises(ValueError, match="^target"):
        s.fit(z, y[:10])
    with pytest.raises(ValueError, match="^target"):
        s.fit(z, y + 4)
    with pytest.raises(ValueError, match="^logits"):
        s.fit(z.masked_fill(z > 2, float("nan")), y)
    with pytest.raises(ValueError, match="^logits"):
        s.fit(z[:, 0], y)
    with pytest.raises(ValueError, match="^logits: expected at least folds"):
        s.fit(z[:3], y[:3])
    for kw, name in [
        ({"reg": "auto"}, "reg"),
        ({"reg": -1.0}, "reg"),
        ({"reg": float("inf")}, "reg"),
        ({"rank": -1}, "rank"),
        ({"folds": 1}, "folds"),
        ({"seed": 1.5}, "seed"),
        ({"grad_tol": 0.0}, "grad_tol"),
        ({"cv_rows": 4}, "cv_rows"),
        ({"cv_rows": 100.0}, "cv_rows"),
    ]:
        with pytest.raises((ValueError, TypeError), match=f"^{name}"):
            StructuredScaler(4, **kw)
    with pytest.raises((ValueError, TypeError), match="^num_classes"):
        StructuredScaler(1)
    _quiet_fit(s, z, y)
    with pytest.raises(ValueError, match="^logits: expected a floating-point tensor"):
        s(z[:, :3])
    bad = s.state_dict()
    bad["scale"] = torch.full((4,), float("nan"), dtype=torch.float64)
    with pytest.raises(ValueError, match="scale"):
        StructuredScaler(4).load_state_dict(bad)


def test_logits_without_signal_fit_a_positive_temperature():
    """Random labels: the first temperature's inverse went <= 0 on some seeds (an unbounded
    fit) and log T failed; T0 is TemperatureScaler's bounded fit."""
    for seed in (1, 14):  # two of the seeds that failed
        g = torch.Generator().manual_seed(seed)
        z = torch.randn(60, 3, generator=g)
        y = torch.randint(0, 3, (60,), generator=g)
        m = StructuredScaler(3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m.fit(z, y)
        assert math.isfinite(float(m.log_temperature)) and torch.isfinite(m(z)).all()


@pytest.mark.parametrize("masked", [False, True])
def test_blocked_passes_equal_a_float64_autograd_pass(monkeypatch, masked):
    """The passes run over blocks of rows in one reused buffer: with blocks of 7 rows (the
    last one short) the NLL and every gradient block equal a float64 autograd pass on the
    same float32 features, masked entries included."""
    from torchcal.functional import structured as S

    monkeypatch.setattr(S, "_BLOCK_ENTRIES", 7 * 6)
    g = torch.Generator().manual_seed(3)
    n, c, r = 52, 6, 3
    z = 3 * torch.randn(n, c, generator=g)
    y = torch.randint(0, c, (n,), generator=g)
    if masked:
        z[torch.rand(n, c, generator=g) < 0.2] = -math.inf
        z[torch.arange(n), y] = torch.randn(n, generator=g).abs()
    x, mask = S.structured_features(z, 1.7)
    basis = S.structured_basis(x, r, 0)
    prob = S.StructuredProblem.of(x, y, basis, mask)
    assert prob._block == 7
    p = S.StructuredParams(
        *(0.3 * torch.randn(s, generator=g, dtype=torch.float64) for s in ((), (c,), (c,), (c, r)))
    )
    f, grad = prob.nll_grad(p)
    leaves = [t.clone().requires_grad_(True) for t in p]
    a, d, b, coef = leaves
    x64 = x.double()
    out = x64 * (a + d) + b + (x64 @ basis) @ coef.T
    if mask is not None:
        out = out.masked_fill(mask, -math.inf)
    ref = F.cross_entropy(out, y)
    ref.backward()
    assert f == pytest.approx(float(ref), abs=1e-6)
    assert prob.nll(p) == pytest.approx(float(ref), abs=1e-6)
    for got, leaf in zip(grad, leaves):
        torch.testing.assert_close(got, leaf.grad, atol=1e-5, rtol=1e-5)


def test_strength_subsample_rule():
    """reg="cv" scores the strengths on at most max(2,000, 2**21 // C) rows: none of the
    sizes above is subsampled (5,000 x 100 is not); 25,000 x 1,000 is, to 2,097 seeded rows."""
    from torchcal.functional.structured import cv_row_limit, cv_subsample

    assert cv_row_limit(100, None) == 20_971 and cv_row_limit(1_000, None) == 2_097
    assert cv_row_limit(10_000, None) == 2_000 and cv_row_limit(1_000, 700) == 700
    assert cv_subsample(5_000, 100, None, 0) is None and cv_subsample(700, 1_000, 700, 0) is None
    rows = cv_subsample(25_000, 1_000, None, 3)
    assert rows is not None and len(rows) == 2_097 and len(torch.unique(rows)) == 2_097
    assert bool((rows[1:] > rows[:-1]).all()) and 0 <= int(rows[0]) and int(rows[-1]) < 25_000
    assert torch.equal(rows, cv_subsample(25_000, 1_000, None, 3))
    assert not torch.equal(rows, cv_subsample(25_000, 1_000, None, 4))


def test_strength_and_guard_come_from_the_subsample():
    """With the full-rank basis (the identity, whatever the rows) the strength path, its
    folds' NLLs and the temperature's (the guard's reference) are those of a fit on the
    subsample's rows alone; the map is then refitted on all rows."""
    from torchcal.functional.structured import cv_subsample

    zf, yf, _, _ = _split(3000, 0, 6, "vec", seed=7)
    sub = StructuredScaler(6, rank=6, cv_rows=800)
    res = _quiet_fit(sub, zf, yf)
    rows = cv_subsample(3000, 6, 800, 0)
    own = StructuredScaler(6, rank=6)
    alone = _quiet_fit(own, zf[rows], yf[rows])
    assert res.strengths == alone.strengths and res.reg == alone.reg
    assert res.cv_nll == pytest.approx(alone.cv_nll, abs=1e-9)
    assert res.temperature_cv_nll == pytest.approx(alone.temperature_cv_nll, abs=1e-9)
    # the refit used all 3000 rows: its map is the all-rows fit at that strength, not the
    # subsample's own
    assert float((sub.bias - own.bias).abs().max()) > 0.01
    full = StructuredScaler(6, rank=6, reg=res.reg)
    full.fit(zf, yf)
    p_sub, p_full, p_own = (torch.softmax(m(zf).double(), 1) for m in (sub, full, own))
    # (T0 from the subsample: the same map family up to the features' temperature)
    assert float((p_sub - p_full).abs().max()) < 0.01 < 0.05 < float((p_own - p_full).abs().max())
    # at or above the row count nothing is subsampled: the default fit exactly
    a, b = StructuredScaler(6, cv_rows=3000), StructuredScaler(6)
    a.fit(zf, yf)
    b.fit(zf, yf)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


def test_subsampled_strength_beats_one_temperature_where_a_structured_map_is_the_truth():
    zf, yf, zt, yt = _split(6000, 5000, 30, "vec", seed=9)
    ts = TemperatureScaler()
    ts.fit(zf, yf)
    scaler = StructuredScaler(30, cv_rows=1500)
    res = scaler.fit(zf, yf)
    assert not res.fallback and res.converged
    assert min(res.cv_nll) < res.temperature_cv_nll - 0.05
    assert _nll_acc(scaler(zt), yt)[0] < _nll_acc(ts(zt), yt)[0] - 0.05
