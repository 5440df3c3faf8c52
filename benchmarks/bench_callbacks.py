"""Overhead of ``CalibrationMonitor`` on a validation epoch whose forward pass dominates.

Times ``trainer.validate`` epochs (from ``on_validation_epoch_start`` to ``on_validation_end``,
so the monitor's epoch-end work, logging included, is inside) of an MLP classifier, without
any callback, with ``CalibrationMonitor`` (CSV only; and with a TensorBoard logger, which adds
the markdown table and the rendered diagram), and with the usual peer practice: torchmetrics'
``MulticlassCalibrationError`` updated from the same outputs in a callback. Runs are
interleaved, the median of ``--repeats`` epochs is reported, and the RATIO to the bare epoch
(the machine is shared; quote ratios, not seconds).

    python benchmarks/bench_callbacks.py            # ~1-2 minutes on 2 CPU cores
    python benchmarks/bench_callbacks.py --repeats 3 --n 2048   # quicker
    python benchmarks/bench_callbacks.py --threads 2            # all cores
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchcal.callbacks import CalibrationMonitor


class MLP(L.LightningModule):
    def __init__(self, d_in: int, width: int, classes: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(d_in, width),
            torch.nn.GELU(),
            torch.nn.Linear(width, width),
            torch.nn.GELU(),
            torch.nn.Linear(width, width),
            torch.nn.GELU(),
            torch.nn.Linear(width, classes),
        )

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        return {"logits": self.net(x), "target": y}


class Timer(L.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []
        self.hook_fractions: list[float] = []
        self.batch_fractions: list[float] = []  # per-batch hooks only
        self.end_seconds: list[float] = []  # epoch start + end hooks (fixed per epoch)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._t0 = time.perf_counter()
        self._mon = [c for c in trainer.callbacks if isinstance(c, TimedMonitor)]
        for m in self._mon:
            m.hook_time = 0.0
            m.batch_time = 0.0

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        dt = time.perf_counter() - self._t0
        self.times.append(dt)
        for m in self._mon:
            self.hook_fractions.append(m.hook_time / dt)
            self.batch_fractions.append(m.batch_time / dt)
            self.end_seconds.append(m.hook_time - m.batch_time)


class TimedMonitor(CalibrationMonitor):
    """CalibrationMonitor with a stopwatch around each of its hooks (the in-hook time is
    robust to the noise of a shared machine, unlike differences of epoch times)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hook_time = 0.0
        self.batch_time = 0.0

    def _timed(self, name: str, *args: Any, **kwargs: Any) -> None:
        t0 = time.perf_counter()
        getattr(super(), name)(*args, **kwargs)
        dt = time.perf_counter() - t0
        self.hook_time += dt
        if name == "on_validation_batch_end":
            self.batch_time += dt

    def on_validation_epoch_start(self, *args: Any, **kwargs: Any) -> None:
        self._timed("on_validation_epoch_start", *args, **kwargs)

    def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self._timed("on_validation_batch_end", *args, **kwargs)

    def on_validation_epoch_end(self, *args: Any, **kwargs: Any) -> None:
        self._timed("on_validation_epoch_end", *args, **kwargs)


class TorchmetricsECE(L.Callback):
    """The peer practice: a torchmetrics calibration metric fed from the step outputs."""

    def __init__(self, classes: int, n_bins: int) -> None:
        from torchmetrics.classification import MulticlassCalibrationError

        self.metric = MulticlassCalibrationError(num_classes=classes, n_bins=n_bins)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.metric = self.metric.to(pl_module.device)
        self.metric.reset()

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: Any,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.metric.update(outputs["logits"], outputs["target"])

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        pl_module.log("val/tm_ece", self.metric.compute(), sync_dist=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="validation samples")
    ap.add_argument("--width", type=int, default=1536)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on an oversubscribed machine, "
        "multi-threaded small ops stall on OpenMP barriers for milliseconds, "
        "which measures the machine, not the code)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    d_in = 512
    data = TensorDataset(torch.randn(args.n, d_in), torch.randint(0, args.classes, (args.n,)))
    dl = DataLoader(data, batch_size=args.batch)
    model = MLP(d_in, args.width, args.classes)
    tmp = tempfile.mkdtemp()

    def make(name: str) -> tuple[L.Trainer, Timer]:
        timer = Timer()
        cbs: list[L.Callback] = [timer]
        logger: Any = False
        if name.startswith("monitor"):
            cbs.append(TimedMonitor(n_bins=15))
        if name == "monitor+tensorboard":
            from lightning.pytorch.loggers import TensorBoardLogger

            logger = TensorBoardLogger(tmp, name="tb")
        if name == "torchmetrics":
            cbs.append(TorchmetricsECE(args.classes, 15))
        tr = L.Trainer(
            accelerator="cpu",
            devices=1,
            logger=logger,
            callbacks=cbs,
            default_root_dir=tmp,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
        )
        return tr, timer

    cases = ["bare", "monitor", "torchmetrics", "monitor+tensorboard"]
    runs = {c: make(c) for c in cases}
    for c in cases:  # warm-up (allocations, first-call costs)
        runs[c][0].validate(model, dl, verbose=False)
        runs[c][1].times.clear()
        runs[c][1].hook_fractions.clear()
    for _ in range(args.repeats):
        for c in cases:
            runs[c][0].validate(model, dl, verbose=False)
    med = {c: statistics.median(runs[c][1].times) for c in cases}
    print(
        f"validation epoch: N={args.n}, MLP 512-{args.width}x3-{args.classes}, batch "
        f"{args.batch}, median of {args.repeats} epochs (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)"
    )
    print(f"{'case':<22}{'epoch s':>10}{'ratio to bare':>16}{'overhead':>11}")
    for c in cases:
        print(
            f"{c:<22}{med[c]:>10.3f}{med[c] / med['bare']:>16.3f}"
            f"{100 * (med[c] / med['bare'] - 1):>10.1f}%"
        )
    for c in ("monitor", "monitor+tensorboard"):
        t = runs[c][1]
        frac = statistics.median(t.hook_fractions)
        end = statistics.median(t.end_seconds)
        print(
            f"{c}: time inside the monitor's hooks = {100 * frac:.2f}% of the epoch "
            f"(median; the robust number on a noisy machine): per-batch updates "
            f"{100 * statistics.median(t.batch_fractions):.2f}% (scales with the epoch), "
            f"epoch-end work {end * 1e3:.1f} ms (fixed per epoch: under 5% once an epoch "
            f"takes over {end / 0.05:.2f} s)"
        )
    print(
        f"monitor vs torchmetrics MulticlassCalibrationError callback (peer): "
        f"{(med['monitor'] - med['bare']) * 1e3:.1f} ms vs "
        f"{(med['torchmetrics'] - med['bare']) * 1e3:.1f} ms of extra time per epoch"
    )


if __name__ == "__main__":
    main()
