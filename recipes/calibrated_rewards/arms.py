"""The two rewards the demo trains with ("arms"), each ``reward(confidence, correct)``:

* ``correctness_brier``: :func:`torchcal.rewards.correctness_brier_reward`,
  ``1[correct] - (q - 1[correct])^2`` (Damani et al. 2025). Expected reward
  ``p - p (1 - q)^2 - (1 - p) q^2 = p^2 - (q - p)^2``: for a given answer it is maximised
  only at ``q = p`` (strictly proper), and its best value ``p^2`` grows with ``p``, so the
  policy also learns to pick the answer most likely to be right.
* ``improper``: the IMPROPER control :func:`improper_reward`, ``q * 1[correct]``, which pays
  the stated confidence on success. Expected reward ``q p``, increasing in ``q`` for every
  ``p > 0``: the best statement is always the largest confidence, whatever the truth. It is
  defined here, not in :mod:`torchcal.rewards`, because nobody should train with it.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from torchcal.rewards import correctness_brier_reward

__all__ = ["ARMS", "improper_reward"]


def improper_reward(confidence: Tensor, correct: Tensor) -> Tensor:
    """IMPROPER control ``q * 1[correct]`` (``is_proper = "no"``): its expected value ``q p``
    is maximised at ``q = 1`` for every ``p > 0``. Same shapes required (never broadcast).

    Example:
        >>> import torch
        >>> q = torch.tensor([0.2, 0.9], dtype=torch.float64)
        >>> improper_reward(q, torch.tensor([1.0, 0.0])).tolist()
        [0.2, 0.0]
    """
    if confidence.shape != correct.shape:
        raise ValueError(
            f"confidence: shape {tuple(confidence.shape)} != correct's {tuple(correct.shape)}"
        )
    return confidence * correct.to(confidence.dtype)


ARMS: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], str]] = {
    "correctness_brier": (correctness_brier_reward, "strict"),
    "improper": (improper_reward, "no"),
}
