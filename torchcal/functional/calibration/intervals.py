"""Binomial intervals for a bin's accuracy: Wilson (1927) and Clopper-Pearson (1934)."""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

INTERVALS = ("wilson", "clopper_pearson")


def z_of_level(level: float) -> float:
    if isinstance(level, bool) or not isinstance(level, Real):  # numpy floats are Real
        raise TypeError(f"level: expected a number in (0, 1), got {type(level).__name__}")
    x = float(level)
    if not 0.0 < x < 1.0:
        raise ValueError(f"level: expected a value in the open interval (0, 1), got {level!r}")
    return float(torch.special.ndtri(torch.tensor(0.5 + x / 2, dtype=torch.float64)))


def wilson_interval(
    successes: Tensor, trials: Tensor, level: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Wilson (1927) score interval for a binomial proportion (no continuity correction).

    ``NaN`` where ``trials == 0``. Matches ``scipy.stats.binomtest(k, n)
    .proportion_ci(level, method="wilson")``.

    Example:
        >>> import torch
        >>> lo, hi = wilson_interval(torch.tensor([7.0]), torch.tensor([7.0]))
        >>> round(float(lo), 4), round(float(hi), 4)
        (0.6457, 1.0)
    """
    z = z_of_level(level)
    k = successes.to(torch.float64)
    n = trials.to(torch.float64)
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = (z / denom) * torch.sqrt((p * (1 - p) / n + z2 / (4 * n * n)).clamp_min(0))
    # the closed form is exactly 0 at k = 0 and 1 at k = n; rounding can miss by 1e-16 and
    # put the bound on the wrong side of the accuracy (a negative whisker in a plot)
    lo = torch.where(k <= 0, 0.0, (center - half).clamp(0, 1))
    hi = torch.where(k >= n, 1.0, (center + half).clamp(0, 1))
    return torch.where(n > 0, lo, math.nan), torch.where(n > 0, hi, math.nan)


def clopper_pearson_interval(
    successes: Tensor, trials: Tensor, level: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Clopper & Pearson (1934) exact interval: beta quantiles
    ``B^-1(a/2; k, n-k+1)`` and ``B^-1(1-a/2; k+1, n-k)``.

    Needs ``scipy`` (for ``scipy.special.betaincinv``; imported here only). ``NaN`` where
    ``trials == 0``.

    Example:
        >>> import torch
        >>> lo, hi = clopper_pearson_interval(torch.tensor([7.0]), torch.tensor([7.0]))
        >>> round(float(lo), 4), round(float(hi), 4)
        (0.5904, 1.0)
    """
    z_of_level(level)
    try:
        from scipy.special import betaincinv
    except ImportError as e:  # pragma: no cover - scipy is a test/bench extra
        raise ImportError("interval='clopper_pearson' needs scipy; use interval='wilson'") from e
    k = successes.detach().to(torch.float64).cpu()
    n = trials.detach().to(torch.float64).cpu()
    a = 1.0 - level
    nan = torch.full_like(k, math.nan)
    empty = n <= 0
    kk = k.numpy()
    nn = n.numpy()
    with torch.no_grad():
        import numpy as np

        with np.errstate(invalid="ignore", divide="ignore"):
            lo = torch.from_numpy(np.where(kk > 0, betaincinv(kk, nn - kk + 1, a / 2), 0.0))
            hi = torch.from_numpy(np.where(kk < nn, betaincinv(kk + 1, nn - kk, 1 - a / 2), 1.0))
    lo = torch.where(empty, nan, lo)
    hi = torch.where(empty, nan, hi)
    return lo.to(successes.device), hi.to(successes.device)
