"""Small duck-typed writers that send a reliability table (and its figure) to the loggers
attached to a Lightning ``Trainer``, plus the long-format CSV file. The figures themselves
are drawn in :mod:`torchcal.plotting`.

Loggers are recognised by class name, so neither ``wandb`` nor ``mlflow`` has to be installed
(and test doubles with the same class name and methods work):

* ``TensorBoardLogger``: ``experiment.add_text(tag, markdown, step)`` and
  ``experiment.add_image(tag, rgb, step, dataformats="HWC")``;
* ``WandbLogger``: its own ``log_table(key, columns, data, step)`` and
  ``log_image(key, images, step)``;
* ``MLFlowLogger``: ``experiment.log_table(run_id, data, artifact_file)`` and
  ``experiment.log_figure(run_id, figure, artifact_file)`` (the ``MlflowClient`` API);
* ``CSVLogger``: nothing besides the CSV file, which is written into its ``log_dir``.

Any other logger gets one warning per class and is otherwise left alone; a logger that raises
while writing gets one warning (per message, through Lightning's ``WarningCache``) and the
training goes on.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.utilities.rank_zero import WarningCache

from torchcal.functional.calibration.results import CSV_COLUMNS, ReliabilityTable
from torchcal.plotting import figure_rgb

#: Columns of ``reliability.csv`` (long format, one line per non-empty bin and epoch).
EPOCH_CSV_COLUMNS = ("epoch", "step") + CSV_COLUMNS
#: Loggers that take images (the reliability diagram is drawn only when one is attached).
IMAGE_LOGGERS = ("TensorBoardLogger", "WandbLogger", "MLFlowLogger")


@dataclass(frozen=True)
class TableRecord:
    """One table to emit: ``tag`` (e.g. ``"val/reliability"``), ``table`` and the group id
    (``None`` for the pooled table)."""

    tag: str
    table: ReliabilityTable
    group: int | None = None


def log_dir_of(trainer: Any) -> str:
    """Directory for the CSV/PNG files: the first ``CSVLogger``'s ``log_dir``, else the
    directory ``trainer.log_dir`` names (the first logger's ``log_dir`` for TensorBoard/CSV,
    its ``save_dir`` otherwise), else ``default_root_dir``.

    ``trainer.log_dir`` itself is not read: it broadcasts from rank 0 (a collective), and the
    files are written on rank 0 alone, so under DDP it would wait forever for the others."""
    loggers = list(getattr(trainer, "loggers", None) or [])
    for lg in loggers:
        if type(lg).__name__ == "CSVLogger" and getattr(lg, "log_dir", None):
            return str(lg.log_dir)
    if loggers:
        first = loggers[0]
        attr = (
            "log_dir"
            if type(first).__name__ in ("TensorBoardLogger", "CSVLogger")
            else ("save_dir")
        )
        path = getattr(first, attr, None)
        if path:
            return str(path)
    return str(trainer.default_root_dir)


def write_csv(path: str, records: Sequence[TableRecord], *, epoch: int, step: int) -> None:
    """Append the non-empty bins of every record to ``path`` (header when the file is new).

    Columns: ``epoch, step, [group,] bin, lo, hi, count, conf, acc, gap, ci_low, ci_high``
    (``group`` only for per-group records)."""
    grouped = any(r.group is not None for r in records)
    cols = (("epoch", "step", "group") + CSV_COLUMNS) if grouped else EPOCH_CSV_COLUMNS
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        if new:
            w.writerow(cols)
        for rec in records:
            lead = [str(epoch), str(step)] + ([str(rec.group)] if grouped else [])
            for cells in rec.table.csv_rows():
                w.writerow(lead + cells)


def _safe(cache: WarningCache, logger: Any, what: str, fn: Callable[[], Any]) -> None:
    """Run ``fn()``; a failing logger gets a warning and never stops the training."""
    try:
        fn()
    except Exception as e:
        cache.warn(
            f"CalibrationMonitor: {type(logger).__name__} failed to log the {what} "
            f"({type(e).__name__}: {e}); continuing without it"
        )


def _artifact(tag: str, epoch: int, step: int, ext: str) -> str:
    return f"calibration/{tag.replace('/', '_')}_epoch={epoch}_step={step}.{ext}"


def _send_table(cache: WarningCache, lg: Any, r: TableRecord, *, epoch: int, step: int) -> None:
    """One table to one logger, in the form its API takes."""
    name = type(lg).__name__
    if name == "TensorBoardLogger":
        _safe(
            cache, lg, "table", lambda: lg.experiment.add_text(r.tag, r.table.to_markdown(), step)
        )
    elif name == "WandbLogger":
        data = [[row[c] for c in CSV_COLUMNS] for row in r.table.rows()]
        _safe(
            cache,
            lg,
            "table",
            lambda: lg.log_table(key=r.tag, columns=list(CSV_COLUMNS), data=data, step=step),
        )
    elif name == "MLFlowLogger":
        rows = r.table.rows()
        cols = {c: [row[c] for row in rows] for c in CSV_COLUMNS}
        _safe(
            cache,
            lg,
            "table",
            lambda: lg.experiment.log_table(
                lg.run_id, data=cols, artifact_file=_artifact(r.tag, epoch, step, "json")
            ),
        )


def send_tables(
    loggers: Sequence[Any],
    records: Sequence[TableRecord],
    *,
    epoch: int,
    step: int,
    fig_tag: str | None,
    fig: Any,
    cache: WarningCache,
) -> None:
    """Write each record (and the pooled figure ``fig`` under ``fig_tag``) to every logger."""
    for lg in loggers:
        name = type(lg).__name__
        if name not in IMAGE_LOGGERS and name != "CSVLogger":
            cache.warn(
                f"CalibrationMonitor: no adapter for logger {name}; the scalars still "
                f"reach it through pl_module.log and the tables go to the CSV file only"
            )
        for r in records:
            _send_table(cache, lg, r, epoch=epoch, step=step)
    if fig is not None and fig_tag is not None:
        send_figure(
            loggers,
            fig_tag,
            fig,
            step=step,
            cache=cache,
            artifact_file=_artifact(fig_tag, epoch, step, "png"),
        )


def send_figure(
    loggers: Sequence[Any],
    tag: str,
    fig: Any,
    *,
    step: int,
    cache: WarningCache,
    artifact_file: str | None = None,
) -> None:
    """Send one figure to every logger that takes images (TensorBoard, W&B, MLflow); it is
    rendered to an RGB array once, for the loggers that take arrays."""
    rgb: list[Any] = []

    def image() -> Any:
        if not rgb:
            rgb.append(figure_rgb(fig))
        return rgb[0]

    artifact = artifact_file or f"calibration/{tag.replace('/', '_')}.png"
    for lg in loggers:
        name = type(lg).__name__
        if name == "TensorBoardLogger":
            _safe(
                cache,
                lg,
                "figure",
                lambda lg=lg: lg.experiment.add_image(tag, image(), step, dataformats="HWC"),
            )
        elif name == "WandbLogger":
            _safe(
                cache,
                lg,
                "figure",
                lambda lg=lg: lg.log_image(key=tag, images=[image()], step=step),
            )
        elif name == "MLFlowLogger":
            _safe(
                cache,
                lg,
                "figure",
                lambda lg=lg: lg.experiment.log_figure(lg.run_id, fig, artifact_file=artifact),
            )
