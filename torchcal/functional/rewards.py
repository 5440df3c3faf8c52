"""Proper scoring rules as rewards for a stated confidence of a verifiable outcome.

A model answers and states a confidence ``q`` in [0, 1] that its answer is right; a
verifier says whether it was (``correct``, 0/1). Each function here returns a positively
oriented reward ``r(q, y)`` (higher is better), elementwise, for reinforcement learning
of calibrated confidence. Write ``p = P(correct)`` for the true probability that the
answer is right. The expected reward ``R(q; p) = p r(q, 1) + (1 - p) r(q, 0)`` of a
**strictly proper** rule is maximised only at ``q = p``: a policy that maximises it
states its true probability of being right (Gneiting & Raftery 2007, *JASA* 102, 359-378,
sec. 2; a reward is a scoring rule with the sign flipped).

Why other rewards do not calibrate:

* a 0/1 correctness reward ``1[correct]`` does not depend on ``q``: its expectation is
  ``p`` for every stated confidence, so the confidence gets no signal at all;
* paying the confidence on success, ``q * 1[correct]``, has expectation ``p q``, maximised
  at ``q = 1`` for every ``p > 0``: it trains over-confidence;
* a learned preference (reward-model) score of the stated confidence is not a scoring
  rule of the outcome: its maximiser is whatever confidence the raters (or the reward
  model) liked, with no reason to equal ``p``.

Conventions: ``confidence`` is a floating tensor of any shape with values in [0, 1];
``correct`` has exactly its shape (never broadcast) with values in {0, 1} (bool, integer
or floating). ``reduction`` is ``'none'`` (default: one reward per sample, as RL needs),
``'mean'`` or ``'sum'`` (sums in float64, returned in the compute dtype). float16/bfloat16
confidences are computed and returned in float32. Gradients flow to ``confidence``.
Bad input raises ``ValueError`` naming the argument (``confidence``, ``correct``,
``reduction``, ``floor``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_binary_target,
    check_floating,
    check_nonempty,
    check_probabilities,
    check_reduction,
    check_same_shape,
    check_tensor,
    compute_dtype,
)
from torchcal.functional._validation import values_within

__all__ = ["brier_reward", "log_reward", "spherical_reward", "correctness_brier_reward"]


def prepare_reward(confidence: Tensor, correct: Tensor, reduction: str) -> tuple[Tensor, Tensor]:
    """Check the arguments of a reward; return ``(q, y)`` in the compute dtype.

    ``y`` is ``correct`` converted to ``q``'s dtype (exactly 0.0 or 1.0).
    """
    check_tensor("confidence", confidence)
    check_tensor("correct", correct)
    check_reduction(reduction)
    check_floating("confidence", confidence)
    check_nonempty("confidence", confidence)
    check_same_shape("confidence", confidence, "correct", correct)
    if correct.is_complex():
        raise ValueError(f"correct: expected 0/1 labels (bool, int or float), got {correct.dtype}")
    if not values_within(confidence, 0.0, 1.0):
        check_probabilities("confidence", confidence)
    if correct.dtype != torch.bool:
        check_binary_target("correct", correct)
    q = confidence.to(compute_dtype(confidence.dtype))
    return q, correct.to(device=q.device, dtype=q.dtype)


def reduce_reward(reward: Tensor, reduction: str) -> Tensor:
    """``'none'``: the rewards; ``'sum'`` / ``'mean'``: summed in float64."""
    if reduction == "none":
        return reward
    total = reward.sum(dtype=torch.float64)
    if reduction == "mean":
        total = total / reward.numel()
    return total.to(reward.dtype)


def brier_reward(confidence: Tensor, correct: Tensor, *, reduction: str = "none") -> Tensor:
    r"""Brier reward ``-(q - y)^2`` (strictly proper; values in [-1, 0]).

    The negative of the binary Brier score (Brier 1950). Expected reward
    ``R(q; p) = -(q - p)^2 - p (1 - p)``: maximised only at ``q = p``
    (``is_proper = "strict"``). Its best value ``-p (1 - p)`` is highest at ``p = 0`` as
    at ``p = 1``, so on its own it does not prefer right answers to surely wrong ones:
    :func:`correctness_brier_reward` adds the correctness term.

    Example:
        >>> import torch
        >>> from torchcal.rewards import brier_reward
        >>> q = torch.tensor([0.9, 0.9, 0.5], dtype=torch.float64)
        >>> [round(v, 4) for v in brier_reward(q, torch.tensor([1, 0, 1])).tolist()]
        [-0.01, -0.81, -0.25]
        >>> round(brier_reward(q, torch.tensor([1, 0, 1]), reduction="mean").item(), 4)
        -0.3567
    """
    q, y = prepare_reward(confidence, correct, reduction)
    return reduce_reward(-(q - y).square(), reduction)


def check_floor(floor: float | None) -> float | None:
    """``floor``: ``None`` or a number in the open interval (0, 0.5)."""
    if floor is None:
        return None
    if isinstance(floor, bool) or not isinstance(floor, (int, float)):
        raise TypeError(f"floor: expected a float or None, got {type(floor).__name__}")
    if not 0.0 < floor < 0.5:
        raise ValueError(f"floor: expected None or a number in (0, 0.5), got {floor!r}")
    return float(floor)


def log_reward(
    confidence: Tensor,
    correct: Tensor,
    *,
    floor: float | None = None,
    reduction: str = "none",
) -> Tensor:
    r"""Logarithmic reward ``y log q + (1 - y) log(1 - q)`` (strictly proper without a floor).

    The negative binary log score (Good 1952). Expected reward
    ``R(q; p) = -KL(p || q) - H(p)``: maximised only at ``q = p``
    (``is_proper = "strict"``). Unbounded below: a certain wrong statement (``q = 0`` with
    ``y = 1``, or ``q = 1`` with ``y = 0``) gives ``-inf`` (and an infinite gradient).
    Computed as ``log q`` / ``log1p(-q)`` on the branch that applies (no ``log(1 - q)``
    cancellation, no NaN gradient from the other branch).

    ``floor`` in (0, 0.5) first clamps ``q`` to ``[floor, 1 - floor]``, bounding the reward
    below by ``log(floor)``. **This breaks strict properness near the floor**: for
    ``p < floor`` (or ``p > 1 - floor``) every ``q`` in ``[0, floor]`` (``[1 - floor, 1]``)
    earns the same expected reward and has zero gradient, so the reward no longer
    identifies ``p`` there (a learner may settle anywhere in that interval). Between the
    floors it is still strictly proper. Off by default.

    Example:
        >>> import torch
        >>> from torchcal.rewards import log_reward
        >>> q = torch.tensor([0.5, 0.8, 0.0], dtype=torch.float64)
        >>> [round(v, 4) for v in log_reward(q, torch.tensor([1, 0, 1])).tolist()]
        [-0.6931, -1.6094, -inf]
        >>> round(log_reward(q, torch.tensor([1, 0, 1]), floor=0.01)[2].item(), 4)
        -4.6052
    """
    floor = check_floor(floor)
    q, y = prepare_reward(confidence, correct, reduction)
    if floor is not None:
        q = q.clamp(floor, 1.0 - floor)
    hit = y == 1
    half = torch.full_like(q, 0.5)  # a harmless value for the branch that does not apply
    reward = torch.where(
        hit, torch.log(torch.where(hit, q, half)), torch.log1p(-torch.where(hit, half, q))
    )
    return reduce_reward(reward, reduction)


def spherical_reward(confidence: Tensor, correct: Tensor, *, reduction: str = "none") -> Tensor:
    r"""Spherical reward ``(q y + (1 - q)(1 - y)) / sqrt(q^2 + (1 - q)^2)`` (strictly proper).

    The spherical score of the forecast ``(1 - q, q)`` (Good 1971; Gneiting & Raftery 2007,
    eq. 13), positively oriented, in [0, 1]. Expected reward
    ``R(q; p) = <(1 - p, p), (1 - q, q)> / ||(1 - q, q)||``, by Cauchy-Schwarz maximised
    only at ``q = p`` (``is_proper = "strict"``). Bounded, unlike :func:`log_reward`.

    Example:
        >>> import torch
        >>> from torchcal.rewards import spherical_reward
        >>> q = torch.tensor([0.5, 1.0, 0.6], dtype=torch.float64)
        >>> [round(v, 4) for v in spherical_reward(q, torch.tensor([1, 1, 0])).tolist()]
        [0.7071, 1.0, 0.5547]
    """
    q, y = prepare_reward(confidence, correct, reduction)
    stated = torch.where(y == 1, q, 1.0 - q)  # the probability given to what happened
    return reduce_reward(stated / torch.hypot(q, 1.0 - q), reduction)


def correctness_brier_reward(
    confidence: Tensor, correct: Tensor, *, reduction: str = "none"
) -> Tensor:
    r"""Correctness plus a Brier term, ``y - (q - y)^2`` (values in [-1, 1]).

    The reward of RLCR (Damani et al. 2025, *Beyond Binary Rewards: Training LMs to
    Reason About Their Uncertainty*): the 0/1 correctness reward plus
    :func:`brier_reward`. Expected reward ``R(q; p) = p - (q - p)^2 - p (1 - p)``: the
    correctness term does not depend on ``q``, so it is maximised only at ``q = p``
    (``is_proper = "strict"`` as a rule for the confidence), and its best value ``p^2``
    grows with ``p``: among answers, the policy still prefers the one more likely to be
    right (the Brier reward alone, best value ``-p (1 - p)``, would be as happy with a
    surely wrong answer stated at ``q = 0``).

    Example:
        >>> import torch
        >>> from torchcal.rewards import correctness_brier_reward
        >>> q = torch.tensor([0.9, 0.9, 0.0], dtype=torch.float64)
        >>> [round(v, 4) for v in correctness_brier_reward(q, torch.tensor([1, 0, 0])).tolist()]
        [0.99, -0.81, 0.0]
    """
    q, y = prepare_reward(confidence, correct, reduction)
    return reduce_reward(y - (q - y).square(), reduction)
