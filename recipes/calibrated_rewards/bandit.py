"""The environment: a contextual bandit whose every answer has a known probability of being
right, and the grid of confidences the policy may state.

Context ``k`` (of ``K``, drawn uniformly each round) has ``A`` candidate answers; answer ``a``
is right with probability ``p[k, a] = p_k * answer_decay ** a``, where the ``p_k`` are spread
evenly over ``[p_low, p_high]``. Answer 0 is therefore always the best one, and a reward that
pays for correctness should teach the policy to pick it. With ``n_answers=1`` the policy only
states a confidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Bandit", "confidence_grid", "make_bandit"]


@dataclass(frozen=True)
class Bandit:
    """The known truth: ``p[k, a]``, the probability that answer ``a`` in context ``k`` is
    right (float64 ``(K, A)``)."""

    p: Tensor

    @property
    def n_contexts(self) -> int:
        """``K``."""
        return int(self.p.shape[0])

    @property
    def n_answers(self) -> int:
        """``A``."""
        return int(self.p.shape[1])

    def outcomes(self, context: Tensor, answer: Tensor, generator: torch.Generator) -> Tensor:
        """Draw ``1[correct]`` (float64) for each ``(context, answer)`` pair, in one call.

        Example:
            >>> b = make_bandit(n_contexts=2, n_answers=1, p_low=0.0, p_high=1.0)
            >>> g = torch.Generator().manual_seed(0)
            >>> b.outcomes(torch.tensor([0, 1, 1]), torch.tensor([0, 0, 0]), g).tolist()
            [0.0, 1.0, 1.0]
        """
        u = torch.rand(context.shape, generator=generator, dtype=torch.float64)
        return (u < self.p[context, answer]).double()


def _check_probability(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a float in [0, 1], got {value!r}")
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name}: expected a float in [0, 1], got {value!r}")
    return float(value)


def _check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return value


def make_bandit(
    n_contexts: int = 20,
    n_answers: int = 2,
    p_low: float = 0.05,
    p_high: float = 0.95,
    answer_decay: float = 0.5,
) -> Bandit:
    """The bandit: ``p[k, a] = p_k * answer_decay ** a`` with ``p_k`` evenly spaced on
    ``[p_low, p_high]`` (deterministic: the truth is fixed, only the rounds are random). The
    command line's ``--bandit.*`` options are these arguments.

    Args:
        n_contexts: number of contexts ``K``.
        n_answers: candidate answers per context ``A`` (1: the policy only states a
            confidence).
        p_low, p_high: the range of the best answer's probability of being right.
        answer_decay: each further answer is right this many times as often as the one
            before, in ``[0, 1)`` (so answer 0 is the best one).

    Example:
        >>> make_bandit(n_contexts=3, n_answers=2, p_low=0.2, p_high=0.8).p.tolist()
        [[0.2, 0.1], [0.5, 0.25], [0.8, 0.4]]
    """
    _check_count("n_contexts", n_contexts, 1)
    _check_count("n_answers", n_answers, 1)
    lo, hi = _check_probability("p_low", p_low), _check_probability("p_high", p_high)
    if hi < lo:
        raise ValueError(f"p_high: expected >= p_low = {lo}, got {hi}")
    decay = _check_probability("answer_decay", answer_decay)
    if decay >= 1.0:
        raise ValueError(f"answer_decay: expected a float in [0, 1), got {decay!r}")
    p_best = torch.linspace(lo, hi, n_contexts, dtype=torch.float64)
    powers = torch.arange(n_answers, dtype=torch.float64)
    return Bandit(p_best[:, None] * decay**powers)


def confidence_grid(size: int = 20) -> Tensor:
    """The confidences the policy may state: the centres ``(g + 0.5) / size`` of ``size``
    equal bins of ``[0, 1]`` (float64). With the reliability table's ``n_bins == size``, each
    stated value has a bin of its own, never on a bin edge, so the binned ECE is exactly the
    calibration of each stated value.

    Example:
        >>> confidence_grid(4).tolist()
        [0.125, 0.375, 0.625, 0.875]
    """
    _check_count("grid_size", size, 2)
    return (torch.arange(size, dtype=torch.float64) + 0.5) / size
