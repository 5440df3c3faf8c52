"""The single-process against ``ddp_spawn`` runs of the monitor tests (a module, not a
conftest, so that the spawned children can unpickle :class:`RankSplit` by reference)."""

from __future__ import annotations

from typing import Any

import torch
from _callbacks_helpers import quiet_warnings, trainer
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import TensorDataset


class RankSplit(torch.utils.data.IterableDataset):
    """Rank 0 gets the first ``cut`` samples, rank 1 the rest (one process: all)."""

    def __init__(self, ds: TensorDataset, cut: int) -> None:
        self.ds, self.cut = ds, cut

    def __iter__(self) -> Any:
        dist = torch.distributed
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else -1
        lo, hi = {-1: (0, len(self.ds)), 0: (0, self.cut), 1: (self.cut, len(self.ds))}[rank]
        yield from (self.ds[i] for i in range(lo, hi))


def validate_logs(out: Any, make_model: Any, monitor: Any, loaders: Any, **kw: Any) -> str:
    """Seed 0, ``make_model()``, one ``validate`` with ``monitor`` and a CSV logger under
    ``out`` (``kw`` to :func:`trainer`: ``devices``, ``strategy``): the logger's folder."""
    torch.manual_seed(0)
    model = make_model()
    logger = CSVLogger(str(out), name="logs", version=0)
    trainer(out, logger=logger, callbacks=[monitor], **kw).validate(model, loaders, verbose=False)
    return str(out / "logs" / "version_0")


def single_and_ddp(tmp: Any, make_model: Any, make_monitor: Any, loaders: Any) -> tuple[str, str]:
    """:func:`validate_logs` of a fresh ``make_monitor()`` in one process (under ``tmp /
    "single"``) and on two ``ddp_spawn`` CPU processes (``tmp / "ddp"``): the two folders."""
    quiet_warnings()
    single = validate_logs(tmp / "single", make_model, make_monitor(), loaders, devices=1)
    ddp = validate_logs(
        tmp / "ddp", make_model, make_monitor(), loaders, devices=2, strategy="ddp_spawn"
    )
    return single, ddp
