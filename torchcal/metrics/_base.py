"""The shared machinery of the calibration Metrics (an internal module; docs/design.md
section 3): configuration-checked merging and DDP sync, persistent states that are checked
when loaded or merged, float64 states under dtype conversions, the one-time probabilities
warning, and the binned ``(G, K, B)`` state (binned in deferred batches) with its public
synced accessor :meth:`BinnedMetric.statistics`."""

from __future__ import annotations

import dataclasses
import warnings
import zlib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.distributed import gather_all_tensors

from torchcal.functional._checks import (
    check_bool,
    check_int,
    check_option,
    validation_enabled,
    values_checked,
)
from torchcal.functional._validation import check_optional_int
from torchcal.functional.calibration.binning import SUM_BLOCK, BinnedStats, accumulate, bin_batches
from torchcal.functional.calibration.readings import (
    INPUTS,
    PROBS_AS_LOGITS,
    READINGS,
    CalibrationSamples,
    PreparedInputs,
    prepare_inputs,
    prepare_rows,
)
from torchcal.functional.calibration.results import GroupedResult
from torchcal.functional.calibration.wrappers import per_group

__all__ = [
    "MetricStatistics",
]

STAT_NAMES = ("count", "sum_conf", "sum_acc", "sum_conf2", "sum_conf_acc")

#: relative slack of the bounds between float64 sums (``sum c <= count`` is exact in real
#: arithmetic; a float64 sum of ``n`` values carries a relative error below ``n * 2^-53``)
_SLACK = 1e-9


@dataclasses.dataclass(frozen=True)
class StateRules:
    """What a metric's summed states must satisfy (checked on load, merge and DDP sync).

    Attributes:
        counts: int64 states of non-negative counts.
        sums: float64 states that must be finite.
        nonnegative: float64 states that must be ``>= 0`` and not NaN (``+inf`` allowed:
            a log score of a zero probability).
        bounded: ``(part, whole)`` pairs: ``0 <= part <= whole`` element-wise, ``whole``
            broadcast from the left over ``part``'s trailing dims (hits <= n).
    """

    counts: tuple[str, ...] = ()
    sums: tuple[str, ...] = ()
    nonnegative: tuple[str, ...] = ()
    bounded: tuple[tuple[str, str], ...] = ()


def _first_bad(bad: Tensor) -> str:
    idx = torch.nonzero(bad)[0].tolist()
    return str(tuple(idx)) if len(idx) > 1 else str(idx[0]) if idx else "()"


def check_state_values(rules: StateRules, states: Mapping[str, Any], where: str) -> None:
    """``ValueError("<where>: state '<name>' ...")`` when ``states`` break ``rules`` (a
    tampered or corrupted checkpoint, a merge with garbage): negative or non-integer counts,
    non-finite sums, a part above its whole. Names absent from ``states`` are skipped."""

    def get(name: str) -> Tensor | None:
        v = states.get(name)
        return v.detach() if isinstance(v, Tensor) else None

    for name in rules.counts:
        v = get(name)
        if v is None:
            continue
        if v.is_floating_point() or v.is_complex() or v.dtype == torch.bool:
            raise ValueError(f"{where}: state {name!r} must hold integer counts, got {v.dtype}")
        if v.numel() and bool((v < 0).any()):
            bad = v < 0
            raise ValueError(
                f"{where}: state {name!r} must hold non-negative counts, got "
                f"{int(v[bad].reshape(-1)[0])} at {_first_bad(bad)}"
            )
    for name in rules.sums + rules.nonnegative:
        v = get(name)
        if v is None or not v.numel():
            continue
        if not v.is_floating_point():
            raise ValueError(f"{where}: state {name!r} must hold float sums, got {v.dtype}")
        bad = ~torch.isfinite(v) if name in rules.sums else ~(v >= 0)
        if bool(bad.any()):
            want = "finite sums" if name in rules.sums else "non-negative sums"
            raise ValueError(
                f"{where}: state {name!r} must hold {want}, got "
                f"{float(v[bad].reshape(-1)[0])!r} at {_first_bad(bad)}"
            )
    for part_name, whole_name in rules.bounded:
        part, whole = get(part_name), get(whole_name)
        if part is None or whole is None or not part.numel():
            continue
        w = whole.to(torch.float64).reshape(whole.shape + (1,) * (part.dim() - whole.dim()))
        p = part.to(torch.float64)
        bad = (p < -_SLACK * w) | (p > w * (1 + _SLACK) + _SLACK)
        if bool(bad.any()):
            raise ValueError(
                f"{where}: state {part_name!r} must lie in [0, {whole_name}], got "
                f"{p[bad.expand_as(p)].reshape(-1)[0].item()!r} against "
                f"{w.expand_as(p)[bad.expand_as(p)].reshape(-1)[0].item()!r} at "
                f"{_first_bad(bad.expand_as(p))}"
            )


