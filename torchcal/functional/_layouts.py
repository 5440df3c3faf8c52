"""The layouts of the scoring rules (binary, class indices, class probabilities, multi-label):
validation and canonical form shared by :mod:`torchcal.functional.scoring` and
:mod:`torchcal.functional.regularizers` (an internal module: docs/design.md section 3).

:func:`prepare` checks ``(logits, target, weight, ignore_index, reduction, multilabel)``
and returns a :class:`Prepared`; :func:`check_rows` / :func:`check_multiclass_rows` are the
O(N) value checks of multiclass logits; :func:`fused_multiclass` runs a fused softmax rule.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from torchcal.functional import _checks
from torchcal.functional._checks import (
    PARALLEL_GRAIN,
    REDUCTIONS,
    check_binary_target,
    check_bool,
    check_class_target,
    check_finite,
    check_floating,
    check_int,
    check_nonempty,
    check_reduction,
    check_tensor,
    check_values,
    compute_dtype,
    finite_ok,
    first_bad_position,
    reduce,
    values_checked,
)
from torchcal.functional._validation import check_probability_rows

NEG_INF = float("-inf")


class Prepared(NamedTuple):
    binary: bool
    logits: Tensor  # in the compute dtype (a (N, 1, *) binary head squeezed to the target)
    target: Tensor  # binary: 0/1 in the compute dtype; multiclass: long indices (ignored -> 0)
    used: Tensor  # bool, shape of target: False where target == ignore_index
    weight: Tensor | None  # per-item weight w_i (0 where ignored), compute dtype; None: soft
    soft: Tensor | None = None  # class-probability target (N, C, *), compute dtype
    class_weight: Tensor | None = None  # soft targets only: (C,) weights or None


def check_no_soft(prep: Prepared, name: str) -> None:
    """The confidence-reading regularisers need a class label per item."""
    if prep.soft is not None:
        raise ValueError(
            f"target: {name} needs class indices (N, *) (or 0/1 labels with "
            f"multilabel=True), got class probabilities of the logits' shape "
            f"{tuple(prep.soft.shape)}"
        )


_FAST_DTYPES = (torch.float32, torch.float64)
_LONG = torch.long
_is_compiling = torch.compiler.is_compiling


def plain_indices(
    logits: object,
    target: object,
    weight: object,
    ignore_index: object,
    reduction: object,
    multilabel: object,
) -> bool:
    """Whether the arguments are the common case that a rule may hand straight to a torch
    kernel (the structural checks of :func:`prepare`, in Python, for free): float32/float64
    logits ``(N, C, *)`` with ``C >= 2``, non-empty, torch.long class indices ``(N, *)``,
    no ``multilabel``, ``weight`` ``None`` or ``(C,)`` of the logits' dtype and device, a
    known ``reduction`` and an int ``ignore_index`` outside ``[0, C)`` (a device mismatch of
    logits and target is left to the kernel, whose error sends the call to :func:`prepare`).
    Anything else goes through :func:`prepare` (its messages)."""
    if not (isinstance(logits, Tensor) and isinstance(target, Tensor)):
        return False
    if multilabel is not False or reduction not in REDUCTIONS or type(ignore_index) is not int:
        return False
    shape = logits.shape
    if len(shape) < 2 or logits.dtype not in _FAST_DTYPES or target.dtype != torch.long:
        return False
    num_classes = shape[1]
    if num_classes < 2 or 0 <= ignore_index < num_classes or target.shape != shape[:1] + shape[2:]:
        return False
    if not target.numel():  # an empty batch: prepare()'s message
        return False
    if weight is None:
        return True
    return (
        isinstance(weight, Tensor)
        and weight.shape == (num_classes,)
        and weight.dtype == logits.dtype
        and weight.device == logits.device
    )


def fast_case(logits: Tensor, target: Tensor, ignore_index: int) -> bool:
    """Whether a rule may take its fast path (docs/design.md section 3, the hot path):
    2-D float32/float64 logits ``(N, C)`` with ``C >= 2`` and ``N >= 1``, torch.long class
    indices ``(N,)``, an int ``ignore_index`` outside ``[0, C)``, on the CPU in eager mode
    (not :func:`~torchcal.functional._checks.sync_free`). The options are the caller's (a
    Module validated them in ``__init__``, a functional before calling). CPU autocast needs
    no switch here: the fast kernels use no operation it lowers, and it never casts float32
    or float64 to a wider type.

    On this path the kernel runs first and the value checks read what it computed: a label
    outside ``[0, C)`` (out of range or ``ignore_index``) makes the kernel's gather or
    scatter raise, and a NaN/+inf logit or an all ``-inf`` item makes the result non-finite;
    :func:`fast_ok` reads both with at most two host reads. Where a test fails the rule
    returns ``None`` and its caller runs the full path, which raises today's message (or,
    where the fast test was only conservative, returns the same value). Written for the
    per-call cost (a few hundred nanoseconds): the shapes decide first."""
    try:
        n, num_classes = logits.shape
        (m,) = target.shape
    except (AttributeError, TypeError, ValueError):  # not a tensor, or not 2-D / 1-D
        return False
    # one expression, sync_free() inlined: this runs before every loss call
    return (
        m == n > 0
        and num_classes > 1
        and target.dtype is _LONG
        and logits.dtype in _FAST_DTYPES
        and type(ignore_index) is int
        and not 0 <= ignore_index < num_classes
        and logits.is_cpu
        and not _checks._FORCE_SYNC_FREE
        and not _is_compiling()
    )


def fast_ok(score: Tensor, logits: Tensor | None = None, target: Tensor | None = None) -> bool:
    """The value check of a fast path (:func:`fast_case`): ``score`` (the reduced result, or
    per-item scores) is finite and, given ``logits`` and ``target``, no true class is
    masked with ``-inf`` (which the Brier, spherical, RPS and confidence readings do not
    show): a one-thread-sized batch (:func:`small_sum`) tests every logit with one reduction
    (conservative: any ``-inf`` mask sends the call to the full path, which allows masks
    of the other classes), a larger one the gathered true logits. A float32 sum of finite
    scores that overflows also only sends the call to the full path."""
    if not math.isfinite((score if score.dim() == 0 else score.data.sum()).item()):
        return False
    if logits is None or target is None:
        return True
    z = logits.data  # read only: no detach dispatch on the hot path
    if not small_sum(z):
        z = z.gather(1, target.unsqueeze(1))
    return z.amin().item() > NEG_INF  # NaN fails


def fast_true_ok(value: Tensor, true: Tensor) -> bool:
    """:func:`fast_ok` of a 0-d ``value`` with the true-class logits ``true`` (one gather):
    ``value`` is finite and no true logit is NaN or ``-inf`` (two host reads, no kernel but one
    ``min``; a ``+inf`` true logit makes the softmax, so ``value``, NaN)."""
    return math.isfinite(value.item()) and true.min().item() > NEG_INF  # NaN fails


def small_sum(x: Tensor) -> bool:
    """Whether a sum over every element of ``x`` runs on one thread on the CPU (at most
    :data:`~torchcal.functional._checks.PARALLEL_GRAIN` values), so that its last bit does
    not depend on the thread count."""
    return x.numel() <= PARALLEL_GRAIN


def prepare(
    logits: Tensor,
    target: Tensor,
    weight: Tensor | None,
    ignore_index: int,
    reduction: str,
    multilabel: bool = False,
) -> Prepared:
    """Validate the common arguments and bring them into one canonical form."""
    check_tensor("logits", logits)
    check_tensor("target", target)
    check_reduction(reduction)
    check_int("ignore_index", ignore_index)
    check_bool("multilabel", multilabel)
    check_floating("logits", logits)
    check_nonempty("logits", logits)
    dtype = compute_dtype(logits.dtype)
    if weight is not None:
        check_floating("weight", weight)
    class_shape = logits.shape[:1] + logits.shape[2:]
    has_classes = logits.dim() >= 2
    if has_classes and logits.shape[1] == 1 and not multilabel:
        # a binary head (N, 1, *): binary with a target of shape (N, 1, *) or (N, *)
        if target.shape in (logits.shape, class_shape):
            return _prepare_binary(
                logits.reshape(target.shape), target, weight, ignore_index, dtype
            )
    elif target.shape == logits.shape:
        if multilabel or not has_classes:
            return _prepare_binary(logits, target, weight, ignore_index, dtype)
        return _prepare_soft(logits, target, weight, dtype)
    elif has_classes and target.shape == class_shape:
        if multilabel:
            raise ValueError(
                f"target: multilabel=True expects 0/1 float labels of the logits' "
                f"shape {tuple(logits.shape)}, got {tuple(target.shape)}"
            )
        return _prepare_multiclass(logits, target, weight, ignore_index, dtype)
    if not has_classes:
        expected = f"{tuple(logits.shape)} (binary labels)"
    elif logits.shape[1] == 1:
        expected = (
            f"{tuple(logits.shape)} or {tuple(class_shape)} (binary labels for a "
            f"binary head (N, 1, *))"
        )
    elif multilabel:
        expected = f"{tuple(logits.shape)} (multi-label 0/1 floats)"
    else:
        expected = (
            f"{tuple(class_shape)} (class indices) or {tuple(logits.shape)} "
            f"(class probabilities) for logits (N, C, *)"
        )
    raise ValueError(f"target: expected shape {expected}, got {tuple(target.shape)}")


def _prepare_soft(
    logits: Tensor, target: Tensor, weight: Tensor | None, dtype: torch.dtype
) -> Prepared:
    """Class-probability targets of the logits' shape, as ``F.cross_entropy`` reads them."""
    num_classes = logits.shape[1]
    if not target.is_floating_point():
        raise ValueError(
            f"target: expected class indices of shape "
            f"{tuple(logits.shape[:1] + logits.shape[2:])} or floating class "
            f"probabilities of the logits' shape, got dtype {target.dtype} of the "
            f"logits' shape {tuple(target.shape)}; for independent sigmoids "
            f"pass multilabel=True and 0/1 floats"
        )
    check_class_probabilities("target", target)
    check_finite("logits", logits)
    if weight is not None:
        if weight.shape != (num_classes,):
            raise ValueError(
                f"weight: expected a 1-d tensor of {num_classes} class weights, "
                f"got shape {tuple(weight.shape)}"
            )
        check_weight_values(weight)
        weight = weight.to(device=logits.device, dtype=dtype)
    shape = logits.shape[:1] + logits.shape[2:]
    index = torch.zeros(shape, dtype=torch.long, device=logits.device)
    used = torch.ones(shape, dtype=torch.bool, device=logits.device)
    return Prepared(
        False,
        logits.to(dtype),
        index,
        used,
        None,
        target.to(device=logits.device, dtype=dtype),
        weight,
    )


