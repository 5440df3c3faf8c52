"""Argument validation shared by every public entry point of torchcal.

Every check raises ``ValueError`` (``TypeError`` only for a wrong Python type of an
option) whose message starts with the argument's name and says what was expected::

    ValueError("target: expected class indices in [0, 9], got 12 at position 3")

Checks on tensor values (finiteness, ranges) cost one reduction each and never synchronise
the device (:func:`~torchcal.functional._checks.check_values`: a device-side assertion on
CUDA and inside ``torch.compile``; on CPU the result is read and a failure is scanned for its
position). They can be switched off for a hot loop that is known to be clean with
:func:`validation_enabled` (``with torchcal.functional.validation_enabled(False): ...``);
shape, dtype and option checks always run.

The generic checks and the value-check switch live in :mod:`torchcal.functional._checks`
and are re-exported here, so every check is imported from this module.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_class_target,
    check_finite,
    check_floating,
    check_int,
    check_nonempty,
    check_number,
    check_open_unit,
    check_option,
    check_probabilities,
    check_tensor,
    check_values,
    first_bad_position,
    first_bad_value,
    labels_ok,
    range_ok,
    sync_free,
    values_checked,
)

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

ENSEMBLE_ESTIMATORS = ("fair", "nrg")


def check_ensemble_estimator(estimator: str) -> str:
    """Ensemble ``estimator``: ``'fair'`` or ``'nrg'``."""
    if estimator in ENSEMBLE_ESTIMATORS:  # the hot path: one test
        return estimator
    return check_option("estimator", estimator, ENSEMBLE_ESTIMATORS)


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
    elif isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        # numbers.Real: Python and NumPy scalars alike (np.float32(0.1) is a number too)
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


# --- calibration readings (R1) ---
def check_group_ids(
    groups: object,
    shape: torch.Size | tuple[int, ...],
    num_groups: int | None,
    *,
    name: str = "groups",
    always: bool = False,
    hint: str = "",
) -> int:
    """The one group check: ``name`` holds integer ids, one per sample (``shape``), in
    ``[0, num_groups)`` (``num_groups=None``: ids ``>= 0``, their number inferred); returns the
    number of groups.

    The range is a value check (skipped with validation off, never a host sync on a device)
    unless ``always``: ids that index a parameter (a scaler's per-group temperature) are always
    checked. ``hint`` ends every message (e.g. the option a callback was built with).
    """
    groups = check_tensor(name, groups)
    if groups.shape != tuple(shape):
        raise ValueError(
            f"{name}: expected one group id per sample, shape {tuple(shape)}, "
            f"got {tuple(groups.shape)}{hint}"
        )
    if groups.is_floating_point() or groups.is_complex() or groups.dtype == torch.bool:
        raise ValueError(
            f"{name}: expected integer group ids (torch.long), got {groups.dtype}{hint}"
        )
    if num_groups is None:
        if groups.numel() == 0:
            raise ValueError(f"{name}: expected a non-empty tensor{hint}")
        if bool((groups < 0).any()):
            pos = first_bad_position(groups < 0)
            raise ValueError(f"{name}: expected group ids >= 0, found a negative id at {pos}{hint}")
        return int(groups.max()) + 1
    check_int("num_groups", num_groups, minimum=1)
    if not groups.numel():
        return num_groups

    def scan() -> None:
        bad = (groups < 0) | (groups >= num_groups)
        pos = first_bad_position(bad)
        val = int(groups.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])])
        raise ValueError(
            f"{name}: expected group ids in [0, {num_groups - 1}], got {val} at position "
            f"{pos}{hint}"
        )

    if always:
        if not bool(labels_ok(groups, num_groups)):
            scan()
    elif values_checked():
        check_values(
            labels_ok(groups, num_groups),
            f"{name}: expected group ids in [0, {num_groups - 1}]{hint}",
            scan,
        )
    return num_groups


def check_probabilities_fast(x: Tensor) -> None:
    """``check_probabilities`` with one fused min/max pass; the slow check only for the message."""
    if not values_checked() or not x.numel():
        return
    check_values(
        range_ok(x, 0.0, 1.0),  # NaN fails both bounds
        "preds: expected probabilities in [0, 1]",
        lambda: check_probabilities("preds", x),
    )


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
    """:func:`~torchcal.functional._checks.check_class_target` of ``target`` (one fused
    ``aminmax`` on the common path)."""
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
    if not values_checked() or not p.numel():
        return
    tol = probability_sum_tolerance(p.dtype, p.shape[1])
    total = p.detach().sum(dim=1, dtype=torch.float64)

    def scan() -> None:
        bad = (total - 1).abs() > tol
        val = float(total.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])])
        raise ValueError(
            f"{name}: expected {what} is 1 (tolerance {tol:.3g}), got {val!r} at "
            f"item {first_bad_position(bad)}{hint}"
        )

    check_values(range_ok(total - 1.0, -tol, tol), f"{name}: expected {what} is 1", scan)


# --- scaling (R2) ---
def check_finite_value(name: str, value: object, *, strict: bool = False) -> float:
    """A finite number ``> 0`` (``strict``) or ``>= 0`` (a regulariser, a prior strength, a
    temperature), returned as a float; ``ValueError("<name>: expected a finite value > 0,
    got ...")`` otherwise."""
    if isinstance(value, (str, bytes, bool)):  # float() would read "0.5" and True
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):  # None, a list, a many-element tensor
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}") from None
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


