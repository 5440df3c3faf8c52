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
import math
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
    "check_bool",
    "check_number",
    "check_label_smoothing",
    "check_gamma",
    "check_kernel_width",
    "check_norm_power",
    "ESTIMATORS",
    "check_estimator",
    "check_ensemble_size",
    "check_alpha",
    "check_levels",
    "HALF_DTYPES",
    "compute_dtype",
    "check_open_unit",
    "first_bad_position",
    "first_bad_value",
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
    check_finite(name, x)
    if not _VALUE_CHECKS:
        return
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


# ------------------------------------------------------------------ options of the losses


def check_label_smoothing(label_smoothing: float) -> float:
    """``label_smoothing`` must be a number in [0, 1)."""
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
        raise TypeError(f"label_smoothing: expected a number, got {type(label_smoothing).__name__}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing: expected a number in [0, 1), got {label_smoothing!r}")
    return float(label_smoothing)


def check_gamma(gamma: float | str) -> float | str:
    """Focal ``gamma``: a finite number >= 0, or ``'adaptive'`` (FLSD-53)."""
    if isinstance(gamma, str):
        if gamma != "adaptive":
            raise ValueError(f"gamma: expected a number >= 0 or 'adaptive', got {gamma!r}")
        return gamma
    return check_number("gamma", gamma, expected="a number or 'adaptive'")


def check_kernel_width(width: float) -> float:
    """MMCE kernel ``width``: a finite number >= 1e-3 (float64 range of its exponentials)."""
    width = check_number("width", width, strict=True)
    if width < 1e-3:
        raise ValueError(f"width: expected a kernel width >= 1e-3, got {width!r}")
    return width


def check_norm_power(name: str, value: float) -> float:
    """The power ``p`` of an L^p norm: a finite number >= 1."""
    value = check_number(name, value, strict=True)
    if value < 1:
        raise ValueError(f"{name}: expected a number >= 1, got {value!r}")
    return value


# ------------------------------------------------------------ real-valued forecasts
# Option checks of torchcal.functional.continuous / crps (their shape and dtype rules:
# torchcal.functional._forecast).

ESTIMATORS = ("fair", "nrg")


def check_estimator(estimator: str) -> str:
    """Ensemble ``estimator``: ``'fair'`` or ``'nrg'``."""
    check_option("estimator", estimator, ESTIMATORS)
    return estimator


def check_ensemble_size(m: int, estimator: str) -> None:
    """The fair estimator needs at least 2 members."""
    if estimator == "fair" and m < 2:
        raise ValueError(
            f"samples: the fair estimator (estimator='fair') needs at least 2 "
            f"ensemble members, got {m}; use estimator='nrg' for a single member"
        )


def check_alpha(alpha: float | Tensor) -> float | Tensor:
    """``alpha``: a number or a non-empty floating tensor, strictly inside (0, 1)."""
    if isinstance(alpha, Tensor):
        check_floating("alpha", alpha)
        check_nonempty("alpha", alpha)
        check_finite("alpha", alpha)
    elif isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha: expected a float or a tensor, got {type(alpha).__name__}")
    check_open_unit("alpha", alpha)
    return alpha if isinstance(alpha, Tensor) else float(alpha)


def check_levels(quantiles: Tensor | Sequence[float]) -> Tensor:
    """``quantiles``: a non-empty 1-d tensor (or sequence) of levels in (0, 1)."""
    if not isinstance(quantiles, Tensor):
        try:
            quantiles = torch.as_tensor(list(quantiles), dtype=torch.float64)
        except (TypeError, ValueError):
            raise TypeError(
                "quantiles: expected a 1-d tensor or a sequence of floats, got "
                f"{type(quantiles).__name__}"
            ) from None
    check_floating("quantiles", quantiles)
    if quantiles.dim() != 1 or quantiles.numel() == 0:
        raise ValueError(
            f"quantiles: expected a non-empty 1-d tensor of levels, got shape "
            f"{tuple(quantiles.shape)}"
        )
    check_finite("quantiles", quantiles)
    check_open_unit("quantiles", quantiles)
    return quantiles


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


# --- calibration readings (R1) ---
def check_group_ids(groups: Tensor, shape: torch.Size, num_groups: int | None) -> int:
    """``groups``: integer ids of ``shape`` in ``[0, num_groups)`` (``num_groups=None``: ids
    ``>= 0``, their number inferred); returns the number of groups."""
    check_tensor("groups", groups)
    if groups.shape != shape:
        raise ValueError(
            f"groups: expected one group id per sample, shape {tuple(shape)}, "
            f"got {tuple(groups.shape)}"
        )
    if groups.is_floating_point() or groups.is_complex() or groups.dtype == torch.bool:
        raise ValueError(f"groups: expected integer group ids (torch.long), got {groups.dtype}")
    if num_groups is None:
        if groups.numel() == 0:
            raise ValueError("groups: expected a non-empty tensor")
        if bool((groups < 0).any()):
            pos = first_bad_position(groups < 0)
            raise ValueError(f"groups: expected group ids >= 0, found a negative id at {pos}")
        return int(groups.max()) + 1
    check_int("num_groups", num_groups, minimum=1)
    if values_checked():
        bad = (groups < 0) | (groups >= num_groups)
        if bool(bad.any()):
            pos = first_bad_position(bad)
            val = int(groups.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])])
            raise ValueError(
                f"groups: expected group ids in [0, {num_groups - 1}], got {val} at position {pos}"
            )
    return num_groups


