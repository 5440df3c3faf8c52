"""Resolution: does a confidence separate right answers from wrong ones at all? (docs/design.md
section 6g). A judge that says 0.85-0.95 to everyone can have a small ECE and no resolution;
the AUROC of the confidence against correctness, with an interval, says so.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_binary_target,
    check_floating,
    check_same_shape,
    check_tensor,
)

__all__ = ["AurocInterval", "auroc_interval"]


class AurocInterval(NamedTuple):
    """The AUROC and its interval (floats; NaN where one class is absent)."""

    auroc: float
    lower: float
    upper: float
    se: float  # DeLong's standard error
    positives: int
    negatives: int


def _midranks(x: Tensor) -> Tensor:
    """Ranks 1..n of ``x``, ties given the mean of their ranks (float64)."""
    order = torch.sort(x, stable=True).indices
    xs = x[order]
    _, inverse, counts = torch.unique_consecutive(xs, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    mid = ends - (counts.double() - 1) / 2
    ranks = torch.empty_like(mid[inverse])
    ranks[order] = mid[inverse]
    return ranks


def auroc_interval(confidence: Tensor, correct: Tensor, *, level: float = 0.9) -> AurocInterval:
    """AUROC of ``confidence`` ``(N,)`` against ``correct`` ``(N,)`` (0/1: the answer was
    right) -- the probability that a right answer's confidence exceeds a wrong one's, ties
    counted one half -- with DeLong's standard error (DeLong, DeLong & Clarke-Pearson 1988,
    from midranks, O(N log N)) and the Wald interval at ``level``, intersected with [0, 1].
    0.5 inside the interval: the data do not show that the confidence separates right from
    wrong answers.

    Example:
        >>> import torch
        >>> from torchcal.functional import auroc_interval
        >>> conf = torch.tensor([0.9, 0.8, 0.85, 0.9, 0.6, 0.7])
        >>> res = auroc_interval(conf, torch.tensor([1, 1, 0, 1, 0, 0]))
        >>> round(res.auroc, 4), res.positives, res.negatives
        (0.8889, 3, 3)
    """
    check_floating("confidence", check_tensor("confidence", confidence))
    if confidence.dim() != 1:
        raise ValueError(f"confidence: expected shape (N,), got {tuple(confidence.shape)}")
    check_same_shape("confidence", confidence, "correct", check_tensor("correct", correct))
    check_binary_target("correct", correct)
    if not bool(torch.isfinite(confidence).all()):
        raise ValueError("confidence: expected finite values, found NaN or Inf")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level: expected a number in (0, 1), got {level!r}")
    c = confidence.detach().to(torch.float64)
    pos = correct.detach().to(torch.bool)
    m, n = int(pos.sum()), int((~pos).sum())
    if m == 0 or n == 0:
        return AurocInterval(math.nan, math.nan, math.nan, math.nan, m, n)
    r_all = _midranks(c)
    x, y = c[pos], c[~pos]
    v10 = (r_all[pos] - _midranks(x)) / n  # per right answer: share of wrong ones below it
    v01 = 1.0 - (r_all[~pos] - _midranks(y)) / m  # per wrong answer: share of right ones above
    auc = float(v10.mean())
    var = (float(v10.var()) / m if m > 1 else 0.0) + (float(v01.var()) / n if n > 1 else 0.0)
    se = math.sqrt(max(var, 0.0))
    z = NormalDist().inv_cdf(0.5 + level / 2)
    return AurocInterval(auc, max(0.0, auc - z * se), min(1.0, auc + z * se), se, m, n)
