"""Two CPU processes (``ddp_spawn``, gloo) against one process on the same data: the same
reliability CSV, the same temperature on every rank and as in one process, also when one
rank has no validation batch."""

from __future__ import annotations

import csv
import os

import lightning as L
import pytest
import torch
from _callbacks_helpers import (
    RankShard,
    TemperatureRecorder,
    TinyModule,
    WarningRecorder,
    loader,
    make_data,
    quiet_warnings,
)
from lightning.pytorch.loggers import CSVLogger

from torchcal.callbacks import CalibrationMonitor, TemperatureScaling

N_TRAIN, N_VAL = 256, 200


def run(tmp, name: str, *, empty_rank: bool = False, **kw) -> str:
    """Two fits on the same data, in one process or (``devices=2``) under DDP. With
    ``empty_rank`` one validation shard holds every sample (under DDP rank 1 gets no
    validation batch) and each rank's warnings are written to a file."""
    torch.manual_seed(0)
    model = TinyModule(lr=0.0, scale=3.0)  # lr 0: identical weights whatever the sharding
    out = tmp / name
    out.mkdir()
    callbacks = [
        CalibrationMonitor(n_bins=10),
        TemperatureScaling(n_bins=10),
        TemperatureRecorder(str(out)),
    ]
    if empty_rank:
        callbacks.append(WarningRecorder(str(out)))
        val = torch.utils.data.DataLoader(RankShard(make_data(N_VAL, 2)), batch_size=32)
    else:
        val = loader(make_data(N_VAL, 2), 32)
    tr = L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        default_root_dir=str(out),
        logger=CSVLogger(str(out), name="logs", version=0),
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        **kw,
    )
    batch = 64 if kw.get("devices", 1) == 1 else 32  # the same number of steps per epoch
    tr.fit(model, loader(make_data(N_TRAIN, 1), batch), val)
    return str(out)


def temperatures(single: str, ddp: str) -> tuple[float, float, float]:
    """The fitted T of DDP rank 0, of DDP rank 1 and of the one process."""
    paths = ((ddp, "T_rank0.txt"), (ddp, "T_rank1.txt"), (single, "T_rank0.txt"))
    t0, t1, t_single = (float(open(os.path.join(*p)).read()) for p in paths)
    return t0, t1, t_single


def read(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def eces(out: str, rank: int) -> list[float]:
    """The (before, after) ECEs TemperatureScaling logged on ``rank``, fit after fit."""
    with open(os.path.join(out, f"ece_rank{rank}.txt")) as fh:
        return [float(v) for line in fh for v in line.split()]


def check_eces(single: str, ddp: str) -> None:
    """The logged ECE comes from the CalibrationError metric's own DDP sync: the same on
    every rank, and that of one process on all the data (to float64 rounding: the per-rank
    sums are added in another order)."""
    e0, e1, e_single = eces(ddp, 0), eces(ddp, 1), eces(single, 0)
    assert e0 == e1 and len(e0) == len(e_single) == 4  # two fits, before and after
    assert e0 == pytest.approx(e_single, rel=1e-12, abs=1e-15)
    assert e0[1] < e0[0]  # T lowered the ECE
    # the refinement NLL and the calibration gap come from the all-reduced sums of the fit
    r0, r1, r_single = (
        [float(v) for line in open(os.path.join(out, f"ref_rank{r}.txt")) for v in line.split()]
        for out, r in ((ddp, 0), (ddp, 1), (single, 0))
    )
    assert r0 == r1 and len(r0) == 4
    assert r0 == pytest.approx(r_single, rel=1e-9)


@pytest.mark.ddp
def test_ddp_spawn_matches_single_process(tmp_path):
    quiet_warnings()
    single = run(tmp_path, "single", devices=1)
    ddp = run(tmp_path, "ddp", devices=2, strategy="ddp_spawn")
    a = read(os.path.join(single, "logs", "version_0", "reliability.csv"))
    b = read(os.path.join(ddp, "logs", "version_0", "reliability.csv"))
    assert len(a) == len(b) > 0
    for ra, rb in zip(a, b):
        assert list(ra) == list(rb)
        for col in ("epoch", "step", "bin", "count"):
            assert ra[col] == rb[col]
        for col in ("lo", "hi", "conf", "acc", "gap", "ci_low", "ci_high"):
            # float64 sums merged in another order: equal to rounding
            assert float(ra[col]) == pytest.approx(float(rb[col]), rel=1e-12, abs=1e-15)
    for e in (0, 1):
        assert sum(int(r["count"]) for r in b if r["epoch"] == str(e)) == N_VAL
    t0, t1, t_single = temperatures(single, ddp)
    assert t0 == t1  # the same T on every rank
    assert t0 == pytest.approx(t_single, rel=1e-9)
    assert t0 > 1.5
    check_eces(single, ddp)


@pytest.mark.ddp
def test_ddp_rank_without_validation_batch(tmp_path):
    """Rank 1 has no validation batch: the job finishes (no IndexError, no hang), rank 1
    warns, and every rank gets the T of one process on all the data."""
    quiet_warnings()
    single = run(tmp_path, "single", empty_rank=True, devices=1)
    ddp = run(tmp_path, "ddp", empty_rank=True, devices=2, strategy="ddp_spawn")
    t0, t1, t_single = temperatures(single, ddp)
    assert t0 == t1  # the same T on every rank
    assert t0 == pytest.approx(t_single, rel=1e-12)  # rank 1 added zero sums
    assert t0 > 1.5
    check_eces(single, ddp)  # rank 1 computes its metric before any update: zero counts
    warned = open(os.path.join(ddp, "warnings_rank1.txt")).read()
    assert "TemperatureScaling: rank 1 had no batch of validation dataloader 0" in warned
    rank0 = open(os.path.join(ddp, "warnings_rank0.txt")).read()
    assert "had no batch" not in rank0
    rows = read(os.path.join(ddp, "logs", "version_0", "reliability.csv"))
    for e in (0, 1):  # the monitor's table pools both ranks: every sample, once
        assert sum(int(r["count"]) for r in rows if r["epoch"] == str(e)) == N_VAL
