"""Small duck-typed writers that send a reliability table (and its figure) to the loggers
attached to a Lightning ``Trainer``, plus the long-format CSV file.

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
while writing gets one warning and the training goes on.
"""

from __future__ import annotations

import csv
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torchcal.report import CSV_COLUMNS, ReliabilityTable

__all__ = ["TableRecord", "figure_rgb", "history_figure", "log_dir_of", "send_figure",
           "send_tables", "write_csv"]

#: Columns of ``reliability.csv`` (long format, one line per non-empty bin and epoch).
EPOCH_CSV_COLUMNS = ("epoch", "step") + CSV_COLUMNS
_KNOWN = ("TensorBoardLogger", "WandbLogger", "MLFlowLogger", "CSVLogger")


@dataclass(frozen=True)
class TableRecord:
    """One table to emit: ``tag`` (e.g. ``"val/reliability"``), ``table`` and the group id
    (``None`` for the pooled table)."""

    tag: str
    table: ReliabilityTable
    group: int | None = None


class WarnOnce:
    """Warn once per key (a logger class, a missing optional package, ...)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, key: str, message: str) -> None:
        if key not in self._seen:
            self._seen.add(key)
            warnings.warn(message, UserWarning, stacklevel=3)


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
        attr = "log_dir" if type(first).__name__ in ("TensorBoardLogger", "CSVLogger") else (
            "save_dir")
        path = getattr(first, attr, None)
        if path:
            return str(path)
    return str(trainer.default_root_dir)


def _fmt(v: Any) -> str:
    return repr(v) if isinstance(v, float) else str(v)


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
            lead = [epoch, step] + ([rec.group] if grouped else [])
            for row in rec.table.rows():
                w.writerow([_fmt(v) for v in lead + [row[c] for c in CSV_COLUMNS]])


def figure_rgb(fig: Any) -> Any:
    """Render a matplotlib ``Figure`` to an ``(H, W, 3)`` uint8 numpy array (Agg canvas,
    no pyplot state touched)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def table_figure(table: ReliabilityTable) -> Any:
    """The reliability diagram of ``table`` on a fresh pyplot-free ``Figure``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.5, 4.0), dpi=80)
    table.plot(ax=fig.add_subplot(1, 1, 1))
    # fixed margins (room for the count axis on the right): tight_layout() would double the
    # cost of the figure, drawn every validation epoch
    fig.subplots_adjust(left=0.15, right=0.83, bottom=0.13, top=0.9)
    return fig


def history_figure(history: Sequence[dict[str, Any]], title: str, *,
                   brier_key: str = "brier_confidence") -> Any:
    """"Calibration over epochs": ECE / debiased ECE / MCE, the Brier score and the NLL (one
    panel each: their scales differ) against the epoch, one point per validation run in
    ``history``. When an epoch holds several runs (``val_check_interval < 1``, a
    ``validate()`` before ``fit``), the x axis is the global step instead."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    epochs = [h["epoch"] for h in history]
    by_step = len(set(epochs)) < len(epochs)
    x, xlabel = ([h["step"] for h in history], "global step") if by_step else (epochs, "epoch")
    fig = Figure(figsize=(10.5, 3.4), dpi=90)
    panels = ((("ece", "ece_debiased", "mce"), "calibration error"),
              ((brier_key,), brier_key.replace("_", " ")), (("nll",), "NLL (nats)"))
    for i, (keys, ylabel) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        for k in keys:
            ax.plot(x, [h[k] for h in history], marker="o", label=k)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _safe(warn: WarnOnce, logger: Any, what: str, fn: Callable[[], Any]) -> None:
    """Run ``fn()``; a failing logger gets one warning and never stops the training."""
    try:
        fn()
    except Exception as e:
        name = type(logger).__name__
        warn(f"{name}:{what}", f"CalibrationMonitor: {name} failed to log the {what} "
                               f"({type(e).__name__}: {e}); continuing without it")


def _artifact(tag: str, epoch: int, step: int, ext: str) -> str:
    return f"calibration/{tag.replace('/', '_')}_epoch={epoch}_step={step}.{ext}"


def send_tables(loggers: Sequence[Any], records: Sequence[TableRecord], *, epoch: int,
                step: int, fig_tag: str | None, fig: Any, warn: WarnOnce) -> None:
    """Write each record (and the pooled figure ``fig`` under ``fig_tag``) to every logger."""
    for lg in loggers:
        name = type(lg).__name__
        if name == "TensorBoardLogger":
            for r in records:
                _safe(warn, lg, "table", lambda lg=lg, r=r: lg.experiment.add_text(
                    r.tag, r.table.to_markdown(), step))
        elif name == "WandbLogger":
            for r in records:
                data = [[row[c] for c in CSV_COLUMNS] for row in r.table.rows()]
                _safe(warn, lg, "table", lambda lg=lg, r=r, data=data: lg.log_table(
                    key=r.tag, columns=list(CSV_COLUMNS), data=data, step=step))
        elif name == "MLFlowLogger":
            for r in records:
                rows = r.table.rows()
                data = {c: [row[c] for row in rows] for c in CSV_COLUMNS}
                _safe(warn, lg, "table", lambda lg=lg, r=r, data=data: lg.experiment.log_table(
                    lg.run_id, data=data, artifact_file=_artifact(r.tag, epoch, step, "json")))
        elif name != "CSVLogger":
            warn(f"logger:{name}", f"CalibrationMonitor: no adapter for logger {name}; the "
                                   f"scalars still reach it through pl_module.log and the "
                                   f"tables go to the CSV file only")
    if fig is not None and fig_tag is not None:
        send_figure(loggers, fig_tag, fig, step=step, warn=warn,
                    artifact_file=_artifact(fig_tag, epoch, step, "png"))


def send_figure(loggers: Sequence[Any], tag: str, fig: Any, *, step: int, warn: WarnOnce,
                artifact_file: str | None = None) -> None:
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
            _safe(warn, lg, "figure", lambda lg=lg: lg.experiment.add_image(
                tag, image(), step, dataformats="HWC"))
        elif name == "WandbLogger":
            _safe(warn, lg, "figure", lambda lg=lg: lg.log_image(key=tag, images=[image()],
                                                                 step=step))
        elif name == "MLFlowLogger":
            _safe(warn, lg, "figure", lambda lg=lg: lg.experiment.log_figure(
                lg.run_id, fig, artifact_file=artifact))
