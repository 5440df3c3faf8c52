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
from _callbacks_helpers import (
    TinyModule,
    info_log,
    loader,
    make_data,
    quiet_warnings,
    trainer,
    validate,
)
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from torchcal.callbacks import CalibrationMonitor, TemperatureScaling
from torchcal.functional import calibration_error
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


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    quiet_warnings()
    tmp = tmp_path_factory.mktemp("ts")
    torch.manual_seed(0)
    train, val = make_data(256, 1), make_data(200, 2)
    ts = TemperatureScaling(n_bins=10)
    model = TinyModule(scale=4.0)  # overconfident: T > 1
    tr = trainer(
        tmp,
        max_epochs=2,
        callbacks=[CalibrationMonitor(sinks=("loggers", "figures")), ts],
        logger=CSVLogger(str(tmp)),
    )
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
    # fitted at the end of every validation epoch of fit, the last on the final weights
    assert [x["epoch"] for x in ts.history] == [0, 1] and h["converged"]
    assert h["n"] == h["n_local"] == 200
    assert h["nll_before_scaling"] == pytest.approx(
        float(F.cross_entropy(logits.double(), y)), rel=1e-6
    )
    assert h["nll_after_scaling"] < h["nll_before_scaling"]
    z = logits.double()  # the logged ECEs are computed from the float64 logits
    assert h["ece_before_scaling"] == pytest.approx(
        float(calibration_error(z, y, n_bins=10)), abs=1e-12
    )
    assert h["ece_after_scaling"] == pytest.approx(
        float(calibration_error(z / scaler.temperature, y, n_bins=10)), abs=1e-12
    )
    assert h["ece_after_scaling"] < h["ece_before_scaling"]
    # the training optimiser never touched the temperature
    assert not scaler.log_temperature.requires_grad


def test_epoch_values_reach_loggers_and_callback_metrics(fitted):
    cm = fitted["trainer"].callback_metrics
    t = fitted["model"].temperature_scaler.temperature
    assert float(cm["val/temperature"]) == t
    rows = list(
        csv.DictReader(open(os.path.join(fitted["trainer"].loggers[0].log_dir, "metrics.csv")))
    )
    logged = [float(r["val/temperature"]) for r in rows if r.get("val/temperature")]
    assert logged == [pytest.approx(h["temperature"], rel=1e-12) for h in fitted["ts"].history]
    assert any(r.get("val/ece_after_scaling") for r in rows)


def test_fit_end_mode_fits_once(tmp_path):
    ts = TemperatureScaling(when="fit_end", n_bins=10)
    model = TinyModule(scale=4.0)
    tr = trainer(tmp_path, max_epochs=2, callbacks=[ts], logger=CSVLogger(str(tmp_path)))
    val = make_data(200, 2)
    tr.fit(model, loader(make_data(256, 1)), loader(val))
    assert [h["epoch"] for h in ts.history] == [1]
    logits, y = val_logits(model, val)
    assert model.temperature_scaler.temperature == pytest.approx(
        brent_temperature(logits, y), rel=1e-6
    )
    assert float(tr.callback_metrics["val/temperature"]) == ts.history[0]["temperature"]


def test_checkpoint_restores_identical_predictions(fitted, tmp_path):
    model, path = fitted["model"], fitted["path"]
    x = fitted["val"].tensors[0]
    pred_loader = loader(torch.utils.data.TensorDataset(x))
    with torch.no_grad():  # the same batches as predict (float32 results depend on them)
        ref = torch.cat([model.temperature_scaler(model(b[0])) for b in pred_loader])
    # 1) a Trainer, no callback needed: the module declares its scaler
    fresh = TinyModule(scale=4.0)
    assert not fresh.temperature_scaler.is_fitted
    out = trainer(tmp_path).predict(fresh, pred_loader, ckpt_path=path)
    assert torch.equal(torch.cat(out), ref)
    assert fresh.temperature_scaler.temperature == model.temperature_scaler.temperature
    # 2) load_from_checkpoint with no other code
    loaded = TinyModule.load_from_checkpoint(path, weights_only=True, scale=4.0)
    assert loaded.temperature_scaler.is_fitted
    with torch.no_grad():
        assert torch.equal(
            torch.cat([loaded.temperature_scaler(loaded(b[0])) for b in pred_loader]), ref
        )
    # 2b) validate a calibrated checkpoint: no refit (the default)
    kept = TinyModule(scale=4.0)
    ts = TemperatureScaling()
    out = trainer(tmp_path, callbacks=[ts]).validate(
        kept, loader(fitted["val"]), ckpt_path=path, verbose=False
    )[0]
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
    tr.fit(
        TinyModule(scale=4.0),
        loader(fitted["train"]),
        loader(fitted["val"]),
        ckpt_path=fitted["path"],
    )
    assert len(ts.history) == 3 and ts.history[:2] == fitted["ts"].history
    assert ts.history[2]["epoch"] == 2


