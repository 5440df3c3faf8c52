"""Issue 30: ``confidence=`` on every conformal entry point, read as the decimal written, and
``alpha = 1 - c`` in floating point read as ``1 - c``: the same conformal rank on every n."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from torchcal.functional._levels import alpha_fraction, miscoverage
from torchcal.scaling import (
    ConformalClassifier,
    ConformalQuantileRegression,
    SplitConformal,
    conformal_quantile,
    conformal_rank,
)

#: crepes' confidence levels (its docs and tests: 0.5 .. 0.99 and the usual 0.95 / 0.99 /
#: 0.995 / 0.999), which crepes turns into ``alpha = 1 - confidence`` in floating point
GRID = [round(0.5 + k / 100, 2) for k in range(50)] + [0.975, 0.995, 0.999, 0.9999]
N = torch.arange(1, 1001)


def _exact_rank(n: torch.Tensor, alpha: Fraction) -> torch.Tensor:
    p, q = alpha.numerator, alpha.denominator
    return torch.tensor([-((-(m + 1) * (q - p)) // q) for m in n.tolist()])


def test_one_minus_confidence_gives_the_confidence_rank_on_crepes_grid() -> None:
    moved = 0
    for c in GRID:
        written = 1 - Fraction(Decimal(repr(c)))  # the decimal the user wrote
        want = _exact_rank(N, written)
        assert torch.equal(conformal_rank(N, confidence=c), want), c
        assert torch.equal(conformal_rank(N, 1 - c), want), c
        assert torch.equal(conformal_rank(N, np.float64(1) - np.float64(c)), want), c
        # the float 1 - c read as itself would move the rank on some n (the defect)
        moved += int(not torch.equal(_exact_rank(N, Fraction(1 - c)), want))
    assert moved >= 10


def test_float32_levels_in_their_own_precision() -> None:
    for c in (0.8, 0.9, 0.95, 0.99):
        c32 = np.float32(c)
        assert miscoverage(np.float32(1) - c32, None) == miscoverage(None, c32)
        assert alpha_fraction(torch.tensor(1 - c, dtype=torch.float32)) == 1 - Fraction(
            Decimal(repr(c))
        )


def test_readings_that_stay() -> None:
    assert alpha_fraction(0.7) == Fraction(7, 10)
    assert alpha_fraction(1 / 3) == Fraction(1, 3)
    assert alpha_fraction(1e-10) == Fraction(1, 10**10)
    assert alpha_fraction(np.float32(0.1)) == Fraction(1, 10)
    assert 0 < alpha_fraction(1 - 1e-10) < 1
    assert alpha_fraction(Decimal("0.19999999999999996")) == Fraction(
        Decimal("0.19999999999999996")
    )  # exact types are taken as they are


def test_every_entry_point_takes_confidence() -> None:
    g = torch.Generator().manual_seed(0)
    pred, y = torch.zeros(99), torch.randn(99, generator=g)
    for c in (0.8, 0.9, 0.95):
        a = SplitConformal(alpha=1 - c).fit(pred, y)
        b = SplitConformal(confidence=c).fit(pred, y)
        assert a == b and b.ranks == (int(_exact_rank(torch.tensor([99]), 1 - Fraction(str(c)))),)
        lo, hi = pred - 1, pred + 1
        assert ConformalQuantileRegression(confidence=c).fit(
            lo, hi, y
        ) == ConformalQuantileRegression(alpha=1 - c).fit(lo, hi, y)
        q1 = conformal_quantile(y.abs().double(), confidence=c)
        q2 = conformal_quantile(y.abs().double(), 1 - c)
        assert all(torch.equal(u, v) for u, v in zip(q1, q2))
    z = torch.randn(200, 4, generator=g) * 2
    t = torch.randint(0, 4, (200,), generator=g)
    f1 = ConformalClassifier(confidence=0.8, method="lac").fit(z, t)
    f2 = ConformalClassifier(alpha=1 - 0.8, method="lac").fit(z, t)
    assert f1 == f2 and f1.ranks == (161,) and f1.alpha == 0.2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"alpha": 0.1, "confidence": 0.9}, "^confidence: given together with alpha"),
        ({"confidence": 1.0}, "^confidence: expected a value in the open interval"),
        ({"confidence": 0.0}, "^confidence: expected a value in the open interval"),
        ({"confidence": float("nan")}, "^confidence"),
        ({"alpha": 1.5}, "^alpha: expected a value in the open interval"),
    ],
)
def test_bad_levels_are_named(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        SplitConformal(**kwargs)
    with pytest.raises(ValueError, match=match):
        conformal_rank(5, **kwargs)
    with pytest.raises(ValueError, match=match):
        ConformalClassifier(**kwargs)


def test_level_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match="^confidence: expected a float"):
        conformal_rank(5, confidence="0.9")
    with pytest.raises(TypeError, match="^alpha: expected a float"):
        conformal_rank(5, 1)
    with pytest.raises(ValueError, match="^alpha: expected alpha or confidence"):
        conformal_rank(5)
