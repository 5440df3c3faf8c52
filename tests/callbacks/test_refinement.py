"""Refine, then calibrate: ``TemperatureScaling`` logs ``val/refinement_nll`` (the validation
NLL after the fitted T) and ``val/calibration_gap``, and ``ModelCheckpoint`` /
``EarlyStopping`` select on them in a real ``Trainer.fit``."""

from __future__ import annotations

import csv
import os
import warnings
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from _callbacks_helpers import TinyModule, loader, make_data, quiet_warnings, trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from torchcal.callbacks import CalibrationMonitor, TemperatureScaling

EPOCHS = 6


@pytest.fixture(autouse=True)
def _quiet():
    quiet_warnings()
    warnings.filterwarnings("ignore", message=r".*callbacks used to create the checkpoint.*")
    warnings.filterwarnings("ignore", message=r".*exists and is not empty.*")


def _fit(tmp: Any, callbacks: list[Any], **kw: Any) -> TinyModule:
    """24 training rows at a high learning rate: the linear model over-fits, so the raw
    validation NLL is lowest at epoch 0 and the NLL after T at a later epoch."""
    torch.manual_seed(0)
    model = TinyModule(lr=2.0, scale=1.0)
    tr = trainer(tmp, max_epochs=EPOCHS, callbacks=callbacks, **kw)
    tr.fit(model, loader(make_data(24, 1), 8), loader(make_data(400, 2), 100))
    return model


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    quiet_warnings()
    tmp = tmp_path_factory.mktemp("refine")
    ts = TemperatureScaling()
    by_ref = ModelCheckpoint(dirpath=str(tmp / "ref"), monitor="val/refinement_nll", mode="min")
    by_nll = ModelCheckpoint(dirpath=str(tmp / "nll"), monitor="val/nll", mode="min")
    callbacks = [CalibrationMonitor(sinks=()), ts, by_ref, by_nll]
    model = _fit(tmp, callbacks, enable_checkpointing=True, logger=CSVLogger(str(tmp), version=0))
    # a copy: a later trainer.test(ckpt_path=...) restores the callbacks' checkpointed state
    hist = [dict(h) for h in ts.history]
    return dict(tmp=tmp, hist=hist, by_ref=by_ref, by_nll=by_nll, model=model)


def _nll_after(model: TinyModule, ds: TensorDataset) -> float:
    with torch.no_grad():
        z = model.temperature_scaler(model(ds.tensors[0]).double())
    return float(F.cross_entropy(z, ds.tensors[1]))


def test_logged_values_are_the_fits_own(run):
    hist = run["hist"]
    assert len(hist) == EPOCHS
    for h in hist:
        assert h["refinement_nll"] == h["nll_after_scaling"]  # the fit's own sums, no new pass
        assert h["calibration_gap"] == h["nll_before_scaling"] - h["nll_after_scaling"]
        assert h["calibration_gap"] >= 0
    path = os.path.join(str(run["tmp"]), "lightning_logs", "version_0", "metrics.csv")
    with open(path, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("val/refinement_nll")]
    assert [int(r["epoch"]) for r in rows] == [h["epoch"] for h in hist]
    for r, h in zip(rows, hist):
        assert float(r["val/refinement_nll"]) == pytest.approx(h["refinement_nll"], rel=1e-12)
        assert float(r["val/calibration_gap"]) == pytest.approx(h["calibration_gap"], rel=1e-9)


def test_best_checkpoint_is_the_epoch_of_lowest_refinement_nll(run):
    hist, by_ref, by_nll = run["hist"], run["by_ref"], run["by_nll"]
    refinement = [h["refinement_nll"] for h in hist]
    best = min(range(len(hist)), key=refinement.__getitem__)
    assert 0 < best < EPOCHS - 1  # neither the first epoch nor the last: a real choice
    ckpt = torch.load(by_ref.best_model_path, map_location="cpu", weights_only=True)
    assert ckpt["epoch"] == hist[best]["epoch"]
    # the score Lightning saw at the save is that epoch's value, not a neighbour's
    assert float(by_ref.best_model_score) == pytest.approx(refinement[best], rel=1e-12)
    # selecting on the raw NLL keeps another (earlier, over-confident) epoch
    assert torch.load(by_nll.best_model_path, weights_only=True)["epoch"] < ckpt["epoch"]
    loaded = TinyModule.load_from_checkpoint(by_ref.best_model_path)
    assert loaded.temperature_scaler.temperature == hist[best]["temperature"]
    val = make_data(400, 2)
    assert _nll_after(loaded, val) == pytest.approx(refinement[best], rel=1e-6)


