r"""Selective prediction: risk-coverage curves, AURC, AUGRC, risk at a coverage and coverage at
a risk, with tied confidences treated as one block.

**Definitions.** Rank the ``N`` samples by confidence, highest first, and accept the top ``i``:
coverage ``i / N``, selective risk ``S_i / i`` and generalised risk ``S_i / N`` (Traub et al.,
NeurIPS 2024: the joint probability of being accepted and wrong), ``S_i`` the summed loss of
the accepted samples (0/1 error by default).

**Integration rules** (``integration=``). ``"mean"``: the mean over the ``N`` acceptance counts,
``AURC = (1/N) sum_i S_i / i`` (Geifman et al. 2019; the default for AURC) and ``(1/N) sum_i S_i
/ N`` for AUGRC (a left Riemann sum of its curve). ``"trapezoid"``: the trapezoid rule over the
curve's points at the tie-block ends, as the AUGRC paper and its code (fd-shifts'
``np.trapz``) integrate: the generalised risk starts at ``(0, 0)``, the selective risk at the
first block's risk. **AUGRC's default is the trapezoid**, equal to fd-shifts to 1e-12 on the
authors' test cases; it is the mean form less ``mean(loss) / (2N)`` exactly (all wrong: 0.5,
not 0.5 + 1/(2N)). ``aurc(..., integration="trapezoid")`` is fd-shifts' ``aurc``.

**Ties.** Sorting alone breaks tied confidences by row order (torch-uncertainty's AURC reads
0.109 or 0.241 on one data set depending on the order). Here a block of ``m`` tied samples
entered after ``a`` others contributes its **expectation under a uniformly random order
within the block**: accepting ``j`` of them adds ``j * L_b / m`` to ``S`` (``L_b``: the
block's summed loss), exactly, since ``S / i`` is linear in ``S`` at fixed ``i``. The samples
are put in a canonical order (confidence descending, then loss ascending) before every sum, so
the results are bitwise invariant under any permutation of the rows. Thresholds (the curve,
:func:`coverage_at_risk`) are the block ends, the coverages a confidence threshold can reach.

**Binned form** (``*_from_stats``): each bin of the binned core (``BinnedStats`` of the
confidence reading, errors ``count - acc``) is one tie block, so the streamed state is O(bins)
and DDP-summable; the result equals the exact one of the data with each confidence replaced
by its bin. Against the exact value it errs by at most the bound that
:func:`selective_binned_bound` returns (reordering a bin moves at most ``min(j, m - j)`` losses
of at most 1 in and out of each prefix):
``|AURC_binned - AURC| <= (1/N) sum_b sum_{j=1}^{m_b} min(j, m_b - j) / (a_b + j)`` (in
closed form through harmonic numbers; ``a_b``: the samples in bins above) and
``|AUGRC_binned - AUGRC| <= sum_b floor(m_b^2 / 4) / N^2``.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from numbers import Real
from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_finite,
    check_floating,
    check_nonempty,
    check_option,
    check_tensor,
)
from torchcal.functional._levels import level_fraction
from torchcal.functional.calibration.binning import BinnedStats, require_single_slot

__all__ = [
    "RiskCoverage",
    "risk_coverage_curve",
    "aurc",
    "augrc",
    "risk_at_coverage",
    "coverage_at_risk",
    "risk_coverage_from_stats",
    "selective_binned_bound",
]

F64 = torch.float64


class RiskCoverage(NamedTuple):
    """Tie blocks in acceptance order and what they give (all float64 unless stated).

    Attributes:
        threshold: the block's confidence (binned: the bin's lower edge), descending ``(K,)``.
        count: samples per block, int64 ``(K,)``.
        loss: summed loss per block ``(K,)``.
        coverage: coverage at each block end ``(K,)``.
        risk: selective risk at each block end ``(K,)``.
        generalized_risk: generalised risk at each block end ``(K,)``.
        aurc: the tie-averaged AURC, ``integration="mean"`` (0-d).
        augrc: the AUGRC, ``integration="trapezoid"`` (0-d).
    """

    threshold: Tensor
    count: Tensor
    loss: Tensor
    coverage: Tensor
    risk: Tensor
    generalized_risk: Tensor
    aurc: Tensor
    augrc: Tensor


def _fixed_sum(x: Tensor) -> Tensor:
    """A sum in one fixed (sequential) order, independent of the thread count."""
    return torch.cumsum(x, 0)[-1] if x.numel() else torch.zeros((), dtype=x.dtype)


def _check_pair(confidence: Tensor, loss: Tensor | None) -> tuple[Tensor, Tensor]:
    check_floating("confidence", check_tensor("confidence", confidence))
    if confidence.dim() != 1:
        raise ValueError(f"confidence: expected (N,), got shape {tuple(confidence.shape)}")
    check_nonempty("confidence", confidence)
    check_finite("confidence", confidence)
    check_tensor("loss", loss)
    if loss.shape != confidence.shape:
        raise ValueError(
            f"loss: expected confidence's shape {tuple(confidence.shape)}, got {tuple(loss.shape)}"
        )
    lo = loss.detach().to(F64)
    check_finite("loss", lo)
    if bool((lo < 0).any()):
        raise ValueError("loss: expected losses >= 0 (e.g. 1 - correct)")
    return confidence.detach().to(F64), lo


def _blocks(confidence: Tensor, loss: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Canonical order and tie blocks: (block confidence, count, block loss sum, the losses
    in canonical order)."""
    order = torch.argsort(loss, stable=True)
    order = order[torch.argsort(confidence[order], descending=True, stable=True)]
    c, lo = confidence[order], loss[order]
    vals, counts = torch.unique_consecutive(c, return_counts=True)
    ends = torch.cumsum(counts, 0)
    cum = torch.cumsum(lo, 0)
    at_end = cum[ends - 1]
    block_loss = torch.diff(at_end, prepend=at_end.new_zeros(1))
    return vals, counts, block_loss, lo


