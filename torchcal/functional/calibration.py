"""Calibration metrics from one streaming, mergeable binned core.

Everything here is derived from **binned sufficient statistics** (:class:`BinnedStats`): per
bin the count (int64) and, in float64, the sums of confidence ``c``, outcome ``y``, ``c**2``
and ``c*y``. Two streams merge by adding their statistics (one all-reduce under DDP), memory
is O(bins) whatever the number of samples, and the numbers are exact up to float64 rounding:

* the reliability table with Wilson (1927) or Clopper-Pearson (1934) intervals per bin;
* equal-width ECE / RMSCE / MCE (``norm="l1" | "l2" | "max"``; Naeini et al. 2015,
  Guo et al. 2017), the debiased L2 ECE of Kumar, Liang & Ma (2019);
* the Brier score with its exact Murphy (1973) decomposition including the two within-bin
  terms of Stephenson, Coelho & Jolliffe (2008);
* from a *fine* histogram (default 4096 sub-bins, opt-in): equal-mass ECE and ECE_sweep
  (Roelofs et al. 2022) and the smooth ECE (Blasiok & Nakkiran 2023);
* a seeded streaming Poisson bootstrap interval for ECE (Hanley & MacGibbon 2006; Chamandy
  et al. 2012).

**Readings** (what is binned against what) are explicit: ``"binary"`` (P(y=1) against y),
``"confidence"`` (max probability against correct-or-not, Guo et al. 2017), ``"top_label"``
(also conditioned on the predicted class, Gupta & Ramdas 2021: one cell per (class, bin)),
``"classwise"`` (one-vs-rest per class, Kull et al. 2019). ``input="logits" | "probs"`` is an
argument, never guessed.

**Binning.** ``c`` goes to bin ``min(floor(c * B), B - 1)`` computed in float64 after
upcasting (bins ``[k/B, (k+1)/B)``, the last closed: 1.0 is in the last bin, 0.0 in the
first).

**Groups.** An optional ``groups`` tensor (a domain id per sample, in ``[0, num_groups)``)
adds a leading group axis to the statistics; results then come as
:class:`~torchcal.report.GroupedResult` with the pooled value beside one per group.

**Errors.** NaN/Inf scores, probabilities outside [0, 1] with ``input="probs"``, labels out
of range, shape mismatches, ``n_bins < 1`` and empty input raise ``ValueError`` naming the
argument (value checks can be switched off with
:func:`torchcal.functional.validation_enabled`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from torchcal.functional._validation import (
    check_binary_target,
    check_class_target,
    check_finite,
    check_floating,
    check_int,
    check_nonempty,
    check_option,
    check_probabilities,
    check_tensor,
    first_bad_position,
    values_checked,
)
from torchcal.report import GroupedResult, ReliabilityTable

__all__ = [
    "ESTIMATORS",
    "INPUTS",
    "INTERVALS",
    "NORMS",
    "READINGS",
    "BinnedStats",
    "CalibrationSamples",
    "PreparedInputs",
    "accumulate",
    "bin_index",
    "binned_statistics",
    "bootstrap_statistics",
    "brier_decomposition",
    "brier_decomposition_from_stats",
    "calibration_error",
    "calibration_error_bootstrap",
    "calibration_error_from_stats",
    "clopper_pearson_interval",
    "debiased_calibration_error_from_stats",
    "ece_bootstrap_from_stats",
    "ece_sweep_from_samples",
    "ece_sweep_from_stats",
    "equal_mass_calibration_error_from_samples",
    "equal_mass_calibration_error_from_stats",
    "negative_log_likelihood",
    "nll_items",
    "nll_sum",
    "prepare_inputs",
    "reliability_table",
    "reliability_table_from_stats",
    "smooth_calibration_error_from_samples",
    "smooth_calibration_error_from_stats",
    "wilson_interval",
]

READINGS = ("binary", "confidence", "top_label", "classwise")
INPUTS = ("logits", "probs")
NORMS = ("l1", "l2", "max")
INTERVALS = ("wilson", "clopper_pearson")
ESTIMATORS = ("binned", "debiased", "equal_mass", "sweep", "smooth")
#: estimators that need the fine histogram (or the samples with ``exact=True``)
FINE_ESTIMATORS = ("equal_mass", "sweep", "smooth")


# =============================================================================== statistics
@dataclass(frozen=True)
class BinnedStats:
    """Per-bin sufficient statistics; every field has shape ``(*lead, n_bins)``.

    ``lead`` is ``(G, K)`` as produced by :func:`binned_statistics`: ``G`` groups (1 without
    ``groups``) and ``K`` slots (1 for ``binary``/``confidence``, the classes for
    ``top_label`` and ``classwise``). Merging two streams is ``a + b``; ``stats.pooled()``
    sums the groups away.

    Attributes:
        count: samples per bin (int64).
        conf: sum of confidences (float64).
        acc: sum of outcomes, 0/1 (float64).
        conf2: sum of squared confidences (float64).
        conf_acc: sum of confidence x outcome (float64).

    Example:
        >>> import torch
        >>> from torchcal.functional.calibration import binned_statistics
        >>> a = binned_statistics(torch.tensor([0.1, 0.9]), torch.tensor([0, 1]),
        ...                       n_bins=2, reading="binary", input="probs")
        >>> (a + a).count.tolist()
        [[[2, 2]]]
    """

    count: Tensor
    conf: Tensor
    acc: Tensor
    conf2: Tensor
    conf_acc: Tensor

    @classmethod
    def zeros(cls, *shape: int, device: torch.device | str | None = None) -> BinnedStats:
        """All-zero statistics of shape ``shape`` (last entry: number of bins)."""
        z = torch.zeros(shape, dtype=torch.float64, device=device)
        return cls(torch.zeros(shape, dtype=torch.int64, device=device), z, z.clone(),
                   z.clone(), z.clone())

    def _map(self, fn: Any) -> BinnedStats:
        return BinnedStats(*(fn(getattr(self, f.name)) for f in fields(self)))

    def __add__(self, other: BinnedStats) -> BinnedStats:
        if not isinstance(other, BinnedStats):
            return NotImplemented
        if other.count.shape != self.count.shape:
            raise ValueError(f"other: expected statistics of shape {tuple(self.count.shape)}, "
                             f"got {tuple(other.count.shape)}")
        return BinnedStats(*(getattr(self, f.name) + getattr(other, f.name)
                             for f in fields(self)))

    @property
    def n_bins(self) -> int:
        """Number of bins (last dimension)."""
        return int(self.count.shape[-1])

    def pooled(self) -> BinnedStats:
        """Sum over the group axis: ``(G, K, B) -> (K, B)``."""
        return self._map(lambda t: t.sum(0))

    def group(self, g: int) -> BinnedStats:
        """The statistics of group ``g``: ``(G, K, B) -> (K, B)``."""
        return self._map(lambda t: t[g])

    def coarsen(self, n_bins: int) -> BinnedStats:
        """Merge adjacent bins: ``B_fine -> n_bins`` (``n_bins`` must divide ``B_fine``).

        Equal to binning with ``n_bins`` directly except for confidences within float64
        rounding of a coarse edge (``floor(c * B)`` is not always ``floor(c * mB) // m``).
        """
        if self.n_bins % n_bins:
            raise ValueError(f"n_bins: expected a divisor of {self.n_bins}, got {n_bins}")
        m = self.n_bins // n_bins
        return self._map(lambda t: t.reshape(*t.shape[:-1], n_bins, m).sum(-1))


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
        >>> s = CalibrationSamples(torch.tensor([0.2, 0.9], dtype=torch.float64),
        ...                        torch.tensor([0.0, 1.0], dtype=torch.float64),
        ...                        torch.zeros(2, dtype=torch.long))
        >>> round(float(equal_mass_calibration_error_from_samples(s, 2)), 4)
        0.15
    """

    conf: Tensor
    outcome: Tensor
    group: Tensor


def bin_index(conf: Tensor, n_bins: int) -> Tensor:
    """Equal-width bin of each confidence: ``min(floor(c * n_bins), n_bins - 1)`` in float64.

    Inputs of any floating dtype are upcast to float64 first, so ``k / B`` rounded to the
    input dtype lands in the bin its float64 value times ``B`` says; 1.0 goes to the last bin
    and 0.0 to the first. Values outside [0, 1] (possible only with validation off) are
    clamped into the first/last bin.

    Example:
        >>> import torch
        >>> bin_index(torch.tensor([0.0, 0.1, 0.5, 0.99, 1.0]), 10).tolist()
        [0, 1, 5, 9, 9]
    """
    return _bins(conf, check_int("n_bins", n_bins, minimum=1))


def _bins(conf: Tensor, n_bins: int) -> Tensor:
    """The binning rule (the one place it is written): ``min(floor(c * B), B - 1)`` in float64."""
    return (conf.to(torch.float64) * n_bins).floor_().to(torch.int64).clamp_(0, n_bins - 1)


def _check_groups(groups: Tensor, shape: torch.Size, num_groups: int | None) -> int:
    check_tensor("groups", groups)
    if groups.shape != shape:
        raise ValueError(f"groups: expected one group id per sample, shape {tuple(shape)}, "
                         f"got {tuple(groups.shape)}")
    if groups.is_floating_point() or groups.is_complex() or groups.dtype == torch.bool:
        raise ValueError(f"groups: expected integer group ids (torch.long), got {groups.dtype}")
    if num_groups is None:
        if groups.numel() == 0:
            raise ValueError("groups: expected a non-empty tensor")
        if bool((groups < 0).any()):
            pos = first_bad_position(groups < 0)
            raise ValueError(f"groups: expected group ids >= 0, found a negative id at {pos}")
        return int(groups.max()) + 1
    check_int("num_groups", num_groups, minimum=1)
    if values_checked():
        bad = (groups < 0) | (groups >= num_groups)
        if bool(bad.any()):
            pos = first_bad_position(bad)
            val = int(groups.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])])
            raise ValueError(f"groups: expected group ids in [0, {num_groups - 1}], got {val} "
                             f"at position {pos}")
    return num_groups


