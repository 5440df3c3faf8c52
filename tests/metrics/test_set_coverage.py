"""Set coverage (issue 30): the functional summary against a row-by-row loop (Wilson interval,
numpy's median), per class and per group; the streamed metric equal to one call, bitwise,
under batching, merging and a state-dict round trip; tampered states refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchcal.functional import set_coverage, set_coverage_counts
from torchcal.functional.calibration.intervals import wilson_interval
from torchcal.metrics import SetCoverage
from torchcal.scaling import ConformalClassifier


def _sets(n: int = 3000, C: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = 2 * torch.randn(n, C, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    grp = torch.randint(0, 4, (n,), generator=g)
    cc = ConformalClassifier(alpha=0.1, method="aps", include_last=False)  # some empty sets
    cc.fit(z[:1000], y[:1000])
    return cc.predict(z[1000:]), y[1000:], grp[1000:]


def _loop(sets: torch.Tensor, y: torch.Tensor, keep: torch.Tensor) -> tuple:
    rows = [i for i in range(len(y)) if bool(keep[i])]
    hits = sum(bool(sets[i, y[i]]) for i in rows)
    sizes = [int(sets[i].sum()) for i in rows]
    lo, hi = wilson_interval(torch.tensor([float(hits)]), torch.tensor([float(len(rows))]))
    if not rows:
        return (0, math.nan, math.nan, math.nan, math.nan, math.nan)
    n = len(rows)
    return (n, hits / n, float(lo), float(hi), float(np.mean(sizes)), float(np.median(sizes)))


def _check(summary, i, want) -> None:
    got = [summary.rows, summary.coverage, summary.lower, summary.upper]
    got += [summary.mean_size, summary.median_size]
    got = [float(x.reshape(-1)[i]) if x.dim() else float(x) for x in got]
    assert got[0] == want[0]
    for a, b in zip(got[1:], want[1:]):
        assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-12, (got, want)


def test_functional_equals_a_loop_pooled_per_class_and_per_group() -> None:
    sets, y, grp = _sets()
    r = set_coverage(sets, y, grp, 5)  # group 4 is empty: NaN there
    everyone = torch.ones(len(y), dtype=torch.bool)
    _check(r.pooled, 0, _loop(sets, y, everyone))
    for c in range(sets.shape[1]):
        _check(r.per_class, c, _loop(sets, y, y == c))
    for k in range(5):
        _check(r.per_group, k, _loop(sets, y, grp == k))
    assert float(r.pooled.empty) == float((sets.sum(1) == 0).double().mean()) > 0
    assert math.isnan(float(r.per_group.coverage[4])) and int(r.per_group.rows[4]) == 0
    assert set_coverage(sets, y).per_group is None


def test_median_of_an_even_count_is_the_mean_of_the_middle_two() -> None:
    sets = torch.tensor([[True, False, False], [True, True, True], [True, True, False]] * 2)
    sets = torch.cat([sets, torch.zeros(2, 3, dtype=torch.bool)])  # sizes 1,3,2,1,3,2,0,0
    r = set_coverage(sets, torch.zeros(8, dtype=torch.long))
    assert float(r.pooled.median_size) == float(np.median([1, 3, 2, 1, 3, 2, 0, 0])) == 1.5
    assert float(r.pooled.empty) == 0.25 and float(r.pooled.coverage) == 0.75


def test_metric_streams_merges_and_reloads_exactly() -> None:
    sets, y, grp = _sets(seed=1)
    ref = set_coverage(sets, y, grp, 4, level=0.9)
    m = SetCoverage(num_classes=6, num_groups=4, level=0.9)
    for lo in range(0, len(y), 333):
        m.update(sets[lo : lo + 333], y[lo : lo + 333], grp[lo : lo + 333])
    a, b = SetCoverage(6, num_groups=4, level=0.9), SetCoverage(6, num_groups=4, level=0.9)
    a.update(sets[:700], y[:700], grp[:700])
    b.update(sets[700:], y[700:], grp[700:])
    a.merge_state(b)
    fresh = SetCoverage(6, num_groups=4, level=0.9)
    fresh.load_state_dict(m.state_dict())
    for metric in (m, a, fresh):
        got = metric.compute()
        for part in ("pooled", "per_class", "per_group"):
            for x, w in zip(getattr(got, part), getattr(ref, part)):
                assert torch.equal(x, w) or torch.equal(x.isnan(), w.isnan()), part
    with pytest.raises(ValueError, match="^other: cannot merge"):
        a.merge_state(SetCoverage(6, num_groups=4, level=0.95))


def test_tampered_states_and_bad_input_are_named() -> None:
    sets, y, _ = _sets(n=1300, seed=2)
    m = SetCoverage(num_classes=6)
    m.update(sets, y)
    state = m.state_dict()
    state["class_hits"] = state["class_sizes"].sum(1) + 1  # more covered rows than rows
    with pytest.raises(ValueError, match="^state_dict: state 'class_hits' must be at most"):
        SetCoverage(num_classes=6).load_state_dict(state)
    neg = m.state_dict()
    neg["class_sizes"] = -neg["class_sizes"]
    with pytest.raises(ValueError, match="^state_dict: state 'class_sizes'"):
        SetCoverage(num_classes=6).load_state_dict(neg)
    with pytest.raises(ValueError, match="^sets: expected"):
        m.update(sets[:, :5], y)
    with pytest.raises(ValueError, match="^sets: expected an"):
        set_coverage_counts(sets.long(), y)
    with pytest.raises(ValueError, match="^target"):
        set_coverage_counts(sets, y[:-1])
    with pytest.raises(ValueError, match="^groups"):
        m.update(sets, y, torch.zeros_like(y))
    with pytest.raises(ValueError, match="^level"):
        SetCoverage(num_classes=6, level=1.5)
    with pytest.raises(RuntimeError, match="no rows seen"), pytest.warns(UserWarning):
        SetCoverage(num_classes=6).compute()  # torchmetrics warns first
