"""The fine-histogram scores (torchcal/functional/histogram_scores.py, docs/design.md 6g): the
global ECCE from fine-bin sums against the exact ECCE, its stated bound, the AUROC with
DeLong's interval against the exact one and scikit-learn, and the rows-to-decide hint."""

from __future__ import annotations

import math

import pytest
import torch

from torchcal.functional.histogram_scores import (
    FINE_BINS,
    FineHistogram,
    auroc_from_histogram,
    ecce_from_histogram,
    fine_histogram,
    rows_to_decide,
)
from torchcal.functional.multicalibration import ecce
from torchcal.functional.resolution import auroc_interval


@pytest.mark.parametrize("shift", [0.0, 0.02])
def test_ecce_from_the_fine_histogram_is_within_1e_4_at_a_million_rows(shift):
    g = torch.Generator().manual_seed(11)
    n = 1_000_000
    c = torch.rand(3, n, generator=g, dtype=torch.float64).mean(0)  # a smooth density (<= 2.25)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < (c + shift).clamp(0, 1)).long()
    exact, sigma = ecce(c, y)
    e, s, bound = ecce_from_histogram(fine_histogram(c, y))
    gap = float(exact - e[0])
    assert -1e-12 <= gap <= 1e-4, gap  # measured: ~1e-6 (and -6e-16: the sums' order)
    assert gap <= float(bound[0])  # the stated bound (largest bin's mass share, ~5e-4 here)
    assert float(bound[0]) < 1e-3
    assert math.isclose(float(s[0]), float(sigma), rel_tol=1e-12)
    if shift:  # a real gap is seen (and far above the histogram's error)
        assert float(e[0]) > 0.015


def test_the_bound_holds_where_the_bins_hold_many_tied_rows():
    """A few hundred rows in a handful of fine bins (the worst case for the histogram): the
    exact ECCE lies in [hist, hist + bound] on every seed; a walk up and back inside one bin
    reaches a quarter of the bound (it is not vacuous)."""
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        base = torch.randint(0, 6, (300,), generator=g).double() * 0.1 + 0.2
        c = base + torch.rand(300, generator=g, dtype=torch.float64) / FINE_BINS * 0.999
        y = (torch.rand(300, generator=g, dtype=torch.float64) < c).long()
        exact, _ = ecce(c, y)
        e, _, bound = ecce_from_histogram(fine_histogram(c, y))
        assert float(e[0]) - 1e-15 <= float(exact) <= float(e[0] + bound[0]) + 1e-15
    c = 0.5 + torch.arange(1000, dtype=torch.float64) * 1e-8  # one fine bin
    y = (torch.arange(1000) < 500).long()  # right answers first: the walk rises, then falls
    exact, _ = ecce(c, y)
    e, _, bound = ecce_from_histogram(fine_histogram(c, y))
    assert float(bound[0]) == 1.0 and float(e[0]) < 1e-4
    assert float(exact) > 0.249  # 0.25: a quarter of the bound


def test_weighted_ecce_and_sigma_from_the_histogram():
    """Weights: the exact ECCE's walk with weights; importance sigma is mcgrad's sqrt(sum w^2
    c(1-c)) / W, frequency sigma that of the repeated rows."""
    g = torch.Generator().manual_seed(3)
    n = 20_000
    c = torch.rand(n, generator=g, dtype=torch.float64)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < c).long()
    w = torch.randint(0, 4, (n,), generator=g).double()
    exact, sigma = ecce(c, y, weight=w)
    h = fine_histogram(c, y, weight=w)
    e, s, bound = ecce_from_histogram(h)
    assert 0 <= float(exact - e[0]) <= float(bound[0])
    assert math.isclose(float(s[0]), float(sigma), rel_tol=1e-12)
    rep = w.long()
    ce, cs = ecce(c.repeat_interleave(rep), y.repeat_interleave(rep))
    ef, sf, _ = ecce_from_histogram(h, "frequency")
    assert math.isclose(float(sf[0]), float(cs), rel_tol=1e-12)
    assert math.isclose(float(ef[0]), float(e[0]), rel_tol=1e-12)  # the walk: the same
    with pytest.raises(ValueError, match="weights"):
        ecce_from_histogram(h, "kish")


def test_groups_and_merges_give_the_same_cells():
    g = torch.Generator().manual_seed(4)
    c = torch.rand(5000, generator=g, dtype=torch.float64)
    y = (torch.rand(5000, generator=g, dtype=torch.float64) < c).long()
    grp = torch.randint(0, 3, (5000,), generator=g)
    whole = fine_histogram(c, y, groups=grp, num_groups=3)
    parts = fine_histogram(c[:2000], y[:2000], groups=grp[:2000], num_groups=3).plus(
        fine_histogram(c[2000:], y[2000:], groups=grp[2000:], num_groups=3)
    )
    assert torch.equal(whole.count, parts.count)
    for a, b in zip(whole[1:], parts[1:], strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)
    one = fine_histogram(c[grp == 1], y[grp == 1])
    assert torch.equal(whole.count[1], one.count[0])
    pooled = whole.with_pooled()
    assert torch.equal(pooled.count[0], fine_histogram(c, y).count[0])
    assert pooled.count.shape == (4, FINE_BINS)


def _grid_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(40, 100, (n,), generator=g)
    c = k.double() / 100  # the 0.01 grid: one fine bin per value
    y = (torch.rand(n, generator=g, dtype=torch.float64) < (c - 0.3).clamp(0, 1)).long()
    return c, y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_from_the_histogram_is_delong_on_grid_data(seed):
    c, y = _grid_data(3000, seed)
    ref = auroc_interval(c, y, level=0.9)
    h = fine_histogram(c, y)
    r = auroc_from_histogram(h.pos, h.mass - h.pos, level=0.9)
    for got, want in zip(r[:4], ref[:4], strict=True):
        assert math.isclose(float(got[0]), want, rel_tol=1e-12, abs_tol=1e-15)
    assert float(r.positives[0]) == ref.positives and float(r.negatives[0]) == ref.negatives


