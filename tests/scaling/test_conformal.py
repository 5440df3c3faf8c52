"""Conformal intervals: the finite-sample rank, coverage over 1,000 splits, Mondrian, CQR."""

import io
import math
from fractions import Fraction

import pytest
import torch

from torchcal.scaling import (
    CalibrationWarning,
    ConformalQuantileRegression,
    NotFittedError,
    SplitConformal,
    conformal_quantile,
    conformal_rank,
)

SPLITS = 1000


# ----------------------------------------------------------------------------- the rank
def test_rank_is_exact_ceil_in_integers():
    for alpha in ("0.1", "0.05", "0.2", "0.3", "0.7", "0.01", "0.125"):
        a = Fraction(alpha)
        n = torch.arange(0, 2001)
        want = [math.ceil((m + 1) * (1 - a)) for m in range(2001)]  # exact rational ceil
        assert conformal_rank(n, float(alpha)).tolist() == want, alpha
    # the floating-point trap: (9 + 1) * (1 - 0.7) = 3.0000000000000004 in float64
    assert math.ceil(10 * (1 - 0.7)) == 4 and int(conformal_rank(9, 0.7)) == 3


def test_hand_worked_small_case():
    # scores 1..9 in shuffled order; alpha = 0.2: k = ceil(10 * 0.8) = 8 -> q = 8 (the k/n =
    # 8/9 empirical quantile; the (1 - alpha) = 0.8 quantile would be 7.4 or 8 by method, and
    # one order statistic too many gives 9)
    s = torch.tensor([3.0, 1.0, 2.0, 5.0, 4.0, 9.0, 7.0, 8.0, 6.0], dtype=torch.float64)
    assert conformal_quantile(s, 0.2)[0].tolist() == [8.0]
    assert conformal_quantile(s, 0.1)[0].tolist() == [9.0]  # k = 9 = n
    q, n, k = conformal_quantile(s, 0.05)  # k = ceil(9.5) = 10 > n
    assert q.tolist() == [math.inf] and k.tolist() == [10]
    cp = SplitConformal(alpha=0.05)
    with pytest.warns(CalibrationWarning, match="^alpha"):
        fit = cp.fit(torch.zeros(9, dtype=torch.float64), s)
    assert fit.quantiles == (math.inf,)
    lo, hi = cp.predict(torch.zeros(2))
    assert bool(torch.isneginf(lo).all() and torch.isposinf(hi).all())
    # groups: each group its own k-th smallest (one sort, no loop)
    g = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1, 0])
    # group 0: 2, 3, 4, 6, 7 (n = 5, k = ceil(4.5) = 5); group 1: 1, 5, 8, 9 (n = 4,
    # k = ceil(3.75) = 4)
    q, n, k = conformal_quantile(s, 0.25, g)
    assert q.tolist() == [7.0, 9.0] and n.tolist() == [5, 4] and k.tolist() == [5, 4]


# ----------------------------------------------------------------------------- coverage
def pool(n: int, seed: int):
    """Heteroscedastic data and a mediocre point / scale / quantile model."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, generator=g, dtype=torch.float64)
    y = 2 * x + (0.1 + 0.5 * x) * torch.randn(n, generator=g, dtype=torch.float64)
    pred = 1.9 * x + 0.05
    scale = 0.2 + 0.3 * x
    return x, y, pred, scale


def split_groups(n_total: int, n_cal: int, seed: int):
    """``SPLITS`` random permutations: (calibration index, test index) per split, flattened,
    with the split id as the group (one Mondrian fit = 1,000 independent split fits)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.rand(SPLITS, n_total, generator=g).argsort(1)
    ids = torch.arange(SPLITS)[:, None]
    cal, test = perm[:, :n_cal], perm[:, n_cal:]
    return cal.reshape(-1), ids.expand_as(cal).reshape(-1), test.reshape(-1), ids.expand_as(test)


# n = 104, alpha = 0.1: k = ceil(94.5) = 95 and the expected coverage 95/105 = 0.9048 sits
# mid-way in [0.9, 0.9095]: k = 94 (0.8952) or k = 96 (0.9143) would fail the test
N_CAL, ALPHA = 104, 0.1


def bounds_ok(coverage: float, n: int, alpha: float) -> bool:
    return 1 - alpha <= coverage <= 1 - alpha + 1 / (n + 1)


