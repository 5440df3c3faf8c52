"""Bin-free scores from a fine histogram of the confidence (docs/design.md section 6g): the
global ECCE with its sigma, the resolution (distinct values, the share at the most common
one) and the AUROC of the confidence against the outcome with DeLong's interval, from per
(group, fine bin) sums that every audit road can compute and merge.

The grid is ``F = FINE_BINS = 2^12`` bins by the one bin rule ``min(floor(c F), F - 1)`` in
float64; ``c * 2^12`` is exact in binary floating point, so every engine (torch, DuckDB,
Spark) puts a value in the same bin. Per cell (:class:`FineHistogram`): rows, ``sum w``,
``sum w w``, ``sum w y``, ``sum (w w) y``, ``sum w (y - c)``, ``sum w (c (1 - c))`` and
``sum (w w) (c (1 - c))`` (the squares for importance weights, read by their effective size).
At most ``MAX_FINE_GROUPS = 128`` groups keep one (``128 x 4096`` cells of 64 bytes: 32 MiB);
above that the audit reports no ECCE and no resolution, and says so.

**ECCE at fine-bin ends.** The exact ECCE (:func:`~torchcal.functional.multicalibration.ecce`)
is the range of the walk ``C_k = sum_{i <= k} w_i (y_i - c_i) / W`` in confidence order, read
at tie-block ends. Every fine-bin end is a tie-block end, so the histogram's walk is the exact
walk read at fewer points: ``ECCE_hist <= ECCE``. Inside bin ``b`` the walk moves by at most
``V_b = sum_b w |y - c| / W <= m_b / W`` (the bin's mass share) in total, so it rises at most
``V_b / 2`` above the larger of the bin's two end values (and falls as far below the smaller):
``ECCE <= ECCE_hist + max_b m_b / W`` (the ``bound`` returned). On smooth confidences at
``n = 1e6`` the distance itself is ~1e-5 (tested, <= 1e-4), the bound ~2.5e-4 for a uniform
spread. ``sigma`` is exact (a sum).

**AUROC from the histogram.** Rows in one fine bin are treated as tied (counted one half), so on
data whose distinct values fall in distinct fine bins (the 0.01 grid does) the AUROC and
DeLong's standard error are those of :func:`~torchcal.functional.resolution.auroc_interval`
(tested); otherwise the within-bin order is lost (at most the mass of the bins holding both
outcomes, ``sum_b P_b N_b / (2 P N)``). Weights are frequency weights (a row of weight ``w`` is
``w`` rows).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional.calibration.binning import bin_ids
from torchcal.functional.calibration.weights import cell_sums

#: fine bins (a power of two: ``c * FINE_BINS`` is exact, so every engine bins alike)
FINE_BINS = 1 << 12
#: the most groups kept with a fine histogram (64 bytes per cell: 32 MiB at the cap)
MAX_FINE_GROUPS = 128


class FineHistogram(NamedTuple):
    """Per (group, fine bin) sums ``(G, F)``: ``count`` int64 rows; float64 ``mass`` sum w,
    ``mass2`` sum w w, ``pos`` sum w y, ``pos2`` sum (w w) y, ``gap`` sum w (y - c),
    ``var_w`` sum w (c (1 - c)) and ``var_w2`` sum (w w) (c (1 - c)) (unweighted: ``mass`` and
    ``mass2`` are the count, ``pos2`` is ``pos``, the two variances are equal)."""

    count: Tensor  # type: ignore[assignment]  # (tuple.count: the field shadows it)
    mass: Tensor
    mass2: Tensor
    pos: Tensor
    pos2: Tensor
    gap: Tensor
    var_w: Tensor
    var_w2: Tensor

    @classmethod
    def zeros(cls, groups: int, bins: int = FINE_BINS) -> FineHistogram:
        z = [torch.zeros(groups, bins, dtype=torch.float64) for _ in cls._fields[1:]]
        return cls(torch.zeros(groups, bins, dtype=torch.int64), *z)

    def plus(self, other: FineHistogram) -> FineHistogram:
        """Cell by cell sums of two histograms of the same shape."""
        return FineHistogram(*(a + b for a, b in zip(self, other, strict=True)))

    def take(self, index: Tensor) -> FineHistogram:
        """The groups ``index`` (a permutation or a selection)."""
        return FineHistogram(*(t[index] for t in self))

    def grow(self, groups: int) -> FineHistogram:
        """Padded with empty groups to ``groups``."""
        extra = groups - self.count.shape[0]
        if extra <= 0:
            return self
        pad = FineHistogram.zeros(extra, self.count.shape[1])
        return FineHistogram(*(torch.cat([a, b]) for a, b in zip(self, pad, strict=True)))

    def with_pooled(self) -> FineHistogram:
        """The pooled row (the sum over groups) first, then the groups."""
        return FineHistogram(*(torch.cat([t.sum(0, keepdim=True), t]) for t in self))


def fine_histogram(
    conf: Tensor,
    outcome: Tensor,
    *,
    groups: Tensor | None = None,
    num_groups: int = 1,
    weight: Tensor | None = None,
    bins: int = FINE_BINS,
) -> FineHistogram:
    """The :class:`FineHistogram` of confidences ``conf`` ``(N,)`` in [0, 1] with outcomes
    ``outcome`` (0/1), group ids ``groups`` in ``[0, num_groups)`` and frequency weights
    (inputs checked by the caller: the audit's :func:`~torchcal.functional.calibration
    .prepare_inputs`).

    Example:
        >>> import torch
        >>> c = torch.tensor([0.25, 0.25, 0.75], dtype=torch.float64)
        >>> h = fine_histogram(c, torch.tensor([1, 0, 1]))
        >>> int(h.count.sum()), h.count[0, 1024].item(), float(h.gap.sum())
        (3, 2, 0.75)
    """
    c = conf.detach().reshape(-1).to(torch.float64)
    y = outcome.detach().reshape(-1).to(torch.float64)
    idx = bin_ids(c, bins)
    if groups is not None:
        idx = idx + groups.reshape(-1).to(torch.int64) * bins
    size = num_groups * bins
    count = torch.bincount(idx, minlength=size).view(num_groups, bins)
    var = c * (1.0 - c)
    if weight is None:
        mass = count.to(torch.float64)
        pos = cell_sums(idx, size, y).view(num_groups, bins)
        gap, var_w = (cell_sums(idx, size, v).view(num_groups, bins) for v in (y - c, var))
        return FineHistogram(count, mass, mass.clone(), pos, pos.clone(), gap, var_w, var_w.clone())
    w = weight.detach().reshape(-1).to(torch.float64)
    w2 = w * w
    values = (w, w2, w * y, w2 * y, w * (y - c), w * var, w2 * var)
    sums = [cell_sums(idx, size, v).view(num_groups, bins) for v in values]
    return FineHistogram(count, *sums)


def ecce_from_histogram(
    h: FineHistogram, weights: str = "importance"
) -> tuple[Tensor, Tensor, Tensor]:
    """``(ecce, sigma, bound)`` per group ``(G,)`` (float64, NaN for an empty group): the
    range of the cumulative differences read at fine-bin ends over the total weight, its scale
    under perfect calibration ``sqrt(sum w^2 c (1 - c)) / W`` (``weights="frequency"``: a row
    of weight ``w`` is ``w`` rows, ``sqrt(sum w c (1 - c)) / W``), and the largest bin's mass
    share, which bounds the distance to the exact ECCE: ``ecce <= exact <= ecce + bound``
    (module docstring).

    Example:
        >>> import torch
        >>> p, y = torch.tensor([0.1, 0.4, 0.6, 0.9]), torch.tensor([0, 1, 0, 1])
        >>> e, s, b = ecce_from_histogram(fine_histogram(p, y))
        >>> round(float(e[0]), 4), round(float(s[0]), 4), float(b[0])  # ecce(p, y): 0.15, 0.2031
        (0.15, 0.2031, 0.25)
    """
    W = h.mass.sum(-1)
    cum = torch.cumsum(h.gap, -1)
    zero = torch.zeros_like(cum[..., :1])
    cum = torch.cat([zero, cum], -1)
    span = cum.amax(-1) - cum.amin(-1)
    nan = torch.full_like(W, math.nan)
    ok = W > 0
    safe = torch.where(ok, W, torch.ones_like(W))
    ecce = torch.where(ok, span / safe, nan)
    if weights not in ("importance", "frequency"):
        raise ValueError(f"weights: expected 'importance' or 'frequency', got {weights!r}")
    var = h.var_w2 if weights == "importance" else h.var_w
    sigma = torch.where(ok, torch.sqrt(var.sum(-1)) / safe, nan)
    bound = torch.where(ok, h.mass.amax(-1) / safe, nan)
    return ecce, sigma, bound


class HistogramAuroc(NamedTuple):
    """Per group ``(G,)`` float64: the AUROC, its interval and DeLong's standard error (NaN
    where one outcome is absent), and the positive and negative mass."""

    auroc: Tensor
    lower: Tensor
    upper: Tensor
    se: Tensor
    positives: Tensor
    negatives: Tensor


def auroc_from_histogram(
    pos: Tensor,
    neg: Tensor,
    *,
    pos2: Tensor | None = None,
    neg2: Tensor | None = None,
    level: float = 0.9,
) -> HistogramAuroc:
    """AUROC of the confidence against the outcome from per-bin positive and negative mass
    ``(G, F)`` in ascending confidence order, rows of one bin tied (one half), with DeLong's
    standard error and the Wald interval at ``level`` clipped to [0, 1], as
    :func:`~torchcal.functional.resolution.auroc_interval`.

    The structural components of a bin's rows are equal, so DeLong's variances are sums over
    bins: ``var10 = sum_b Q_b (V10_b - A)^2 / P^2 * m / (m - 1)`` with ``Q_b`` the bin's sum of
    squared weights of the positives (``pos2``; default ``pos``: frequency weights, where it
    is DeLong's ``sum (V - A)^2 / (m (m - 1))``) and ``m = P^2 / sum Q`` the effective number
    of positives (Kish); the same for the negatives.

    Example:
        >>> import torch
        >>> pos = torch.tensor([[0.0, 1.0, 2.0]]); neg = torch.tensor([[2.0, 1.0, 0.0]])
        >>> r = auroc_from_histogram(pos, neg)
        >>> round(float(r.auroc[0]), 4), float(r.positives[0])
        (0.9444, 3.0)
    """
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level: expected a number in (0, 1), got {level!r}")
    P, N = pos.to(torch.float64), neg.to(torch.float64)
    P2 = P if pos2 is None else pos2.to(torch.float64)
    N2 = N if neg2 is None else neg2.to(torch.float64)
    m, n = P.sum(-1), N.sum(-1)
    ok = (m > 0) & (n > 0)
    ms, ns = torch.where(ok, m, 1.0)[..., None], torch.where(ok, n, 1.0)[..., None]
    n_below = torch.cumsum(N, -1) - N
    p_above = m[..., None] - torch.cumsum(P, -1)
    v10 = (n_below + N / 2) / ns  # per positive in the bin: share of negatives below it
    v01 = (p_above + P / 2) / ms  # per negative: share of positives above it
    auc = (P * v10).sum(-1) / ms[..., 0]
    var = torch.zeros_like(auc)
    for Q, V, tot in ((P2, v10, ms[..., 0]), (N2, v01, ns[..., 0])):
        q = Q.sum(-1)
        eff = torch.where(q > 0, tot * tot / torch.where(q > 0, q, 1.0), 0.0)
        part = (Q * (V - auc[..., None]) ** 2).sum(-1) / (tot * tot)
        var = var + torch.where(eff > 1, part * eff / (eff - 1).clamp_min(1e-300), 0.0)
    se = var.clamp_min(0.0).sqrt()
    z = NormalDist().inv_cdf(0.5 + level / 2)
    nan = torch.full_like(auc, math.nan)
    auc, se = torch.where(ok, auc, nan), torch.where(ok, se, nan)
    lo = torch.where(ok, (auc - z * se).clamp_min(0.0), nan)
    hi = torch.where(ok, (auc + z * se).clamp_max(1.0), nan)
    return HistogramAuroc(auc, lo, hi, se, m, n)


def rows_to_decide(
    estimate: float, lower: float, upper: float, tolerance: float, n: int, two_sided: bool
) -> int | None:
    """About how many rows at the same spread would put the interval ``[lower, upper]`` around
    ``estimate`` on one side of the tolerance (``+-tolerance`` when ``two_sided``): interval
    half-widths shrink as ``1 / sqrt(n)``, so the side that is short needs ``n (half / room)^2``
    rows. ``None`` when the estimate sits on a limit (no ``n`` decides) or a value is missing.

    Example:
        >>> rows_to_decide(0.03, 0.01, 0.06, 0.05, 1000, False)  # needs (0.03 / 0.02)^2 x n
        2250
    """
    vals = (estimate, lower, upper)
    if n <= 0 or any(v is None or not math.isfinite(v) for v in vals):
        return None
    limits = (-tolerance, tolerance) if two_sided else (tolerance,)
    if any(abs(estimate - t) < 1e-12 for t in limits):
        return None
    if estimate > tolerance:  # outside above: the lower end must clear the tolerance
        need = [(estimate - lower) / (estimate - tolerance)]
    elif two_sided and estimate < -tolerance:  # outside below
        need = [(upper - estimate) / (-tolerance - estimate)]
    else:  # inside: the ends must move inside
        need = [(upper - estimate) / (tolerance - estimate)]
        if two_sided:
            need.append((estimate - lower) / (estimate + tolerance))
    ratio = max(need)
    if not ratio > 1:  # this spread should decide already (the Holm step did not)
        return None
    return int(math.ceil(n * ratio * ratio))
