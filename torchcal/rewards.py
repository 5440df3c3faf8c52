"""Rewards for stated confidence: proper scoring rules, positively oriented, for RL.

A model states a confidence ``q`` that its (verifiable) answer is right; these rewards
pay it so that the expected reward is maximised only at ``q = P(correct)``. The formulas
live in :mod:`torchcal.functional.rewards` (its docstring says why a 0/1 correctness
reward, ``q * 1[correct]`` or a learned preference reward does not calibrate).

``REWARDS`` maps each name to ``(function, is_proper)`` with ``is_proper`` one of
``"strict"`` (expected reward maximised only at the truth), ``"proper"`` (maximised at
the truth, not only there) or ``"no"``; :func:`log_reward` is ``"strict"`` without its
``floor`` option (with it, not strictly proper below the floor).

Example:
    >>> import torch
    >>> from torchcal.rewards import REWARDS, correctness_brier_reward
    >>> q = torch.tensor([0.8, 0.3], dtype=torch.float64)
    >>> [round(v, 4) for v in correctness_brier_reward(q, torch.tensor([1, 0])).tolist()]
    [0.96, -0.09]
    >>> sorted(name for name, (fn, tag) in REWARDS.items() if tag == "strict")
    ['brier_reward', 'correctness_brier_reward', 'log_reward', 'spherical_reward']
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from torchcal.functional.rewards import (
    brier_reward,
    correctness_brier_reward,
    log_reward,
    spherical_reward,
)

__all__ = [
    "REWARDS",
    "brier_reward",
    "correctness_brier_reward",
    "log_reward",
    "spherical_reward",
]

REWARDS: dict[str, tuple[Callable[..., Tensor], str]] = {
    "brier_reward": (brier_reward, "strict"),
    "log_reward": (log_reward, "strict"),
    "spherical_reward": (spherical_reward, "strict"),
    "correctness_brier_reward": (correctness_brier_reward, "strict"),
}
