"""The generic argument checks of torchcal (Python types, tensor types and shapes, value
ranges), the switch of the value checks (:func:`validation_enabled`) and :func:`reduce`.

Re-exported, with the option checks of the losses, forecasts, readings and scaling, by
:mod:`torchcal.functional._validation`, the module every entry point imports them from (its
docstring states the message convention).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

__all__ = [
    "REDUCTIONS",
    "HALF_DTYPES",
    "validation_enabled",
    "values_checked",
    "first_bad_position",
    "first_bad_value",
    "check_option",
    "check_reduction",
    "check_tensor",
    "check_floating",
    "check_nonempty",
    "check_finite",
    "check_same_shape",
    "check_probabilities",
    "check_positive",
    "check_binary_target",
    "check_class_target",
    "check_int",
    "check_bool",
    "check_number",
    "check_open_unit",
    "compute_dtype",
    "reduce",
]

REDUCTIONS = ("mean", "sum", "none")
HALF_DTYPES = (torch.float16, torch.bfloat16)

_VALUE_CHECKS = True


@contextlib.contextmanager
def validation_enabled(enabled: bool = True) -> Iterator[None]:
    """Turn the value checks (NaN/Inf, ranges) on or off inside a ``with`` block.

    Example:
        >>> import torch
        >>> from torchcal.functional import log_score, validation_enabled
        >>> with validation_enabled(False):
        ...     loss = log_score(torch.zeros(4, 3), torch.tensor([0, 1, 2, 0]))
    """
    global _VALUE_CHECKS
    previous = _VALUE_CHECKS
    _VALUE_CHECKS = bool(enabled)
    try:
        yield
    finally:
        _VALUE_CHECKS = previous


def values_checked() -> bool:
    """Whether value checks (NaN/Inf, ranges) are currently on."""
    return _VALUE_CHECKS


def first_bad_position(bad: Tensor) -> str:
    """Human-readable index of the first ``True`` in a boolean tensor (e.g. ``(3, 1)``)."""
    flat = int(torch.nonzero(bad.reshape(-1), as_tuple=False)[0, 0])
    if bad.dim() <= 1:
        return str(flat)
    idx = []
    for size in reversed(bad.shape):
        idx.append(flat % size)
        flat //= size
    return "(" + ", ".join(str(i) for i in reversed(idx)) + ")"


def first_bad_value(x: Tensor, bad: Tensor) -> Tensor:
    """The element of ``x`` at the first ``True`` of ``bad`` (same shape), as a 0-d tensor."""
    return x.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])]


def check_option(name: str, value: object, choices: Sequence[object]) -> object:
    """``value`` must be one of ``choices``; returned unchanged."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)!r}, got {value!r}")
    return value


def check_reduction(reduction: str) -> str:
    """``reduction`` must be 'mean', 'sum' or 'none'; returned unchanged."""
    check_option("reduction", reduction, REDUCTIONS)
    return reduction


