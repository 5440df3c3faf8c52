"""The one finite-sample conformal rank k = ceil((n + 1)(1 - alpha)), against exact fractions."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from torchcal.scaling import SplitConformal, conformal_quantile, conformal_rank

# (the float a user types, the fraction they mean): MAPIE / TorchCP / crepes trap cells
ALPHAS = [
    (0.1, Fraction(1, 10)),
    (1 / 3, Fraction(1, 3)),
    (0.7, Fraction(7, 10)),
    (0.05, Fraction(1, 20)),
    (0.2, Fraction(1, 5)),
    (0.3, Fraction(3, 10)),
    (2 / 3, Fraction(2, 3)),
    (0.9, Fraction(9, 10)),
    (0.01, Fraction(1, 100)),
    (1 - 1e-10, Fraction(9999999999, 10**10)),
    (1e-10, Fraction(1, 10**10)),
    (1e-6, Fraction(1, 10**6)),
]
N = np.arange(5, 2001)


def _exact(n: int, a: Fraction) -> int:
    return math.ceil((n + 1) * (1 - a))


@pytest.mark.parametrize("alpha, frac", ALPHAS, ids=[repr(a) for a, _ in ALPHAS])
def test_rank_equals_exact_fraction_on_the_grid(alpha: float, frac: Fraction) -> None:
    got = conformal_rank(torch.as_tensor(N), alpha).tolist()
    want = [_exact(int(n), frac) for n in N]
    assert got == want
    assert all(1 <= k <= n + 1 for k, n in zip(got, N))


def test_the_grid_holds_cells_where_floating_point_is_wrong() -> None:
    # the naive float formula misses some cells of this grid, so the test above has teeth
    wrong = sum(math.ceil((n + 1) * (1 - a)) != _exact(int(n), f) for a, f in ALPHAS for n in N)
    assert wrong > 50


def test_alpha_types_and_precisions() -> None:
    for a in (np.float32(0.1), np.float64(0.1), Fraction(1, 10), Decimal("0.1")):
        assert conformal_rank(9, a).item() == 9  # ceil(10 * 0.9)
        SplitConformal(alpha=a)  # np.float32 raised TypeError before
    assert conformal_rank(9, torch.tensor(0.1, dtype=torch.float32)).item() == 9
    assert conformal_rank(9, np.float32(0.7)).item() == 3
    # float32(0.1) is 0.10000000149..., in float64 it is not 1/10: read in its own precision
    assert conformal_rank(10**9, np.float32(0.1)).item() == 900000001
    assert conformal_rank(10**9, float(np.float32(0.1))).item() == 900000000
    for bad in (0.0, 1.0, -0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match="^alpha"):
            conformal_rank(9, bad)
    with pytest.raises(TypeError, match="^alpha"):
        conformal_rank(9, "0.1")  # type: ignore[arg-type]


def test_alpha_near_one_and_zero_clamped_and_groups_never_leak() -> None:
    assert conformal_rank(50, 1 - 1e-10).item() == 1  # was 0 (rounded alpha to 1)
    assert conformal_rank(50, 1e-10).item() == 51  # k > n: infinite
    assert conformal_rank(0, 0.5).item() == 1  # an empty group: infinite, never index -1
    s = torch.tensor([5.0, 4.0, 3.0, 9.0, 8.0, 7.0])
    g = torch.tensor([0, 0, 0, 2, 2, 2])
    q, n, k = conformal_quantile(s, 1 - 1e-10, g, 3)
    assert q.tolist() == [3.0, math.inf, 7.0] and n.tolist() == [3, 0, 3]
    assert k.tolist() == [1, 1, 1]
    q, _, k = conformal_quantile(s, 1e-10, g, 3)
    assert q.tolist() == [math.inf] * 3 and k.tolist() == [4, 1, 4]
