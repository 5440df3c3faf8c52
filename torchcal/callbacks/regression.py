"""``RegressionMonitor``: calibration and sharpness of predictive distributions, epoch by
epoch, in the loggers a Lightning user already has (the regression sibling of
:class:`~torchcal.callbacks.CalibrationMonitor`).

Per (stage, dataloader) at the end of an epoch: compute (the metrics of
:mod:`torchcal.metrics`, all-reduced), log (``pl_module.log``), write (CSV files, loggers,
the PIT figure, rank 0 only)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import WarningCache, rank_zero_info
from torch import Tensor
from typing_extensions import override

from torchcal.callbacks import _regression_parts as P
from torchcal.callbacks import _sinks
from torchcal.callbacks._history import StageMonitor
from torchcal.callbacks._monitor_options import Sink, check_sinks
from torchcal.callbacks._outputs import check_extract_fn, check_key, read_outputs
from torchcal.functional._checks import check_bool, check_int, check_option, validation_enabled
from torchcal.functional._validation import check_group_ids, check_level_grid
from torchcal.plotting import pit_figure

__all__ = ["RegressionMonitor"]

Family = Literal["normal", "laplace", "logistic", "quantiles", "ensemble"]


class RegressionMonitor(StageMonitor):
    """Track the calibration of predictive distributions from ``validation_step``/``test_step``.

    The monitor never runs a forward pass: it reads what the step returns, by ``family``:

    * ``"normal"`` (default), ``"laplace"``, ``"logistic"``: ``{"loc": (B,), "scale": (B,),
      "target": (B,)}`` (the families of :func:`torchcal.functional.crps_normal` and its
      siblings; ``scale > 0``, the target never broadcast);
    * ``"quantiles"``: ``{"quantiles": (B, K), "levels": (K,), "target": (B,)}`` (the same
      levels in every batch; they must hold ``(1 - l) / 2`` and ``(1 + l) / 2`` for every
      monitored level ``l``);
    * ``"ensemble"``: ``{"samples": (B, M), "target": (B,)}`` (members on the last dim).

    Every batch is validated from the first one on (the sanity check's too, whose sums are
    dropped), so a wrong ``validation_step`` fails before training, with a ``ValueError``
    naming the key. Inputs are read in float64. At the end of each validation/test epoch
    (not the sanity check) it

    * logs with ``pl_module.log(..., sync_dist=True)`` (``stage`` is ``val`` or ``test``):
      ``{stage}/crps`` (mean CRPS; closed form, or the fair ensemble CRPS; for quantile
      sets ``{stage}/quantile_score`` instead, the mean pinball loss over the step's
      levels, about CRPS / 2 on a fine uniform grid), ``{stage}/nll`` (Gaussian NLL,
      ``normal`` only), ``{stage}/pit_ece`` (``sum_b |count_b / N - 1 / B|`` of the PIT
      histogram; 0 = flat) and per monitored level, e.g. 0.9, ``{stage}/coverage_90`` and
      ``{stage}/width_90`` (observed coverage and mean width of the central 90 % interval:
      the family's quantiles, the step's quantiles, or the members' linearly interpolated
      quantiles). They are usable as ``ModelCheckpoint``/``EarlyStopping`` monitors
      (``monitor="val/crps"``). For model selection use a proper score (CRPS, NLL): a
      climatological forecast has a flat PIT and nominal coverage, and is useless; the
      widths say how sharp a calibrated forecast is. With several dataloaders the one of
      ``dataloader_idx`` keeps the plain names, the others' end in ``/dataloader_idx_{i}``;
    * writes the PIT histogram (``bin, lo, hi, count, share, density``) and the coverage
      table (``level, coverage, stderr, width, interval_score``; ``stderr`` is
      ``sqrt(p (1 - p) / n)``) to every logger (TensorBoard text, W&B and MLflow tables),
      the PIT figure (:func:`torchcal.plotting.pit_figure`, with the coverage panel) to the
      image loggers, and appends both tables in long format (with ``epoch, step``) to
      ``pit.csv`` and ``coverage.csv`` in the CSVLogger's ``log_dir`` (``test_pit.csv``,
      ``..._dataloader_idx_{i}.csv`` for the others);
    * records the scalars in :attr:`history` (kept in checkpoints).

    Per group (``num_groups=G``; the step then returns a group id per target value under
    ``group_key``, integers in ``[0, G)`` of the target's shape, checked from the first
    batch): marginal coverage can hide a group whose intervals fail, so each non-empty group
    also gets ``{stage}/group_{g}/pit_ece``, ``{stage}/group_{g}/coverage_90`` and
    ``{stage}/group_{g}/width_90`` (as ``CalibrationMonitor``'s ``{stage}/group_{g}/ece``),
    its PIT and coverage tables (with a leading ``group`` column, the coverage table also
    ``n`` and the per-group ``stderr``) in ``pit_groups.csv`` and ``coverage_groups.csv``
    and the loggers (tags ``{stage}/pit_groups`` and ``{stage}/coverage_groups``), and the
    ``group_metrics`` of :attr:`history` (one dict per group, ``n`` and the per-group
    scalars; ``None`` for an empty group). The pooled metrics are unchanged.

    Args:
        levels: nominal coverages of the central intervals, strictly increasing in (0, 1).
        n_bins: bins of the PIT histogram.
        family: how to read the step's outputs (see above).
        dataloader_idx: with several dataloaders, the one whose metrics get the plain names.
        sinks: any of ``"loggers"``, ``"figures"``, ``"csv"``, ``"prog_bar"`` (``crps`` or
            ``quantile_score`` in the progress bar), as for ``CalibrationMonitor``.
        verbose: log the scalars and both tables each epoch (``rank_zero_info``).
        extract_fn: ``fn(pl_module, batch, outputs)`` returning a dict with the family's
            keys or a tuple in their order (replaces the dict lookup).
        name: optional sub-namespace (``name="head"`` logs ``val/head/crps``).
        num_groups: the number of groups ``G`` for per-group results (``None``: none).
        group_key: the key of the group ids in the step's output dict (after the family's
            keys in an ``extract_fn`` tuple).
        seed: seed of the randomised ensemble PIT (reseeded at every epoch start, plus the
            global rank; ties and the ends randomised, see
            :func:`torchcal.functional.pit_ensemble`).
        validate_args: run the value checks (NaN, positive scale, sorted quantiles, ...).

    Example:
        >>> import torch, lightning as L
        >>> from torchcal.callbacks import RegressionMonitor
        >>> class Model(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(1, 2)
        ...     def validation_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         loc, raw = self.net(x).unbind(-1)
        ...         scale = torch.nn.functional.softplus(raw) + 1e-3
        ...         return {"loc": loc, "scale": scale, "target": y}
        >>> x = torch.rand(64, 1)
        >>> data = torch.utils.data.TensorDataset(x, 2 * x[:, 0] + 0.1 * torch.randn(64))
        >>> trainer = L.Trainer(callbacks=[RegressionMonitor(levels=(0.9,), sinks=())],
        ...                     logger=False, enable_progress_bar=False,
        ...                     enable_model_summary=False, enable_checkpointing=False)
        >>> out = trainer.validate(Model(), torch.utils.data.DataLoader(data, batch_size=16),
        ...                        verbose=False)
        >>> sorted(out[0])
        ['val/coverage_90', 'val/crps', 'val/nll', 'val/pit_ece', 'val/width_90']
    """

    def __init__(
        self,
        levels: Sequence[float] = (0.5, 0.8, 0.9, 0.95),
        n_bins: int = 10,
        family: Family = "normal",
        *,
        dataloader_idx: int = 0,
        sinks: Sequence[Sink] = ("loggers", "figures", "csv"),
        verbose: bool = False,
        extract_fn: Callable[[LightningModule, Any, Any], Any] | None = None,
        name: str = "",
        num_groups: int | None = None,
        group_key: str = "group",
        seed: int = 0,
        validate_args: bool = True,
    ) -> None:
        super().__init__()
        #: The monitored nominal coverages (float64).
        self.levels = check_level_grid("levels", levels).detach().to("cpu", torch.float64)
        self.n_bins = check_int("n_bins", n_bins, minimum=1)
        self.family = str(check_option("family", family, P.FAMILIES))
        self.dataloader_idx = check_int("dataloader_idx", dataloader_idx, minimum=0)
        #: Where the results go besides ``pl_module.log``.
        self.sinks = check_sinks(sinks)
        self.verbose = check_bool("verbose", verbose)
        self.extract_fn = check_extract_fn(extract_fn)
        if not isinstance(name, str) or name.strip("/") != name:
            raise ValueError(f"name: expected a string without leading/trailing '/', got {name!r}")
        self.name = name
        self.num_groups = (
            None if num_groups is None else check_int("num_groups", num_groups, minimum=1)
        )
        self.group_key = check_key("group_key", group_key)
        if self.group_key in P.OUTPUT_KEYS[self.family]:
            raise ValueError(
                f"group_key: expected a key other than the family's "
                f"{P.OUTPUT_KEYS[self.family]}, got {group_key!r}"
            )
        self.seed = check_int("seed", seed, minimum=0)
        self.validate_args = check_bool("validate_args", validate_args)
        #: The scalars logged per stage and dataloader (the keys of :attr:`history`).
        self.metrics = P.metric_names(self.family, self.levels.tolist())
        #: The scalars logged per non-empty group (``{stage}/group_{g}/{name}``).
        self.group_metrics = P.group_metric_names(self.levels.tolist())
        #: One dict per (stage, dataloader) and epoch: ``stage, dataloader_idx, epoch, step,
        #: n``, the scalars of :attr:`metrics`, ``pit_counts`` (a list of ints) and
        #: ``group_metrics`` (``None`` without groups).
        self.history: list[dict[str, Any]] = []
        self._accs: dict[tuple[str, int], P.Accumulator] = {}
        self._warnings = WarningCache()

    @property
    @override
    def state_key(self) -> str:
        # num_groups only when set: an ungrouped monitor keeps the key of earlier checkpoints
        extra = {} if self.num_groups is None else {"num_groups": self.num_groups}
        return self._generate_state_key(
            levels=tuple(self.levels.tolist()),
            n_bins=self.n_bins,
            family=self.family,
            name=self.name,
            **extra,
        )

    # ------------------------------------------------------------------ accumulation
    def _acc(self, stage: str, idx: int, device: torch.device, rank: int) -> P.Accumulator:
        """The (stage, dataloader) accumulator, created on first use."""
        if (stage, idx) not in self._accs:
            gen = None
            if self.family == "ensemble":
                gen = torch.Generator(device=device).manual_seed(self.seed + rank)
            acc = P.Accumulator(self.family, self.levels, self.n_bins, gen, self.num_groups)
            self._accs[(stage, idx)] = acc.to(device)
        return self._accs[(stage, idx)]

    def _read(
        self, stage: str, pl_module: LightningModule, batch: Any, outputs: Any
    ) -> tuple[list[Tensor], Tensor | None]:
        """The family's tensors and the group ids (``None`` without ``num_groups``)."""
        keys = P.OUTPUT_KEYS[self.family]
        if self.extract_fn is None and isinstance(outputs, Mapping):
            self._check_keys(outputs, keys)
        grouped = self.num_groups is not None
        values = read_outputs(
            "RegressionMonitor",
            stage,
            pl_module,
            batch,
            outputs,
            keys=keys + ((self.group_key,) if grouped else ()),
            extract_fn=self.extract_fn,
        )
        return (values[:-1], values[-1]) if grouped else (values, None)

    def _check_keys(self, outputs: Mapping[str, Any], keys: tuple[str, ...]) -> None:
        """A step output dict with another family's keys, or without the group ids (or with
        group ids the monitor ignores: one warning)."""
        got = sorted(map(str, outputs))
        if any(k not in outputs for k in keys):
            for fam, fam_keys in P.OUTPUT_KEYS.items():
                if all(k in outputs for k in fam_keys) and fam_keys != keys:
                    raise ValueError(
                        f"family: the step returned the keys {got} of family={fam!r} "
                        f"forecasts, but the monitor was built with family={self.family!r}; "
                        f"pass RegressionMonitor(family={fam!r})"
                    )
        elif self.num_groups is not None and self.group_key not in outputs:
            raise ValueError(
                f"{self.group_key}: RegressionMonitor(num_groups={self.num_groups}) needs a "
                f"group id per target value under the key {self.group_key!r}, but the step "
                f"returned the keys {got}; return it (or set group_key=...)"
            )
        elif self.num_groups is None and self.group_key in outputs:
            self._warnings.warn(
                f"RegressionMonitor: the step output carries {self.group_key!r} but "
                f"num_groups is not set; pass num_groups=G for per-group results"
            )

    @override
    def _update(
        self, stage: str, pl_module: LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        values, groups = self._read(stage, pl_module, batch, outputs)
        acc = self._acc(stage, idx, values[0].device, pl_module.global_rank)
        with validation_enabled(self.validate_args):
            if groups is not None and self.num_groups is not None:
                shape = values[-1].shape
                hint = f" (RegressionMonitor(num_groups={self.num_groups}))"
                check_group_ids(groups, shape, self.num_groups, name=self.group_key, hint=hint)
            acc.update(values, groups)

    @override
    def _emit(
        self, stage: str, trainer: Trainer, pl_module: LightningModule, n_loaders: int
    ) -> None:
        """Compute, log and write each dataloader's epoch. Every rank takes part in the
        collectives (a rank without batches of a loader adds zeros); files and loggers are
        written on rank 0."""
        several = n_loaders > 1
        for idx in range(max(n_loaders, 1)):
            acc = self._acc(stage, idx, pl_module.device, trainer.global_rank)
            local = torch.tensor(float(acc.n), device=pl_module.device)
            if float(trainer.strategy.reduce(local, reduce_op="sum")) == 0:  # a collective
                continue
            res = acc.compute()  # all-reduced (collectives)
            ns, sfx = self._names(stage, idx, several)
            values = self._values(res)
            self._log_scalars(pl_module, values, ns, sfx)
            per_group = self._log_groups(pl_module, res["groups"], ns, sfx)
            entry = self._record(
                stage,
                trainer,
                idx,
                n=int(res["coverage"]["n"]),
                **{k: float(values[k]) for k in self.metrics},
                pit_counts=[int(c) for c in res["pit"]["counts"].reshape(-1).tolist()],
                group_metrics=per_group,
            )
            if trainer.is_global_zero:
                self._write(stage, trainer, ns, sfx, res, entry)

    def _log_groups(
        self, pl_module: LightningModule, groups: dict[str, Any] | None, ns: str, sfx: str
    ) -> list[dict[str, float] | None] | None:
        """``pl_module.log`` every non-empty group's scalars (already all-reduced; every
        rank); returns the history's ``group_metrics``."""
        if groups is None:
            return None
        dev = pl_module.device
        dtype = torch.float32 if dev.type == "mps" else torch.float64  # no float64 on mps
        per_group = P.group_values(self.levels, groups)
        for g, vals in per_group.items():
            for key in self.group_metrics:
                pl_module.log(
                    f"{ns}/group_{g}/{key}{sfx}",
                    vals[key].to(dev, dtype),
                    on_step=False,
                    on_epoch=True,
                    sync_dist=True,
                    add_dataloader_idx=False,
                )
        n = groups["n"].reshape(-1).tolist()
        return [
            {"n": int(n[g]), **{k: float(v) for k, v in per_group[g].items()}}
            if g in per_group
            else None
            for g in range(len(n))
        ]

    def _values(self, res: dict[str, Any]) -> dict[str, Tensor]:
        """The scalars of :attr:`metrics` from the computed results."""
        cov = res["coverage"]
        values = {self.metrics[0]: res["score"], "pit_ece": res["pit"]["pit_ece"]}
        if res["nll"] is not None:
            values["nll"] = res["nll"]
        for i, lv in enumerate(self.levels.tolist()):
            key = P.level_key(lv)
            values[f"coverage_{key}"] = cov["coverage"].reshape(-1)[i]
            values[f"width_{key}"] = cov["width"].reshape(-1)[i]
        return values

    def _write(
        self,
        stage: str,
        trainer: Trainer,
        ns: str,
        sfx: str,
        res: dict[str, Any],
        entry: dict[str, Any],
    ) -> None:
        """Rank 0: the text tables (``verbose``), the CSV files, the loggers and the figure."""
        epoch, step = entry["epoch"], entry["step"]
        tables = {
            "pit": P.pit_rows(res["pit"]["counts"]),
            "coverage": P.coverage_rows(self.levels, res["coverage"]),
        }
        if res["groups"] is not None:
            tables["pit_groups"], tables["coverage_groups"] = P.group_rows(
                self.levels, res["groups"]
            )
        if self.verbose:
            rank_zero_info(
                f"[RegressionMonitor] {ns}{sfx} epoch {epoch} step {step}: "
                + ", ".join(f"{k}={entry[k]:.4f}" for k in self.metrics)
            )
            text = [P.rows_text(tables["pit"], bar="density"), P.rows_text(tables["coverage"])]
            if tables.get("coverage_groups"):
                text.append(P.rows_text(tables["coverage_groups"]))
            rank_zero_info("\n".join(text))
        tables = {what: rows for what, rows in tables.items() if rows}  # no empty table
        if "csv" in self.sinks:
            stem = self._file(ns, stage, sfx)
            base = _sinks.log_dir_of(trainer)
            for what, rows in tables.items():
                path = os.path.join(base, stem.format(what) + ".csv")
                P.write_rows(path, rows, epoch=epoch, step=step)
        if "loggers" in self.sinks and trainer.loggers:
            for what, rows in tables.items():
                tag = f"{ns}/{what}{sfx}"
                art = f"calibration/{tag.replace('/', '_')}_epoch={epoch}_step={step}.json"
                P.send_text_table(
                    trainer.loggers, tag, rows, step=step, artifact=art, cache=self._warnings
                )
            if "figures" in self.sinks:
                self._figure(trainer, f"{ns}/pit_histogram{sfx}", res, step)

    def _file(self, ns: str, stage: str, sfx: str) -> str:
        """The CSV file stem with a ``{}`` for ``pit``, ``coverage``, ``pit_groups`` or
        ``coverage_groups``: ``[test_][name_]{}`` and
        ``_dataloader_idx_{i}``."""
        parts = ([] if stage == "val" else [stage]) + (
            [self.name.replace("/", "_")] if self.name else []
        )
        return "_".join(parts + ["{}"]) + sfx.replace("/", "_")

    def _figure(self, trainer: Trainer, tag: str, res: dict[str, Any], step: int) -> None:
        if not any(type(lg).__name__ in _sinks.IMAGE_LOGGERS for lg in trainer.loggers):
            return
        cov = res["coverage"]
        try:
            fig = pit_figure(
                res["pit"]["counts"].reshape(-1).tolist(),
                levels=self.levels.tolist(),
                coverage=cov["coverage"].reshape(-1).tolist(),
                stderr=cov["stderr"].reshape(-1).tolist(),
                title=tag,
            )
        except ImportError:
            self._warnings.warn(
                "RegressionMonitor: matplotlib is not installed; the PIT figure is skipped"
            )
            return
        _sinks.send_figure(trainer.loggers, tag, fig, step=step, cache=self._warnings)
