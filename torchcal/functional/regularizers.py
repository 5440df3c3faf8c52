"""Set-level calibration regularisers for training: MMCE, soft-binned ECE, DCA and MDCA (the
per-item ones, focal loss and the confidence penalty, are
:mod:`torchcal.functional.item_regularizers`).

None of these is a strictly proper scoring rule (their minimiser over forecasts is not
the true distribution); they are meant as training objectives or as penalties added to
a proper score. Layouts, ``ignore_index`` and validation follow
:mod:`torchcal.functional.scoring`: binary (``target`` of the logits' shape, 0/1 labels,
float, integer or bool; a binary head ``(N, 1, *)`` is binary too), multiclass (``logits``
``(N, C, *)``, integer class indices ``(N, *)``) or, only with ``multilabel=True``,
independent sigmoids over ``(N, C, *)`` 0/1 float targets (every element one binary item).
A float target of the logits' shape without ``multilabel=True`` means class probabilities:
:func:`mdca` accepts it, the others raise ``ValueError`` (their readings need a class label;
they never fall back to independent sigmoids).

Gradients are finite everywhere, also at a value of 0 (a saturated all-correct batch):
roots (:func:`mmce`, :func:`soft_binned_ece`) take the subgradient 0 there. The smooth
forms (``squared=True`` / ``root=False``) are the defaults of the Loss modules.

:func:`mmce` and :func:`soft_binned_ece` are set-level statistics of the *confidence*
reading: confidence ``r_i`` = max softmax probability (binary: ``max(p, 1 - p)``) and
correctness ``o_i`` = whether the argmax (binary: ``p >= 0.5``) equals the target.
They return one scalar per call (no ``reduction``); ignored items are left out.
:func:`dca` uses the same reading; :func:`mdca` compares the mean softmax vector with the
class frequencies of the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchcal.functional import _checks
from torchcal.functional._checks import (
    check_bool,
    check_int,
    check_number,
    fixed_mean,
    sync_free,
)
from torchcal.functional._layouts import (
    Prepared,
    autocast_off,
    check_multiclass_rows,
    check_no_soft,
    fast_case,
    fast_true_ok,
    prepare,
)
from torchcal.functional._validation import check_kernel_width, check_norm_power

__all__ = ["mmce", "soft_binned_ece", "dca", "mdca"]

#: soft bin counts below this are read as empty (docs/design.md): such a bin's term is at
#: most its count, far below any float32 result, while 1 / count would overflow a gradient
_LIVE_COUNT = 1e-300


def _safe_root(value: Tensor, power: float) -> Tensor:
    """``value ** (1 / power)`` for ``value >= 0`` with the subgradient 0 at 0 (no NaN
    gradient there).

    Rounding below 0 (a kernel sum that is >= 0 in exact arithmetic) is read as +0; a NaN
    ``value`` (every item ignored, or NaN input with validation off) stays NaN, never 0.
    """
    positive = value > 0
    safe = torch.where(positive, value, torch.ones_like(value))
    root = torch.sqrt(safe) if power == 2.0 else safe.pow(1.0 / power)
    rest = value.detach().abs().clamp(max=0.0)  # +0, or NaN where value is NaN
    return torch.where(positive, root, rest)


def _confidence_reading(prep: Prepared) -> tuple[Tensor, Tensor, Tensor]:
    """Flattened (confidence, correct, used) of every item, in the compute dtype (``used``:
    1 for a used item, 0 for an ignored one: weights, no data-dependent selection). The
    multiclass reading is ``torch.max`` of the softmax (the row maximum, and whether its
    first position is the target), which is what
    :func:`~torchcal.functional.calibration.readings.confidence_reading` returns for probabilities
    that require grad, bit for bit; one kernel, no host sync (differentiable: gradients
    flow through the row maximum)."""
    z = prep.logits
    if prep.binary:
        conf = torch.sigmoid(z.abs())
        correct = (z >= 0) == (prep.target == 1)
    else:
        check_multiclass_rows(prep)
        p = torch.softmax(z, dim=1).movedim(1, -1).reshape(-1, z.shape[1])
        conf, top = p.max(dim=1)
        correct = top == prep.target.reshape(-1)
    conf = conf.reshape(-1)
    return conf, correct.reshape(-1).to(conf.dtype), prep.used.reshape(-1).to(conf.dtype)


def _true_logits(logits: Tensor, target: Tensor) -> Tensor | None:
    """The true-class logits ``(N, 1)`` of :func:`~torchcal.functional._layouts.fast_case`
    arguments, read only (``.data``: no detach dispatch), or ``None`` where a label lies
    outside ``[0, C)`` (out of range, or an ignored item: ``ignore_index`` is outside that
    range on the fast path), which the gather itself reports: the hot path's label check, one
    kernel, no host read."""
    try:
        return logits.data.gather(1, target.unsqueeze(1))
    except RuntimeError:  # an index out of bounds: the full path names it (or ignores it)
        return None


def _fast_reading(
    logits: Tensor, target: Tensor, ignore_index: int
) -> tuple[Tensor, Tensor, Tensor] | None:
    """The confidence reading on the hot path (:func:`~torchcal.functional._layouts.fast_case`
    arguments): ``(conf, correct, true)`` of every item, ``torch.max`` of the softmax as
    :func:`_confidence_reading`, and :func:`_true_logits` (a label outside ``[0, C)``, out of
    range or an ignored item, which the full path leaves out, sends the call there).
    ``None`` where the hot path does not apply."""
    if not fast_case(logits, target, ignore_index):
        return None
    true = _true_logits(logits, target)
    if true is None:
        return None
    conf, top = torch.softmax(logits, dim=1).max(dim=1)
    return conf, top == target, true


def mmce(
    logits: Tensor,
    target: Tensor,
    *,
    width: float = 0.4,
    squared: bool = False,
    ignore_index: int = -100,
    multilabel: bool = False,
) -> Tensor:
    r"""Maximum mean calibration error with a Laplacian kernel (Kumar et al. 2018, ICML).

    ``MMCE^2 = (1/m^2) sum_{i,j} (o_i - r_i)(o_j - r_j) exp(-|r_i - r_j| / width)`` over
    the ``m`` used items (Kumar, Sarawagi & Jain 2018, *Trainable calibration measures
    for neural networks from kernel mean embeddings*, eq. 2, with their kernel width
    0.4); returns ``MMCE`` (the square root; the kernel is positive definite, so the
    sum is >= 0 and rounding below 0 is set to 0) or ``MMCE^2`` with ``squared=True``
    (the smooth form, default of :class:`~torchcal.losses.MMCELoss`: the root has an
    infinite slope at 0, where this function takes the subgradient 0, so a saturated
    all-correct batch gives zero gradients, never NaN).

    Exact in O(N log N): after sorting the confidences,
    ``sum_{j<i} a_j e^{-(r_i - r_j)/w} = e^{-r_i/w} * cumsum(a e^{r/w})``, evaluated in
    float64 on centred confidences (every prefix term is at most the current one, so
    the error matches a direct sum). ``width`` must be >= 1e-3 (float64 range).
    Gradients flow through the confidences (the correctness is piecewise constant).

    Example:
        >>> import torch
        >>> from torchcal.functional import mmce
        >>> logits = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 0.5]])
        >>> round(mmce(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.1647
    """
    width = check_kernel_width(width)
    squared = check_bool("squared", squared)
    if multilabel is False:
        out = mmce_fast(logits, target, ignore_index, width, squared)
        if out is not None:
            return out
    prep = prepare(logits, target, None, ignore_index, "mean", multilabel)
    check_no_soft(prep, "mmce")
    with autocast_off(prep.logits):
        conf, correct, used = _confidence_reading(prep)
        value = _mmce_squared(conf, correct, used, width)
        return (value if squared else _safe_root(value, 2.0)).to(prep.logits.dtype)


def _mmce_squared(conf: Tensor, correct: Tensor, used: Tensor | None, width: float) -> Tensor:
    """``MMCE^2`` in float64 from the flat confidence reading; ``used`` (0/1 weights) leaves
    ignored items out, ``None``: every item is used."""
    r = conf.double()
    a = correct.double() - r
    m: float | Tensor
    if used is None:
        m = float(r.numel())
    else:
        m = used.double().sum()  # ignored items: a = 0, no term
        a = a * used.double()
    r_sorted, order = torch.sort(r)
    a_sorted = a[order]
    centred = (r_sorted - 0.5) / width
    up = a_sorted * torch.exp(centred)
    prefix = torch.cumsum(up, dim=0) - up  # sum_{j<i} a_j e^{r_j / w}
    cross = (a_sorted * torch.exp(-centred) * prefix).sum()
    total = (a_sorted * a_sorted).sum() + 2.0 * cross
    return total / (m * m)  # 0 / 0 = NaN when every item is ignored


def mmce_fast(
    logits: Tensor, target: Tensor, ignore_index: int, width: float, squared: bool
) -> Tensor | None:
    """The hot path of :func:`mmce` (and :class:`~torchcal.losses.MMCELoss`), options
    already checked: :func:`_fast_reading` and the same kernel, one value check of the
    result and the true class; ``None`` sends the call to the full path."""
    reading = _fast_reading(logits, target, ignore_index)
    if reading is None:
        return None
    conf, correct, true = reading
    value = _mmce_squared(conf, correct, None, width)
    if _checks._VALUE_CHECKS and not fast_true_ok(value, true):  # before the root (NaN -> 0)
        return None
    return (value if squared else _safe_root(value, 2.0)).to(logits.dtype)


def soft_binned_ece(
    logits: Tensor,
    target: Tensor,
    *,
    bins: int = 15,
    temperature: float = 0.01,
    p: float = 2.0,
    ignore_index: int = -100,
    root: bool = True,
    multilabel: bool = False,
) -> Tensor:
    r"""Soft-binned expected calibration error (Karandikar et al. 2021, NeurIPS).

    Each confidence ``r_i`` belongs to every bin ``b`` with weight
    ``u_ib = softmax_b(-(r_i - xi_b)^2 / temperature)``, bin centres
    ``xi_b = (b + 1/2) / bins`` (Karandikar, Cain, Tran, Lakshminarayanan, Shlens, Mozer &
    Roelofs 2021, *Soft calibration objectives for neural networks*, sec. 3). With soft
    counts ``S_b = sum_i u_ib``, accuracies ``A_b`` and confidences ``C_b`` (the
    ``u``-weighted means of ``o_i`` and ``r_i``)::

        SB-ECE_p = ( sum_b (S_b / m) |A_b - C_b|^p )^(1/p)

    computed as ``sum_b |sum_i u_ib (o_i - r_i)|^p / (m S_b^(p-1))`` in float64 (bins
    whose soft count underflows to 0 contribute 0). As ``temperature -> 0`` it tends to
    the hard-binned ECE with equal-width bins (``p = 1``). The result has the compute
    dtype of the logits. ``root=False`` returns ``SB-ECE_p^p`` (the smooth form, default
    of :class:`~torchcal.losses.SoftBinnedECELoss`); with the root, the value 0 gets the
    subgradient 0 (no NaN on a saturated all-correct batch).

    Example:
        >>> import torch
        >>> from torchcal.functional import soft_binned_ece
        >>> logits = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 0.5]])
        >>> round(soft_binned_ece(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.3192
    """
    bins = check_int("bins", bins, minimum=1)
    temperature = check_number("temperature", temperature, strict=True)
    p = check_norm_power("p", p)
    root = check_bool("root", root)
    if multilabel is False:
        out = soft_binned_ece_fast(logits, target, ignore_index, bins, temperature, p, root)
        if out is not None:
            return out
    prep = prepare(logits, target, None, ignore_index, "mean", multilabel)
    check_no_soft(prep, "soft_binned_ece")
    with autocast_off(prep.logits):
        conf, correct, used = _confidence_reading(prep)
        value = _soft_binned_power(conf, correct, used, bins, temperature, p)
        return (_safe_root(value, p) if root else value).to(prep.logits.dtype)


_CENTRES: dict[tuple[int, torch.device], Tensor] = {}


def _bin_centres(bins: int, device: torch.device) -> Tensor:
    """The float64 centres ``(k + 1/2) / bins`` of the soft bins, built once per (bins,
    device) in eager mode (compiling: no cache, a global dict read would be guarded;
    inference mode: none either, its tensors may not meet autograd later)."""
    if sync_free():  # compiling (or force_sync_free): no cache read
        return torch.arange(0.5, bins, dtype=torch.float64, device=device) / bins
    key = (bins, device)
    centres = _CENTRES.get(key)
    if centres is None:
        centres = torch.arange(0.5, bins, dtype=torch.float64, device=device) / bins
        if not torch.is_inference_mode_enabled() and len(_CENTRES) < 64:
            _CENTRES[key] = centres
    return centres


def _soft_binned_power(
    conf: Tensor, correct: Tensor, used: Tensor | None, bins: int, temperature: float, p: float
) -> Tensor:
    """``SB-ECE_p^p`` in float64 from the flat confidence reading; ``used``
    (0/1 weights) leaves ignored items out, ``None``: every item is used."""
    r = conf.double()
    centres = _bin_centres(bins, r.device)
    u = torch.softmax((r.unsqueeze(1) - centres).square() / -temperature, dim=1)
    m: float | Tensor
    if used is None:
        m = float(r.numel())
    else:
        w = used.double()
        m = w.sum()
        u = u * w.unsqueeze(1)  # ignored items: no soft count
    counts = u.sum(dim=0)
    gaps = ((correct.double() - r).unsqueeze(1) * u).sum(dim=0)
    # A bin's term |gap|^p / S^(p-1) (|gap| <= S, its soft count). Bins with S below
    # _LIVE_COUNT (far bins at temperatures below ~1.5e-3, whose memberships underflow) are
    # empty: their term is < 1e-300, and 1 / S would overflow the gradient (NaN / inf at
    # T = 1e-3 before). p = 2 keeps gap^2 / S (its gap^2 is exactly 0 on an empty bin, so the
    # value is bitwise what it was); other powers take S (|gap| / S)^p, where S^(p-1)
    # underflowed to 0 / 0 for p > 2.
    safe_counts = counts.clamp_min(_LIVE_COUNT)  # an empty bin: |gap| <= S < the floor
    if p == 2.0:
        total = (gaps.square() / safe_counts).sum()
    else:
        total = (counts * (gaps.abs() / safe_counts).pow(p)).sum()
    return total / m  # 0 / 0 = NaN when every item is ignored


def soft_binned_ece_fast(
    logits: Tensor,
    target: Tensor,
    ignore_index: int,
    bins: int,
    temperature: float,
    p: float,
    root: bool,
) -> Tensor | None:
    """The hot path of :func:`soft_binned_ece` (and :class:`~torchcal.losses.SoftBinnedECELoss`),
    options already checked: :func:`_fast_reading` and the same kernel, one value check of
    the result and the true class; ``None`` sends the call to the full path."""
    reading = _fast_reading(logits, target, ignore_index)
    if reading is None:
        return None
    conf, correct, true = reading
    value = _soft_binned_power(conf, correct, None, bins, temperature, p)
    if _checks._VALUE_CHECKS and not fast_true_ok(value, true):  # before the root (NaN -> 0)
        return None
    return (_safe_root(value, p) if root else value).to(logits.dtype)


# ------------------------------------------------------------------------- DCA / MDCA


def dca(
    logits: Tensor, target: Tensor, *, ignore_index: int = -100, multilabel: bool = False
) -> Tensor:
    r"""Difference between confidence and accuracy (DCA, Liang et al. 2020).

    ``DCA = | (1/m) sum_i r_i - (1/m) sum_i o_i |`` over the ``m`` used items, with the
    confidence reading of this module (``r_i`` max softmax probability, binary
    ``max(p, 1 - p)``; ``o_i`` whether the argmax is right), from Liang, Zhang, Wang &
    Jacobs 2020, *Improved trainable calibration method for neural networks on medical
    imaging classification* (BMVC); they train with ``log_score + beta * DCA``.
    One scalar per call (no ``reduction``), NaN when every item is ignored. Gradients
    flow through the confidences; sums are taken in float64, the result has the compute
    dtype of the logits.

    Example:
        >>> import torch
        >>> from torchcal.functional import dca
        >>> logits = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 0.5]])
        >>> round(dca(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.0467
    """
    if multilabel is False:
        out = dca_fast(logits, target, ignore_index)
        if out is not None:
            return out
    prep = prepare(logits, target, None, ignore_index, "mean", multilabel)
    check_no_soft(prep, "dca")
    with autocast_off(prep.logits):
        conf, correct, used = _confidence_reading(prep)
        w = used.double()
        gap = ((conf.double() - correct.double()) * w).sum()
        return (gap / w.sum()).abs().to(prep.logits.dtype)  # NaN when every item is ignored


def dca_fast(logits: Tensor, target: Tensor, ignore_index: int) -> Tensor | None:
    """The hot path of :func:`dca` (and :class:`~torchcal.losses.DCALoss`):
    :func:`_fast_reading`, ``|mean_i (r_i - o_i)|`` (:func:`~torchcal.functional._checks.fixed_mean`
    above one thread's reduction), one value check of the
    result and the true class; ``None`` sends the call to the full path."""
    reading = _fast_reading(logits, target, ignore_index)
    if reading is None:
        return None
    conf, correct, true = reading
    gap = torch.add(conf, correct, alpha=-1)  # conf - correct: the bool read as 0/1 in the kernel
    out = fixed_mean(gap).abs()  # one thread, or fixed blocks
    if _checks._VALUE_CHECKS and not fast_true_ok(out, true):
        return None
    return out


def mdca(
    logits: Tensor, target: Tensor, *, ignore_index: int = -100, multilabel: bool = False
) -> Tensor:
    r"""Multi-class difference in confidence and accuracy (MDCA, Hebbalaguppe et al. 2022).

    ``MDCA = (1/C) sum_c | (1/m) sum_i p_ic - (1/m) sum_i [y_i = c] |`` over the ``m``
    used items (Hebbalaguppe, Prakash, Madan & Arora 2022, *A stitch in time saves nine:
    a train-time regularizing loss for improved neural network calibration*, CVPR); they
    train with ``log_score + beta * MDCA``. Binary logits are read as the two classes
    ``(1 - p, p)``, so MDCA is ``|mean(p) - mean(y)|`` (the 2-class value).
    ``-inf`` masked classes have ``p_ic = 0``. One scalar per call (no ``reduction``),
    NaN when every item is ignored; sums in float64, result in the compute dtype. On the
    hot path (2-D float32 logits with class indices on the CPU) the class means are float32
    reductions, as the plain formula's: MDCA then carries the float32 rounding of those means,
    an absolute error below 1.2e-7 (at most 3.8e-8 measured), which is a large relative error
    only where MDCA itself is tiny (3e-4 at MDCA ~ 5e-5); float64 logits get float64 sums.
    Class-probability targets (float, the logits' shape) give the class frequencies as
    their mean; ``multilabel=True`` reads each element as a binary item.

    MDCA is 0 for a batch whose mean forecast equals its class frequencies, whatever the
    individual forecasts; per item (a batch of one) it is improper.

    Example:
        >>> import torch
        >>> from torchcal.functional import mdca
        >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
        >>> round(mdca(logits, torch.tensor([0, 2])).item(), 4)
        0.2082
    """
    if multilabel is False:
        out = mdca_fast(logits, target, ignore_index)
        if out is not None:
            return out
    prep = prepare(logits, target, None, ignore_index, "mean", multilabel)
    z = prep.logits
    with autocast_off(z):
        if prep.soft is not None:  # class frequencies are the mean target probabilities
            num_classes = z.shape[1]
            p_mean = torch.softmax(z, dim=1).movedim(1, -1).reshape(-1, num_classes)
            q_mean = prep.soft.movedim(1, -1).reshape(-1, num_classes)
            gap = (p_mean.double() - q_mean.double()).mean(dim=0)
            return gap.abs().mean().to(z.dtype)
        used = prep.used.to(torch.float64)
        m = used.sum()  # 0 when all are ignored: 0 / 0 gives NaN, no host sync
        if prep.binary:
            gap = ((torch.sigmoid(z).double() - prep.target.double()) * used).sum()
            return (gap / m).abs().to(z.dtype)
        check_multiclass_rows(prep)
        num_classes = z.shape[1]
        used = used.reshape(-1)
        p_sum = (
            torch.softmax(z, dim=1).movedim(1, -1).reshape(-1, num_classes).double()
            * used.unsqueeze(1)
        ).sum(dim=0)
        counts = torch.zeros(num_classes, dtype=torch.float64, device=z.device)
        counts.scatter_add_(0, prep.target.reshape(-1), used)
        return ((p_sum - counts) / m).abs().mean().to(z.dtype)


def mdca_fast(logits: Tensor, target: Tensor, ignore_index: int) -> Tensor | None:
    """The hot path of :func:`mdca` (and :class:`~torchcal.losses.MDCALoss`) for
    :func:`~torchcal.functional._layouts.fast_case` arguments: the per-class means of the
    softmax (float32, one column per thread) against ``bincount`` of the labels (after
    :func:`_true_logits`: a label outside ``[0, C)`` goes to the full path), one value check
    of the result and the true class; ``None`` sends the call to the full path."""
    if not fast_case(logits, target, ignore_index):
        return None
    true = _true_logits(logits, target)
    if true is None:
        return None
    n, num_classes = logits.shape
    p = torch.softmax(logits, dim=1)
    counts = torch.bincount(target, minlength=num_classes)
    # the class frequencies outside the graph, the reference's kernels; a column mean has
    # C >= 2 outputs, so torch gives each column to one thread: its bits do not depend on
    # the thread count (docs/design.md section 3)
    out = (p.mean(dim=0) - counts.to(p.dtype).div_(n)).abs().mean()
    if _checks._VALUE_CHECKS and not fast_true_ok(out, true):
        return None
    return out
