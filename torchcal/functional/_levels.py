r"""Miscoverage ``alpha`` and confidence ``1 - alpha`` read as exact fractions (docs/design.md
section 6e, "Stated levels").

**A float** ``x`` in ``(0, 1)`` is read as the fraction of smallest denominator among

- the fractions that round to ``x`` in its own precision (the simplest one of its rounding
  interval: ``0.7`` is ``7/10``, ``1/3`` is ``1/3``, ``np.float32(0.1)`` is ``1/10``; every
  decimal of up to 7 significant digits reads as itself, as written), and
- ``1 - c`` for every float ``c`` with ``fl(1 - c) == x`` (in ``x``'s precision), ``c`` read as
  above: ``1 - 0.8 = 0.19999999999999996`` is ``1/5``, ``1 - 0.99`` is ``1/100``, the forms a
  user writes for ``alpha = 1 - confidence`` (crepes' own grid does), within the one rounding
  of the subtraction (a few ulps of ``x``; up to ``eps / 2`` absolute near 0).

A :class:`~fractions.Fraction` or :class:`~decimal.Decimal` is taken as it is; a one-element
floating tensor or a numpy float in its own precision. ``confidence=c`` reads ``c`` by the same
rule and gives ``alpha = 1 - c`` exactly, so ``confidence=c`` and ``alpha=1 - c`` give the same
rank on every ``n`` (tested over crepes' grid).
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from numbers import Real

import torch
from torch import Tensor

__all__: list[str] = []


def _simplest_between(lo: Fraction, hi: Fraction) -> Fraction:
    """The fraction of smallest denominator in ``[lo, hi]`` (``0 <= lo <= hi``)."""
    fl = math.floor(lo)
    if fl == lo:
        return Fraction(fl)
    if fl + 1 <= hi:
        return Fraction(fl + 1)
    return fl + 1 / _simplest_between(1 / (hi - fl), 1 / (lo - fl))


def _as_float(name: str, value: object) -> tuple[float, torch.dtype] | Fraction:
    """``value`` as (float, its precision as a torch dtype), or an exact Fraction."""
    if isinstance(value, Tensor):
        if value.numel() != 1 or not value.is_floating_point():
            raise TypeError(
                f"{name}: expected a float or a one-element floating tensor, got a tensor of "
                f"shape {tuple(value.shape)} and dtype {value.dtype}"
            )
        return float(value.detach().cpu().reshape(())), value.dtype
    if isinstance(value, (Fraction, Decimal)):
        return Fraction(value)
    if isinstance(value, Real) and not isinstance(value, (bool, int)):
        size = getattr(getattr(value, "dtype", None), "itemsize", 8)
        kind = {2: torch.float16, 4: torch.float32}.get(size, torch.float64)
        return float(value), kind
    raise TypeError(f"{name}: expected a float, got {type(value).__name__}")


def _neighbours(x: float, kind: torch.dtype) -> tuple[float, float]:
    if kind == torch.float64:
        return math.nextafter(x, -1.0), math.nextafter(x, 2.0)
    t = torch.tensor(x, dtype=kind)
    return (
        float(torch.nextafter(t, torch.tensor(-1.0, dtype=kind))),
        float(torch.nextafter(t, torch.tensor(2.0, dtype=kind))),
    )


def _rounding_interval(x: float, kind: torch.dtype) -> tuple[Fraction, Fraction]:
    """The reals that round to ``x`` in precision ``kind`` (up to the tie at its ends)."""
    down, up = _neighbours(x, kind)
    fx = Fraction(x)
    return (fx + Fraction(down)) / 2, (fx + Fraction(up)) / 2


def _rounding_simplest(x: float, kind: torch.dtype) -> Fraction:
    """The simplest fraction that rounds to ``x`` in precision ``kind``."""
    frac = _simplest_between(*_rounding_interval(x, kind))
    return frac if 0 < frac < 1 else Fraction(x)


def _to_kind(x: float, kind: torch.dtype) -> float:
    return x if kind == torch.float64 else float(torch.tensor(x, dtype=kind))


def _one_minus(x: float, kind: torch.dtype) -> float:
    """``fl(1 - x)`` in precision ``kind``."""
    if kind == torch.float64:
        return 1.0 - x
    return float(torch.tensor(1.0, dtype=kind) - torch.tensor(x, dtype=kind))


def _complement_reading(x: float, kind: torch.dtype) -> Fraction | None:
    """``1 - R(c)`` for the float ``c`` with ``fl(1 - c) == x`` whose reading ``R(c)`` is
    simplest (``None`` where none is found): the ``c`` lie in ``1 - (x's rounding interval)``,
    and a fraction reads as such a ``c`` within half an ulp of ``c`` beyond it."""
    lo, hi = _rounding_interval(x, kind)
    c_lo, c_hi = 1 - hi, 1 - lo
    top = _to_kind(float(c_hi), kind)
    half_ulp = (Fraction(_neighbours(top, kind)[1]) - Fraction(top)) / 2
    f = _simplest_between(max(c_lo - half_ulp, Fraction(0)), c_hi + half_ulp)
    c = _to_kind(float(f), kind)
    if not (0 < c < 1 and _one_minus(c, kind) == x):
        return None
    return 1 - _rounding_simplest(c, kind)


def level_fraction(name: str, value: object) -> Fraction:
    """``value`` in ``(0, 1)`` as an exact fraction (see the module docstring)."""
    got = _as_float(name, value)
    if isinstance(got, Fraction):
        if not 0 < got < 1:
            raise ValueError(f"{name}: expected a value in the open interval (0, 1), got {value}")
        return got
    x, kind = got
    if not (math.isfinite(x) and 0 < x < 1):
        raise ValueError(f"{name}: expected a value in the open interval (0, 1), got {x!r}")
    best = _rounding_simplest(x, kind)
    other = _complement_reading(x, kind)
    if other is not None and 0 < other < 1 and other.denominator < best.denominator:
        return other
    return best


def alpha_fraction(alpha: object) -> Fraction:
    """``alpha`` in ``(0, 1)`` as an exact fraction (see :mod:`torchcal.functional._levels`)."""
    return level_fraction("alpha", alpha)


def miscoverage(
    alpha: object | None, confidence: object | None, default: object = None
) -> Fraction:
    """The miscoverage from exactly one of ``alpha`` and ``confidence`` (``1 - confidence``,
    the confidence read as written); ``default`` (an alpha) where neither is given."""
    if alpha is not None and confidence is not None:
        raise ValueError("confidence: given together with alpha (pass one of them)")
    if confidence is not None:
        return 1 - level_fraction("confidence", confidence)
    if alpha is None:
        if default is None:
            raise ValueError("alpha: expected alpha or confidence, got neither")
        alpha = default
    return alpha_fraction(alpha)
