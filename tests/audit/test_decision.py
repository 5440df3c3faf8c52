"""torchcal.functional.decision against numpy/scipy float64 references and brute force."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy.special import logit
from scipy.stats import binomtest

from torchcal.functional import binned_statistics, calibration_error_from_stats
from torchcal.functional.calibration.bootstrap import bootstrap_statistics, ece_bootstrap_from_stats
from torchcal.functional.calibration.readings import prepare_inputs
from torchcal.functional.decision import (
    LOGIT_LIMIT,
    cost_threshold_from_stats,
    drift_from_summaries,
    ece_interval_from_stats,
    probs_to_logits,
    threshold_window,
    window_gap_from_stats,
)


def _data(n: int, seed: int, power: float = 1.5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, generator=g, dtype=torch.float64)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < p**power).long()
    return p, y


def _stats(p: torch.Tensor, y: torch.Tensor, B: int = 10):
    return binned_statistics(p, y, n_bins=B, reading="binary", input="probs").pooled()


def _contains(t: float, B: int) -> None:
    """The window of ``t`` contains ``t`` exactly (as the decimal it was written as) and the
    float64 bin of a confidence equal to ``t``; it is the bin holding t and its neighbour."""
    lo, hi = threshold_window(t, B)
    a, b = round(lo * B), round(hi * B)
    exact = Fraction(repr(t))
    assert Fraction(repr(lo)) <= exact and (exact < Fraction(repr(hi)) or hi == 1.0), (t, B)
    assert a <= min(math.floor(t * B), B - 1) < b, (t, B)  # the float64 bin rule
    assert b - a == (1 if b == 1 else 2), (t, B)


@pytest.mark.parametrize("B", [5, 10, 13, 50, 100])
def test_threshold_window_contains_the_threshold(B: int) -> None:
    for t in np.linspace(0, 1, 401)[1:-1].round(6):
        _contains(float(t), B)
    assert threshold_window(0.8, 10) == (0.7, 0.9)
    assert threshold_window(1.0, 10) == (0.8, 1.0)


def test_threshold_window_float64_floor_regressions() -> None:
    """floor(0.29 * 100) is 28 in float64 (0.29 * 100 = 28.999999999999996): the old window
    [0.27, 0.29) did not contain 0.29; the same for 0.57/0.58 at 100 bins and 0.58 at 50."""
    assert threshold_window(0.29, 100) == (0.28, 0.3)
    assert threshold_window(0.57, 100) == (0.56, 0.58)
    assert threshold_window(0.58, 100) == (0.57, 0.59)
    assert threshold_window(0.58, 50) == (0.56, 0.6)
    for B in (7, 20, 100, 1000):  # a sweep of 3-decimal thresholds
        for i in range(1, 1000):
            _contains(i / 1000, B)


def test_window_gap_matches_numpy_and_scipy_wilson() -> None:
    p, y = _data(3000, 0)
    s = _stats(p, y)
    w = window_gap_from_stats(s, 0.7, 0.9)
    pn, yn = p.numpy(), y.numpy()
    m = (pn >= 0.7) & (pn < 0.9)
    assert int(w["n"]) == m.sum()
    assert float(w["confidence"]) == pytest.approx(pn[m].mean(), rel=1e-12)
    assert float(w["accuracy"]) == pytest.approx(yn[m].mean(), rel=1e-12)
    assert float(w["gap"]) == pytest.approx(pn[m].mean() - yn[m].mean(), abs=1e-12)
    ci = binomtest(int(yn[m].sum()), int(m.sum())).proportion_ci(0.95, method="wilson")
    assert w["accuracy_ci"].tolist() == pytest.approx([ci.low, ci.high], abs=1e-10)
    last = window_gap_from_stats(_stats(torch.tensor([1.0, 0.95]), torch.tensor([1, 0])), 0.8, 1.0)
    assert int(last["n"]) == 2  # 1.0 is in the last (closed) bin
    with pytest.raises(ValueError, match="^lo, hi"):
        window_gap_from_stats(s, 0.75, 0.9)


def _brute_cost(p: np.ndarray, y: np.ndarray, B: int, ce: float, cx: float):
    best = None
    for t in [k / B for k in range(B)] + [1.0]:
        auto = (p >= t) if t < 1.0 else np.zeros_like(p, dtype=bool)
        cost = ce * np.sum(auto & (y == 0)) + cx * np.sum(~auto)
        if best is None or cost <= best[1]:  # ties: the highest t (visited last)
            best = (t, cost, auto.sum(), np.sum(auto & (y == 0)))
    return best


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("ce", "cx"), [(10.0, 1.0), (3.0, 1.0), (1.0, 1.0), (1.0, 5.0)])
def test_cost_threshold_equals_brute_force(seed: int, ce: float, cx: float) -> None:
    p, y = _data(500, seed, power=1.0 + seed / 2)
    B = 10
    r = cost_threshold_from_stats(_stats(p, y, B), ce, cx)
    t, cost, n_auto, errors = _brute_cost(p.numpy(), y.numpy(), B, ce, cx)
    assert float(r["threshold"]) == t
    assert int(r["n_automated"]) == n_auto
    assert float(r["cost_per_item"]) == pytest.approx(cost / 500, rel=1e-12)
    assert float(r["naive_threshold"]) == pytest.approx(1 - cx / ce)
    if n_auto:
        assert float(r["error_rate"]) == pytest.approx(errors / n_auto)
        ci = binomtest(int(errors), int(n_auto)).proportion_ci(0.95, method="wilson")
        assert r["error_rate_ci"].tolist() == pytest.approx([ci.low, ci.high], abs=1e-10)
    else:
        assert math.isnan(float(r["error_rate"]))


def test_cost_threshold_groups_and_argument_errors() -> None:
    p, y = _data(600, 1)
    grp = torch.arange(600) % 3
    s = binned_statistics(p, y, n_bins=10, reading="binary", input="probs", groups=grp)
    r = cost_threshold_from_stats(s, 4.0, 1.0)
    for gi in range(3):
        m = (grp == gi).numpy()
        t = _brute_cost(p.numpy()[m], y.numpy()[m], 10, 4.0, 1.0)[0]
        assert float(r["threshold"][gi]) == t
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="^cost_error"):
            cost_threshold_from_stats(s, bad, 1.0)
        with pytest.raises(ValueError, match="^cost_escalation"):
            cost_threshold_from_stats(s, 1.0, bad)


def _numpy_interval(s, R: int, seed: int, level: float = 0.95):
    """The same moment-matched replicates in numpy from the same normal draws."""
    n = s.count.flatten().numpy().astype(np.float64)
    d = (s.conf - s.acc).flatten().numpy()
    v = (s.conf2 - 2 * s.conf_acc + s.acc).flatten().numpy()
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randn((R, n.size), generator=g, dtype=torch.float64).numpy()
    z2 = torch.randn((R, n.size), generator=g, dtype=torch.float64).numpy()
    safe = np.maximum(n, 1)
    nst = n + np.sqrt(n) * z1
    dst = d + d / np.sqrt(safe) * z1 + np.sqrt(np.maximum(v - d * d / safe, 0)) * z2
    ece = np.abs(dst).sum(1) / nst.sum(1)
    a = (1 - level) / 2
    return np.quantile(ece, [a, 1 - a])


def test_ece_interval_reference_determinism_and_the_poisson_bootstrap() -> None:
    p, y = _data(2000, 3, power=1.3)
    s = _stats(p, y)
    lo, hi = ece_interval_from_stats(s, replicates=500, seed=7)
    assert [float(lo), float(hi)] == pytest.approx(_numpy_interval(s, 500, 7).tolist(), rel=1e-12)
    # the moments: V_b is sum (c - y)^2 per bin, as numpy computes it from the samples
    pn, yn = p.numpy(), y.numpy()
    b = np.minimum(np.floor(pn * 10), 9).astype(int)
    v = np.bincount(b, weights=(pn - yn) ** 2, minlength=10)
    assert (s.conf2 - 2 * s.conf_acc + s.acc).flatten().numpy() == pytest.approx(v, rel=1e-10)
    again = ece_interval_from_stats(s, replicates=500, seed=7)
    assert torch.equal(lo, again[0]) and torch.equal(hi, again[1])
    assert not torch.equal(lo, ece_interval_from_stats(s, replicates=500, seed=8)[0])
    ece = calibration_error_from_stats(s, reading="binary")
    assert lo <= ece <= hi
    # agrees with the per-row Poisson bootstrap (2000 replicates each)
    prep = prepare_inputs(p, y, reading="binary", input="probs")
    w = bootstrap_statistics(prep, 10, 2000, torch.Generator().manual_seed(0))
    plo, phi = ece_bootstrap_from_stats(*w)
    mlo, mhi = ece_interval_from_stats(s, replicates=2000)
    width = float(phi - plo)
    assert abs(float(mlo - plo)) < 0.1 * width and abs(float(mhi - phi)) < 0.1 * width
    with pytest.raises(ValueError, match="^replicates"):
        ece_interval_from_stats(s, replicates=1)


def test_drift_hand_worked_and_errors() -> None:
    d = drift_from_summaries(
        {"value": 0.02, "ci": [0.01, 0.03]}, {"value": 0.08, "ci": [0.06, 0.1]}
    )
    half = 1.96 * math.sqrt((0.01 / 1.96) ** 2 + (0.02 / 1.96) ** 2)
    assert d["delta"] == pytest.approx(0.06)
    assert d["delta_ci"] == pytest.approx([0.06 - half, 0.06 + half])
    assert d["worse"] is True
    same = drift_from_summaries(
        {"value": 0.05, "ci": [0.03, 0.07]}, {"value": 0.06, "ci": [0.04, 0.08]}
    )
    assert same["worse"] is False and same["delta_ci"][0] < 0 < same["delta_ci"][1]
    better = drift_from_summaries(
        {"value": 0.2, "ci": [0.18, 0.22]}, {"value": 0.02, "ci": [0.01, 0.03]}
    )
    assert better["worse"] is False
    assert (
        drift_from_summaries({"value": None, "ci": None}, {"value": 0.1, "ci": [0, 0.2]})["delta"]
        is None
    )
    with pytest.raises(ValueError, match="^old"):
        drift_from_summaries({"value": 0.1}, {"value": 0.1, "ci": [0, 0.2]})
    with pytest.raises(ValueError, match="^new"):
        drift_from_summaries({"value": 0.1, "ci": [0, 0.2]}, {"value": 0.1, "ci": [0.3, 0.2]})


def test_probs_to_logits_matches_scipy_and_counts_the_clamped() -> None:
    p = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0], dtype=torch.float64)
    z, n = probs_to_logits(p, binary=True)
    assert n == 2
    assert z[1:4].numpy() == pytest.approx(logit(p[1:4].numpy()), rel=1e-14)
    assert z[0] == -LOGIT_LIMIT and z[4] == LOGIT_LIMIT
    assert LOGIT_LIMIT == pytest.approx(logit(1 - 2.0**-53), rel=1e-12)
    rows = torch.tensor([[0.2, 0.8, 0.0], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    zm, nm = probs_to_logits(rows, binary=False)
    assert nm == 1 and zm[0, 2] == -LOGIT_LIMIT
    assert zm[1].numpy() == pytest.approx(np.log(np.full(3, 1 / 3)))


# --- torchcal.functional.verdict: the tests behind the verdict -----------------------------

from scipy.optimize import brentq  # noqa: E402
from scipy.stats import norm  # noqa: E402

from torchcal.functional.verdict import (  # noqa: E402
    ece_test_from_stats,
    holm_adjust,
    wilson_cc_interval,
    window_gap_test,
)


def test_wilson_cc_interval_inverts_the_corrected_score_test() -> None:
    """Each bound is the q0 at which the continuity-corrected score test has p = (1-level)/2
    (found by brentq, independently of the closed form), for many (k, n)."""
    z = norm.ppf(0.95)
    for n in (1, 2, 3, 5, 17, 100, 2500):
        for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            lo, hi = (
                float(v)
                for v in wilson_cc_interval(torch.tensor([float(k)]), torch.tensor([float(n)]), 0.9)
            )
            f_lo = lambda q, k=k, n=n: (k - 0.5 - n * q) - z * math.sqrt(n * q * (1 - q))  # noqa: E731
            f_hi = lambda q, k=k, n=n: (n * q - k - 0.5) - z * math.sqrt(n * q * (1 - q))  # noqa: E731
            want_lo = 0.0 if k == 0 or f_lo(1e-15) < 0 else brentq(f_lo, 1e-15, k / n)
            want_hi = 1.0 if k == n or f_hi(1 - 1e-15) < 0 else brentq(f_hi, k / n, 1 - 1e-15)
            assert lo == pytest.approx(want_lo, abs=1e-9) and hi == pytest.approx(want_hi, abs=1e-9)
    assert math.isnan(float(wilson_cc_interval(torch.tensor([0.0]), torch.tensor([0.0]))[0]))


def test_window_gap_test_p_values_agree_with_the_interval() -> None:
    """p_pass <= alpha exactly when the gap interval lies inside (-tol, tol), p_fail <= alpha
    exactly when it lies outside; on many random windows (different n, confidences, hits)."""
    g = torch.Generator().manual_seed(3)
    reps, tol = 4000, 0.05
    n = torch.randint(0, 400, (reps,), generator=g)
    conf = 0.72 + 0.16 * torch.rand(reps, generator=g, dtype=torch.float64)
    acc = torch.clamp(conf + 0.3 * (torch.rand(reps, generator=g, dtype=torch.float64) - 0.5), 0, 1)
    hits = torch.round(acc * n).double()
    z = torch.zeros(reps, 1, 10, dtype=torch.float64)
    cnt = torch.zeros(reps, 1, 10, dtype=torch.int64)
    cnt[:, 0, 7] = n
    cs, hs = z.clone(), z.clone()
    cs[:, 0, 7], hs[:, 0, 7] = conf * n, hits
    from torchcal.functional import BinnedStats

    t = window_gap_test(BinnedStats(cnt, cs, hs, z.clone(), z.clone()), 0.7, 0.9, tol)
    lo, hi = t["gap_ci"].unbind(-1)
    ok = n > 0
    inside = (lo > -tol) & (hi < tol)
    outside = (lo > tol) | (hi < -tol)
    assert torch.equal((t["p_pass"] <= 0.05)[ok], inside[ok])
    assert torch.equal((t["p_fail"] <= 0.05)[ok], outside[ok])
    assert bool(torch.isnan(t["p_pass"][~ok]).all()) and int((~ok).sum()) > 0


def test_holm_against_brute_force() -> None:
    g = torch.Generator().manual_seed(0)
    p = torch.rand(200, 6, generator=g, dtype=torch.float64) ** 3
    p[::7, 2] = math.nan
    adj = holm_adjust(p)
    for row, a in zip(p.tolist(), adj.tolist()):
        idx = [i for i, v in enumerate(row) if not math.isnan(v)]
        m = len(idx)
        order = sorted(idx, key=lambda i: row[i])
        run = 0.0
        for r, i in enumerate(order):
            run = max(run, min(1.0, (m - r) * row[i]))
            assert a[i] == pytest.approx(run, rel=1e-12)
        assert all(math.isnan(a[i]) for i in range(6) if i not in idx)


def test_conditional_holm_against_brute_force() -> None:
    """``discard``: rows above their threshold leave the family (adjusted 1), the rest are
    Holm on ``p / tau`` counted among themselves (Zhao, Small & Su 2019); ``tau = 1`` is
    plain Holm; NaN stays NaN."""
    g = torch.Generator().manual_seed(1)
    p = torch.rand(200, 7, generator=g, dtype=torch.float64) ** 2
    p[::5, 3] = math.nan
    tau = torch.tensor([1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.5], dtype=torch.float64)
    adj = holm_adjust(p, tau)
    for row, a in zip(p.tolist(), adj.tolist()):
        kept = [i for i, v in enumerate(row) if not math.isnan(v) and v <= tau[i]]
        q = {i: row[i] / float(tau[i]) for i in kept}
        run = 0.0
        for r, i in enumerate(sorted(kept, key=lambda i: q[i])):
            run = max(run, min(1.0, (len(kept) - r) * q[i]))
            assert a[i] == pytest.approx(run, rel=1e-12)
        for i, v in enumerate(row):
            if math.isnan(v):
                assert math.isnan(a[i])
            elif i not in kept:
                assert a[i] == 1.0
    assert torch.equal(holm_adjust(p, 1.0).nan_to_num(-1), holm_adjust(p).nan_to_num(-1))
    with pytest.raises(ValueError, match="discard"):
        holm_adjust(p, 0.0)


def test_ece_test_interval_respects_0_1_for_tiny_groups() -> None:
    """The old bootstrap gave [-3.94, 5.74] for a 2-row group and [-0.93, 0.86] for 3 rows:
    the ECE lies in [0, 1], and so does its interval (low <= debiased <= high)."""
    for p, y in (([0.9, 0.1], [0, 1]), ([0.2, 0.6, 0.95], [1, 0, 0]), ([1.0], [0]), ([0.5], [1])):
        s = _stats(torch.tensor(p, dtype=torch.float64), torch.tensor(y))
        t = ece_test_from_stats(s, 0.05)
        lo, hi = t["ci"].tolist()
        assert 0 <= lo <= float(t["debiased"]) <= hi <= 1, (p, y, lo, hi)
        assert float(t["p_pass"]) > 0.05  # two or three rows never show calibration


def test_ece_test_clipped_estimate_says_so_and_agrees_with_its_interval() -> None:
    p = torch.tensor([0.25, 0.75] * 200, dtype=torch.float64)  # every bin exactly calibrated
    y = torch.tensor([1, 1, 0, 1, 0, 1, 0, 0] * 50)
    t = ece_test_from_stats(_stats(p, y), 0.05)  # T = 0: the correction falls below 0
    assert bool(t["clipped"]) and float(t["debiased"]) == 0.0 and float(t["ci"][0]) == 0.0
    p, y = _data(5000, 4, power=2.0)  # miscalibrated: clearly above 0
    t = ece_test_from_stats(_stats(p, y), 0.05)
    assert not bool(t["clipped"]) and float(t["ci"][0]) > 0.05 and float(t["p_fail"]) < 1e-6
    # p_pass <= alpha exactly when the upper bound is below the tolerance
    for tol in np.linspace(0.01, 0.3, 30):
        t = ece_test_from_stats(_stats(p, y), float(tol))
        assert bool(t["p_pass"] <= 0.05) == bool(t["ci"][1] < tol)
        assert bool(t["p_fail"] <= 0.05) == bool(t["ci"][0] > tol)
