"""Tiny Lightning pieces shared by the callback tests (a module, not a conftest, so that
``ddp_spawn`` children can unpickle the classes by reference)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from torchcal.scaling import TemperatureScaler

N_FEATURES = 8
N_CLASSES = 3

QUIET = (
    r".*LeafSpec.*",
    r".*does not have many workers.*",
    r".*smaller than the logging interval.*",
    r".*sync_dist=True.*",
    r".*GPU available but not used.*",
    r".*predict_dataloader.*",
)


def quiet_warnings() -> None:
    """Lightning noise that says nothing about the code under test (the LeafSpec
    FutureWarning of torch 2.13 + lightning 2.6, worker-count hints)."""
    for pat in QUIET:
        warnings.filterwarnings("ignore", message=pat)


@contextmanager
def info_log(caplog: Any) -> Iterator[Any]:
    """Capture what ``rank_zero_info`` logs (``verbose=True``): Lightning's own logger does
    not propagate to the root logger that ``caplog`` listens on."""
    lg = logging.getLogger("lightning.pytorch")
    old = lg.propagate
    lg.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
            yield caplog
    finally:
        lg.propagate = old


def make_data(
    n: int, seed: int, *, binary: bool = False, groups: int = 0, n_classes: int = N_CLASSES
) -> TensorDataset:
    """Noisy linear classes; with ``groups`` a third tensor of group ids."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, N_FEATURES, generator=g)
    w = torch.randn(
        N_FEATURES, 1 if binary else n_classes, generator=torch.Generator().manual_seed(1234)
    )
    z = x @ w + 1.5 * torch.randn(n, w.shape[1], generator=g)
    y = (z[:, 0] > 0).float() if binary else z.argmax(1)
    if groups:
        gid = torch.randint(0, groups, (n,), generator=g)
        return TensorDataset(x, y, gid)
    return TensorDataset(x, y)


def loader(ds: TensorDataset, batch_size: int = 32) -> DataLoader:
    return DataLoader(ds, batch_size=batch_size, shuffle=False)


