"""(internal) The fused row passes of a confidence reading over ``(M, C)`` rows.

:func:`logit_rows` (logits: row maximum, ``exp(x - max)`` and its row sum, validated by one
reduction) and :func:`prob_rows` (probabilities: row maximum, values and row sums validated
by two ``aminmax``), both over :func:`row_max` (``torch.max``, or ``amax`` and a hit test on
the CPU's large batches); :func:`rows_look_like_probs`, the one test for probabilities
passed as logits. :mod:`.readings` builds the readings on them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_finite,
    check_probabilities,
    check_values,
    first_bad_position,
    sync_free,
    values_checked,
)
from torchcal.functional._validation import (
    probability_sum_tolerance,
)


def _check_logits_via(name: str, x: Tensor, derived: Tensor) -> None:
    """Slow path after a failed fused logit check: name the culprit of rows ``x`` ``(M, C)``.

    ``derived`` is a per-row result that is NaN exactly when the row holds a NaN or ``+inf``
    or is entirely ``-inf`` (the softmax denominator of :func:`logit_rows`); the O(M C) scan runs
    only here, to name the position of a bad value.
    """
    check_finite(name, x, allow_neg_inf=True)
    row = first_bad_position(torch.isnan(derived))
    raise ValueError(
        f"{name}: expected at least one finite score per row, row {row} is entirely -inf"
    )


def _raise_bad_prob_rows(x: Tensor, total: Tensor, tol: float) -> None:
    """Name the culprit of a failed fused probability check (slow path, on failure only)."""
    check_probabilities("preds", x)  # NaN/Inf/outside [0, 1]
    bad = (total.to(torch.float64) - 1).abs() > tol
    row = first_bad_position(bad)
    val = float(total.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])])
    raise ValueError(
        f"preds: expected probabilities whose sum over the classes (dim 1) is 1 "
        f"(tolerance {tol:.3g}), got {val!r} in row {row}; pass input='logits' "
        f"for unnormalised scores"
    )


def rows_look_like_probs(x: Tensor) -> bool:
    """Whether every entry of ``x`` ``(N, C, *)`` lies in [0, 1] and every row (dim 1) sums
    to 1 within ``max(1e-4, C * eps)`` (sums in float64): probabilities passed as logits.
    One ``aminmax`` pass and a host sync; the row sums only when the range fits. The one
    implementation of the test (:func:`logit_rows`, :mod:`.nll`)."""
    lo, hi = torch.aminmax(x)
    if not bool((lo >= 0) & (hi <= 1)):  # NaN fails
        return False
    tol = probability_sum_tolerance(x.dtype, x.shape[1])
    return bool(((x.sum(dim=1, dtype=torch.float64) - 1).abs() <= tol).all())


#: from this many elements (and classes) a CPU confidence reading finds ``argmax == target``
#: without the arg-max: ``torch.max(dim=1)`` with indices runs a scalar loop on the CPU,
#: ``amax`` a vectorised one (:func:`row_max`; about 1.4x faster at 1000 x 100)
_AMAX_ELEMENTS = 1 << 16
_AMAX_CLASSES = 64


def row_max(
    x: Tensor, t: Tensor | None
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Row maxima ``top`` ``(M, 1)`` of ``x`` ``(M, C)`` and either the first arg-max ``(M,
    1)`` (``torch.max``) or, given labels ``t`` on the CPU's large-batch path, ``hits`` ``(M,)``
    = ``argmax == t`` (exactly one of the two is ``None``); last ``x - top`` when the path
    computed it (else ``None``).

    The path: ``top = amax(x)``; ``sign(x - top) + 1`` is 1 exactly at a row's maxima, so
    when every row has exactly one (one host read of the counts' ``aminmax``) the arg-max
    is the only position equal to ``top`` and ``hits = x[t] == top``, the value
    ``torch.max`` would give; ties, NaN or infinities fall back to ``torch.max``. Taken only
    with validated labels (the gather needs them in range) and without autograd (``amax``
    shares the gradient among ties)."""
    if (
        t is not None
        and x.shape[1] >= _AMAX_CLASSES
        and x.numel() >= _AMAX_ELEMENTS
        and t.dtype == torch.int64
        and values_checked()
        and not sync_free(x)
        and not (x.requires_grad and torch.is_grad_enabled())
    ):
        top = x.amax(dim=1, keepdim=True)
        d = x - top
        lo, hi = torch.aminmax(torch.sign(d).add_(1).sum(dim=1))
        if lo.item() == 1 and hi.item() == 1:
            return top, None, x.gather(1, t.unsqueeze(1)).squeeze(1) == top.squeeze(1), d
    top, arg = x.max(dim=1, keepdim=True)
    return top, arg, None, None


