"""Strictly proper scoring rules for class forecasts, taking logits.

Every rule is negatively oriented (lower is better), strictly proper, and has an
``nn.Module`` twin in :mod:`torchcal.losses`. All four share one signature::

    fn(logits, target, *, weight=None, ignore_index=-100, reduction="mean")

Layouts (decided by shapes, dtypes and the explicit ``multilabel`` flag, never by values):

* **binary**: ``logits`` is ``(N, *)`` without a class dimension and ``target`` has its
  shape with values in {0, 1} (floating, integer or bool labels: the shapes decide the layout,
  as in the metrics' negative log-likelihood); ``p = sigmoid(logits)`` is the probability of
  the label 1. A binary head of shape ``(N, 1, *)`` (``C = 1``) is binary too, with a
  target of shape ``(N, 1, *)`` or ``(N, *)``: the same numbers as ``logits.squeeze(1)``
  (``'none'`` returns the target's shape).
* **multiclass, class indices**: ``logits`` is ``(N, C, *)`` with ``C >= 2`` and ``target``
  ``(N, *)`` holds integer class indices; ``p = softmax(logits, dim=1)``.
* **multiclass, class probabilities**: ``logits`` ``(N, C, *)`` with ``C >= 2`` and a
  *floating* ``target`` of the same shape: ``target[:, c]`` is the probability of class
  ``c``, exactly as ``F.cross_entropy`` reads it (a one-hot float target gives the same
  numbers as its class indices). Each rule returns the expected score under ``y ~ q``,
  ``S(p, q) = sum_c q_c S(p, c)`` (for the log score ``-sum_c q_c log p_c``). Targets must
  lie in [0, 1] with rows summing to 1 within ``max(1e-4, C * eps(target.dtype))`` (sums
  in float64), else ``ValueError``. As in ``F.cross_entropy``: ``weight[c]`` multiplies
  class ``c``'s term, ``'mean'`` divides by the number of items (not by the weights),
  ``ignore_index`` does not apply; every logit must be finite (no ``-inf`` masks).
* **multi-label** (independent sigmoids over the classes) only with ``multilabel=True``:
  ``target`` of the logits' shape with 0/1 labels, scored like the binary layout per
  element. It is never guessed from a float target.

``weight``, ``ignore_index`` and ``reduction`` follow ``torch.nn.functional.cross_entropy``
exactly: multiclass ``weight`` is per class ``(C,)`` and item ``i`` gets
``w_i = weight[target_i]``; binary ``weight`` is per element (broadcastable to
``target``). Items whose target equals ``ignore_index`` get ``w_i = 0`` (zero score,
zero gradient). ``'none'`` returns ``w_i * S_i`` in the shape of ``target``, ``'sum'``
returns ``sum_i w_i S_i`` and ``'mean'`` returns ``sum_i w_i S_i / sum_i w_i`` (NaN when
every item is ignored, as in ``F.cross_entropy``). Note that the binary weighted
``'mean'`` therefore divides by the sum of the weights, unlike
``F.binary_cross_entropy_with_logits`` (which divides by the number of elements).

Validation (see :mod:`torchcal.functional._validation`): NaN and ``+inf`` logits raise,
anywhere. In the multiclass layout ``-inf`` logits are allowed as masks of impossible
classes, as long as every item keeps a finite logit and the true class of every
non-ignored item is finite; binary logits must be finite. Class indices out of range,
binary labels outside {0, 1}, shape mismatches, unknown reductions and empty inputs
raise ``ValueError`` naming the argument. The multiclass value checks cost O(N), not
O(N * C): they inspect the per-item results (a NaN or ``+inf`` logit propagates into
its item's normaliser) and only on failure scan the logits to name the culprit.

Dtypes: float16/bfloat16 logits are computed and returned in float32 (also under
``torch.autocast``, which is switched off inside these functions); float32 and float64
are computed in their own precision.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from torchcal.functional import _checks
from torchcal.functional._checks import (
    REDUCTIONS,
    check_finite,
    check_values,
    finite_ok,
    labels_ok,
    reduce,
    sync_free,
    values_checked,
)
from torchcal.functional._fused import SoftmaxBrier, SoftmaxRPS, SoftmaxSpherical
from torchcal.functional._layouts import (
    Prepared,
    autocast_off,
    binary_brier,
    check_rows,
    fast_case,
    fast_ok,
    fused_multiclass,
    log_score_items,
    plain_indices,
    prepare,
    small_sum,
    soft_expected,
)
from torchcal.functional._validation import check_label_smoothing

__all__ = [
    "log_score",
    "brier_score",
    "spherical_score",
    "ranked_probability_score",
]


def binary_nll(t: Tensor, y: Tensor) -> Tensor:
    """Exact per-element binary log score of logits ``t``: ``softplus(t) - y t``.

    Written ``relu(t) + log1p(exp(-|t|)) - y t`` (an exact softplus: no switch to the
    identity at ``t = 20`` as ``F.softplus``), in the dtype of ``t`` (pass float64 for the
    solvers), without validation: a kernel for fitting code that has checked its inputs.

    Example:
        >>> import torch
        >>> [round(v, 4) for v in binary_nll(torch.tensor([0.0, 2.0]),
        ...                                  torch.tensor([1.0, 0.0])).tolist()]
        [0.6931, 2.1269]
    """
    return torch.relu(t) + torch.log1p(torch.exp(-t.abs())) - y * t


# --------------------------------------------------------------------------- log score


def log_score(
    logits: Tensor,
    target: Tensor,
    *,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    multilabel: bool = False,
) -> Tensor:
    r"""Logarithmic score (negative log-likelihood, cross-entropy) from logits.

    ``S(p, y) = -log p_y`` (Good 1952, *J. R. Stat. Soc. B* 14, 107-114; Gneiting &
    Raftery 2007, *JASA* 102, 359-378, sec. 3.4). Multiclass: ``-log_softmax(logits)_y``,
    identical to ``F.cross_entropy`` (including ``weight``, ``ignore_index``,
    ``reduction`` and the ``(N, C, d1, ...)`` layout). Binary:
    ``-[y log sigmoid(z) + (1 - y) log sigmoid(-z)]`` via
    ``F.binary_cross_entropy_with_logits``; equals ``scoringrules.log_score``. Never
    computed as ``log(softmax)``. See the module docstring for layouts, weights,
    ignored items and validation. The per-item kernel is
    :func:`torchcal.functional._layouts.log_score_items`, shared with the metrics'
    :func:`~torchcal.functional.negative_log_likelihood` (which checks
    ``preds``/``input`` and allows ``-inf`` masks with class-probability targets); a
    class-probability target here goes through ``F.cross_entropy`` itself, whose
    ``weight``/``'mean'`` semantics (and numbers) this function promises, so every logit
    must then be finite.

    ``label_smoothing = eps`` in [0, 1) (multiclass only) is passed through to
    ``F.cross_entropy``: the target becomes ``(1 - eps) e_y + eps / C`` (Szegedy et al.
    2016, *Rethinking the Inception architecture*, CVPR, sec. 7), with that function's
    ``weight``/``reduction`` semantics (the smoothing term weighs class ``c`` by
    ``weight[c]``; ``'mean'`` divides by ``sum_i weight[y_i]``). For ``eps > 0`` this is
    **not a proper score**: its expectation under ``y ~ q`` is minimised by
    ``(1 - eps) q + eps / C``, not by ``q``; use it as a training regulariser, never to
    compare forecasts. With ``eps > 0`` every logit must be finite (a ``-inf`` mask would
    make the smoothed term infinite); binary targets raise.

    Example:
        >>> import torch
        >>> from torchcal.functional import log_score
        >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
        >>> round(log_score(logits, torch.tensor([0, 2])).item(), 4)
        0.6342
        >>> round(log_score(torch.tensor([0.0, 3.0]), torch.tensor([1.0, 1.0]),
        ...                 reduction="sum").item(), 4)
        0.7417
    """
    label_smoothing = check_label_smoothing(label_smoothing)
    if (
        label_smoothing == 0.0
        and weight is None
        and multilabel is False
        and reduction in REDUCTIONS
    ):
        out = log_score_fast(logits, target, ignore_index, reduction)
        if out is not None:
            return out
    if label_smoothing == 0.0 and plain_indices(
        logits, target, weight, ignore_index, reduction, multilabel
    ):
        out = _log_score_indices(logits, target, weight, ignore_index, reduction)
        if out is not None:
            return out
    prep = prepare(logits, target, weight, ignore_index, reduction, multilabel)
    if prep.soft is not None:  # F.cross_entropy itself: its weight/'mean' semantics, bit for bit
        with autocast_off(prep.logits):
            return F.cross_entropy(
                prep.logits,
                prep.soft,
                weight=prep.class_weight,
                reduction=reduction,
                label_smoothing=label_smoothing,
            )
    if label_smoothing > 0:
        return _smoothed_log_score(prep, weight, reduction, label_smoothing)
    with autocast_off(prep.logits):
        if prep.binary:  # the weights zero the ignored items
            score = log_score_items(prep.logits, prep.target, "binary")
            return reduce(score, reduction, prep.weight)
        # Unweighted per-item scores, 0 (and zero gradient) on ignored items.
        score = log_score_items(prep.logits, prep.target, "indices", used=prep.used)
        if values_checked():
            # A NaN/+inf logit or an all -inf row makes the item's score non-finite; the
            # ignored items (score 0 here) get their log-normaliser checked separately.
            row_ok = score.detach()
            ignored = ~prep.used
            if sync_free(row_ok):  # every row's normaliser, no data-dependent shape
                lse = torch.logsumexp(prep.logits.detach(), dim=1)
                row_ok = row_ok + torch.where(ignored, lse, 0.0)
            elif bool(ignored.any()):
                rows = prep.logits.detach().movedim(1, -1)[ignored]
                lse = torch.zeros_like(row_ok)
                lse[ignored] = torch.logsumexp(rows, dim=-1)
                row_ok = row_ok + lse
            check_rows(prep, row_ok, None)
        return reduce(score, reduction, prep.weight)


def log_score_fast(
    logits: Tensor, target: Tensor, ignore_index: int, reduction: str
) -> Tensor | None:
    """The hot path of :func:`log_score` (and :class:`~torchcal.losses.LogScoreLoss`), for
    :func:`~torchcal.functional._layouts.fast_case` arguments without ``weight`` and
    ``label_smoothing``, options already checked: ``F.cross_entropy`` itself, checked with
    two host reads (docs/design.md section 3). ``F.cross_entropy`` rejects a label out of
    range; the count of used items tells whether one is ignored (the full path also checks
    an ignored item's logits); a NaN/+inf logit, an all ``-inf`` item or a ``-inf`` true class
    makes the result non-finite. ``None`` then (and outside the fast case): the caller runs
    the full path, which names the culprit."""
    if not fast_case(logits, target, ignore_index):
        return None
    try:  # F.cross_entropy's own kernel (its Python wrapper only maps the reduction)
        out = _cross_entropy(logits, target, None, _REDUCTION[reduction], ignore_index, 0.0)  # type: ignore[arg-type]
    except (IndexError, RuntimeError):  # a label out of range: the full check names it
        return None
    if not _checks._VALUE_CHECKS:  # values_checked(), inlined
        return out
    # no ignored item: F.cross_entropy's graph node keeps the number of used items (an exact
    # count up to 2**24) for 'mean'/'sum', read without a kernel; else the extreme label
    node = out.grad_fn
    if node is not None and reduction != "none":
        try:
            used = node._saved_total_weight.item()  # type: ignore[attr-defined]
        except AttributeError:  # a torch without that attribute
            pass
        else:
            return out if used == target.shape[0] and math.isfinite(out.item()) else None
    extreme = target.min() if ignore_index < 0 else target.max()
    return out if extreme.item() != ignore_index and fast_ok(out) else None


_cross_entropy = torch._C._nn.cross_entropy_loss
_mse_loss = torch._C._nn.mse_loss
_REDUCTION = {"none": 0, "mean": 1, "sum": 2}  # torch.nn._reduction.get_enum


def _log_score_indices(
    logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str
) -> Tensor | None:
    """The common case, class indices (:func:`plain_indices`): ``F.cross_entropy`` itself,
    then one value check of its result and of the labels (docs/design.md section 3).

    On the sync-free path (CUDA, compiling) the check is a device-side assertion: labels in
    range or ``ignore_index``, a finite result (a NaN/+inf logit or an all ``-inf`` row of a
    used item makes it non-finite; the logits of ignored items are not read, as in
    ``F.cross_entropy``). On CPU, ``None`` when the labels hold an ignored item or the result
    is not finite: the caller then runs the full check, which names the culprit.
    """
    if not values_checked():
        with autocast_off(logits):
            return F.cross_entropy(
                logits, target, weight=weight, ignore_index=ignore_index, reduction=reduction
            )
    if sync_free(logits):
        num_classes = logits.shape[1]
        with autocast_off(logits):
            out = F.cross_entropy(
                logits, target, weight=weight, ignore_index=ignore_index, reduction=reduction
            )
        ok = labels_ok(target, num_classes, ignore_index) & finite_ok(out.detach())
        if weight is not None:
            lo, hi = torch.aminmax(weight.detach())
            ok = ok & (lo >= 0) & (hi < math.inf)
        check_values(
            ok,
            f"log_score: expected class indices in [0, {num_classes - 1}] (or ignore_index), "
            f"finite logits with a finite true-class logit and finite non-negative weights",
        )
        return out
    # CPU eager: every test reads one value on the host (a few dispatches, no full scan)
    if weight is not None:
        lo, hi = torch.aminmax(weight.detach())
        if not (lo.item() >= 0 and hi.item() < math.inf):  # NaN fails both
            return None
    try:
        with autocast_off(logits):
            out = F.cross_entropy(
                logits, target, weight=weight, ignore_index=ignore_index, reduction=reduction
            )
    except (IndexError, RuntimeError):  # a label out of range: the full check names it
        return None
    # labels are now in range or ignored; an ignored item's logits are checked by the full path
    extreme = target.min() if ignore_index < 0 else target.max()
    if extreme.item() == ignore_index:
        return None
    ok = math.isfinite(out.item()) if out.dim() == 0 else bool(finite_ok(out.detach()))
    return out if ok else None


def _smoothed_log_score(
    prep: Prepared, weight: Tensor | None, reduction: str, label_smoothing: float
) -> Tensor:
    """Label-smoothed multiclass log score: ``F.cross_entropy`` on the validated inputs."""
    if prep.binary:
        raise ValueError(
            f"label_smoothing: supported for multiclass logits (N, C, *) with "
            f"class indices only, got binary targets and label_smoothing="
            f"{label_smoothing!r}; pass 2-class logits and class indices instead"
        )
    check_finite("logits", prep.logits)
    if weight is not None:
        weight = weight.to(device=prep.logits.device, dtype=prep.logits.dtype)
    with autocast_off(prep.logits):
        return F.cross_entropy(
            prep.logits,
            torch.where(prep.used, prep.target, -100),
            weight=weight,
            ignore_index=-100,
            reduction=reduction,
            label_smoothing=label_smoothing,
        )


# --------------------------------------------------------------------------- Brier score


def _squared_distance(a: Tensor, b: Tensor, reduction: str) -> Tensor:
    """``sum_c (a - b)^2`` per item (dim 1), reduced: ``F.mse_loss`` (one kernel each way;
    its ``'sum'`` runs on one thread for :func:`~torchcal.functional._layouts.small_sum`
    inputs, so the last bit does not depend on the thread count)."""
    if reduction == "none":
        return _mse_loss(a, b, _REDUCTION["none"]).sum(dim=1)  # type: ignore[arg-type]
    total = _mse_loss(a, b, _REDUCTION["sum"])  # type: ignore[arg-type]  # F.mse_loss's kernel
    return total / a.shape[0] if reduction == "mean" else total


def _fast_rule(logits: Tensor, target: Tensor, small, fused, reduction: str) -> Tensor | None:
    """The hot path shared by the softmax rules (:func:`brier_score_fast` ...): ``small(p,
    index, reduction)`` on a one-thread-sized batch (:func:`small_sum`), else the fused
    ``autograd.Function`` ``fused``; a label outside ``[0, C)`` makes the gather/scatter
    raise, the result and the true class (a ``-inf`` true class does not show in these
    scores) are checked with two host reads (:func:`fast_ok`). ``None`` sends the call to the full path."""
    index = target.unsqueeze(1)
    try:
        if small is not None and small_sum(logits):
            score = small(torch.softmax(logits, dim=1), index, reduction)
        else:
            score = reduce(fused.apply(logits, index), reduction)
    except (IndexError, RuntimeError):  # a label out of range or ignored: the full path
        return None
    if values_checked() and not fast_ok(score, logits, target):
        return None
    return score


def _brier_small(p: Tensor, index: Tensor, reduction: str) -> Tensor:
    """``||p - e_y||^2`` reduced, with the one-hot built by ``scatter_`` (which rejects a
    label outside ``[0, C)``)."""
    return _squared_distance(p, torch.zeros_like(p).scatter_(1, index, 1.0), reduction)


def brier_score_fast(
    logits: Tensor, target: Tensor, ignore_index: int, reduction: str
) -> Tensor | None:
    """The hot path of :func:`brier_score` (and :class:`~torchcal.losses.BrierLoss`) for
    :func:`~torchcal.functional._layouts.fast_case` arguments without ``weight``, options
    already checked: small batches ``F.mse_loss(softmax(z), one_hot(y))``, larger ones the
    fused :class:`SoftmaxBrier`; ``None`` sends the call to the full path."""
    if not fast_case(logits, target, ignore_index):
        return None
    return _fast_rule(logits, target, _brier_small, SoftmaxBrier, reduction)


def brier_score(
    logits: Tensor,
    target: Tensor,
    *,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    multilabel: bool = False,
) -> Tensor:
    r"""Brier (quadratic) score from logits.

    Multiclass: ``S(p, y) = sum_c (p_c - [c = y])^2``, Brier's original definition
    (Brier 1950, *Mon. Weather Rev.* 78, 1-3; Gneiting & Raftery 2007, eq. 11), in
    [0, 2]. Binary: ``S(p, y) = (p - y)^2`` with ``p = sigmoid(z)``, in [0, 1], the
    convention of ``properscoring.brier_score`` and ``scoringrules.brier_score``; it is
    half of the 2-class multiclass score of the same forecast.

    The multiclass path is a ``torch.autograd.Function`` with a closed-form backward
    (about the cost of ``F.cross_entropy``); it supports double backward and passes
    ``gradcheck``/``gradgradcheck``. See the module docstring for layouts, weights,
    ignored items and validation.

    Example:
        >>> import torch
        >>> from torchcal.functional import brier_score
        >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
        >>> round(brier_score(logits, torch.tensor([0, 2])).item(), 4)
        0.3529
        >>> brier_score(torch.tensor([0.0]), torch.tensor([1.0])).item()
        0.25
    """
    if weight is None and multilabel is False and reduction in REDUCTIONS:
        out = brier_score_fast(logits, target, ignore_index, reduction)
        if out is not None:
            return out
    prep = prepare(logits, target, weight, ignore_index, reduction, multilabel)
    with autocast_off(prep.logits):
        if prep.binary:
            return reduce(binary_brier(prep), reduction, prep.weight)
        if prep.soft is not None:
            # ||p - e_c||^2 = (1 - p_c)^2 + (||p||^2 - p_c^2): two non-negative terms
            p = torch.softmax(prep.logits, dim=1)
            sq = p.square()
            per_class = (1.0 - p).square() + (sq.sum(dim=1, keepdim=True) - sq)
            return soft_expected(prep, per_class, reduction)
        return fused_multiclass(SoftmaxBrier, prep, reduction)


# --------------------------------------------------------------------------- spherical


def spherical_score_fast(
    logits: Tensor, target: Tensor, ignore_index: int, reduction: str
) -> Tensor | None:
    """The hot path of :func:`spherical_score` (and :class:`~torchcal.losses.SphericalLoss`)
    for :func:`~torchcal.functional._layouts.fast_case` arguments without ``weight``, options
    already checked: the fused :class:`SoftmaxSpherical`; ``None`` sends the call to the
    full path."""
    if not fast_case(logits, target, ignore_index):
        return None
    return _fast_rule(logits, target, None, SoftmaxSpherical, reduction)


def spherical_score(
    logits: Tensor,
    target: Tensor,
    *,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    multilabel: bool = False,
) -> Tensor:
    r"""Spherical score from logits, negatively oriented: ``S(p, y) = 1 - p_y / ||p||_2``.

    The spherical score ``p_y / ||p||_2`` (Good 1971; Gneiting & Raftery 2007, eq. 13,
    with ``alpha = 2``) is positively oriented; torchcal reports ``1 - p_y / ||p||_2``
    in [0, 1], 0 for a certain correct forecast. Multiclass: a ``torch.autograd.Function``
    on ``softmax(logits)`` with a closed-form backward that supports double backward.
    Binary: the forecast ``(1 - p, p)``, computed as ``-expm1(y z - log(1 + e^{2z}) / 2)``.
    See the module docstring for layouts, weights, ignored items and validation.

    Example:
        >>> import torch
        >>> from torchcal.functional import spherical_score
        >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
        >>> round(spherical_score(logits, torch.tensor([0, 2])).item(), 4)
        0.2164
        >>> round(spherical_score(torch.tensor([0.0]), torch.tensor([1.0])).item(), 4)
        0.2929
    """
    if weight is None and multilabel is False and reduction in REDUCTIONS:
        out = spherical_score_fast(logits, target, ignore_index, reduction)
        if out is not None:
            return out
    prep = prepare(logits, target, weight, ignore_index, reduction, multilabel)
    z = prep.logits
    with autocast_off(z):
        if prep.soft is not None:
            p = torch.softmax(z, dim=1)
            per_class = 1.0 - p / torch.linalg.vector_norm(p, dim=1, keepdim=True)
            return soft_expected(prep, per_class, reduction)
        if prep.binary:
            # log(1 + e^{2z}) / 2 = m + log(e^{-2m} + e^{2(z - m)}) / 2 with m = max(z, 0):
            # no exponent above 0, so no overflow near float max (2z would), and the
            # gradient is sigmoid(2z) whatever subgradient the max takes at z = 0
            m = z.clamp(min=0.0)
            half_norm = m + 0.5 * torch.logaddexp(-2.0 * m, 2.0 * (z - m))
            score = -torch.expm1(prep.target * z - half_norm)
            return reduce(score, reduction, prep.weight)
        return fused_multiclass(SoftmaxSpherical, prep, reduction)


# --------------------------------------------------------------------------- RPS


def _suffix_after(x: Tensor) -> Tensor:
    """``out[:, k] = sum_{c > k} x[:, c]`` along dim 1 (no cancellation), for ``k < C - 1``."""
    inclusive = x.flip(1).cumsum(dim=1).flip(1)
    return inclusive.narrow(1, 1, x.shape[1] - 1)


def _soft_rps(prep: Prepared) -> Tensor:
    """Expected RPS ``sum_c w_c q_c RPS(p, c)`` per item.

    With ``P_k`` / ``Pbar_k`` the forecast mass at or below / above ``k`` and ``B_k`` /
    ``D_k`` the (weighted) target mass at or below / above ``k``:
    ``sum_{k < C-1} B_k Pbar_k^2 + D_k P_k^2`` (non-negative terms, no cancellation).
    """
    c = prep.logits.shape[1]
    p = torch.softmax(prep.logits, dim=1)
    wq = prep.soft
    if prep.class_weight is not None:
        wq = wq * prep.class_weight.reshape([1, -1] + [1] * (wq.dim() - 2))
    below = p.cumsum(dim=1).narrow(1, 0, c - 1)
    above = _suffix_after(p)
    w_below = wq.cumsum(dim=1).narrow(1, 0, c - 1)
    w_above = _suffix_after(wq)
    return (w_below * above.square() + w_above * below.square()).sum(dim=1)


def _rps_small(p: Tensor, index: Tensor, reduction: str) -> Tensor:
    """``sum_{k < C-1} (P_k - [y <= k])^2`` reduced, the cumulative one-hot built by
    ``scatter_`` (which rejects a label outside ``[0, C)``) and ``cumsum_``."""
    head = p.shape[1] - 1
    cdf = p.cumsum(dim=1).narrow(1, 0, head)
    step = torch.zeros_like(p).scatter_(1, index, 1.0).cumsum_(dim=1).narrow(1, 0, head)
    return _squared_distance(cdf, step, reduction)


def ranked_probability_score_fast(
    logits: Tensor, target: Tensor, ignore_index: int, reduction: str
) -> Tensor | None:
    """The hot path of :func:`ranked_probability_score` (and :class:`~torchcal.losses.RPSLoss`)
    for :func:`~torchcal.functional._layouts.fast_case` arguments without ``weight``, options
    already checked: small batches ``F.mse_loss`` of the two cumulative distributions,
    larger ones the fused :class:`SoftmaxRPS`; ``None`` sends the call to the full path."""
    if not fast_case(logits, target, ignore_index):
        return None
    return _fast_rule(logits, target, _rps_small, SoftmaxRPS, reduction)


def ranked_probability_score(
    logits: Tensor,
    target: Tensor,
    *,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    multilabel: bool = False,
) -> Tensor:
    r"""Ranked probability score for ordered classes, from logits.

    ``S(p, y) = sum_{k=0}^{C-2} (P_k - [y <= k])^2`` with ``P_k = p_0 + ... + p_k`` the
    forecast's cumulative distribution over the ordered classes (Epstein 1969,
    *J. Appl. Meteorol.* 8, 985-987; Murphy 1971). Not normalised by ``C - 1``: this is
    the convention of ``scoringrules.rps_score`` (whose last term is identically 0), in
    [0, C - 1]. Binary (``C = 2``): ``(p - y)^2``, equal to the binary
    :func:`brier_score`. The class order along ``dim=1`` is the ordinal order. The
    multiclass path is a ``torch.autograd.Function`` with a closed-form backward (one
    cumulative sum per pass) that supports double backward. See the module docstring
    for layouts, weights, ignored items and validation.

    Example:
        >>> import torch
        >>> from torchcal.functional import ranked_probability_score
        >>> logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
        >>> round(ranked_probability_score(logits, torch.tensor([2])).item(), 4)
        0.26
    """
    if weight is None and multilabel is False and reduction in REDUCTIONS:
        out = ranked_probability_score_fast(logits, target, ignore_index, reduction)
        if out is not None:
            return out
    prep = prepare(logits, target, weight, ignore_index, reduction, multilabel)
    with autocast_off(prep.logits):
        if prep.binary:
            return reduce(binary_brier(prep), reduction, prep.weight)
        if prep.soft is not None:
            return reduce(_soft_rps(prep), reduction)
        return fused_multiclass(SoftmaxRPS, prep, reduction)