def check_class_probabilities(name: str, target: Tensor) -> None:
    """``target`` ``(N, C, *)``: values in [0, 1], sums over dim 1 equal to 1 within
    ``max(1e-4, C * eps(target.dtype))`` (computed in float64)."""
    check_probability_rows(
        name,
        target,
        what="class probabilities whose sum over dim 1",
        hint="; for independent sigmoids (multi-label) pass multilabel=True",
    )


def soft_expected(prep: Prepared, per_class: Tensor, reduction: str) -> Tensor:
    """``sum_c w_c q_c S(p, c)`` from the ``(N, C, *)`` per-class scores, then reduced as
    ``F.cross_entropy`` does for probability targets (``'mean'`` divides by the items)."""
    wq = prep.soft
    if prep.class_weight is not None:
        shape = [1, -1] + [1] * (wq.dim() - 2)
        wq = wq * prep.class_weight.reshape(shape)
    return reduce((wq * per_class).sum(dim=1), reduction)


def _prepare_binary(
    logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, dtype: torch.dtype
) -> Prepared:
    # integer/bool 0/1 labels are binary labels too (the layout is decided by the shapes):
    # the rule of the metrics' negative log-likelihood (docs/design.md section 3)
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
            raise ValueError(
                f"weight: expected a tensor broadcastable to the target's shape "
                f"{tuple(target.shape)}, got {tuple(weight.shape)}"
            )
        check_weight_values(weight)
        w = w * weight.to(device=logits.device, dtype=dtype)
    return Prepared(True, logits.to(dtype), y, used, w)


