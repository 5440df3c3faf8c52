"""The Lightning flow as people use it (issue 9): fit with ModelCheckpoint(monitor="val/nll"),
test from "best" with the best checkpoint's T, load_from_checkpoint, validate on another
loader (no refit), several validation loaders, bf16-true, no validation at all, and output
problems caught at the first validation batch."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from _callbacks_helpers import RankShard, TinyModule, loader, make_data, quiet_warnings, trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from test_callbacks_temperature import brent_temperature, val_logits

from torchcal.callbacks import CalibrationMonitor, TemperatureScaling


@pytest.fixture(autouse=True)
def _quiet():
    quiet_warnings()
    warnings.filterwarnings("ignore", message=r".*val_dataloader.*")


class Calibrated(TinyModule):
    """``test_step`` returns the calibrated logits (what a user evaluates)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.train_steps = 0

    def training_step(self, batch, batch_idx):
        self.train_steps += 1
        return super().training_step(batch, batch_idx)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        return {"logits": self.temperature_scaler(self(batch[0])), "target": batch[1]}


def ckpt_temperature(path: str) -> float:
    state = torch.load(path, weights_only=True)["state_dict"]
    assert bool(state["temperature_scaler.fitted"])
    assert state["temperature_scaler.log_temperature"].dtype == torch.float64
    return math.exp(float(state["temperature_scaler.log_temperature"]))


def test_fit_checkpoint_best_test_load_validate(tmp_path):
    torch.manual_seed(0)
    train, val, test, other = (
        make_data(64, 1),
        make_data(200, 2),
        make_data(150, 3),
        make_data(120, 4),
    )
    mon, ts = (
        CalibrationMonitor(n_bins=10, sinks=("loggers", "figures")),
        TemperatureScaling(n_bins=10),
    )
    ck = ModelCheckpoint(
        dirpath=str(tmp_path / "ck"),
        monitor="val/nll",
        mode="min",
        save_top_k=-1,
        save_last=True,
        filename="{epoch}",
    )
    tr = trainer(
        tmp_path,
        max_epochs=5,
        callbacks=[mon, ts, ck],
        enable_checkpointing=True,
        num_sanity_val_steps=2,
    )
    model = Calibrated(scale=4.0, lr=0.5)
    tr.fit(model, loader(train), loader(val))
    nll = [h["nll"] for h in mon.history]
    best = min(range(len(nll)), key=nll.__getitem__)
    assert ck.best_model_path.endswith(f"epoch={best}.ckpt")
    assert best != 4  # this seed's val NLL peaks early: best and last differ
    t_at = {h["epoch"]: h["temperature"] for h in ts.history}
    assert sorted(t_at) == [0, 1, 2, 3, 4]
    # every checkpoint holds the T fitted at its own epoch, exactly
    assert ckpt_temperature(ck.best_model_path) == t_at[best]
    for e in range(5):
        assert ckpt_temperature(str(tmp_path / "ck" / f"epoch={e}.ckpt")) == t_at[e]
    last_epoch = torch.load(ck.last_model_path, weights_only=True)["epoch"]
    assert ckpt_temperature(ck.last_model_path) == t_at[last_epoch]
    assert abs(t_at[best] / t_at[4] - 1) > 1e-3  # best and last hold different T
    # ... the T of its own weights (an independent fit on the best weights' logits)
    loaded = Calibrated.load_from_checkpoint(
        ck.best_model_path, weights_only=True, scale=4.0, lr=0.5
    )  # no other code
    assert loaded.temperature_scaler.is_fitted
    assert loaded.temperature_scaler.temperature == t_at[best]
    z, y = val_logits(loaded, val)
    assert t_at[best] == pytest.approx(brent_temperature(z, y), rel=1e-6)
    # test from "best": the best weights with the best T
    out = tr.test(model, loader(test), ckpt_path="best", verbose=False)[0]
    zt, yt = val_logits(loaded, test)
    assert out["test/nll"] == pytest.approx(
        float(F.cross_entropy(zt.double() / t_at[best], yt)), abs=1e-6
    )
    assert model.temperature_scaler.temperature == t_at[best]
    # validate on another loader: T is not refitted, nothing is logged for it
    n_fits = len(ts.history)
    res = tr.validate(model, loader(other), verbose=False)[0]
    assert model.temperature_scaler.temperature == t_at[best] and len(ts.history) == n_fits
    assert "val/temperature" not in res and "val/nll" in res


def test_two_validation_loaders(tmp_path):
    a, b = make_data(200, 2), make_data(120, 5)
    mon = CalibrationMonitor(n_bins=10, sinks=("loggers", "figures"), dataloader_idx=1)
    ts = TemperatureScaling(dataloader_idx=1)
    ck_b = ModelCheckpoint(dirpath=str(tmp_path / "b"), monitor="val/nll")
    ck_a = ModelCheckpoint(dirpath=str(tmp_path / "a"), monitor="val/nll/dataloader_idx_0")
    tr = trainer(
        tmp_path,
        max_epochs=2,
        callbacks=[mon, ts, ck_b, ck_a],
        enable_checkpointing=True,
        num_sanity_val_steps=2,
    )
    model = TinyModule(scale=4.0)
    tr.fit(model, loader(make_data(128, 1)), [loader(a), loader(b)])
    za, ya = val_logits(model, a)
    zb, yb = val_logits(model, b)
    t = model.temperature_scaler.temperature
    assert t == pytest.approx(brent_temperature(zb, yb), rel=1e-6)  # fitted on loader 1
    assert abs(t / brent_temperature(za, ya) - 1) > 1e-3
    cm = tr.callback_metrics
    assert float(cm["val/nll"]) == pytest.approx(float(F.cross_entropy(zb.double(), yb)), abs=1e-6)
    assert float(cm["val/nll/dataloader_idx_0"]) == pytest.approx(
        float(F.cross_entropy(za.double(), ya)), abs=1e-6
    )
    assert ck_a.best_model_path and ck_b.best_model_path
    assert ckpt_temperature(ck_b.best_model_path) in {h["temperature"] for h in ts.history}


