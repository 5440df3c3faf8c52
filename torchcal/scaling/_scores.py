"""Input checks of the calibrators that take a model's probabilities or its logits
(``input="probs"`` / ``"logits"``): :class:`~torchcal.scaling.BetaScaler` and
:class:`~torchcal.scaling.VennAbersCalibrator`."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_binary_target,
    check_class_target,
    check_finite,
    check_floating,
    check_option,
    check_probabilities,
    check_tensor,
    values_checked,
)
from torchcal.functional._validation import check_probability_rows
from torchcal.scaling._base import CalibrationWarning, as_binary_vector

INPUTS = ("probs", "logits")


def check_input(value: str) -> str:
    """The ``input`` option: ``"probs"`` or ``"logits"``."""
    return check_option("input", value, INPUTS)


def check_scores(
    scores: object,
    target: object = None,
    *,
    input: str,
    binary_only: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``scores`` ``(N,)`` (binary; ``(N, 1)`` is squeezed) or ``(N, C)`` (one column per
    class), floating point, non-empty: probabilities in ``[0, 1]`` (rows summing to 1 for
    ``(N, C)``) for ``input="probs"``, finite values for ``"logits"`` (with a warning when
    they look like probabilities); ``target`` (where given) ``(N,)`` 0/1 labels (binary) or
    class indices. Returns the ``(N,)`` / ``(N, C)`` views."""
    scores, target, _ = as_binary_vector(scores, target)
    scores = check_tensor("scores", scores)
    check_floating("scores", scores)
    if scores.dim() not in (1, 2) or (binary_only and scores.dim() != 1):
        want = "(N,) binary scores" if binary_only else "(N,) binary or (N, C) per-class scores"
        raise ValueError(f"scores: expected {want}, got shape {tuple(scores.shape)}")
    if scores.numel() == 0:
        raise ValueError(f"scores: expected a non-empty tensor, got shape {tuple(scores.shape)}")
    if scores.dim() == 2 and scores.shape[1] < 2:
        raise ValueError(
            f"scores: expected at least 2 classes (columns), got shape {tuple(scores.shape)}; "
            f"pass binary scores as shape (N,) or (N, 1)"
        )
    if input == "probs":
        if scores.dim() == 2:
            check_probability_rows("scores", scores, hint=" (pass input='logits' for logits)")
        else:
            check_probabilities("scores", scores)
    else:
        check_finite("scores", scores)
        _warn_if_probabilities(scores)
    if target is None:
        return scores, None
    target = check_tensor("target", target)
    if target.shape != scores.shape[:1]:
        raise ValueError(
            f"target: expected shape {tuple(scores.shape[:1])} (one label per row of scores "
            f"{tuple(scores.shape)}), got {tuple(target.shape)}"
        )
    if scores.dim() == 1:
        check_binary_target("target", target)
    else:
        check_class_target("target", target, scores.shape[1])
    return scores, target


def _warn_if_probabilities(scores: Tensor) -> None:
    """A :class:`~torchcal.scaling.CalibrationWarning` when ``input="logits"`` scores look
    like probabilities (every value in ``[0, 1]``; rows summing to 1 within 1e-4)."""
    if not values_checked() or scores.numel() < 2:
        return
    x = scores.detach()
    lo, hi = torch.aminmax(x)
    if not (float(lo) >= 0.0 and float(hi) <= 1.0):
        return
    if x.dim() == 2 and not bool(((x.sum(1, dtype=torch.float64) - 1).abs() <= 1e-4).all()):
        return
    warnings.warn(
        "scores: every value is in [0, 1]: these look like probabilities, not logits "
        "(pass input='probs')",
        CalibrationWarning,
        stacklevel=4,
    )
