"""Decision-level calibration: the formulas of the audit (``torchcal.audit``).

A model's probability becomes a decision at a threshold (``if p >= 0.8: automate``), so what
matters most is calibration *around that threshold*, the cost of the errors it lets through,
and whether it changed since the last audit. Everything here is derived from the binned
sufficient statistics of :mod:`torchcal.functional.calibration` (:class:`BinnedStats`,
``(..., K, B)``; leading axes such as groups are kept):

* :func:`threshold_window`: the confidence range ``[lo, hi)`` around a threshold (the bin
  holding it and its lower neighbour);
* :func:`window_gap_from_stats`: mean confidence, accuracy (Wilson interval) and their signed
  gap in that window;
* :func:`cost_threshold_from_stats`: the automation threshold of least realised cost;
* :func:`ece_interval_from_stats`: a seeded bootstrap interval of the L1 ECE drawn from the
  statistics alone (moment-matched Poisson bootstrap; O(bins) per replicate, streams for free);
* :func:`drift_from_summaries`: the change between two independent estimates with a CI;
* :func:`probs_to_logits`: probabilities to logits, saturated values clamped and counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import torch
from torch import Tensor

from torchcal.functional._checks import check_int, check_number
from torchcal.functional.calibration.binning import BinnedStats
from torchcal.functional.calibration.intervals import wilson_interval, z_of_level

__all__ = [
    "cost_threshold_from_stats",
    "drift_from_summaries",
    "ece_interval_from_stats",
    "probs_to_logits",
    "threshold_window",
    "window_gap_from_stats",
]

#: |logit| of the float64 probability closest to 0 or 1 (``1 - 2**-53``): where
#: :func:`probs_to_logits` puts probabilities that are exactly 0 or 1.
LOGIT_LIMIT = math.log((1 - 2.0**-53) / 2.0**-53)


def threshold_window(threshold: float, n_bins: int) -> tuple[float, float]:
    """The confidence range ``[lo, hi)`` around ``threshold``: the bin ``k`` holding it joined
    with its lower neighbour (if any), ``lo = (k - 1) / B``, ``hi = (k + 1) / B``.

    ``k = min(floor(t B), B - 1)`` is computed **exactly** on the decimal the threshold was
    written as (``repr(t)``, a :class:`~fractions.Fraction`): in float64 ``0.29 * 100`` is
    ``28.999999999999996``, whose floor would give a window ``[0.27, 0.29)`` that does not
    contain 0.29. The window always contains ``t`` (``lo <= t < hi``, or ``t <= hi = 1``) and
    the float64 bin :func:`~torchcal.functional.calibration.binning.bin_index` gives a confidence
    equal to ``t`` (``k`` is the larger of the exact and the float64 bin; they differ by at
    most one, so both are in the window).

    Example:
        >>> threshold_window(0.8, 10), threshold_window(0.85, 10), threshold_window(0.05, 10)
        ((0.7, 0.9), (0.7, 0.9), (0.0, 0.1))
        >>> threshold_window(0.29, 100)
        (0.28, 0.3)
    """
    threshold = check_number("threshold", threshold)
    if threshold > 1:
        raise ValueError(f"threshold: expected a value in [0, 1], got {threshold!r}")
    n_bins = check_int("n_bins", n_bins, minimum=1)
    exact = math.floor(Fraction(repr(float(threshold))) * n_bins)
    k = min(max(exact, math.floor(float(threshold) * n_bins)), n_bins - 1)  # both in the window
    return max(k - 1, 0) / n_bins, (k + 1) / n_bins


def _window_bins(stats: BinnedStats, lo: float, hi: float) -> tuple[int, int]:
    """Bin range ``[a, b)`` whose edges are ``lo`` and ``hi``."""
    B = stats.n_bins
    a, b = round(lo * B), round(hi * B)
    if not (abs(lo * B - a) < 1e-9 and abs(hi * B - b) < 1e-9 and 0 <= a < b <= B):
        raise ValueError(f"lo, hi: expected bin edges k/{B} with lo < hi, got [{lo!r}, {hi!r})")
    return a, b


def window_gap_from_stats(stats: BinnedStats, lo: float, hi: float) -> dict[str, Tensor]:
    """Calibration in the window ``[lo, hi)`` (edges of the bins of ``stats`` ``(..., K, B)``;
    the slots ``K`` are pooled): ``n``, ``confidence`` (mean), ``accuracy`` (mean outcome),
    ``gap = confidence - accuracy`` (> 0: over-confident) and ``accuracy_ci`` (95 % Wilson,
    ``(..., 2)``); each of shape ``(...)``, ``NaN`` where the window is empty.

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> s = binned_statistics(torch.tensor([0.75, 0.85, 0.95]), torch.tensor([0, 1, 1]),
        ...                       n_bins=10, reading="binary", input="probs").pooled()
        >>> w = window_gap_from_stats(s, 0.7, 0.9)
        >>> int(w["n"]), round(float(w["confidence"]), 4), float(w["accuracy"])
        (2, 0.8, 0.5)
    """
    a, b = _window_bins(stats, lo, hi)
    n = stats.count[..., a:b].sum((-2, -1))
    nf = stats.mass()[..., a:b].sum((-2, -1))  # the weight total when weighted
    conf = stats.conf[..., a:b].sum((-2, -1)) / nf
    hits = stats.acc[..., a:b].sum((-2, -1))
    acc = hits / nf
    ci_lo, ci_hi = wilson_interval(hits, nf)
    return {
        "n": n,
        "mass": nf,
        "confidence": conf,
        "accuracy": acc,
        "gap": conf - acc,
        "accuracy_ci": torch.stack([ci_lo, ci_hi], -1),
    }


def cost_threshold_from_stats(
    stats: BinnedStats, cost_error: float, cost_escalation: float
) -> dict[str, Tensor]:
    """The automation threshold of least realised cost, from statistics ``(..., K, B)``.

    Candidates are the bin lower edges ``k / B`` and ``1.0`` (automate nothing). An item is
    automated when its confidence is ``>= t`` (the bins ``k`` and up), an automated item with
    outcome 0 is an error; realised cost ``= cost_error * errors + cost_escalation *
    escalated``. The least cost wins, ties go to the highest ``t``. Returns ``threshold``,
    ``n_automated``, ``errors``, ``error_rate`` (among automated; NaN if none),
    ``error_rate_ci`` (95 % Wilson, ``(..., 2)``), ``cost_per_item`` and
    ``naive_threshold = 1 - cost_escalation / cost_error`` (what a calibrated model would
    use: automate when the expected cost of an error is below the cost of escalating; <= 0
    means automate everything).

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> s = binned_statistics(torch.tensor([0.3, 0.6, 0.85, 0.95]), torch.tensor([0, 0, 1, 1]),
        ...                       n_bins=10, reading="binary", input="probs").pooled()
        >>> r = cost_threshold_from_stats(s, 10.0, 1.0)
        >>> float(r["threshold"]), int(r["n_automated"]), float(r["cost_per_item"])
        (0.8, 2, 0.5)
    """
    ce = check_number("cost_error", cost_error, strict=True)
    cx = check_number("cost_escalation", cost_escalation, strict=True)
    B = stats.n_bins
    count = stats.mass().sum(-2)  # (..., B); the weight total when weighted
    miss = count - stats.acc.sum(-2)
    zero = torch.zeros_like(count[..., :1])
    # automated from bin k up (k = 0 .. B-1), then nothing (k = B)
    n_auto = torch.cat([count.flip(-1).cumsum(-1).flip(-1), zero], -1)
    errors = torch.cat([miss.flip(-1).cumsum(-1).flip(-1), zero], -1)
    total = count.sum(-1, keepdim=True)
    cost = ce * errors + cx * (total - n_auto)
    k = (B - cost.flip(-1).argmin(-1, keepdim=True)).clamp_max(B)  # ties: the highest t
    n_k, e_k = n_auto.gather(-1, k).squeeze(-1), errors.gather(-1, k).squeeze(-1)
    lo, hi = wilson_interval(e_k, n_k)
    return {
        "threshold": k.squeeze(-1).to(torch.float64) / B,
        "n_automated": n_k.round().to(torch.int64),
        "errors": e_k,
        "error_rate": e_k / n_k,
        "error_rate_ci": torch.stack([lo, hi], -1),
        "cost_per_item": cost.gather(-1, k).squeeze(-1) / total.squeeze(-1),
        "naive_threshold": torch.full_like(e_k, 1 - cx / ce),
    }


def ece_interval_from_stats(
    stats: BinnedStats, *, replicates: int = 200, level: float = 0.95, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Seeded bootstrap percentile interval of the L1 ECE of ``(..., K, B)`` statistics.

    The Poisson(1) bootstrap reweights every item; per bin it moves the count ``n_b`` and the
    gap sum ``D_b = sum (c - y)`` with mean ``(n_b, D_b)``, variances ``n_b`` and
    ``V_b = sum (c - y)^2 = conf2 - 2 conf_acc + acc`` and covariance ``D_b`` - all read from
    the statistics. Each replicate draws ``(n_b*, D_b*)`` from the normal law with exactly
    these moments (independent across bins, as the Poisson weights are) and gives
    ``ECE* = sum_b |D_b*| / sum_b n_b*``. So the interval costs O(R x bins), not O(R x items)
    (a per-item bootstrap of 10 M rows draws 2e9 weights), is identical for any chunking of
    the stream, and agrees with the per-item Poisson bootstrap for bins of tens of items
    (tested). Returns ``(low, high)`` of shape ``(...)``.

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(2000, generator=g, dtype=torch.float64)
        >>> y = (torch.rand(2000, generator=g, dtype=torch.float64) < p ** 1.5).long()
        >>> s = binned_statistics(p, y, n_bins=10, reading="binary", input="probs").pooled()
        >>> lo, hi = ece_interval_from_stats(s)
        >>> from torchcal.functional import calibration_error_from_stats
        >>> bool(lo <= calibration_error_from_stats(s, reading="binary") <= hi)
        True
    """
    replicates = check_int("replicates", replicates, minimum=2)
    z_of_level(level)
    n = stats.mass().flatten(-2)  # the weight total when weighted (frequency weights)
    d = (stats.conf - stats.acc).flatten(-2)
    v = (stats.conf2 - 2 * stats.conf_acc + stats.acc).flatten(-2)
    safe = torch.where(n > 0, n, 1.0)  # a weight total may be below 1
    # residual variance of D given n (>= 0 by Cauchy-Schwarz; clamp only float rounding)
    resid = torch.sqrt((v - d * d / safe).clamp_min(0))
    gen = torch.Generator(device=n.device).manual_seed(seed)
    z1 = torch.randn((replicates, *n.shape), generator=gen, dtype=torch.float64, device=n.device)
    z2 = torch.randn((replicates, *n.shape), generator=gen, dtype=torch.float64, device=n.device)
    n_star = n + torch.sqrt(n) * z1
    d_star = d + d / torch.sqrt(safe) * z1 + resid * z2
    ece = d_star.abs().sum(-1) / n_star.sum(-1)
    a = (1 - level) / 2
    q = torch.quantile(ece, torch.tensor([a, 1 - a], dtype=torch.float64, device=n.device), dim=0)
    return q[0], q[1]