def _prepare_multiclass(
    logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, dtype: torch.dtype
) -> Prepared:
    num_classes = logits.shape[1]
    if num_classes < 2:
        raise ValueError(
            f"logits: expected at least 2 classes along dim 1, got shape "
            f"{tuple(logits.shape)}; for a binary model pass logits of the "
            f"target's shape (e.g. logits.squeeze(1)) and 0/1 float targets"
        )
    check_class_target("target", target, num_classes, ignore_index=ignore_index)
    used = target != ignore_index
    t = torch.where(used, target, 0).long()
    if weight is None:
        w = used.to(dtype)
    else:
        if weight.shape != (num_classes,):
            raise ValueError(
                f"weight: expected a 1-d tensor of {num_classes} class weights, "
                f"got shape {tuple(weight.shape)}"
            )
        check_weight_values(weight)
        w = weight.to(device=logits.device, dtype=dtype)[t] * used
    return Prepared(False, logits.to(dtype), t, used, w)


def check_weight_values(weight: Tensor) -> None:
    """``weight``: finite and non-negative (one ``aminmax``; the scans only on failure)."""
    if not values_checked() or not weight.numel():
        return

    def scan() -> None:
        check_finite("weight", weight)
        raise ValueError(
            f"weight: expected non-negative values, got a negative value at "
            f"position {first_bad_position(weight < 0)}"
        )

    lo, hi = torch.aminmax(weight.detach())
    ok = (lo >= 0) & (hi < float("inf"))  # NaN fails both
    check_values(ok, "weight: expected finite non-negative values", scan)


