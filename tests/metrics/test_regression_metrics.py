"""Issue 11 metrics: PITHistogram, IntervalCoverage, QuantileCalibrationError and the streaming
scores (CRPS, GaussianNLL, IntervalScore) against numpy/scipy float64 references, the
functionals, streaming in odd chunks, per-group filtering, merge checks and dtype casts."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from torchcal import GroupedResult
from torchcal.functional import (
    crps_ensemble,
    crps_normal,
    interval_coverage,
    observed_frequencies,
    pit_calibration_error,
    pit_histogram,
    pit_normal,
    quantile_calibration_error,
    validation_enabled,
)
from torchcal.metrics import (
    CRPS,
    GaussianNLL,
    IntervalCoverage,
    IntervalScore,
    PITHistogram,
    QuantileCalibrationError,
)

N, G = 3001, 3
LEVELS = (0.5, 0.8, 0.9, 0.95)
QLEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)
CHUNKS = (1, 7, 500, 1001, 1492)  # odd sizes, sum N


def _forecast(n=N, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(n, generator=g, dtype=torch.float64)
    scale = 0.5 + torch.rand(n, generator=g, dtype=torch.float64)
    # the truth is wider than the forecast (1.3 x): visible miscalibration
    y = loc + 1.3 * scale * torch.randn(n, generator=g, dtype=torch.float64)
    groups = torch.randint(0, G, (n,), generator=g)
    return loc.to(dtype), scale.to(dtype), y.to(dtype), groups


def _bounds(loc, scale, levels=LEVELS):
    z = torch.tensor([stats.norm.ppf(0.5 + c / 2) for c in levels], dtype=torch.float64)
    half = scale[:, None] * z.to(scale.dtype)
    return loc[:, None] - half, loc[:, None] + half


def _quantiles(loc, scale, levels=QLEVELS):
    z = torch.tensor(stats.norm.ppf(levels), dtype=torch.float64)
    return loc[:, None] + scale[:, None] * z.to(scale.dtype)


def _chunks(*xs):
    lo = 0
    for c in CHUNKS:
        yield tuple(None if x is None else x[lo : lo + c] for x in xs)
        lo += c


def _close(a, b, tol=1e-12):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k], tol)
    elif isinstance(a, GroupedResult):
        _close(a.pooled, b.pooled, tol)
        _close(a.per_group, b.per_group, tol)
        assert torch.equal(a.counts, b.counts)
    elif a.dtype == torch.int64:
        assert torch.equal(a, b)
    else:
        a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
        assert torch.allclose(a, b, rtol=tol, atol=tol, equal_nan=True), (a, b)


def _stream(make, args, groups=None):
    one, many = make(), make()
    one.update(*args, **({} if groups is None else {"groups": groups}))
    for part in _chunks(*args, groups):
        *a, g = part
        many.update(*a, **({} if g is None else {"groups": g}))
    return one, many


# ------------------------------------------------------------------------- PITHistogram
def _np_pit_hist(u, b):
    ids = np.minimum(np.floor(u.astype(np.float64) * b), b - 1).astype(int)
    counts = np.bincount(ids, minlength=b)
    shares = counts / counts.sum()
    return counts, shares, np.abs(shares - 1 / b).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pit_histogram_numpy_reference_stream_and_functional(dtype):
    loc, scale, y, _ = _forecast(dtype=dtype)
    u = pit_normal(loc, scale, y)
    one, many = _stream(lambda: PITHistogram(n_bins=10), (u,))
    r = one.compute()
    counts, shares, ece = _np_pit_hist(u.numpy(), 10)
    assert r["counts"].dtype == torch.int64 and r["counts"].tolist() == counts.tolist()
    np.testing.assert_allclose(r["shares"].numpy(), shares, rtol=0, atol=1e-15)
    assert abs(float(r["pit_ece"]) - ece) <= 1e-12
    assert abs(float(r["pit_ece"]) - float(pit_calibration_error(u, 10))) <= 1e-12
    assert int(r["n"]) == N
    _close(r, many.compute())
    # the too-narrow forecast gives a U shape: both end bins above 1/B
    assert r["shares"][0] > 0.1 and r["shares"][-1] > 0.1


def test_pit_histogram_bin_edges_follow_the_bin_rule():
    m = PITHistogram(n_bins=4)
    m.update(torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 0.2499999]))
    assert m.compute()["counts"].tolist() == [2, 1, 1, 2]


def test_pit_histogram_groups_equal_filtering():
    loc, scale, y, groups = _forecast()
    u = pit_normal(loc, scale, y)
    groups[groups == 2] = 0  # group 2 stays empty: NaN shares, ECE, count 0
    one, many = _stream(lambda: PITHistogram(n_bins=5, num_groups=G), (u,), groups)
    r = one.compute()
    _close(r, many.compute())
    for k in range(2):
        ref = PITHistogram(n_bins=5)
        ref.update(u[groups == k])
        _close({key: v[k] for key, v in r.per_group.items()}, ref.compute())
    assert r.counts.tolist()[2] == 0 and torch.isnan(r.per_group["pit_ece"][2])
    assert torch.equal(r.pooled["counts"], pit_histogram(u, 5)[0])


# --------------------------------------------------------------------- IntervalCoverage
def _np_intervals(lo, hi, y, levels):
    lo, hi, y = (np.asarray(t, dtype=np.float64) for t in (lo, hi, y))
    hit = (lo <= y[:, None]) & (y[:, None] <= hi)
    p = hit.mean(0)
    alpha = 1 - np.asarray(levels)
    score = (hi - lo) + 2 / alpha * (
        np.maximum(lo - y[:, None], 0) + np.maximum(y[:, None] - hi, 0)
    )
    return {
        "coverage": p,
        "stderr": np.sqrt(p * (1 - p) / len(y)),
        "width": (hi - lo).mean(0),
        "interval_score": score.mean(0),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_interval_coverage_numpy_reference_and_stream(dtype):
    loc, scale, y, _ = _forecast(dtype=dtype)
    lo, hi = _bounds(loc, scale)
    one, many = _stream(lambda: IntervalCoverage(LEVELS), (lo, hi, y))
    r = one.compute()
    _close(r, many.compute())
    ref = _np_intervals(lo.numpy(), hi.numpy(), y.numpy(), LEVELS)
    for k, v in ref.items():
        np.testing.assert_allclose(r[k].numpy(), v, rtol=1e-12 if dtype == torch.float64 else 1e-6)
    assert r["coverage"].dtype == torch.float64 and int(r["n"]) == N
    cov = interval_coverage(lo, hi, y[:, None].expand_as(lo), reduction="none").mean(0)
    _close(r["coverage"], cov)
    # forecast too narrow by 1.3: coverage below nominal by many standard errors
    assert bool((r["coverage"] < torch.tensor(LEVELS, dtype=torch.float64) - 3 * r["stderr"]).all())


def test_interval_coverage_of_the_true_distribution_is_nominal():
    g = torch.Generator().manual_seed(5)
    loc, scale = torch.randn(20_000, generator=g), 0.2 + torch.rand(20_000, generator=g)
    y = loc + scale * torch.randn(20_000, generator=g)
    m = IntervalCoverage(LEVELS)
    m.update(*_bounds(loc, scale), y)
    r = m.compute()
    nominal = torch.tensor(LEVELS, dtype=torch.float64)
    assert bool(((r["coverage"] - nominal).abs() <= 3 * r["stderr"]).all()), r["coverage"]


def test_interval_coverage_groups_equal_filtering_and_broadcast_dims():
    loc, scale, y, groups = _forecast()
    lo, hi = _bounds(loc, scale)
    one, many = _stream(lambda: IntervalCoverage(LEVELS, num_groups=G), (lo, hi, y), groups)
    r = one.compute()
    _close(r, many.compute())
    for k in range(G):
        ref = IntervalCoverage(LEVELS)
        sel = groups == k
        ref.update(lo[sel], hi[sel], y[sel])
        _close({key: v[k] for key, v in r.per_group.items()}, ref.compute())
    # a (2, M) target with (2, M, L) bounds: the same numbers as flat rows
    m = IntervalCoverage(LEVELS, num_groups=G)
    m.update(
        lo[:3000].reshape(2, 1500, 4),
        hi[:3000].reshape(2, 1500, 4),
        y[:3000].reshape(2, 1500),
        groups[:3000].reshape(2, 1500),
    )
    flat = IntervalCoverage(LEVELS, num_groups=G)
    flat.update(lo[:3000], hi[:3000], y[:3000], groups[:3000])
    _close(m.compute(), flat.compute())


def test_interval_coverage_blocks_and_chunked_float64_sums(monkeypatch):
    # small blocks and chunks (as 1M rows would use): the same numbers as the numpy float64
    # reference, with and without groups; lower > upper in a late block names its position
    import torchcal.metrics.regression as reg

    loc, scale, y, groups = _forecast(dtype=torch.float32)
    lo, hi = _bounds(loc, scale)
    whole = IntervalCoverage(LEVELS, num_groups=G)
    whole.update(lo, hi, y, groups)
    monkeypatch.setattr(reg, "_BLOCK", 400)  # 100 rows of 4 levels a block
    monkeypatch.setattr(reg, "_CHUNK", 64)
    cols = torch.arange(12.0, dtype=torch.float32).reshape(3, 4).repeat(33, 1)
    np.testing.assert_allclose(
        reg.float64_column_sums(cols)[0].numpy(), cols.double().sum(0).numpy(), rtol=0, atol=0
    )
    for num_groups in (None, G):
        m = IntervalCoverage(LEVELS, num_groups=num_groups)
        m.update(lo, hi, y, None if num_groups is None else groups)
        r = m.compute()
        ref = _np_intervals(lo.numpy(), hi.numpy(), y.numpy(), LEVELS)
        pooled = r if num_groups is None else r.pooled
        for k, v in ref.items():
            np.testing.assert_allclose(pooled[k].numpy(), v, rtol=1e-6)
        _close(pooled["coverage"], whole.compute().pooled["coverage"])
    assert torch.equal(m.hits, whole.hits) and torch.equal(m.n, whole.n)
    _close(m.compute(), whole.compute(), tol=1e-9)
    bad_hi = hi.clone()
    bad_hi[2500, 3] = lo[2500, 3] - 1.0
    with pytest.raises(ValueError, match=r"^upper: .* at position \(2500, 3\)"):
        IntervalCoverage(LEVELS).update(lo, bad_hi, y)


def test_interval_coverage_unchecked_nan_covers_nothing():
    lo, hi = torch.zeros(4, 1), torch.ones(4, 1)
    y = torch.tensor([0.5, float("nan"), 0.0, 1.0])
    m = IntervalCoverage((0.5,), validate_args=False)
    m.update(lo, hi, y)
    assert int(m.hits[0, 0]) == 3 and int(m.n[0]) == 4
    with validation_enabled(False):
        assert interval_coverage(lo[:, 0], hi[:, 0], y, reduction="none").tolist() == [1, 0, 1, 1]


# ------------------------------------------------------------- QuantileCalibrationError
def _np_qce(q, y, levels, norm):
    p_hat = (np.asarray(y, np.float64)[:, None] <= np.asarray(q, np.float64)).mean(0)
    err = p_hat - np.asarray(levels)
    return (np.abs(err).mean() if norm == "l1" else np.sqrt((err**2).mean())), p_hat


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_quantile_calibration_error_reference_stream_and_functional(norm):
    loc, scale, y, _ = _forecast(dtype=torch.float32)
    q = _quantiles(loc, scale)
    one, many = _stream(lambda: QuantileCalibrationError(QLEVELS, norm=norm), (q, y))
    err, p_hat = _np_qce(q.numpy(), y.numpy(), QLEVELS, norm)
    assert abs(float(one.compute()) - err) <= 1e-12
    assert (
        abs(float(one.compute()) - float(quantile_calibration_error(q, QLEVELS, y, norm=norm)))
        <= 1e-12
    )
    np.testing.assert_allclose(one.compute_observed().numpy(), p_hat, rtol=0, atol=1e-15)
    _close(one.compute_observed(), observed_frequencies(q, QLEVELS, y))
    _close(one.compute(), many.compute())
    _close(one.compute_observed(), many.compute_observed())


def test_quantile_calibration_error_groups_equal_filtering():
    loc, scale, y, groups = _forecast()
    q = _quantiles(loc, scale)
    one, many = _stream(lambda: QuantileCalibrationError(QLEVELS, num_groups=G), (q, y), groups)
    r, obs = one.compute(), one.compute_observed()
    _close(r, many.compute())
    _close(obs, many.compute_observed())
    for k in range(G):
        sel = groups == k
        err, p_hat = _np_qce(q[sel].numpy(), y[sel].numpy(), QLEVELS, "l1")
        assert abs(float(r.per_group[k]) - err) <= 1e-12
        np.testing.assert_allclose(obs.per_group[k].numpy(), p_hat, rtol=0, atol=1e-15)


# --------------------------------------------------------------------- streaming scores
def test_crps_closed_forms_match_peers_and_stream():
    sr = pytest.importorskip("scoringrules")
    loc, scale, y, groups = _forecast(dtype=torch.float32)
    ln, sn, yn = (t.double().numpy() for t in (loc, scale, y))
    peers = {
        "normal": sr.crps_normal(yn, ln, sn),
        "laplace": sr.crps_laplace(yn, ln, sn),
        "logistic": sr.crps_logistic(yn, ln, sn),
    }
    for fam, ref in peers.items():
        one, many = _stream(lambda fam=fam: CRPS(fam, num_groups=G), (loc, scale, y), groups)
        r = one.compute()
        _close(r, many.compute())
        assert abs(float(r.pooled) - ref.mean()) <= 1e-6  # float32 inputs
        for k in range(G):
            assert abs(float(r.per_group[k]) - ref[groups.numpy() == k].mean()) <= 1e-6
    m = CRPS("normal")
    m.update(loc.double(), scale.double(), y.double())
    assert abs(float(m.compute()) - peers["normal"].mean()) <= 1e-12
    assert (
        abs(float(m.compute()) - float(crps_normal(loc.double(), scale.double(), y.double())))
        <= 1e-12
    )


def test_crps_ensemble_matches_brute_force_and_stream():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(301, 6, generator=g, dtype=torch.float64)
    y = torch.randn(301, generator=g, dtype=torch.float64)
    xn, yn = x.numpy(), y.numpy()
    pair = np.abs(xn[:, :, None] - xn[:, None, :]).sum((1, 2))
    fair = np.abs(xn - yn[:, None]).mean(1) - pair / (2 * 6 * 5)
    nrg = np.abs(xn - yn[:, None]).mean(1) - pair / (2 * 36)
    for est, ref in (("fair", fair), ("nrg", nrg)):
        one = CRPS("ensemble", estimator=est)
        one.update(x, y)
        assert abs(float(one.compute()) - ref.mean()) <= 1e-12
    # members along dim 0, odd chunks
    m = CRPS("ensemble", ensemble_dim=0)
    for lo, hi in ((0, 1), (1, 150), (150, 301)):
        m.update(x[lo:hi].T, y[lo:hi])
    assert abs(float(m.compute()) - float(crps_ensemble(x, y))) <= 1e-12


def test_gaussian_nll_and_interval_score_references():
    loc, scale, y, groups = _forecast()
    ref = -stats.norm.logpdf(y.numpy(), loc.numpy(), scale.numpy())
    one, many = _stream(lambda: GaussianNLL(num_groups=G), (loc, scale, y), groups)
    _close(one.compute(), many.compute())
    assert abs(float(one.compute().pooled) - ref.mean()) <= 1e-12
    for k in range(G):
        assert abs(float(one.compute().per_group[k]) - ref[groups.numpy() == k].mean()) <= 1e-12
    lo, hi = _bounds(loc, scale, (0.9,))
    lo, hi = lo[:, 0], hi[:, 0]
    one, many = _stream(lambda: IntervalScore(0.1), (lo, hi, y))
    _close(one.compute(), many.compute())
    ref = _np_intervals(lo[:, None], hi[:, None], y, (0.9,))["interval_score"][0]
    assert abs(float(one.compute()) - ref) <= 1e-12
    both = IntervalCoverage((0.9,))
    both.update(lo[:, None], hi[:, None], y)
    assert abs(float(both.compute()["interval_score"]) - float(one.compute())) <= 1e-12


# ------------------------------------------------------------------ merge and dtype casts
def _every_metric(num_groups=None):
    return {
        "pit": PITHistogram(10, num_groups=num_groups),
        "cov": IntervalCoverage(LEVELS, num_groups=num_groups),
        "qce": QuantileCalibrationError(QLEVELS, num_groups=num_groups),
        "crps": CRPS("normal", num_groups=num_groups),
        "nll": GaussianNLL(num_groups=num_groups),
        "is": IntervalScore(0.1, num_groups=num_groups),
    }


def _feed(metrics, loc, scale, y, groups=None):
    kw = {} if groups is None else {"groups": groups}
    metrics["pit"].update(pit_normal(loc, scale, y), **kw)
    lo, hi = _bounds(loc, scale)
    metrics["cov"].update(lo, hi, y, **kw)
    metrics["qce"].update(_quantiles(loc, scale), y, **kw)
    metrics["crps"].update(loc, scale, y, **kw)
    metrics["nll"].update(loc, scale, y, **kw)
    metrics["is"].update(lo[:, 2], hi[:, 2], y, **kw)


@pytest.mark.parametrize(
    "a,b",
    [
        (lambda: PITHistogram(10), lambda: PITHistogram(5)),
        (lambda: PITHistogram(10), lambda: PITHistogram(10, num_groups=2)),
        (lambda: IntervalCoverage((0.5, 0.9)), lambda: IntervalCoverage((0.5, 0.8))),
        (
            lambda: QuantileCalibrationError((0.1, 0.9)),
            lambda: QuantileCalibrationError((0.1, 0.9), norm="l2"),
        ),
        (
            lambda: QuantileCalibrationError((0.1, 0.9)),
            lambda: QuantileCalibrationError((0.2, 0.9)),
        ),
        (lambda: CRPS("normal"), lambda: CRPS("laplace")),
        (lambda: CRPS("ensemble"), lambda: CRPS("ensemble", estimator="nrg")),
        (lambda: IntervalScore(0.1), lambda: IntervalScore(0.2)),
        (lambda: GaussianNLL(), lambda: CRPS()),
        (lambda: GaussianNLL(num_groups=2), lambda: GaussianNLL(num_groups=3)),
    ],
)
def test_merge_state_refuses_other_configurations(a, b):
    with pytest.raises(ValueError, match="^other"):
        a().merge_state(b())


def test_merge_state_same_configuration_equals_one_stream():
    loc, scale, y, groups = _forecast()
    one, a, b = _every_metric(G), _every_metric(G), _every_metric(G)
    _feed(one, loc, scale, y, groups)
    _feed(a, loc[:1234], scale[:1234], y[:1234], groups[:1234])
    _feed(b, loc[1234:], scale[1234:], y[1234:], groups[1234:])
    for name in one:
        a[name].merge_state(b[name])
        _close(a[name].compute(), one[name].compute())


def test_states_stay_float64_under_dtype_casts():
    loc, scale, y, _ = _forecast()
    ref = _every_metric()
    _feed(ref, loc, scale, y)
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.float()):
        ms = _every_metric()
        _feed(ms, loc, scale, y)
        for name, m in ms.items():
            cast(m)
            for state, default in m._defaults.items():
                assert getattr(m, state).dtype == default.dtype, (name, state)
            _close(m.compute(), ref[name].compute())
        # and the casted metric keeps accumulating in float64
        _feed(ms, loc.float(), scale.float(), y.float())
        assert ms["crps"].total.dtype == torch.float64


# ---------------------------------------------------------------------------- bad input
def test_bad_input_raises_naming_the_argument():
    loc, scale, y, groups = _forecast(n=20)
    lo, hi = _bounds(loc, scale)
    q = _quantiles(loc, scale)
    cases = [
        ("^n_bins", lambda: PITHistogram(0)),
        ("^levels", lambda: IntervalCoverage((0.5, 1.0))),
        ("^levels", lambda: IntervalCoverage((0.9, 0.5))),
        ("^levels", lambda: QuantileCalibrationError((0.0, 0.5))),
        ("^norm", lambda: QuantileCalibrationError((0.5,), norm="max")),
        ("^family", lambda: CRPS("gamma")),
        ("^alpha", lambda: IntervalScore(1.5)),
        ("^num_groups", lambda: PITHistogram(num_groups=0)),
        ("^pit", lambda: PITHistogram().update(torch.tensor([0.5, 1.5]))),
        ("^pit", lambda: PITHistogram().update(torch.tensor([0.5, math.nan]))),
        ("^groups", lambda: PITHistogram().update(torch.tensor([0.5]), groups=torch.tensor([0]))),
        ("^groups", lambda: PITHistogram(num_groups=2).update(torch.tensor([0.5]))),
        (
            "^groups",
            lambda: PITHistogram(num_groups=2).update(torch.tensor([0.5]), torch.tensor([2])),
        ),
        ("^groups", lambda: IntervalCoverage(LEVELS, num_groups=G).update(lo, hi, y, groups[:-1])),
        ("^lower", lambda: IntervalCoverage(LEVELS).update(lo[:, :3], hi, y)),
        ("^upper", lambda: IntervalCoverage(LEVELS).update(lo, hi[:-1], y)),
        ("^lower", lambda: IntervalCoverage(LEVELS).update(lo, hi, y[:, None])),
        ("^upper", lambda: IntervalCoverage(LEVELS).update(hi, lo, y)),
        ("^target", lambda: IntervalCoverage(LEVELS).update(lo, hi, y.clone().fill_(math.nan))),
        ("^quantiles", lambda: QuantileCalibrationError(QLEVELS).update(q.flip(-1), y)),
        ("^quantiles", lambda: QuantileCalibrationError(QLEVELS).update(q[:, :3], y)),
        ("^target", lambda: QuantileCalibrationError(QLEVELS).update(q, y[:, None])),
        ("^scale", lambda: CRPS().update(loc, -scale, y)),
        ("^scale", lambda: GaussianNLL().update(loc, scale * 0, y)),
        ("^target", lambda: GaussianNLL().update(loc, scale, y[:, None])),
        ("^upper", lambda: IntervalScore(0.1).update(hi[:, 0], lo[:, 0], y)),
    ]
    for pattern, fn in cases:
        with pytest.raises(ValueError, match=pattern):
            fn()
    with pytest.raises(TypeError, match="CRPS"):
        CRPS("ensemble").update(loc, scale, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torchmetrics: compute before update
        with pytest.raises(RuntimeError, match="no samples"):
            IntervalCoverage().compute()