@pytest.mark.parametrize("score", ["absolute", "normalized"])
def test_split_coverage_over_1000_random_splits(score):
    _, y, pred, scale = pool(1000, 0)
    cal, cal_g, test, test_g = split_groups(1000, N_CAL, 1)
    cp = SplitConformal(ALPHA, score=score)
    s = (lambda idx: scale[idx]) if score == "normalized" else (lambda idx: None)
    fit = cp.fit(pred[cal], y[cal], s(cal), groups=cal_g, num_groups=SPLITS)
    assert set(fit.ranks) == {95} and set(fit.counts) == {N_CAL}
    st = None if score == "absolute" else scale[test].reshape(test_g.shape)
    lo, hi = cp.predict(pred[test].reshape(test_g.shape), st, groups=test_g)
    yt = y[test].reshape(test_g.shape)
    covered = ((lo <= yt) & (yt <= hi)).double()
    assert bounds_ok(float(covered.mean()), N_CAL, ALPHA), float(covered.mean())
    # the same as 1,000 separate fits (checked on a few)
    for i in (0, 500, 999):
        one = SplitConformal(ALPHA, score=score).fit(
            pred[cal[cal_g == i]], y[cal[cal_g == i]], s(cal[cal_g == i])
        )
        assert one.quantiles[0] == fit.quantiles[i]


def test_cqr_coverage_over_1000_random_splits():
    x, y, _, _ = pool(1000, 2)
    # too-narrow quantile predictions (the 25 % / 75 % quantiles of the truth posing as 5 / 95 %)
    sd = 0.1 + 0.5 * x
    lower, upper = 2 * x - 0.674 * sd, 2 * x + 0.674 * sd
    cal, cal_g, test, test_g = split_groups(1000, N_CAL, 3)
    cqr = ConformalQuantileRegression(ALPHA)
    cqr.fit(lower[cal], upper[cal], y[cal], groups=cal_g, num_groups=SPLITS)
    shape = test_g.shape
    lo, hi = cqr.predict(lower[test].reshape(shape), upper[test].reshape(shape), groups=test_g)
    yt = y[test].reshape(shape)
    raw = float(((lower[test] <= y[test]) & (y[test] <= upper[test])).double().mean())
    cov = float(((lo <= yt) & (yt <= hi)).double().mean())
    assert raw < 0.6 and bounds_ok(cov, N_CAL, ALPHA), (raw, cov)


