"""Strictly proper scoring rules for class forecasts, taking logits.

Every rule is negatively oriented (lower is better), strictly proper, and has an
``nn.Module`` twin in :mod:`torchcal.losses`. All four share one signature::

    fn(logits, target, *, weight=None, ignore_index=-100, reduction="mean")

Layouts (decided by shapes, dtypes and the explicit ``multilabel`` flag, never by values):

* **binary**: ``logits`` is ``(N, *)`` without a class dimension and ``target`` has its
  shape, floating with values in {0, 1}; ``p = sigmoid(logits)`` is the probability of
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
  ``target`` of the logits' shape with 0/1 floats, scored like the binary layout per
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

import contextlib
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from torchcal.functional._validation import (
    check_binary_target,
    check_class_target,
    check_finite,
    check_floating,
    check_nonempty,
    check_probabilities,
    check_reduction,
    check_tensor,
    first_bad_position,
    reduce,
    values_checked,
)

__all__ = [
    "log_score",
    "brier_score",
    "spherical_score",
    "ranked_probability_score",
]

_HALF = (torch.float16, torch.bfloat16)
_NEG_INF = float("-inf")


class _Prepared(NamedTuple):
    binary: bool
    logits: Tensor  # in the compute dtype (a (N, 1, *) binary head squeezed to the target)
    target: Tensor  # binary: 0/1 floats; multiclass: long indices (ignored items -> 0)
    used: Tensor  # bool, shape of target: False where target == ignore_index
    weight: Tensor | None  # per-item weight w_i (0 where ignored), compute dtype; None: soft
    soft: Tensor | None = None  # class-probability target (N, C, *), compute dtype
    class_weight: Tensor | None = None  # soft targets only: (C,) weights or None


def _check_multilabel(multilabel: bool) -> bool:
    if not isinstance(multilabel, bool):
        raise TypeError(f"multilabel: expected a bool, got {type(multilabel).__name__}")
    return multilabel


def _prepare(logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
             reduction: str, multilabel: bool = False) -> _Prepared:
    """Validate the common arguments and bring them into one canonical form."""
    check_tensor("logits", logits)
    check_tensor("target", target)
    check_reduction(reduction)
    _check_ignore_index(ignore_index)
    _check_multilabel(multilabel)
    check_floating("logits", logits)
    check_nonempty("logits", logits)
    dtype = torch.float32 if logits.dtype in _HALF else logits.dtype
    if weight is not None:
        check_floating("weight", weight)
    class_shape = logits.shape[:1] + logits.shape[2:]
    has_classes = logits.dim() >= 2
    if has_classes and logits.shape[1] == 1 and not multilabel:
        # a binary head (N, 1, *): binary with a target of shape (N, 1, *) or (N, *)
        if target.shape in (logits.shape, class_shape):
            return _prepare_binary(logits.reshape(target.shape), target, weight,
                                   ignore_index, dtype)
    elif target.shape == logits.shape:
        if multilabel or not has_classes:
            return _prepare_binary(logits, target, weight, ignore_index, dtype)
        return _prepare_soft(logits, target, weight, dtype)
    elif has_classes and target.shape == class_shape:
        if multilabel:
            raise ValueError(f"target: multilabel=True expects 0/1 float labels of the logits' "
                             f"shape {tuple(logits.shape)}, got {tuple(target.shape)}")
        return _prepare_multiclass(logits, target, weight, ignore_index, dtype)
    if not has_classes:
        expected = f"{tuple(logits.shape)} (binary labels)"
    elif logits.shape[1] == 1:
        expected = (f"{tuple(logits.shape)} or {tuple(class_shape)} (binary labels for a "
                    f"binary head (N, 1, *))")
    elif multilabel:
        expected = f"{tuple(logits.shape)} (multi-label 0/1 floats)"
    else:
        expected = (f"{tuple(class_shape)} (class indices) or {tuple(logits.shape)} "
                    f"(class probabilities) for logits (N, C, *)")
    raise ValueError(f"target: expected shape {expected}, got {tuple(target.shape)}")


def _prepare_soft(logits: Tensor, target: Tensor, weight: Tensor | None,
                  dtype: torch.dtype) -> _Prepared:
    """Class-probability targets of the logits' shape, as ``F.cross_entropy`` reads them."""
    num_classes = logits.shape[1]
    if not target.is_floating_point():
        raise ValueError(f"target: expected class indices of shape "
                         f"{tuple(logits.shape[:1] + logits.shape[2:])} or floating class "
                         f"probabilities of the logits' shape, got dtype {target.dtype} of the "
                         f"logits' shape {tuple(target.shape)}; for independent sigmoids "
                         f"pass multilabel=True and 0/1 floats")
    check_class_probabilities("target", target)
    check_finite("logits", logits)
    if weight is not None:
        if weight.shape != (num_classes,):
            raise ValueError(f"weight: expected a 1-d tensor of {num_classes} class weights, "
                             f"got shape {tuple(weight.shape)}")
        _check_weight_values(weight)
        weight = weight.to(device=logits.device, dtype=dtype)
    shape = logits.shape[:1] + logits.shape[2:]
    index = torch.zeros(shape, dtype=torch.long, device=logits.device)
    used = torch.ones(shape, dtype=torch.bool, device=logits.device)
    return _Prepared(False, logits.to(dtype), index, used, None,
                     target.to(device=logits.device, dtype=dtype), weight)


