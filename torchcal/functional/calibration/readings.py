"""Readings and input checks: what is binned against what.

:func:`prepare_inputs` validates ``preds``/``target`` and turns them into per-element
(confidence, outcome, cell) under a reading (``binary``, ``confidence``, ``top_label``,
``classwise``; docs/design.md section 3); :func:`confidence_reading` is the one "max
probability, arg-max == target" reading every module uses.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_binary_target,
    check_finite,
    check_floating,
    check_int,
    check_nonempty,
    check_option,
    check_tensor,
    sync_free,
    values_checked,
)
from torchcal.functional._validation import (
    check_class_target_fast,
    check_group_ids,
    check_optional_int,
    check_probabilities_fast,
)
from torchcal.functional.calibration._rows import logit_rows, prob_rows

READINGS = ("binary", "confidence", "top_label", "classwise")
INPUTS = ("logits", "probs")


@dataclass(frozen=True)
class PreparedInputs:
    """Per-element confidences, outcomes and cell ids after applying a reading.

    Attributes:
        conf: confidences, flat: float64 for binary and classwise logits (linked in
            float64), float32 or float64 for the other multiclass readings of logits, the
            input dtype for probabilities.
        outcome: outcomes (0/1), flat, bool or floating.
        lead: flat index ``g * K + k`` of each element's (group, slot), or ``None`` if
            ``G == K == 1``.
        num_groups: ``G``.
        num_slots: ``K``.
        group_counts: samples per group, int64 ``(G,)`` (samples, not sample x class).
        per_sample: elements per sample (``C`` for ``classwise``: one per class, laid out
            sample-major; else 1).
        looks_like_probs: ``input="logits"`` but every row lies in [0, 1] and sums to 1
            (probabilities passed as logits; the callers warn).

    Example:
        >>> import torch
        >>> p = prepare_inputs(torch.zeros(3, 4), torch.tensor([0, 1, 2]), reading="top_label")
        >>> p.num_slots, p.lead.tolist(), p.outcome.tolist()
        (4, [0, 0, 0], [True, False, False])
    """

    conf: Tensor
    outcome: Tensor
    lead: Tensor | None
    num_groups: int
    num_slots: int
    group_counts: Tensor
    per_sample: int = 1
    looks_like_probs: bool = False


@dataclass(frozen=True)
class CalibrationSamples:
    """Kept samples for the exact (sort-based) estimators: ``conf`` float64, ``outcome``
    float64 and ``group`` int64 (all flat, same length).

    Example:
        >>> import torch
        >>> from torchcal.functional.calibration.adaptive import equal_mass_calibration_error_from_samples
        >>> s = CalibrationSamples(torch.tensor([0.2, 0.9], dtype=torch.float64),
        ...                        torch.tensor([0.0, 1.0], dtype=torch.float64),
        ...                        torch.zeros(2, dtype=torch.long))
        >>> round(float(equal_mass_calibration_error_from_samples(s, 2)), 4)
        0.15
    """

    conf: Tensor
    outcome: Tensor
    group: Tensor


def confidence_reading(
    preds: Tensor, target: Tensor | None = None, *, input: str = "logits"
) -> tuple[Tensor, Tensor | None]:
    """The confidence reading of rows ``(M, C)``: ``(conf, correct)``.

    ``conf`` is the largest class probability (max softmax for ``input="logits"``, computed
    by the fused row pass as ``1 / sum_j exp(z_j - max z)``, float32 for half/float32
    logits; the row maximum for ``input="probs"``), ``correct`` whether the arg-max of ``preds`` (first maximum, as
    ``torch.max``) equals ``target`` (``None`` without a target). Differentiable
    in ``preds``; for probabilities the maximum is ``torch.max``'s, so
    ``confidence_reading(softmax(z), t, input="probs")`` equals ``softmax(z).max(1)`` bit
    for bit, gradients included. Value checks as :func:`prepare_inputs` (no host sync on a
    device).

    Example:
        >>> import torch
        >>> conf, ok = confidence_reading(torch.tensor([[2.0, 0.0], [0.0, 1.0]]),
        ...                               torch.tensor([0, 0]))
        >>> [round(c, 4) for c in conf.tolist()], ok.tolist()
        ([0.8808, 0.7311], [True, False])
    """
    check_option("input", input, INPUTS)
    conf, correct, _, _ = _confidence_rows(preds, target, input)
    return conf, correct


def _confidence_rows(
    x: Tensor, t: Tensor | None, input: str, need_arg: bool = True
) -> tuple[Tensor, Tensor | None, Tensor | None, bool]:
    """:func:`confidence_reading` of rows ``x`` ``(M, C)``, ``M >= 1``: ``(conf, correct,
    arg-max (M,), looks like probabilities)`` (the one implementation of the reading); the
    arg-max may be ``None`` when ``need_arg`` is false (:func:`~._rows.row_max`; then ``t`` must
    hold validated labels of the rows)."""
    looks = False
    hint = None if need_arg else t
    if input == "logits":
        _, arg, _, s, looks, hits = logit_rows(x, hint)
        conf = s.reciprocal()
    else:
        conf, arg, hits = prob_rows(x, hint)
    if hits is None and t is not None:
        hits = arg == t
    return conf, hits, arg, looks


def prepare_inputs(
    preds: Tensor,
    target: Tensor,
    *,
    reading: str = "confidence",
    input: str = "logits",
    num_classes: int | None = None,
    groups: Tensor | None = None,
    num_groups: int | None = None,
    ignore_index: int | None = None,
) -> PreparedInputs:
    """Validate ``preds``/``target`` and turn them into per-element (confidence, outcome, cell).

    Shapes: ``reading="binary"``: ``preds`` and ``target`` of the same shape, ``target`` in
    {0, 1} (a binary head ``(B, 1)`` is also accepted with a ``(B,)`` target); other
    readings: ``preds`` ``(N, C, *)`` with ``C >= 2`` and integer ``target`` ``(N, *)`` with
    classes in ``[0, C)``. ``groups`` has the shape of ``target``. Elements whose target
    equals ``ignore_index`` are dropped (as ``F.cross_entropy`` does; the result may then be
    empty). Ties in the arg-max go to the lowest class index (``torch.max``). Multiclass
    logits may hold ``-inf`` (a masked class, probability 0; e.g. known answers in filtered
    link prediction) but no NaN/``+inf`` and not a row of only ``-inf``; binary logits must
    be finite. ``input="probs"`` rows must lie in [0, 1] and sum to 1 within
    ``max(1e-4, C * eps(dtype))``. Binary logits are linked in float64 (float32 ``sigmoid``
    rounds by position in the tensor); multiclass confidences come from the row-wise pass of
    :func:`~._rows.logit_rows`. Either way an element's confidence does not depend on its position
    in the batch, so streaming equals one call.

    ``looks_like_probs`` is set when ``input="logits"`` and every row of a multiclass
    ``preds`` lies in [0, 1] and sums to 1 (the callers warn).

    Example:
        >>> import torch
        >>> p = prepare_inputs(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))
        >>> [round(c, 4) for c in p.conf.tolist()], p.outcome.tolist()
        ([0.8808, 0.7311], [True, False])
    """
    if groups is None and num_groups is None and ignore_index is None:
        rows = prepare_rows(preds, target, reading=reading, input=input, num_classes=num_classes)
        if rows is not None:
            conf, outcome, lead, looks = rows
            K = preds.shape[1] if lead is not None else 1
            counts = torch.full((1,), conf.shape[0], dtype=torch.int64, device=target.device)
            return PreparedInputs(conf, outcome, lead, 1, K, counts, 1, looks)
    check_option("reading", reading, READINGS)
    check_option("input", input, INPUTS)
    check_optional_int("ignore_index", ignore_index)
    check_floating("preds", preds)
    check_tensor("target", target)
    check_nonempty("preds", preds)
    G = 1
    if groups is not None:
        G = check_group_ids(groups, target.shape, num_groups)
    elif num_groups is not None:
        G = check_int("num_groups", num_groups, minimum=1)
    g = None if groups is None else groups.reshape(-1).to(torch.int64)
    if reading == "binary":
        conf, outcome, t, g = _binary_elements(preds, target, input, ignore_index, g)
        slot, K, looks = None, 1, False
    else:
        C = _check_class_shapes(preds, target, reading, num_classes)
        _check_labels(target, C, ignore_index)
        x = preds.movedim(1, -1).reshape(-1, C) if preds.dim() > 2 else preds
        x, t, g = _drop_ignored(x, target.reshape(-1), g, ignore_index)
        conf, outcome, slot, looks = _class_elements(x, t, reading, input)
        K = C if reading in ("top_label", "classwise") else 1
    lead, group_counts = _cells(g, G, K, slot, t.numel(), reading, t.device)
    return PreparedInputs(
        conf, outcome, lead, G, K, group_counts, K if reading == "classwise" else 1, looks
    )


def prepare_rows(
    preds: Tensor,
    target: Tensor,
    *,
    reading: str = "confidence",
    input: str = "logits",
    num_classes: int | None = None,
) -> tuple[Tensor, Tensor, Tensor | None, bool] | None:
    """The validation loop's case of :func:`prepare_inputs` in the fewest Python calls: rows
    ``preds`` ``(N, C)`` (``N >= 1``, ``C >= 2``) of floating scores with integer ``target``
    ``(N,)``, ``reading="confidence"`` or ``"top_label"``, no groups and no ``ignore_index``.
    Returns ``(conf, outcome, lead, looks_like_probs)`` (``lead``: the arg-max slot for
    ``top_label``, else ``None``), with the checks and values of :func:`prepare_inputs`, or
    ``None`` when the batch is not that case (then :func:`prepare_inputs` handles it).

    Example:
        >>> import torch
        >>> conf, outcome, lead, looks = prepare_rows(
        ...     torch.tensor([[0.9, 0.1], [0.3, 0.7]]), torch.tensor([0, 0]), input="probs")
        >>> [round(c, 4) for c in conf.tolist()], outcome.tolist(), lead, looks
        ([0.9, 0.7], [True, False], None, False)
        >>> prepare_rows(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long)) is None
        True
    """
    if not (
        (reading == "confidence" or reading == "top_label")
        and (input == "logits" or input == "probs")
        and isinstance(preds, Tensor)
        and isinstance(target, Tensor)
        and preds.is_floating_point()
        and len(shape := preds.shape) == 2
        and target.shape == shape[:1]
        and shape[0] > 0
        and shape[1] >= 2
        and (num_classes is None or num_classes == shape[1])
    ):
        return None
    _check_labels(target, shape[1], None)
    top = reading == "top_label"
    conf, outcome, arg, looks = _confidence_rows(preds, target, input, need_arg=top)
    assert outcome is not None  # with a target, the rows give their outcomes
    return conf, outcome, arg if top else None, looks


_LABEL_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _check_labels(target: Tensor, num_classes: int, ignore_index: int | None) -> None:
    """``check_class_target`` of ``target`` with the CPU's common case in one ``aminmax`` and
    one host read (no ``ignore_index``, integer labels in range); every other case, and every
    failure, goes to ``check_class_target`` (its messages, its device-side assertion)."""
    if (
        ignore_index is None
        and target.dtype in _LABEL_DTYPES
        and target.numel()
        and values_checked()
        and not sync_free(target)
    ):
        lo, hi = torch.aminmax(target)
        if lo.item() >= 0 and hi.item() < num_classes:
            return
    check_class_target_fast(target, num_classes, ignore_index)


def _drop_ignored(
    x: Tensor, t: Tensor, g: Tensor | None, ignore_index: int | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Drop the elements whose target equals ``ignore_index`` (rows of ``x``, ``t``, ``g``)."""
    if ignore_index is not None:
        keep = t != ignore_index
        if not bool(keep.all()):
            x, t = x[keep], t[keep]
            g = None if g is None else g[keep]
    return x, t, g


