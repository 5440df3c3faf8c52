"""Streaming calibration of predictive distributions: PIT histogram, interval coverage,
quantile calibration error (issue 11; docs/design.md section 3).

Every metric keeps O(bins or levels) summed states (int64 counts, float64 sums) per group,
so memory does not grow with N, one all-reduce merges ranks under DDP, and a stream equals
one call (to float64 rounding). The arithmetic lives in
:mod:`torchcal.functional.regression` (and :mod:`torchcal.functional.continuous` for the
scores, see :mod:`torchcal.metrics.regression_scores`); the metrics only sum.

With ``num_groups=G`` every ``update`` needs ``groups`` (one integer id per target value)
and ``compute()`` returns a :class:`~torchcal.GroupedResult`: ``pooled`` beside
``per_group`` (the same keys with a leading ``G`` dim; ``NaN`` for an empty group) and
``counts``. ``merge_state`` and the DDP sync accept only a metric of the same configuration
(``ValueError("other: ...")``); the states stay float64/int64 under ``.to(dtype)``.
As every torchmetrics ``Metric``, ``compute()`` squeezes a one-element tensor to a scalar
(a single level or bin).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_finite,
    check_int,
    check_option,
    check_values,
    validation_enabled,
    values_checked,
)
from torchcal.functional._forecast import check_location_scale, renamed_keyword
from torchcal.functional._validation import check_group_ids, check_level_grid
from torchcal.functional.calibration.results import GroupedResult
from torchcal.functional.continuous import (
    check_interval_width,
    interval_inputs,
    interval_parts,
    interval_score_from_parts,
)
from torchcal.functional.coverage import (
    central_interval_sums,
    frequency_calibration_error,
    observed_frequencies,
    pit_calibration_error_from_counts,
    pit_histogram,
)
from torchcal.functional.regression import central_interval_factor
from torchcal.metrics._base import PooledPlotMetric, StateRules

__all__ = [
    "PITHistogram",
    "IntervalCoverage",
    "QuantileCalibrationError",
]


def level_tuple(name: str, levels: Tensor | Sequence[float]) -> tuple[float, ...]:
    """Checked levels (strictly increasing, inside (0, 1)) as a tuple of floats."""
    with validation_enabled(True):
        return tuple(float(v) for v in check_level_grid(name, levels).tolist())


_FAMILIES = ("bounds", "normal", "laplace", "logistic")
#: elements per float64 partial sum on the CPU (see :func:`float64_column_sums`)
_CHUNK = 1 << 16
#: values per block of :meth:`IntervalCoverage.update` (4 MB of float32)
_BLOCK = 1 << 20


def float64_column_sums(values: Tensor) -> Tensor:
    """Column sums ``(1, K)`` of ``values`` ``(M, K)``, accumulated in float64.

    On the CPU ``torch.sum(dtype=float64)`` first casts its whole input (a float64 copy of
    it, written to and read back from memory); here blocks of about ``_CHUNK`` values are
    cast into one reused buffer that stays in cache, and the block sums are summed: about 2x
    faster on 1M float32 values (a loop over blocks, not over samples)."""
    rows = max(_CHUNK // max(values.shape[1], 1), 1)
    if values.dtype == torch.float64 or values.device.type != "cpu" or values.shape[0] <= rows:
        return values.sum(dim=0, keepdim=True, dtype=torch.float64)
    values = values.detach()
    buf = torch.empty((rows, values.shape[1]), dtype=torch.float64)
    parts = []
    for start in range(0, values.shape[0], rows):
        block = values[start : start + rows]
        parts.append(buf[: block.shape[0]].copy_(block).sum(dim=0))
    return torch.stack(parts).sum(dim=0, keepdim=True)


class RegressionMetric(PooledPlotMetric):
    """Shared pieces: ``num_groups``, the group check, per-group sums, the result shape."""

    full_state_update = False
    is_differentiable = False

    def __init__(
        self, *, num_groups: int | None = None, validate_args: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.num_groups = (
            None if num_groups is None else check_int("num_groups", num_groups, minimum=1)
        )
        self.validate_args = bool(validate_args)
        self._G = num_groups or 1

    def _group_ids(self, groups: Tensor | None, shape: torch.Size) -> Tensor | None:
        """Flat int64 group ids for values of ``shape`` (``None`` without groups)."""
        if self.num_groups is None:
            if groups is not None:
                raise ValueError(
                    "groups: pass num_groups= to the metric's constructor to get "
                    "per-group results (the state size must be fixed up front)"
                )
            return None
        if groups is None:
            raise ValueError(
                f"groups: expected a group id per target value (the metric was built "
                f"with num_groups={self.num_groups}), got None"
            )
        with validation_enabled(self.validate_args):
            check_group_ids(groups, shape, self.num_groups)
        return groups.reshape(-1).to(dtype=torch.int64)

    def _sum_rows(self, values: Tensor, ids: Tensor | None, dtype: torch.dtype) -> Tensor:
        """Sum ``values`` (rows = target values, ``(N, *rest)``) per group: ``(G, *rest)``,
        accumulated in float64 (int64 for integer values), returned as ``dtype`` (0/1
        indicators summed in float64 are exact counts below 2^53)."""
        acc = torch.float64 if values.is_floating_point() else torch.int64
        if ids is None and acc == torch.float64:
            return float64_column_sums(values).to(dtype)
        if ids is None:
            return values.sum(dim=0, keepdim=True, dtype=acc).to(dtype)
        out = torch.zeros((self._G, *values.shape[1:]), dtype=acc, device=values.device)
        return out.index_add_(0, ids.to(values.device), values.to(acc)).to(dtype)

    def _count_rows(self, ids: Tensor | None, n: int) -> Tensor:
        """int64 ``(G,)``: the number of target values per group in this batch."""
        if ids is None:
            return torch.tensor([n], dtype=torch.int64)
        out = torch.zeros(self._G, dtype=torch.int64, device=ids.device)
        return out.index_add_(0, ids, torch.ones_like(ids))  # bincount would sync a device

    def _check_seen(self, n: Tensor) -> None:
        if int(n.sum()) == 0:
            raise RuntimeError(
                f"{type(self).__name__}.compute(): no samples seen; call update() with "
                f"at least one sample first"
            )

    def _result(self, fn: Any, states: Sequence[Tensor], n: Tensor) -> Any:
        """``fn(*states)`` on the pooled states, or a GroupedResult (per group beside)."""
        self._check_seen(n)
        pooled = fn(*(s.sum(dim=0) for s in states))
        if self.num_groups is None:
            return pooled
        return GroupedResult(pooled, fn(*states), n.clone())


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """``num / den`` in float64, ``den`` broadcast over ``num``'s trailing dim (0/0 = NaN)."""
    return num.to(torch.float64) / den.to(torch.float64).unsqueeze(-1)