def check_tensor(name: str, x: object) -> Tensor:
    """``x`` must be a ``torch.Tensor``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def check_floating(name: str, x: Tensor) -> None:
    """``x`` must have a floating dtype."""
    check_tensor(name, x)
    if not x.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")


def check_nonempty(name: str, x: Tensor) -> None:
    """``x`` must hold at least one element."""
    check_tensor(name, x)
    if x.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(x.shape)}")


def check_finite(name: str, x: Tensor, *, allow_neg_inf: bool = False) -> None:
    """``x`` must hold no NaN and no +-Inf (``-inf`` allowed as a mask if asked)."""
    if not _VALUE_CHECKS or not x.is_floating_point():
        return
    # Fast path, one reduction: a NaN or an infinity makes the sum non-finite (and a NaN or +inf
    # makes the max NaN or +inf), so a finite sum (a max below +inf) proves every value finite
    # (below +inf). The element-wise scan below runs only when this fails (a bad value, or a sum
    # of finite values that overflows), to decide and to name the position.
    if allow_neg_inf:
        if not x.numel() or bool(x.amax() < float("inf")):  # False for NaN and +inf
            return
    elif bool(torch.isfinite(x.sum())):
        return
    if allow_neg_inf:
        bad = torch.isnan(x) | (x == float("inf"))
        what = "NaN or +Inf"
    else:
        bad = ~torch.isfinite(x)
        what = "NaN or Inf"
    if bool(bad.any()):
        raise ValueError(
            f"{name}: expected finite values, found {what} at position {first_bad_position(bad)}"
        )


def check_same_shape(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    """``a`` and ``b`` must have exactly the same shape."""
    if a.shape != b.shape:
        raise ValueError(
            f"{name_b}: expected the shape of {name_a} {tuple(a.shape)}, got {tuple(b.shape)}"
        )


def check_probabilities(name: str, x: Tensor) -> None:
    """``x`` must be finite and in [0, 1]."""
    check_floating(name, x)
    if not _VALUE_CHECKS:
        return
    bad = ~((x >= 0) & (x <= 1))  # NaN fails both comparisons
    if bool(bad.any()):
        pos = first_bad_position(bad)
        val = first_bad_value(x, bad).item()
        raise ValueError(f"{name}: expected probabilities in [0, 1], got {val!r} at position {pos}")


def check_positive(name: str, x: Tensor, *, strict: bool = True) -> None:
    """``x`` must be finite and > 0 (or >= 0 with ``strict=False``)."""
    if not _VALUE_CHECKS:
        return
    if x.numel() and x.is_floating_point():
        # one reduction decides (a NaN fails both comparisons); the scans only on failure
        least, most = torch.aminmax(x)
        if (bool(least > 0) if strict else bool(least >= 0)) and bool(most < float("inf")):
            return
    check_finite(name, x)
    bad = x <= 0 if strict else x < 0
    if bool(bad.any()):
        pos = first_bad_position(bad)
        val = first_bad_value(x, bad).item()
        rel = "> 0" if strict else ">= 0"
        raise ValueError(f"{name}: expected values {rel}, got {val!r} at position {pos}")


def check_binary_target(name: str, target: Tensor, *, ignore_index: int | None = None) -> None:
    """``target`` must hold only 0 and 1 (and ``ignore_index`` where given)."""
    check_tensor(name, target)
    if not _VALUE_CHECKS:
        return
    bad = (target != 0) & (target != 1)
    if ignore_index is not None:
        bad &= target != ignore_index
    if bool(bad.any()):
        pos = first_bad_position(bad)
        val = first_bad_value(target, bad).item()
        raise ValueError(
            f"{name}: expected binary labels in {{0, 1}}, got {val!r} at position {pos}"
        )


def check_class_target(
    name: str, target: Tensor, num_classes: int, *, ignore_index: int | None = None
) -> None:
    """``target`` must be an integer tensor of class indices in ``[0, num_classes - 1]``."""
    check_tensor(name, target)
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise ValueError(
            f"{name}: expected integer class indices (torch.long), got dtype "
            f"{target.dtype}; for binary targets pass logits of the target's shape"
        )
    if not _VALUE_CHECKS:
        return
    bad = (target < 0) | (target >= num_classes)
    if ignore_index is not None:
        bad &= target != ignore_index
    if bool(bad.any()):
        pos = first_bad_position(bad)
        val = int(first_bad_value(target, bad))
        raise ValueError(
            f"{name}: expected class indices in [0, {num_classes - 1}], got {val} at position {pos}"
        )


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` must be a Python int (not a bool), ``>= minimum`` where given."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    """``value`` must be a Python bool (a flag such as ``multilabel`` or ``squared``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return value


def check_number(
    name: str,
    value: object,
    *,
    minimum: float = 0.0,
    strict: bool = False,
    expected: str = "a number",
) -> float:
    """``value`` must be a finite Python number (not a bool) ``>= minimum`` (``> minimum``
    with ``strict=True``); returned as a float. ``expected`` names the accepted types in
    the ``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected {expected}, got {type(value).__name__}")
    if not (math.isfinite(value) and (value > minimum if strict else value >= minimum)):
        rel = ">" if strict else ">="
        raise ValueError(f"{name}: expected a finite number {rel} {minimum:g}, got {value!r}")
    return float(value)


def check_open_unit(name: str, value: float | Tensor) -> None:
    """``value`` (number or tensor) must lie strictly inside (0, 1)."""
    if isinstance(value, Tensor):
        if not _VALUE_CHECKS:
            return
        bad = ~((value > 0) & (value < 1))
        if bool(bad.any()):
            pos = first_bad_position(bad)
            raise ValueError(
                f"{name}: expected values in the open interval (0, 1), bad value at position {pos}"
            )
        return
    if not (0.0 < float(value) < 1.0):
        raise ValueError(f"{name}: expected a value in the open interval (0, 1), got {value!r}")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a score is computed (and returned) in: float16/bfloat16 -> float32."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def reduce(loss: Tensor, reduction: str, weight: Tensor | None = None) -> Tensor:
    """Reduce per-item ``loss`` like ``F.cross_entropy``.

    ``weight`` (same shape as ``loss``, zero for ignored items) makes 'mean' the
    weighted mean ``sum(w * l) / sum(w)`` and 'sum' the weighted sum; 'none'
    returns ``w * l``.
    """
    if weight is not None:
        loss = loss * weight
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        if weight is None:
            return loss.mean()
        return loss.sum() / weight.sum()
    check_reduction(reduction)
    raise AssertionError("unreachable")
