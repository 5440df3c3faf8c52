"""The shared machinery of the calibration Metrics (an internal module; docs/design.md
section 3): configuration-checked merging and DDP sync, float64 states under dtype
conversions, the one-time probabilities warning, and the binned ``(G, K, B)`` state with
its public synced accessor :meth:`BinnedMetric.statistics`."""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.distributed import gather_all_tensors

from torchcal.functional import calibration as C
from torchcal.functional._validation import (
    check_int,
    check_option,
    check_optional_int,
    validation_enabled,
)
from torchcal.report import GroupedResult

__all__ = ["STAT_NAMES", "BinnedMetric", "MetricStatistics", "PooledPlotMetric"]

STAT_NAMES = ("count", "sum_conf", "sum_acc", "sum_conf2", "sum_conf_acc")


class MetricStatistics(NamedTuple):
    """What :meth:`CalibrationError.statistics` (and the other binned metrics) return.

    Attributes:
        stats: the binned sufficient statistics ``(G, K, n_bins)`` (see
            :class:`~torchcal.functional.calibration.BinnedStats`).
        group_counts: samples per group, int64 ``(G,)``.
    """

    stats: C.BinnedStats
    group_counts: Tensor


class PooledPlotMetric(Metric):
    """``plot()`` of torchmetrics for scalar (or dict) results; the pooled value for groups.

    Also the shared guards: configuration checks in ``merge_state`` and the DDP sync,
    float64 states kept under dtype conversions, the one-time probabilities warning.
    """

    #: attributes whose values change what the states or the result mean
    _CONFIG: tuple[str, ...] = ()

    def _config(self) -> dict[str, Any]:
        return {"class": type(self).__name__, **{k: getattr(self, k, None) for k in self._CONFIG}}

    def _fingerprint(self) -> int:
        return zlib.crc32(repr(sorted(self._config().items())).encode())

    def merge_state(self, incoming_state: dict[str, Any] | Metric) -> None:
        """Add another metric's states (or a state dict) to this one's; ``ValueError``
        naming ``other`` when the configurations (or a dict's shapes/dtypes) differ."""
        if isinstance(incoming_state, Metric):
            if not isinstance(incoming_state, PooledPlotMetric):
                raise ValueError(
                    f"other: expected a {type(self).__name__}, got {type(incoming_state).__name__}"
                )
            mine, theirs = self._config(), incoming_state._config()
            diff = [
                f"{k}={mine[k]!r} here, {theirs.get(k)!r} there"
                for k in mine
                if mine[k] != theirs.get(k)
            ]
            if diff:
                raise ValueError(
                    f"other: cannot merge metrics of different configurations: {'; '.join(diff)}"
                )
        elif isinstance(incoming_state, dict):
            for name in self._defaults:
                mine, theirs = getattr(self, name), incoming_state.get(name)
                if (
                    isinstance(mine, Tensor)
                    and isinstance(theirs, Tensor)
                    and (theirs.shape != mine.shape or theirs.dtype != mine.dtype)
                ):
                    raise ValueError(
                        f"other: state {name!r} has shape {tuple(theirs.shape)} "
                        f"and dtype {theirs.dtype}, expected "
                        f"{tuple(mine.shape)} and {mine.dtype}"
                    )
        super().merge_state(incoming_state)

    def _sync_dist(
        self, dist_sync_fn: Callable | None = None, process_group: Any | None = None
    ) -> None:
        fn = dist_sync_fn or gather_all_tensors
        group = process_group or self.process_group
        mine = torch.tensor([self._fingerprint()], dtype=torch.int64, device=self.device)
        ranks = [r for r, fp in enumerate(fn(mine, group=group)) if int(fp) != int(mine)]
        if ranks:
            raise ValueError(
                f"other: rank(s) {ranks} built {type(self).__name__} with a "
                f"different configuration than this rank ({self._config()}); "
                f"every rank must use the same settings"
            )
        # a rank that never updated holds [] for a 'cat' state; torchmetrics would send an
        # empty tensor of the metric's default dtype, which does not match the others'
        for name, dtype in self._cat_dtypes().items():
            if isinstance(getattr(self, name), list) and len(getattr(self, name)) == 0:
                setattr(self, name, [torch.zeros(0, dtype=dtype, device=self.device)])
        super()._sync_dist(fn, process_group=process_group)

    def _cat_dtypes(self) -> dict[str, torch.dtype]:
        return {}

    def _apply(self, fn: Callable, exclude_state: Any = "") -> torch.nn.Module:
        def keep_dtype(t: Tensor) -> Tensor:
            out = fn(t)  # a dtype change is undone from the original: no rounding trip
            return out if out.dtype == t.dtype else t.to(device=out.device)

        return super()._apply(keep_dtype, exclude_state)

    def _warn_probs_once(self, looks_like_probs: bool, stacklevel: int = 5) -> None:
        if looks_like_probs and not getattr(self, "_warned_probs", False):
            self._warned_probs = True
            warnings.warn(C.PROBS_AS_LOGITS, UserWarning, stacklevel=stacklevel)

    def plot(self, val: Any = None, ax: Any = None) -> Any:
        """Plot the value(s) with torchmetrics' plot (the pooled value(s) for groups);
        returns ``(figure, axis)``."""
        val = self.compute() if val is None else val
        if isinstance(val, GroupedResult):
            val = val.pooled
        return self._plot(val, ax)