_NULL = contextlib.nullcontext()


def autocast_off(x: Tensor) -> contextlib.AbstractContextManager:
    """A context that switches autocast off for ``x``'s device where it is on."""
    device = "cpu" if x.is_cpu else x.device.type
    if torch.is_autocast_enabled(device):
        return torch.autocast(device_type=device, enabled=False)
    return _NULL  # reusable: nullcontext keeps no state


def check_rows(prep: Prepared, row_ok: Tensor, true_logit: Tensor | None) -> None:
    """O(N) value check of the multiclass logits.

    ``row_ok`` (shape of target) must be finite for every item whose logits are free of
    NaN/+inf and hold a finite entry (whatever the target); ``true_logit`` is the logit
    of the (safe) target class, which must not be ``-inf`` on used items.
    """
    if not values_checked():
        return
    ok = finite_ok(row_ok)
    if true_logit is not None:
        ok = ok & ~((true_logit == NEG_INF) & prep.used).any()

    def scan() -> None:
        bad = ~torch.isfinite(row_ok)
        if true_logit is not None:
            bad = bad | ((true_logit == NEG_INF) & prep.used)
        diagnose(prep, bad)

    check_values(
        ok,
        "logits: expected finite scores (a NaN/+Inf logit, an all -inf item or a true class "
        "masked with -inf)",
        scan,
    )


