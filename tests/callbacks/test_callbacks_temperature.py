"""TemperatureScaling: the fitted T, logging, checkpoints, predict, validate, masks, errors."""

from __future__ import annotations

import csv
import math
import os
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _callbacks_helpers import TinyModule, loader, make_data, quiet_warnings, trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from torchcal.callbacks import CalibrationMonitor, TemperatureScaling
from torchcal.functional import calibration as C
from torchcal.scaling import TemperatureScaler


@pytest.fixture(autouse=True)
def _quiet():
    quiet_warnings()
    warnings.filterwarnings("ignore", message=r".*callbacks used to create the checkpoint.*")


def val_logits(model: TinyModule, ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = [(model(b[0]), b[1]) for b in loader(ds)]
    return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])


def brent_temperature(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Independent reference: scipy's bounded Brent on log T, float64 NLL."""
    from scipy.optimize import minimize_scalar

    z = logits.double()

    def nll(log_t: float) -> float:
        zt = z / math.exp(log_t)
        if z.dim() == 1:
            return float(F.binary_cross_entropy_with_logits(zt, y.double()))
        return float(F.cross_entropy(zt, y))

    r = minimize_scalar(nll, bounds=(-5, 5), method="bounded", options={"xatol": 1e-10})
    return math.exp(r.x)


class LoadsTemperature(TinyModule):
    """A module that restores the temperature in ``load_from_checkpoint``."""

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        TemperatureScaling.attach(self, checkpoint)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    quiet_warnings()
    tmp = tmp_path_factory.mktemp("ts")
    torch.manual_seed(0)
    train, val = make_data(256, 1), make_data(200, 2)
    ts = TemperatureScaling(n_bins=10)
    model = LoadsTemperature(scale=4.0)  # overconfident: T > 1
    tr = trainer(tmp, max_epochs=2, callbacks=[CalibrationMonitor(write_csv=False), ts],
                 logger=CSVLogger(str(tmp)))
    tr.fit(model, loader(train), loader(val))
    path = str(tmp / "calibrated.ckpt")
    tr.save_checkpoint(path)
    return dict(tmp=tmp, trainer=tr, model=model, ts=ts, val=val, train=train, path=path)


def test_fit_end_temperature_matches_reference(fitted):
    model, ts = fitted["model"], fitted["ts"]
    scaler = model.temperature_scaler
    assert isinstance(scaler, TemperatureScaler) and scaler.is_fitted
    logits, y = val_logits(model, fitted["val"])
    t_ref = TemperatureScaler().fit(logits, y).temperature
    assert scaler.temperature == pytest.approx(t_ref, rel=1e-9)
    assert scaler.temperature == pytest.approx(brent_temperature(logits, y), rel=1e-6)
    assert scaler.temperature > 1.5
    h = ts.history[-1]
    assert len(ts.history) == 1 and h["epoch"] == 1 and h["converged"]
    assert h["nll_before_scaling"] == pytest.approx(float(F.cross_entropy(logits.double(), y)),
                                                    rel=1e-6)
    assert h["nll_after_scaling"] < h["nll_before_scaling"]
    assert h["ece_before_scaling"] == pytest.approx(float(C.calibration_error(
        logits, y, n_bins=10)), abs=1e-9)
    assert h["ece_after_scaling"] == pytest.approx(float(C.calibration_error(
        scaler(logits), y, n_bins=10)), abs=1e-9)
    assert h["ece_after_scaling"] < h["ece_before_scaling"]
    # the training optimiser never touched the temperature
    assert not scaler.log_temperature.requires_grad


def test_fit_end_values_reach_loggers_and_callback_metrics(fitted):
    cm = fitted["trainer"].callback_metrics
    t = fitted["model"].temperature_scaler.temperature
    assert float(cm["val/temperature"]) == t
    rows = list(csv.DictReader(open(os.path.join(fitted["trainer"].loggers[0].log_dir,
                                                 "metrics.csv"))))
    logged = [float(r["val/temperature"]) for r in rows if r.get("val/temperature")]
    assert logged == [pytest.approx(t, rel=1e-12)]
    assert any(r.get("val/ece_after_scaling") for r in rows)


def test_checkpoint_restores_identical_predictions(fitted, tmp_path):
    model, path = fitted["model"], fitted["path"]
    x = fitted["val"].tensors[0]
    pred_loader = loader(torch.utils.data.TensorDataset(x))
    with torch.no_grad():  # the same batches as predict (float32 results depend on them)
        ref = torch.cat([model.temperature_scaler(model(b[0])) for b in pred_loader])
    # 1) Trainer with the callback: a fresh module gets the scaler before the weights load
    fresh = TinyModule(scale=4.0)
    assert not hasattr(fresh, "temperature_scaler")
    out = trainer(tmp_path, callbacks=[TemperatureScaling()]).predict(
        fresh, pred_loader, ckpt_path=path)
    assert torch.equal(torch.cat(out), ref)
    assert fresh.temperature_scaler.temperature == model.temperature_scaler.temperature
    # 2) load_from_checkpoint with the module's on_load_checkpoint hook
    loaded = LoadsTemperature.load_from_checkpoint(path, weights_only=True, scale=4.0)
    with torch.no_grad():
        assert torch.equal(torch.cat([loaded.temperature_scaler(loaded(b[0]))
                                      for b in pred_loader]), ref)
    # 2b) validate a calibrated checkpoint without refitting it
    kept = TinyModule(scale=4.0)
    ts = TemperatureScaling(fit_on_validate=False)
    out = trainer(tmp_path, callbacks=[ts]).validate(kept, loader(fitted["val"]),
                                                     ckpt_path=path, verbose=False)[0]
    assert "val/temperature" not in out and ts.history == fitted["ts"].history  # restored
    assert kept.temperature_scaler.temperature == model.temperature_scaler.temperature
    # 3) the scaler alone
    alone = TemperatureScaling.load_scaler(path)
    assert alone.temperature == model.temperature_scaler.temperature and alone.is_fitted
    with torch.no_grad():
        assert torch.equal(torch.cat([alone(model(b[0])) for b in pred_loader]), ref)


def test_resume_keeps_history(fitted, tmp_path):
    ts = TemperatureScaling(n_bins=10)
    tr = trainer(tmp_path, max_epochs=3, callbacks=[ts])
    tr.fit(TinyModule(scale=4.0), loader(fitted["train"]), loader(fitted["val"]),
           ckpt_path=fitted["path"])
    assert len(ts.history) == 2 and ts.history[0] == fitted["ts"].history[0]
    assert ts.history[1]["epoch"] == 2


def test_every_epoch_checkpoints_carry_their_temperature(tmp_path):
    train, val = make_data(128, 3), make_data(96, 4)
    ts = TemperatureScaling(when="epoch")
    ck = ModelCheckpoint(dirpath=str(tmp_path / "ck"), every_n_epochs=1, save_top_k=-1,
                         monitor="val/temperature", filename="{epoch}")
    tr = trainer(tmp_path, max_epochs=2, callbacks=[ts, ck], enable_checkpointing=True)
    tr.fit(TinyModule(scale=3.0), loader(train), loader(val))
    assert [h["epoch"] for h in ts.history] == [0, 1]
    for h in ts.history:
        state = torch.load(str(tmp_path / "ck" / f"epoch={h['epoch']}.ckpt"),
                           weights_only=True)["state_dict"]
        assert bool(state["temperature_scaler.fitted"])
        assert math.exp(float(state["temperature_scaler.log_temperature"])) == pytest.approx(
            h["temperature"], rel=1e-12)
    assert float(tr.callback_metrics["val/temperature"]) == ts.history[-1]["temperature"]


def test_validate_inference_mode_and_masks(tmp_path, capsys):
    # 4 outputs, the last masked with -inf; targets only in the first 3 classes
    val = make_data(120, 5, n_classes=3)
    model = TinyModule(n_classes=4, mask_last=True, scale=3.0)
    ts = TemperatureScaling(verbose=True)
    out = trainer(tmp_path, callbacks=[ts]).validate(model, loader(val), verbose=False)[0]
    logits, y = val_logits(model, val)
    assert torch.isinf(logits[:, -1]).all()
    assert out["val/temperature"] == pytest.approx(brent_temperature(logits[:, :3], y),
                                                   rel=1e-6)
    assert out["val/nll_after_scaling"] <= out["val/nll_before_scaling"]
    assert math.isfinite(out["val/ece_after_scaling"])
    printed = capsys.readouterr().out
    assert (f"[TemperatureScaling] epoch 0: T = {out['val/temperature']:.4f}; NLL "
            f"{out['val/nll_before_scaling']:.4f} -> {out['val/nll_after_scaling']:.4f}; "
            f"ECE (15 bins) {out['val/ece_before_scaling']:.4f} -> ") in printed


def test_kept_logits_are_detached(tmp_path):
    class GradLogits(TinyModule):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            with torch.enable_grad():  # outside inference mode: logits that carry a graph
                return {"logits": self(batch[0]), "target": batch[1]}

    ts = TemperatureScaling()
    trainer(tmp_path, callbacks=[ts], inference_mode=False).validate(
        GradLogits(), loader(make_data(64, 0)), verbose=False)
    assert len(ts._chunks) == 2
    assert not any(z.requires_grad for z, _ in ts._chunks)


def test_binary_logits(tmp_path):
    val = make_data(150, 6, binary=True)
    model = TinyModule(binary=True, scale=0.3)  # underconfident: T < 1
    out = trainer(tmp_path, callbacks=[TemperatureScaling()]).validate(
        model, loader(val), verbose=False)[0]
    logits, y = val_logits(model, val)
    assert out["val/temperature"] == pytest.approx(brent_temperature(logits, y), rel=1e-6)
    assert out["val/temperature"] < 1


def test_checkpoint_without_temperature_loads_unfitted(tmp_path):
    tr = trainer(tmp_path, max_epochs=1)
    tr.fit(TinyModule(), loader(make_data(64, 1)), loader(make_data(32, 2)))
    path = str(tmp_path / "plain.ckpt")
    tr.save_checkpoint(path)
    fresh = TinyModule()
    out = trainer(tmp_path, callbacks=[TemperatureScaling()]).validate(
        fresh, loader(make_data(64, 2)), ckpt_path=path, verbose=False)[0]
    assert fresh.temperature_scaler.is_fitted and out["val/temperature"] > 0
    with pytest.raises(ValueError, match="temperature_scaler"):
        TemperatureScaling.load_scaler(path)


def test_missing_outputs_error(tmp_path):
    with pytest.raises(ValueError, match=r"'logits', 'target'.*returned None"):
        trainer(tmp_path, callbacks=[TemperatureScaling()]).validate(
            TinyModule(returns="none"), loader(make_data(32, 0)), verbose=False)


def test_attr_name_clash(tmp_path):
    model = TinyModule()
    model.temperature_scaler = torch.nn.Identity()
    with pytest.raises(ValueError, match="attr_name"):
        trainer(tmp_path, callbacks=[TemperatureScaling()]).validate(
            model, loader(make_data(32, 0)), verbose=False)


@pytest.mark.parametrize("kwargs, match", [
    (dict(when="always"), "when"),
    (dict(method="adam"), "method"),
    (dict(logits_key=""), "logits_key"),
    (dict(attr_name="a b"), "attr_name"),
    (dict(n_bins=0), "n_bins"),
    (dict(dataloader_idx=-1), "dataloader_idx"),
    (dict(bounds=(2.0, 1.0)), "bounds"),
    (dict(bounds=(0.0, 1.0)), "bounds"),
    (dict(bounds="x"), "bounds"),
    (dict(extract_fn=3), "extract_fn"),
])
def test_init_validation(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        TemperatureScaling(**kwargs)


def test_state_key_and_overrides():
    assert TemperatureScaling().state_key != TemperatureScaling(when="epoch").state_key
    assert TemperatureScaling().state_key != TemperatureScaling(attr_name="t2").state_key
    for name, fn in vars(TemperatureScaling).items():
        if name.startswith("on_") or name in ("setup", "state_dict", "load_state_dict"):
            assert getattr(fn, "__override__", False), name