class BinnedMetric(PooledPlotMetric):
    """Shared state handling: ``(G, K, B)`` binned statistics (+ optional fine histogram,
    kept samples, bootstrap replicates)."""

    full_state_update = False
    is_differentiable = False
    higher_is_better = False
    plot_lower_bound = 0.0

    _CONFIG = ("n_bins", "reading", "input", "num_classes", "num_groups")

    def __init__(
        self,
        n_bins: int = 15,
        *,
        reading: str = "confidence",
        input: str = "logits",
        num_classes: int | None = None,
        num_groups: int | None = None,
        validate_args: bool = True,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_optional_int("ignore_index", ignore_index)
        self.ignore_index = ignore_index
        self.n_bins = check_int("n_bins", n_bins, minimum=1)
        check_option("reading", reading, C.READINGS)
        check_option("input", input, C.INPUTS)
        self.reading = reading
        self.input = input
        if reading in ("top_label", "classwise"):
            if num_classes is None:
                raise ValueError(
                    f"num_classes: expected the number of classes for "
                    f"reading={reading!r} (the state is classes x bins), got None"
                )
            check_int("num_classes", num_classes, minimum=2)
        elif num_classes is not None:
            check_int("num_classes", num_classes, minimum=1)
        self.num_classes = num_classes
        self.num_groups = (
            None if num_groups is None else check_int("num_groups", num_groups, minimum=1)
        )
        self.validate_args = bool(validate_args)
        self._G = num_groups or 1
        self._K = num_classes if reading in ("top_label", "classwise") else 1
        self._add_stats("", self.n_bins)
        self.add_state("group_count", torch.zeros(self._G, dtype=torch.int64), dist_reduce_fx="sum")

    def _add_stats(self, prefix: str, bins: int) -> None:
        shape = (self._G, self._K, bins)
        for name in STAT_NAMES:
            dtype = torch.int64 if name == "count" else torch.float64
            self.add_state(prefix + name, torch.zeros(shape, dtype=dtype), dist_reduce_fx="sum")

    def _stats(self, prefix: str = "") -> C.BinnedStats:
        return C.BinnedStats(*(getattr(self, prefix + n) for n in STAT_NAMES))

    def statistics(self) -> MetricStatistics:
        """The binned statistics of every sample seen, synchronised across ranks.

        A collective like ``compute()`` (under DDP every rank must call it); the tensors are
        copies, so the local states are untouched. Zeros if nothing was seen.

        Example:
            >>> import torch
            >>> from torchcal.metrics import ReliabilityDiagram
            >>> m = ReliabilityDiagram(n_bins=2, reading="binary", input="probs")
            >>> m.update(torch.tensor([0.2, 0.9]), torch.tensor([0, 1]))
            >>> st = m.statistics()
            >>> st.stats.pooled().count.tolist(), st.group_counts.tolist()
            ([[1, 1]], [2])
        """
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=True):
            stats = C.BinnedStats(*(getattr(self, n).clone() for n in STAT_NAMES))
            return MetricStatistics(stats, self.group_count.clone())

    def _add_to(self, prefix: str, s: C.BinnedStats) -> None:
        for name, t in zip(STAT_NAMES, (s.count, s.conf, s.acc, s.conf2, s.conf_acc)):
            getattr(self, prefix + name).add_(t)

    def _prepare(self, preds: Tensor, target: Tensor, groups: Tensor | None) -> C.PreparedInputs:
        if self.num_groups is not None and groups is None:
            raise ValueError(
                f"groups: expected a group id per sample (the metric was built "
                f"with num_groups={self.num_groups}), got None"
            )
        if self.num_groups is None and groups is not None:
            raise ValueError(
                "groups: pass num_groups= to the metric's constructor to get "
                "per-group results (the state size must be fixed up front)"
            )
        with validation_enabled(self.validate_args):
            prep = C.prepare_inputs(
                preds,
                target,
                reading=self.reading,
                input=self.input,
                num_classes=self.num_classes,
                groups=groups,
                num_groups=self.num_groups,
                ignore_index=self.ignore_index,
            )
        self._warn_probs_once(prep.looks_like_probs)
        return prep

    def _update_binned(self, prep: C.PreparedInputs) -> None:
        self._add_to("", C.accumulate(prep, self.n_bins))
        self.group_count.add_(prep.group_counts.to(self.group_count.device))

    def _check_seen(self) -> None:
        if int(self.group_count.sum()) == 0:
            raise RuntimeError(
                f"{type(self).__name__}.compute(): no samples seen; call "
                f"update() with at least one sample first"
            )

    def _grouped(
        self,
        fn: Any,
        fine: C.BinnedStats | None = None,
        samples: C.CalibrationSamples | None = None,
    ) -> Any:
        """``fn(stats (K, B), fine, samples)`` pooled, or a GroupedResult."""
        self._check_seen()
        stats = self._stats()
        if self.num_groups is None:
            return fn(stats.pooled(), None if fine is None else fine.pooled(), samples)
        return C.per_group(fn, stats, fine, samples, self.group_count)