def test_mondrian_per_group_coverage():
    # two groups with different noise, calibrated per group: each group's coverage over 1,000
    # fresh calibration/test draws in [1 - alpha, 1 - alpha + 1 / (n_g + 1)], with its n_g;
    # a pooled (marginal) calibration under-covers the noisy group
    g = torch.Generator().manual_seed(4)
    sizes, sd, m = (104, 54), (0.2, 2.0), 200
    cal_y, cal_g, test_y, test_g, tg = [], [], [], [], []
    for grp, (n_g, s_g) in enumerate(zip(sizes, sd)):
        cal_y.append(s_g * torch.randn(SPLITS, n_g, generator=g, dtype=torch.float64))
        cal_g.append(torch.arange(SPLITS)[:, None].expand(SPLITS, n_g) * 2 + grp)
        test_y.append(s_g * torch.randn(SPLITS, m, generator=g, dtype=torch.float64))
        test_g.append(torch.arange(SPLITS)[:, None].expand(SPLITS, m) * 2 + grp)
        tg.append(torch.full((SPLITS, m), grp))
    cy, cg = torch.cat(cal_y, 1).reshape(-1), torch.cat(cal_g, 1).reshape(-1)
    ty, tgr, grp = torch.cat(test_y, 1), torch.cat(test_g, 1), torch.cat(tg, 1)
    cp = SplitConformal(ALPHA)
    cp.fit(torch.zeros_like(cy), cy, groups=cg, num_groups=2 * SPLITS)
    lo, hi = cp.predict(torch.zeros_like(ty), groups=tgr)
    covered = ((lo <= ty) & (ty <= hi)).double()
    for k, n_g in enumerate(sizes):
        assert bounds_ok(float(covered[grp == k].mean()), n_g, ALPHA), (k, n_g)
    pooled = SplitConformal(ALPHA)
    pooled.fit(torch.zeros_like(cy), cy, groups=cg // 2, num_groups=SPLITS)  # per split only
    lo, hi = pooled.predict(torch.zeros_like(ty), groups=tgr // 2)
    marg = ((lo <= ty) & (ty <= hi)).double()
    assert float(marg[grp == 1].mean()) < 0.85 and float(marg[grp == 0].mean()) > 0.99


# ----------------------------------------------------------------------------- details
def test_outward_rounding_and_crossing_band():
    pred = torch.tensor([0.1, 1e7], dtype=torch.float32)
    cp = SplitConformal(0.5)
    cp.fit(torch.zeros(3, dtype=torch.float64), torch.tensor([0.3, 0.1, 0.2], dtype=torch.float64))
    lo, hi = cp.predict(pred)
    exact = pred.double()
    assert lo.dtype == torch.float32
    assert bool((lo.double() <= exact - 0.2).all() and (hi.double() >= exact + 0.2).all())
    cqr = ConformalQuantileRegression(0.5)
    cqr.fit(-torch.ones(3), torch.ones(3), torch.tensor([0.0, 0.5, 0.1]))  # q = -0.9
    lo, hi = cqr.predict(torch.tensor([-1.0, -0.5]), torch.tensor([1.0, 1.0]))
    assert lo.tolist() == pytest.approx([-0.1, 0.25]) and hi.tolist() == pytest.approx([0.1, 0.25])


def test_state_round_trip_and_validation():
    cp = SplitConformal(0.2, score="normalized")
    cp.fit(torch.zeros(20), torch.randn(20), torch.ones(20), groups=torch.arange(20) % 2)
    buf = io.BytesIO()
    torch.save(cp.state_dict(), buf)
    buf.seek(0)
    other = SplitConformal(0.1, score="normalized")
    other.load_state_dict(torch.load(buf, weights_only=True))
    assert float(other.alpha) == 0.2 and torch.equal(other.score_quantiles, cp.score_quantiles)
    other.to(torch.float16)
    assert other.score_quantiles.dtype == torch.float64
    bad = dict(cp.state_dict())
    bad["score_quantiles"] = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="^score_quantiles"):
        SplitConformal().load_state_dict(bad)
    bad["score_quantiles"], bad["alpha"] = cp.score_quantiles, torch.tensor(1.5)
    with pytest.raises(ValueError, match="^alpha"):
        SplitConformal().load_state_dict(bad)
    with pytest.raises(NotFittedError):
        SplitConformal().predict(torch.zeros(2))
    cqr_state = {
        "alpha": torch.tensor(0.1),
        "score_quantiles": torch.tensor([-0.5]),
        "counts": torch.tensor([10]),
        "fitted": torch.tensor(True),
    }
    ConformalQuantileRegression().load_state_dict(cqr_state)  # negative q is fine for CQR


def test_bad_input_names_the_argument():
    y, p = torch.randn(10), torch.zeros(10)
    cp, nz = SplitConformal(), SplitConformal(score="normalized")
    cqr = ConformalQuantileRegression()
    cases = [
        ("^alpha", lambda: SplitConformal(0.0)),
        ("^alpha", lambda: ConformalQuantileRegression(1.0)),
        ("^score", lambda: SplitConformal(score="signed")),
        ("^scale", lambda: cp.fit(p, y, torch.ones(10))),
        ("^scale", lambda: nz.fit(p, y)),
        ("^scale", lambda: nz.fit(p, y, torch.zeros(10))),
        ("^target", lambda: cp.fit(p, y[:, None])),
        ("^target", lambda: cp.fit(p, torch.full_like(y, float("nan")))),
        ("^pred", lambda: cp.fit(torch.full_like(p, float("inf")), y)),
        ("^groups", lambda: cp.fit(p, y, groups=torch.arange(10) - 1)),
        ("^groups", lambda: cp.fit(p, y, groups=torch.arange(10), num_groups=5)),
        ("^num_groups", lambda: cp.fit(p, y, num_groups=2)),
        ("^upper", lambda: cqr.fit(p, p[:5], y)),
    ]
    for pattern, call in cases:
        with pytest.raises(ValueError, match=pattern):
            call()
    with pytest.warns(CalibrationWarning, match="^alpha"):  # n = 5 per group: k = 6 > 5
        cp.fit(p, y, groups=torch.arange(10) % 2)
    with pytest.raises(ValueError, match="^groups"):
        cp.predict(p)  # calibrated per group: the ids are needed
    with pytest.raises(ValueError, match="^groups"):
        cp.predict(p, groups=torch.full((10,), 2))