def test_auroc_from_the_histogram_matches_scikit_learn():
    sk = pytest.importorskip("sklearn.metrics")
    c, y = _grid_data(4000, 7)
    h = fine_histogram(c, y)
    r = auroc_from_histogram(h.pos, h.mass - h.pos)
    assert math.isclose(float(r.auroc[0]), sk.roc_auc_score(y.numpy(), c.numpy()), rel_tol=1e-12)
    w = torch.randint(0, 5, (4000,), generator=torch.Generator().manual_seed(1)).double()
    hw = fine_histogram(c, y, weight=w)
    rw = auroc_from_histogram(hw.pos, hw.mass - hw.pos)  # frequency weights
    want = sk.roc_auc_score(y.numpy(), c.numpy(), sample_weight=w.numpy())
    assert math.isclose(float(rw.auroc[0]), want, rel_tol=1e-12)
    rep = w.long()
    ref = auroc_interval(c.repeat_interleave(rep), y.repeat_interleave(rep))
    assert math.isclose(float(rw.se[0]), ref.se, rel_tol=1e-12)  # DeLong of the repeated rows


def test_importance_weights_read_the_effective_size():
    """Unit weights: the importance form is DeLong's; scaling the weights changes nothing;
    uneven weights widen the interval (fewer effective rows)."""
    c, y = _grid_data(3000, 5)
    ones = torch.ones(3000, dtype=torch.float64)
    h = fine_histogram(c, y, weight=ones)
    plain = auroc_from_histogram(h.pos, h.mass - h.pos)
    imp = auroc_from_histogram(h.pos, h.mass - h.pos, pos2=h.pos2, neg2=h.mass2 - h.pos2)
    assert math.isclose(float(imp.se[0]), float(plain.se[0]), rel_tol=1e-12)
    g = torch.Generator().manual_seed(2)
    w = torch.rand(3000, generator=g, dtype=torch.float64) ** 4
    for scale in (1.0, 1e6):
        hw = fine_histogram(c, y, weight=w * scale)
        r = auroc_from_histogram(hw.pos, hw.mass - hw.pos, pos2=hw.pos2, neg2=hw.mass2 - hw.pos2)
        if scale == 1.0:
            first = float(r.se[0])
        assert math.isclose(float(r.se[0]), first, rel_tol=1e-9)
    assert first > 1.3 * float(plain.se[0])


def test_auroc_interval_covers_half_when_confidence_is_noise():
    """No resolution (outcomes independent of a 0.85/0.90/0.95 confidence): the 90 % interval
    holds 0.5 in about 90 % of 400 seeded replicates (vectorised: one group per replicate); a
    discriminating confidence (mean AUROC 0.81) never holds it."""
    R, n = 400, 600
    g = torch.Generator().manual_seed(0)
    c = (torch.randint(17, 20, (R, n), generator=g).double() * 5) / 100
    grp = torch.arange(R).repeat_interleave(n)
    y = (torch.rand(R, n, generator=g, dtype=torch.float64) < 0.9).long()
    h = fine_histogram(c.reshape(-1), y.reshape(-1), groups=grp, num_groups=R)
    r = auroc_from_histogram(h.pos, h.mass - h.pos, level=0.9)
    holds = ((r.lower <= 0.5) & (r.upper >= 0.5)).double().mean()
    assert 0.86 <= float(holds) <= 0.94, float(holds)
    z = torch.randn(R, n, generator=g, dtype=torch.float64)
    p = torch.sigmoid(z * 1.5 + 1.0)
    y2 = (torch.rand(R, n, generator=g, dtype=torch.float64) < p).long()
    h2 = fine_histogram(p.reshape(-1), y2.reshape(-1), groups=grp, num_groups=R)
    r2 = auroc_from_histogram(h2.pos, h2.mass - h2.pos, level=0.9)
    assert float(r2.auroc.mean()) > 0.7
    assert bool((r2.lower > 0.5).all())


def test_empty_and_one_sided_groups_are_nan():
    h = FineHistogram.zeros(2)
    e, s, b = ecce_from_histogram(h)
    assert torch.isnan(e).all() and torch.isnan(s).all() and torch.isnan(b).all()
    one = fine_histogram(torch.tensor([0.3, 0.6], dtype=torch.float64), torch.tensor([1, 1]))
    r = auroc_from_histogram(one.pos, one.mass - one.pos)
    assert math.isnan(float(r.auroc[0])) and float(r.positives[0]) == 2
    with pytest.raises(ValueError, match="level"):
        auroc_from_histogram(one.pos, one.mass, level=1.5)


def test_rows_to_decide():
    # inside the tolerance: the upper end must come down to it
    assert rows_to_decide(0.03, 0.01, 0.06, 0.05, 1000, False) == 2250
    # outside above: the lower end must clear it
    assert rows_to_decide(0.08, 0.04, 0.12, 0.05, 400, False) == math.ceil(400 * (4 / 3) ** 2)
    # two-sided, inside: the wider side decides
    assert rows_to_decide(0.01, -0.05, 0.06, 0.05, 100, True) == math.ceil(100 * 1.25**2)
    # below -tolerance
    assert rows_to_decide(-0.08, -0.12, -0.04, 0.05, 100, True) == math.ceil(100 * (4 / 3) ** 2)
    assert rows_to_decide(0.05, 0.0, 0.1, 0.05, 100, False) is None  # on the limit
    assert rows_to_decide(float("nan"), 0.0, 0.1, 0.05, 100, False) is None
