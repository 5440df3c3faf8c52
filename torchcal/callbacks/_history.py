"""What the torchcal callbacks share: the checkpointed ``history`` list, and the per-stage,
per-dataloader lifecycle of the two monitors (accumulators dropped at each epoch start, the
sanity check's batches checked but never emitted, metric names per dataloader)."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from typing_extensions import override


class HistoryCallback(Callback):
    """A callback whose checkpoint state is :attr:`history` (one plain dict per record), so a
    resumed run keeps it."""

    history: list[dict[str, Any]]
    #: the settings that tell two instances apart in a checkpoint, in :attr:`state_key` order
    _key_settings: tuple[str, ...] = ()

    def _key_extras(self) -> dict[str, Any]:
        """Settings that join the key only when set (an earlier checkpoint keeps its key)."""
        return {}

    @property
    @override
    def state_key(self) -> str:
        settings = {name: getattr(self, name) for name in self._key_settings}
        return self._generate_state_key(**settings, **self._key_extras())

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"history": [dict(h) for h in self.history]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [dict(h) for h in state_dict.get("history", [])]


class StageMonitor(HistoryCallback):
    """The Lightning plumbing of :class:`CalibrationMonitor` and :class:`RegressionMonitor`.

    Subclasses set ``name``, ``dataloader_idx``, ``sinks``, ``metrics`` and an ``_accs`` dict
    keyed by ``(stage, dataloader_idx)``, and implement ``_update`` (one batch) and ``_emit``
    (one epoch). Validation and test batches are accumulated, the sanity check's too (a wrong
    output fails before any training; its sums are dropped at the next epoch start).
    """

    name: str | None
    dataloader_idx: int
    sinks: frozenset[str]
    metrics: tuple[str, ...]
    _accs: dict[tuple[str, int], Any]

    def _update(
        self, stage: str, pl_module: LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        """Accumulate one batch of dataloader ``idx`` (the rank is ``pl_module.global_rank``)."""
        raise NotImplementedError

    def _emit(
        self, stage: str, trainer: Trainer, pl_module: LightningModule, n_loaders: int
    ) -> None:
        raise NotImplementedError

    def _start(self, stage: str, n_loaders: int) -> None:
        """Drop the stage's sums (the sanity check's too) and check ``dataloader_idx``."""
        for key in [k for k in self._accs if k[0] == stage]:
            del self._accs[key]
        if n_loaders > 1 and self.dataloader_idx >= n_loaders:
            raise ValueError(
                f"dataloader_idx: expected one of the {n_loaders} {stage} "
                f"dataloaders (0 to {n_loaders - 1}), got {self.dataloader_idx}"
            )

    @override
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start("val", len(trainer.num_val_batches))

    @override
    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start("test", len(trainer.num_test_batches))

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._update("val", pl_module, outputs, batch, dataloader_idx)

    @override
    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._update("test", pl_module, outputs, batch, dataloader_idx)

    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._emit("val", trainer, pl_module, len(trainer.num_val_batches))

    @override
    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._emit("test", trainer, pl_module, len(trainer.num_test_batches))

    def _suffixed(self, idx: int, several: bool) -> bool:
        return several and idx != self.dataloader_idx

    def _names(self, stage: str, idx: int, several: bool) -> tuple[str, str]:
        """(namespace, suffix) for metric names: ``val[/name]``, ``[/dataloader_idx_i]``
        (no suffix for the chosen ``dataloader_idx``)."""
        ns = f"{stage}/{self.name}" if self.name else stage
        return ns, (f"/dataloader_idx_{idx}" if self._suffixed(idx, several) else "")

    def _log_scalars(
        self, pl_module: LightningModule, values: dict[str, Tensor], ns: str, sfx: str
    ) -> None:
        """``pl_module.log`` :attr:`metrics` on every rank; the values are already
        all-reduced, so the ``sync_dist`` mean averages equal numbers. The first metric goes
        to the progress bar when ``"prog_bar"`` is a sink."""
        dev = pl_module.device
        dtype = torch.float32 if dev.type == "mps" else torch.float64  # no float64 on mps
        for key in self.metrics:
            pl_module.log(
                f"{ns}/{key}{sfx}",
                torch.as_tensor(values[key]).to(dev, dtype),
                on_step=False,
                on_epoch=True,
                sync_dist=True,
                add_dataloader_idx=False,
                prog_bar="prog_bar" in self.sinks and key == self.metrics[0],
            )

    def _record(self, stage: str, trainer: Trainer, idx: int, **values: Any) -> dict[str, Any]:
        """Append one epoch's record to :attr:`history` and return it."""
        entry = {
            "stage": stage,
            "dataloader_idx": idx,
            "epoch": int(trainer.current_epoch),
            "step": int(trainer.global_step),
            **values,
        }
        self.history.append(entry)
        return entry
