"""What :class:`~torchcal.callbacks.CalibrationMonitor` reports for one (stage, dataloader)
at the end of an epoch, composed from the metrics' synced binned statistics by the
functional core's ``*_from_stats`` functions (no formula lives here; see
``docs/design.md`` section 3, "Sufficient statistics"). Lightning-free: the monitor logs and
writes what :func:`compose` returns."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from torchcal.callbacks._sinks import TableRecord
from torchcal.functional.calibration.binning import BinnedStats
from torchcal.functional.calibration.estimators import (
    brier_decomposition_from_stats,
    calibration_error_from_stats,
    debiased_calibration_error_from_stats,
)
from torchcal.functional.calibration.results import ReliabilityTable
from torchcal.functional.calibration.tables import reliability_table_from_stats
from torchcal.metrics._base import MetricStatistics


def brier_name(reading: str) -> str:
    """The key of the reading's Brier score: ``"brier"`` where it is the usual Brier score of
    the full prediction (``binary``: ``(p - y)^2``; ``classwise``: the multiclass
    ``sum_k (p_k - y_k)^2``), ``"brier_confidence"`` where it is the Brier score of the
    top-label confidence against correct-or-not (``confidence``, ``top_label``)."""
    return "brier" if reading in ("binary", "classwise") else "brier_confidence"


def metric_names(reading: str) -> tuple[str, ...]:
    """The scalars logged per stage (and dataloader) for ``reading``, in order."""
    return ("ece", "ece_debiased", "mce", brier_name(reading), "nll")


@dataclass
class EpochReport:
    """One (stage, dataloader) at the end of an epoch.

    Attributes:
        n: samples seen on all ranks.
        values: the scalars of :func:`metric_names` (0-dim tensors), in order.
        records: the pooled table first (tag ``{ns}/reliability{sfx}``), then one per
            non-empty group.
        group_ece: per-group ECE as floats (``None`` for an empty group), or ``None``
            without groups.
        group_values: the per-group ECE tensors to log, by group id.
    """

    n: int
    values: dict[str, Tensor]
    records: list[TableRecord]
    group_ece: list[float | None] | None
    group_values: dict[int, Tensor]


def _scalars(stats: BinnedStats, reading: str) -> dict[str, Tensor]:
    return {
        "ece": calibration_error_from_stats(stats, norm="l1", reading=reading),
        "ece_debiased": debiased_calibration_error_from_stats(stats, reading=reading),
        "mce": calibration_error_from_stats(stats, norm="max", reading=reading),
        brier_name(reading): brier_decomposition_from_stats(stats, reading=reading)["brier"],
    }


def compose(
    synced: MetricStatistics,
    nll: Tensor,
    *,
    reading: str,
    interval: str,
    level: float,
    tag: str,
    num_groups: int | None,
) -> EpochReport:
    """The scalars, tables and per-group ECEs of the all-reduced ``synced`` statistics
    (``(G, K, B)``, from ``ReliabilityDiagram.statistics()``) and the streamed ``nll``.
    ``tag`` is the pooled table's tag, e.g. ``"val/reliability"`` or
    ``"val/reliability/dataloader_idx_1"`` (per-group tags insert ``/group_{g}``)."""
    stats, group_count = synced
    pooled = stats.pooled()
    values = _scalars(pooled, reading)
    values["nll"] = nll

    def table(s: BinnedStats) -> ReliabilityTable:
        return reliability_table_from_stats(s, interval=interval, level=level, reading=reading)

    records = [TableRecord(tag, table(pooled))]
    group_ece: list[float | None] | None = None
    group_values: dict[int, Tensor] = {}
    if num_groups:
        group_ece = []
        base, _, sfx = tag.partition("/reliability")
        for g in range(num_groups):
            if int(group_count[g]) == 0:
                group_ece.append(None)
                continue
            gs = stats.group(g)
            ge = calibration_error_from_stats(gs, norm="l1", reading=reading)
            group_ece.append(float(ge))
            group_values[g] = ge
            records.append(TableRecord(f"{base}/reliability/group_{g}{sfx}", table(gs), group=g))
    return EpochReport(int(group_count.sum()), values, records, group_ece, group_values)
