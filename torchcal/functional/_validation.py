"""Argument validation shared by every public entry point of torchcal.

Every check raises ``ValueError`` (``TypeError`` only for a wrong Python type of an
option) whose message starts with the argument's name and says what was expected::

    ValueError("target: expected class indices in [0, 9], got 12 at position 3")

Checks on tensor values (finiteness, ranges) cost one reduction and one host sync
each. They can be switched off for a hot loop that is known to be clean with
:func:`validation_enabled` (``with torchcal.functional.validation_enabled(False): ...``);
shape, dtype and option checks always run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

__all__ = [
    "REDUCTIONS",
    "validation_enabled",
    "values_checked",
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
    "check_open_unit",
    "first_bad_position",
    "reduce",
]

REDUCTIONS = ("mean", "sum", "none")

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


def check_option(name: str, value: object, choices: Sequence[object]) -> None:
    """``value`` must be one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)!r}, got {value!r}")


def check_reduction(reduction: str) -> None:
    """``reduction`` must be 'mean', 'sum' or 'none'."""
    check_option("reduction", reduction, REDUCTIONS)


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
    if allow_neg_inf:
        bad = torch.isnan(x) | (x == float("inf"))
        what = "NaN or +Inf"
    else:
        bad = ~torch.isfinite(x)
        what = "NaN or Inf"
    if bool(bad.any()):
        raise ValueError(f"{name}: expected finite values, found {what} at position "
                         f"{first_bad_position(bad)}")


def check_same_shape(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    """``a`` and ``b`` must have exactly the same shape."""
    if a.shape != b.shape:
        raise ValueError(f"{name_b}: expected the shape of {name_a} {tuple(a.shape)}, "
                         f"got {tuple(b.shape)}")


def check_probabilities(name: str, x: Tensor) -> None:
    """``x`` must be finite and in [0, 1]."""
    check_floating(name, x)
    if not _VALUE_CHECKS:
        return
    bad = ~((x >= 0) & (x <= 1))  # NaN fails both comparisons
    if bool(bad.any()):
        pos = first_bad_position(bad)
        val = x.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])].item()
        raise ValueError(f"{name}: expected probabilities in [0, 1], got {val!r} at position {pos}")


def check_positive(name: str, x: Tensor, *, strict: bool = True) -> None:
    """``x`` must be finite and > 0 (or >= 0 with ``strict=False``)."""
    check_finite(name, x)
    if not _VALUE_CHECKS:
        return
    bad = x <= 0 if strict else x < 0
    if bool(bad.any()):
        pos = first_bad_position(bad)
        val = x.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])].item()
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
        val = target.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])].item()
        raise ValueError(f"{name}: expected binary labels in {{0, 1}}, got {val!r} at position {pos}")


def check_class_target(name: str, target: Tensor, num_classes: int, *,
                       ignore_index: int | None = None) -> None:
    """``target`` must be an integer tensor of class indices in ``[0, num_classes - 1]``."""
    check_tensor(name, target)
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise ValueError(f"{name}: expected integer class indices (torch.long), got dtype "
                         f"{target.dtype}; for binary targets pass logits of the target's shape")
    if not _VALUE_CHECKS:
        return
    bad = (target < 0) | (target >= num_classes)
    if ignore_index is not None:
        bad &= target != ignore_index
    if bool(bad.any()):
        pos = first_bad_position(bad)
        val = int(target.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])])
        raise ValueError(f"{name}: expected class indices in [0, {num_classes - 1}], got {val} "
                         f"at position {pos}")


def check_int(name: str, value: object, *, minimum: int) -> int:
    """``value`` must be a Python int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def check_open_unit(name: str, value: float | Tensor) -> None:
    """``value`` (number or tensor) must lie strictly inside (0, 1)."""
    if isinstance(value, Tensor):
        if not _VALUE_CHECKS:
            return
        bad = ~((value > 0) & (value < 1))
        if bool(bad.any()):
            pos = first_bad_position(bad)
            raise ValueError(f"{name}: expected values in the open interval (0, 1), "
                             f"bad value at position {pos}")
        return
    if not (0.0 < float(value) < 1.0):
        raise ValueError(f"{name}: expected a value in the open interval (0, 1), got {value!r}")


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