def _check_probabilities_fast(x: Tensor) -> None:
    """``check_probabilities`` with one fused min/max pass; the slow check only for the message."""
    if not values_checked():
        return
    lo, hi = torch.aminmax(x)
    if not bool((lo >= 0) & (hi <= 1)):  # NaN fails both
        check_probabilities("preds", x)


def _check_logits_via(name: str, x: Tensor, derived: Tensor) -> None:
    """Logit rows of ``x`` (``(M, C)``) must be finite except for ``-inf`` masks.

    Checked in O(M) on a per-row result ``derived`` that is NaN exactly when the row holds a
    NaN or ``+inf`` or is entirely ``-inf`` (max-softmax confidence, or the softmax's first
    column); the O(M C) scan runs only to name the position of a bad value.
    """
    if not values_checked():
        return
    bad = torch.isnan(derived)
    if bool(bad.any()):
        check_finite(name, x, allow_neg_inf=True)
        row = first_bad_position(bad)
        raise ValueError(f"{name}: expected at least one finite score per row, row {row} is "
                         f"entirely -inf")


def _sum_tolerance(dtype: torch.dtype, num_classes: int) -> float:
    """Tolerance on ``|sum_c p_c - 1|`` for a row of probabilities: ``max(1e-4, C * eps)``
    of the dtype (the rule of :func:`torchcal.functional.scoring.check_class_probabilities`):
    1e-4 for float64 and for float32 up to C = 838, ``C * 2^-7`` for bfloat16."""
    return max(1e-4, num_classes * torch.finfo(dtype).eps)


def _check_ignore_index(ignore_index: int | None) -> None:
    if ignore_index is not None and (isinstance(ignore_index, bool)
                                     or not isinstance(ignore_index, int)):
        raise TypeError(f"ignore_index: expected an int or None, got "
                        f"{type(ignore_index).__name__}")


def _raise_bad_prob_rows(x: Tensor, total: Tensor, tol: float) -> None:
    """Name the culprit of a failed fused probability check (slow path, on failure only)."""
    check_probabilities("preds", x)  # NaN/Inf/outside [0, 1]
    bad = (total.to(torch.float64) - 1).abs() > tol
    row = first_bad_position(bad)
    val = float(total.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])])
    raise ValueError(f"preds: expected probabilities whose sum over the classes (dim 1) is 1 "
                     f"(tolerance {tol:.3g}), got {val!r} in row {row}; pass input='logits' "
                     f"for unnormalised scores")


def _rows_look_like_probs(x: Tensor) -> bool:
    """Every row of ``x`` ``(M, C)`` in [0, 1] and summing to 1 (probabilities passed as
    logits); called only when the O(M) necessary conditions already hold."""
    tol = _sum_tolerance(x.dtype, x.shape[1])
    total = x.sum(dim=1, dtype=torch.float64)
    return bool((x.amin() >= 0) & ((total - 1).abs() <= tol).all())


def _check_class_target_fast(target: Tensor, num_classes: int, ignore_index: int | None
                             ) -> None:
    """``check_class_target`` with one fused ``aminmax`` on the common path."""
    if (values_checked() and target.numel() and not target.is_floating_point()
            and target.dtype != torch.bool and not target.is_complex()):
        lo, hi = torch.aminmax(target)
        if bool((lo >= 0) & (hi < num_classes)):
            return
    check_class_target("target", target, num_classes, ignore_index=ignore_index)


def _logit_rows(x: Tensor) -> tuple[Tensor, Tensor, Tensor, bool]:
    """The fused confidence pass over logits ``(M, C)``, ``M >= 1``.

    Returns ``top`` (row maxima ``(M, 1)``), ``e = exp(x - top)`` and ``s = sum_j e_j``
    (float32 for float16/bfloat16/float32 logits, float64 for float64), and whether every
    row lies in [0, 1] and sums to 1 (probabilities passed as logits). Every step is exact
    (max, subtraction's correct rounding) or row-wise (``exp`` of a value, the row's sum),
    so a row's confidence ``1 / s`` does not depend on where the row sits in a batch:
    streaming equals one call bit for bit (tested; unlike float32 ``sigmoid``, which rounds
    by position and is therefore run in float64 for binary logits). Validation costs O(M)
    and one host sync: ``s`` is NaN exactly for a row with a NaN or ``+inf`` or only
    ``-inf`` entries, and probabilities force ``max <= 1`` and ``s >= C / e``; the O(M C)
    scans run only to name a culprit or to confirm the probability pattern.
    """
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    top = work.amax(dim=1, keepdim=True)
    e = (work - top).exp_()
    s = e.sum(dim=1)
    looks = False
    if values_checked():  # one host sync: min propagates NaN
        s_min, t_max = torch.stack([s.min(), top.max()]).tolist()
        if math.isnan(s_min):
            _check_logits_via("preds", x, s)
        looks = t_max <= 1 and s_min >= 0.36 * x.shape[1] and _rows_look_like_probs(x)
    return top, e, s, looks


def _first_max_hit(x: Tensor, t: Tensor, top: Tensor, maybe_tie: Tensor) -> Tensor:
    """Whether ``argmax(x_i) == t_i`` (first maximum wins, as ``torch.max``) from the row
    maxima, without the slow indexed reduction on most rows: ``t`` is right iff it attains
    the maximum and no earlier class does; ``torch.max`` re-checks only the rows that hit
    the maximum and where ``maybe_tie`` (a superset of the rows with two maxima) is set."""
    hit = (x.gather(1, t.unsqueeze(1)) == top).squeeze(1)
    rows = (hit & maybe_tie).nonzero().squeeze(1)  # the one host sync
    if rows.numel():
        hit[rows] = x[rows].max(dim=1).indices == t[rows]
    return hit


def _prob_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """The fused confidence pass over probabilities ``(M, C)``: row maxima ``(M, 1)`` and
    the superset of rows that may hold two maxima; validated (values in [0, 1], rows sum to 1
    within :func:`_sum_tolerance`) from one ``amin``, the row maxima and the row sums."""
    top = x.amax(dim=1, keepdim=True)
    if not values_checked():
        return top, torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    tol = _sum_tolerance(x.dtype, x.shape[1])
    total = x.sum(dim=1)
    s_lo, s_hi = torch.aminmax(total)
    lo, hi, s_lo, s_hi = torch.stack([x.amin(), top.max(), s_lo, s_hi]).tolist()
    if not (lo >= 0 and hi <= 1 and s_lo >= 1 - tol and s_hi <= 1 + tol):  # NaN fails all
        _raise_bad_prob_rows(x, total, tol)
    # two maxima force 2 * max <= sum <= 1 + tol
    return top, top.squeeze(1) <= (1 + 2 * tol) / 2