class PITHistogram(RegressionMetric):
    """Streaming histogram of PIT values (equal-width bins, the torchcal bin rule).

    ``update(pit, groups=None)`` takes PIT values in [0, 1] of any shape (from
    :func:`~torchcal.functional.pit_normal`, :func:`~torchcal.functional.pit_ensemble`, ...);
    the state is an int64 ``(G, n_bins)`` count. ``compute()`` returns a dict:

    * ``counts``: int64 ``(n_bins,)``; ``shares``: float64 ``counts / n``;
    * ``pit_ece``: :math:`\\sum_b |n_b / N - 1/B|` (as
      :func:`~torchcal.functional.pit_calibration_error`; 0 = flat);
    * ``n``: the number of PIT values (int64 scalar).

    With ``num_groups`` a :class:`~torchcal.GroupedResult` whose ``per_group`` dict
    has the same keys with a leading ``G`` dim.

    Args:
        n_bins: the number of bins ``B``.
        num_groups: per-group histograms (``update`` then needs ``groups`` of ``pit``'s shape).
        validate_args: run the value checks (range, NaN, group ids) in ``update``.

    Example:
        >>> import torch
        >>> from torchcal.metrics import PITHistogram
        >>> m = PITHistogram(n_bins=2)
        >>> m.update(torch.tensor([0.1, 0.2, 0.3]))
        >>> m.update(torch.tensor([0.9]))
        >>> r = m.compute()
        >>> r["counts"].tolist(), r["shares"].tolist(), float(r["pit_ece"])
        ([3, 1], [0.75, 0.25], 0.5)
    """

    higher_is_better = None
    _CONFIG = ("n_bins", "num_groups")
    _RULES = StateRules(counts=("counts",))

    def __init__(
        self,
        n_bins: int = 10,
        *,
        num_groups: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_groups=num_groups, validate_args=validate_args, **kwargs)
        self.n_bins = check_int("n_bins", n_bins, minimum=1)
        shape = (self._G, self.n_bins)
        self.add_state("counts", torch.zeros(shape, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, pit: Tensor, groups: Tensor | None = None) -> None:
        """Count a batch of PIT values (any shape; ``groups`` of the same shape)."""
        ids = self._group_ids(groups, getattr(pit, "shape", torch.Size([])))
        with validation_enabled(self.validate_args):
            counts = pit_histogram(
                pit,
                self.n_bins,
                groups=None if ids is None else ids.reshape(pit.shape),
                num_groups=self.num_groups,
            )
        self.counts.add_(counts.to(self.counts.device))

    @staticmethod
    def _summary(counts: Tensor) -> dict[str, Tensor]:
        n = counts.sum(dim=-1)
        return {
            "counts": counts.clone(),
            "shares": _ratio(counts, n),
            "pit_ece": pit_calibration_error_from_counts(counts),
            "n": n,
        }

    def compute(self) -> dict[str, Tensor] | GroupedResult:
        """The histogram, its shares, ``pit_ece`` and ``n`` (or a GroupedResult)."""
        return self._result(self._summary, [self.counts], self.counts.sum(dim=-1))


class IntervalCoverage(RegressionMetric):
    """Streaming coverage, width and interval score of central prediction intervals.

    ``update(lower, upper, target, groups=None)`` takes the bounds of ``L`` intervals at once,
    ``(..., L)`` for a target ``(...)`` (column ``l`` is the central interval of nominal
    coverage ``levels[l]``, e.g. the ``(1 - c)/2`` and ``(1 + c)/2`` quantiles); the target is
    never broadcast. States per group: int64 hits ``(G, L)``, float64 width and interval-score
    sums ``(G, L)``, int64 ``n``. ``compute()`` returns a dict of float64 ``(L,)`` tensors:

    * ``coverage``: the share of targets with ``lower <= y <= upper``
      (:func:`~torchcal.functional.interval_coverage`);
    * ``stderr``: its binomial standard error :math:`\\sqrt{p(1-p)/n}`;
    * ``width``: the mean width ``upper - lower`` (sharpness of the intervals);
    * ``interval_score``: the mean interval score at :math:`\\alpha = 1 - c`
      (:func:`~torchcal.functional.interval_score`, a proper score: lower is better);
    * ``n``: the number of target values (int64 scalar).

    With ``num_groups`` a :class:`~torchcal.GroupedResult` (``per_group``: ``(G, L)``;
    conditional coverage, e.g. by input range or by predicted spread, is a group id).

    **Location-scale forecasts.** With ``family="normal" | "laplace" | "logistic"``,
    ``update(loc, scale, target, groups=None)`` takes the forecast itself (``loc`` and ``scale``
    broadcast to the target's shape) and scores its central intervals
    ``loc -+ central_interval_factor(family, c) * scale`` at every level in one pass whose cost
    does not grow with the number of levels (:func:`~torchcal.functional.coverage.
    central_interval_sums`; per element in the inputs' dtype, sums in float64, as with bounds).

    Args:
        levels: nominal coverages ``c`` in (0, 1), strictly increasing.
        family: ``"bounds"`` (default: ``update(lower, upper, target)``) or a location-scale
            family (``update(loc, scale, target)``). ``forecast=`` is its deprecated
            spelling (one release, with a ``FutureWarning``; both given raise ``ValueError``).
        num_groups: per-group results (``update`` then needs ``groups`` of ``target``'s shape).
        validate_args: run the value checks (NaN, ``lower <= upper``, group ids).

    Example:
        >>> import torch
        >>> from torchcal.metrics import IntervalCoverage
        >>> m = IntervalCoverage(levels=(0.5, 0.9))
        >>> lower = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]])
        >>> upper = torch.tensor([[1.0, 2.0], [1.0, 2.0]])
        >>> m.update(lower, upper, torch.tensor([0.0, 1.5]))
        >>> r = m.compute()
        >>> r["coverage"].tolist(), r["width"].tolist()
        ([0.5, 1.0], [2.0, 4.0])
        >>> r["interval_score"].tolist()  # level 0.5: (2 + (2 + 2 / 0.5 * 0.5)) / 2
        [3.0, 4.0]
        >>> m = IntervalCoverage(levels=(0.5, 0.9), family="normal")
        >>> m.update(torch.zeros(3), torch.ones(3), torch.tensor([0.1, -1.0, 2.0]))
        >>> m.compute()["coverage"].tolist()
        [0.3333333333333333, 0.6666666666666666]
    """

    higher_is_better = None
    _CONFIG = ("levels", "family", "num_groups")
    _RULES = StateRules(
        counts=("hits", "n"), nonnegative=("width_sum", "score_sum"), bounded=(("hits", "n"),)
    )

    def __init__(
        self,
        levels: Sequence[float] | Tensor = (0.5, 0.8, 0.9, 0.95),
        *,
        family: str | None = None,
        num_groups: int | None = None,
        validate_args: bool = True,
        forecast: str | None = None,
        **kwargs: Any,
    ) -> None:
        family = renamed_keyword("IntervalCoverage", "family", family, "forecast", forecast)
        super().__init__(num_groups=num_groups, validate_args=validate_args, **kwargs)
        self.levels = level_tuple("levels", levels)
        self.family = check_option("family", "bounds" if family is None else family, _FAMILIES)
        shape = (self._G, len(self.levels))
        self.add_state("hits", torch.zeros(shape, dtype=torch.int64), dist_reduce_fx="sum")
        for name in ("width_sum", "score_sum"):
            self.add_state(name, torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("n", torch.zeros(self._G, dtype=torch.int64), dist_reduce_fx="sum")

    @property
    def forecast(self) -> str:
        """Deprecated: :attr:`family`."""
        warnings.warn(
            "IntervalCoverage.forecast is deprecated; use IntervalCoverage.family",
            FutureWarning,
            stacklevel=2,
        )
        return self.family

    def _check_bounds(self, lower: Tensor, upper: Tensor, target: Tensor) -> None:
        want = (*target.shape, len(self.levels))
        for name, x in (("lower", lower), ("upper", upper)):
            if not isinstance(x, Tensor) or tuple(x.shape) != want:
                got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(
                    f"{name}: expected shape {want} (the target's shape and one column per "
                    f"level, levels={self.levels}), got {got}"
                )

    def update(
        self, lower: Tensor, upper: Tensor, target: Tensor, groups: Tensor | None = None
    ) -> None:
        """Accumulate a batch: bounds ``(..., L)``, target ``(...)``, groups ``(...)``; with a
        location-scale ``family``: ``update(loc, scale, target, groups)``."""
        if not isinstance(target, Tensor):
            raise TypeError(f"target: expected a Tensor, got {type(target).__name__}")
        if self.family != "bounds":
            self._update_location_scale(lower, upper, target, groups)
            return
        self._check_bounds(lower, upper, target)
        ids = self._group_ids(groups, target.shape)
        alpha = 1.0 - torch.tensor(self.levels, dtype=torch.float64, device=target.device)
        with validation_enabled(self.validate_args):
            # the interval score's checks (shapes, finite values, lower <= upper), once
            lo, hi, y, _ = interval_inputs(lower, upper, target, alpha)
            k = len(self.levels)
            sums = self._interval_sums(lo.reshape(-1, k), hi.reshape(-1, k), y.reshape(-1, 1), ids)
        width_sum, penalty_sum, misses = sums
        self._add_sums(width_sum, penalty_sum, misses, self._count_rows(ids, target.numel()), alpha)

    def _update_location_scale(
        self, loc: Tensor, scale: Tensor, target: Tensor, groups: Tensor | None
    ) -> None:
        ids = self._group_ids(groups, target.shape)
        with validation_enabled(self.validate_args):
            loc, scale, target = check_location_scale(loc, scale, target, finite_after=True)
            factors = central_interval_factor(self.family, self.levels)
            misses, width, penalty, rows = central_interval_sums(
                loc, scale, target, factors, groups=ids, num_groups=self._G
            )
            # a NaN or an infinity in loc or target makes a penalty sum non-finite: name it

            def scan() -> None:
                check_finite("loc", loc)
                check_finite("target", target)

            check_values(torch.isfinite(penalty).all(), "loc, target: expected finite values", scan)
        alpha = 1.0 - torch.tensor(self.levels, dtype=torch.float64, device=target.device)
        self._add_sums(width, penalty, misses, rows, alpha)

    def _add_sums(
        self, width: Tensor, penalty: Tensor, misses: Tensor, rows: Tensor, alpha: Tensor
    ) -> None:
        """Add a batch's float64 width and penalty sums and int64 miss counts ``(G, L)`` and
        row counts ``(G,)`` to the states. The score is linear in its parts: the summed score
        comes from the float64 sums."""
        device = self.n.device
        self.width_sum.add_(width.to(device))
        self.score_sum.add_(interval_score_from_parts(width, penalty, alpha).to(device))
        self.hits.add_((rows.unsqueeze(-1) - misses).to(device))
        self.n.add_(rows.to(device))

    def _interval_sums(
        self, lower: Tensor, upper: Tensor, target: Tensor, ids: Tensor | None
    ) -> tuple[Tensor, ...]:
        """float64 width and penalty sums and int64 miss counts ``(G, L)`` of rows ``(M, L)``
        (target ``(M, 1)``), in blocks of about ``_BLOCK`` values (a loop over blocks, not
        over samples): the temporaries stay a few MB whatever the batch (fresh large buffers
        cost page faults; 1M x 4 float32 values: about 1.4x faster). ``lower <= upper`` is
        checked on the blocks' least widths once all are seen (positions over the batch)."""
        step = max(_BLOCK // lower.shape[1], 1)
        sums, least_widths = [], []
        for start in range(0, lower.shape[0], step):
            rows = slice(start, start + step)
            width, penalty = interval_parts(lower[rows], upper[rows], target[rows])
            block_ids = None if ids is None else ids[rows]
            if values_checked():
                least_widths.append(width.amin())
            sums.append(
                (
                    self._sum_rows(width, block_ids, torch.float64),
                    self._sum_rows(penalty, block_ids, torch.float64),
                    self._count_misses(penalty, block_ids),
                )
            )
        if least_widths:
            check_interval_width(torch.stack(least_widths), lower, upper)
        return tuple(torch.stack(parts).sum(dim=0) for parts in zip(*sums))

    def _count_misses(self, penalty: Tensor, ids: Tensor | None) -> Tensor:
        """int64 ``(G, L)``: the number of rows with ``penalty > 0`` (the target outside;
        ``penalty == 0`` exactly when covered). Overwrites ``penalty``."""
        if not self.validate_args:
            penalty.nan_to_num_(nan=1.0)  # a NaN covers nothing (unchecked input; sign(NaN) = 0)
        miss = penalty.sign_()  # 0/1 (penalty >= 0)
        if ids is None:
            # 0/1 values, at most _BLOCK <= 2^24 rows: every partial sum is exact in float32
            return miss.sum(dim=0, keepdim=True).to(torch.int64)
        return self._sum_rows(miss, ids, torch.int64)

    @staticmethod
    def _summary(hits: Tensor, width: Tensor, score: Tensor, n: Tensor) -> dict[str, Tensor]:
        p = _ratio(hits, n)
        nf = n.to(torch.float64).unsqueeze(-1)
        return {
            "coverage": p,
            "stderr": torch.sqrt(p * (1.0 - p) / nf),
            "width": width / nf,
            "interval_score": score / nf,
            "n": n.clone(),
        }

    def compute(self) -> dict[str, Tensor] | GroupedResult:
        """Coverage, its standard error, mean width and interval score per level (+ ``n``)."""
        states = [self.hits, self.width_sum, self.score_sum, self.n]
        return self._result(self._summary, states, self.n)


class QuantileCalibrationError(RegressionMetric):
    """Streaming quantile calibration error: observed frequency vs nominal level.

    ``update(quantiles, target, groups=None)`` with ``quantiles`` ``(..., K)`` at the ``K``
    ``levels`` (non-decreasing along the last dim) and ``target`` ``(...)``. The state is an
    int64 count of ``y <= q_k`` per (group, level) and ``n`` per group. ``compute()`` returns
    the error of :func:`~torchcal.functional.quantile_calibration_error` (``norm="l1"``: the
    mean :math:`|\\hat p_k - \\tau_k|`, uncertainty-toolbox's miscalibration area on a level
    grid; ``"l2"``: the RMS calibration error) as a float64 scalar, or a
    :class:`~torchcal.GroupedResult` (``per_group`` ``(G,)``).
    :meth:`compute_observed` returns the observed frequencies :math:`\\hat p_k` ``(K,)``
    (the quantile reliability curve; ``(G, K)`` per group).

    Args:
        levels: nominal levels ``tau_k`` in (0, 1), strictly increasing.
        norm: ``"l1"`` or ``"l2"``.
        num_groups: per-group results (``update`` then needs ``groups`` of ``target``'s shape).
        validate_args: run the value checks (NaN, crossing quantiles, group ids).

    Example:
        >>> import torch
        >>> from torchcal.metrics import QuantileCalibrationError
        >>> m = QuantileCalibrationError(levels=(0.25, 0.75))
        >>> m.update(torch.tensor([[-1.0, 1.0], [-1.0, 1.0]]), torch.tensor([0.0, 2.0]))
        >>> float(m.compute()), m.compute_observed().tolist()
        (0.25, [0.0, 0.5])
    """

    higher_is_better = False
    plot_lower_bound = 0.0
    _CONFIG = ("levels", "norm", "num_groups")
    _RULES = StateRules(counts=("below", "n"), bounded=(("below", "n"),))

    def __init__(
        self,
        levels: Sequence[float] | Tensor,
        *,
        norm: str = "l1",
        num_groups: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_groups=num_groups, validate_args=validate_args, **kwargs)
        self.levels = level_tuple("levels", levels)
        self.norm = check_option("norm", norm, ("l1", "l2"))
        shape = (self._G, len(self.levels))
        self.add_state("below", torch.zeros(shape, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("n", torch.zeros(self._G, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, quantiles: Tensor, target: Tensor, groups: Tensor | None = None) -> None:
        """Accumulate a batch: quantiles ``(..., K)``, target ``(...)``, groups ``(...)``."""
        if not isinstance(target, Tensor):
            raise TypeError(f"target: expected a Tensor, got {type(target).__name__}")
        ids = self._group_ids(groups, target.shape)
        k = len(self.levels)
        with validation_enabled(self.validate_args):
            below = observed_frequencies(quantiles, self.levels, target, reduction="none")
        self.below.add_(
            self._sum_rows(below.reshape(-1, k), ids, torch.int64).to(self.below.device)
        )
        self.n.add_(self._count_rows(ids, target.numel()).to(self.n.device))

    def _error(self, below: Tensor, n: Tensor) -> Tensor:
        levels = torch.tensor(self.levels, dtype=torch.float64, device=below.device)
        return frequency_calibration_error(_ratio(below, n), levels, norm=self.norm)

    def compute(self) -> Tensor | GroupedResult:
        """The quantile calibration error (float64 scalar, or a GroupedResult)."""
        return self._result(self._error, [self.below, self.n], self.n)

    def compute_observed(self) -> Tensor | GroupedResult:
        """Observed frequencies :math:`\\hat p_k` ``(K,)`` (or a GroupedResult, ``(G, K)``);
        synchronised across ranks like :meth:`compute`."""
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=True):
            return self._result(_ratio, [self.below.clone(), self.n.clone()], self.n.clone())