def diagnose(prep: Prepared, flagged: Tensor) -> None:
    """Slow path, only after a failed O(N) check: name the offending logit, then raise."""
    logits = prep.logits
    check_finite("logits", logits, allow_neg_inf=True)
    no_finite = ~torch.isfinite(logits).any(dim=1)
    if bool(no_finite.any()):
        raise ValueError(
            f"logits: expected at least one finite logit per item (-inf may only "
            f"mask classes), item {first_bad_position(no_finite)} is all -inf"
        )
    true_logit = logits.gather(1, prep.target.unsqueeze(1)).squeeze(1)
    masked_true = (true_logit == NEG_INF) & prep.used
    if bool(masked_true.any()):
        raise ValueError(
            f"logits: the true class has logit -inf at item "
            f"{first_bad_position(masked_true)}; -inf may only mask classes "
            f"other than the target"
        )
    raise ValueError(
        f"logits: the score is not finite at item {first_bad_position(flagged)}: "
        f"logits too large in magnitude for {logits.dtype}"
    )


def fused_multiclass(fn: type[torch.autograd.Function], prep: Prepared, reduction: str) -> Tensor:
    """Per-item scores of a fused softmax rule ``fn(logits, index)``, checked and reduced."""
    z = prep.logits
    index = prep.target.unsqueeze(1)
    score = fn.apply(z, index)
    if values_checked():
        check_rows(prep, score.detach(), z.detach().gather(1, index).squeeze(1))
    return reduce(score, reduction, prep.weight)


def binary_brier(prep: Prepared) -> Tensor:
    """``(sigmoid(z) - y)^2`` as ``sigmoid((1 - 2y) z)^2``: no cancellation when p is near y."""
    return torch.sigmoid((1.0 - 2.0 * prep.target) * prep.logits).square()


def check_multiclass_rows(prep: Prepared) -> None:
    """:func:`check_rows` of multiclass logits from their log-normalisers and true logits."""
    z = prep.logits.detach()
    check_rows(prep, torch.logsumexp(z, dim=1), z.gather(1, prep.target.unsqueeze(1)).squeeze(1))


def log_score_items(
    x: Tensor, target: Tensor, layout: str, *, input: str = "logits", used: Tensor | None = None
) -> Tensor:
    """Per-item log score ``-log p_y`` of validated inputs: the one implementation behind
    :func:`~torchcal.functional.scoring.log_score` and the negative log-likelihood of
    :mod:`torchcal.functional.calibration.nll` (which differ only in their checks).

    ``layout``: ``"binary"`` (``target`` 0/1 floats of ``x``'s shape, ignored items already
    0), ``"indices"`` (``x`` ``(N, C, *)``, ``target`` long ``(N, *)`` with ignored items
    mapped to a valid class) or ``"soft"`` (``target`` class probabilities of ``x``'s shape;
    a class with probability 0 contributes 0 even under a ``-inf`` mask). ``input``:
    ``"logits"`` (``F.binary_cross_entropy_with_logits`` / ``F.cross_entropy`` /
    ``log_softmax``, never ``log(softmax)``) or ``"probs"`` (``xlogy`` / ``log``). ``used``
    (bool, ``target``'s shape; ``None``: all used) zeroes the ignored items. Computed in
    the dtype of ``x`` (the caller chooses the compute dtype); no validation.
    """
    logits = input == "logits"
    if layout == "soft":
        if logits:
            logp = F.log_softmax(x, dim=1)
            return -torch.where(target > 0, target * logp, 0.0).sum(dim=1)
        return -torch.xlogy(target, x).sum(dim=1)
    if layout == "indices" and logits:  # ignored items: 0 and a zero gradient
        t = target if used is None else torch.where(used, target, -100)
        return F.cross_entropy(x, t, ignore_index=-100, reduction="none")
    if layout == "indices":
        items = -torch.log(x.gather(1, target.unsqueeze(1)).squeeze(1))
    elif logits:
        items = F.binary_cross_entropy_with_logits(x, target, reduction="none")
    else:
        items = -(torch.xlogy(target, x) + torch.xlogy(1 - target, 1 - x))
    return items if used is None else items * used