# --- regression (P) ---
def check_level_grid(name: str, levels: Tensor | Sequence[float]) -> Tensor:
    """Nominal ``levels``: a non-empty 1-d floating tensor (or a sequence, read as float64),
    finite, strictly inside (0, 1) and strictly increasing; returned as a tensor."""
    if not isinstance(levels, Tensor):
        try:
            levels = torch.as_tensor(list(levels), dtype=torch.float64)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise TypeError(
                f"{name}: expected a 1-d tensor or a sequence of floats, got {type(levels).__name__}"
            ) from None
    check_floating(name, levels)
    if levels.dim() != 1 or levels.numel() == 0:
        raise ValueError(
            f"{name}: expected a non-empty 1-d tensor of levels, got shape {tuple(levels.shape)}"
        )
    check_finite(name, levels)
    check_open_unit(name, levels)
    if values_checked() and levels.numel() > 1:
        bad = levels[1:] <= levels[:-1]
        if bool(bad.any()):
            k = int(torch.nonzero(bad)[0, 0])
            raise ValueError(
                f"{name}: expected strictly increasing levels, got {levels[k].item()!r} then "
                f"{levels[k + 1].item()!r} at positions {k}, {k + 1}"
            )
    return levels


def check_sorted_last(name: str, x: Tensor) -> None:
    """``x`` must be non-decreasing along its last dim (quantiles that do not cross)."""
    if not values_checked() or x.shape[-1] < 2 or not x.numel():
        return
    bad = x[..., 1:] < x[..., :-1]  # NaN is caught by the finiteness check before

    def scan() -> None:
        raise ValueError(
            f"{name}: expected values non-decreasing along the last dim (quantiles in the order "
            f"of their levels, not crossing), got a decrease at position {first_bad_position(bad)}"
        )

    check_values(~bad.any(), f"{name}: expected values non-decreasing along the last dim", scan)


def check_interval_bounds(lower: Tensor, upper: Tensor) -> None:
    """``lower <= upper`` everywhere (after broadcasting); the message names ``upper``, as
    :func:`torchcal.functional.interval_score` does."""
    if not values_checked():
        return
    bad = lower > upper

    def scan() -> None:
        raise ValueError(
            f"upper: expected upper >= lower, got upper < lower at position "
            f"{first_bad_position(bad)}"
        )

    check_values(~bad.any(), "upper: expected upper >= lower", scan)


def check_interval_side(name: str, x: Tensor, *, unbounded: float) -> None:
    """An interval bound: no NaN, and infinite only on its own side (``unbounded = -inf``
    for a lower bound, ``+inf`` for an upper bound: no bound on that side)."""
    if not values_checked():
        return
    bad = torch.isnan(x) | (torch.isinf(x) & (x != unbounded))

    def scan() -> None:
        raise ValueError(
            f"{name}: expected finite values or {unbounded} (no bound), found "
            f"{first_bad_value(x, bad).item()!r} at position {first_bad_position(bad)}"
        )

    check_values(~bad.any(), f"{name}: expected finite values or {unbounded} (no bound)", scan)


def values_within(x: Tensor, low: float, high: float, *, strict_low: bool = False) -> bool:
    """Whether every value of the floating ``x`` lies in ``[low, high]`` (``(low, high]`` with
    ``strict_low``; NaN never does), in one ``aminmax`` pass: the fast path of the value
    checks, about 15x cheaper than the elementwise masks; the caller runs the full check (for
    its message) only when this says no. True for an empty ``x`` and with validation off.
    Sync-free (:func:`~torchcal.functional._checks.sync_free`: a CUDA tensor, compiling):
    asserts the range on the device and returns True (no host round trip)."""
    if not values_checked() or x.numel() == 0:
        return True
    ok = range_ok(x, low, high, strict_low=strict_low)
    if sync_free(ok):
        check_values(ok, f"expected values in {'(' if strict_low else '['}{low:g}, {high:g}]")
        return True
    return bool(ok)
