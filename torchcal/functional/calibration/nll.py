"""Negative log-likelihood (the log score) over logits or probabilities, float64 sums.

The metrics' entry point of the log score: its own layout checks (arguments named ``preds``,
``-inf`` masks allowed, a masked true class scores ``inf``), then the one per-item kernel
:func:`torchcal.functional._layouts.log_score_items` that
:func:`torchcal.functional.log_score` calls too.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_binary_target,
    check_bool,
    check_class_target,
    check_finite,
    check_floating,
    check_nonempty,
    check_option,
    check_probabilities,
    check_tensor,
    check_values,
    first_bad_position,
    sync_free,
    values_checked,
)
from torchcal.functional._layouts import log_score_items
from torchcal.functional._validation import check_optional_int, check_probability_rows
from torchcal.functional.calibration._rows import rows_look_like_probs
from torchcal.functional.calibration.readings import INPUTS, PROBS_AS_LOGITS

__all__ = [
    "negative_log_likelihood",
]


def _nll(
    preds: Tensor, target: Tensor, input: str, ignore_index: int | None, multilabel: bool
) -> tuple[Tensor, Tensor | None]:
    """Per-item NLL in the dtype of ``preds`` (the shape of the items) and the mask of the
    items kept (``None``: all kept); ignored items hold 0."""
    check_option("input", input, INPUTS)
    check_optional_int("ignore_index", ignore_index)
    check_bool("multilabel", multilabel)
    check_floating("preds", preds)
    check_tensor("target", target)
    check_nonempty("preds", preds)
    has_classes = preds.dim() >= 2
    class_shape = preds.shape[:1] + preds.shape[2:]
    if (
        has_classes
        and preds.shape[1] == 1
        and not multilabel
        and target.shape in (preds.shape, class_shape)
    ):
        return _nll_binary(preds.reshape(target.shape), target, input, ignore_index)
    if target.shape == preds.shape and (multilabel or not has_classes):
        return _nll_binary(preds, target, input, ignore_index)
    if has_classes and target.shape == preds.shape:
        return _nll_soft(preds, target, input), None
    if has_classes and target.shape == class_shape and not multilabel:
        return _nll_indices(preds, target, input, ignore_index)
    if not has_classes:
        expected = f"{tuple(preds.shape)} (binary labels)"
    elif multilabel:
        expected = f"{tuple(preds.shape)} (multi-label 0/1 labels)"
    else:
        expected = (
            f"{tuple(class_shape)} (class indices) or {tuple(preds.shape)} (float "
            f"class probabilities) for preds (N, C, *)"
        )
    raise ValueError(f"target: expected shape {expected}, got {tuple(target.shape)}")


def _nll_binary(
    preds: Tensor, target: Tensor, input: str, ignore_index: int | None
) -> tuple[Tensor, Tensor | None]:
    check_binary_target("target", target, ignore_index=ignore_index)
    keep = None if ignore_index is None else target != ignore_index
    y = target.to(preds.dtype)
    if keep is not None:
        y = torch.where(keep, y, 0.0)
    if input == "logits":
        check_finite("preds", preds)
    else:
        check_probabilities("preds", preds)
    return log_score_items(preds, y, "binary", input=input, used=keep), keep


def logits_look_like_probs(preds: Tensor) -> bool:
    """Whether multiclass logits ``(N, C, *)`` (``C >= 2``) are all in [0, 1] with every
    row (dim 1) summing to 1 within ``max(1e-4, C * eps)``: probabilities passed as logits.
    The guards of :func:`~._rows.rows_look_like_probs` (validation on, a class axis)."""
    if (
        not values_checked()
        or preds.dim() < 2
        or preds.shape[1] < 2
        or preds.numel() == 0
        or sync_free(preds)  # a host decision: not on the device path
    ):
        return False
    return rows_look_like_probs(preds)


def _check_rows_finite(items: Tensor, preds: Tensor) -> None:
    """An item is NaN exactly when its row of logits is entirely ``-inf`` (NaN/``+inf`` were
    rejected before): name it."""
    if not values_checked():
        return

    def scan() -> None:
        raise ValueError(
            f"preds: expected at least one finite score per row, row "
            f"{first_bad_position(torch.isnan(items))} is entirely -inf"
        )

    s = items.detach().sum()  # NaN iff an item is NaN (the items are >= 0 or +inf)
    check_values(~torch.isnan(s), "preds: expected at least one finite score per row", scan)


def _nll_soft(preds: Tensor, target: Tensor, input: str) -> Tensor:
    if not target.is_floating_point():
        raise ValueError(
            f"target: expected class indices of shape "
            f"{tuple(preds.shape[:1] + preds.shape[2:])} or float class "
            f"probabilities of the shape of preds, got dtype {target.dtype} of "
            f"shape {tuple(target.shape)}; for independent sigmoids pass "
            f"multilabel=True"
        )
    check_probability_rows("target", target)
    q = target.to(preds.dtype)
    if input == "logits":
        check_finite("preds", preds, allow_neg_inf=True)
        items = log_score_items(preds, q, "soft")
        _check_rows_finite(items, preds)  # NaN exactly on the all -inf rows (q sums to 1)
        return items
    check_probability_rows("preds", preds)
    return log_score_items(preds, q, "soft", input="probs")


def _nll_indices(
    preds: Tensor, target: Tensor, input: str, ignore_index: int | None
) -> tuple[Tensor, Tensor | None]:
    check_class_target("target", target, preds.shape[1], ignore_index=ignore_index)
    keep = None if ignore_index is None else target != ignore_index
    # int32/uint8 class ids too (the readings take them; F.cross_entropy wants int64)
    t = (target if keep is None else torch.where(keep, target, 0)).long()
    if input == "logits":
        check_finite("preds", preds, allow_neg_inf=True)
        items = log_score_items(preds, t, "indices", used=keep)
        _check_rows_finite(items, preds)
        return items, keep
    check_probability_rows("preds", preds)
    return log_score_items(preds, t, "indices", input="probs", used=keep), keep


def nll_items(
    preds: Tensor,
    target: Tensor,
    *,
    input: str = "logits",
    ignore_index: int | None = None,
    multilabel: bool = False,
) -> Tensor:
    """Per-prediction negative log-likelihood, in the input dtype, shape of the items.

    Layouts (as :mod:`torchcal.functional.scoring`; decided by shapes, dtypes and the
    explicit ``multilabel``, never by values):

    * **binary**: ``preds`` without a class dimension and ``target`` of its shape in
      ``{0, 1}``; a binary head ``(N, 1, *)`` with a target ``(N, 1, *)`` or ``(N, *)``;
    * **class indices**: ``preds`` ``(N, C, *)``, ``C >= 2``, integer ``target`` ``(N, *)``;
    * **class probabilities**: a *floating* ``target`` of the shape of ``preds`` ``(N, C, *)``
      is read as class probabilities, exactly as ``F.cross_entropy`` reads it (rows summing
      to 1 within ``max(1e-4, C * eps(dtype))``): ``-sum_c q_c log p_c``;
    * **multi-label** (independent sigmoids per element) only with ``multilabel=True``.

    Logits go through ``F.cross_entropy``/``log_softmax``/
    ``F.binary_cross_entropy_with_logits`` (never ``log(softmax)``); multiclass logits may
    hold ``-inf`` masks (a masked true class gives ``inf``) but a row entirely ``-inf``
    raises ``ValueError``. Probabilities go through ``log`` (a zero probability on the
    truth gives ``inf``); multiclass probability rows must sum to 1. Items whose target
    equals ``ignore_index`` are 0 (class indices and binary layouts). Multiclass logits
    whose rows all lie in [0, 1] and sum to 1 warn (probabilities passed as logits).

    Example:
        >>> import torch
        >>> items = nll_items(torch.tensor([0.0, 2.0]), torch.tensor([1, 0]))
        >>> [round(v, 4) for v in items.tolist()]
        [0.6931, 2.1269]
    """
    items = _nll(preds, target, input, ignore_index, multilabel)[0]
    if input == "logits" and not multilabel and logits_look_like_probs(preds):
        warnings.warn(PROBS_AS_LOGITS, UserWarning, stacklevel=2)
    return items


def nll_sum(
    preds: Tensor,
    target: Tensor,
    *,
    input: str = "logits",
    ignore_index: int | None = None,
    multilabel: bool = False,
) -> tuple[Tensor, int]:
    """Summed negative log-likelihood and the number of items used (ignored items excluded).

    The link runs in float64 (``preds`` are upcast before ``log_softmax``/``softplus``), so
    a sum over batches equals one call to float64 rounding (layouts as :func:`nll_items`).

    Example:
        >>> import torch
        >>> s, n = nll_sum(torch.zeros(2, 2), torch.tensor([0, 1]))
        >>> round(float(s), 4), n
        (1.3863, 2)
    """
    items, keep = nll_terms(
        preds, target, input=input, ignore_index=ignore_index, multilabel=multilabel
    )
    if input == "logits" and not multilabel and logits_look_like_probs(preds):
        warnings.warn(PROBS_AS_LOGITS, UserWarning, stacklevel=2)
    n = items.numel() if keep is None else int(keep.sum())
    return items.sum(dtype=torch.float64), n


def nll_terms(
    preds: Tensor,
    target: Tensor,
    *,
    input: str = "logits",
    ignore_index: int | None = None,
    multilabel: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-item NLL linked in float64 (``preds`` upcast first) and the mask of the items kept
    (``None``: all kept; ignored items hold 0): the update step of :func:`nll_sum` and of
    :class:`~torchcal.metrics.NegativeLogLikelihood` (no warning here)."""
    return _nll(as_float64(preds), target, input, ignore_index, multilabel)


def as_float64(preds: Tensor) -> Tensor:
    """``preds`` upcast to float64 if floating (left alone otherwise: the checks name it)."""
    return (
        preds.to(torch.float64)
        if isinstance(preds, Tensor) and preds.is_floating_point()
        else preds
    )


def negative_log_likelihood(
    preds: Tensor,
    target: Tensor,
    *,
    input: str = "logits",
    ignore_index: int | None = None,
    multilabel: bool = False,
) -> Tensor:
    """Mean negative log-likelihood (the log score; Good 1952) in float64 over the items
    not ignored (layouts as :func:`nll_items`; ``ValueError`` if every item is ignored).
    Multiclass ``input="logits"`` whose rows all lie in [0, 1] and sum to 1 warn
    (probabilities passed as logits).

    Example:
        >>> import torch
        >>> round(float(negative_log_likelihood(torch.zeros(4, 2), torch.tensor([0, 1, 0, 1]))), 4)
        0.6931
    """
    s, n = nll_sum(preds, target, input=input, ignore_index=ignore_index, multilabel=multilabel)
    if n == 0:
        raise ValueError(
            f"target: every target equals ignore_index={ignore_index}, nothing to measure"
        )
    return s / n
