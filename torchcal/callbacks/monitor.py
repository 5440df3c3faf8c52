"""``CalibrationMonitor``: calibration metrics and reliability tables, epoch by epoch, in the
loggers a Lightning user already has."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from typing_extensions import override

from torchcal.callbacks import _sinks
from torchcal.callbacks._outputs import check_extract_fn, check_key, read_outputs
from torchcal.functional import calibration as C
from torchcal.functional._validation import check_int, check_open_unit, check_option
from torchcal.metrics import NegativeLogLikelihood, ReliabilityDiagram
from torchcal.report import ReliabilityTable

__all__ = ["CalibrationMonitor"]

#: Scalars logged per stage (and dataloader), in this order, for the default reading
#: (``confidence``); see :func:`metric_names` for the others.
METRICS = ("ece", "ece_debiased", "mce", "brier_confidence", "nll")


def brier_name(reading: str) -> str:
    """The key of the reading's Brier score: ``"brier"`` where it is the usual Brier score of
    the full prediction (``binary``: ``(p - y)^2``; ``classwise``: the multiclass
    ``sum_k (p_k - y_k)^2``), ``"brier_confidence"`` where it is the Brier score of the
    top-label confidence against correct-or-not (``confidence``, ``top_label``)."""
    return "brier" if reading in ("binary", "classwise") else "brier_confidence"


def metric_names(reading: str) -> tuple[str, ...]:
    """The scalars logged per stage (and dataloader) for ``reading``, in order."""
    return ("ece", "ece_debiased", "mce", brier_name(reading), "nll")


class CalibrationMonitor(Callback):
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
        log_tables: send tables (and figures) to the loggers.
        log_figures: draw the reliability diagram each epoch and the history figure at fit
            end (needs matplotlib; skipped with one warning without it).
        write_csv: append the tables to the CSV files.
        verbose: print the table each epoch (rank 0).
        prog_bar: also show ``ece`` in the progress bar.
        validate_args: run the value checks (NaN/Inf, label range) on each batch.
        dataloader_idx: with several validation (or test) dataloaders, the one whose metrics
            get the plain names (``val/nll``); the others get ``/dataloader_idx_{i}``.

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
        >>> trainer = L.Trainer(callbacks=[CalibrationMonitor(n_bins=10, write_csv=False)],
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
        log_tables: bool = True,
        log_figures: bool = True,
        write_csv: bool = True,
        verbose: bool = False,
        prog_bar: bool = False,
        validate_args: bool = True,
        dataloader_idx: int = 0,
    ) -> None:
        super().__init__()
        self.n_bins = check_int("n_bins", n_bins, minimum=1)
        check_option("reading", reading, C.READINGS)
        check_option("input", input, C.INPUTS)
        check_option("interval", interval, C.INTERVALS)
        check_open_unit("level", level)
        if reading in ("top_label", "classwise") and num_classes is None:
            raise ValueError(f"num_classes: expected the number of classes for "
                             f"reading={reading!r}, got None")
        if num_classes is not None:
            check_int("num_classes", num_classes, minimum=2)
        if num_groups is not None:
            check_int("num_groups", num_groups, minimum=1)
        if not isinstance(name, str) or name.strip("/") != name:
            raise ValueError(f"name: expected a string without leading/trailing '/', got "
                             f"{name!r}")
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
        self.log_tables = bool(log_tables)
        self.log_figures = bool(log_figures)
        self.write_csv = bool(write_csv)
        self.verbose = bool(verbose)
        self.prog_bar = bool(prog_bar)
        self.validate_args = bool(validate_args)
        self.dataloader_idx = check_int("dataloader_idx", dataloader_idx, minimum=0)
        #: The scalars logged per stage and dataloader (the keys of :attr:`history`).
        self.metrics = metric_names(reading)
        #: One dict per (stage, dataloader) and epoch: ``stage, dataloader_idx, epoch, step,
        #: n`` and the scalars of :attr:`metrics` (``group_ece``: per-group ECEs or None).
        self.history: list[dict[str, Any]] = []
        self._accs: dict[tuple[str, int], tuple[ReliabilityDiagram, NegativeLogLikelihood]] = {}
        self._warn = _sinks.WarnOnce()

    # ------------------------------------------------------------------ identity / state
    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(
            n_bins=self.n_bins, reading=self.reading, input=self.input,
            preds_key=self.preds_key, target_key=self.target_key, name=self.name,
            num_groups=self.num_groups)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"history": [dict(h) for h in self.history]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [dict(h) for h in state_dict.get("history", [])]

    # ------------------------------------------------------------------ accumulation
    def _new_acc(self, device: torch.device) -> tuple[ReliabilityDiagram, NegativeLogLikelihood]:
        rd = ReliabilityDiagram(self.n_bins, reading=self.reading, input=self.input,
                                num_classes=self.num_classes, num_groups=self.num_groups,
                                interval=self.interval, level=self.level,
                                validate_args=self.validate_args)
        # NLL gets the tensors the diagram has just validated; its own check would reject
        # the -inf masks that F.cross_entropy handles exactly
        nll = NegativeLogLikelihood(input=self.input, validate_args=False)
        return rd.to(device), nll.to(device)

    def _acc(self, stage: str, idx: int, device: torch.device
             ) -> tuple[ReliabilityDiagram, NegativeLogLikelihood]:
        key = (stage, idx)
        if key not in self._accs:
            self._accs[key] = self._new_acc(device)
        return self._accs[key]

    def _extract(self, stage: str, pl_module: LightningModule, batch: Any, outputs: Any
                 ) -> tuple[Tensor, Tensor, Tensor | None]:
        keys = [self.preds_key, self.target_key] + ([self.group_key] if self.num_groups else [])
        got = read_outputs("CalibrationMonitor", stage, pl_module, batch, outputs, keys=keys,
                           extract_fn=self.extract_fn)
        if (not self.num_groups and self.extract_fn is None and isinstance(outputs, Mapping)
                and self.group_key in outputs):
            self._warn("groups-ignored", f"CalibrationMonitor: the step output carries "
                                         f"{self.group_key!r} but num_groups is not set; pass "
                                         f"num_groups=G for per-group tables")
        return got[0], got[1], got[2] if self.num_groups else None

    def _update(self, stage: str, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                batch: Any, dataloader_idx: int) -> None:
        # the sanity check's batches too: a wrong output fails before any training (its sums
        # are dropped at the next epoch start and never emitted)
        preds, target, groups = self._extract(stage, pl_module, batch, outputs)
        rd, nll = self._acc(stage, dataloader_idx, preds.device)
        rd.update(preds, target, groups)  # validates (NaN/+inf, all -inf rows, labels)
        nll.update(preds, target)  # the same tensors, already validated: no second check

    @override
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._reset("val")
        self._check_loaders("val", len(trainer.num_val_batches))

    def _check_loaders(self, stage: str, n_loaders: int) -> None:
        if n_loaders > 1 and self.dataloader_idx >= n_loaders:
            raise ValueError(f"dataloader_idx: expected one of the {n_loaders} {stage} "
                             f"dataloaders (0 to {n_loaders - 1}), got {self.dataloader_idx}")

    @override
    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._reset("test")
        self._check_loaders("test", len(trainer.num_test_batches))

    def _reset(self, stage: str) -> None:
        for key in [k for k in self._accs if k[0] == stage]:
            del self._accs[key]

    @override
    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule,
                                outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._update("val", trainer, pl_module, outputs, batch, dataloader_idx)

    @override
    def on_test_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                          batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._update("test", trainer, pl_module, outputs, batch, dataloader_idx)

    # ------------------------------------------------------------------ epoch end
    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._emit("val", trainer, pl_module, len(trainer.num_val_batches))

    @override
    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._emit("test", trainer, pl_module, len(trainer.num_test_batches))

    def _synced(self, idx_acc: tuple[ReliabilityDiagram, NegativeLogLikelihood]
                ) -> tuple[C.BinnedStats, Tensor, Tensor | None]:
        """The all-reduced statistics (a collective under DDP: every rank calls it)."""
        rd, nll = idx_acc
        with rd.sync_context():  # the states are back to the local shard on exit: clone
            local = rd._stats()
            stats = C.BinnedStats(*(getattr(local, f.name).clone() for f in fields(local)))
            group_count = rd.group_count.clone()
        n = int(group_count.sum())
        # the metric's own mean (a collective too); only once any rank has seen a sample
        return stats, group_count, (nll.compute() if n else None)

    def _scalars(self, stats: C.BinnedStats) -> dict[str, Tensor]:
        r = self.reading
        return {
            "ece": C.calibration_error_from_stats(stats, norm="l1", reading=r),
            "ece_debiased": C.debiased_calibration_error_from_stats(stats, reading=r),
            "mce": C.calibration_error_from_stats(stats, norm="max", reading=r),
            brier_name(r): C.brier_decomposition_from_stats(stats, reading=r)["brier"],
        }

    def _table(self, stats: C.BinnedStats) -> ReliabilityTable:
        return C.reliability_table_from_stats(stats, interval=self.interval, level=self.level,
                                              reading=self.reading)

    def _names(self, stage: str, idx: int, several: bool) -> tuple[str, str]:
        """(namespace, suffix) for metric names: ``val[/name]``, ``[/dataloader_idx_i]``
        (no suffix for the chosen ``dataloader_idx``)."""
        ns = f"{stage}/{self.name}" if self.name else stage
        return ns, (f"/dataloader_idx_{idx}" if self._suffixed(idx, several) else "")

    def _suffixed(self, idx: int, several: bool) -> bool:
        return several and idx != self.dataloader_idx

    def _emit(self, stage: str, trainer: Trainer, pl_module: LightningModule,
              n_loaders: int) -> None:
        several = n_loaders > 1
        for idx in range(max(n_loaders, 1)):
            # every rank takes part (a rank without batches of this loader adds zeros)
            stats, group_count, nll = self._synced(self._acc(stage, idx, pl_module.device))
            if nll is None:  # no sample on any rank
                continue
            n = int(group_count.sum())
            pooled = stats.pooled()
            values = self._scalars(pooled)
            values["nll"] = nll
            ns, sfx = self._names(stage, idx, several)
            dev = pl_module.device
            dtype = torch.float32 if dev.type == "mps" else torch.float64  # no float64 on mps
            for key in self.metrics:
                pl_module.log(f"{ns}/{key}{sfx}", values[key].to(dev, dtype), on_step=False,
                              on_epoch=True, sync_dist=True, add_dataloader_idx=False,
                              prog_bar=self.prog_bar and key == "ece")
            group_ece = None
            records = [_sinks.TableRecord(f"{ns}/reliability{sfx}", self._table(pooled))]
            if self.num_groups:
                group_ece = []
                for g in range(self.num_groups):
                    if int(group_count[g]) == 0:
                        group_ece.append(None)
                        continue
                    gs = stats.group(g)
                    ge = C.calibration_error_from_stats(gs, norm="l1", reading=self.reading)
                    group_ece.append(float(ge))
                    pl_module.log(f"{ns}/group_{g}/ece{sfx}", ge.to(dev, dtype),
                                  on_step=False, on_epoch=True, sync_dist=True,
                                  add_dataloader_idx=False)
                    records.append(_sinks.TableRecord(f"{ns}/reliability/group_{g}{sfx}",
                                                      self._table(gs), group=g))
            entry = {"stage": stage, "dataloader_idx": idx, "epoch": int(trainer.current_epoch),
                     "step": int(trainer.global_step), "n": n,
                     **{k: float(values[k]) for k in self.metrics}, "group_ece": group_ece}
            self.history.append(entry)
            if trainer.is_global_zero:
                self._write(stage, trainer, idx, several, records, entry)

    def _write(self, stage: str, trainer: Trainer, idx: int, several: bool,
               records: list[_sinks.TableRecord], entry: dict[str, Any]) -> None:
        epoch, step = entry["epoch"], entry["step"]
        if self.verbose:
            where = f" dataloader {idx}" if several else ""
            print(f"[CalibrationMonitor] {stage}{where} epoch {epoch} step {step}: "
                  + ", ".join(f"{k}={entry[k]:.4f}" for k in self.metrics))
            print(records[0].table.to_text())
        if self.write_csv:
            base = os.path.join(_sinks.log_dir_of(trainer), self._file(stage, idx, several))
            _sinks.write_csv(base + ".csv", records[:1], epoch=epoch, step=step)
            if len(records) > 1:
                _sinks.write_csv(base + "_groups.csv", records[1:], epoch=epoch, step=step)
        if self.log_tables and trainer.loggers:
            fig = self._figure(records[0].table, trainer) if self.log_figures else None
            tag = records[0].tag.replace("/reliability", "/reliability_diagram", 1)
            _sinks.send_tables(trainer.loggers, records, epoch=epoch, step=step, fig_tag=tag,
                               fig=fig, warn=self._warn)

    def _file(self, stage: str, idx: int, several: bool) -> str:
        parts = ([] if stage == "val" else [stage]) + ([self.name.replace("/", "_")]
                                                      if self.name else [])
        parts.append("reliability")
        if self._suffixed(idx, several):
            parts.append(f"dataloader_idx_{idx}")
        return "_".join(parts)

    def _figure(self, table: ReliabilityTable, trainer: Trainer) -> Any:
        if not any(type(lg).__name__ in ("TensorBoardLogger", "WandbLogger", "MLFlowLogger")
                   for lg in trainer.loggers):
            return None
        try:
            return _sinks.table_figure(table)
        except ImportError:
            self._warn("matplotlib", "CalibrationMonitor: matplotlib is not installed; "
                                     "reliability diagrams are skipped (tables still logged)")
            return None

    # ------------------------------------------------------------------ fit end
    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not (self.log_figures and trainer.is_global_zero):
            return
        loaders = sorted({h["dataloader_idx"] for h in self.history if h["stage"] == "val"})
        for idx in loaders:
            hist = [h for h in self.history if h["stage"] == "val" and h["dataloader_idx"] == idx]
            several = len(loaders) > 1
            ns, sfx = self._names("val", idx, several)
            try:
                fig = _sinks.history_figure(hist, f"calibration over epochs ({ns}{sfx})",
                                            brier_key=brier_name(self.reading))
            except ImportError:
                self._warn("matplotlib", "CalibrationMonitor: matplotlib is not installed; "
                                         "the calibration-over-epochs figure is skipped")
                return
            stem = self._file("val", idx, several).replace("reliability",
                                                           "calibration_over_epochs")
            out = os.path.join(_sinks.log_dir_of(trainer), stem + ".png")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            fig.savefig(out)
            if self.log_tables:
                _sinks.send_figure(trainer.loggers, f"{ns}/calibration_over_epochs{sfx}", fig,
                                   step=int(trainer.global_step), warn=self._warn)