def prepare_inputs(preds: Tensor, target: Tensor, *, reading: str = "confidence",
                   input: str = "logits", num_classes: int | None = None,
                   groups: Tensor | None = None, num_groups: int | None = None,
                   ignore_index: int | None = None) -> PreparedInputs:
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
    :func:`_logit_rows`. Either way an element's confidence does not depend on its position
    in the batch, so streaming equals one call.

    ``looks_like_probs`` is set when ``input="logits"`` and every row of a multiclass
    ``preds`` lies in [0, 1] and sums to 1 (the callers warn).

    Example:
        >>> import torch
        >>> p = prepare_inputs(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))
        >>> [round(c, 4) for c in p.conf.tolist()], p.outcome.tolist()
        ([0.8808, 0.7311], [True, False])
    """
    check_option("reading", reading, READINGS)
    check_option("input", input, INPUTS)
    _check_ignore_index(ignore_index)
    check_floating("preds", preds)
    check_tensor("target", target)
    check_nonempty("preds", preds)
    G = 1
    if groups is not None:
        G = _check_groups(groups, target.shape, num_groups)
    elif num_groups is not None:
        G = check_int("num_groups", num_groups, minimum=1)
    g = None if groups is None else groups.reshape(-1).to(torch.int64)
    looks = False
    if reading == "binary":
        if (preds.shape != target.shape and preds.dim() == 2 and preds.shape[1] == 1
                and target.shape == preds.shape[:1]):
            preds = preds.reshape(target.shape)  # a binary head (B, 1) with (B,) targets
        if preds.shape != target.shape:
            raise ValueError(f"target: expected the shape of preds {tuple(preds.shape)} for "
                             f"reading='binary' (or (B,) for a (B, 1) binary head), got "
                             f"{tuple(target.shape)}")
        check_binary_target("target", target, ignore_index=ignore_index)
        p = preds.reshape(-1)
        t = target.reshape(-1)
        if ignore_index is not None:
            keep = t != ignore_index
            if not bool(keep.all()):
                p, t = p[keep], t[keep]
                g = None if g is None else g[keep]
        if input == "logits":
            check_finite("preds", p)
            conf = torch.sigmoid(p.to(torch.float64))
        else:
            _check_probabilities_fast(p)
            conf = p
        outcome = t
        slot = None
        K = 1
    else:
        if preds.dim() < 2:
            raise ValueError(f"preds: expected scores of shape (N, C, *) for reading={reading!r}, "
                             f"got shape {tuple(preds.shape)}; use reading='binary' for one "
                             f"probability per sample")
        C = preds.shape[1]
        if C < 2:
            raise ValueError(f"preds: expected C >= 2 classes in dim 1 for reading={reading!r}, "
                             f"got shape {tuple(preds.shape)}; a single score per sample is "
                             f"binary: use reading='binary'")
        if num_classes is not None and num_classes != C:
            raise ValueError(f"preds: expected {num_classes} classes (num_classes) in dim 1, "
                             f"got {C}")
        expected = (preds.shape[0],) + tuple(preds.shape[2:])
        if tuple(target.shape) != expected:
            raise ValueError(f"target: expected shape {expected} for preds of shape "
                             f"{tuple(preds.shape)}, got {tuple(target.shape)}")
        _check_class_target_fast(target, C, ignore_index)
        x = preds.movedim(1, -1).reshape(-1, C) if preds.dim() > 2 else preds
        t = target.reshape(-1)
        if ignore_index is not None:
            keep = t != ignore_index
            if not bool(keep.all()):
                x, t = x[keep], t[keep]
                g = None if g is None else g[keep]
        if t.numel() == 0:  # everything ignored
            conf = torch.zeros(0, dtype=torch.float64, device=x.device)
            outcome = torch.zeros(0, dtype=torch.bool, device=x.device)
            slot = torch.zeros(0, dtype=torch.int64, device=x.device)
        elif reading == "classwise":
            if input == "logits":  # every class's probability is binned: float64 link
                _, e, s, looks = _logit_rows(x.to(torch.float64))
                probs = e.div_(s.unsqueeze(1))
            else:
                _prob_rows(x)
                probs = x
            conf = probs.reshape(-1)
            outcome = (t.unsqueeze(1) == torch.arange(C, device=t.device)).reshape(-1)
            slot = torch.arange(C, device=t.device).repeat(t.shape[0])
        elif input == "logits":
            top, _, s, looks = _logit_rows(x)
            conf = s.reciprocal()
            if reading == "top_label":
                slot = x.max(dim=1).indices
                outcome = slot == t
            else:  # two maxima contribute exactly 1 each: s >= 2
                outcome = _first_max_hit(x, t, top, s >= 2)
                slot = None
        else:
            top, maybe_tie = _prob_rows(x)
            conf = top.squeeze(1)
            if reading == "top_label":
                slot = x.max(dim=1).indices
                outcome = slot == t
            else:
                outcome = _first_max_hit(x, t, top, maybe_tie)
                slot = None
        K = C if reading in ("top_label", "classwise") else 1
    n_samples = t.numel()
    if g is not None:
        group_counts = torch.bincount(g.clamp(0, G - 1), minlength=G)
        if reading == "classwise":
            g = g.repeat_interleave(K)
        lead = g * K if slot is None else g * K + slot
    else:
        group_counts = torch.full((G,), n_samples, dtype=torch.int64, device=t.device)
        if G > 1:
            group_counts[1:] = 0
        lead = slot
    return PreparedInputs(conf, outcome, lead, G, K, group_counts,
                          K if reading == "classwise" else 1, looks)


PROBS_AS_LOGITS = ("preds: every row lies in [0, 1] and sums to 1: these look like probabilities "
                   "passed with input='logits' (the default), which softmaxes them again and "
                   "gives a wrong calibration error; pass input='probs' if they are "
                   "probabilities")


def warn_probs_as_logits(prep: PreparedInputs, stacklevel: int = 3) -> None:
    """Warn (``UserWarning``) when :func:`prepare_inputs` flagged probabilities passed as
    logits."""
    if prep.looks_like_probs:
        warnings.warn(PROBS_AS_LOGITS, UserWarning, stacklevel=stacklevel)


def _prepare(preds: Tensor, target: Tensor, **kw: Any) -> PreparedInputs:
    """:func:`prepare_inputs` for the one-shot functionals: warns on probabilities passed as
    logits, and raises when ``ignore_index`` removed every element."""
    prep = prepare_inputs(preds, target, **kw)
    warn_probs_as_logits(prep, stacklevel=4)
    if prep.conf.numel() == 0:
        raise ValueError(f"target: every target equals ignore_index={kw.get('ignore_index')}, "
                         f"nothing to measure")
    return prep


#: elements per block of the float64 per-bin sums (see :func:`_blocked_bincount`)
_BLOCK = 1 << 14


def _blocked_bincount(idx: Tensor, size: int) -> Any:
    """``weights -> per-cell float64 sums`` with bounded rounding error.

    ``torch.bincount`` adds sequentially, so one cell collecting M values carries a relative
    error up to ~M * 2^-53 (3e-10 for 20M values of 0.95). Above ``_BLOCK`` elements the
    input is cut into blocks of ``_BLOCK`` that are binned into separate rows, and the rows
    are summed by ``torch.sum`` (blocked/cascade): relative error ~1e-13 at any M.
    """
    M = idx.numel()
    if M <= _BLOCK:
        return lambda w: torch.bincount(idx, weights=w, minlength=size)
    nb = M // _BLOCK
    head = nb * _BLOCK
    offsets = torch.arange(nb, device=idx.device).mul_(size).unsqueeze(1)
    idx_h = (idx[:head].view(nb, _BLOCK) + offsets).view(-1)
    idx_t = idx[head:]

    def wsum(w: Tensor) -> Tensor:
        h = torch.bincount(idx_h, weights=w[:head], minlength=nb * size).view(nb, size).sum(0)
        return h + torch.bincount(idx_t, weights=w[head:], minlength=size)

    return wsum


def accumulate(prep: PreparedInputs, n_bins: int) -> BinnedStats:
    """Bin prepared inputs into :class:`BinnedStats` of shape ``(G, K, n_bins)``.

    One ``torch.bincount`` per statistic over the flat cell index ``lead * B + bin`` (blocked
    above 16384 elements to bound the float64 rounding error); no loop over bins or samples.

    Example:
        >>> import torch
        >>> prep = prepare_inputs(torch.tensor([0.1, 0.6, 0.7]), torch.tensor([0, 1, 0]),
        ...                       reading="binary", input="probs")
        >>> s = accumulate(prep, 2)
        >>> s.count.tolist(), [round(v, 2) for v in s.conf.flatten().tolist()]
        ([[[1, 2]]], [0.1, 1.3])
    """
    c = prep.conf.to(torch.float64)
    idx = _bins(c, n_bins)
    if prep.lead is not None:
        idx.add_(prep.lead, alpha=n_bins)
    G, K = prep.num_groups, prep.num_slots
    size = G * K * n_bins
    o = prep.outcome.to(torch.float64)
    shape = (G, K, n_bins)
    count = torch.bincount(idx, minlength=size)
    wsum = _blocked_bincount(idx, size)
    s_c = wsum(c)
    s_o = wsum(o)
    s_cc = wsum(c * c)
    s_co = wsum(c * o)
    if count.numel() != size:  # only with validation off and out-of-range groups
        raise ValueError(f"groups: expected group ids in [0, {G - 1}]")
    return BinnedStats(count.view(shape), s_c.view(shape), s_o.view(shape), s_cc.view(shape),
                       s_co.view(shape))


def binned_statistics(preds: Tensor, target: Tensor, *, n_bins: int = 15,
                      reading: str = "confidence", input: str = "logits",
                      num_classes: int | None = None, groups: Tensor | None = None,
                      num_groups: int | None = None, ignore_index: int | None = None
                      ) -> BinnedStats:
    """Binned sufficient statistics of shape ``(G, K, n_bins)`` (see :class:`BinnedStats`).

    Example:
        >>> import torch
        >>> s = binned_statistics(torch.tensor([0.05, 0.5, 1.0]), torch.tensor([0, 1, 1]),
        ...                       n_bins=2, reading="binary", input="probs")
        >>> s.count.tolist(), s.acc.tolist()
        ([[[1, 2]]], [[[0.0, 2.0]]])
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    prep = _prepare(preds, target, reading=reading, input=input, num_classes=num_classes,
                    groups=groups, num_groups=num_groups, ignore_index=ignore_index)
    return accumulate(prep, n_bins)


# =============================================================================== intervals
def _z(level: float) -> float:
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level: expected a value in the open interval (0, 1), got {level!r}")
    return float(torch.special.ndtri(torch.tensor(0.5 + level / 2, dtype=torch.float64)))


def wilson_interval(successes: Tensor, trials: Tensor, level: float = 0.95
                    ) -> tuple[Tensor, Tensor]:
    """Wilson (1927) score interval for a binomial proportion (no continuity correction).

    ``NaN`` where ``trials == 0``. Matches ``scipy.stats.binomtest(k, n)
    .proportion_ci(level, method="wilson")``.

    Example:
        >>> import torch
        >>> lo, hi = wilson_interval(torch.tensor([7.0]), torch.tensor([7.0]))
        >>> round(float(lo), 4), round(float(hi), 4)
        (0.6457, 1.0)
    """
    z = _z(level)
    k = successes.to(torch.float64)
    n = trials.to(torch.float64)
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = (z / denom) * torch.sqrt((p * (1 - p) / n + z2 / (4 * n * n)).clamp_min(0))
    # the closed form is exactly 0 at k = 0 and 1 at k = n; rounding can miss by 1e-16 and
    # put the bound on the wrong side of the accuracy (a negative whisker in a plot)
    lo = torch.where(k <= 0, 0.0, (center - half).clamp(0, 1))
    hi = torch.where(k >= n, 1.0, (center + half).clamp(0, 1))
    return torch.where(n > 0, lo, math.nan), torch.where(n > 0, hi, math.nan)