class TinyModule(L.LightningModule):
    """Linear classifier whose validation/test steps return ``{"logits", "target"[, "group"]}``."""

    def __init__(
        self,
        binary: bool = False,
        n_classes: int = N_CLASSES,
        lr: float = 0.5,
        mask_last: bool = False,
        returns: str = "dict",
        scale: float = 1.0,
        scaler: bool = True,
    ) -> None:
        super().__init__()
        if scaler:  # the documented pattern: the module declares its temperature scaler
            self.temperature_scaler = TemperatureScaler()
        self.scale = scale
        self.binary = binary
        self.mask_last = mask_last
        self.returns = returns
        self.lr = lr
        self.net = torch.nn.Linear(N_FEATURES, 1 if binary else n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.scale * self.net(x)
        if self.binary:
            return z.squeeze(-1)
        if self.mask_last:  # a masked class, as in filtered link prediction
            z = torch.cat([z[:, :-1], torch.full_like(z[:, -1:], -float("inf"))], 1)
        return z

    def loss(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.binary:
            return F.binary_cross_entropy_with_logits(z, y)
        return F.cross_entropy(z, y)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch[0], batch[1]
        return self.loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        x, y = batch[0], batch[1]
        z = self(x)
        if self.returns == "none":
            return None
        if self.returns == "loss":
            return {"loss": self.loss(z, y)}
        out = {"logits": z, "target": y}
        if len(batch) > 2:
            out["group"] = batch[2]
        return out

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self.validation_step(batch, batch_idx, dataloader_idx)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        z = self(batch[0])
        scaler = getattr(self, "temperature_scaler", None)
        return z if scaler is None else scaler(z)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class LocScaleNet(L.LightningModule):
    """A (loc, scale) network on one feature trained with the Gaussian NLL; the regression
    monitor tests subclass it with their validation steps (``seen`` collects each epoch's
    outputs, ``trained`` counts training steps)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 2)
        self.seen: dict[int, list[dict[str, torch.Tensor]]] = {}
        self.trained = 0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, raw = self.net(x).unbind(-1)
        return loc, F.softplus(raw) + 0.05

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.trained += 1
        loc, scale = self(batch[0])
        return F.gaussian_nll_loss(loc, batch[1], scale**2)

    def on_validation_epoch_start(self) -> None:
        self.seen = {}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.05)


def trainer(tmp_path: Any, **kw: Any) -> L.Trainer:
    """A fast single-process CPU trainer."""
    opts: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        log_every_n_steps=1,
    )
    opts.update(kw)
    return L.Trainer(**opts)


def validate(tmp_path: Any, callback: L.Callback, model: Any, data: TensorDataset) -> Any:
    """One ``validate`` of ``model`` on ``data`` with ``callback`` (a :func:`trainer`): the
    logged metrics of the loader."""
    return trainer(tmp_path, callbacks=[callback]).validate(model, loader(data), verbose=False)[0]


class TemperatureRecorder(L.Callback):
    """Writes each rank's fitted temperature to ``<dirpath>/T_rank<r>.txt`` at fit end (runs
    after TemperatureScaling when listed after it)."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        t = pl_module.temperature_scaler.temperature
        with open(f"{self.dirpath}/T_rank{trainer.global_rank}.txt", "w") as fh:
            fh.write(repr(t))
        # and the ECEs the TemperatureScaling callback logged, per fit (ece_rank<r>.txt)
        from torchcal.callbacks import TemperatureScaling

        ts = next(c for c in trainer.callbacks if isinstance(c, TemperatureScaling))
        with open(f"{self.dirpath}/ece_rank{trainer.global_rank}.txt", "w") as fh:
            for h in ts.history:
                fh.write(f"{h['ece_before_scaling']!r} {h['ece_after_scaling']!r}\n")
        # and the refinement NLL and calibration gap it logged, per fit (ref_rank<r>.txt)
        with open(f"{self.dirpath}/ref_rank{trainer.global_rank}.txt", "w") as fh:
            for h in ts.history:
                fh.write(f"{h['refinement_nll']!r} {h['calibration_gap']!r}\n")


class RankShard(torch.utils.data.IterableDataset):
    """An uneven per-rank shard: every sample on the ranks in ``ranks`` (rank 0 by default),
    none on the others (Lightning cannot know its length, so an empty rank still runs the
    validation loop, with no batch)."""

    def __init__(self, ds: TensorDataset, ranks: tuple[int, ...] = (0,)) -> None:
        self.ds = ds
        self.ranks = ranks

    def __iter__(self) -> Any:
        dist = torch.distributed
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if rank in self.ranks:
            yield from (self.ds[i] for i in range(len(self.ds)))


def checkpointed_fit(
    tmp: Any, make_model: Any, callback: Any, data: tuple[Any, Any], sanity: int, **ckpt: Any
) -> dict[str, Any]:
    """The module fixture of the monitor tests: seed 0, ``make_model()``, then two epochs of
    :func:`trainer` with the monitor ``callback`` and ``ModelCheckpoint(dirpath=tmp / "ckpt",
    **ckpt)``, CSV and TensorBoard loggers under ``tmp``, ``sanity`` sanity-check batches and
    ``data = (train, val)`` loaders. Returns tmp, trainer, model, monitor, ckpt, csv and tb."""
    quiet_warnings()
    csv_logger = CSVLogger(str(tmp), name="csv")
    tb_logger = TensorBoardLogger(str(tmp), name="tb")
    checkpoint = ModelCheckpoint(dirpath=str(tmp / "ckpt"), **ckpt)
    torch.manual_seed(0)
    model = make_model()
    tr = trainer(
        tmp,
        max_epochs=2,
        logger=[csv_logger, tb_logger],
        callbacks=[callback, checkpoint],
        enable_checkpointing=True,
        num_sanity_val_steps=sanity,
    )
    tr.fit(model, *data)
    loggers = dict(csv=csv_logger, tb=tb_logger)
    return dict(tmp=tmp, trainer=tr, model=model, monitor=callback, ckpt=checkpoint, **loggers)


class WarningRecorder(L.Callback):
    """Appends every warning of this process to ``<dirpath>/warnings_rank<r>.txt`` (the
    ``ddp_spawn`` children's warnings never reach pytest)."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        path = f"{self.dirpath}/warnings_rank{trainer.global_rank}.txt"
        warnings.simplefilter("always")

        def show(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
            with open(path, "a") as fh:
                fh.write(f"{category.__name__}: {message}\n")

        warnings.showwarning = show
