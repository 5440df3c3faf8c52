"""torchmetrics ``Metric`` shells over :mod:`torchcal.functional.calibration`.

Every metric keeps float64 ``sum`` states of size O(groups x slots x bins) (never the
samples, unless ``exact=True`` asks for it), so memory is independent of N, one all-reduce
merges ranks under DDP, and ``update``/``compute`` run the same code as the functional twins
(:func:`~torchcal.functional.calibration_error`, :func:`~torchcal.functional.reliability_table`,
:func:`~torchcal.functional.brier_decomposition`,
:func:`~torchcal.functional.negative_log_likelihood`).

With ``num_groups=G`` every ``update`` needs ``groups`` (a domain id per sample) and
``compute()`` returns a :class:`~torchcal.GroupedResult` (``pooled`` beside
``per_group``). ``compute()`` before any sample raises ``RuntimeError``.

**Merging.** ``merge_state(other)`` and the DDP sync add the statistics only between metrics
of the same configuration (class, ``n_bins``, ``reading``, ``input``, ``num_classes``,
``num_groups``, ``norm``, ``estimator``, ``exact``, ...: everything that changes what a
statistic or the result means; not ``validate_args``, ``ignore_index`` or ``seed``), else
``ValueError("other: ...")``. Under DDP every rank all-gathers an 8-byte fingerprint of its
configuration before the states (one small collective per sync). A state ``dict`` passed to
``merge_state`` carries no configuration: only its shapes and dtypes are checked.

**Dtypes.** The statistics stay float64 (counts int64) under every dtype conversion:
``.to(dtype)``, ``.half()``, ``.bfloat16()``, ``.type()``, ``set_dtype`` and Lightning's
``"bf16-true"``/``"16-true"`` (which call ``module.to(dtype)``); device moves apply.

**Probabilities passed as logits.** With ``input="logits"`` a batch whose rows all lie in
[0, 1] and sum to 1 gets one ``UserWarning`` per metric (``validate_args=True``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_bool, check_int, check_number, check_option
from torchcal.functional.calibration.binning import BinnedStats, accumulate
from torchcal.functional.calibration.bootstrap import bootstrap_statistics, ece_bootstrap_from_stats
from torchcal.functional.calibration.estimators import (
    brier_decomposition_from_stats,
    calibration_error_from_stats,
    class_mean,
    debiased_calibration_error_from_stats,
)
from torchcal.functional.calibration.intervals import INTERVALS, z_of_level
from torchcal.functional.calibration.readings import CalibrationSamples, samples_from
from torchcal.functional.calibration.results import GroupedResult, ReliabilityTable
from torchcal.functional.calibration.tables import reliability_table_from_stats
from torchcal.functional.calibration.wrappers import (
    FINE_ESTIMATORS,
    check_ece_estimator,
    estimate,
    stack_scalars,
)
from torchcal.metrics._base import BinnedMetric

__all__ = [
    "BrierDecomposition",
    "CalibrationError",
    "ClasswiseCalibrationError",
    "ReliabilityDiagram",
]


class CalibrationError(BinnedMetric):
    """Streaming calibration error (ECE / RMSCE / MCE and friends) in O(bins) state.

    Args:
        n_bins: number of bins ``B`` (equal-width; equal-mass for ``"equal_mass"``).
        norm: ``"l1"`` (ECE), ``"l2"`` (RMSCE) or ``"max"`` (MCE).
        reading: ``"binary" | "confidence" | "top_label" | "classwise"``.
        input: ``"logits"`` or ``"probs"`` (never guessed).
        estimator: ``"binned"`` (default), ``"debiased"`` (Kumar et al. 2019, ``norm="l2"``),
            ``"equal_mass"``, ``"sweep"`` (Roelofs et al. 2022), ``"smooth"`` (Blasiok &
            Nakkiran 2023). The last three add a ``fine_bins`` histogram to the state
            (``binary``/``confidence`` only), or keep the samples with ``exact=True``.
        num_classes: required for ``top_label`` / ``classwise`` (state ``C x B``).
        num_groups: per-group results (state ``G x K x B``); ``update`` then needs ``groups``.
        fine_bins: sub-bins of the fine histogram (default 4096).
        exact: keep every (confidence, outcome, group) (24 bytes/sample, ``cat`` under DDP)
            for the sort-based equal-mass / sweep / smooth estimators (the binned and
            debiased estimators need no samples: nothing is kept for them).
        sigma: fixed bandwidth for ``"smooth"`` (default: the fixed point).
        bootstrap: number ``R`` of streaming Poisson-bootstrap replicates (0: off); adds
            ``3 x R x K x B`` float64 state and enables :meth:`compute_interval`.
        level: level of the bootstrap interval.
        seed: seed of the bootstrap weights (rank ``r`` uses ``seed + 1_000_003 r``). The
            generator keeps its position across ``reset()`` (``forward()`` resets the states
            for every batch, and batches must get fresh weights); a new metric with the same
            seed repeats a run exactly.
        validate_args: run the value checks (NaN, ranges; one host sync each) in ``update``.
        ignore_index: a target value whose elements ``update`` drops (as
            ``F.cross_entropy``; a batch may be entirely ignored).

    ``compute()`` returns a float64 scalar, or a :class:`~torchcal.GroupedResult`
    (``pooled`` scalar, ``per_group`` ``(G,)``) with ``num_groups``.

    Example:
        >>> import torch
        >>> from torchcal.metrics import CalibrationError
        >>> m = CalibrationError(n_bins=10)
        >>> m.update(torch.tensor([[2.0, 0.0]]), torch.tensor([0]))
        >>> m.update(torch.tensor([[0.0, 3.0], [1.0, 0.0]]), torch.tensor([1, 1]))
        >>> round(float(m.compute()), 4)
        0.2992
    """

    def __init__(
        self,
        n_bins: int = 15,
        *,
        norm: str = "l1",
        reading: str = "confidence",
        input: str = "logits",
        estimator: str = "binned",
        num_classes: int | None = None,
        num_groups: int | None = None,
        fine_bins: int = 4096,
        exact: bool = False,
        sigma: float | None = None,
        bootstrap: int = 0,
        level: float = 0.95,
        seed: int = 0,
        validate_args: bool = True,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            n_bins,
            reading=reading,
            input=input,
            num_classes=num_classes,
            num_groups=num_groups,
            validate_args=validate_args,
            ignore_index=ignore_index,
            **kwargs,
        )
        check_ece_estimator(estimator, norm, reading)
        self.norm = norm
        self.estimator = estimator
        self.sigma = None if sigma is None else check_number("sigma", sigma, strict=True)
        self.exact = check_bool("exact", exact)
        self.fine_bins = check_int("fine_bins", fine_bins, minimum=1)
        self._fine = estimator in FINE_ESTIMATORS and not self.exact
        self._keep = estimator in FINE_ESTIMATORS and self.exact
        #: nothing but the binned statistics: the batch may take the rows path
        self._plain = not (self._fine or self._keep or bootstrap)
        if self._fine:
            self._add_stats("fine_", self.fine_bins)
        if self._keep:
            self.add_state("sample_conf", [], dist_reduce_fx="cat")
            self.add_state("sample_outcome", [], dist_reduce_fx="cat")
            self.add_state("sample_group", [], dist_reduce_fx="cat")
        self.bootstrap = check_int("bootstrap", bootstrap, minimum=0)
        z_of_level(level)
        self.level = float(level)
        self.seed = check_int("seed", seed)
        self._generator: torch.Generator | None = None
        if self.bootstrap:
            cells = self._K * self.n_bins
            for name in ("boot_n", "boot_conf", "boot_acc"):
                self.add_state(
                    name,
                    torch.zeros(self.bootstrap, cells, dtype=torch.float64),
                    dist_reduce_fx="sum",
                )

    _CONFIG = BinnedMetric._CONFIG + (
        "norm",
        "estimator",
        "exact",
        "fine_bins",
        "sigma",
        "bootstrap",
        "level",
    )

    def _cat_dtypes(self) -> dict[str, torch.dtype]:
        if not self._keep:
            return {}
        return {
            "sample_conf": torch.float64,
            "sample_outcome": torch.float64,
            "sample_group": torch.int64,
        }

    def update(self, preds: Tensor, target: Tensor, groups: Tensor | None = None) -> None:
        """Accumulate a batch (shapes as :func:`~torchcal.functional.calibration_error`)."""
        if self._plain and self._update_rows(preds, target, groups):
            return
        prep = self._prepare(preds, target, groups)
        self._update_binned(prep)
        if self._fine:
            self._add_to("fine_", accumulate(prep, self.fine_bins))
        if self._keep:
            s = samples_from(prep)
            self.sample_conf.append(s.conf)
            self.sample_outcome.append(s.outcome)
            self.sample_group.append(s.group)
        if self.bootstrap:
            if self._generator is None:
                rank = (
                    torch.distributed.get_rank()
                    if torch.distributed.is_available() and torch.distributed.is_initialized()
                    else 0
                )
                self._generator = torch.Generator(device=prep.conf.device)
                self._generator.manual_seed(self.seed + 1_000_003 * rank)
            wn, wc, wo = bootstrap_statistics(prep, self.n_bins, self.bootstrap, self._generator)
            self.boot_n.add_(wn)
            self.boot_conf.add_(wc)
            self.boot_acc.add_(wo)

    def _samples(self) -> CalibrationSamples | None:
        if not self._keep:
            return None

        def cat(x: Any) -> Tensor:
            if isinstance(x, Tensor):
                return x
            return torch.cat(x) if len(x) else torch.zeros(0, dtype=torch.float64)

        return CalibrationSamples(
            cat(self.sample_conf), cat(self.sample_outcome), cat(self.sample_group).to(torch.int64)
        )

    def compute(self) -> Tensor | GroupedResult:
        """The calibration error (scalar) or a :class:`~torchcal.GroupedResult`."""
        fine = self._stats("fine_") if self._fine else None

        def fn(s: BinnedStats, f: Any, smp: Any) -> Tensor:
            return estimate(
                self.estimator,
                stats=s,
                fine=f,
                samples=smp,
                n_bins=self.n_bins,
                norm=self.norm,
                reading=self.reading,
                sigma=self.sigma,
            )

        res = self._grouped(fn, fine, self._samples())
        return res if self.num_groups is None else stack_scalars(res)

    def compute_interval(self) -> tuple[Tensor, Tensor]:
        """Percentile bootstrap interval ``(low, high)`` of the pooled L1 equal-width ECE at
        ``level`` (needs ``bootstrap > 0`` and at least 2 samples; replicates that drew no
        sample are dropped; synchronises ranks like ``compute``)."""
        if not self.bootstrap:
            raise ValueError(
                "bootstrap: expected a number of replicates > 0 at construction "
                "to compute a bootstrap interval, got 0"
            )
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=True):
            self._check_seen()
            n = int(self.group_count.sum())
            if n < 2:
                raise ValueError(f"preds: a bootstrap interval needs at least 2 samples, got {n}")
            return ece_bootstrap_from_stats(
                self.boot_n, self.boot_conf, self.boot_acc, level=self.level
            )


class ClasswiseCalibrationError(BinnedMetric):
    """Classwise (one-vs-rest) calibration error (Kull et al. 2019), state ``G x C x B``.

    The per-class errors ``e_k`` are aggregated by the power mean of the norm, as the
    marginal calibration error of Kumar et al. (2019; ``verified_calibration``):
    ``mean_k e_k`` for ``l1``, the root mean square ``sqrt(mean_k e_k^2)`` for ``l2`` (and
    the debiased estimator, whose clipped squares are averaged), ``max_k e_k`` for ``max``.

    Args:
        num_classes: the number of classes ``C``.
        n_bins, norm, input, num_groups, validate_args, ignore_index: as
            :class:`CalibrationError`.
        estimator: ``"binned"`` or ``"debiased"`` (``norm="l2"``).

    Example:
        >>> import torch
        >>> from torchcal.metrics import ClasswiseCalibrationError
        >>> m = ClasswiseCalibrationError(num_classes=3, n_bins=5, input="probs")
        >>> m.update(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]]), torch.tensor([0, 2]))
        >>> round(float(m.compute()), 4)
        0.3667
        >>> [round(v, 4) for v in m.compute_per_class().tolist()]
        [0.2, 0.5, 0.4]
    """

    def __init__(
        self,
        num_classes: int,
        n_bins: int = 15,
        *,
        norm: str = "l1",
        input: str = "logits",
        estimator: str = "binned",
        num_groups: int | None = None,
        validate_args: bool = True,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            n_bins,
            reading="classwise",
            input=input,
            num_classes=num_classes,
            num_groups=num_groups,
            validate_args=validate_args,
            ignore_index=ignore_index,
            **kwargs,
        )
        check_ece_estimator(estimator, norm, "classwise", allowed=("binned", "debiased"))
        self.norm = norm
        self.estimator = estimator

    _CONFIG = BinnedMetric._CONFIG + ("norm", "estimator")

    def update(self, preds: Tensor, target: Tensor, groups: Tensor | None = None) -> None:
        """Accumulate a batch: ``preds`` ``(N, C, *)``, ``target`` ``(N, *)``."""
        self._update_binned(self._prepare(preds, target, groups))

    def _per_class(self, s: BinnedStats) -> Tensor:
        # each class as its own 'confidence' table: (K, B) -> (K, 1, B)
        s1 = s.map(lambda t: t.unsqueeze(-2))
        if self.estimator == "debiased":
            return debiased_calibration_error_from_stats(s1, reading="binary")
        return calibration_error_from_stats(s1, norm=self.norm, reading="binary")

    def compute(self) -> Tensor | GroupedResult:
        """Power mean over classes of the one-vs-rest errors, or a GroupedResult."""
        norm = "l2" if self.estimator == "debiased" else self.norm
        res = self._grouped(lambda s, f, smp: class_mean(self._per_class(s), norm))
        return res if self.num_groups is None else stack_scalars(res)

    def compute_per_class(self) -> Tensor:
        """Pooled one-vs-rest error of each class, ``(C,)`` (synchronises like ``compute``)."""
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=True):
            self._check_seen()
            return self._per_class(self._stats().pooled())


class ReliabilityDiagram(BinnedMetric):
    """Streaming reliability table: ``compute()`` returns a
    :class:`~torchcal.ReliabilityTable` (or a GroupedResult of tables).

    Args:
        n_bins, reading, input, num_classes, num_groups, validate_args, ignore_index: as
            :class:`CalibrationError`.
        interval: ``"wilson"`` (default) or ``"clopper_pearson"`` (needs scipy).
        level: level of the per-bin intervals.

    Example:
        >>> import torch
        >>> from torchcal.metrics import ReliabilityDiagram
        >>> m = ReliabilityDiagram(n_bins=5, reading="binary", input="probs")
        >>> m.update(torch.tensor([0.9, 0.9, 0.1]), torch.tensor([1, 0, 0]))
        >>> t = m.compute()
        >>> t.count.tolist(), [r["bin"] for r in t.rows()]
        ([1, 0, 0, 0, 2], [0, 4])
    """

    higher_is_better = None

    def __init__(
        self,
        n_bins: int = 15,
        *,
        reading: str = "confidence",
        input: str = "logits",
        num_classes: int | None = None,
        num_groups: int | None = None,
        interval: str = "wilson",
        level: float = 0.95,
        validate_args: bool = True,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            n_bins,
            reading=reading,
            input=input,
            num_classes=num_classes,
            num_groups=num_groups,
            validate_args=validate_args,
            ignore_index=ignore_index,
            **kwargs,
        )
        check_option("interval", interval, INTERVALS)
        z_of_level(level)
        self.interval = interval
        self.level = float(level)

    _CONFIG = BinnedMetric._CONFIG + ("interval", "level")

    def update(self, preds: Tensor, target: Tensor, groups: Tensor | None = None) -> None:
        """Accumulate a batch (shapes as :func:`~torchcal.functional.reliability_table`)."""
        if not self._update_rows(preds, target, groups):
            self._update_binned(self._prepare(preds, target, groups))

    def compute(self) -> ReliabilityTable | GroupedResult:
        """The table (pooled), or a GroupedResult with ``per_group`` a list of tables."""
        return self._grouped(
            lambda s, f, smp: reliability_table_from_stats(
                s, interval=self.interval, level=self.level, reading=self.reading
            )
        )

    def plot(self, val: Any = None, ax: Any = None) -> Any:
        """Draw the (pooled) reliability diagram
        (:func:`torchcal.plotting.reliability_diagram`); returns ``(figure, axis)`` like
        torchmetrics' ``plot``."""
        from torchcal.plotting import reliability_diagram

        val = self.compute() if val is None else val
        if isinstance(val, GroupedResult):
            val = val.pooled
        axis = reliability_diagram(val, ax=ax)
        return axis.figure, axis