def clopper_pearson_interval(successes: Tensor, trials: Tensor, level: float = 0.95
                             ) -> tuple[Tensor, Tensor]:
    """Clopper & Pearson (1934) exact interval: beta quantiles
    ``B^-1(a/2; k, n-k+1)`` and ``B^-1(1-a/2; k+1, n-k)``.

    Needs ``scipy`` (for ``scipy.special.betaincinv``; imported here only). ``NaN`` where
    ``trials == 0``.

    Example:
        >>> import torch
        >>> lo, hi = clopper_pearson_interval(torch.tensor([7.0]), torch.tensor([7.0]))
        >>> round(float(lo), 4), round(float(hi), 4)
        (0.5904, 1.0)
    """
    _z(level)
    try:
        from scipy.special import betaincinv
    except ImportError as e:  # pragma: no cover - scipy is a test/bench extra
        raise ImportError("interval='clopper_pearson' needs scipy; use interval='wilson'") from e
    k = successes.detach().to(torch.float64).cpu()
    n = trials.detach().to(torch.float64).cpu()
    a = 1.0 - level
    nan = torch.full_like(k, math.nan)
    empty = n <= 0
    kk = k.numpy()
    nn = n.numpy()
    with torch.no_grad():
        import numpy as np
        with np.errstate(invalid="ignore", divide="ignore"):
            lo = torch.from_numpy(np.where(kk > 0, betaincinv(kk, nn - kk + 1, a / 2), 0.0))
            hi = torch.from_numpy(np.where(kk < nn, betaincinv(kk + 1, nn - kk, 1 - a / 2), 1.0))
    lo = torch.where(empty, nan, lo)
    hi = torch.where(empty, nan, hi)
    return lo.to(successes.device), hi.to(successes.device)


# =============================================================================== tables
def _tables(stats: BinnedStats, interval: str, level: float, reading: str
            ) -> list[ReliabilityTable]:
    """One table per row of ``(K, B)`` statistics, with every column computed in one pass."""
    B = stats.n_bins
    edges = torch.arange(B + 1, dtype=torch.float64) / B
    with torch.no_grad():
        count = stats.count.cpu()
        n = count.to(torch.float64)
        s_acc = stats.acc.cpu()
        conf = stats.conf.cpu() / n
        acc = s_acc / n
        fn = wilson_interval if interval == "wilson" else clopper_pearson_interval
        lo, hi = fn(s_acc, n, level)
    return [ReliabilityTable(edges[:-1], edges[1:], count[k], conf[k], acc[k], lo[k], hi[k],
                             float(level), interval, reading)
            for k in range(count.shape[0])]


def reliability_table_from_stats(stats: BinnedStats, *, interval: str = "wilson",
                                 level: float = 0.95, reading: str = "confidence"
                                 ) -> ReliabilityTable:
    """:class:`~torchcal.report.ReliabilityTable` of statistics ``(K, B)`` (or ``(B,)``).

    For ``K > 1`` (``top_label``/``classwise``) the table pools the classes bin by bin and
    ``per_class`` holds one table per class; the table's ``ece`` is still the error of the
    reading (count-weighted over predicted classes for ``top_label``, the mean over classes
    for ``classwise``), as :func:`calibration_error` gives it.

    Example:
        >>> import torch
        >>> s = binned_statistics(torch.tensor([0.2, 0.8]), torch.tensor([0, 1]), n_bins=2,
        ...                       reading="binary", input="probs")
        >>> reliability_table_from_stats(s.pooled()).count.tolist()
        [1, 1]
    """
    check_option("interval", interval, INTERVALS)
    check_option("reading", reading, READINGS)
    _z(level)
    if stats.count.dim() == 1:
        stats = stats._map(lambda t: t.unsqueeze(0))
    if stats.count.dim() != 2:
        raise ValueError(f"stats: expected (K, B) statistics, got {tuple(stats.count.shape)}")
    if stats.count.shape[0] == 1:
        return _tables(stats, interval, level, reading)[0]
    per_class = tuple(_tables(stats, interval, level, reading))
    table = _tables(stats._map(lambda t: t.sum(0, keepdim=True)), interval, level, reading)[0]
    table.per_class = per_class
    return table


# =============================================================================== ECE family
def _check_nonempty_stats(stats: BinnedStats) -> None:
    if int(stats.count.sum()) == 0:
        raise ValueError("stats: no samples were accumulated (empty input, or compute() before "
                         "any update())")


def calibration_error_from_stats(stats: BinnedStats, *, norm: str = "l1",
                                 reading: str = "confidence") -> Tensor:
    """Equal-width ECE (``norm="l1"``), RMSCE (``"l2"``) or MCE (``"max"``) of ``(..., K, B)``
    statistics; returns shape ``(...)`` (``NaN`` where a leading entry has no samples).

    ``l1``: ``sum_b n_b / N |conf_b - acc_b|`` (Naeini et al. 2015, Guo et al. 2017);
    ``l2``: ``sqrt(sum_b n_b / N (conf_b - acc_b)^2)``; ``max``: ``max_b |conf_b - acc_b|``
    over non-empty bins. ``top_label`` treats each (class, bin) as a bin, which is the
    count-weighted average over predicted classes (Gupta & Ramdas 2021); ``classwise``
    aggregates the one-vs-rest errors ``e_k`` of the classes by the power mean of the norm,
    as the marginal calibration error of Kumar et al. (2019; ``verified_calibration``):
    ``mean_k e_k`` for ``l1`` (Kull et al. 2019), ``sqrt(mean_k e_k^2)`` for ``l2``,
    ``max_k e_k`` for ``max``.

    Example:
        >>> import torch
        >>> s = binned_statistics(torch.tensor([0.9, 0.9, 0.2]), torch.tensor([1, 0, 0]),
        ...                       n_bins=10, reading="binary", input="probs")
        >>> round(float(calibration_error_from_stats(s.pooled(), reading="binary")), 4)
        0.3333
    """
    check_option("norm", norm, NORMS)
    check_option("reading", reading, READINGS)
    n = stats.count.to(torch.float64)
    gap = stats.conf - stats.acc  # sums
    if reading != "classwise":  # flatten (K, B) cells
        n = n.flatten(-2)
        gap = gap.flatten(-2)
    N = n.sum(-1)
    nonempty = n > 0
    if norm == "l1":
        err = gap.abs().sum(-1) / N
    elif norm == "l2":
        err = torch.sqrt(torch.where(nonempty, gap * gap / n, 0.0).sum(-1) / N)
    else:
        err = torch.where(nonempty, gap.abs() / n, -math.inf).amax(-1)
        err = torch.where(N > 0, err, math.nan)
    if reading == "classwise":
        err = _class_mean(err, norm)
    return err


def _class_mean(err: Tensor, norm: str) -> Tensor:
    """Aggregate per-class errors ``(..., K)`` by the power mean of the norm, as
    ``verified_calibration`` (Kumar et al. 2019) does for its marginal (classwise) error:
    ``l1`` the mean, ``l2`` the root mean square, ``max`` the maximum (NaN propagates)."""
    if norm == "l1":
        return err.mean(-1)
    if norm == "l2":
        return torch.sqrt((err * err).mean(-1))
    return err.amax(-1)


def debiased_calibration_error_from_stats(stats: BinnedStats, *,
                                          reading: str = "confidence") -> Tensor:
    """Debiased L2 calibration error of Kumar, Liang & Ma (2019), shape ``(...)``.

    Per non-empty bin the plug-in ``(conf_b - acc_b)^2`` minus the variance of the bin's
    accuracy ``acc_b (1 - acc_b) / (n_b - 1)``; bins with fewer than two samples contribute
    0; the weighted sum ``sum_b n_b / N (...)`` is clipped at 0 and square-rooted (as their
    ``unbiased_l2_ce``). ``classwise`` is the root of the mean over classes of the clipped
    squares (their marginal calibration error).

    Example:
        >>> import torch
        >>> s = binned_statistics(torch.tensor([0.9, 0.9, 0.9, 0.9]), torch.tensor([1, 1, 0, 0]),
        ...                       n_bins=10, reading="binary", input="probs")
        >>> round(float(debiased_calibration_error_from_stats(s.pooled())), 4)  # 0.16 - 1/12
        0.2769
    """
    check_option("reading", reading, READINGS)
    n = stats.count.to(torch.float64)
    gap = stats.conf - stats.acc
    acc = stats.acc
    if reading != "classwise":
        n, gap, acc = n.flatten(-2), gap.flatten(-2), acc.flatten(-2)
    N = n.sum(-1)
    ok = n >= 2
    a = acc / n
    term = (gap / n) ** 2 - a * (1 - a) / (n - 1)
    sq = torch.where(ok, n * term, 0.0).sum(-1) / N
    if reading == "classwise":  # root of the mean over classes of the clipped squares
        return torch.sqrt(sq.clamp_min(0).mean(-1))
    return torch.sqrt(sq.clamp_min(0))


def brier_decomposition_from_stats(stats: BinnedStats, *, reading: str = "confidence"
                                   ) -> dict[str, Tensor]:
    """Brier score and its exact Murphy decomposition from ``(..., K, B)`` statistics.

    ``brier = reliability - resolution + uncertainty + within_bin_variance
    - 2 * within_bin_covariance`` holds exactly (Murphy 1973; the two within-bin terms of
    Stephenson, Coelho & Jolliffe 2008 make the binned decomposition exact):

    * ``reliability = sum_b n_b (f_b - o_b)^2 / N``, ``resolution = sum_b n_b (o_b - o)^2 / N``,
      ``uncertainty = o (1 - o)``;
    * ``within_bin_variance = sum_b sum_{i in b} (f_i - f_b)^2 / N``,
      ``within_bin_covariance = sum_b sum_{i in b} (f_i - f_b)(y_i - o_b) / N``.

    ``top_label`` uses the (class, bin) cells as the partition; ``classwise`` sums the
    one-vs-rest decompositions over classes, so ``brier`` is the multiclass Brier score
    ``mean_i sum_k (p_ik - y_ik)^2``.

    Example:
        >>> import torch
        >>> s = binned_statistics(torch.tensor([0.9, 0.1]), torch.tensor([1, 1]), n_bins=2,
        ...                       reading="binary", input="probs")
        >>> round(float(brier_decomposition_from_stats(s.pooled())["brier"]), 4)
        0.41
    """
    check_option("reading", reading, READINGS)
    n = stats.count.to(torch.float64)
    sc, sa, scc, sca = stats.conf, stats.acc, stats.conf2, stats.conf_acc
    if reading != "classwise":
        n, sc, sa, scc, sca = (t.flatten(-2).unsqueeze(-2) for t in (n, sc, sa, scc, sca))
    N = n.sum(-1)
    safe = n.clamp_min(1)
    fb = sc / safe
    ob = sa / safe
    o = sa.sum(-1) / N
    out = {
        "brier": (scc.sum(-1) - 2 * sca.sum(-1) + sa.sum(-1)) / N,
        "reliability": (n * (fb - ob) ** 2).sum(-1) / N,
        "resolution": (n * (ob - o.unsqueeze(-1)) ** 2).sum(-1) / N,
        "uncertainty": o * (1 - o),
        "within_bin_variance": (scc - sc * fb).sum(-1) / N,
        "within_bin_covariance": (sca - sc * ob).sum(-1) / N,
    }
    return {k: v.sum(-1) for k, v in out.items()}


