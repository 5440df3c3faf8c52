"""IntervalCoverage(family=family): central intervals of a location-scale forecast, scored in
one pass (functional.coverage.central_interval_sums), against the bounds path and scipy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from torchcal.functional import central_interval_factor
from torchcal.functional.coverage import central_interval_sums
from torchcal.metrics import IntervalCoverage

LEVELS = (0.5, 0.8, 0.9, 0.95)
SCIPY = {"normal": stats.norm, "laplace": stats.laplace, "logistic": stats.logistic}


def _data(n: int = 3000, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(n, generator=g, dtype=dtype)
    scale = 0.2 + torch.rand(n, generator=g, dtype=dtype)
    y = loc + 1.3 * scale * torch.randn(n, generator=g, dtype=dtype)
    groups = torch.randint(0, 3, (n,), generator=g)
    return loc, scale, y, groups


def _clear_of_the_bounds(family, loc, scale, y, rel=1e-9):
    """No target within ``rel`` of an interval end: there, |y - loc| <= k s and
    lo <= y <= hi (rounded differently) could disagree; elsewhere floating point guarantees the
    same hits. The tests below assert this precondition of their exact hit comparisons."""
    k = central_interval_factor(family, LEVELS).to(loc.dtype)
    d = ((y - loc).abs()[:, None] - k * scale[:, None]).abs()
    return bool((d > rel * (loc.abs() + y.abs())[:, None] + rel * k * scale[:, None]).all())


def _numpy_reference(family, loc, scale, y, groups, G):
    """Brute force per (group, level) in float64 numpy, intervals from scipy's ``interval``."""
    loc, scale, y = (t.double().numpy() for t in (loc, scale, y))
    groups = groups.numpy()
    out = {k: np.zeros((G, len(LEVELS))) for k in ("coverage", "width", "interval_score")}
    for j, c in enumerate(LEVELS):
        lo, hi = SCIPY[family].interval(c, loc=loc, scale=scale)
        cov = (lo <= y) & (y <= hi)
        width = hi - lo
        score = width + 2 / (1 - c) * (np.maximum(lo - y, 0) + np.maximum(y - hi, 0))
        for g in range(G):
            m = groups == g
            out["coverage"][g, j] = cov[m].mean()
            out["width"][g, j] = width[m].mean()
            out["interval_score"][g, j] = score[m].mean()
    return out


@pytest.mark.parametrize("family", ["normal", "laplace", "logistic"])
def test_location_scale_path_matches_scipy_intervals_per_group(family):
    loc, scale, y, groups = _data()
    assert _clear_of_the_bounds(family, loc, scale, y)
    m = IntervalCoverage(LEVELS, family=family, num_groups=3)
    m.update(loc, scale, y, groups)
    res = m.compute()
    ref = _numpy_reference(family, loc, scale, y, groups, 3)
    for key in ("coverage", "width", "interval_score"):
        np.testing.assert_allclose(res.per_group[key].numpy(), ref[key], rtol=1e-12, atol=1e-13)
    pooled = _numpy_reference(family, loc, scale, y, torch.zeros_like(groups), 1)
    np.testing.assert_allclose(res.pooled["width"].numpy(), pooled["width"][0], rtol=1e-12)
    np.testing.assert_allclose(
        res.pooled["interval_score"].numpy(), pooled["interval_score"][0], rtol=1e-12
    )


@pytest.mark.parametrize("family", ["normal", "laplace", "logistic"])
def test_location_scale_path_equals_the_bounds_path(family):
    """Same hits, width and interval score as ``family="bounds"`` given float64 bounds built
    from the same forecast (the only difference is summation order)."""
    loc, scale, y, _ = _data(seed=1)
    assert _clear_of_the_bounds(family, loc, scale, y)
    k = central_interval_factor(family, LEVELS)
    lower, upper = loc[:, None] - k * scale[:, None], loc[:, None] + k * scale[:, None]
    fast, slow = IntervalCoverage(LEVELS, family=family), IntervalCoverage(LEVELS)
    fast.update(loc, scale, y)
    slow.update(lower, upper, y)
    a, b = fast.compute(), slow.compute()
    assert torch.equal(a["coverage"], b["coverage"]) and torch.equal(a["n"], b["n"])
    for key in ("width", "interval_score"):
        torch.testing.assert_close(a[key], b[key], rtol=1e-12, atol=0)


def test_streaming_in_odd_chunks_equals_one_call_and_broadcast_forecasts():
    loc, scale, y, groups = _data(seed=2, dtype=torch.float32)
    one = IntervalCoverage(LEVELS, family="normal", num_groups=3)
    one.update(loc, scale, y, groups)
    many = IntervalCoverage(LEVELS, family="normal", num_groups=3)
    for part in torch.split(torch.arange(y.numel()), 457):
        many.update(loc[part], scale[part], y[part], groups[part])
    a, b = one.compute(), many.compute()
    for key in ("coverage", "width", "interval_score"):
        torch.testing.assert_close(a.per_group[key], b.per_group[key], rtol=1e-12, atol=1e-15)
    # a scalar scale broadcasts to the target (the forecast may broadcast, the target never)
    m = IntervalCoverage((0.9,), family="laplace")
    m.update(torch.zeros(4), torch.tensor(2.0), torch.tensor([0.0, 1.0, -5.0, 7.0]))
    k = float(central_interval_factor("laplace", [0.9])[0])
    assert m.compute()["width"].item() == pytest.approx(4 * k, rel=1e-15)
    assert m.compute()["coverage"].item() == 0.5