class BrierDecomposition(BinnedMetric):
    """Streaming Brier score with its exact binned Murphy decomposition.

    ``compute()`` returns a dict of float64 scalars ``brier``, ``reliability``,
    ``resolution``, ``uncertainty``, ``within_bin_variance``, ``within_bin_covariance``
    (see :func:`~torchcal.functional.brier_decomposition`), or a GroupedResult.

    Example:
        >>> import torch
        >>> from torchcal.metrics import BrierDecomposition
        >>> m = BrierDecomposition(n_bins=5, input="probs")
        >>> m.update(torch.tensor([0.9, 0.8, 0.2, 0.1]), torch.tensor([1, 0, 0, 0]))
        >>> round(float(m.compute()["brier"]), 4)
        0.175
    """

    def __init__(
        self,
        n_bins: int = 15,
        *,
        reading: str = "binary",
        input: str = "logits",
        num_classes: int | None = None,
        num_groups: int | None = None,
        validate_args: bool = True,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            n_bins,
            reading=reading,
            input=input,
            num_classes=num_classes,
            num_groups=num_groups,
            validate_args=validate_args,
            ignore_index=ignore_index,
            **kwargs,
        )

    def update(self, preds: Tensor, target: Tensor, groups: Tensor | None = None) -> None:
        """Accumulate a batch (shapes as :func:`~torchcal.functional.brier_decomposition`)."""
        if not self._update_rows(preds, target, groups):
            self._update_binned(self._prepare(preds, target, groups))

    def compute(self) -> dict[str, Tensor] | GroupedResult:
        """The decomposition dict, or a GroupedResult with ``per_group`` a dict of ``(G,)``."""
        self._check_seen()
        stats = self._stats()
        pooled = brier_decomposition_from_stats(stats.pooled(), reading=self.reading)
        if self.num_groups is None:
            return pooled
        per = brier_decomposition_from_stats(stats, reading=self.reading)
        return GroupedResult(pooled, per, self.group_count.cpu())