# ---------------------------------------------------------------- fine-histogram estimators
def _require_single_slot(stats: BinnedStats, what: str) -> BinnedStats:
    if stats.count.dim() == 2:
        if stats.count.shape[0] != 1:
            raise ValueError(f"reading: {what} is defined for reading='binary' or 'confidence' "
                             f"(one slot), got statistics with {stats.count.shape[0]} slots")
        stats = stats._map(lambda t: t[0])
    if stats.count.dim() != 1:
        raise ValueError(f"stats: expected (B,) or (1, B) statistics, got "
                         f"{tuple(stats.count.shape)}")
    return stats


def _equal_mass_sums(cum_n: Tensor, cum_c: Tensor, cum_o: Tensor, n_bins: int
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """Sums of conf and outcome in ``n_bins`` equal-mass bins of a piecewise-linear
    cumulative distribution (knots ``cum_n``, values ``cum_c``/``cum_o``)."""
    N = cum_n[-1]
    m = torch.arange(n_bins + 1, dtype=torch.float64) * (N / n_bins)
    j = (torch.searchsorted(cum_n, m, right=False) - 1).clamp_(0, cum_n.numel() - 2)
    x0, x1 = cum_n[j], cum_n[j + 1]
    t = torch.where(x1 > x0, (m - x0) / (x1 - x0).clamp_min(1e-300), 0.0).clamp_(0, 1)
    vc = cum_c[j] + t * (cum_c[j + 1] - cum_c[j])
    vo = cum_o[j] + t * (cum_o[j + 1] - cum_o[j])
    vc[0], vo[0] = 0.0, 0.0
    vc[-1], vo[-1] = cum_c[-1], cum_o[-1]
    return m.diff(), vc.diff(), vo.diff()


def _norm_of(n: Tensor, gap_sum: Tensor, norm: str) -> Tensor:
    N = n.sum()
    if norm == "l1":
        return gap_sum.abs().sum() / N
    ok = n > 0
    if norm == "l2":
        return torch.sqrt(torch.where(ok, gap_sum * gap_sum / n.clamp_min(1e-300), 0.0).sum()
                          / N)
    return torch.where(ok, gap_sum.abs() / n.clamp_min(1e-300), -math.inf).max()


def _cumulative(stats: BinnedStats) -> tuple[Tensor, Tensor, Tensor]:
    z = torch.zeros(1, dtype=torch.float64)
    cum_n = torch.cat([z, stats.count.to(torch.float64).cpu().cumsum(0)])
    cum_c = torch.cat([z, stats.conf.cpu().cumsum(0)])
    cum_o = torch.cat([z, stats.acc.cpu().cumsum(0)])
    return cum_n, cum_c, cum_o


def _sorted_cumulative(samples: CalibrationSamples) -> tuple[Tensor, Tensor, Tensor]:
    order = torch.argsort(samples.conf, stable=True)
    z = torch.zeros(1, dtype=torch.float64)
    c = samples.conf[order].cpu()
    o = samples.outcome[order].cpu()
    cum_n = torch.arange(c.numel() + 1, dtype=torch.float64)
    return cum_n, torch.cat([z, c.cumsum(0)]), torch.cat([z, o.cumsum(0)])


def _equal_mass(cum: tuple[Tensor, Tensor, Tensor], n_bins: int, norm: str) -> Tensor:
    n, sc, so = _equal_mass_sums(*cum, n_bins)
    return _norm_of(n, sc - so, norm)


def _sweep(cum: tuple[Tensor, Tensor, Tensor], norm: str, max_bins: int) -> Tensor:
    # bin sums are differences of cumulative sums: each carries an absolute rounding error of
    # a few ulps of the total, so a "decrease" below ``slack / n_b`` is rounding (e.g. two
    # all-correct bins at 1.0 and 0.9999999999999983), not a violation of monotonicity
    slack = 16 * torch.finfo(torch.float64).eps * max(float(cum[2][-1]), 1.0)
    best = _equal_mass(cum, 1, norm)
    for b in range(2, max_bins + 1):
        n, sc, so = _equal_mass_sums(*cum, b)
        acc = so / n
        if bool((acc.diff() < -2 * slack / n.min()).any()):
            break
        best = _norm_of(n, sc - so, norm)
    return best


def equal_mass_calibration_error_from_stats(fine: BinnedStats, n_bins: int = 15, *,
                                            norm: str = "l1") -> Tensor:
    """Equal-mass (adaptive) ECE from a fine histogram (Nguyen & O'Connor 2015; Roelofs et
    al. 2022).

    The ``b``-th bin holds the samples of rank ``[b N / B, (b + 1) N / B)`` in confidence
    order. A fine bin that straddles a boundary is split in proportion to its count (its
    sums are taken as spread evenly over it); with 4096 sub-bins this is within a few 1e-5 of
    the sort-based value (:func:`equal_mass_calibration_error_from_samples`), exactly equal
    where the gap keeps its sign across each boundary.

    Example:
        >>> import torch
        >>> p = torch.tensor([0.1, 0.2, 0.8, 0.9], dtype=torch.float64)
        >>> fine = binned_statistics(p, torch.tensor([0, 1, 1, 1]), n_bins=4096,
        ...                          reading="binary", input="probs").pooled()
        >>> round(float(equal_mass_calibration_error_from_stats(fine, 2)), 4)  # .5*.35 + .5*.15
        0.25
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    check_option("norm", norm, NORMS)
    fine = _require_single_slot(fine, "equal-mass ECE")
    _check_nonempty_stats(fine)
    return _equal_mass(_cumulative(fine), n_bins, norm)


def equal_mass_calibration_error_from_samples(samples: CalibrationSamples, n_bins: int = 15, *,
                                              norm: str = "l1") -> Tensor:
    """Sort-based equal-mass ECE (the exact reference; same rank convention as
    :func:`equal_mass_calibration_error_from_stats`, a fractional rank boundary splits one
    sample).

    Example:
        >>> import torch
        >>> s = CalibrationSamples(torch.tensor([0.1, 0.2, 0.8, 0.9], dtype=torch.float64),
        ...                        torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64),
        ...                        torch.zeros(4, dtype=torch.long))
        >>> round(float(equal_mass_calibration_error_from_samples(s, 2)), 4)  # .5*.35 + .5*.15
        0.25
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    check_option("norm", norm, NORMS)
    if samples.conf.numel() == 0:
        raise ValueError("samples: no samples were kept")
    return _equal_mass(_sorted_cumulative(samples), n_bins, norm)


def ece_sweep_from_stats(fine: BinnedStats, *, norm: str = "l1",
                         max_bins: int | None = None) -> Tensor:
    """ECE_sweep (Roelofs et al. 2022) from a fine histogram: equal-mass ECE at the largest
    number of bins ``b`` such that the bin accuracies of ``1 .. b`` bins were all monotone
    non-decreasing (the sweep stops at the first non-monotone ``b``). ``max_bins`` defaults
    to ``min(N, number of fine bins)``.

    Example:
        >>> import torch
        >>> p = torch.tensor([0.1, 0.2, 0.8, 0.9], dtype=torch.float64)
        >>> fine = binned_statistics(p, torch.tensor([0, 1, 1, 1]), n_bins=4096,
        ...                          reading="binary", input="probs").pooled()
        >>> round(float(ece_sweep_from_stats(fine)), 4)  # monotone up to 4 bins: mean |f - y|
        0.3
    """
    check_option("norm", norm, NORMS)
    fine = _require_single_slot(fine, "ECE_sweep")
    _check_nonempty_stats(fine)
    N = int(fine.count.sum())
    limit = min(N, fine.n_bins) if max_bins is None else check_int("max_bins", max_bins,
                                                                   minimum=1)
    return _sweep(_cumulative(fine), norm, limit)


def ece_sweep_from_samples(samples: CalibrationSamples, *, norm: str = "l1",
                           max_bins: int | None = None) -> Tensor:
    """Sort-based ECE_sweep (Roelofs et al. 2022); ``max_bins`` defaults to ``N``.

    Example:
        >>> import torch
        >>> s = CalibrationSamples(torch.tensor([0.1, 0.2, 0.8, 0.9], dtype=torch.float64),
        ...                        torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64),
        ...                        torch.zeros(4, dtype=torch.long))
        >>> round(float(ece_sweep_from_samples(s)), 4)
        0.3
    """
    check_option("norm", norm, NORMS)
    N = samples.conf.numel()
    if N == 0:
        raise ValueError("samples: no samples were kept")
    limit = N if max_bins is None else check_int("max_bins", max_bins, minimum=1)
    return _sweep(_sorted_cumulative(samples), norm, limit)


# smooth ECE -------------------------------------------------------------------------------
def _deposit_samples(f: Tensor, y: Tensor, points: int) -> Tensor:
    """Linear interpolation of values ``y`` at ``f`` onto ``points`` grid nodes on [0, 1]."""
    x = f * (points - 1)
    j = x.to(torch.int64).clamp_(0, points - 2)
    frac = x - j
    out = torch.bincount(j, weights=(1 - frac) * y, minlength=points)
    return out + torch.bincount(j + 1, weights=frac * y, minlength=points)