def test_test_from_best_restores_weights_and_temperature(run):
    model, hist, by_ref = run["model"], run["hist"], run["by_ref"]
    i = min(range(len(hist)), key=lambda k: hist[k]["refinement_nll"])
    best = hist[i]
    ts = TemperatureScaling()
    tr = trainer(run["tmp"], callbacks=[ts, by_ref], enable_checkpointing=True)
    tr.test(model, loader(make_data(400, 2), 100), ckpt_path="best", verbose=False)
    assert tr.ckpt_path == by_ref.best_model_path
    assert ts.history == hist[: i + 1]  # the callback's state as it was at that save
    assert model.temperature_scaler.temperature == best["temperature"]
    assert _nll_after(model, make_data(400, 2)) == pytest.approx(best["refinement_nll"], rel=1e-6)


def test_early_stopping_on_refinement_nll(run, tmp_path):
    reference = [h["refinement_nll"] for h in run["hist"]]
    best = min(range(len(reference)), key=reference.__getitem__)
    ts = TemperatureScaling()
    stop = EarlyStopping(monitor="val/refinement_nll", mode="min", patience=1)
    _fit(tmp_path, [ts, stop])
    got = [h["refinement_nll"] for h in ts.history]
    assert len(got) == best + 2  # stopped one epoch without improvement after the best
    assert got == pytest.approx(reference[: best + 2], rel=1e-12)


@pytest.mark.parametrize("monitor", ["val/refinement_nll", "val/calibration_gap"])
def test_fit_end_cannot_be_monitored(tmp_path, monitor):
    ts = TemperatureScaling(when="fit_end")
    ck = ModelCheckpoint(dirpath=str(tmp_path), monitor=monitor)
    tr = trainer(tmp_path, callbacks=[ts, ck], enable_checkpointing=True)
    with pytest.raises(ValueError, match=r"^when: ModelCheckpoint\(monitor="):
        tr.fit(TinyModule(), loader(make_data(32, 1)), loader(make_data(32, 2)))


class LogitsModule(L.LightningModule):
    """Validation batches are ``(logits, target)``: the callback sees given logits."""

    def __init__(self) -> None:
        super().__init__()
        from torchcal.scaling import TemperatureScaler

        self.temperature_scaler = TemperatureScaler()

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        return {"logits": batch[0], "target": batch[1]}


def _validate(z: torch.Tensor, y: torch.Tensor, tmp: Any) -> dict[str, float]:
    ts = TemperatureScaling(fit_on_validate=True)
    tr = trainer(tmp, callbacks=[ts])
    dl = DataLoader(TensorDataset(z, y), batch_size=2500)
    return tr.validate(LogitsModule(), dl, verbose=False)[0]


def _probmetrics_refinement(z2d: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """probmetrics' temperature-scaling refinement estimate on all rows (its
    ``MetricsWithCalibration`` with ``temp-scaling`` and ``AllSplitter``) and the
    calibration error it splits off."""
    metrics = pytest.importorskip("probmetrics.metrics")
    from probmetrics.calibrators import get_calibrator
    from probmetrics.splitters import AllSplitter

    m = metrics.MetricsWithCalibration(
        metrics.LogLoss(), get_calibrator("temp-scaling"), AllSplitter(), cal_name="ts"
    )
    out = m.compute_all_from_labels_logits(y, z2d)
    return float(out["refinement_logloss_ts_all"]), float(out["calib-err_logloss_ts_all"])


def test_refinement_equals_probmetrics_multiclass(tmp_path):
    g = torch.Generator().manual_seed(3)
    z = 3 * torch.randn(10_000, 100, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
    ref, gap = _probmetrics_refinement(z, y)
    out = _validate(z, y, tmp_path)
    assert out["val/refinement_nll"] == pytest.approx(ref, abs=1e-6)
    assert out["val/calibration_gap"] == pytest.approx(gap, abs=1e-6)
    assert gap > 0.1  # the over-confident logits leave a real calibration term


def test_refinement_equals_probmetrics_binary(tmp_path):
    g = torch.Generator().manual_seed(4)
    z = 4 * torch.randn(5_000, generator=g, dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(z / 3), generator=g)
    ref, gap = _probmetrics_refinement(torch.stack([torch.zeros_like(z), z], 1), y.long())
    out = _validate(z, y, tmp_path)
    assert out["val/refinement_nll"] == pytest.approx(ref, abs=1e-6)
    assert out["val/calibration_gap"] == pytest.approx(gap, abs=1e-6)