def _summary(
    threshold: Tensor, count: Tensor, block_loss: Tensor, per_sample: bool
) -> RiskCoverage:
    """Curve, AURC and AUGRC of tie blocks in acceptance order (closed forms per block, or
    per sample when the block structure is small enough to expand)."""
    n = count.to(F64)
    N = float(n.sum())
    S_end = torch.cumsum(block_loss, 0)
    a = torch.cumsum(n, 0) - n  # samples before the block
    S_a = S_end - block_loss
    mu = torch.where(n > 0, block_loss / n.clamp_min(1), 0.0)
    if per_sample:
        blk = torch.repeat_interleave(torch.arange(count.numel(), device=count.device), count)
        i = torch.arange(1, int(N) + 1, dtype=F64, device=count.device)
        j = i - a[blk]
        aurc = _fixed_sum((S_a[blk] + j * mu[blk]) / i) / N
    else:  # sum_{j=1}^m (S_a + j mu) / (a + j) = (S_a - a mu)(H(a + m) - H(a)) + m mu
        dH = torch.special.digamma(a + n + 1) - torch.special.digamma(a + 1)
        aurc = _fixed_sum(torch.where(n > 0, (S_a - a * mu) * dH + n * mu, 0.0)) / N
    augrc = _fixed_sum(n * S_a + block_loss * n / 2) / (N * N)  # the trapezoid rule
    cov = torch.cumsum(n, 0) / N
    end_n = torch.cumsum(n, 0)
    risk = torch.where(end_n > 0, S_end / end_n.clamp_min(1), 0.0)
    return RiskCoverage(threshold, count, block_loss, cov, risk, S_end / N, aurc, augrc)


def risk_coverage_curve(confidence: Tensor, loss: Tensor) -> RiskCoverage:
    """The risk-coverage curve at every tie-block end, with the tie-averaged AURC and AUGRC.

    Args:
        confidence: ``(N,)`` floating confidences (higher = accepted first).
        loss: ``(N,)`` losses ``>= 0`` (e.g. ``1 - correct``; bool or any dtype).

    Example:
        >>> import torch
        >>> from torchcal.functional import risk_coverage_curve
        >>> rc = risk_coverage_curve(torch.tensor([0.9, 0.8, 0.8, 0.6]),
        ...                          torch.tensor([0.0, 1.0, 0.0, 1.0]))
        >>> rc.coverage.tolist(), rc.risk.tolist()
        ([0.25, 0.75, 1.0], [0.0, 0.3333333333333333, 0.5])
    """
    c, lo = _check_pair(confidence, loss)
    vals, counts, block_loss, _ = _blocks(c, lo)
    return _summary(vals, counts, block_loss, per_sample=True)


INTEGRATIONS = ("mean", "trapezoid")


def aurc_of(rc: RiskCoverage, integration: str = "mean") -> Tensor:
    """The AURC of a summary by ``integration`` (module docstring)."""
    check_option("integration", integration, INTEGRATIONS)
    if integration == "mean":
        return rc.aurc
    prev = torch.cat([rc.risk[:1], rc.risk[:-1]])  # the curve starts at the first risk
    width = rc.count.to(F64) / rc.count.sum().to(F64)
    return _fixed_sum(width * (prev + rc.risk) / 2)