def _deposit_stats(n: Tensor, s_f: Tensor, s_y: Tensor, s_fy: Tensor, points: int) -> Tensor:
    """Same as :func:`_deposit_samples` from per-bin sums (exact for bins inside one grid
    cell; zeroth and first moments exact otherwise)."""
    ok = n > 0
    mean = torch.where(ok, s_f / n.clamp_min(1), 0.0)
    j = (mean * (points - 1)).to(torch.int64).clamp_(0, points - 2)
    jf = j.to(torch.float64)
    left = torch.where(ok, (1 + jf) * s_y - (points - 1) * s_fy, 0.0)
    right = torch.where(ok, (points - 1) * s_fy - jf * s_y, 0.0)
    out = torch.bincount(j, weights=left, minlength=points)
    return out + torch.bincount(j + 1, weights=right, minlength=points)


def _reflected_smooth(values: Tensor, sigma: float) -> Tensor:
    """Convolve grid values with a Gaussian reflected at 0 and 1 (FFT, float64)."""
    E = values.numel()
    t = torch.linspace(0, 1, E, dtype=torch.float64)
    ker = torch.exp(-(t - 0.5) ** 2 / (2 * sigma * sigma)) / (math.sqrt(2 * math.pi) * sigma)
    ext = torch.cat([values.flip(0)[:-1], values, values.flip(0)[1:]])
    L = ext.numel()
    size = L + E - 1
    full = torch.fft.irfft(torch.fft.rfft(ext, size) * torch.fft.rfft(ker, size), size)
    valid = full[E - 1:L]
    return valid[E // 2:E // 2 + E]


def _interp_grid(values: Tensor, t: Tensor) -> Tensor:
    E = values.numel()
    x = t * (E - 1)
    j = x.to(torch.int64).clamp_(0, E - 2)
    r = x - j
    return values[j] * (1 - r) + values[j + 1] * r


def _smooth_ece_at(deposit: Any, sigma: float) -> float:
    points = (max(2000, round(20 / sigma)) // 2) + 1
    r_grid, one_grid = deposit(points)
    mesh = torch.linspace(0, 1, max(round(10 / sigma), 200), dtype=torch.float64)
    num = _interp_grid(_reflected_smooth(r_grid, sigma), mesh)
    dens = _interp_grid(_reflected_smooth(one_grid, sigma), mesh) + 1e-4
    rs = num / dens
    return float((rs.abs() * dens).sum() / dens.sum())


def _smooth_ece(deposit: Any, sigma: float | None, eps: float = 1e-3) -> Tensor:
    if sigma is not None:
        if not sigma > 0:
            raise ValueError(f"sigma: expected a bandwidth > 0, got {sigma!r}")
        return torch.tensor(_smooth_ece_at(deposit, sigma), dtype=torch.float64)

    def ok(alpha: float) -> bool:  # alpha is at least the smooth ECE at bandwidth alpha
        return alpha < eps or alpha < _smooth_ece_at(deposit, alpha)

    # fixed point sigma* = smECE_sigma* by bisection (Blasiok & Nakkiran 2023, as relplot)
    if ok(1.0):
        width = 1.0
    else:
        start, end = 1.0, 0.0
        for _ in range(10):
            mid = (start + end) / 2
            if ok(mid):
                end = mid
            else:
                start = mid
        width = start
    return torch.tensor(_smooth_ece_at(deposit, width), dtype=torch.float64)


def smooth_calibration_error_from_stats(fine: BinnedStats, *, sigma: float | None = None
                                        ) -> Tensor:
    """Smooth ECE (Blasiok & Nakkiran 2023) from a fine histogram.

    The residuals ``f - y`` and the sample density are spread on a grid by linear
    interpolation, smoothed with a Gaussian kernel reflected at 0 and 1, and
    ``smECE_sigma = int |smoothed residual|`` is taken relative to the smoothed density;
    without ``sigma`` the bandwidth is the fixed point ``sigma = smECE_sigma`` found by
    bisection. Grid, mesh and bisection follow the reference implementation (``relplot``)
    so both agree to ~1e-6 from a 4096-bin histogram (and to float64 rounding from samples,
    :func:`smooth_calibration_error_from_samples`).

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(2000, generator=g, dtype=torch.float64)
        >>> y = (torch.rand(2000, generator=g, dtype=torch.float64) < p ** 2).long()
        >>> fine = binned_statistics(p, y, n_bins=4096, reading="binary", input="probs")
        >>> 0.1 < float(smooth_calibration_error_from_stats(fine.pooled())) < 0.2
        True
    """
    fine = _require_single_slot(fine, "smooth ECE")
    _check_nonempty_stats(fine)
    n = fine.count.to(torch.float64).cpu()
    s_f = fine.conf.cpu()
    s_r = s_f - fine.acc.cpu()
    s_fr = fine.conf2.cpu() - fine.conf_acc.cpu()

    def deposit(points: int) -> tuple[Tensor, Tensor]:
        return (_deposit_stats(n, s_f, s_r, s_fr, points),
                _deposit_stats(n, s_f, n, s_f, points))

    return _smooth_ece(deposit, sigma)


def smooth_calibration_error_from_samples(samples: CalibrationSamples, *,
                                          sigma: float | None = None) -> Tensor:
    """Smooth ECE (Blasiok & Nakkiran 2023) from kept samples (see
    :func:`smooth_calibration_error_from_stats`).

    Example:
        >>> import torch
        >>> s = CalibrationSamples(torch.full((100,), 0.5, dtype=torch.float64),
        ...                        (torch.arange(100) % 2).double(),
        ...                        torch.zeros(100, dtype=torch.long))
        >>> float(smooth_calibration_error_from_samples(s)) < 1e-3  # calibrated at 0.5
        True
    """
    if samples.conf.numel() == 0:
        raise ValueError("samples: no samples were kept")
    f = samples.conf.cpu().to(torch.float64)
    r = f - samples.outcome.cpu().to(torch.float64)
    one = torch.ones_like(f)

    def deposit(points: int) -> tuple[Tensor, Tensor]:
        return _deposit_samples(f, r, points), _deposit_samples(f, one, points)

    return _smooth_ece(deposit, sigma)


# ---------------------------------------------------------------- bootstrap
def bootstrap_statistics(prep: PreparedInputs, n_bins: int, replicates: int,
                         generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Poisson(1)-weighted binned sums for ``replicates`` bootstrap replicates, pooled over
    groups: weighted counts, confidence sums and outcome sums, each ``(R, K * B)`` float64.

    Each element draws ``R`` independent Poisson(1) weights from ``generator`` (the streaming
    bootstrap of Hanley & MacGibbon 2006 / Chamandy et al. 2012), so the state streams and
    merges by addition like the plain statistics. A weight belongs to a sample: for
    ``classwise`` its ``C`` one-vs-rest elements share it (resampling samples, not pairs).
    Memory per update: ``M x R`` float64 weights.

    Example:
        >>> import torch
        >>> prep = prepare_inputs(torch.tensor([0.2, 0.7]), torch.tensor([0, 1]),
        ...                       reading="binary", input="probs")
        >>> wn, wc, wo = bootstrap_statistics(prep, 2, 3, torch.Generator().manual_seed(0))
        >>> wn.shape
        torch.Size([3, 2])
    """
    c = prep.conf.to(torch.float64)
    idx = _bins(c, n_bins)
    K = prep.num_slots
    if prep.lead is not None:
        idx = idx + (prep.lead % K) * n_bins
    size = K * n_bins
    rate = torch.ones(c.numel() // prep.per_sample, replicates, dtype=torch.float64,
                      device=c.device)
    w = torch.poisson(rate, generator=generator)  # (samples, R)
    if prep.per_sample > 1:
        w = w.repeat_interleave(prep.per_sample, dim=0)  # (M, R)
    cell = (idx.unsqueeze(1) + torch.arange(replicates, device=c.device) * size).reshape(-1)
    o = prep.outcome.to(torch.float64)
    wn = torch.bincount(cell, weights=w.reshape(-1), minlength=replicates * size)
    wc = torch.bincount(cell, weights=(w * c.unsqueeze(1)).reshape(-1),
                        minlength=replicates * size)
    wo = torch.bincount(cell, weights=(w * o.unsqueeze(1)).reshape(-1),
                        minlength=replicates * size)
    shape = (replicates, size)
    return wn.view(shape), wc.view(shape), wo.view(shape)


def ece_bootstrap_from_stats(wn: Tensor, wc: Tensor, wo: Tensor, *, level: float = 0.95
                             ) -> tuple[Tensor, Tensor]:
    """Percentile interval of the L1 ECE over bootstrap replicates ``(R, cells)``.

    The ECE of a replicate is ``sum_cells |wc - wo| / sum_cells wn`` in every reading: for
    ``classwise`` the cells are (class, bin) and ``sum wn`` is ``C`` times the weighted
    number of samples, so this is the mean over classes of the one-vs-rest ECE. Replicates
    whose Poisson weights are all 0 (likely for small N: probability ``exp(-N)``) are
    dropped; fewer than two usable replicates raise ``ValueError``.

    Example:
        >>> import torch
        >>> wn = torch.tensor([[2.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
        >>> wc = torch.tensor([[0.4, 0.9], [0.2, 0.9]], dtype=torch.float64)
        >>> wo = torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
        >>> [round(float(v), 4) for v in ece_bootstrap_from_stats(wn, wc, wo, level=0.5)]
        [0.1542, 0.1625]
    """
    _z(level)
    total = wn.sum(-1)
    used = total > 0  # a replicate whose weights are all 0 has no ECE: dropped
    if int(used.sum()) < 2:
        raise ValueError(f"replicates: only {int(used.sum())} of {wn.shape[0]} bootstrap "
                         f"replicates drew a sample; use more samples or more replicates")
    ece = ((wc - wo).abs().sum(-1) / total)[used]
    a = (1 - level) / 2
    q = torch.quantile(ece, torch.tensor([a, 1 - a], dtype=torch.float64, device=ece.device))
    return q[0], q[1]


# =============================================================================== functional
def _samples_from(prep: PreparedInputs) -> CalibrationSamples:
    if prep.num_slots != 1:
        raise ValueError("exact: kept samples are supported for reading='binary' or "
                         "'confidence'")
    g = (prep.lead if prep.lead is not None
         else torch.zeros(prep.conf.numel(), dtype=torch.int64, device=prep.conf.device))
    return CalibrationSamples(prep.conf.to(torch.float64), prep.outcome.to(torch.float64), g)


def _check_estimator(estimator: str, norm: str, reading: str,
                     allowed: tuple[str, ...] = ESTIMATORS) -> None:
    """Validate an (estimator, norm, reading) combination (functional and metrics)."""
    check_option("estimator", estimator, allowed)
    check_option("norm", norm, NORMS)
    check_option("reading", reading, READINGS)
    if estimator == "debiased" and norm != "l2":
        raise ValueError(f"norm: the debiased estimator is an L2 error, expected norm='l2', "
                         f"got {norm!r}")
    if estimator in FINE_ESTIMATORS and reading not in ("binary", "confidence"):
        raise ValueError(f"estimator: {estimator!r} is defined for reading='binary' or "
                         f"'confidence', got reading={reading!r}")


def _estimate(estimator: str, *, stats: BinnedStats, fine: BinnedStats | None,
              samples: CalibrationSamples | None, n_bins: int, norm: str, reading: str,
              sigma: float | None = None) -> Tensor:
    """One estimate from ``(K, B)`` statistics (and fine ``(K, F)`` or kept samples); the
    combination was checked by :func:`_check_estimator`."""
    if estimator == "binned":
        return calibration_error_from_stats(stats, norm=norm, reading=reading)
    if estimator == "debiased":
        return debiased_calibration_error_from_stats(stats, reading=reading)
    if samples is not None:
        if estimator == "equal_mass":
            return equal_mass_calibration_error_from_samples(samples, n_bins, norm=norm)
        if estimator == "sweep":
            return ece_sweep_from_samples(samples, norm=norm)
        return smooth_calibration_error_from_samples(samples, sigma=sigma)
    assert fine is not None
    if estimator == "equal_mass":
        return equal_mass_calibration_error_from_stats(fine, n_bins, norm=norm)
    if estimator == "sweep":
        return ece_sweep_from_stats(fine, norm=norm)
    return smooth_calibration_error_from_stats(fine, sigma=sigma)


def _per_group(fn: Any, stats: BinnedStats, fine: BinnedStats | None,
               samples: CalibrationSamples | None, counts: Tensor) -> GroupedResult:
    """Evaluate ``fn(stats, fine, samples)`` pooled and for each group."""
    pooled = fn(stats.pooled(), None if fine is None else fine.pooled(), samples)
    per = []
    for g in range(stats.count.shape[0]):
        if int(counts[g]) == 0:
            per.append(None)
            continue
        s = None
        if samples is not None:
            m = samples.group == g
            s = CalibrationSamples(samples.conf[m], samples.outcome[m], samples.group[m])
        per.append(fn(stats.group(g), None if fine is None else fine.group(g), s))
    return GroupedResult(pooled, per, counts.cpu())


def _stack_scalars(res: GroupedResult) -> GroupedResult:
    vals = [math.nan if v is None else float(v) for v in res.per_group]
    return GroupedResult(res.pooled, torch.tensor(vals, dtype=torch.float64), res.counts)


def calibration_error(preds: Tensor, target: Tensor, *, n_bins: int = 15, norm: str = "l1",
                      reading: str = "confidence", input: str = "logits",
                      estimator: str = "binned", num_classes: int | None = None,
                      groups: Tensor | None = None, num_groups: int | None = None,
                      fine_bins: int = 4096, exact: bool = False,
                      sigma: float | None = None, ignore_index: int | None = None
                      ) -> Tensor | GroupedResult:
    """Calibration error of ``preds`` against ``target``.

    Args:
        preds: logits or probabilities (``input``): ``(N,)``/any shape for ``binary``,
            ``(N, C, *)`` otherwise.
        target: ``{0, 1}`` of the shape of ``preds`` (``binary``), else class indices
            ``(N, *)``.
        n_bins: number of equal-width (or equal-mass) bins ``B >= 1``.
        norm: ``"l1"`` (ECE), ``"l2"`` (RMSCE) or ``"max"`` (MCE).
        reading: ``"binary" | "confidence" | "top_label" | "classwise"`` (module docstring).
        input: ``"logits"`` or ``"probs"``.
        estimator: ``"binned"`` (equal-width), ``"debiased"`` (Kumar et al. 2019, needs
            ``norm="l2"``), ``"equal_mass"``, ``"sweep"`` (Roelofs et al. 2022) or
            ``"smooth"`` (Blasiok & Nakkiran 2023; ``norm`` ignored); the last three from a
            ``fine_bins`` histogram, or from the sorted samples with ``exact=True``.
        groups, num_groups: optional domain id per sample; then a
            :class:`~torchcal.report.GroupedResult` with ``pooled`` (scalar) and
            ``per_group`` (``(G,)``, ``NaN`` for empty groups) is returned.
        sigma: fixed bandwidth for ``estimator="smooth"`` (default: the fixed point).
        ignore_index: a target value whose elements are dropped (as in
            ``F.cross_entropy``); ``ValueError`` if nothing is left.

    ``input="logits"`` whose rows all lie in [0, 1] and sum to 1 warn (``UserWarning``:
    probabilities passed as logits). ``input="probs"`` rows must sum to 1 within
    ``max(1e-4, C * eps(dtype))``.

    Returns:
        A float64 scalar tensor, or a ``GroupedResult`` when ``groups`` is given.

    Example:
        >>> import torch
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 0.0]])
        >>> round(float(calibration_error(logits, torch.tensor([0, 1, 1]), n_bins=10)), 4)
        0.2992
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    _check_estimator(estimator, norm, reading)
    prep = _prepare(preds, target, reading=reading, input=input, num_classes=num_classes,
                    groups=groups, num_groups=num_groups, ignore_index=ignore_index)
    stats = accumulate(prep, n_bins)
    fine = samples = None
    if estimator in FINE_ESTIMATORS:
        if exact:
            samples = _samples_from(prep)
        else:
            fine = accumulate(prep, check_int("fine_bins", fine_bins, minimum=1))

    def fn(s: BinnedStats, f: BinnedStats | None, smp: CalibrationSamples | None) -> Tensor:
        return _estimate(estimator, stats=s, fine=f, samples=smp, n_bins=n_bins, norm=norm,
                         reading=reading, sigma=sigma)

    if groups is None:
        return fn(stats.pooled(), None if fine is None else fine.pooled(), samples)
    return _stack_scalars(_per_group(fn, stats, fine, samples, prep.group_counts))


def reliability_table(preds: Tensor, target: Tensor, *, n_bins: int = 15,
                      reading: str = "confidence", input: str = "logits",
                      interval: str = "wilson", level: float = 0.95,
                      num_classes: int | None = None, groups: Tensor | None = None,
                      num_groups: int | None = None, ignore_index: int | None = None
                      ) -> ReliabilityTable | GroupedResult:
    """Equal-width :class:`~torchcal.report.ReliabilityTable` with per-bin counts and
    accuracy intervals (``interval="wilson" | "clopper_pearson"`` at ``level``).

    With ``groups`` a :class:`~torchcal.report.GroupedResult` whose ``per_group`` is a list
    of tables (``None`` for empty groups).

    Example:
        >>> import torch
        >>> t = reliability_table(torch.tensor([0.9] * 4), torch.tensor([1, 1, 1, 0]),
        ...                       n_bins=5, reading="binary", input="probs")
        >>> t.count.tolist(), round(float(t.acc[4]), 2), round(float(t.ci_low[4]), 3)
        ([0, 0, 0, 0, 4], 0.75, 0.301)
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    check_option("interval", interval, INTERVALS)
    _z(level)
    prep = _prepare(preds, target, reading=reading, input=input, num_classes=num_classes,
                    groups=groups, num_groups=num_groups, ignore_index=ignore_index)
    stats = accumulate(prep, n_bins)

    def fn(s: BinnedStats, f: Any, smp: Any) -> ReliabilityTable:
        return reliability_table_from_stats(s, interval=interval, level=level, reading=reading)

    if groups is None:
        return fn(stats.pooled(), None, None)
    return _per_group(fn, stats, None, None, prep.group_counts)


def brier_decomposition(preds: Tensor, target: Tensor, *, n_bins: int = 15,
                        reading: str = "binary", input: str = "logits",
                        num_classes: int | None = None, groups: Tensor | None = None,
                        num_groups: int | None = None, ignore_index: int | None = None
                        ) -> dict[str, Tensor] | GroupedResult:
    """Brier score with its exact binned Murphy decomposition (see
    :func:`brier_decomposition_from_stats`): a dict with ``brier``, ``reliability``,
    ``resolution``, ``uncertainty``, ``within_bin_variance`` and ``within_bin_covariance``
    (float64 scalars) with
    ``brier = reliability - resolution + uncertainty + within_bin_variance
    - 2 * within_bin_covariance``.

    With ``groups``: a :class:`~torchcal.report.GroupedResult` whose ``per_group`` is a dict
    of ``(G,)`` tensors.

    Example:
        >>> import torch
        >>> d = brier_decomposition(torch.tensor([0.9, 0.8, 0.2, 0.1]),
        ...                         torch.tensor([1, 0, 0, 0]), n_bins=5, input="probs")
        >>> round(float(d["brier"]), 4)
        0.175
        >>> parts = (d["reliability"] - d["resolution"] + d["uncertainty"]
        ...          + d["within_bin_variance"] - 2 * d["within_bin_covariance"])
        >>> round(float(parts), 4)
        0.175
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    prep = _prepare(preds, target, reading=reading, input=input, num_classes=num_classes,
                    groups=groups, num_groups=num_groups, ignore_index=ignore_index)
    stats = accumulate(prep, n_bins)
    pooled = brier_decomposition_from_stats(stats.pooled(), reading=reading)
    if groups is None:
        return pooled
    per = brier_decomposition_from_stats(stats, reading=reading)
    return GroupedResult(pooled, per, prep.group_counts.cpu())


def calibration_error_bootstrap(preds: Tensor, target: Tensor, *, n_bins: int = 15,
                                reading: str = "confidence", input: str = "logits",
                                num_classes: int | None = None, replicates: int = 200,
                                level: float = 0.95, seed: int = 0,
                                ignore_index: int | None = None
                                ) -> tuple[Tensor, Tensor, Tensor]:
    """Equal-width L1 ECE with a seeded Poisson-bootstrap percentile interval:
    ``(ece, low, high)``. Needs at least 2 samples; replicates that drew no sample are
    dropped (see :func:`ece_bootstrap_from_stats`).

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(500, generator=g, dtype=torch.float64)
        >>> y = (torch.rand(500, generator=g, dtype=torch.float64) < p).long()
        >>> ece, lo, hi = calibration_error_bootstrap(p, y, reading="binary", input="probs",
        ...                                           n_bins=10, replicates=100)
        >>> bool(lo <= ece <= hi)
        True
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    replicates = check_int("replicates", replicates, minimum=2)
    prep = _prepare(preds, target, reading=reading, input=input, num_classes=num_classes,
                    ignore_index=ignore_index)
    n = prep.conf.numel() // prep.per_sample
    if n < 2:
        raise ValueError(f"preds: a bootstrap interval needs at least 2 samples, got {n}")
    stats = accumulate(prep, n_bins)
    gen = torch.Generator(device=prep.conf.device).manual_seed(seed)
    wn, wc, wo = bootstrap_statistics(prep, n_bins, replicates, gen)
    lo, hi = ece_bootstrap_from_stats(wn, wc, wo, level=level)
    return calibration_error_from_stats(stats.pooled(), reading=reading), lo, hi


# =============================================================================== log score
def _nll(preds: Tensor, target: Tensor, input: str, ignore_index: int | None,
         multilabel: bool) -> tuple[Tensor, Tensor | None]:
    """Per-item NLL in the dtype of ``preds`` (the shape of the items) and the mask of the
    items kept (``None``: all kept); ignored items hold 0."""
    check_option("input", input, INPUTS)
    _check_ignore_index(ignore_index)
    if not isinstance(multilabel, bool):
        raise TypeError(f"multilabel: expected a bool, got {type(multilabel).__name__}")
    check_floating("preds", preds)
    check_tensor("target", target)
    check_nonempty("preds", preds)
    has_classes = preds.dim() >= 2
    class_shape = preds.shape[:1] + preds.shape[2:]
    if has_classes and preds.shape[1] == 1 and not multilabel and target.shape in (
            preds.shape, class_shape):
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
        expected = (f"{tuple(class_shape)} (class indices) or {tuple(preds.shape)} (float "
                    f"class probabilities) for preds (N, C, *)")
    raise ValueError(f"target: expected shape {expected}, got {tuple(target.shape)}")


def _nll_binary(preds: Tensor, target: Tensor, input: str, ignore_index: int | None
                ) -> tuple[Tensor, Tensor | None]:
    check_binary_target("target", target, ignore_index=ignore_index)
    keep = None if ignore_index is None else target != ignore_index
    y = target.to(preds.dtype)
    if keep is not None:
        y = torch.where(keep, y, 0.0)
    if input == "logits":
        check_finite("preds", preds)
        items = F.binary_cross_entropy_with_logits(preds, y, reduction="none")
    else:
        check_probabilities("preds", preds)
        items = -(torch.xlogy(y, preds) + torch.xlogy(1 - y, 1 - preds))
    return (items if keep is None else items * keep), keep


def _check_prob_rows_nd(name: str, p: Tensor) -> None:
    """``(N, C, *)`` values in [0, 1] with sums over dim 1 equal to 1 (``_sum_tolerance``)."""
    check_probabilities(name, p)
    if not values_checked():
        return
    tol = _sum_tolerance(p.dtype, p.shape[1])
    total = p.sum(dim=1, dtype=torch.float64)
    bad = (total - 1).abs() > tol
    if bool(bad.any()):
        val = float(total.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])])
        raise ValueError(f"{name}: expected probabilities whose sum over the classes (dim 1) "
                         f"is 1 (tolerance {tol:.3g}), got {val!r} at item "
                         f"{first_bad_position(bad)}")


def logits_look_like_probs(preds: Tensor) -> bool:
    """Whether multiclass logits ``(N, C, *)`` (``C >= 2``) are all in [0, 1] with every
    row (dim 1) summing to 1 within ``max(1e-4, C * eps)``: probabilities passed as logits.
    One ``aminmax`` pass and a host sync; the row sums only when the range fits."""
    if not values_checked() or preds.dim() < 2 or preds.shape[1] < 2 or preds.numel() == 0:
        return False
    lo, hi = torch.aminmax(preds)
    if not bool((lo >= 0) & (hi <= 1)):
        return False
    tol = _sum_tolerance(preds.dtype, preds.shape[1])
    return bool(((preds.sum(dim=1, dtype=torch.float64) - 1).abs() <= tol).all())


def _check_rows_finite(items: Tensor, preds: Tensor) -> None:
    """An item is NaN exactly when its row of logits is entirely ``-inf`` (NaN/``+inf`` were
    rejected before): name it."""
    if values_checked():
        bad = torch.isnan(items)
        if bool(bad.any()):
            raise ValueError(f"preds: expected at least one finite score per row, row "
                             f"{first_bad_position(bad)} is entirely -inf")


def _nll_soft(preds: Tensor, target: Tensor, input: str) -> Tensor:
    if not target.is_floating_point():
        raise ValueError(f"target: expected class indices of shape "
                         f"{tuple(preds.shape[:1] + preds.shape[2:])} or float class "
                         f"probabilities of the shape of preds, got dtype {target.dtype} of "
                         f"shape {tuple(target.shape)}; for independent sigmoids pass "
                         f"multilabel=True")
    _check_prob_rows_nd("target", target)
    q = target.to(preds.dtype)
    if input == "logits":
        check_finite("preds", preds, allow_neg_inf=True)
        logp = F.log_softmax(preds, dim=1)
        items = -torch.where(q > 0, q * logp, 0.0).sum(dim=1)
        _check_rows_finite(logp.amax(dim=1), preds)
        return items
    _check_prob_rows_nd("preds", preds)
    return -torch.xlogy(q, preds).sum(dim=1)


def _nll_indices(preds: Tensor, target: Tensor, input: str, ignore_index: int | None
                 ) -> tuple[Tensor, Tensor | None]:
    check_class_target("target", target, preds.shape[1], ignore_index=ignore_index)
    keep = None if ignore_index is None else target != ignore_index
    if input == "logits":
        check_finite("preds", preds, allow_neg_inf=True)
        items = F.cross_entropy(preds, target, reduction="none",
                                ignore_index=-100 if ignore_index is None else ignore_index)
        _check_rows_finite(items, preds)
        return items, keep
    _check_prob_rows_nd("preds", preds)
    t = target if keep is None else torch.where(keep, target, 0)
    items = -torch.log(preds.gather(1, t.unsqueeze(1)).squeeze(1))
    return (items if keep is None else items * keep), keep


def nll_items(preds: Tensor, target: Tensor, *, input: str = "logits",
              ignore_index: int | None = None, multilabel: bool = False) -> Tensor:
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


def nll_sum(preds: Tensor, target: Tensor, *, input: str = "logits",
            ignore_index: int | None = None, multilabel: bool = False) -> tuple[Tensor, int]:
    """Summed negative log-likelihood and the number of items used (ignored items excluded).

    The link runs in float64 (``preds`` are upcast before ``log_softmax``/``softplus``), so
    a sum over batches equals one call to float64 rounding (layouts as :func:`nll_items`).

    Example:
        >>> import torch
        >>> s, n = nll_sum(torch.zeros(2, 2), torch.tensor([0, 1]))
        >>> round(float(s), 4), n
        (1.3863, 2)
    """
    items, keep = _nll(_as_float64(preds), target, input, ignore_index, multilabel)
    if input == "logits" and not multilabel and logits_look_like_probs(preds):
        warnings.warn(PROBS_AS_LOGITS, UserWarning, stacklevel=2)
    n = items.numel() if keep is None else int(keep.sum())
    return items.sum(dtype=torch.float64), n


def _as_float64(preds: Tensor) -> Tensor:
    return preds.to(torch.float64) if isinstance(preds, Tensor) and preds.is_floating_point() \
        else preds


def negative_log_likelihood(preds: Tensor, target: Tensor, *, input: str = "logits",
                            ignore_index: int | None = None,
                            multilabel: bool = False) -> Tensor:
    """Mean negative log-likelihood (the log score; Good 1952) in float64 over the items
    not ignored (layouts as :func:`nll_items`; ``ValueError`` if every item is ignored).
    Multiclass ``input="logits"`` whose rows all lie in [0, 1] and sum to 1 warn
    (probabilities passed as logits).

    Example:
        >>> import torch
        >>> round(float(negative_log_likelihood(torch.zeros(4, 2), torch.tensor([0, 1, 0, 1]))), 4)
        0.6931
    """
    s, n = nll_sum(preds, target, input=input, ignore_index=ignore_index,
                   multilabel=multilabel)
    if n == 0:
        raise ValueError(f"target: every target equals ignore_index={ignore_index}, nothing "
                         f"to measure")
    return s / n
