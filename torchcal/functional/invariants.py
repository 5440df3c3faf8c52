"""What a monotone map of scores keeps in floating point, checked exactly.

A temperature (``x / T``), a Platt map ``a * x + b`` with ``a > 0`` or per-group temperatures
are increasing functions in exact arithmetic, so they keep every ranking, every top-1 and (for
``x / T``) every decision at logit 0. In floating point the map is only *weakly* monotone:
two scores one ulp apart can round to the same value after ``/ T`` (a tie the map created),
but a correctly rounded monotone operation never puts them in the opposite order. So the
checks here assert what floating point guarantees (see ``docs/design.md``, section 6):

* no strict inversion: along the *stable* sort order of the original scores, the mapped
  scores never decrease;
* no broken tie: scores that were equal stay equal;
* every decision at logit 0 unchanged (the sign of every score; optional, since a Platt
  offset moves the threshold on purpose);
* every original top-1 (each position holding the row maximum) is still among the maxima of
  the mapped row;

and count what floating point may do: the ties the map created, with the largest original
gap between two merged neighbours in ulps of the original dtype. A single correctly rounded
multiply or divide (``x / T``, ``x * (1 / T)``) can only merge neighbours less than 2 ulps
apart; the default bound of 4 ulps leaves room for a map of two rounded operations, and
anything wider means the map is not the monotone map it claims to be.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_floating,
    check_nonempty,
    check_same_shape,
    first_bad_position,
)

__all__ = ["MonotoneMapCheck", "check_monotone_map", "ulp_distance"]

_INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


@dataclass(frozen=True)
class MonotoneMapCheck:
    """The result of :func:`check_monotone_map`.

    Attributes:
        strict_inversions: adjacent pairs, along the stable sort order of the original
            scores, whose mapped scores strictly decrease (must be 0).
        ties_broken: adjacent pairs of equal original scores whose mapped scores differ
            (must be 0).
        ties_created: adjacent pairs of distinct original scores that the map made equal
            (allowed; floating point may merge near-ties).
        max_tie_gap_ulps: the largest original gap, in ulps of the original dtype, among the
            created ties (0 when none).
        top1_kept: every position holding its row's maximum is still a maximum after the map.
        decisions_kept: every score keeps its sign (the decision at logit 0); ``None`` when
            not checked.
        max_tie_gap_bound: the bound ``max_tie_gap_ulps`` was held to.
        ok: all of the above hold.
    """

    strict_inversions: int
    ties_broken: int
    ties_created: int
    max_tie_gap_ulps: int
    top1_kept: bool
    decisions_kept: bool | None
    max_tie_gap_bound: int
    ok: bool

    def as_dict(self) -> dict[str, object]:
        """JSON-ready fields."""
        return asdict(self)


def _ordered_keys(x: Tensor) -> Tensor:
    """Integer keys (int64) in the order of the floats ``x``: consecutive representable
    floats get consecutive keys, ``-0.0`` and ``0.0`` the same key."""
    bits = x.contiguous().view(_INT_VIEW[x.dtype]).long()
    nbits = torch.finfo(x.dtype).bits
    magnitude = bits & ((1 << (nbits - 1)) - 1)
    return torch.where(bits < 0, -magnitude, magnitude)


def _check_ulp_dtype(name: str, x: Tensor) -> None:
    if x.dtype not in _INT_VIEW:
        raise ValueError(f"{name}: expected float16, bfloat16, float32 or float64, got {x.dtype}")


def _check_map_inputs(scores: Tensor, mapped: Tensor, max_tie_gap_ulps: int) -> None:
    """The arguments of :func:`check_monotone_map`; NaN is always checked (it compares
    false, so an inversion next to it would pass silently)."""
    check_floating("scores", scores)
    check_floating("mapped", mapped)
    check_same_shape("scores", scores, "mapped", mapped)
    if scores.dim() == 0:
        raise ValueError("scores: expected a 1-D vector or (..., K) rows, got a 0-d tensor")
    check_nonempty("scores", scores)
    _check_ulp_dtype("scores", scores)
    if max_tie_gap_ulps < 0:
        raise ValueError(f"max_tie_gap_ulps: expected an int >= 0, got {max_tie_gap_ulps}")
    for name, x in (("scores", scores), ("mapped", mapped)):
        nan = torch.isnan(x)
        if bool(nan.any()):
            raise ValueError(
                f"{name}: expected no NaN, found NaN at position {first_bad_position(nan)}"
            )


def ulp_distance(a: Tensor, b: Tensor) -> Tensor:
    """The number of representable steps from ``a`` to ``b`` in their (common) floating
    dtype, as int64 (``b > a`` gives a positive count; ``-0.0`` and ``0.0`` are 0 apart).
    Distances beyond 2**53 are approximate.

    Example:
        >>> import torch
        >>> a = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
        >>> b = torch.nextafter(torch.nextafter(a, a + 1), a + 1)
        >>> ulp_distance(a, b).tolist()
        [2, 2, 2]
    """
    check_floating("a", a)
    check_floating("b", b)
    if a.dtype != b.dtype:
        raise ValueError(f"b: expected the dtype of a ({a.dtype}), got {b.dtype}")
    _check_ulp_dtype("a", a)
    ka, kb = _ordered_keys(a), _ordered_keys(b)
    exact = kb - ka  # wraps only for float64 gaps beyond 2**63
    approx = kb.double() - ka.double()
    return torch.where(approx.abs() > 2.0**53, approx.clamp(-(2.0**62), 2.0**62).long(), exact)


def check_monotone_map(
    scores: Tensor, mapped: Tensor, *, decisions: bool = True, max_tie_gap_ulps: int = 4
) -> MonotoneMapCheck:
    """Check exactly that ``mapped`` is ``scores`` under an increasing map, as far as
    floating point promises (see the module docstring).

    Rows are the last dimension: ``(..., K)`` scores are ``prod(...)`` independent rankings
    of ``K`` candidates (per-query scores, masked entries ``-inf``); a 1-D vector (binary
    logits) is one ranking.

    Args:
        scores: the original scores (floating point, ``-inf``/``+inf`` allowed, no NaN).
        mapped: the scores after the map, same shape (any floating dtype, no NaN).
        decisions: also require that every score keeps its sign (the decision at logit 0;
            right for ``x / T``, wrong for a Platt offset).
        max_tie_gap_ulps: the largest original gap (ulps of ``scores.dtype``) between two
            scores the map may merge into a tie for ``ok`` to hold.

    Returns:
        a :class:`MonotoneMapCheck`.

    Example:
        >>> import torch
        >>> a = torch.tensor(-3.543827191505563, dtype=torch.float64)
        >>> x = torch.stack([a, torch.nextafter(a, a + 1), torch.tensor(2.0).double()])
        >>> T = torch.tensor(2.4776, dtype=torch.float64)
        >>> c = check_monotone_map(x, x / T)
        >>> c.ok, c.strict_inversions, c.top1_kept, c.decisions_kept
        (True, 0, True, True)
        >>> c.ties_created <= 1 and c.max_tie_gap_ulps <= 1
        True
        >>> check_monotone_map(x, x.flip(0)).ok  # a map that reorders fails
        False
    """
    _check_map_inputs(scores, mapped, max_tie_gap_ulps)
    k = scores.shape[-1]
    a = scores.detach().reshape(-1, k)
    s = mapped.detach().reshape(-1, k).to(a.device)

    order = torch.argsort(a, dim=-1, stable=True)
    a_sorted, s_sorted = a.gather(-1, order), s.gather(-1, order)
    a_lo, a_hi = a_sorted[:, :-1], a_sorted[:, 1:]
    s_lo, s_hi = s_sorted[:, :-1], s_sorted[:, 1:]
    strict_inversions = int((s_lo > s_hi).sum())
    orig_tie = a_lo == a_hi
    ties_broken = int((orig_tie & (s_lo != s_hi)).sum())
    created = ~orig_tie & (s_lo == s_hi)
    ties_created = int(created.sum())
    max_gap = 0
    if ties_created:
        max_gap = int(ulp_distance(a_lo[created], a_hi[created]).max())

    top = a == a.amax(dim=-1, keepdim=True)
    top1_kept = bool((s == s.amax(dim=-1, keepdim=True))[top].all())
    decisions_kept: bool | None = None
    if decisions:
        decisions_kept = bool(torch.equal(torch.sign(a), torch.sign(s).to(a.dtype)))
    ok = (
        strict_inversions == 0
        and ties_broken == 0
        and max_gap <= max_tie_gap_ulps
        and top1_kept
        and decisions_kept is not False
    )
    return MonotoneMapCheck(
        strict_inversions=strict_inversions,
        ties_broken=ties_broken,
        ties_created=ties_created,
        max_tie_gap_ulps=max_gap,
        top1_kept=top1_kept,
        decisions_kept=decisions_kept,
        max_tie_gap_bound=int(max_tie_gap_ulps),
        ok=ok,
    )
