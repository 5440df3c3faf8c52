"""The segments' FAIL test (:func:`~torchcal.functional.verdict.mean_gap_test`) against its
formula computed row by row, and its weighted readings (docs/design.md section 6g.1)."""

from __future__ import annotations

import math

import pytest
import torch

from torchcal.functional import BinnedStats, binned_statistics
from torchcal.functional.calibration.binning import bin_ids
from torchcal.functional.calibration.readings import prepare_inputs
from torchcal.functional.calibration.weights import accumulate_weighted
from torchcal.functional.verdict import mean_gap_test

B, TOL = 10, 0.05


def rows(n: int, shift: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = 0.05 + 0.9 * torch.rand(n, generator=g, dtype=torch.float64)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < (p - shift).clamp(0, 1)).long()
    return p, y


def brute(p: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """``gap`` and ``p_fail`` from the rows, bin by bin in Python."""
    b = torch.clamp((p * B).floor().long(), max=B - 1)  # the bin rule for these p (none on an edge)
    n, d, v_over, v_under = len(p), 0.0, 0.0, 0.0
    for k in range(B):
        m = b == k
        nb = int(m.sum())
        if nb == 0:
            continue
        a, c = float(y[m].double().mean()), float(p[m].mean())
        d += float((p[m] - y[m].double()).sum())
        for side, q0 in ((0, c - TOL), (1, c + TOL)):
            q0 = min(max(q0, 0.0), 1.0)
            v = nb * max(a * (1 - a), q0 * (1 - q0))
            v_over, v_under = (v_over + v, v_under) if side == 0 else (v_over, v_under + v)
    phi = torch.distributions.Normal(0.0, 1.0)

    def tail(x: float, v: float) -> float:
        return float(1 - phi.cdf(torch.tensor(x / math.sqrt(v), dtype=torch.float64)))

    p_fail = min(tail(d - n * TOL - 0.5, v_over), tail(-d - n * TOL - 0.5, v_under))
    return d / n, p_fail


@pytest.mark.parametrize(("shift", "seed"), [(0.0, 0), (0.12, 1), (-0.12, 2)])
def test_equals_the_formula_row_by_row(shift, seed):
    p, y = rows(1500, shift, seed)
    s = binned_statistics(p, y, n_bins=B, reading="binary", input="probs").pooled()
    t = mean_gap_test(s, TOL)
    gap, p_fail = brute(p, y)
    assert float(t["gap"]) == pytest.approx(gap, abs=1e-12)
    assert float(t["p_fail"]) == pytest.approx(p_fail, rel=1e-6, abs=1e-12)
    assert (float(t["p_fail"]) < 1e-3) == (abs(shift) > 0.05)  # the planted gaps are found


def test_frequency_weights_are_repeated_rows_and_importance_weights_scale_free():
    p, y = rows(800, 0.07, 3)
    reps = torch.randint(1, 4, (800,), generator=torch.Generator().manual_seed(4))
    prep = prepare_inputs(p, y, reading="binary", input="probs")
    sw = accumulate_weighted(prep, B, reps.double()).pooled()
    rp, ry = p.repeat_interleave(reps), y.repeat_interleave(reps)
    sr = binned_statistics(rp, ry, n_bins=B, reading="binary", input="probs").pooled()
    tw, tr = mean_gap_test(sw, TOL, weights="frequency"), mean_gap_test(sr, TOL)
    for k in ("gap", "p_fail", "gap_ci"):
        assert torch.allclose(tw[k], tr[k], rtol=1e-9, atol=1e-12)
    s7 = accumulate_weighted(prep, B, 7.0 * reps.double()).pooled()
    t1, t7 = mean_gap_test(sw, TOL), mean_gap_test(s7, TOL)
    for k in ("gap", "p_fail", "gap_ci"):
        assert torch.allclose(t1[k], t7[k], rtol=1e-9, atol=1e-12)
    # importance weights count Kish's n_eff, fewer rows than the repetitions: a larger p
    assert float(t1["p_fail"]) > float(tw["p_fail"])


def test_empty_and_bad_tolerance():
    s = BinnedStats.zeros(1, 1, B)
    assert math.isnan(float(mean_gap_test(s, TOL)["p_fail"]))
    with pytest.raises(ValueError, match="tolerance"):
        mean_gap_test(s, 0.0)


@pytest.mark.parametrize(("lo", "hi", "sign"), [(0.85, 0.95, 1), (0.15, 0.85, -1), (0.06, 0.2, 1)])
def test_size_at_the_tolerance_in_small_skewed_segments(lo, hi, sign):
    """200 rows whose true gap is exactly the tolerance: FAIL at most alpha (measured 0.025-0.040
    on 100,000 replicates) and at most alpha / 60, Holm's first step over the audit's family
    (measured 0.00000-0.00049 against 0.00083)."""
    R, n = 20_000, 200
    g = torch.Generator().manual_seed(7)
    p = lo + (hi - lo) * torch.rand(R, n, generator=g, dtype=torch.float64)
    y = (torch.rand(R, n, generator=g, dtype=torch.float64) < p - sign * TOL).double()
    idx = (torch.arange(R)[:, None] * B + bin_ids(p.reshape(-1), B).view(R, n)).reshape(-1)

    def s(w: torch.Tensor | None) -> torch.Tensor:
        return torch.bincount(idx, weights=w, minlength=R * B).view(R, 1, B)

    st = BinnedStats(s(None), s(p.reshape(-1)), s(y.reshape(-1)), s((p * p).reshape(-1)),
                     s((p * y).reshape(-1)))  # fmt: skip
    pf = mean_gap_test(st, TOL)["p_fail"]
    assert float((pf <= 0.05).double().mean()) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / R)
    assert int((pf <= 0.05 / 60).sum()) <= 30  # binomial(20,000, 0.00083): mean 17, sd 4