def test_monitor_dataloader_idx_out_of_range(tmp_path):
    a = loader(make_data(32, 2))
    with pytest.raises(ValueError, match=r"^dataloader_idx: expected one of the 2 val "):
        trainer(tmp_path, callbacks=[CalibrationMonitor(dataloader_idx=2)]).validate(
            TinyModule(), [a, a], verbose=False
        )


def test_bf16_true_keeps_temperature_float64_and_exact(tmp_path):
    ts = TemperatureScaling()
    ck = ModelCheckpoint(
        dirpath=str(tmp_path / "ck"),
        save_top_k=-1,
        filename="{epoch}",
        monitor="val/nll_before_scaling",
    )
    tr = trainer(
        tmp_path, max_epochs=2, precision="bf16-true", callbacks=[ts, ck], enable_checkpointing=True
    )
    model = TinyModule(scale=4.0)
    val = make_data(200, 2)
    tr.fit(model, loader(make_data(128, 1)), loader(val))
    assert model.net.weight.dtype == torch.bfloat16  # the plugin did convert the module
    assert model.temperature_scaler.log_temperature.dtype == torch.float64
    for h in ts.history:
        assert (
            ckpt_temperature(str(tmp_path / "ck" / f"epoch={h['epoch']}.ckpt"))
            == (h["temperature"])
        )
    with torch.no_grad():
        z = model(val.tensors[0].bfloat16())
    y = val.tensors[1]
    assert z.dtype == torch.bfloat16
    assert model.temperature_scaler.temperature == pytest.approx(
        brent_temperature(z.double(), y), rel=1e-6
    )


def test_no_validation_warns_and_leaves_t_unfitted(tmp_path):
    model, train, val = TinyModule(), loader(make_data(64, 1)), loader(make_data(32, 2))
    ts = TemperatureScaling()
    with pytest.warns(UserWarning, match=r"^TemperatureScaling: limit_val_batches=0"):
        trainer(tmp_path, max_epochs=1, limit_val_batches=0, callbacks=[ts]).fit(model, train, val)
    assert not model.temperature_scaler.is_fitted and ts.history == []
    with pytest.warns(UserWarning, match=r"^TemperatureScaling: no validation logits"):
        trainer(tmp_path, max_epochs=1, callbacks=[ts]).fit(model, train)
    assert not model.temperature_scaler.is_fitted


def test_epoch_without_any_sample_warns(tmp_path):
    empty = torch.utils.data.DataLoader(RankShard(make_data(32, 2), ranks=()), batch_size=8)
    ts = TemperatureScaling()
    model = TinyModule()
    with pytest.warns(
        UserWarning,
        match=r"^TemperatureScaling: validation dataloader 0 gave "
        r"no sample on any rank",
    ):
        trainer(
            tmp_path, max_epochs=1, callbacks=[CalibrationMonitor(sinks=("loggers", "figures")), ts]
        ).fit(model, loader(make_data(64, 1)), empty)
    assert not model.temperature_scaler.is_fitted


class Bad(Calibrated):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        z, y = self(batch[0]), batch[1]
        if self.kind == "none":
            return None
        if self.kind == "nan":
            z = z.clone()
            z[1, 0] = float("nan")
        if self.kind == "one_hot":
            y = F.one_hot(y, z.shape[1]).float()
        if self.kind == "column":
            y = y[:, None]
        if self.kind == "label":
            y = y + 3
        return {"logits": z, "target": y}


@pytest.mark.parametrize(
    "kind, match",
    [
        ("none", r"^outputs: TemperatureScaling reads"),
        ("nan", r"^logits: expected finite values"),
        ("one_hot", r"^target: expected shape"),
        ("column", r"^target: expected shape"),
        ("label", r"^target: expected class indices in \[0, 2\]"),
    ],
)
@pytest.mark.parametrize("who", ["temperature", "monitor"])
def test_bad_outputs_fail_at_the_sanity_check(kind, match, who, tmp_path):
    model = Bad(kind)
    cb = (
        TemperatureScaling()
        if who == "temperature"
        else CalibrationMonitor(sinks=("loggers", "figures"))
    )
    with pytest.raises(ValueError, match=match if who == "temperature" else None):
        trainer(tmp_path, max_epochs=1, callbacks=[cb], num_sanity_val_steps=1).fit(
            model, loader(make_data(64, 1)), loader(make_data(32, 2))
        )
    assert model.train_steps == 0  # before any training


def test_probabilities_as_logits_warn_at_first_batch(tmp_path):
    class Probs(Calibrated):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            return {"logits": torch.softmax(self(batch[0]), 1), "target": batch[1]}

    with pytest.warns(
        UserWarning,
        match=r"^logits: every row of the first validation batch "
        r"lies in \[0, 1\] and sums to 1",
    ):
        trainer(
            tmp_path,
            max_epochs=1,
            callbacks=[TemperatureScaling()],
            num_sanity_val_steps=1,
            limit_train_batches=1,
        ).fit(Probs(), loader(make_data(64, 1)), loader(make_data(32, 2)))
