"""The Lightning-free parts of :class:`~torchcal.callbacks.RegressionMonitor`: what a forecast
family needs from the step's outputs, the central intervals it implies, the per-(stage,
dataloader) accumulator over the regression metrics (pooled, and per group with
``num_groups``), the PIT and coverage tables (text, markdown, CSV rows; per group with a
leading ``group`` column) and their writers for the loggers.

No score or calibration formula lives here: the PIT values come from
:mod:`torchcal.functional` (``pit_normal``, ``pit_ensemble``, ...), the sums from the
:mod:`torchcal.metrics` Metrics (``PITHistogram``, ``IntervalCoverage``, ``CRPS``,
``GaussianNLL``); this module only reads, routes and formats."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import WarningCache
from torch import Tensor
from torchmetrics import Metric

from torchcal import functional as F
from torchcal.functional.calibration.results import GroupedResult
from torchcal.metrics._base import PooledPlotMetric
from torchcal.metrics.regression import IntervalCoverage, PITHistogram
from torchcal.metrics.regression_scores import CRPS, GaussianNLL

#: Families read as ``{"loc", "scale", "target"}`` (the closed forms the CRPS supports).
CLOSED_FORMS = ("normal", "laplace", "logistic")
#: Every ``family=`` of the monitor.
FAMILIES = CLOSED_FORMS + ("quantiles", "ensemble")
#: The keys of the step's output dict, per family (also the order of an ``extract_fn`` tuple).
OUTPUT_KEYS = {
    **{f: ("loc", "scale", "target") for f in CLOSED_FORMS},
    "quantiles": ("quantiles", "levels", "target"),
    "ensemble": ("samples", "target"),
}
_PIT = {"normal": "pit_normal", "laplace": "pit_laplace", "logistic": "pit_logistic"}
#: Quantile levels of a step's output match a needed interval end within this tolerance (or
#: two ulps of 1 in the levels' dtype, so float32 levels such as 0.05 match).
LEVEL_TOL = 1e-9
#: The columns of a coverage table after ``level``.
COVERAGE_COLUMNS = ("coverage", "stderr", "width", "interval_score")


def level_key(level: float) -> str:
    """The key suffix of a nominal coverage: ``0.9 -> "90"``, ``0.975 -> "97_5"``."""
    return f"{100.0 * float(level):.10g}".replace(".", "_")


def metric_names(family: str, levels: Sequence[float]) -> tuple[str, ...]:
    """The scalars logged per stage (and dataloader), in order: the proper score (``crps``;
    ``quantile_score`` for quantile sets), ``nll`` (normal only), ``pit_ece``, then
    ``coverage_{p}`` and ``width_{p}`` per level."""
    names = ["quantile_score" if family == "quantiles" else "crps"]
    names += ["nll"] if family == "normal" else []
    names.append("pit_ece")
    for lv in levels:
        names += [f"coverage_{level_key(lv)}", f"width_{level_key(lv)}"]
    return tuple(names)


def group_metric_names(levels: Sequence[float]) -> tuple[str, ...]:
    """The scalars logged per group (``{stage}/group_{g}/{name}``): ``pit_ece``, then
    ``coverage_{p}`` and ``width_{p}`` per level."""
    return metric_names("", levels)[1:]


def quantile_columns(
    out_levels: Tensor, levels: Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """Column indices of the ``(1 - l) / 2`` and ``(1 + l) / 2`` quantiles of every nominal
    level in a step's quantile ``levels`` (given in ``dtype``); ``ValueError`` naming
    ``levels`` if one is absent."""
    have = out_levels.detach().to("cpu", torch.float64)
    tol = max(LEVEL_TOL, 2.0 * torch.finfo(dtype).eps)
    cols = []
    for end in torch.cat([(1.0 - levels) / 2.0, (1.0 + levels) / 2.0]).tolist():
        hit = torch.nonzero((have - end).abs() <= tol)
        if hit.numel() == 0:
            raise ValueError(
                f"levels: the central intervals of RegressionMonitor(levels=...) need the "
                f"quantile at level {end:.10g}, but the step's quantile levels are "
                f"{[round(v, 10) for v in have.tolist()]}; return those levels or choose "
                f"monitor levels whose interval ends are among them"
            )
        cols.append(int(hit[0, 0]))
    idx = torch.tensor(cols, device=out_levels.device)
    return idx[: levels.numel()], idx[levels.numel() :]


class PinballMean(PooledPlotMetric):
    """The mean of per-item scores computed elsewhere (float64 sum, int64 count): the
    quantile score of a quantile set, which has no Metric of its own. (torchmetrics'
    ``MeanMetric`` is not used: after ``.to(device)`` it sums in float32 again.)"""

    full_state_update = False
    higher_is_better = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, values: Tensor) -> None:
        self.total += values.sum(dtype=torch.float64).to(self.total.device)
        self.count += values.numel()

    def compute(self) -> Tensor:
        return self.total / self.count


class Accumulator:
    """The metrics of one (stage, dataloader): PIT histogram, interval coverage (both per
    group too with ``num_groups``), the proper score, the Gaussian NLL (normal only). Inputs
    are read in float64."""

    def __init__(
        self,
        family: str,
        levels: Tensor,
        n_bins: int,
        generator: torch.Generator | None,
        num_groups: int | None = None,
    ) -> None:
        self.family = family
        self.levels = levels.to(torch.float64)
        self.pit = PITHistogram(n_bins, num_groups=num_groups)
        # closed forms: the metric builds the central intervals itself, in one pass for all levels
        self.coverage = IntervalCoverage(
            levels=tuple(self.levels.tolist()),
            family=family if family in CLOSED_FORMS else "bounds",
            num_groups=num_groups,
        )
        if family == "quantiles":  # mean pinball loss over the step's levels
            self.score: Metric = PinballMean()
        else:
            self.score = CRPS(family=family)
        self.nll = GaussianNLL() if family == "normal" else None
        self.generator = generator
        self.groups: Tensor | None = None  # the current batch's flat group ids
        self.quantile_levels: Tensor | None = None
        self.columns: tuple[Tensor, Tensor] | None = None
        self.n = 0  # samples on this rank

    def metrics(self) -> list[Metric]:
        return [m for m in (self.pit, self.coverage, self.score, self.nll) if m is not None]

    def to(self, device: torch.device) -> Accumulator:
        for m in self.metrics():
            m.to(device)
        return self

    def update(self, values: Sequence[Tensor], groups: Tensor | None = None) -> None:
        """One batch: ``values`` in the order of :data:`OUTPUT_KEYS` for the family and, with
        ``num_groups``, the group ids (the target's shape, checked by :func:`~torchcal.functional._validation.check_group_ids`)."""
        self.groups = None if groups is None else groups.reshape(-1)
        if self.family in CLOSED_FORMS:
            self._closed_form(*values)
        elif self.family == "quantiles":
            self._quantiles(*values)
        else:
            self._ensemble(*values)

    def _closed_form(self, loc: Tensor, scale: Tensor, target: Tensor) -> None:
        loc, scale, target = (x.to(torch.float64) for x in (loc, scale, target))
        pit = getattr(F, _PIT[self.family])(loc, scale, target)  # validates the forecast
        loc, scale = (torch.broadcast_to(x, target.shape).reshape(-1) for x in (loc, scale))
        self._intervals(pit, loc, scale, target)
        self.score.update(loc, scale, target.reshape(-1))
        if self.nll is not None:
            self.nll.update(loc, scale, target.reshape(-1))

    def _quantiles(self, quantiles: Tensor, levels: Tensor, target: Tensor) -> None:
        dtype = levels.dtype  # its resolution decides which levels match an interval end
        quantiles, levels, target = (x.to(torch.float64) for x in (quantiles, levels, target))
        pit = F.pit_quantiles(quantiles, levels, target)  # validates levels and quantiles
        if self.quantile_levels is None:
            self.quantile_levels = levels.detach().clone()
            self.columns = quantile_columns(levels, self.levels, dtype)
        elif levels.shape != self.quantile_levels.shape or not torch.equal(
            levels.detach(), self.quantile_levels
        ):
            raise ValueError(
                f"levels: expected the same quantile levels in every batch, got "
                f"{levels.tolist()} after {self.quantile_levels.tolist()}"
            )
        lo, hi = self.columns
        q = quantiles.reshape(-1, quantiles.shape[-1])
        self._intervals(pit, q[:, lo], q[:, hi], target)
        self.score.update(F.quantile_score(quantiles, target, levels, reduction="none"))

    def _ensemble(self, samples: Tensor, target: Tensor) -> None:
        samples, target = samples.to(torch.float64), target.to(torch.float64)
        pit = F.pit_ensemble(samples, target, generator=self.generator)  # validates
        ends = torch.cat([(1.0 - self.levels) / 2.0, (1.0 + self.levels) / 2.0])
        x = samples.reshape(-1, samples.shape[-1])
        q = torch.quantile(x, ends.to(x.device), dim=-1).T  # (N, 2L), linear interpolation
        k = self.levels.numel()
        self._intervals(pit, q[:, :k], q[:, k:], target)
        self.score.update(samples, target)

    def _intervals(self, pit: Tensor, first: Tensor, second: Tensor, target: Tensor) -> None:
        """PIT and coverage of one batch: ``first, second`` are the bounds ``(N, L)``, or
        ``loc, scale`` ``(N,)`` for a closed form (the coverage metric's ``forecast``)."""
        self.pit.update(pit.reshape(-1), self.groups)
        self.coverage.update(first, second, target.reshape(-1), self.groups)
        self.n += target.numel()

    def compute(self) -> dict[str, Any]:
        """Every metric's ``compute()`` (collectives: call on every rank): the pooled
        ``pit`` and ``coverage`` dicts, ``score``, ``nll`` and ``groups`` (``None``, or the
        per-group ``pit`` and ``coverage`` dicts and the counts ``n``)."""
        pit, cov = self.pit.compute(), self.coverage.compute()
        out: dict[str, Any] = {"groups": None}
        if isinstance(pit, GroupedResult) and isinstance(cov, GroupedResult):
            out["groups"] = {"pit": pit.per_group, "coverage": cov.per_group, "n": cov.counts}
            pit, cov = pit.pooled, cov.pooled
        out.update(pit=pit, coverage=cov, score=self.score.compute())
        out["nll"] = None if self.nll is None else self.nll.compute()
        return out


# ------------------------------------------------------------------ tables
def pit_rows(counts: Tensor) -> list[dict[str, Any]]:
    """One row per PIT bin: ``bin, lo, hi, count, share, density`` (``share * B``; 1 = flat)."""
    c = counts.reshape(-1).to("cpu", torch.int64)
    b, n = c.numel(), int(c.sum())
    rows = []
    for i, k in enumerate(c.tolist()):
        share = k / n if n else math.nan
        rows.append(
            {
                "bin": i,
                "lo": i / b,
                "hi": (i + 1) / b,
                "count": k,
                "share": share,
                "density": share * b,
            }
        )
    return rows


def coverage_rows(levels: Tensor, cov: dict[str, Tensor]) -> list[dict[str, Any]]:
    """One row per nominal level: ``level, coverage, stderr, width, interval_score``."""
    vals = {c: cov[c].reshape(-1).tolist() for c in COVERAGE_COLUMNS}
    return [
        {"level": float(lv), **{c: vals[c][i] for c in COVERAGE_COLUMNS}}
        for i, lv in enumerate(levels.tolist())
    ]


def group_values(levels: Tensor, groups: dict[str, Any]) -> dict[int, dict[str, Tensor]]:
    """Per non-empty group ``g``: the scalars of :func:`group_metric_names` (float64 0-dim
    tensors) from the per-group results of :meth:`Accumulator.compute`."""
    n = groups["n"].reshape(-1)
    ece = groups["pit"]["pit_ece"].reshape(-1)
    cov = {c: groups["coverage"][c].reshape(n.numel(), -1) for c in ("coverage", "width")}
    out = {}
    for g in torch.nonzero(n > 0).reshape(-1).tolist():
        vals = {"pit_ece": ece[g]}
        for i, lv in enumerate(levels.tolist()):
            vals[f"coverage_{level_key(lv)}"] = cov["coverage"][g, i]
            vals[f"width_{level_key(lv)}"] = cov["width"][g, i]
        out[g] = vals
    return out


def group_rows(
    levels: Tensor, groups: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The PIT and coverage tables of every non-empty group, stacked with a leading ``group``
    column (the coverage rows also carry the group's ``n``)."""
    n = groups["n"].reshape(-1)
    counts = groups["pit"]["counts"].reshape(n.numel(), -1)
    cov = {c: groups["coverage"][c].reshape(n.numel(), -1) for c in COVERAGE_COLUMNS}
    pit, coverage = [], []
    for g in torch.nonzero(n > 0).reshape(-1).tolist():
        pit += [{"group": g, **r} for r in pit_rows(counts[g])]
        rows = coverage_rows(levels, {c: v[g] for c, v in cov.items()})
        coverage += [{"group": g, "n": int(n[g]), **r} for r in rows]
    return pit, coverage


def _fmt(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def rows_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of ``rows`` (their keys are the columns)."""
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def rows_text(rows: Sequence[dict[str, Any]], *, bar: str | None = None) -> str:
    """A fixed-width text table of ``rows``; with ``bar`` (a column holding a density, 1 =
    flat) a ``#`` bar of 10 characters per unit of density."""
    cols = list(rows[0])
    cells = [[_fmt(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    for r, x in zip(rows, cells):
        line = "  ".join(v.rjust(w) for v, w in zip(x, widths))
        if bar is not None and math.isfinite(r[bar]):
            line += "  " + "#" * min(round(10 * r[bar]), 60)
        lines.append(line)
    return "\n".join(lines)


def write_rows(path: str, rows: Sequence[dict[str, Any]], *, epoch: int, step: int) -> None:
    """Append ``rows`` to the CSV file ``path`` with leading ``epoch, step`` columns (a header
    when the file is new)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        if new:
            w.writerow(["epoch", "step", *rows[0]])
        for r in rows:
            w.writerow([epoch, step, *(repr(v) if isinstance(v, float) else v for v in r.values())])


def _safe(cache: WarningCache, logger: Any, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as e:
        cache.warn(
            f"RegressionMonitor: {type(logger).__name__} failed to log a table "
            f"({type(e).__name__}: {e}); continuing without it"
        )


def send_text_table(
    loggers: Sequence[Any],
    tag: str,
    rows: Sequence[dict[str, Any]],
    *,
    step: int,
    artifact: str,
    cache: WarningCache,
) -> None:
    """``rows`` to every logger: TensorBoard (markdown text), W&B (a table), MLflow (a JSON
    table artifact); others get one warning per class (the CSV file still has the rows)."""
    cols = list(rows[0])
    for lg in loggers:
        name = type(lg).__name__
        if name == "TensorBoardLogger":
            _safe(cache, lg, lambda lg=lg: lg.experiment.add_text(tag, rows_markdown(rows), step))
        elif name == "WandbLogger":
            data = [[r[c] for c in cols] for r in rows]
            _safe(
                cache,
                lg,
                lambda lg=lg, data=data: lg.log_table(key=tag, columns=cols, data=data, step=step),
            )
        elif name == "MLFlowLogger":
            data = {c: [r[c] for r in rows] for c in cols}
            _safe(
                cache,
                lg,
                lambda lg=lg, data=data: lg.experiment.log_table(
                    lg.run_id, data=data, artifact_file=artifact
                ),
            )
        elif name != "CSVLogger":
            cache.warn(
                f"RegressionMonitor: no adapter for logger {name}; the scalars still reach it "
                f"through pl_module.log and the tables go to the CSV files only"
            )