def test_every_epoch_checkpoints_carry_their_temperature(tmp_path):
    train, val = make_data(128, 3), make_data(96, 4)
    ts = TemperatureScaling()  # when="epoch", the default
    ck = ModelCheckpoint(
        dirpath=str(tmp_path / "ck"),
        every_n_epochs=1,
        save_top_k=-1,
        monitor="val/temperature",
        filename="{epoch}",
    )
    tr = trainer(tmp_path, max_epochs=2, callbacks=[ts, ck], enable_checkpointing=True)
    tr.fit(TinyModule(scale=3.0), loader(train), loader(val))
    assert [h["epoch"] for h in ts.history] == [0, 1]
    for h in ts.history:
        state = torch.load(str(tmp_path / "ck" / f"epoch={h['epoch']}.ckpt"), weights_only=True)[
            "state_dict"
        ]
        assert bool(state["temperature_scaler.fitted"])
        assert math.exp(float(state["temperature_scaler.log_temperature"])) == pytest.approx(
            h["temperature"], rel=1e-12
        )
    assert float(tr.callback_metrics["val/temperature"]) == ts.history[-1]["temperature"]


def test_validate_inference_mode_and_masks(tmp_path, caplog):
    # 4 outputs, the last masked with -inf; targets only in the first 3 classes
    val = make_data(120, 5, n_classes=3)
    model = TinyModule(n_classes=4, mask_last=True, scale=3.0)
    ts = TemperatureScaling(verbose=True, fit_on_validate=True)
    with info_log(caplog):  # verbose=True: rank_zero_info, not print
        out = validate(tmp_path, ts, model, val)
    logits, y = val_logits(model, val)
    assert torch.isinf(logits[:, -1]).all()
    assert out["val/temperature"] == pytest.approx(brent_temperature(logits[:, :3], y), rel=1e-6)
    assert out["val/nll_after_scaling"] <= out["val/nll_before_scaling"]
    assert math.isfinite(out["val/ece_after_scaling"])
    printed = caplog.text
    assert (
        f"[TemperatureScaling] epoch 0: T = {out['val/temperature']:.4f}; NLL "
        f"{out['val/nll_before_scaling']:.4f} -> {out['val/nll_after_scaling']:.4f}; "
        f"ECE (15 bins) {out['val/ece_before_scaling']:.4f} -> "
    ) in printed


def test_kept_logits_are_detached(tmp_path, monkeypatch):
    class GradLogits(TinyModule):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            with torch.enable_grad():  # outside inference mode: logits that carry a graph
                return {"logits": self(batch[0]), "target": batch[1]}

    seen: list[list] = []
    real = TemperatureScaler.fit_stream

    def spy(self, batches, **kw):
        seen.append(list(batches))
        return real(self, batches, **kw)

    monkeypatch.setattr(TemperatureScaler, "fit_stream", spy)
    ts = TemperatureScaling(fit_on_validate=True)
    trainer(tmp_path, callbacks=[ts], inference_mode=False).validate(
        GradLogits(), loader(make_data(64, 0)), verbose=False
    )
    assert len(seen) == 1 and len(seen[0]) == 2
    assert not any(z.requires_grad for z, _ in seen[0])
    assert ts._chunks == []  # released after the fit


def test_binary_logits(tmp_path):
    val = make_data(150, 6, binary=True)
    model = TinyModule(binary=True, scale=0.3)  # underconfident: T < 1
    out = validate(tmp_path, TemperatureScaling(fit_on_validate=True), model, val)
    logits, y = val_logits(model, val)
    assert out["val/temperature"] == pytest.approx(brent_temperature(logits, y), rel=1e-6)
    assert out["val/temperature"] < 1


