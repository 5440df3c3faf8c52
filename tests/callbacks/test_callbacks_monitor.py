"""CalibrationMonitor: files, loggers, callback metrics, offline agreement, resume, errors."""

from __future__ import annotations

import csv
import math
import os
import warnings
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _callbacks_helpers import (
    N_CLASSES,
    TinyModule,
    checkpointed_fit,
    info_log,
    loader,
    make_data,
    quiet_warnings,
    trainer,
)
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from torchcal.callbacks import CalibrationMonitor, TemperatureScaling
from torchcal.functional import (
    brier_decomposition,
    brier_score,
    calibration_error,
    reliability_table,
)
from torchcal.functional.calibration.results import CSV_COLUMNS

N_TRAIN, N_VAL = 256, 200  # 200 = 6 full batches of 32 + one of 8


@pytest.fixture(autouse=True)
def _quiet():
    quiet_warnings()


def read_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def offline_logits(model: TinyModule, ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's predictions on the same batches as the validation loop (float32 matmul
    results depend on the batch size)."""
    with torch.no_grad():
        out = [(model(b[0]), b[1]) for b in loader(ds)]
    return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])


def numpy_ece(logits: torch.Tensor, y: torch.Tensor, n_bins: int) -> tuple[float, float]:
    """Independent float64 numpy reference: (L1 ECE, MCE) of the confidence reading."""
    p = torch.softmax(logits.double(), 1).numpy()
    conf, pred = p.max(1), p.argmax(1)
    hit = (pred == y.numpy()).astype(float)
    b = np.minimum(np.floor(conf * n_bins), n_bins - 1).astype(int)
    ece, mce = 0.0, 0.0
    for k in range(n_bins):
        m = b == k
        if m.any():
            gap = abs(conf[m].mean() - hit[m].mean())
            ece += m.sum() / len(conf) * gap
            mce = max(mce, gap)
    return ece, mce


# ---------------------------------------------------------------- the main single-process fit
@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fit")
    train, val = make_data(N_TRAIN, 1), make_data(N_VAL, 2)
    monitor = CalibrationMonitor(n_bins=10)
    ckpt = dict(monitor="val/ece", mode="min", save_last=True)
    fit = checkpointed_fit(tmp, TinyModule, monitor, (loader(train), loader(val)), 2, **ckpt)
    return dict(fit, val=val, train=train)


def test_csv_one_table_per_epoch_counts_sum_to_val_size(fitted):
    path = os.path.join(fitted["csv"].log_dir, "reliability.csv")
    rows = read_csv(path)
    # the column list, spelled out (not re-derived from report.CSV_COLUMNS)
    assert list(rows[0]) == [
        "epoch",
        "step",
        "bin",
        "lo",
        "hi",
        "count",
        "conf",
        "acc",
        "gap",
        "ci_low",
        "ci_high",
    ]
    epochs = sorted({int(r["epoch"]) for r in rows})
    assert epochs == [0, 1]  # the sanity check (2 batches) wrote nothing
    for e in epochs:
        assert sum(int(r["count"]) for r in rows if int(r["epoch"]) == e) == N_VAL
    # one step per epoch, the global step at the validation's end
    assert {int(r["step"]) for r in rows if int(r["epoch"]) == 1} == {2 * math.ceil(N_TRAIN / 32)}
    assert [h["epoch"] for h in fitted["monitor"].history] == [0, 1]
    assert all(h["n"] == N_VAL for h in fitted["monitor"].history)


def test_tensorboard_has_text_and_image(fitted):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(fitted["tb"].log_dir, size_guidance={"tensors": 0, "images": 0})
    ea.Reload()
    tags = ea.Tags()
    assert "val/reliability/text_summary" in tags["tensors"]  # add_text (text plugin)
    assert "val/reliability_diagram" in tags["images"]
    assert len(ea.Images("val/reliability_diagram")) == 2
    assert "val/calibration_over_epochs" in tags["images"]
    text = ea.Tensors("val/reliability/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert text.startswith("| bin | lo | hi | count |")
    assert {"val/ece", "val/nll", "val/brier_confidence", "val/mce", "val/ece_debiased"} <= set(
        tags["scalars"]
    )


def test_callback_metrics_and_modelcheckpoint_monitor(fitted):
    cm = fitted["trainer"].callback_metrics
    for k in ("val/ece", "val/ece_debiased", "val/mce", "val/brier_confidence", "val/nll"):
        assert k in cm
    assert "val/brier" not in cm  # the confidence reading's Brier is not the multiclass one
    hist = fitted["monitor"].history
    assert float(cm["val/ece"]) == pytest.approx(hist[-1]["ece"], abs=1e-12)
    ck = fitted["ckpt"]
    assert ck.best_model_path and os.path.exists(ck.best_model_path)
    assert float(ck.best_model_score) == pytest.approx(min(h["ece"] for h in hist), abs=1e-12)
    # metrics.csv of the CSVLogger carries the scalar per epoch
    rows = read_csv(os.path.join(fitted["csv"].log_dir, "metrics.csv"))
    assert sum(1 for r in rows if r.get("val/ece")) == 2


def test_logged_table_equals_offline_table(fitted):
    logits, y = offline_logits(fitted["model"], fitted["val"])
    table = reliability_table(logits, y, n_bins=10)
    rows = [
        r
        for r in read_csv(os.path.join(fitted["csv"].log_dir, "reliability.csv"))
        if int(r["epoch"]) == 1
    ]
    ref = table.rows()
    assert [int(r["bin"]) for r in rows] == [r["bin"] for r in ref]
    assert [int(r["count"]) for r in rows] == [r["count"] for r in ref]
    for col in ("lo", "hi", "conf", "acc", "gap", "ci_low", "ci_high"):
        np.testing.assert_allclose(
            [float(r[col]) for r in rows], [r[col] for r in ref], rtol=0, atol=1e-12
        )
    h = fitted["monitor"].history[-1]
    ece, mce = numpy_ece(logits, y, 10)
    # the monitor's confidences are float32 (as the model's logits), the reference float64
    assert h["ece"] == pytest.approx(ece, abs=1e-6)
    assert h["mce"] == pytest.approx(mce, abs=1e-6)
    assert h["ece"] == pytest.approx(table.ece, abs=1e-12)
    assert h["ece_debiased"] == pytest.approx(
        float(calibration_error(logits, y, n_bins=10, norm="l2", estimator="debiased")), abs=1e-12
    )
    # Brier of the confidence reading: mean (conf - correct)^2
    p = torch.softmax(logits.double(), 1)
    conf, pred = p.max(1)
    assert h["brier_confidence"] == pytest.approx(
        float(((conf - (pred == y).double()) ** 2).mean()), abs=1e-6
    )
    assert h["brier_confidence"] == pytest.approx(
        float(brier_decomposition(logits, y, n_bins=10, reading="confidence")["brier"]), abs=1e-12
    )
    assert h["nll"] == pytest.approx(float(F.cross_entropy(logits.double(), y)), abs=1e-6)


def test_history_figure_written(fitted):
    assert (
        os.path.getsize(os.path.join(fitted["csv"].log_dir, "calibration_over_epochs.png")) > 1000
    )


def test_resume_keeps_history(fitted, tmp_path):
    last = fitted["ckpt"].last_model_path
    state = torch.load(last, weights_only=True)
    mon = CalibrationMonitor(n_bins=10)
    warnings.filterwarnings("ignore", message=r".*callbacks used to create the checkpoint.*")
    assert state["callbacks"][mon.state_key]["history"] == fitted["monitor"].history
    tr = trainer(tmp_path, max_epochs=3, callbacks=[mon], logger=CSVLogger(str(tmp_path)))
    tr.fit(TinyModule(), loader(fitted["train"]), loader(fitted["val"]), ckpt_path=last)
    assert [h["epoch"] for h in mon.history] == [0, 1, 2]
    assert mon.history[:2] == fitted["monitor"].history


# ---------------------------------------------------------------- readings, stages, loaders
@pytest.mark.parametrize("reading", ["binary", "top_label", "classwise"])
def test_readings_match_functional(reading, tmp_path):
    binary = reading == "binary"
    val = make_data(96, 3, binary=binary)
    model = TinyModule(binary=binary)
    mon = CalibrationMonitor(
        n_bins=8,
        reading=reading,
        num_classes=None if binary else N_CLASSES,
        sinks=("loggers", "figures"),
    )
    out = trainer(tmp_path, callbacks=[mon]).validate(model, loader(val), verbose=False)[0]
    logits, y = offline_logits(model, val)
    kw = dict(n_bins=8, reading=reading, num_classes=None if binary else N_CLASSES)
    assert out["val/ece"] == pytest.approx(float(calibration_error(logits, y, **kw)), abs=1e-6)
    assert out["val/mce"] == pytest.approx(
        float(calibration_error(logits, y, norm="max", **kw)), abs=1e-6
    )
    brier = float(brier_decomposition(logits, y, **kw)["brier"])
    key = "val/brier_confidence" if reading == "top_label" else "val/brier"
    assert set(out) == {"val/ece", "val/ece_debiased", "val/mce", key, "val/nll"}
    assert out[key] == pytest.approx(brier, abs=1e-6)
    if reading == "classwise":  # "val/brier" is the full multiclass Brier score
        onehot = F.one_hot(y, N_CLASSES).double()
        full = float(((torch.softmax(logits.double(), 1) - onehot) ** 2).sum(1).mean())
        # a float32 or float64 link: equal to float32 rounding of the probabilities
        assert brier == pytest.approx(full, abs=1e-9)
        assert out[key] == pytest.approx(float(brier_score(logits.double(), y)), abs=1e-6)
    if binary:  # the usual binary Brier score
        ref = float(((torch.sigmoid(logits.double()) - y.double()) ** 2).mean())
        assert out[key] == pytest.approx(ref, abs=1e-6)
    if binary:
        ref = float(F.binary_cross_entropy_with_logits(logits.double(), y.double()))
        assert out["val/nll"] == pytest.approx(ref, abs=1e-6)
    assert mon.history[-1]["n"] == 96


def test_test_stage_and_several_dataloaders(tmp_path, caplog):
    a, b = make_data(64, 4), make_data(40, 5)
    model = TinyModule()
    mon = CalibrationMonitor(n_bins=5, verbose=True)
    tr = trainer(tmp_path, callbacks=[mon], logger=CSVLogger(str(tmp_path)))
    with info_log(caplog):  # verbose=True: rank_zero_info, not print
        out = tr.test(model, [loader(a), loader(b)], verbose=False)
    keys = set(out[0]) | set(out[1])
    # dataloader 0 (the default dataloader_idx) keeps the plain names, so one monitor key
    # works with one loader or several; the others carry the suffix
    assert {
        "test/ece",
        "test/nll",
        "test/ece/dataloader_idx_1",
        "test/nll/dataloader_idx_1",
    } <= keys
    assert "test/ece/dataloader_idx_0" not in keys
    d = tr.loggers[0].log_dir
    for i, n, key, stem in (
        (0, 64, "test/ece", "test_reliability"),
        (1, 40, "test/ece/dataloader_idx_1", "test_reliability_dataloader_idx_1"),
    ):
        rows = read_csv(os.path.join(d, f"{stem}.csv"))
        assert sum(int(r["count"]) for r in rows) == n
        logits, y = offline_logits(model, (a, b)[i])
        assert out[i][key] == pytest.approx(float(calibration_error(logits, y, n_bins=5)), abs=1e-6)
    printed = caplog.text
    assert "test dataloader 1 epoch 0" in printed and "reliability table" in printed
    assert [(h["stage"], h["dataloader_idx"]) for h in mon.history] == [("test", 0), ("test", 1)]


def test_groups_tables_and_metrics(tmp_path):
    val = make_data(120, 6, groups=3)
    model = TinyModule()
    mon = CalibrationMonitor(n_bins=5, num_groups=3, name="g")
    tr = trainer(tmp_path, callbacks=[mon], logger=CSVLogger(str(tmp_path)))
    out = tr.validate(model, loader(val), verbose=False)[0]
    logits, y = offline_logits(model, val)
    gid = val.tensors[2]
    for g in range(3):
        m = gid == g
        assert out[f"val/g/group_{g}/ece"] == pytest.approx(
            float(calibration_error(logits[m], y[m], n_bins=5)), abs=1e-6
        )
    rows = read_csv(os.path.join(tr.loggers[0].log_dir, "g_reliability_groups.csv"))
    assert list(rows[0])[:3] == ["epoch", "step", "group"]
    for g in range(3):
        assert sum(int(r["count"]) for r in rows if int(r["group"]) == g) == int((gid == g).sum())
    pooled = read_csv(os.path.join(tr.loggers[0].log_dir, "g_reliability.csv"))
    assert sum(int(r["count"]) for r in pooled) == 120
    assert out["val/g/ece"] == pytest.approx(
        float(calibration_error(logits, y, n_bins=5)), abs=1e-6
    )


def test_group_ids_without_num_groups_warn_once(tmp_path):
    val = make_data(96, 6, groups=3)  # the step returns "group", the monitor has no num_groups
    mon = CalibrationMonitor(n_bins=5, sinks=("loggers", "figures"))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        quiet_warnings()
        out = trainer(tmp_path, callbacks=[mon]).validate(TinyModule(), loader(val), verbose=False)[
            0
        ]
    msgs = [str(w.message) for w in rec if "num_groups is not set" in str(w.message)]
    assert len(msgs) == 1 and "'group'" in msgs[0]  # 3 batches, one warning
    assert "val/group_0/ece" not in out and mon.history[-1]["group_ece"] is None


def test_history_figure_axes():
    pytest.importorskip("matplotlib")
    from torchcal.plotting import history_figure

    def hist(epochs, steps):
        return [
            dict(
                epoch=e, step=s, ece=0.1, ece_debiased=0.05, mce=0.2, brier_confidence=0.3, nll=1.0
            )
            for e, s in zip(epochs, steps)
        ]

    fig = history_figure(hist([0, 1, 2], [10, 20, 30]), "t")
    axes = fig.get_axes()
    assert [a.get_ylabel() for a in axes] == ["calibration error", "brier confidence", "NLL (nats)"]
    assert {a.get_xlabel() for a in axes} == {"epoch"}
    assert [ln.get_label() for ln in axes[0].get_lines()] == ["ece", "ece_debiased", "mce"]
    assert list(axes[2].get_lines()[0].get_xdata()) == [0, 1, 2]
    # several validations per epoch (val_check_interval=0.5): one point per step
    fig = history_figure(hist([0, 0, 1, 1], [5, 10, 15, 20]), "t")
    assert {a.get_xlabel() for a in fig.get_axes()} == {"global step"}
    assert list(fig.get_axes()[1].get_lines()[0].get_xdata()) == [5, 10, 15, 20]


def test_extract_fn_and_probs(tmp_path):
    val = make_data(64, 7)
    model = TinyModule(returns="loss")

    def extract(pl_module, batch, outputs):
        return torch.softmax(pl_module(batch[0]), 1), batch[1]

    mon = CalibrationMonitor(
        n_bins=5, input="probs", extract_fn=extract, sinks=("loggers", "figures")
    )
    out = trainer(tmp_path, callbacks=[mon]).validate(model, loader(val), verbose=False)[0]
    logits, y = offline_logits(model, val)
    assert out["val/ece"] == pytest.approx(float(calibration_error(logits, y, n_bins=5)), abs=1e-6)
    assert out["val/nll"] == pytest.approx(float(F.cross_entropy(logits.double(), y)), abs=1e-5)


def test_neg_inf_masks_allowed(tmp_path):
    # 4 outputs, the last masked with -inf (as known answers in filtered link prediction)
    val = make_data(64, 8, n_classes=3)
    model = TinyModule(n_classes=4, mask_last=True)
    mon = CalibrationMonitor(n_bins=5, sinks=("loggers", "figures"))
    out = trainer(tmp_path, callbacks=[mon]).validate(model, loader(val), verbose=False)[0]
    logits, y = offline_logits(model, val)
    assert torch.isinf(logits[:, -1]).all()
    ref = calibration_error(torch.softmax(logits, 1), y, n_bins=5, input="probs")
    assert out["val/ece"] == pytest.approx(float(ref), abs=1e-6)
    assert out["val/nll"] == pytest.approx(float(F.cross_entropy(logits.double(), y)), abs=1e-6)
    # a masked true class: the NLL is honestly infinite, the binned metrics stay finite
    y2 = torch.full_like(y, 3)
    out2 = trainer(
        tmp_path, callbacks=[CalibrationMonitor(n_bins=5, sinks=("loggers", "figures"))]
    ).validate(model, loader(torch.utils.data.TensorDataset(val.tensors[0], y2)), verbose=False)[0]
    assert out2["val/nll"] == math.inf and math.isfinite(out2["val/ece"])


# ---------------------------------------------------------------- errors and validation
@pytest.mark.parametrize("returns", ["none", "loss"])
def test_missing_outputs_error_names_keys(returns, tmp_path):
    mon = CalibrationMonitor(sinks=("loggers", "figures"))
    with pytest.raises(ValueError) as e:
        trainer(tmp_path, callbacks=[mon]).validate(
            TinyModule(returns=returns), loader(make_data(32, 0)), verbose=False
        )
    msg = str(e.value)
    assert "'logits'" in msg and "'target'" in msg
    assert 'return {"logits": logits, "target": y}' in msg
    assert ("returned None" in msg) if returns == "none" else ("keys ['loss']" in msg)


def test_bad_values_raise(tmp_path):
    class NaNModule(TinyModule):
        def forward(self, x):
            z = super().forward(x)
            return torch.where(torch.arange(z.shape[0])[:, None] == 3, torch.nan, z)

    with pytest.raises(ValueError, match="preds: expected finite"):
        trainer(tmp_path, callbacks=[CalibrationMonitor(sinks=("loggers", "figures"))]).validate(
            NaNModule(), loader(make_data(32, 0)), verbose=False
        )

    class DeadRow(TinyModule):
        def forward(self, x):
            z = super().forward(x)
            return torch.where(torch.arange(z.shape[0])[:, None] == 2, -torch.inf, z)

    with pytest.raises(ValueError, match="row 2 is entirely -inf"):
        trainer(tmp_path, callbacks=[CalibrationMonitor(sinks=("loggers", "figures"))]).validate(
            DeadRow(), loader(make_data(32, 0)), verbose=False
        )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_bins=0), "n_bins"),
        (dict(n_bins=2.5), "n_bins"),
        (dict(reading="top1"), "reading"),
        (dict(input="scores"), "input"),
        (dict(level=1.0), "level"),
        (dict(interval="exact"), "interval"),
        (dict(reading="classwise"), "num_classes"),
        (dict(num_groups=0), "num_groups"),
        (dict(preds_key=""), "preds_key"),
        (dict(target_key=3), "target_key"),
        (dict(name="/x"), "name"),
        (dict(extract_fn="f"), "extract_fn"),
        (dict(sinks=("loggers", "tables")), "sinks"),
        (dict(sinks=3), "sinks"),
    ],
)
def test_init_validation(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        CalibrationMonitor(**kwargs)


def test_state_key_unique_per_configuration():
    keys = {
        CalibrationMonitor().state_key,
        CalibrationMonitor(n_bins=10).state_key,
        CalibrationMonitor(reading="binary").state_key,
        CalibrationMonitor(name="a").state_key,
        CalibrationMonitor(input="probs").state_key,
    }
    assert len(keys) == 5
    assert CalibrationMonitor(n_bins=10).state_key == CalibrationMonitor(n_bins=10).state_key


def test_every_hook_is_marked_override():
    for name, fn in vars(CalibrationMonitor).items():
        if name.startswith("on_") or name in ("state_dict", "load_state_dict"):
            assert getattr(fn, "__override__", False), name


def test_lightning_cli_yaml(tmp_path, monkeypatch):
    pytest.importorskip("jsonargparse")
    monkeypatch.setattr("sys.argv", ["prog"])
    warnings.filterwarnings("ignore", message=r".*No seed found.*")
    warnings.filterwarnings("ignore", module=r"lightning\.pytorch\.cli")
    from lightning.pytorch.cli import LightningCLI

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "trainer:\n"
        "  logger: false\n"
        "  callbacks:\n"
        "    - class_path: torchcal.callbacks.CalibrationMonitor\n"
        "      init_args:\n"
        "        n_bins: 12\n"
        "        reading: top_label\n"
        "        num_classes: 3\n"
        "        preds_key: scores\n"
        "        sinks: [csv, prog_bar]\n"
        "    - class_path: torchcal.callbacks.TemperatureScaling\n"
        "      init_args:\n"
        "        when: epoch\n"
        "        fit_on_validate: true\n"
    )
    cli = LightningCLI(
        TinyModule, run=False, args=["--config", str(cfg)], save_config_callback=None
    )
    mon = [c for c in cli.trainer.callbacks if isinstance(c, CalibrationMonitor)]
    assert len(mon) == 1 and mon[0].n_bins == 12 and mon[0].reading == "top_label"
    assert mon[0].preds_key == "scores" and mon[0].sinks == {"csv", "prog_bar"}
    ts = [c for c in cli.trainer.callbacks if isinstance(c, TemperatureScaling)]
    assert len(ts) == 1 and ts[0].when == "epoch" and ts[0].fit_on_validate
    cfg.write_text(cfg.read_text().replace("reading: top_label", "reading: top1"))
    with pytest.raises(SystemExit):
        LightningCLI(TinyModule, run=False, args=["--config", str(cfg)], save_config_callback=None)


# ---------------------------------------------------------------- fake W&B / MLflow loggers
class _Recorder(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple, dict]] = []

    @property
    def name(self) -> str:
        return "fake"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.calls.append(("log_metrics", (metrics,), {"step": step}))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


class WandbLogger(_Recorder):
    def log_table(self, key, columns=None, data=None, dataframe=None, step=None):
        self.calls.append(("log_table", (), dict(key=key, columns=columns, data=data, step=step)))

    def log_image(self, key, images, step=None, **kwargs):
        self.calls.append(("log_image", (), dict(key=key, images=images, step=step)))


class _FakeMlflowClient:
    def __init__(self, calls):
        self.calls = calls

    def log_table(self, run_id, data, artifact_file):
        self.calls.append(("log_table", (run_id,), dict(data=data, artifact_file=artifact_file)))

    def log_figure(self, run_id, figure, artifact_file):
        self.calls.append(("log_figure", (run_id, figure), dict(artifact_file=artifact_file)))


class MLFlowLogger(_Recorder):
    run_id = "run-123"

    @property
    def experiment(self):
        return _FakeMlflowClient(self.calls)


class SomeOtherLogger(_Recorder):
    pass


def test_fake_wandb_mlflow_and_unknown_logger(tmp_path):
    pytest.importorskip("matplotlib")
    wb, ml, other = WandbLogger(), MLFlowLogger(), SomeOtherLogger()
    mon = CalibrationMonitor(n_bins=5)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        quiet_warnings()
        trainer(tmp_path, max_epochs=2, logger=[wb, ml, other], callbacks=[mon]).fit(
            TinyModule(), loader(make_data(64, 1)), loader(make_data(48, 2))
        )
    unknown = [w for w in rec if "no adapter for logger SomeOtherLogger" in str(w.message)]
    assert len(unknown) == 1  # warned once, not per epoch
    tables = [c for c in wb.calls if c[0] == "log_table"]
    assert len(tables) == 2 and tables[0][2]["key"] == "val/reliability"
    assert tables[0][2]["columns"] == list(CSV_COLUMNS)
    assert sum(row[3] for row in tables[-1][2]["data"]) == 48
    images = [c for c in wb.calls if c[0] == "log_image"]
    assert [c[2]["key"] for c in images] == ["val/reliability_diagram"] * 2 + [
        "val/calibration_over_epochs"
    ]
    assert images[0][2]["images"][0].ndim == 3 and images[0][2]["images"][0].shape[2] == 3
    mt = [c for c in ml.calls if c[0] == "log_table"]
    assert len(mt) == 2 and mt[0][1] == ("run-123",)
    assert mt[0][2]["artifact_file"].endswith(".json")
    assert sum(mt[-1][2]["data"]["count"]) == 48 and list(mt[-1][2]["data"]) == list(CSV_COLUMNS)
    figs = [c for c in ml.calls if c[0] == "log_figure"]
    assert len(figs) == 3 and type(figs[0][1][1]).__name__ == "Figure"
    # the scalars reached every logger through pl_module.log
    for lg in (wb, ml, other):
        assert any("val/ece" in c[1][0] for c in lg.calls if c[0] == "log_metrics")


def test_logger_failure_does_not_crash(tmp_path):
    class _Full:
        def add_text(self, *args, **kwargs):
            raise OSError("disk full")

    class TensorBoardLogger(_Recorder):  # duck-typed by name
        @property
        def experiment(self):
            return _Full()

    lg = TensorBoardLogger()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        quiet_warnings()
        trainer(
            tmp_path, callbacks=[CalibrationMonitor(sinks=("loggers", "csv"))], logger=lg
        ).validate(TinyModule(), loader(make_data(32, 0)), verbose=False)
    assert any("disk full" in str(w.message) for w in rec)


@pytest.mark.parametrize("with_tb", [True, False])
def test_files_never_read_trainer_log_dir(with_tb, tmp_path, monkeypatch):
    # trainer.log_dir broadcasts from rank 0 (a collective); the monitor writes on rank 0
    # alone, so reading it there hangs a DDP run (seen with ddp_spawn and a TensorBoard-only
    # logger): the directory must come from the loggers themselves
    import sys
    from pathlib import Path

    import lightning as L

    import torchcal

    # the package's own directory, compared as a path (never a substring of a file name: a
    # checkout named torchcal holds its venv, and Lightning's files, under that name)
    package = Path(torchcal.__file__).resolve().parent
    original = L.Trainer.log_dir

    def broadcasting(self):
        frame = sys._getframe(1)
        while frame is not None:  # Lightning reads it on every rank; torchcal must not
            where = Path(frame.f_code.co_filename).resolve()
            assert not where.is_relative_to(package), f"trainer.log_dir read in {where}"
            frame = frame.f_back
        return original.fget(self)

    monkeypatch.setattr(L.Trainer, "log_dir", property(broadcasting))
    tb = TensorBoardLogger(str(tmp_path), name="tb") if with_tb else False
    trainer(tmp_path, max_epochs=1, callbacks=[CalibrationMonitor(n_bins=5)], logger=tb).fit(
        TinyModule(), loader(make_data(64, 1)), loader(make_data(40, 2))
    )
    where = tb.log_dir if with_tb else str(tmp_path)
    assert sum(int(r["count"]) for r in read_csv(os.path.join(where, "reliability.csv"))) == 40
    assert os.path.exists(os.path.join(where, "calibration_over_epochs.png"))


def test_no_logger_writes_csv_to_default_root_dir(tmp_path):
    trainer(tmp_path, callbacks=[CalibrationMonitor()]).validate(
        TinyModule(), loader(make_data(40, 0)), verbose=False
    )
    rows = read_csv(os.path.join(tmp_path, "reliability.csv"))
    assert sum(int(r["count"]) for r in rows) == 40


class _FixedOutputs(L.LightningModule):
    """A validation step that returns given logits and targets (one batch)."""

    def __init__(self, logits: torch.Tensor, target: torch.Tensor) -> None:
        super().__init__()
        self.logits, self.target = logits, target

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        return {"logits": self.logits, "target": self.target}


def _validate_once(tmp_path, callback, logits, target) -> dict[str, float]:
    data = DataLoader(TensorDataset(torch.zeros(1, 1)), batch_size=1)
    model = _FixedOutputs(logits, target)
    return trainer(tmp_path, callbacks=[callback]).validate(model, data, verbose=False)[0]


def test_binary_reading_of_multi_label_targets_logs_the_binary_nll(tmp_path):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 3, generator=g)
    y = (torch.rand(64, 3, generator=g) > 0.5).float()  # (B, C) 0/1: independent sigmoids
    out = _validate_once(tmp_path, CalibrationMonitor(reading="binary", sinks=()), z, y)
    ref = float(F.binary_cross_entropy_with_logits(z.double(), y.double()))
    assert out["val/nll"] == pytest.approx(ref, abs=1e-9)  # read as class probabilities before
    brier = float(((torch.sigmoid(z.double()) - y.double()) ** 2).mean())
    assert out["val/brier"] == pytest.approx(brier, abs=1e-9)


def test_int32_class_targets(tmp_path):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(64, 3, generator=g)
    y = torch.randint(0, 3, (64,), generator=g)
    mon = CalibrationMonitor(num_classes=3, sinks=())
    out = _validate_once(tmp_path, mon, z, y.to(torch.int32))  # a raw torch RuntimeError before
    assert out["val/nll"] == pytest.approx(float(F.cross_entropy(z.double(), y)), abs=1e-9)


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: CalibrationMonitor(validate_args="False"), "validate_args"),
        (lambda: CalibrationMonitor(verbose="no"), "verbose"),
        (lambda: CalibrationMonitor(level="0.9"), "level"),
        (lambda: TemperatureScaling(fit_on_validate="False"), "fit_on_validate"),
    ],
)
def test_callback_flags_of_the_wrong_type(make, name):
    with pytest.raises(TypeError, match=rf"^{name}: expected"):
        make()
