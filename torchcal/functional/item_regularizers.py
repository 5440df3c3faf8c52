"""The per-item regularisers: focal loss (incl. FLSD-53) and the confidence penalty.

Each scores every item (it has a ``reduction``), unlike the set-level statistics of
:mod:`torchcal.functional.regularizers` (MMCE, soft-binned ECE, DCA, MDCA); neither is a
proper scoring rule. Layouts, ``ignore_index`` and validation follow
:mod:`torchcal.functional.scoring`: binary, multiclass class indices, or, only with
``multilabel=True``, independent sigmoids over ``(N, C, *)`` 0/1 targets. :func:`focal_loss`
needs a class label per item (class probabilities raise); :func:`confidence_penalty` accepts
them and needs no target at all.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from torchcal.functional._checks import (
    REDUCTIONS,
    check_floating,
    check_int,
    check_nonempty,
    check_number,
    check_reduction,
    check_tensor,
    compute_dtype,
    reduce,
    sync_free,
    values_checked,
)
from torchcal.functional._layouts import (
    Prepared,
    autocast_off,
    check_multiclass_rows,
    check_no_soft,
    check_rows,
    fast_case,
    fast_ok,
    prepare,
)
from torchcal.functional._validation import check_gamma

__all__ = ["focal_loss", "confidence_penalty"]

_LOG_0_2 = math.log(0.2)


def focal_loss(
    logits: Tensor,
    target: Tensor,
    *,
    gamma: float | str = 2.0,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    multilabel: bool = False,
) -> Tensor:
    r"""Focal loss ``-(1 - p_y)^gamma log p_y`` from logits (Lin et al. 2017, ICCV).

    ``gamma='adaptive'`` is FLSD-53 (Mukhoti et al. 2020, *Calibrating deep neural
    networks using focal loss*, NeurIPS): ``gamma_i = 5`` where ``p_y < 0.2`` and 3
    otherwise, chosen per item from the detached ``p_y`` in one vectorised ``where``
    (no host sync). ``gamma=0`` is the log score. ``weight`` (the class weights often
    called alpha), ``ignore_index`` and ``reduction`` follow ``F.cross_entropy``.
    ``multilabel=True`` with 0/1 float targets of the logits' shape is the sigmoid focal
    loss per element (RetinaNet's form); class-probability targets raise.

    Numerics: multiclass, one ``log_softmax``, the true class's ``log p_y`` and
    ``1 - p_y = -expm1(log p_y)`` (the plain formula, without cancellation in ``1 - p_y``:
    its absolute error is that of ``log p_y``, a few eps; the items it affects score
    ``(1 - p_y)^(gamma + 1)``, below float32 rounding of a batch mean); binary,
    ``log p`` and ``log(1 - p)`` both from ``logsigmoid``. The gradient has no NaN at
    saturation (``p_y -> 1``), also for ``gamma < 1`` (subgradient 0 of ``(1 - p_y)^gamma``
    at ``p_y = 1``). Items whose other classes are all masked with ``-inf``
    (``p_y = 1`` exactly) score 0 with zero gradient.

    Example:
        >>> import torch
        >>> from torchcal.functional import focal_loss
        >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
        >>> round(focal_loss(logits, torch.tensor([0, 2]), gamma=2.0).item(), 4)
        0.2462
        >>> round(focal_loss(logits, torch.tensor([0, 2]), gamma="adaptive").item(), 4)
        0.1631
    """
    gamma = check_gamma(gamma)
    if weight is None and multilabel is False and reduction in REDUCTIONS:
        out = focal_loss_fast(logits, target, ignore_index, reduction, gamma)
        if out is not None:
            return out
    prep = prepare(logits, target, weight, ignore_index, reduction, multilabel)
    check_no_soft(prep, "focal_loss")
    z = prep.logits
    with autocast_off(z):
        if prep.binary:
            signed = (2.0 * prep.target - 1.0) * z
            log_p = F.logsigmoid(signed)
            items = _focal_binary(log_p, F.logsigmoid(-signed), gamma)
        else:
            check_multiclass_rows(prep)
            log_p = torch.log_softmax(z, dim=1).gather(1, prep.target.unsqueeze(1)).squeeze(1)
            # an ignored item (its target mapped to class 0) scores 0, also under a -inf mask
            items = focal_items(torch.where(prep.used, log_p, 0.0), gamma)
        return reduce(items, reduction, prep.weight)


def focal_items(log_p: Tensor, gamma: float | str) -> Tensor:
    """Per-item multiclass focal loss ``-(1 - p)^gamma log p`` from ``log p`` (the true
    class's ``log_softmax``), with ``1 - p = -expm1(log p)``; ``(1 - p)^gamma`` takes the
    subgradient 0 at ``p = 1`` for ``0 < gamma < 1`` (its slope is infinite there)."""
    if gamma == 0.0:
        return -log_p
    one_minus = -torch.expm1(log_p)
    if isinstance(gamma, str):  # 'adaptive', FLSD-53: 5 where p < 0.2, else 3 (no NaN)
        g = torch.where(log_p.detach() < _LOG_0_2, 5.0, 3.0).to(log_p.dtype)
        return -one_minus.pow(g) * log_p
    if gamma >= 1.0:
        return -one_minus.pow(gamma) * log_p
    positive = one_minus > 0
    safe = torch.where(positive, one_minus, 1.0).pow(gamma)
    return -torch.where(positive, safe, 0.0) * log_p


def _focal_binary(log_p: Tensor, log_1mp: Tensor, gamma: float | str) -> Tensor:
    """Per-element binary focal loss from ``log p`` and ``log(1 - p)`` (both ``logsigmoid``,
    exact): ``-exp(gamma log(1 - p)) log p``, no NaN gradient at saturation."""
    if isinstance(gamma, str):  # 'adaptive'
        g = torch.where(log_p.detach() < _LOG_0_2, 5.0, 3.0).to(log_p.dtype)
        return -torch.exp(g * log_1mp) * log_p
    if gamma == 0.0:
        return -log_p
    return -torch.exp(gamma * log_1mp) * log_p


def focal_loss_fast(
    logits: Tensor, target: Tensor, ignore_index: int, reduction: str, gamma: float | str
) -> Tensor | None:
    """The hot path of :func:`focal_loss` (and :class:`~torchcal.losses.FocalLoss`) for
    :func:`~torchcal.functional._layouts.fast_case` arguments without ``weight``, options
    already checked: one ``log_softmax``, a gather (which rejects a label outside
    ``[0, C)``) and :func:`focal_items`, checked with one host read (a NaN/+inf logit, an
    all ``-inf`` item or a ``-inf`` true class makes the result non-finite). ``None`` sends
    the call to the full path, which names the culprit."""
    if not fast_case(logits, target, ignore_index):
        return None
    try:
        log_p = torch.log_softmax(logits, dim=1).gather(1, target.unsqueeze(1)).squeeze(1)
    except (IndexError, RuntimeError):  # a label out of range or ignored: the full path
        return None
    out = reduce(focal_items(log_p, gamma), reduction)
    if values_checked() and not fast_ok(out):
        return None
    return out


# ------------------------------------------------------------------- confidence penalty


def _prepare_logits_only(logits: Tensor, reduction: str) -> Prepared:
    """Multiclass ``(N, C, *)`` logits without a target: every item is used."""
    check_tensor("logits", logits)
    check_reduction(reduction)
    check_floating("logits", logits)
    check_nonempty("logits", logits)
    if logits.dim() < 2 or logits.shape[1] < 2:
        raise ValueError(
            f"logits: expected multiclass logits (N, C, *) with C >= 2 when no "
            f"target is given, got shape {tuple(logits.shape)}; for binary "
            f"logits pass the 0/1 target"
        )
    dtype = compute_dtype(logits.dtype)
    shape = logits.shape[:1] + logits.shape[2:]
    index = torch.zeros(shape, dtype=torch.long, device=logits.device)
    # used=False only steers diagnose() past its true-class check; the weight marks every
    # item as used.
    return Prepared(
        False,
        logits.to(dtype),
        index,
        torch.zeros_like(index, dtype=torch.bool),
        torch.ones(shape, dtype=dtype, device=logits.device),
    )


def _entropy_of_logits(z: Tensor) -> Tensor:
    """``H(softmax(z))`` over dim 1 with ``p log p = 0`` where ``log p = -inf`` (a ``-inf``
    mask, or a logit so far below the maximum that ``z - max z`` overflows: never
    ``0 * -inf``)."""
    log_p = torch.log_softmax(z, dim=1)
    safe_log_p = torch.where(log_p.detach() == float("-inf"), 0.0, log_p)
    return -(log_p.exp() * safe_log_p).sum(dim=1)


def confidence_penalty_fast(logits: Tensor, reduction: str, beta: float) -> Tensor | None:
    """The hot path of :func:`confidence_penalty` (and
    :class:`~torchcal.losses.ConfidencePenaltyLoss`) without a target, options already
    checked: 2-D float32/float64 logits ``(N, C)``, ``C >= 2``, on the CPU in eager mode:
    ``beta * sum_c p_c log p_c`` from one ``log_softmax``, checked with one host read. A
    NaN or +inf logit or an all ``-inf`` item makes the result NaN, and so does a ``-inf``
    mask (``0 * -inf``): ``None`` then, and the full path (which reads a mask as
    ``0 log 0 = 0``) decides."""
    if not (
        isinstance(logits, Tensor)
        and logits.dim() == 2
        and logits.dtype in (torch.float32, torch.float64)
        and logits.shape[0] > 0
        and logits.shape[1] >= 2
        and not sync_free(logits)  # CPU autocast lowers none of these kernels
    ):
        return None
    log_p = torch.log_softmax(logits, dim=1)
    items = (log_p.exp() * log_p).sum(dim=1)  # -H(p), as the full path's -beta * H
    out = reduce(items if beta == 1.0 else items * beta, reduction)
    if values_checked() and not fast_ok(out):
        return None
    return out


def confidence_penalty(
    logits: Tensor,
    target: Tensor | None = None,
    *,
    beta: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "mean",
    multilabel: bool = False,
) -> Tensor:
    r"""Confidence penalty ``-beta * H(p)`` to add to a loss (Pereyra et al. 2017).

    Pereyra, Tucker, Chorowski, Kaiser & Hinton 2017, *Regularizing neural networks by
    penalizing confident output distributions* (ICLR workshop): the training loss
    is ``-log p_y - beta * H(p)`` with ``H(p) = -sum_c p_c log p_c``. This function returns
    the penalty term ``-beta * H(p)`` per item: it is ``<= 0``, equals ``-beta * log C``
    at the uniform forecast and ``0`` at a one-hot one, so adding it to the loss *rewards*
    entropy and pushes away from over-confident outputs (a version that returns ``+H``
    has the wrong sign and sharpens the forecast). ``beta`` is tuned per task in the
    paper; ``beta = 1`` returns ``-H(p)`` itself.

    ``target`` is optional; it is only used for the layout and ``ignore_index``. Without
    it, ``logits`` are multiclass ``(N, C, *)``. With it, the layouts of
    :mod:`torchcal.functional.scoring` apply (binary: ``H`` of Bernoulli(sigmoid(z)));
    ignored items get 0 and zero gradient, ``'mean'`` averages over the used items
    (``multilabel=True``: the Bernoulli entropy per element; class probabilities: every
    item is used).
    ``-inf`` logits masking classes contribute ``0 log 0 = 0`` (finite gradient).

    Not a proper scoring rule: ``log_score + confidence_penalty`` is minimised by a
    forecast flatter than the truth.

    Example:
        >>> import torch
        >>> from torchcal.functional import confidence_penalty
        >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
        >>> round(confidence_penalty(logits, reduction="none")[1].item(), 4)  # -log 3
        -1.0986
        >>> round(confidence_penalty(logits, beta=0.5).item(), 4)
        -0.4057
    """
    beta = check_number("beta", beta)
    check_int("ignore_index", ignore_index)
    if target is None and reduction in REDUCTIONS:
        out = confidence_penalty_fast(logits, reduction, beta)
        if out is not None:
            return out
    if target is None:
        prep = _prepare_logits_only(logits, reduction)
    else:
        prep = prepare(logits, target, None, ignore_index, reduction, multilabel)
        if prep.soft is not None:  # class probabilities: every item is used
            prep = prep._replace(
                weight=torch.ones_like(prep.target, dtype=prep.logits.dtype),
                used=torch.zeros_like(prep.used),
            )
    z = prep.logits
    with autocast_off(z):
        if prep.binary:
            # H = p softplus(-z) + (1 - p) softplus(z): non-negative terms, no cancellation
            entropy = torch.sigmoid(z) * F.softplus(-z) + torch.sigmoid(-z) * F.softplus(z)
        else:
            check_rows(prep, torch.logsumexp(z.detach(), dim=1), None)
            entropy = _entropy_of_logits(z)
        return reduce(-beta * entropy, reduction, prep.weight)