def check_class_probabilities(name: str, target: Tensor) -> None:
    """``target`` ``(N, C, *)``: values in [0, 1], sums over dim 1 equal to 1 within
    ``max(1e-4, C * eps(target.dtype))`` (computed in float64)."""
    check_probabilities(name, target)
    if not values_checked():
        return
    num_classes = target.shape[1]
    tol = max(1e-4, num_classes * torch.finfo(target.dtype).eps)
    total = target.sum(dim=1, dtype=torch.float64)
    bad = (total - 1.0).abs() > tol
    if bool(bad.any()):
        pos = first_bad_position(bad)
        val = float(total.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])])
        raise ValueError(f"{name}: expected class probabilities whose sum over dim 1 is 1 "
                         f"(tolerance {tol:.3g}), got {val!r} at item {pos}; for independent "
                         f"sigmoids (multi-label) pass multilabel=True")


def _soft_expected(prep: _Prepared, per_class: Tensor, reduction: str) -> Tensor:
    """``sum_c w_c q_c S(p, c)`` from the ``(N, C, *)`` per-class scores, then reduced as
    ``F.cross_entropy`` does for probability targets (``'mean'`` divides by the items)."""
    wq = prep.soft
    if prep.class_weight is not None:
        shape = [1, -1] + [1] * (wq.dim() - 2)
        wq = wq * prep.class_weight.reshape(shape)
    return reduce((wq * per_class).sum(dim=1), reduction)


def _prepare_binary(logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                    dtype: torch.dtype) -> _Prepared:
    if not target.is_floating_point():
        raise ValueError(f"target: expected floating-point labels in {{0, 1}} for binary logits "
                         f"of the same shape, got dtype {target.dtype}; for multiclass pass "
                         f"logits (N, C, *) and class indices (N, *)")
    check_binary_target("target", target, ignore_index=ignore_index)
    check_finite("logits", logits)
    used = target != ignore_index
    y = torch.where(used, target, 0).to(dtype)
    w = used.to(dtype)
    if weight is not None:
        try:
            shape = torch.broadcast_shapes(weight.shape, target.shape)
        except RuntimeError:
            shape = None
        if shape != target.shape:
            raise ValueError(f"weight: expected a tensor broadcastable to the target's shape "
                             f"{tuple(target.shape)}, got {tuple(weight.shape)}")
        _check_weight_values(weight)
        w = w * weight.to(device=logits.device, dtype=dtype)
    return _Prepared(True, logits.to(dtype), y, used, w)


