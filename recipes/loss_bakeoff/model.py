"""The student network and its Lightning training: one ``Trainer.fit`` per (loss, seed), with
:class:`torchcal.callbacks.CalibrationMonitor` (validation ECE, debiased ECE, NLL, Brier,
epoch by epoch) and :class:`torchcal.callbacks.TemperatureScaling` (fits the module's own
:class:`torchcal.scaling.TemperatureScaler` on the last validation epoch's logits)."""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["Trained", "make_mlp", "train_one", "validation_interval"]


def validation_interval(epochs: int) -> int:
    """Validate every ``k`` epochs, ``k`` the largest divisor of ``epochs`` up to
    ``epochs / 4``: at least four points in the monitor's history, the last epoch always
    validated (the temperature is fitted on it).

    Example:
        >>> validation_interval(40), validation_interval(30), validation_interval(2)
        (10, 6, 1)
    """
    top = max(1, epochs // 4)
    return max(k for k in range(1, top + 1) if epochs % k == 0)


def make_mlp(dim: int, num_classes: int, hidden: int, depth: int) -> nn.Sequential:
    """``depth`` hidden ReLU layers of width ``hidden``, then a linear head (the logits).

    Example:
        >>> make_mlp(4, 3, 8, 2)(torch.zeros(5, 4)).shape
        torch.Size([5, 3])
    """
    layers: list[nn.Module] = []
    width = dim
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def _module(net: nn.Module, objective: nn.Module, lr: float, weight_decay: float) -> Any:
    import lightning as L

    from torchcal.scaling import TemperatureScaler

    class BakeoffModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.objective = net, objective
            self.temperature_scaler = TemperatureScaler()

        def forward(self, x: Tensor) -> Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            x, y = batch
            return self.objective(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
            x, y = batch
            return {"logits": self.net(x), "target": y}

        def configure_optimizers(self) -> Any:
            opt = torch.optim.AdamW(self.net.parameters(), lr=lr, weight_decay=weight_decay)
            steps = self.trainer.estimated_stepping_batches
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, steps))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return BakeoffModule()


@dataclass
class Trained:
    """A trained network (eval mode), its fitted temperature and the monitor's last
    validation scalars."""

    net: nn.Module
    temperature: float
    converged: bool
    val_history: list[dict[str, Any]]


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Lightning's per-Trainer info lines (accelerator, tips), 33 times per run, off."""
    log = logging.getLogger("lightning.pytorch")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def _loaders(
    train: tuple[Tensor, Tensor], val: tuple[Tensor, Tensor], batch_size: int, seed: int
) -> tuple[Any, Any]:
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(seed)
    tl = DataLoader(TensorDataset(*train), batch_size=batch_size, shuffle=True, generator=g)
    vl = DataLoader(TensorDataset(*val), batch_size=max(len(val[1]), 1))
    return tl, vl


def train_one(
    objective: nn.Module,
    train: tuple[Tensor, Tensor],
    val: tuple[Tensor, Tensor],
    num_classes: int,
    *,
    seed: int,
    hidden: int = 128,
    depth: int = 2,
    epochs: int = 40,
    batch_size: int = 128,
    lr: float = 2e-3,
    weight_decay: float = 0.0,
    progress: bool = True,
    desc: str = "",
) -> Trained:
    """Train a fresh :func:`make_mlp` with ``objective`` under Lightning and fit its
    temperature on ``val``. Seeded (weights, shuffling); the command line's ``--model.*``
    options are the keyword arguments from ``hidden`` to ``weight_decay``.

    Args:
        objective: the training loss ``(logits, target) -> scalar``.
        train, val: ``(x, y)`` splits.
        num_classes: number of classes.
        seed: seed of the weights and the minibatch order.
        hidden, depth: width and number of hidden layers.
        epochs: passes over the training split.
        batch_size: minibatch size.
        lr: AdamW learning rate, cosine-decayed to 0 over the run.
        weight_decay: AdamW weight decay (0: nothing holds back over-fitting).
        progress: Lightning's progress bar.
        desc: a label printed before the bar.
    """
    import lightning as L

    from torchcal.callbacks import CalibrationMonitor, TemperatureScaling

    for name, v, low in (
        ("hidden", hidden, 1), ("depth", depth, 0), ("epochs", epochs, 1),
        ("batch_size", batch_size, 1),
    ):  # fmt: skip
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ValueError(f"model.{name}: expected an int >= {low}, got {v!r}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"model.lr: expected a finite float > 0, got {lr!r}")
    L.seed_everything(seed, verbose=False)
    net = make_mlp(train[0].shape[1], num_classes, hidden, depth)
    module = _module(net, objective, float(lr), float(weight_decay))
    monitor = CalibrationMonitor(n_bins=15, sinks=())
    scaling = TemperatureScaling(when="fit_end")
    if progress and desc:
        print(desc, flush=True)
    with warnings.catch_warnings(), _quiet_lightning():
        warnings.filterwarnings("ignore", message=".*(num_workers|LeafSpec|bottleneck).*")
        trainer = L.Trainer(
            max_epochs=epochs,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=progress,
            num_sanity_val_steps=0,
            check_val_every_n_epoch=validation_interval(epochs),
            deterministic=True,
            callbacks=[monitor, scaling],
        )
        trainer.fit(module, *_loaders(train, val, batch_size, seed))
    scaler = module.temperature_scaler
    result = scaling.result
    return Trained(
        net.eval(),
        float(scaler.temperature),
        bool(result.converged) if result is not None else False,
        list(monitor.history),
    )
