"""Inputs of real-valued forecasts: the shape rule, the compute dtype, location-scale checks.

The contract of :mod:`torchcal.functional.continuous` and :mod:`torchcal.functional.crps`
(see ``docs/design.md``): the forecast's parameters come first and may broadcast *up to*
the target's shape; the target itself is never broadcast. float16/bfloat16 are computed in
float32 (:func:`~torchcal.functional._validation.compute_dtype`). The single-argument
checks (estimator, alpha, levels) live in :mod:`torchcal.functional._validation`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

from torchcal.functional import _checks
from torchcal.functional._checks import (
    check_finite,
    check_floating,
    check_nonempty,
    check_positive,
    check_tensor,
    compute_dtype,
)

_FAST_DTYPES = (torch.float32, torch.float64)
_is_compiling = torch.compiler.is_compiling


def plain_cpu(*xs: object) -> bool:
    """Whether ``xs`` take the scores' fast path: plain CPU tensors (no subclass), one float32 or
    float64 dtype, one non-empty shape, eager (not compiling, no :func:`force_sync_free`). There
    nothing is cast or broadcast, and the value checks read the result once
    (:func:`check_after`) instead of scanning every input (issue 18). Written for the per-call
    cost (it runs before every loss call): :func:`sync_free` inlined, no slice."""
    if _checks._FORCE_SYNC_FREE or _is_compiling():
        return False
    first = xs[0]
    if type(first) is not Tensor:
        return False
    shape, dtype = first.shape, first.dtype
    if dtype not in _FAST_DTYPES or not first.is_cpu or 0 in shape:
        return False
    for x in xs:
        if type(x) is not Tensor or x.dtype is not dtype or x.shape != shape or not x.is_cpu:
            return False
    return True


def check_after(
    result: Tensor,
    reduction: str,
    full_checks: Callable[..., object],
    *args: object,
    extra_ok: Callable[[], bool] | None = None,
) -> None:
    """The value checks of a fast path (CPU eager, :func:`plain_cpu`), read from its result:
    a NaN or an infinity in any input makes the (reduced) result non-finite, so one host read
    of it decides (``reduction='none'``: one sum), with ``extra_ok`` for what the result
    cannot show (e.g. ``scale > 0`` of the CRPS). Only when that fails, ``full_checks(*args)``
    runs the entry point's usual checks, which raise today's messages (naming the argument
    and the position), or return where the inputs were fine and the result overflowed.
    ``full_checks`` and its ``args`` come separately, so the common call builds no closure."""
    if not _checks._VALUE_CHECKS:  # values_checked(), inlined
        return
    total = result.item() if reduction != "none" else result.data.sum().item()
    if not (math.isfinite(total) and (extra_ok is None or extra_ok())):
        full_checks(*args)


_T = TypeVar("_T")


def renamed_keyword(owner: str, new: str, value: _T, old: str, old_value: _T | None) -> _T:
    """The value of keyword ``new`` of ``owner`` where ``old`` is its deprecated alias (kept
    for one release): ``old_value`` when only the alias was given (with a ``FutureWarning``
    naming ``new``), ``value`` otherwise (``None`` when neither was); both given raise a
    ``ValueError`` naming both."""
    if old_value is None:
        return value
    if value is not None:
        raise ValueError(f"{owner}: got both {new}= and its deprecated alias {old}=; pass {new}=")
    warnings.warn(
        f"{owner}({old}=...) is deprecated and will be removed in the next release; use {new}=...",
        FutureWarning,
        stacklevel=3,
    )
    return old_value


def gaussian_spread(
    owner: str, spread: Tensor | None, var: Tensor | None, sd: Tensor | None, positional: str
) -> tuple[Tensor, bool]:
    """``(spread tensor, is_variance)`` of a Gaussian forecast given as ``spread`` (read as
    ``positional``: ``"var"`` or ``"sd"``) or by name, ``var=`` (the variance) or ``sd=``
    (the standard deviation): exactly one of the three. ``var=`` with ``sd=`` raise a
    ``ValueError`` naming both; a positional spread with a named one a ``TypeError`` (as
    Python's "multiple values"); none a ``TypeError``. Never guessed from the values."""
    if var is not None and sd is not None:
        raise ValueError(
            f"{owner}: got both var= and sd=; give the spread once, as the variance (var=) "
            f"or as the standard deviation (sd=)"
        )
    named = "var" if var is not None else "sd" if sd is not None else None
    if named is not None:
        if spread is not None:
            raise TypeError(
                f"{owner}: got the spread twice, positionally and as {named}=; the forecast "
                f"comes first and the target last: (loc, target=..., {named}=...) or "
                f"(loc, spread, target)"
            )
        given = var if named == "var" else sd
        assert given is not None  # for the type checker: named says which one is set
        return given, named == "var"
    if spread is None:
        raise TypeError(
            f"{owner}: missing the spread: pass var= (the variance) or sd= (the standard deviation)"
        )
    return spread, positional == "var"


def broadcast_or_none(shapes: Sequence[Sequence[int]]) -> torch.Size | None:
    """``torch.broadcast_shapes(*shapes)``, or ``None`` where they do not broadcast.

    Pure Python over the sizes: ``torch.broadcast_shapes`` costs about 100 us a call on a busy
    CPU, more than a whole small-batch score (issue 18)."""
    out: list[int] = []
    for shape in shapes:
        if len(shape) > len(out):
            out = [1] * (len(shape) - len(out)) + out
        offset = len(out) - len(shape)
        for i, size in enumerate(shape):
            have = out[offset + i]
            if have == 1:
                out[offset + i] = size
            elif size != 1 and size != have:
                return None
    return torch.Size(out)


def check_target_shape(
    target_shape: torch.Size, forecast: Sequence[tuple[str, torch.Size]], what: str = ""
) -> None:
    """The forecast shapes must broadcast to ``target_shape``; the target is never broadcast.

    ``forecast`` holds (name, shape) pairs already compared with the target's shape
    (e.g. without the ensemble dimension); ``what`` says which part of the target's
    shape is meant in the message.
    """
    shape: torch.Size | None = torch.Size([])
    for i, (name, s) in enumerate(forecast):
        shape = broadcast_or_none([shape, s])
        if shape is None:
            others = ", ".join(f"{n} {tuple(t)}" for n, t in forecast[:i])
            raise ValueError(
                f"{name}: expected a shape broadcastable with {others}, got {tuple(s)}"
            )
    if broadcast_or_none([shape, target_shape]) != target_shape:
        names = ", ".join(f"{n} {tuple(s)}" for n, s in forecast)
        raise ValueError(
            f"target: expected {what}shape {tuple(target_shape)} to match the "
            f"forecast ({names}); the forecast may broadcast to the target's "
            f"shape, the target is never broadcast (an (N, 1) target against "
            f"(N,) predictions would score all N x N pairs)"
        )


def cast_forecast(
    named: Sequence[tuple[str, Tensor]],
    options: Sequence[tuple[str, Tensor]] = (),
    *,
    finite: Sequence[str] | None = None,
) -> list[Tensor]:
    """Validate floating, non-empty, finite, mutually broadcastable tensors; cast them.

    The compute dtype is torch's promotion of the ``named`` tensors, at least float32;
    ``options`` (e.g. levels) are validated alike and cast to it without promoting it.
    ``finite`` names the tensors whose finiteness is checked here (default: all; a caller that
    reads non-finite values from its own result checks the others after it).
    Returns the cast tensors (not broadcast), ``named`` first.
    """
    everything = list(named) + list(options)
    for name, x in everything:
        check_floating(name, x)
        check_nonempty(name, x)
    shape = everything[0][1].shape
    for name, x in everything[1:]:
        joint = broadcast_or_none([shape, x.shape])
        if joint is None:
            others = ", ".join(n for n, _ in everything if n != name)
            raise ValueError(
                f"{name}: expected a shape broadcastable with {others} "
                f"{tuple(shape)}, got {tuple(x.shape)}"
            )
        shape = joint
    for name, x in everything:
        if finite is None or name in finite:
            check_finite(name, x)
    dtype = named[0][1].dtype
    for _, x in named[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    dtype = compute_dtype(dtype)
    return [x.to(dtype) for _, x in everything]


def check_location_scale(
    loc: Tensor,
    scale: Tensor,
    target: Tensor,
    scale_name: str = "scale",
    *,
    finite_after: bool = False,
) -> list[Tensor]:
    """Validate and cast ``(loc, scale, target)`` of a location-scale forecast, target last;
    ``scale`` must be > 0 (and finite). With ``finite_after`` the finiteness of ``loc`` and
    ``target`` is left to the caller, who reads it from its own result (a NaN or an infinity
    makes it non-finite) and then calls :func:`check_finite` on them: one pass less over each."""
    for name, x in (("loc", loc), (scale_name, scale), ("target", target)):
        check_tensor(name, x)
    named = [("loc", loc), (scale_name, scale), ("target", target)]
    out = cast_forecast(named, finite=[] if finite_after else None)  # scale: check_positive
    check_target_shape(target.shape, [("loc", loc.shape), (scale_name, scale.shape)])
    check_positive(scale_name, out[1])
    return out