def _prepare_multiclass(logits: Tensor, target: Tensor, weight: Tensor | None,
                        ignore_index: int, dtype: torch.dtype) -> _Prepared:
    num_classes = logits.shape[1]
    if num_classes < 2:
        raise ValueError(f"logits: expected at least 2 classes along dim 1, got shape "
                         f"{tuple(logits.shape)}; for a binary model pass logits of the "
                         f"target's shape (e.g. logits.squeeze(1)) and 0/1 float targets")
    check_class_target("target", target, num_classes, ignore_index=ignore_index)
    used = target != ignore_index
    t = torch.where(used, target, 0).long()
    if weight is None:
        w = used.to(dtype)
    else:
        if weight.shape != (num_classes,):
            raise ValueError(f"weight: expected a 1-d tensor of {num_classes} class weights, "
                             f"got shape {tuple(weight.shape)}")
        _check_weight_values(weight)
        w = weight.to(device=logits.device, dtype=dtype)[t] * used
    return _Prepared(False, logits.to(dtype), t, used, w)


def _check_ignore_index(ignore_index: int) -> int:
    """``ignore_index`` must be a Python int (as in ``F.cross_entropy``)."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index: expected an int, got {type(ignore_index).__name__}")
    return ignore_index


def _check_weight_values(weight: Tensor) -> None:
    check_finite("weight", weight)
    if values_checked() and bool((weight < 0).any()):
        raise ValueError(f"weight: expected non-negative values, got a negative value at "
                         f"position {first_bad_position(weight < 0)}")


def _autocast_off(x: Tensor) -> contextlib.AbstractContextManager:
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.autocast(device_type=device, enabled=False)
    return contextlib.nullcontext()


def _check_rows(prep: _Prepared, row_ok: Tensor, true_logit: Tensor | None) -> None:
    """O(N) value check of the multiclass logits.

    ``row_ok`` (shape of target) must be finite for every item whose logits are free of
    NaN/+inf and hold a finite entry (whatever the target); ``true_logit`` is the logit
    of the (safe) target class, which must not be ``-inf`` on used items.
    """
    if not values_checked():
        return
    bad = ~torch.isfinite(row_ok)
    if true_logit is not None:
        bad = bad | ((true_logit == _NEG_INF) & prep.used)
    if bool(bad.any()):
        _diagnose(prep, bad)


def _diagnose(prep: _Prepared, flagged: Tensor) -> None:
    """Slow path, only after a failed O(N) check: name the offending logit, then raise."""
    logits = prep.logits
    check_finite("logits", logits, allow_neg_inf=True)
    no_finite = ~torch.isfinite(logits).any(dim=1)
    if bool(no_finite.any()):
        raise ValueError(f"logits: expected at least one finite logit per item (-inf may only "
                         f"mask classes), item {first_bad_position(no_finite)} is all -inf")
    true_logit = logits.gather(1, prep.target.unsqueeze(1)).squeeze(1)
    masked_true = (true_logit == _NEG_INF) & prep.used
    if bool(masked_true.any()):
        raise ValueError(f"logits: the true class has logit -inf at item "
                         f"{first_bad_position(masked_true)}; -inf may only mask classes "
                         f"other than the target")
    raise ValueError(f"logits: the score is not finite at item {first_bad_position(flagged)}: "
                     f"logits too large in magnitude for {logits.dtype}")


def _fused_multiclass(fn: type[torch.autograd.Function], prep: _Prepared,
                      reduction: str) -> Tensor:
    """Per-item scores of a fused softmax rule ``fn(logits, index)``, checked and reduced."""
    z = prep.logits
    index = prep.target.unsqueeze(1)
    score = fn.apply(z, index)
    if values_checked():
        _check_rows(prep, score.detach(), z.detach().gather(1, index).squeeze(1))
    return reduce(score, reduction, prep.weight)


def _binary_brier(prep: _Prepared) -> Tensor:
    """``(sigmoid(z) - y)^2`` as ``sigmoid((1 - 2y) z)^2``: no cancellation when p is near y."""
    return torch.sigmoid((1.0 - 2.0 * prep.target) * prep.logits).square()


# --------------------------------------------------------------------------- log score


def _check_label_smoothing(label_smoothing: float) -> float:
    """``label_smoothing`` must be a number in [0, 1)."""
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
        raise TypeError(f"label_smoothing: expected a number, got "
                        f"{type(label_smoothing).__name__}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing: expected a number in [0, 1), got {label_smoothing!r}")
    return float(label_smoothing)


def log_score(logits: Tensor, target: Tensor, *, weight: Tensor | None = None,
              ignore_index: int = -100, reduction: str = "mean",
              label_smoothing: float = 0.0, multilabel: bool = False) -> Tensor:
    r"""Logarithmic score (negative log-likelihood, cross-entropy) from logits.

    ``S(p, y) = -log p_y`` (Good 1952, *J. R. Stat. Soc. B* 14, 107-114; Gneiting &
    Raftery 2007, *JASA* 102, 359-378, sec. 3.4). Multiclass: ``-log_softmax(logits)_y``,
    identical to ``F.cross_entropy`` (including ``weight``, ``ignore_index``,
    ``reduction`` and the ``(N, C, d1, ...)`` layout). Binary:
    ``-[y log sigmoid(z) + (1 - y) log sigmoid(-z)]`` via
    ``F.binary_cross_entropy_with_logits``; equals ``scoringrules.log_score``. Never
    computed as ``log(softmax)``. See the module docstring for layouts, weights,
    ignored items and validation.

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
    label_smoothing = _check_label_smoothing(label_smoothing)
    prep = _prepare(logits, target, weight, ignore_index, reduction, multilabel)
    if prep.soft is not None:
        with _autocast_off(prep.logits):
            return F.cross_entropy(prep.logits, prep.soft, weight=prep.class_weight,
                                   reduction=reduction, label_smoothing=label_smoothing)
    if label_smoothing > 0:
        return _smoothed_log_score(prep, weight, reduction, label_smoothing)
    with _autocast_off(prep.logits):
        if prep.binary:
            score = F.binary_cross_entropy_with_logits(prep.logits, prep.target,
                                                       reduction="none")
            return reduce(score, reduction, prep.weight)
        # Unweighted per-item scores, 0 (and zero gradient) on ignored items.
        score = F.cross_entropy(prep.logits, torch.where(prep.used, prep.target, -100),
                                ignore_index=-100, reduction="none")
        if values_checked():
            # A NaN/+inf logit or an all -inf row makes the item's score non-finite; the
            # ignored items (score 0 here) get their log-normaliser checked separately.
            row_ok = score.detach()
            ignored = ~prep.used
            if bool(ignored.any()):
                rows = prep.logits.detach().movedim(1, -1)[ignored]
                lse = torch.zeros_like(row_ok)
                lse[ignored] = torch.logsumexp(rows, dim=-1)
                row_ok = row_ok + lse
            _check_rows(prep, row_ok, None)
        return reduce(score, reduction, prep.weight)