@pytest.mark.parametrize("grouped", [True, False])
def test_many_blocks_and_a_last_block_of_one_match_the_reference(grouped, monkeypatch):
    """Blocks of 7 values over 7 * 60 + 1 values (the reused buffers, a last block of one):
    the same numbers as the numpy reference, grouped and pooled."""
    import torchcal.functional.coverage as C

    monkeypatch.setattr(C, "COVERAGE_BLOCK", 7)
    loc, scale, y, groups = _data(n=7 * 60 + 1, seed=5)
    y[-1] = loc[-1] + 50.0 * scale[-1]  # the last value misses every level
    if not grouped:
        groups = torch.zeros_like(groups)
    m = IntervalCoverage(LEVELS, family="logistic", num_groups=3 if grouped else None)
    m.update(loc, scale, y, groups if grouped else None)
    res = m.compute()
    ref = _numpy_reference("logistic", loc, scale, y, groups, 3 if grouped else 1)
    got = res.per_group if grouped else {k: v[None] for k, v in res.items()}
    for key in ("coverage", "width", "interval_score"):
        np.testing.assert_allclose(got[key].numpy(), ref[key], rtol=1e-12, atol=1e-13)


def test_hand_worked_sums_and_a_target_on_the_bound_is_covered():
    k = torch.tensor([1.0, 2.0], dtype=torch.float64)
    y = torch.tensor([0.5, 1.5, 3.0, -2.0])  # -2.0 sits on the lower bound of level 2
    misses, width, penalty, rows = central_interval_sums(torch.zeros(4), torch.ones(4), y, k)
    assert misses.tolist() == [[3, 1]] and rows.tolist() == [4]
    assert width.tolist() == [[8.0, 16.0]]
    assert penalty.tolist() == [[0.5 + 2.0 + 1.0, 1.0]]
    one, just = (
        torch.ones(1, dtype=torch.float64),
        torch.tensor([2.0 + 2.0**-40], dtype=torch.float64),
    )
    assert central_interval_sums(0 * one, one, just, k)[0].tolist() == [[1, 1]]  # no tolerance


def test_bad_input_names_the_argument_and_configs_do_not_merge():
    m = IntervalCoverage(LEVELS, family="normal")
    with pytest.raises(ValueError, match="^scale"):
        m.update(torch.zeros(3), torch.tensor([1.0, 0.0, 1.0]), torch.zeros(3))
    with pytest.raises(ValueError, match="^target"):
        m.update(torch.zeros(3), torch.ones(3), torch.tensor([0.0, float("nan"), 1.0]))
    with pytest.raises(ValueError, match="^target"):
        m.update(torch.zeros(3, 2), torch.ones(3, 2), torch.zeros(3))  # target never broadcasts
    with pytest.raises(ValueError, match="^family"):
        IntervalCoverage(LEVELS, family="gamma")
    other = IntervalCoverage(LEVELS)
    other.update(-torch.ones(2, 4), torch.ones(2, 4), torch.zeros(2))
    with pytest.raises(ValueError, match="^other"):
        m.merge_state(other)


def test_unchecked_nan_covers_nothing_as_in_the_bounds_path():
    """validate_args=False: a NaN target is a miss at every level (not a hit), as with bounds."""
    y = torch.tensor([0.0, float("nan"), 1.0], dtype=torch.float64)
    k = central_interval_factor("normal", (0.5, 0.9))
    fast = IntervalCoverage((0.5, 0.9), family="normal", validate_args=False)
    fast.update(torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64), y)
    slow = IntervalCoverage((0.5, 0.9), validate_args=False)
    slow.update(-k.expand(3, 2), k.expand(3, 2), y)
    assert fast.compute()["coverage"].tolist() == slow.compute()["coverage"].tolist()
    assert fast.compute()["coverage"].tolist() == [1 / 3, 2 / 3]


@pytest.mark.parametrize(
    ("name", "bad"),
    [("loc", float("nan")), ("loc", float("inf")), ("target", -float("inf")), ("scale", 0.0)],
)
def test_non_finite_forecast_or_target_raises_before_the_state_moves(name, bad):
    """loc/target finiteness is read from the pass's own sums; the error still names the
    argument and nothing is added to the state."""
    m = IntervalCoverage(LEVELS, family="normal", num_groups=2)
    good = {"loc": torch.zeros(6), "scale": torch.ones(6), "target": torch.linspace(-2, 2, 6)}
    m.update(good["loc"], good["scale"], good["target"], torch.tensor([0, 1, 0, 1, 0, 1]))
    before = [s.clone() for s in (m.hits, m.width_sum, m.score_sum, m.n)]
    args = {k: v.clone() for k, v in good.items()}
    args[name][4] = bad
    with pytest.raises(ValueError, match=f"^{name}"):
        m.update(args["loc"], args["scale"], args["target"], torch.tensor([0, 1, 0, 1, 0, 1]))
    after = [m.hits, m.width_sum, m.score_sum, m.n]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