#: the device-side message of a failed logit check (CUDA, ``torch.compile``)
_BAD_LOGIT_ROW = "preds: expected logits without NaN or +inf and at least one finite score per row"


def logit_rows(
    x: Tensor, t: Tensor | None = None
) -> tuple[Tensor, Tensor | None, Tensor, Tensor, bool, Tensor | None]:
    """The fused confidence pass over logits ``(M, C)``, ``M >= 1``.

    Returns the row maxima ``top`` ``(M, 1)`` and the first arg-max ``arg`` ``(M,)`` (one
    ``torch.max``; with labels ``t`` possibly ``None`` and ``hits = argmax == t`` instead,
    see :func:`row_max`), ``e = exp(x - top)`` and ``s = sum_j e_j`` (float32 for
    float16/bfloat16/float32 logits, float64 for float64), and whether every row lies in
    [0, 1] and sums to 1 (probabilities passed as logits). Every step is exact (max,
    subtraction's correct rounding) or row-wise (``exp`` of a value, the row's sum), so a
    row's confidence ``1 / s`` does not depend on where the row sits in a batch: streaming
    equals one call bit for bit (tested; unlike float32 ``sigmoid``, which rounds by
    position and is therefore run in float64 for binary logits).

    Validation costs one O(M) reduction: ``s`` is NaN exactly for a row with a NaN or
    ``+inf`` or only ``-inf`` entries, so ``min(s)`` (which propagates NaN) decides. On the
    CPU it is read once (a NaN names the culprit by an O(M C) scan; probabilities force
    ``s >= C / e``, and only then are the rows tested for the probability pattern); on a
    device or under ``torch.compile`` it is a device-side assertion and the
    probabilities-as-logits test is skipped (no host round trip).
    """
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    top, arg, hits, d = row_max(work, t)
    e = (work - top if d is None else d).exp_()
    s = e.sum(dim=1)
    looks = False
    if values_checked():
        s_min = s.min()  # NaN propagates
        if sync_free(x):
            check_values(s_min == s_min, _BAD_LOGIT_ROW)
        else:  # one host read
            v = float(s_min)
            if math.isnan(v):
                _check_logits_via("preds", x, s)
            looks = v >= 0.36 * x.shape[1] and rows_look_like_probs(x)
    return top, None if arg is None else arg.squeeze(1), e, s, looks, hits


_TOLERANCES: dict[tuple[torch.dtype, int], float] = {}


def _sum_tolerance(dtype: torch.dtype, num_classes: int) -> float:
    """:func:`~torchcal.functional._validation.probability_sum_tolerance`, memoised (the
    per-batch ``torch.finfo`` is a visible share of a small batch's update)."""
    key = (dtype, num_classes)
    tol = _TOLERANCES.get(key)
    if tol is None:
        tol = _TOLERANCES[key] = probability_sum_tolerance(dtype, num_classes)
    return tol


def prob_rows(x: Tensor, t: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The fused confidence pass over probabilities ``(M, C)``: row maxima ``(M,)`` and the
    first arg-max of each row ``(M,)`` (``torch.max``, whose gradient goes to the first
    maximum; with labels ``t`` possibly ``None`` and ``hits = argmax == t`` instead, see
    :func:`row_max`); validated (values in [0, 1], rows sum to 1 within
    :func:`~torchcal.functional._validation.probability_sum_tolerance`) from one ``aminmax``
    of the values and one of the row sums: one host read on the CPU, a device-side assertion
    on a device or under ``torch.compile``."""
    top, arg, hits, _ = row_max(x, t)
    top = top.squeeze(1)
    arg = None if arg is None else arg.squeeze(1)
    if not values_checked():
        return top, arg, hits
    tol = _sum_tolerance(x.dtype, x.shape[1])
    xd = x.detach() if x.requires_grad else x
    total = xd.sum(dim=1)
    lo, hi = torch.aminmax(xd)
    s_lo, s_hi = torch.aminmax(total)
    if sync_free(x):
        ok = (lo >= 0) & (hi <= 1) & (s_lo >= 1 - tol) & (s_hi <= 1 + tol)
        check_values(ok, "preds: expected probabilities in [0, 1] whose rows sum to 1")
        return top, arg, hits
    # four scalar reads cost less than stacking them for one (NaN fails every comparison)
    if not (
        lo.item() >= 0 and hi.item() <= 1 and s_lo.item() >= 1 - tol and s_hi.item() <= 1 + tol
    ):
        _raise_bad_prob_rows(xd, total, tol)
    return top, arg, hits