def augrc_of(rc: RiskCoverage, integration: str = "trapezoid") -> Tensor:
    """The AUGRC of a summary by ``integration`` (module docstring)."""
    check_option("integration", integration, INTEGRATIONS)
    if integration == "trapezoid":
        return rc.augrc
    N = rc.count.sum().to(F64)
    return rc.augrc + _fixed_sum(rc.loss) / (2 * N * N)  # the mean form: + mean(loss) / (2N)


def aurc(confidence: Tensor, loss: Tensor, *, integration: str = "mean") -> Tensor:
    """Area under the risk-coverage curve, tie-averaged (module docstring); 0-d float64.
    ``integration="mean"`` (default): ``(1/N) sum_i S_i / i``; ``"trapezoid"``: fd-shifts'.

    Example:
        >>> import torch
        >>> from torchcal.functional import aurc
        >>> c = torch.tensor([0.9, 0.8, 0.8, 0.6])
        >>> float(aurc(c, torch.tensor([0.0, 1.0, 0.0, 1.0])))   # (0 + 1/4 + 1/3 + 1/2) / 4
        0.2708333333333333
        >>> float(aurc(c, torch.tensor([0.0, 1.0, 0.0, 1.0]), integration="trapezoid"))
        0.1875
    """
    return aurc_of(risk_coverage_curve(confidence, loss), integration)


def augrc(confidence: Tensor, loss: Tensor, *, integration: str = "trapezoid") -> Tensor:
    """Area under the generalised risk-coverage curve (Traub et al. 2024), tie-averaged;
    0-d float64. ``integration="trapezoid"`` (default, the paper's and fd-shifts'); ``"mean"``:
    ``(1/N) sum_i S_i / N``, larger by ``mean(loss) / (2N)``.

    Example:
        >>> import torch
        >>> from torchcal.functional import augrc
        >>> c = torch.tensor([0.9, 0.8, 0.8, 0.6])          # ends (1/4, 0), (3/4, 1/4), (1, 1/2)
        >>> float(augrc(c, torch.tensor([0.0, 1.0, 0.0, 1.0])))  # 0 + 1/16 + 3/32
        0.15625
        >>> float(augrc(c, torch.tensor([0.0, 1.0, 0.0, 1.0]), integration="mean"))
        0.21875
    """
    return augrc_of(risk_coverage_curve(confidence, loss), integration)


def coverage_fraction(coverage: object) -> Fraction:
    """``coverage`` in ``(0, 1]`` as an exact fraction, read as ``alpha`` is
    (:mod:`torchcal.functional._levels`: ``0.1`` and ``np.float32(0.1)`` are both 1/10, in
    their own precision); a Python or numpy number, a one-element floating
    tensor, a :class:`~fractions.Fraction` or a :class:`~decimal.Decimal`."""
    if isinstance(coverage, bool) or not isinstance(coverage, (Real, Decimal, Tensor)):
        raise TypeError(f"coverage: expected a number in (0, 1], got {type(coverage).__name__}")
    if isinstance(coverage, Tensor) and (coverage.numel() != 1 or not coverage.is_floating_point()):
        raise TypeError(
            f"coverage: expected a number or a one-element floating tensor, got a tensor of "
            f"shape {tuple(coverage.shape)} and dtype {coverage.dtype}"
        )
    x = float(coverage)  # type: ignore[arg-type]
    if not (math.isfinite(x) and 0 < x <= 1):
        raise ValueError(f"coverage: expected a value in (0, 1], got {coverage!r}")
    if isinstance(coverage, (Fraction, Decimal)):
        return Fraction(coverage)
    return Fraction(1) if x == 1 else level_fraction("coverage", coverage)


