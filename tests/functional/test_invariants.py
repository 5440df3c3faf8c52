"""check_monotone_map: what floating point keeps under a monotone map, checked exactly.

References: hand-built one-ulp near-ties (torch.nextafter), brute-force pairwise checks on
random rows, and maps that are wrong on purpose (a swap, a broken tie, a sign flip)."""

from __future__ import annotations

import itertools

import pytest
import torch

from torchcal.functional import MonotoneMapCheck, check_monotone_map, ulp_distance

INF = float("inf")


def _up(x: torch.Tensor, n: int = 1) -> torch.Tensor:
    for _ in range(n):
        x = torch.nextafter(x, torch.full_like(x, INF))
    return x


def _merging_pair(dtype: torch.dtype, t: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Search a seeded grid for scores a and nextafter(a) that x / t maps to the same value
    (they exist: division is only weakly monotone in floating point)."""
    g = torch.Generator().manual_seed(0)
    a = -10 * torch.rand(20000, generator=g, dtype=torch.float64).to(dtype)
    b = _up(a)
    T = torch.tensor(t, dtype=dtype)
    merged = (a / T) == (b / T)
    assert bool(merged.any()), "no merging one-ulp pair found: change the grid"
    i = int(torch.nonzero(merged)[0, 0])
    return a[i], b[i]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_ulp_near_ties_merged_by_division_pass(dtype):
    t = 2.4776
    a, b = _merging_pair(dtype, t)
    assert ulp_distance(a, b) == 1
    # a row with the merging pair in the middle, in shuffled positions, and a clear top-1
    row = torch.stack([torch.tensor(1.5, dtype=dtype), b, torch.tensor(-20.0, dtype=dtype), a])
    T = torch.tensor(t, dtype=dtype)
    c = check_monotone_map(row, row / T)
    assert isinstance(c, MonotoneMapCheck)
    assert (
        c.ok,
        c.strict_inversions,
        c.ties_broken,
        c.ties_created,
        c.max_tie_gap_ulps,
        c.top1_kept,
        c.decisions_kept,
    ) == (True, 0, 0, 1, 1, True, True)
    # the exact-equality check the recipe used to make ("same weak order") fails here
    assert not torch.equal((row[:, None] == row[None, :]), ((row / T)[:, None] == (row / T)[None]))


def test_merged_near_tie_at_the_top_keeps_top1():
    a, b = _merging_pair(torch.float64, 2.4776)
    row = torch.stack([a, b])  # b is the unique top-1; after / T both are maxima
    c = check_monotone_map(row, row / 2.4776)
    assert c.ok and c.top1_kept and c.ties_created == 1


def test_a_swap_of_two_scores_fails():
    x = torch.tensor([[0.3, -1.0, 2.0, 0.7]], dtype=torch.float64)
    y = x / 1.7
    y[0, 0], y[0, 3] = y[0, 3].clone(), y[0, 0].clone()
    c = check_monotone_map(x, y)
    assert not c.ok and c.strict_inversions == 1 and c.top1_kept and c.decisions_kept


def test_a_swap_of_one_ulp_neighbours_still_fails():
    a = torch.tensor([1.0], dtype=torch.float64)
    x = torch.cat([a, _up(a)])
    c = check_monotone_map(x, x.flip(0))
    assert not c.ok and c.strict_inversions == 1 and c.ties_created == 0


def test_swapping_the_top1_away_fails_top1():
    x = torch.tensor([[0.1, 3.0, 2.0]], dtype=torch.float64)
    y = torch.tensor([[0.1, 2.0, 3.0]], dtype=torch.float64)
    c = check_monotone_map(x, y)
    assert not c.top1_kept and c.strict_inversions == 1 and not c.ok


def test_broken_tie_fails():
    x = torch.tensor([1.0, 1.0, -2.0], dtype=torch.float64)
    c = check_monotone_map(x, torch.tensor([0.5, 0.6, -1.0], dtype=torch.float64))
    assert not c.ok and c.ties_broken == 1 and c.strict_inversions == 0


def test_wide_created_tie_fails_the_bound():
    x = torch.tensor([1.0, 1.0 + 2**-40], dtype=torch.float64)  # 2**12 ulps apart
    y = torch.tensor([0.5, 0.5], dtype=torch.float64)
    c = check_monotone_map(x, y)
    assert c.ties_created == 1 and c.max_tie_gap_ulps == 2**12 and not c.ok
    assert check_monotone_map(x, y, max_tie_gap_ulps=2**12).ok


def test_decisions_at_zero():
    x = torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64)
    shifted = 0.5 * x + 1.0  # increasing, but moves the threshold (a Platt offset)
    c = check_monotone_map(x, shifted)
    assert c.decisions_kept is False and not c.ok and c.strict_inversions == 0
    c = check_monotone_map(x, shifted, decisions=False)
    assert c.ok and c.decisions_kept is None
    # zero stays zero under x / T: a score of exactly 0 mapped to a tiny positive value fails
    assert check_monotone_map(x, x / 3).decisions_kept is True
    assert (
        check_monotone_map(
            x, x / 3 + torch.tensor([0, 1e-300, 0], dtype=torch.float64)
        ).decisions_kept
        is False
    )


def test_masked_rows():
    x = torch.tensor(
        [[-INF, 0.5, -INF, 2.0], [-INF, -INF, -INF, -INF], [3.0, -INF, 1.0, -INF]],
        dtype=torch.float64,
    )
    c = check_monotone_map(x, x / 0.37)
    assert c.ok and c.ties_created == 0 and c.ties_broken == 0
    # an all -inf row: every position is a top-1 and stays one
    assert c.top1_kept
    # a mask lifted (a -inf becoming finite below every score) is a broken tie, not ok
    y = (x / 0.37).clone()
    y[0, 0] = -1e300
    c = check_monotone_map(x, y)
    assert not c.ok and c.ties_broken == 1
    # overflow of a finite score to -inf creates a tie with a mask: counted, gap huge
    z = torch.tensor([[-INF, -1e300, 1.0]], dtype=torch.float64)
    c = check_monotone_map(z, z / 1e-10)
    assert c.ties_created == 1 and c.max_tie_gap_ulps > 2**53 and not c.ok


def test_batched_rows_match_brute_force_pairwise():
    """On random rows with many duplicates, counts equal a brute-force reference built from
    all pairs (i, j) and a per-row Python sort."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-3, 4, (2, 3, 7), generator=g).double()
    y = x / 1.3
    noise = torch.randint(0, 3, x.shape, generator=g).double() * 0.5
    y = y + torch.where(torch.rand(x.shape, generator=g) < 0.2, noise, torch.zeros_like(x))
    c = check_monotone_map(x, y, decisions=False)
    inv = broken = created = 0
    top_ok = True
    for a, s in zip(x.reshape(-1, 7).tolist(), y.reshape(-1, 7).tolist()):
        order = sorted(range(7), key=lambda i: (a[i], i))
        for i, j in itertools.pairwise(order):
            inv += s[i] > s[j]
            broken += a[i] == a[j] and s[i] != s[j]
            created += a[i] != a[j] and s[i] == s[j]
        top_ok &= all(s[i] == max(s) for i in range(7) if a[i] == max(a))
    assert (c.strict_inversions, c.ties_broken, c.ties_created, c.top1_kept) == (
        inv,
        broken,
        created,
        top_ok,
    )
    assert inv + broken > 0  # the perturbation did damage this check must see


def test_ulp_distance_against_nextafter_chain():
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        a = torch.tensor([-1.0, -1e-3, 0.0, 1.0, 7.0], dtype=dtype)
        assert ulp_distance(a, _up(a, 3)).tolist() == [3] * 5
        assert ulp_distance(_up(a, 3), a).tolist() == [-3] * 5
    # across zero: -tiny -> +tiny is 2 steps (-0.0 and 0.0 are the same key)
    tiny = torch.tensor([5e-324], dtype=torch.float64)
    assert ulp_distance(-tiny, tiny).item() == 2
    assert ulp_distance(torch.tensor([-0.0]), torch.tensor([0.0])).item() == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"scores": torch.tensor([1.0, float("nan")]), "mapped": torch.tensor([1.0, 2.0])},
            "^scores: expected no NaN",
        ),
        (
            {"scores": torch.tensor([1.0, 2.0]), "mapped": torch.tensor([1.0, float("nan")])},
            "^mapped: expected no NaN",
        ),
        (
            {"scores": torch.tensor([1.0, 2.0]), "mapped": torch.tensor([[1.0, 2.0]])},
            r"^mapped: expected the shape of scores \(2,\)",
        ),
        (
            {"scores": torch.tensor([1, 2]), "mapped": torch.tensor([1.0, 2.0])},
            "^scores: expected a floating-point tensor",
        ),
        (
            {"scores": torch.tensor([1.0, 2.0]), "mapped": torch.tensor([1, 2])},
            "^mapped: expected a floating-point tensor",
        ),
        ({"scores": torch.zeros(0), "mapped": torch.zeros(0)}, "^scores: expected a non-empty"),
        ({"scores": torch.tensor(1.0), "mapped": torch.tensor(1.0)}, "^scores: expected a 1-D"),
        (
            {"scores": torch.tensor([1.0]), "mapped": torch.tensor([1.0]), "max_tie_gap_ulps": -1},
            "^max_tie_gap_ulps",
        ),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_monotone_map(**kwargs)


def test_single_score_and_nan_checked_even_with_validation_off():
    from torchcal.functional import validation_enabled

    one = torch.tensor([0.25], dtype=torch.float64)
    assert check_monotone_map(one, one / 2).ok
    assert check_monotone_map(one, -one).decisions_kept is False
    with validation_enabled(False), pytest.raises(ValueError, match="^mapped"):
        check_monotone_map(one, torch.tensor([float("nan")], dtype=torch.float64))
