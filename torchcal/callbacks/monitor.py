"""``CalibrationMonitor``: calibration metrics and reliability tables, epoch by epoch, in the
loggers a Lightning user already has.

Three short steps per (stage, dataloader) at the end of an epoch: compose (the metrics' synced
statistics -> scalars and tables, :mod:`torchcal.callbacks._compose`), log
(``pl_module.log``), write (CSV files, loggers and the text table on rank 0,
:mod:`torchcal.callbacks._sinks`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import WarningCache, rank_zero_info
from torch import Tensor
from typing_extensions import override

from torchcal.callbacks import _sinks
from torchcal.callbacks._compose import EpochReport, brier_name, compose, metric_names
from torchcal.callbacks._history import StageMonitor
from torchcal.callbacks._monitor_options import Sink, check_reading_options, check_sinks
from torchcal.callbacks._outputs import check_extract_fn, check_key, read_outputs
from torchcal.functional._checks import check_bool, check_int
from torchcal.metrics.calibration import ReliabilityDiagram
from torchcal.metrics.nll import NegativeLogLikelihood
from torchcal.metrics.selective import RiskCoverageCurve
from torchcal.plotting import history_figure, table_figure

__all__ = [
    "CalibrationMonitor",
]

#: Scalars logged per stage (and dataloader), in this order, for the default reading
#: (``confidence``); see :func:`~torchcal.callbacks._compose.metric_names` for the others.
METRICS = metric_names("confidence")


class CalibrationMonitor(StageMonitor):
    """Track calibration epoch by epoch from the outputs of ``validation_step``/``test_step``.

    The monitor never runs a forward pass of its own: it reads the predictions the step
    returns (default ``{"logits": (B, C) or (B,), "target": (B,)}``), accumulates the binned
    sufficient statistics of :class:`torchcal.metrics.ReliabilityDiagram` (O(bins) state,
    float64 sums, one all-reduce under DDP) and a streaming
    :class:`torchcal.metrics.NegativeLogLikelihood`, and at the end of each validation/test
    epoch (not the sanity check):

    * logs ``{stage}/ece``, ``{stage}/ece_debiased``, ``{stage}/mce``, the Brier score
      (``{stage}/brier_confidence`` for the ``confidence`` and ``top_label`` readings,
      ``{stage}/brier`` for ``binary`` and ``classwise``, see below) and ``{stage}/nll``
      with ``pl_module.log(..., sync_dist=True)`` (``stage`` is ``val`` or ``test``), so
      ``ModelCheckpoint(monitor="val/nll")`` and ``EarlyStopping`` can use them. With several
      dataloaders, the one chosen by ``dataloader_idx`` (default 0) keeps these plain names
      (so the same ``monitor`` key works with one loader or several) and the others' names
      end in ``/dataloader_idx_{i}``. The values come from the already all-reduced
      statistics, so the ``sync_dist`` mean averages equal numbers. For model selection use
      a proper score (``nll``, the Brier score): ECE alone is no criterion (a constant
      forecast of the base rate has ECE 0);
    * writes the reliability table to every attached logger: TensorBoard (markdown text and
      the diagram as an image), W&B (table and image), MLflow (table and figure), and
      appends it in long format (``epoch, step, bin, lo, hi, count, conf, acc, gap, ci_low,
      ci_high``; empty bins omitted) to ``reliability.csv`` in the CSVLogger's ``log_dir``
      (else ``trainer.log_dir``). Test tables go to ``test_reliability.csv``, the other
      dataloaders' to ``..._dataloader_idx_{i}.csv``, per-group tables to
      ``reliability_groups.csv`` (an extra ``group`` column). Unknown loggers get one
      warning;
    * records the scalars in :attr:`history` (kept in the checkpoint, so a resumed run keeps
      it) and, at the end of ``fit``, draws a "calibration over epochs" figure
      (``calibration_over_epochs.png`` in the same directory, and to the image loggers).

    Definitions (one place: :mod:`torchcal.functional.calibration`, from the same binned
    statistics): ``ece`` is the equal-width L1 ECE of the chosen ``reading`` (Naeini et al.
    2015; Guo et al. 2017), ``ece_debiased`` the debiased L2 ECE of Kumar, Liang & Ma (2019),
    ``mce`` the maximum bin gap; the Brier score is that of the reading's (confidence,
    outcome) pairs, and its key says which it is: ``brier`` is the usual Brier score of the
    full prediction (``binary``: ``mean (p - y)^2``; ``classwise``: the multiclass
    ``mean_i sum_k (p_ik - y_ik)^2``, as :func:`torchcal.functional.brier_score`),
    ``brier_confidence`` the Brier score of the top-label confidence against correct-or-not
    (``confidence``, ``top_label``), which is not the multiclass Brier score. ``nll`` is the
    mean negative log-likelihood of the full prediction (cross-entropy for multiclass,
    binary log loss for binary).

    Every batch is read and checked from the first one on, the sanity check's included
    (nothing is accumulated there), so a wrong ``validation_step`` fails before training.

    ``-inf`` entries in multiclass ``input="logits"`` are masks (probability 0, as in a
    softmax; ``nll`` is ``inf`` if a true class is masked); NaN, ``+inf``, a row of only
    ``-inf`` and non-finite binary logits raise.

    Args:
        n_bins: number of equal-width bins.
        reading: ``"confidence"`` (default), ``"binary"``, ``"top_label"`` or
            ``"classwise"`` (see :mod:`torchcal.metrics`).
        input: whether the step returns ``"logits"`` (default) or ``"probs"``.
        preds_key: key of the predictions in the step's output dict (default: the value of
            ``input``, i.e. ``"logits"`` or ``"probs"``).
        target_key: key of the targets (class indices ``(B,)`` or binary labels).
        group_key: key of a per-sample group id; used when ``num_groups`` is set.
        num_classes: required for ``top_label``/``classwise``.
        num_groups: number of groups; then every batch must carry ``group_key`` and a table
            per group is written (plus ``{stage}/group_{g}/ece``).
        extract_fn: ``fn(pl_module, batch, outputs)`` returning ``(preds, target)``,
            ``(preds, target, groups)`` or a dict with the keys above; replaces the dict
            lookup (e.g. to read the target from the batch).
        interval: per-bin interval, ``"wilson"`` or ``"clopper_pearson"``.
        level: level of the per-bin intervals.
        name: optional sub-namespace, e.g. ``name="top"`` logs ``val/top/ece`` (to run
            several monitors side by side).
        sinks: where the tables and figures go besides ``pl_module.log``, any of
            ``"loggers"`` (tables, and the diagrams with ``"figures"``, to the attached
            loggers), ``"figures"`` (draw the reliability diagram each epoch and the history
            figure at fit end; needs matplotlib, skipped with one warning without it),
            ``"csv"`` (append the tables to the CSV files) and ``"prog_bar"`` (also show
            ``ece`` in the progress bar). Default: loggers, figures and CSV.
        verbose: log the scalars and the table each epoch (``rank_zero_info``: the
            ``lightning.pytorch`` logger, rank 0).
        validate_args: run the value checks (NaN/Inf, label range) on each batch.
        dataloader_idx: with several validation (or test) dataloaders, the one whose metrics
            get the plain names (``val/nll``); the others get ``/dataloader_idx_{i}``.
        selective_bins: also log ``aurc`` and ``augrc`` (tie-averaged, from a
            :class:`~torchcal.metrics.RiskCoverageCurve` of this many bins, within its
            ``bound()`` of the exact values); ``reading="confidence"`` only. ``None``: off.

    Example:
        >>> import torch, lightning as L
        >>> from torchcal.callbacks import CalibrationMonitor
        >>> class Model(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(4, 3)
        ...     def validation_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return {"logits": self.net(x), "target": y}
        >>> data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
        >>> trainer = L.Trainer(callbacks=[CalibrationMonitor(n_bins=10, sinks=())],
        ...                     logger=False, enable_progress_bar=False,
        ...                     enable_model_summary=False, enable_checkpointing=False)
        >>> out = trainer.validate(Model(), torch.utils.data.DataLoader(data, batch_size=16),
        ...                        verbose=False)
        >>> sorted(out[0])
        ['val/brier_confidence', 'val/ece', 'val/ece_debiased', 'val/mce', 'val/nll']
        >>> trainer.callbacks[0].history[-1]["n"]
        64
    """

    def __init__(
        self,
        n_bins: int = 15,
        reading: Literal["confidence", "binary", "top_label", "classwise"] = "confidence",
        input: Literal["logits", "probs"] = "logits",
        preds_key: str | None = None,
        target_key: str = "target",
        group_key: str = "group",
        num_classes: int | None = None,
        num_groups: int | None = None,
        extract_fn: Callable[[LightningModule, Any, Any], Any] | None = None,
        interval: Literal["wilson", "clopper_pearson"] = "wilson",
        level: float = 0.95,
        name: str = "",
        sinks: Sequence[Sink] = ("loggers", "figures", "csv"),
        verbose: bool = False,
        validate_args: bool = True,
        dataloader_idx: int = 0,
        selective_bins: int | None = None,
    ) -> None:
        super().__init__()
        check_reading_options(
            n_bins=n_bins,
            reading=reading,
            input=input,
            interval=interval,
            level=level,
            num_classes=num_classes,
            num_groups=num_groups,
            name=name,
        )
        self.n_bins = n_bins
        self.reading = reading
        self.input = input
        self.preds_key = check_key("preds_key", input if preds_key is None else preds_key)
        self.target_key = check_key("target_key", target_key)
        self.group_key = check_key("group_key", group_key)
        self.num_classes = num_classes
        self.num_groups = num_groups
        self.extract_fn = check_extract_fn(extract_fn)
        self.interval = interval
        self.level = float(level)
        self.name = name
        #: Where the results go besides ``pl_module.log`` (see :data:`SINKS`).
        self.sinks = check_sinks(sinks)
        self.verbose = check_bool("verbose", verbose)
        self.validate_args = check_bool("validate_args", validate_args)
        self.dataloader_idx = check_int("dataloader_idx", dataloader_idx, minimum=0)
        #: The scalars logged per stage and dataloader (the keys of :attr:`history`).
        self.selective_bins = None
        if selective_bins is not None:
            self.selective_bins = check_int("selective_bins", selective_bins, minimum=1)
            if reading != "confidence":
                raise ValueError(
                    f"selective_bins: AURC/AUGRC use reading='confidence', got {reading!r}"
                )
        self.metrics = metric_names(reading) + (("aurc", "augrc") if selective_bins else ())
        #: One dict per (stage, dataloader) and epoch: ``stage, dataloader_idx, epoch, step,
        #: n`` and the scalars of :attr:`metrics` (``group_ece``: per-group ECEs or None).
        self.history: list[dict[str, Any]] = []
        self._accs: dict[tuple[str, int], tuple[Any, ...]] = {}
        self._warnings = WarningCache()

    # ------------------------------------------------------------------ identity / state
    _key_settings = ("n_bins", "reading", "input", "preds_key", "target_key", "name", "num_groups")

    @override
    def _key_extras(self) -> dict[str, Any]:
        return {"selective_bins": self.selective_bins} if self.selective_bins else {}

    # ------------------------------------------------------------------ accumulation
    def _acc(self, stage: str, idx: int, device: torch.device) -> tuple[Any, ...]:
        """The (stage, dataloader) accumulators (diagram, NLL, risk-coverage or None),
        created on first use."""
        key = (stage, idx)
        if key not in self._accs:
            rd = ReliabilityDiagram(
                self.n_bins,
                reading=self.reading,
                input=self.input,
                num_classes=self.num_classes,
                num_groups=self.num_groups,
                interval=self.interval,
                level=self.level,
                validate_args=self.validate_args,
            )
            # NLL gets the tensors the diagram has just validated; its own check would reject
            # the -inf masks that F.cross_entropy handles exactly
            # reading="binary": every element an independent sigmoid, as the diagram reads it
            # ((B, C) 0/1 targets were read as class probabilities before)
            nll = NegativeLogLikelihood(
                input=self.input, multilabel=self.reading == "binary", validate_args=False
            )
            rc = None
            if self.selective_bins:
                rc = RiskCoverageCurve(
                    self.selective_bins,
                    input=self.input,
                    num_classes=self.num_classes,
                    validate_args=False,
                ).to(device)
            self._accs[key] = (rd.to(device), nll.to(device), rc)
        return self._accs[key]

    def _extract(
        self, stage: str, pl_module: LightningModule, batch: Any, outputs: Any
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        keys = [self.preds_key, self.target_key] + ([self.group_key] if self.num_groups else [])
        got = read_outputs(
            "CalibrationMonitor",
            stage,
            pl_module,
            batch,
            outputs,
            keys=keys,
            extract_fn=self.extract_fn,
        )
        if (
            not self.num_groups
            and self.extract_fn is None
            and isinstance(outputs, Mapping)
            and self.group_key in outputs
        ):
            self._warnings.warn(
                f"CalibrationMonitor: the step output carries "
                f"{self.group_key!r} but num_groups is not set; pass "
                f"num_groups=G for per-group tables"
            )
        return got[0], got[1], got[2] if self.num_groups else None

    @override
    def _update(
        self, stage: str, pl_module: LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        # the sanity check's batches too: a wrong output fails before any training (its sums
        # are dropped at the next epoch start and never emitted)
        preds, target, groups = self._extract(stage, pl_module, batch, outputs)
        rd, nll, rc = self._acc(stage, idx, preds.device)
        rd.update(preds, target, groups)  # validates (NaN/+inf, all -inf rows, labels)
        if self.reading == "binary" and preds.dim() == target.dim() + 1:  # a (B, 1) head
            nll.update(preds.squeeze(-1), target)
        else:  # the same tensors, already validated: no second check
            nll.update(preds, target)
        if rc is not None:
            rc.update(preds, target)

    @override
    def _emit(
        self, stage: str, trainer: Trainer, pl_module: LightningModule, n_loaders: int
    ) -> None:
        """Compose, log and write each dataloader's epoch. Every rank takes part in the
        collectives (a rank without batches of a loader adds zeros); files and loggers are
        written on rank 0."""
        several = n_loaders > 1
        for idx in range(max(n_loaders, 1)):
            rd, nll, rc = self._acc(stage, idx, pl_module.device)
            synced = rd.statistics()  # all-reduced (a collective)
            if int(synced.group_counts.sum()) == 0:  # no sample on any rank
                continue
            summary = rc.compute() if rc is not None else None  # a collective too
            ns, sfx = self._names(stage, idx, several)
            report = compose(
                synced,
                nll.compute(),
                reading=self.reading,
                interval=self.interval,
                level=self.level,
                tag=f"{ns}/reliability{sfx}",
                num_groups=self.num_groups,
            )
            if summary is not None:
                report.values["aurc"], report.values["augrc"] = summary.aurc, summary.augrc
            self._log(pl_module, report, ns, sfx)
            entry = self._record(
                stage,
                trainer,
                idx,
                n=report.n,
                **{k: float(report.values[k]) for k in self.metrics},
                group_ece=report.group_ece,
            )
            if trainer.is_global_zero:
                self._write(stage, trainer, idx, several, report, entry)

    def _log(self, pl_module: LightningModule, report: EpochReport, ns: str, sfx: str) -> None:
        """``pl_module.log`` the scalars, then the per-group ECEs, on every rank (already
        all-reduced values)."""
        self._log_scalars(pl_module, report.values, ns, sfx)
        dev = pl_module.device
        dtype = torch.float32 if dev.type == "mps" else torch.float64  # no float64 on mps
        for g, ge in report.group_values.items():
            pl_module.log(
                f"{ns}/group_{g}/ece{sfx}",
                ge.to(dev, dtype),
                on_step=False,
                on_epoch=True,
                sync_dist=True,
                add_dataloader_idx=False,
            )

    def _write(
        self,
        stage: str,
        trainer: Trainer,
        idx: int,
        several: bool,
        report: EpochReport,
        entry: dict[str, Any],
    ) -> None:
        """Rank 0: the text table (``verbose``), the CSV files and the loggers."""
        epoch, step, records = entry["epoch"], entry["step"], report.records
        if self.verbose:
            where = f" dataloader {idx}" if several else ""
            rank_zero_info(
                f"[CalibrationMonitor] {stage}{where} epoch {epoch} step {step}: "
                + ", ".join(f"{k}={entry[k]:.4f}" for k in self.metrics)
            )
            rank_zero_info(records[0].table.to_text())
        if "csv" in self.sinks:
            base = os.path.join(_sinks.log_dir_of(trainer), self._file(stage, idx, several))
            _sinks.write_csv(base + ".csv", records[:1], epoch=epoch, step=step)
            if len(records) > 1:
                _sinks.write_csv(base + "_groups.csv", records[1:], epoch=epoch, step=step)
        if "loggers" in self.sinks and trainer.loggers:
            fig = self._figure(records[0].table, trainer) if "figures" in self.sinks else None
            tag = records[0].tag.replace("/reliability", "/reliability_diagram", 1)
            _sinks.send_tables(
                trainer.loggers,
                records,
                epoch=epoch,
                step=step,
                fig_tag=tag,
                fig=fig,
                cache=self._warnings,
            )

    def _file(self, stage: str, idx: int, several: bool) -> str:
        parts = ([] if stage == "val" else [stage]) + (
            [self.name.replace("/", "_")] if self.name else []
        )
        parts.append("reliability")
        if self._suffixed(idx, several):
            parts.append(f"dataloader_idx_{idx}")
        return "_".join(parts)

    def _figure(self, table: Any, trainer: Trainer) -> Any:
        if not any(type(lg).__name__ in _sinks.IMAGE_LOGGERS for lg in trainer.loggers):
            return None
        try:
            return table_figure(table)
        except ImportError:
            self._warnings.warn(
                "CalibrationMonitor: matplotlib is not installed; reliability "
                "diagrams are skipped (tables still logged)"
            )
            return None

    # ------------------------------------------------------------------ fit end
    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not ("figures" in self.sinks and trainer.is_global_zero):
            return
        loaders = sorted({h["dataloader_idx"] for h in self.history if h["stage"] == "val"})
        for idx in loaders:
            if not self._history_figure(trainer, idx, several=len(loaders) > 1):
                return

    def _history_figure(self, trainer: Trainer, idx: int, several: bool) -> bool:
        """Draw, save and send dataloader ``idx``'s calibration-over-epochs figure; ``False``
        without matplotlib (warned once)."""
        hist = [h for h in self.history if h["stage"] == "val" and h["dataloader_idx"] == idx]
        ns, sfx = self._names("val", idx, several)
        try:
            fig = history_figure(
                hist, f"calibration over epochs ({ns}{sfx})", brier_key=brier_name(self.reading)
            )
        except ImportError:
            self._warnings.warn(
                "CalibrationMonitor: matplotlib is not installed; the "
                "calibration-over-epochs figure is skipped"
            )
            return False
        stem = self._file("val", idx, several).replace("reliability", "calibration_over_epochs")
        out = os.path.join(_sinks.log_dir_of(trainer), stem + ".png")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        fig.savefig(out)
        if "loggers" in self.sinks:
            _sinks.send_figure(
                trainer.loggers,
                f"{ns}/calibration_over_epochs{sfx}",
                fig,
                step=int(trainer.global_step),
                cache=self._warnings,
            )
        return True