class MetricStatistics(NamedTuple):
    """What :meth:`CalibrationError.statistics` (and the other binned metrics) return.

    Attributes:
        stats: the binned sufficient statistics ``(G, K, n_bins)`` (see
            :class:`~torchcal.functional.BinnedStats`).
        group_counts: samples per group, int64 ``(G,)``.
    """

    stats: BinnedStats
    group_counts: Tensor


class PooledPlotMetric(Metric):
    """``plot()`` of torchmetrics for scalar (or dict) results; the pooled value for groups.

    Also the shared guards: configuration checks in ``merge_state`` and the DDP sync,
    float64 states kept under dtype conversions, the one-time probabilities warning.
    """

    #: attributes whose values change what the states or the result mean
    _CONFIG: tuple[str, ...] = ()
    #: what the summed states must satisfy (checked on load, merge and DDP sync)
    _RULES = StateRules()

    def add_state(self, name: str, default: Any, *args: Any, **kwargs: Any) -> None:
        """torchmetrics' ``add_state``, persistent by default: ``state_dict()`` carries the
        states, so a checkpointed metric reloads what it has seen (a ``state_dict`` without
        them, e.g. from an earlier version, loads as before: the states stay untouched)."""
        if not args:
            kwargs.setdefault("persistent", True)
        super().add_state(name, default, *args, **kwargs)

    def _check_states(self, states: Mapping[str, Any], where: str) -> None:
        check_state_values(self._RULES, states, where)

    def _load_from_state_dict(
        self,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        incoming = {k: state_dict[prefix + k] for k in self._defaults if prefix + k in state_dict}
        for name, value in incoming.items():
            mine = getattr(self, name)
            if isinstance(mine, Tensor) and (
                not isinstance(value, Tensor) or value.shape != mine.shape
            ):
                got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(
                    f"state_dict: state {prefix + name!r} has shape {got}, expected "
                    f"{tuple(mine.shape)} (a metric of another configuration?)"
                )
        self._check_states(incoming, "state_dict")
        devices = {
            k: getattr(self, k).device for k in incoming if isinstance(getattr(self, k), Tensor)
        }
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        for name, device in devices.items():  # the metric's device and state dtype, own copy
            dtype = self._defaults[name].dtype
            setattr(self, name, getattr(self, name).to(device=device, dtype=dtype, copy=True))
        if incoming and not self._update_count:  # it has seen what the states hold
            self._update_count = 1

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
            self._check_states(
                {k: getattr(incoming_state, k) for k in incoming_state._defaults}, "other"
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
            self._check_states(incoming_state, "other")
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
        self._check_states({k: getattr(self, k) for k in self._defaults}, "other")

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
            warnings.warn(PROBS_AS_LOGITS, UserWarning, stacklevel=stacklevel)

    def plot(self, val: Any = None, ax: Any = None) -> Any:
        """Plot the value(s) with torchmetrics' plot (the pooled value(s) for groups);
        returns ``(figure, axis)``."""
        val = self.compute() if val is None else val
        if isinstance(val, GroupedResult):
            val = val.pooled
        return self._plot(val, ax)


#: pending elements at which :meth:`BinnedMetric.update` bins them (bounded memory; the
#: temporaries of a flush stay in cache: 2^14 bins 256-row batches about 1.6x faster per
#: batch than 2^16)
_FLUSH_AT = 1 << 14


class _DeferredStat:
    """A binned statistic whose pending batches are binned before any read or write.

    ``update`` of a :class:`BinnedMetric` keeps the prepared (confidence, outcome, cell)
    tensors of small batches in a list and bins them together later (one pass over many
    batches instead of a dozen small kernels per batch); every access to the state through
    the attribute (``compute``, ``statistics``, ``state_dict``, the DDP sync, ``merge_state``,
    ``reset``, device moves, a user reading ``metric.count``) bins the pending batches
    first, so no reader ever sees a partial state. ``group_count`` is one too: the batches
    of :meth:`BinnedMetric._update_rows` keep their sample counts on the host until then.
    """

    def __init__(self, name: str) -> None:
        self.key = "_deferred_" + name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        obj._flush()
        return obj.__dict__[self.key]

    def __set__(self, obj: Any, value: Any) -> None:
        obj._flush()  # pending batches belong to the value being replaced
        obj.__dict__[self.key] = value


class BinnedMetric(PooledPlotMetric):
    """Shared state handling: ``(G, K, B)`` binned statistics (+ optional fine histogram,
    kept samples, bootstrap replicates).

    The main statistics are binned in deferred batches (see :class:`_DeferredStat`): an
    ``update`` of a small batch validates it and computes its confidences and outcomes at
    once (errors name the batch that caused them), and the binning runs when ``2^14``
    elements are pending or when anything reads the states. Batches whose prepared tensors
    could alias the caller's memory (the binary reading, classwise probabilities) are
    binned at once.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False
    plot_lower_bound = 0.0

    _CONFIG = ("n_bins", "reading", "input", "num_classes", "num_groups")
    _RULES = StateRules(
        counts=("count", "group_count", "fine_count"),
        sums=tuple(p + n for p in ("", "fine_") for n in STAT_NAMES[1:])
        + ("boot_n", "boot_conf", "boot_acc"),
        bounded=tuple(
            (p + a, p + b)
            for p in ("", "fine_")
            for a, b in (
                ("sum_conf", "count"),
                ("sum_acc", "count"),
                ("sum_conf2", "sum_conf"),
                ("sum_conf_acc", "sum_acc"),
            )
        ),
    )

    count = _DeferredStat("count")
    sum_conf = _DeferredStat("sum_conf")
    sum_acc = _DeferredStat("sum_acc")
    sum_conf2 = _DeferredStat("sum_conf2")
    sum_conf_acc = _DeferredStat("sum_conf_acc")
    group_count = _DeferredStat("group_count")

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
        self.__dict__["_pending"] = []
        self.__dict__["_pending_n"] = 0
        check_optional_int("ignore_index", ignore_index)
        self.ignore_index = ignore_index
        self.n_bins = check_int("n_bins", n_bins, minimum=1)
        check_option("reading", reading, READINGS)
        check_option("input", input, INPUTS)
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
        self.validate_args = check_bool("validate_args", validate_args)
        self._G = num_groups or 1
        self._K = num_classes if reading in ("top_label", "classwise") else 1
        self._add_stats("", self.n_bins)
        self.add_state("group_count", torch.zeros(self._G, dtype=torch.int64), dist_reduce_fx="sum")
        # the prepared tensors are fresh (never a view of the caller's preds/target) only for
        # these readings: defer their binning
        self._defer = reading in ("confidence", "top_label") or (
            reading == "classwise" and input == "logits"
        )
        # the validation loop's batches (rows, no groups) take :meth:`_update_rows`
        self._rows = reading in ("confidence", "top_label") and num_groups is None

    def _add_stats(self, prefix: str, bins: int) -> None:
        shape = (self._G, self._K, bins)
        for name in STAT_NAMES:
            dtype = torch.int64 if name == "count" else torch.float64
            self.add_state(prefix + name, torch.zeros(shape, dtype=dtype), dist_reduce_fx="sum")

    def _stats(self, prefix: str = "") -> BinnedStats:
        return BinnedStats(*(getattr(self, prefix + n) for n in STAT_NAMES))

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
            stats = BinnedStats(*(getattr(self, n).clone() for n in STAT_NAMES))
            return MetricStatistics(stats, self.group_count.clone())

    def _add_to(self, prefix: str, s: BinnedStats) -> None:
        for name, t in zip(STAT_NAMES, (s.count, s.conf, s.acc, s.conf2, s.conf_acc)):
            getattr(self, prefix + name).add_(t)

    def _prepare(self, preds: Tensor, target: Tensor, groups: Tensor | None) -> PreparedInputs:
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
        kw = dict(
            reading=self.reading,
            input=self.input,
            num_classes=self.num_classes,
            groups=groups,
            num_groups=self.num_groups,
            ignore_index=self.ignore_index,
        )
        if self.validate_args == values_checked():  # no switch to flip: skip the context
            prep = prepare_inputs(preds, target, **kw)
        else:
            with validation_enabled(self.validate_args):
                prep = prepare_inputs(preds, target, **kw)
        if prep.looks_like_probs:
            self._warn_probs_once(True)
        return prep

    def _update_rows(self, preds: Tensor, target: Tensor, groups: Tensor | None) -> bool:
        """Bin a batch of rows ``(N, C)`` with labels ``(N,)`` (no groups, no
        ``ignore_index``) in the fewest calls: :func:`~.readings.prepare_rows` (the checks and
        values of :meth:`_prepare`), then deferred, its samples counted on the host until the
        flush. ``False`` (nothing done) for any other batch: the caller takes the general
        path."""
        if not (self._rows and groups is None and self.ignore_index is None):
            return False
        reading, input, num_classes = self.reading, self.input, self.num_classes
        if self.validate_args == values_checked():
            rows = prepare_rows(
                preds, target, reading=reading, input=input, num_classes=num_classes
            )
        else:
            with validation_enabled(self.validate_args):
                rows = prepare_rows(
                    preds, target, reading=reading, input=input, num_classes=num_classes
                )
        if rows is None:
            return False
        conf, outcome, lead, looks = rows
        if looks:
            self._warn_probs_once(True)
        n = conf.shape[0]
        if n > SUM_BLOCK:  # binned at once (blocked sums)
            counts = torch.full((1,), n, dtype=torch.int64, device=conf.device)
            prep = PreparedInputs(conf, outcome, lead, 1, self._K, counts, 1, looks)
            self._update_binned(prep)
            return True
        d = self.__dict__
        pending = d["_pending"]
        if pending and pending[0][0].device != conf.device:
            self._flush()
            pending = d["_pending"]
        pending.append((conf, outcome, lead, n))
        d["_pending_n"] += n
        if d["_pending_n"] >= _FLUSH_AT:
            self._flush()
        return True

    def _update_binned(self, prep: PreparedInputs) -> None:
        d = self.__dict__
        if self._defer and prep.conf.numel() <= SUM_BLOCK:
            pending = d["_pending"]
            if pending and pending[0][0].device != prep.conf.device:
                self._flush()
                pending = d["_pending"]
            pending.append((prep.conf, prep.outcome, prep.lead, 0))
            d["_pending_n"] += prep.conf.numel()
            gc = d["_deferred_group_count"]  # integers: adding them now or later is exact
            if d["_pending_n"] >= _FLUSH_AT:
                self._flush()
        else:  # getattr bins the pending batches first: the order of the sums is kept
            self._add_to("", accumulate(prep, self.n_bins))
            gc = self.group_count
        counts = prep.group_counts
        gc.add_(counts if counts.device == gc.device else counts.to(gc.device))

    def _flush(self) -> None:
        """Bin the pending batches into the statistics: one pass over all of them, added in
        batch order (a sequential ``cumsum``), so the states are bit-identical to binning
        each batch at its ``update``; the samples of :meth:`_update_rows` batches go to
        group 0's count."""
        d = self.__dict__
        pending = d.get("_pending")
        if not pending:
            return
        d["_pending"], d["_pending_n"] = [], 0
        confs, outcomes, leads, samples = zip(*pending)
        s = bin_batches(confs, outcomes, leads, self._G, self._K, self.n_bins)
        for name, t in zip(STAT_NAMES, (s.count, s.conf, s.acc, s.conf2, s.conf_acc)):
            state = d["_deferred_" + name]
            t = t if t.device == state.device else t.to(state.device)
            if name == "count":  # integers: any order is exact
                state.add_(t.sum(0))
            else:
                state.copy_(torch.cat([state.unsqueeze(0), t]).cumsum(0)[-1])
        n = sum(samples)
        if n:
            d["_deferred_group_count"][0] += n

    def _check_seen(self) -> None:
        if int(self.group_count.sum()) == 0:
            raise RuntimeError(
                f"{type(self).__name__}.compute(): no samples seen; call "
                f"update() with at least one sample first"
            )

    def _grouped(
        self,
        fn: Any,
        fine: BinnedStats | None = None,
        samples: CalibrationSamples | None = None,
    ) -> Any:
        """``fn(stats (K, B), fine, samples)`` pooled, or a GroupedResult."""
        self._check_seen()
        stats = self._stats()
        if self.num_groups is None:
            return fn(stats.pooled(), None if fine is None else fine.pooled(), samples)
        return per_group(fn, stats, fine, samples, self.group_count)