def drift_from_summaries(
    old: Mapping[str, float | Sequence[float]], new: Mapping[str, float | Sequence[float]]
) -> dict[str, object]:
    """Change between two independent estimates ``{"value": x, "ci": [lo, hi]}``.

    ``delta = new - old``, ``delta_ci = delta +- 1.96 sqrt(se_old^2 + se_new^2)`` with each
    ``se`` read from its 95 % interval (half-width / 1.96); ``worse`` when the whole interval
    is above 0 (significantly larger: worse for an error). ``None`` values give ``None``.

    Example:
        >>> d = drift_from_summaries({"value": 0.02, "ci": [0.01, 0.03]},
        ...                          {"value": 0.08, "ci": [0.06, 0.10]})
        >>> round(d["delta"], 3), [round(x, 4) for x in d["delta_ci"]], d["worse"]
        (0.06, [0.0376, 0.0824], True)
    """
    vals = []
    for name, s in (("old", old), ("new", new)):
        if not isinstance(s, Mapping) or "value" not in s or "ci" not in s:
            raise ValueError(f"{name}: expected a mapping with 'value' and 'ci', got {s!r}")
        if s["value"] is None or s["ci"] is None:
            return {"delta": None, "delta_ci": None, "worse": False}
        lo, hi = (float(x) for x in s["ci"])  # type: ignore[union-attr]
        if not hi >= lo:
            raise ValueError(f"{name}: expected ci [lo, hi] with lo <= hi, got {s['ci']!r}")
        vals.append((float(s["value"]), (hi - lo) / 2 / 1.96))  # type: ignore[arg-type]
    (v_old, se_old), (v_new, se_new) = vals
    delta = v_new - v_old
    half = 1.96 * math.sqrt(se_old**2 + se_new**2)
    return {"delta": delta, "delta_ci": [delta - half, delta + half], "worse": delta - half > 0}


def probs_to_logits(probs: Tensor, *, binary: bool) -> tuple[Tensor, int]:
    """Probabilities to float64 logits and the number of values that were saturated.

    Binary ``P(y=1)`` ``(N,)``: ``log p - log1p(-p)``; multiclass rows ``(N, C)``:
    ``log p``. Probabilities of exactly 0 or 1 have infinite logits; they are set to
    ``-+LOGIT_LIMIT`` (the logit of the float64 value next to 0 or 1) and **counted**, so the
    caller can say so (a temperature fit needs finite logits).

    Example:
        >>> import torch
        >>> z, n = probs_to_logits(torch.tensor([0.5, 1.0]), binary=True)
        >>> z.tolist()[0], round(z.tolist()[1], 2), n
        (0.0, 36.74, 1)
    """
    p = probs.to(torch.float64)
    z = torch.log(p) - torch.log1p(-p) if binary else torch.log(p)
    bad = ~torch.isfinite(z)
    n = int(bad.sum())
    if n:
        z = torch.where(bad, torch.sign(z) * LOGIT_LIMIT, z)
    return z, n