def _smoothed_log_score(prep: _Prepared, weight: Tensor | None, reduction: str,
                        label_smoothing: float) -> Tensor:
    """Label-smoothed multiclass log score: ``F.cross_entropy`` on the validated inputs."""
    if prep.binary:
        raise ValueError(f"label_smoothing: supported for multiclass logits (N, C, *) with "
                         f"class indices only, got binary targets and label_smoothing="
                         f"{label_smoothing!r}; pass 2-class logits and class indices instead")
    check_finite("logits", prep.logits)
    if weight is not None:
        weight = weight.to(device=prep.logits.device, dtype=prep.logits.dtype)
    with _autocast_off(prep.logits):
        return F.cross_entropy(prep.logits, torch.where(prep.used, prep.target, -100),
                               weight=weight, ignore_index=-100, reduction=reduction,
                               label_smoothing=label_smoothing)


# --------------------------------------------------------------------------- Brier score


class _SoftmaxBrier(torch.autograd.Function):
    """Per-item multiclass Brier score ``||softmax(z) - e_y||^2`` with a fused backward.

    Gradient: ``dS/dz_j = 2 p_j (p_j - [j = y] - d)`` with ``d = ||p||^2 - p_y``. The first
    backward uses the saved softmax (two passes over the logits); when a graph of the
    backward is requested (double backward) it recomputes the same closed form with
    differentiable ops from the saved logits.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, index: Tensor) -> Tensor:  # type: ignore[override]
        p = torch.softmax(logits, dim=1)
        p_y = p.gather(1, index)
        # ||p - e_y||^2 exactly as written (never negative): shift the true class in place,
        # take the norm, restore the saved value bit for bit.
        p.scatter_add_(1, index, torch.full_like(p_y, -1.0))
        score = torch.linalg.vector_norm(p, dim=1, keepdim=True).square_()
        p.scatter_(1, index, p_y)
        d = score + p_y - 1.0  # = ||p||^2 - p_y
        ctx.save_for_backward(logits, index, p, p_y, d)
        return score.squeeze(1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        logits, index, p, p_y, d = ctx.saved_tensors
        g2 = (2.0 * grad).unsqueeze(1)
        if torch.is_grad_enabled():  # create_graph=True: differentiable recomputation
            p = torch.softmax(logits, dim=1)
            p_y = p.gather(1, index)
            d = (p * p).sum(dim=1, keepdim=True) - p_y
            out = g2 * p * (p - d)
            return out.scatter_add(1, index, -g2 * p_y), None
        out = torch.addcmul(-g2 * d, p, g2).mul_(p)
        out.scatter_add_(1, index, -g2 * p_y)
        return out, None


def brier_score(logits: Tensor, target: Tensor, *, weight: Tensor | None = None,
                ignore_index: int = -100, reduction: str = "mean",
                multilabel: bool = False) -> Tensor:
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
    prep = _prepare(logits, target, weight, ignore_index, reduction, multilabel)
    with _autocast_off(prep.logits):
        if prep.binary:
            return reduce(_binary_brier(prep), reduction, prep.weight)
        if prep.soft is not None:
            # ||p - e_c||^2 = (1 - p_c)^2 + (||p||^2 - p_c^2): two non-negative terms
            p = torch.softmax(prep.logits, dim=1)
            sq = p.square()
            per_class = (1.0 - p).square() + (sq.sum(dim=1, keepdim=True) - sq)
            return _soft_expected(prep, per_class, reduction)
        return _fused_multiclass(_SoftmaxBrier, prep, reduction)


# --------------------------------------------------------------------------- spherical


class _SoftmaxSpherical(torch.autograd.Function):
    """Per-item ``1 - p_y / ||p||_2`` of ``p = softmax(z)`` with a fused backward.

    With ``a = p_y / ||p||`` and ``q = p^2 / ||p||^2`` (``= softmax(2 z)``):
    ``dS/dz_j = a (q_j - [j = y])``. ``||p|| >= p_y`` holds in floating point too (a sum
    of non-negative squares never rounds below one of its terms), so ``S >= 0``.
    Double backward recomputes the closed form with differentiable ops.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, index: Tensor) -> Tensor:  # type: ignore[override]
        p = torch.softmax(logits, dim=1)
        norm = torch.linalg.vector_norm(p, dim=1, keepdim=True)
        ratio = p.gather(1, index) / norm
        ctx.save_for_backward(logits, index, p, norm, ratio)
        return (1.0 - ratio).squeeze(1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        logits, index, p, norm, ratio = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiable recomputation
            p = torch.softmax(logits, dim=1)
            norm2 = (p * p).sum(dim=1, keepdim=True)
            ratio = p.gather(1, index) / norm2.sqrt()
            ga = grad.unsqueeze(1) * ratio
            return (ga * p * p / norm2).scatter_add(1, index, -ga), None
        ga = grad.unsqueeze(1) * ratio
        out = torch.mul(p, ga / norm.square()).mul_(p)
        return out.scatter_add_(1, index, -ga), None


def spherical_score(logits: Tensor, target: Tensor, *, weight: Tensor | None = None,
                    ignore_index: int = -100, reduction: str = "mean",
                    multilabel: bool = False) -> Tensor:
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
    prep = _prepare(logits, target, weight, ignore_index, reduction, multilabel)
    z = prep.logits
    with _autocast_off(z):
        if prep.soft is not None:
            p = torch.softmax(z, dim=1)
            per_class = 1.0 - p / torch.linalg.vector_norm(p, dim=1, keepdim=True)
            return _soft_expected(prep, per_class, reduction)
        if prep.binary:
            half_norm = 0.5 * torch.logaddexp(torch.zeros_like(z), 2.0 * z)
            score = -torch.expm1(prep.target * z - half_norm)
            return reduce(score, reduction, prep.weight)
        return _fused_multiclass(_SoftmaxSpherical, prep, reduction)


# --------------------------------------------------------------------------- RPS


class _SoftmaxRPS(torch.autograd.Function):
    """Per-item RPS ``sum_{k<C-1} (P_k - [y <= k])^2`` of ``p = softmax(z)``, fused backward.

    With ``d_k = P_k - [y <= k]`` (``d_{C-1} = 0``) and suffix sums ``h_j = sum_{k>=j} d_k``:
    ``dS/dp_j = 2 h_j`` and ``dS/dz = 2 p (h - <p, h>)``, where ``<p, h> = S + h_y``
    (``sum_k d_k P_k = sum_k d_k^2 + sum_{k>=y} d_k``). One cumulative sum in each pass;
    double backward recomputes the same closed form with differentiable ops.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, index: Tensor) -> Tensor:  # type: ignore[override]
        num_classes = logits.shape[1]
        p = torch.softmax(logits, dim=1)
        p_y = p.gather(1, index)
        p.scatter_add_(1, index, torch.full_like(p_y, -1.0))
        diff = torch.cumsum(p, dim=1)  # P_k - [y <= k] = cumsum(p - e_y)
        p.scatter_(1, index, p_y)  # restore p bit for bit
        diff.narrow(1, num_classes - 1, 1).zero_()  # P_{C-1} - 1 is 0 up to rounding
        score = torch.linalg.vector_norm(diff, dim=1, keepdim=True).square_()
        ctx.save_for_backward(logits, index, p, diff, score)
        return score.squeeze(1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        logits, index, p, diff, score = ctx.saved_tensors
        num_classes = logits.shape[1]
        g2 = (2.0 * grad).unsqueeze(1)
        if torch.is_grad_enabled():  # create_graph=True: differentiable recomputation
            p = torch.softmax(logits, dim=1)
            head = p.scatter_add(1, index, -torch.ones_like(index, dtype=p.dtype))
            head = head.cumsum(dim=1).narrow(1, 0, num_classes - 1)
            h = torch.cat([head.flip(1).cumsum(dim=1).flip(1),
                           torch.zeros_like(p.narrow(1, 0, 1))], dim=1)
            centre = head.square().sum(dim=1, keepdim=True) + h.gather(1, index)
            return g2 * p * (h - centre), None
        h = torch.cumsum(diff, dim=1)
        total = h.narrow(1, num_classes - 1, 1).clone()
        h.sub_(diff).neg_().add_(total)  # suffix sums: h_j = total - sum_{k<j} d_k
        centre = score + h.gather(1, index)  # <p, h>
        return h.sub_(centre).mul_(p).mul_(g2), None


def _suffix_after(x: Tensor) -> Tensor:
    """``out[:, k] = sum_{c > k} x[:, c]`` along dim 1 (no cancellation), for ``k < C - 1``."""
    inclusive = x.flip(1).cumsum(dim=1).flip(1)
    return inclusive.narrow(1, 1, x.shape[1] - 1)


def _soft_rps(prep: _Prepared) -> Tensor:
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


def ranked_probability_score(logits: Tensor, target: Tensor, *, weight: Tensor | None = None,
                             ignore_index: int = -100, reduction: str = "mean",
                             multilabel: bool = False) -> Tensor:
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
    prep = _prepare(logits, target, weight, ignore_index, reduction, multilabel)
    with _autocast_off(prep.logits):
        if prep.binary:
            return reduce(_binary_brier(prep), reduction, prep.weight)
        if prep.soft is not None:
            return reduce(_soft_rps(prep), reduction)
        return _fused_multiclass(_SoftmaxRPS, prep, reduction)