def check_probabilities_fast(x: Tensor) -> None:
    """``check_probabilities`` with one fused min/max pass; the slow check only for the message."""
    if not values_checked():
        return
    lo, hi = torch.aminmax(x)
    if not bool((lo >= 0) & (hi <= 1)):  # NaN fails both
        check_probabilities("preds", x)


def probability_sum_tolerance(dtype: torch.dtype, num_classes: int) -> float:
    """Tolerance on ``|sum_c p_c - 1|`` for a row of probabilities: ``max(1e-4, C * eps)``
    of the dtype (every probability-row check uses it):
    1e-4 for float64 and for float32 up to C = 838, ``C * 2^-7`` for bfloat16."""
    return max(1e-4, num_classes * torch.finfo(dtype).eps)


def check_optional_int(name: str, value: object) -> int | None:
    """``value`` must be a Python int (not a bool) or ``None`` (e.g. an optional
    ``ignore_index``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int or None, got {type(value).__name__}")
    return value


def check_class_target_fast(target: Tensor, num_classes: int, ignore_index: int | None) -> None:
    """``check_class_target`` with one fused ``aminmax`` on the common path."""
    if (
        values_checked()
        and target.numel()
        and not target.is_floating_point()
        and target.dtype != torch.bool
        and not target.is_complex()
    ):
        lo, hi = torch.aminmax(target)
        if bool((lo >= 0) & (hi < num_classes)):
            return
    check_class_target("target", target, num_classes, ignore_index=ignore_index)


def check_probability_rows(
    name: str,
    p: Tensor,
    *,
    what: str = "probabilities whose sum over the classes (dim 1)",
    hint: str = "",
) -> None:
    """``(N, C, *)`` values in [0, 1] with sums over dim 1 (in float64) equal to 1 within
    :func:`probability_sum_tolerance`; the message names ``what`` and ends with ``hint``."""
    check_probabilities(name, p)
    if not values_checked():
        return
    tol = probability_sum_tolerance(p.dtype, p.shape[1])
    total = p.sum(dim=1, dtype=torch.float64)
    bad = (total - 1).abs() > tol
    if bool(bad.any()):
        val = float(total.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])])
        raise ValueError(
            f"{name}: expected {what} is 1 (tolerance {tol:.3g}), got {val!r} at "
            f"item {first_bad_position(bad)}{hint}"
        )


# --- scaling (R2) ---
def check_finite_value(name: str, value: object, *, strict: bool = False) -> float:
    """A finite number ``> 0`` (``strict``) or ``>= 0`` (a regulariser, a prior strength, a
    temperature), returned as a float; ``ValueError("<name>: expected a finite value > 0,
    got ...")`` otherwise."""
    v = float(value)  # type: ignore[arg-type]
    if not (math.isfinite(v) and (v > 0 if strict else v >= 0)):
        raise ValueError(
            f"{name}: expected a finite value {'>' if strict else '>='} 0, got {value!r}"
        )
    return v


def check_temperature_bounds(name: str, bounds: Sequence[float]) -> tuple[float, float]:
    """``(t_min, t_max)`` with ``0 < t_min < t_max < inf``, returned as floats."""
    lo, hi = (float(b) for b in bounds)
    if not (0.0 < lo < hi < math.inf):
        raise ValueError(f"{name}: expected 0 < t_min < t_max < inf, got {bounds!r}")
    return lo, hi


def check_group_index(
    name: str, groups: object, n: int, num_groups: int, device: torch.device
) -> Tensor:
    """One integer group id per row in ``[0, num_groups - 1]`` (always checked: the ids index
    a parameter); returned as ``torch.long`` on ``device``."""
    groups = check_tensor(name, groups)
    if groups.shape != (n,):
        raise ValueError(
            f"{name}: expected shape ({n},) (one group id per row), got {tuple(groups.shape)}"
        )
    if groups.is_floating_point() or groups.is_complex() or groups.dtype == torch.bool:
        raise ValueError(f"{name}: expected integer group ids, got dtype {groups.dtype}")
    groups = groups.detach().to(device=device, dtype=torch.long)
    bad = (groups < 0) | (groups >= num_groups)
    if bool(bad.any()):
        pos = int(torch.nonzero(bad)[0, 0])
        raise ValueError(
            f"{name}: expected group ids in [0, {num_groups - 1}], got "
            f"{int(groups[pos])} at position {pos}"
        )
    return groups
