"""The student network and its Lightning training: one ``Trainer.fit`` per (loss, seed), with
:class:`torchcal.callbacks.CalibrationMonitor` (validation ECE, debiased ECE, NLL, Brier,
epoch by epoch), :class:`torchcal.callbacks.TemperatureScaling` (fits the module's own
:class:`torchcal.scaling.TemperatureScaler` at every validation epoch; the last one is the
run's T) and two ``ModelCheckpoint`` callbacks: the epoch of lowest ``val/nll`` and the
epoch of lowest ``val/refinement_nll`` (the validation NLL after that epoch's own T: refine,
then calibrate), each kept with its T."""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["Pick", "Trained", "make_mlp", "train_one", "validation_interval"]

#: the checkpoint selections: name -> the monitored validation metric
SELECTIONS = {"val_nll": "val/nll", "refinement_nll": "val/refinement_nll"}


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
class Pick:
    """A checkpoint kept by one selection: its network (eval mode), the T fitted on its own
    validation logits, and its epoch."""

    net: nn.Module
    temperature: float
    epoch: int


@dataclass
class Trained:
    """A trained network (eval mode), its fitted temperature, the validation scalars of the
    monitor and of the temperature fits, epoch by epoch, and the checkpoints of
    :data:`SELECTIONS`."""

    net: nn.Module
    temperature: float
    converged: bool
    val_history: list[dict[str, Any]]
    temperature_history: list[dict[str, Any]]
    picks: dict[str, Pick]


def _pick(net: nn.Module, path: str) -> Pick:
    """The network and temperature saved in the Lightning checkpoint at ``path``."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    state = ckpt["state_dict"]
    picked = copy.deepcopy(net)
    picked.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("net.")})
    t = math.exp(float(state["temperature_scaler.log_temperature"]))
    return Pick(picked.eval(), t, int(ckpt["epoch"]))


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
    val_every: int | None = None,
    progress: bool = True,
    desc: str = "",
) -> Trained:
    """Train a fresh :func:`make_mlp` with ``objective`` under Lightning and fit its
    temperature on ``val``.

    The temperature is fitted at every validation epoch; the checkpoints of
    :data:`SELECTIONS` are kept (the validated epoch of lowest ``val/nll``, and of lowest
    ``val/refinement_nll``, each with its own T). Seeded (weights, shuffling); the command
    line's ``--model.*`` options are the keyword arguments from ``hidden`` to ``val_every``.

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
        val_every: validate (and fit T, and offer a checkpoint) every ``val_every`` epochs,
            a divisor of ``epochs`` (the last epoch is always validated); ``None``:
            :func:`validation_interval`.
        progress: Lightning's progress bar.
        desc: a label printed before the bar.
    """
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from torchcal.callbacks import CalibrationMonitor, TemperatureScaling

    for name, v, low in (
        ("hidden", hidden, 1), ("depth", depth, 0), ("epochs", epochs, 1),
        ("batch_size", batch_size, 1),
    ):  # fmt: skip
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ValueError(f"model.{name}: expected an int >= {low}, got {v!r}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"model.lr: expected a finite float > 0, got {lr!r}")
    every = validation_interval(epochs) if val_every is None else val_every
    if not isinstance(every, int) or isinstance(every, bool) or every < 1 or epochs % every:
        raise ValueError(
            f"model.val_every: expected None or an int >= 1 dividing epochs = {epochs}, "
            f"got {val_every!r}"
        )
    L.seed_everything(seed, verbose=False)
    net = make_mlp(train[0].shape[1], num_classes, hidden, depth)
    module = _module(net, objective, float(lr), float(weight_decay))
    monitor = CalibrationMonitor(n_bins=15, sinks=())
    scaling = TemperatureScaling()  # a T at every validation epoch; the last is the run's
    if progress and desc:
        print(desc, flush=True)
    with warnings.catch_warnings(), _quiet_lightning(), tempfile.TemporaryDirectory() as tmp:
        warnings.filterwarnings("ignore", message=".*(num_workers|LeafSpec|bottleneck).*")
        keep = {
            name: ModelCheckpoint(
                dirpath=f"{tmp}/{name}", monitor=metric, mode="min", save_weights_only=True
            )
            for name, metric in SELECTIONS.items()
        }
        trainer = L.Trainer(
            max_epochs=epochs,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=True,
            enable_model_summary=False,
            enable_progress_bar=progress,
            num_sanity_val_steps=0,
            check_val_every_n_epoch=every,
            deterministic=True,
            callbacks=[monitor, scaling, *keep.values()],
        )
        trainer.fit(module, *_loaders(train, val, batch_size, seed))
        picks = {name: _pick(net, ck.best_model_path) for name, ck in keep.items()}
    scaler = module.temperature_scaler
    result = scaling.result
    return Trained(
        net.eval(),
        float(scaler.temperature),
        bool(result.converged) if result is not None else False,
        list(monitor.history),
        list(scaling.history),
        picks,
    )