def _binary_elements(
    preds: Tensor, target: Tensor, input: str, ignore_index: int | None, g: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """``reading="binary"``: (P(y=1), outcome, kept targets, kept group ids), flat."""
    if (
        preds.shape != target.shape
        and preds.dim() == 2
        and preds.shape[1] == 1
        and target.shape == preds.shape[:1]
    ):
        preds = preds.reshape(target.shape)  # a binary head (B, 1) with (B,) targets
    if preds.shape != target.shape:
        raise ValueError(
            f"target: expected the shape of preds {tuple(preds.shape)} for "
            f"reading='binary' (or (B,) for a (B, 1) binary head), got "
            f"{tuple(target.shape)}"
        )
    check_binary_target("target", target, ignore_index=ignore_index)
    p, t, g = _drop_ignored(preds.reshape(-1), target.reshape(-1), g, ignore_index)
    if input == "logits":
        check_finite("preds", p)
        return torch.sigmoid(p.to(torch.float64)), t, t, g
    check_probabilities_fast(p)
    return p, t, t, g


def _check_class_shapes(
    preds: Tensor, target: Tensor, reading: str, num_classes: int | None
) -> int:
    """Multiclass readings: ``preds`` ``(N, C, *)``, ``C >= 2``, ``target`` ``(N, *)``;
    returns ``C``."""
    if preds.dim() < 2:
        raise ValueError(
            f"preds: expected scores of shape (N, C, *) for reading={reading!r}, "
            f"got shape {tuple(preds.shape)}; use reading='binary' for one "
            f"probability per sample"
        )
    C = preds.shape[1]
    if C < 2:
        raise ValueError(
            f"preds: expected C >= 2 classes in dim 1 for reading={reading!r}, "
            f"got shape {tuple(preds.shape)}; a single score per sample is "
            f"binary: use reading='binary'"
        )
    if num_classes is not None and num_classes != C:
        raise ValueError(f"preds: expected {num_classes} classes (num_classes) in dim 1, got {C}")
    expected = (preds.shape[0],) + tuple(preds.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(
            f"target: expected shape {expected} for preds of shape "
            f"{tuple(preds.shape)}, got {tuple(target.shape)}"
        )
    return C


def _class_elements(
    x: Tensor, t: Tensor, reading: str, input: str
) -> tuple[Tensor, Tensor, Tensor | None, bool]:
    """Rows ``x`` ``(M, C)`` under a multiclass reading: (confidences, outcomes, slots,
    looks-like-probabilities), flat (``classwise``: one element per (sample, class))."""
    C = x.shape[1]
    if t.numel() == 0:  # everything ignored
        return (
            torch.zeros(0, dtype=torch.float64, device=x.device),
            torch.zeros(0, dtype=torch.bool, device=x.device),
            None if reading == "confidence" else torch.zeros(0, dtype=torch.int64, device=x.device),
            False,
        )
    if reading == "classwise":
        looks = False
        if input == "logits":  # every class's probability is binned: float64 link
            _, _, e, s, looks, _ = logit_rows(x.to(torch.float64))
            probs = e.div_(s.unsqueeze(1))
        else:
            prob_rows(x)
            probs = x
        outcome = (t.unsqueeze(1) == torch.arange(C, device=t.device)).reshape(-1)
        return (
            probs.reshape(-1),
            outcome,
            torch.arange(C, device=t.device).repeat(t.shape[0]),
            looks,
        )
    top = reading == "top_label"
    conf, outcome, slot, looks = _confidence_rows(x, t, input, need_arg=top)
    assert outcome is not None  # with a target, the rows give their outcomes
    return conf, outcome, slot if top else None, looks


def _cells(
    g: Tensor | None,
    G: int,
    K: int,
    slot: Tensor | None,
    n_samples: int,
    reading: str,
    device: torch.device,
) -> tuple[Tensor | None, Tensor]:
    """Flat (group, slot) cell of each element and the samples per group."""
    if g is not None:
        gc = g.clamp(0, G - 1)
        if sync_free(gc):  # bincount would read its output size on the host
            group_counts = torch.zeros(G, dtype=torch.int64, device=gc.device)
            group_counts.index_add_(0, gc, torch.ones_like(gc))
        else:
            group_counts = torch.bincount(gc, minlength=G)
        if reading == "classwise":
            g = g.repeat_interleave(K)
        return (g * K if slot is None else g * K + slot), group_counts
    group_counts = torch.full((G,), n_samples, dtype=torch.int64, device=device)
    if G > 1:
        group_counts[1:] = 0
    return slot, group_counts


PROBS_AS_LOGITS = (
    "preds: every row lies in [0, 1] and sums to 1: these look like probabilities "
    "passed with input='logits' (the default), which softmaxes them again and "
    "gives a wrong calibration error; pass input='probs' if they are "
    "probabilities"
)


def warn_probs_as_logits(prep: PreparedInputs, stacklevel: int = 3) -> None:
    """Warn (``UserWarning``) when :func:`prepare_inputs` flagged probabilities passed as
    logits."""
    if prep.looks_like_probs:
        warnings.warn(PROBS_AS_LOGITS, UserWarning, stacklevel=stacklevel)


def prepare_checked(preds: Tensor, target: Tensor, **kw: Any) -> PreparedInputs:
    """:func:`prepare_inputs` for the one-shot functionals: warns on probabilities passed as
    logits, and raises when ``ignore_index`` removed every element."""
    prep = prepare_inputs(preds, target, **kw)
    warn_probs_as_logits(prep, stacklevel=4)
    if prep.conf.numel() == 0:
        raise ValueError(
            f"target: every target equals ignore_index={kw.get('ignore_index')}, nothing to measure"
        )
    return prep


def samples_from(prep: PreparedInputs) -> CalibrationSamples:
    if prep.num_slots != 1:
        raise ValueError("exact: kept samples are supported for reading='binary' or 'confidence'")
    g = (
        prep.lead
        if prep.lead is not None
        else torch.zeros(prep.conf.numel(), dtype=torch.int64, device=prep.conf.device)
    )
    return CalibrationSamples(prep.conf.to(torch.float64), prep.outcome.to(torch.float64), g)