def _coverage_count(coverage: object, N: int) -> int:
    frac = coverage_fraction(coverage)
    return max(1, -(-(frac.numerator * N) // frac.denominator))


def risk_at_coverage_of(rc: RiskCoverage, coverage: float) -> Tensor:
    n = rc.count.to(F64)
    N = int(rc.count.sum())
    k = _coverage_count(coverage, N)
    ends = torch.cumsum(n, 0)
    b = int(torch.searchsorted(ends, torch.tensor(float(k), dtype=F64, device=ends.device)))
    a = float(ends[b] - n[b])
    S_a = float(torch.cumsum(rc.loss, 0)[b] - rc.loss[b])
    return torch.tensor((S_a + (k - a) * float(rc.loss[b]) / float(n[b])) / k, dtype=F64)


def risk_at_coverage(confidence: Tensor, loss: Tensor, coverage: float) -> Tensor:
    """The selective risk when the top ``ceil(coverage * N)`` samples are accepted (``coverage``
    read as an exact fraction), ties broken at random in expectation; 0-d float64.

    Example:
        >>> import torch
        >>> from torchcal.functional import risk_at_coverage
        >>> c = torch.tensor([0.9, 0.8, 0.8, 0.6])
        >>> float(risk_at_coverage(c, torch.tensor([0.0, 1.0, 0.0, 1.0]), 0.5))  # (0 + 1/2) / 2
        0.25
    """
    return risk_at_coverage_of(risk_coverage_curve(confidence, loss), coverage)


def coverage_at_risk_of(rc: RiskCoverage, risk: float) -> Tensor:
    r = float(risk)
    if not (math.isfinite(r) and r >= 0):
        raise ValueError(f"risk: expected a finite value >= 0, got {risk!r}")
    ok = rc.risk <= r
    if not bool(ok.any()):
        return torch.zeros((), dtype=F64)
    return rc.coverage[ok].max()


def coverage_at_risk(confidence: Tensor, loss: Tensor, risk: float) -> Tensor:
    """The largest coverage a confidence threshold reaches with selective risk ``<= risk`` (0
    if none); 0-d float64.

    Example:
        >>> import torch
        >>> from torchcal.functional import coverage_at_risk
        >>> c = torch.tensor([0.9, 0.8, 0.8, 0.6])
        >>> float(coverage_at_risk(c, torch.tensor([0.0, 1.0, 0.0, 1.0]), 0.4))
        0.75
    """
    return coverage_at_risk_of(risk_coverage_curve(confidence, loss), risk)


def risk_coverage_from_stats(stats: BinnedStats) -> RiskCoverage:
    """The binned risk-coverage summary from the confidence reading's ``BinnedStats`` (one
    slot; groups pooled): each bin a tie block, loss = errors (``count - acc``). O(bins).

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> from torchcal.functional import risk_coverage_from_stats
        >>> logits = torch.tensor([[3.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 0.1]])
        >>> st = binned_statistics(logits, torch.tensor([0, 0, 0, 1]), n_bins=10)
        >>> round(float(risk_coverage_from_stats(st.pooled()).aurc), 4)  # (0 + 0 + 1/3 + 1/4) / 4
        0.1458
    """
    s = require_single_slot(stats.pooled() if stats.count.dim() == 3 else stats, "AURC")
    count = s.count.reshape(-1).flip(0)
    err = (count.to(F64) - s.acc.reshape(-1).flip(0).to(F64)).clamp_min(0.0)
    keep = count > 0
    if not bool(keep.any()):
        raise ValueError("stats: no samples")
    B = count.numel()
    edges = torch.arange(B - 1, -1, -1, dtype=F64, device=count.device) / B
    return _summary(edges[keep], count[keep], err[keep], per_sample=False)


def selective_binned_bound(stats: BinnedStats) -> tuple[Tensor, Tensor]:
    """``(aurc_bound, augrc_bound)``: how far the binned AURC / AUGRC can be from the exact
    ones for losses in ``[0, 1]`` (module docstring); 0-d float64 each.

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> from torchcal.functional import selective_binned_bound
        >>> st = binned_statistics(torch.tensor([[3.0, 0.0], [2.9, 0.0]]), torch.tensor([0, 1]),
        ...                        n_bins=10)
        >>> [round(float(b), 4) for b in selective_binned_bound(st.pooled())]
        [0.5, 0.25]
    """
    s = require_single_slot(stats.pooled() if stats.count.dim() == 3 else stats, "AURC")
    n = s.count.reshape(-1).flip(0).to(F64)
    n = n[n > 0]
    N = float(n.sum())
    a = torch.cumsum(n, 0) - n
    h = torch.floor(n / 2)

    def H(x: Tensor) -> Tensor:  # harmonic number H(x) up to a constant
        return torch.special.digamma(x + 1)

    # sum_{j <= h} j / (a + j) + sum_{h < j <= m} (m - j) / (a + j), in closed form
    low = h - a * (H(a + h) - H(a))
    high = (n + a) * (H(a + n) - H(a + h)) - (n - h)
    per = (low + high).clamp_min(0.0)
    return _fixed_sum(per) / N, _fixed_sum(torch.floor(n * n / 4)) / (N * N)