def test_checkpoint_without_temperature_loads_unfitted(tmp_path):
    tr = trainer(tmp_path, max_epochs=1)
    tr.fit(TinyModule(scaler=False), loader(make_data(64, 1)), loader(make_data(32, 2)))
    path = str(tmp_path / "plain.ckpt")
    tr.save_checkpoint(path)
    fresh = TinyModule()
    out = trainer(tmp_path, callbacks=[TemperatureScaling(fit_on_validate=True)]).validate(
        fresh, loader(make_data(64, 2)), ckpt_path=path, verbose=False
    )[0]
    assert fresh.temperature_scaler.is_fitted and out["val/temperature"] > 0
    with pytest.raises(ValueError, match="^checkpoint: .*temperature_scaler"):
        TemperatureScaling.load_scaler(path)


def test_unfitted_scaler_checkpoint_loads_unfitted(tmp_path):
    """A checkpoint written before any fit holds an unfitted scaler: it loads, unfitted."""
    model = TinyModule()
    tr = trainer(tmp_path, max_epochs=1, limit_val_batches=0)
    tr.fit(model, loader(make_data(64, 1)))
    path = str(tmp_path / "unfitted.ckpt")
    tr.save_checkpoint(path)
    loaded = TinyModule.load_from_checkpoint(path, weights_only=True)
    assert not loaded.temperature_scaler.is_fitted
    assert torch.equal(loaded.net.weight, model.net.weight)


def test_validate_refits_only_when_asked(tmp_path):
    model = TinyModule(scale=3.0)
    model.temperature_scaler.temperature = 2.0
    val = make_data(120, 4)
    validate(tmp_path, TemperatureScaling(), model, val)
    assert model.temperature_scaler.temperature == 2.0
    out = validate(tmp_path, TemperatureScaling(fit_on_validate=True), model, val)
    z, y = val_logits(model, val)
    assert out["val/temperature"] == pytest.approx(brent_temperature(z, y), rel=1e-6)
    assert model.temperature_scaler.temperature == out["val/temperature"] != 2.0


def test_validate_unfitted_warns(tmp_path):
    model = TinyModule()
    with pytest.warns(
        UserWarning,
        match=r"^TemperatureScaling: TinyModule.temperature_scaler "
        r"is not fitted .*fit_on_validate=True",
    ):
        validate(tmp_path, TemperatureScaling(), model, make_data(64, 0))
    assert not model.temperature_scaler.is_fitted


def test_missing_outputs_error(tmp_path):
    with pytest.raises(ValueError, match=r"'logits', 'target'.*returned None"):
        validate(
            tmp_path,
            TemperatureScaling(fit_on_validate=True),
            TinyModule(returns="none"),
            make_data(32, 0),
        )


def test_missing_scaler_error_names_the_fix(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"^pl_module: .*TinyModule has none; add "
        r"`self.temperature_scaler = TemperatureScaler\(\)`",
    ):
        trainer(tmp_path, callbacks=[TemperatureScaling()]).fit(
            TinyModule(scaler=False), loader(make_data(32, 0)), loader(make_data(32, 1))
        )
    model = TinyModule(scaler=False)
    model.temperature_scaler = torch.nn.Identity()
    with pytest.raises(
        ValueError,
        match=r"^attr_name: TinyModule.temperature_scaler is a "
        r"Identity",
    ):
        validate(tmp_path, TemperatureScaling(), model, make_data(32, 0))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(when="always"), "when"),
        (dict(logits_key=""), "logits_key"),
        (dict(attr_name="a b"), "attr_name"),
        (dict(n_bins=0), "n_bins"),
        (dict(dataloader_idx=-1), "dataloader_idx"),
        (dict(extract_fn=3), "extract_fn"),
    ],
)
def test_init_validation(kwargs, match):
    with pytest.raises(ValueError, match=f"^{match}"):
        TemperatureScaling(**kwargs)


def test_state_key_and_overrides():
    assert TemperatureScaling().state_key != TemperatureScaling(when="fit_end").state_key
    assert TemperatureScaling().state_key != TemperatureScaling(attr_name="t2").state_key
    for name, fn in vars(TemperatureScaling).items():
        if name.startswith("on_") or name in ("setup", "state_dict", "load_state_dict"):
            assert getattr(fn, "__override__", False), name
