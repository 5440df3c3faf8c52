"""RegressionMonitor: every key in every logger each epoch, values against independent
float64 references (scipy, properscoring, numpy), ModelCheckpoint on ``val/crps``, quantile and
ensemble outputs, bad outputs at the first batch, two dataloaders, TensorBoard text/figure."""

from __future__ import annotations

import csv
import os
from typing import Any

import numpy as np
import properscoring as ps
import pytest
import torch
from _callbacks_helpers import LocScaleNet, checkpointed_fit, info_log, quiet_warnings, trainer
from _ddp_runs import RankSplit, single_and_ddp
from lightning.pytorch.loggers import CSVLogger
from scipy import stats
from torch.utils.data import DataLoader, TensorDataset

from torchcal.callbacks import RegressionMonitor
from torchcal.functional import pit_ensemble, pit_quantiles

N_TRAIN, N_VAL, BATCH = 128, 200, 32  # 200 = 6 batches of 32 + one of 8
LEVELS = (0.5, 0.8, 0.9, 0.95)
Q_LEVELS = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.975)  # holds every interval end
M = 9  # ensemble members


@pytest.fixture(autouse=True)
def _quiet():
    quiet_warnings()


def make_data(n: int, seed: int) -> TensorDataset:
    """The issue's process: x ~ U(0, 1), y = 2x + N(0, (0.1 + 0.5x)^2)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g)
    y = 2 * x[:, 0] + (0.1 + 0.5 * x[:, 0]) * torch.randn(n, generator=g)
    return TensorDataset(x, y)


def loader(ds: TensorDataset) -> DataLoader:
    return DataLoader(ds, batch_size=BATCH, shuffle=False)


class Reg(LocScaleNet):
    """A (loc, scale) network trained with the Gaussian NLL; its validation step returns the
    forecast as ``kind`` says and records every output of the epoch in ``seen``."""

    def __init__(self, kind: str = "normal", bad: str = "") -> None:
        super().__init__()
        self.kind, self.bad = kind, bad
        self.register_buffer(
            "eps", torch.randn(BATCH, M, generator=torch.Generator().manual_seed(5))
        )

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        loc, scale = self(batch[0])
        y = batch[1]
        if self.kind == "quantiles":
            lv = torch.tensor(Q_LEVELS)
            out = {
                "quantiles": loc[:, None] + scale[:, None] * torch.special.ndtri(lv),
                "levels": lv,
            }
        elif self.kind == "ensemble":
            out = {"samples": loc[:, None] + scale[:, None] * self.eps[: len(y)]}
        else:
            out = {"loc": loc, "scale": scale}
        out = {**out, "target": y}
        if self.bad:
            out = corrupt(out, self.bad)
        self.seen.setdefault(dataloader_idx, []).append(
            {k: v.detach().clone() for k, v in out.items()}
        )
        return out

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self.validation_step(batch, batch_idx, dataloader_idx)


def corrupt(out: dict[str, torch.Tensor], bad: str) -> dict[str, Any]:
    out = dict(out)
    if bad == "scale":
        out["scale"] = -out["scale"]
    elif bad == "loc":
        out["loc"] = out["loc"].clone()
        out["loc"][3] = float("nan")
    elif bad == "target":
        out["target"] = out["target"][:, None]  # (B, 1): would broadcast
    elif bad == "missing":
        del out["scale"]
    elif bad == "quantiles":
        out["quantiles"] = out["quantiles"].flip(-1)  # crossing
    elif bad == "levels":
        out["levels"] = torch.linspace(0.1, 0.9, len(Q_LEVELS))  # no 0.025 / 0.975
        out["quantiles"] = out["quantiles"].sort(-1).values
    return out


def cat(seen: list[dict[str, torch.Tensor]], key: str) -> np.ndarray:
    return torch.cat([s[key] for s in seen]).double().numpy()


def read_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def pit_ece_np(pit: np.ndarray, n_bins: int = 10) -> float:
    counts = np.bincount(
        np.minimum(np.floor(pit * n_bins), n_bins - 1).astype(int), minlength=n_bins
    )
    return float(np.abs(counts / counts.sum() - 1 / n_bins).sum())


def reference(family: str, seen: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Independent float64 references of every logged key for a location-scale family."""
    mu, s, y = cat(seen, "loc"), cat(seen, "scale"), cat(seen, "target")
    law = {"normal": stats.norm, "laplace": stats.laplace, "logistic": stats.logistic}[family]
    ref = {"pit_ece": pit_ece_np(law.cdf(y, mu, s))}
    if family == "normal":
        ref["crps"] = float(ps.crps_gaussian(y, mu, s).mean())
        ref["nll"] = float(-stats.norm.logpdf(y, mu, s).mean())
    for lv in LEVELS:
        lo, hi = law.ppf((1 - lv) / 2, mu, s), law.ppf((1 + lv) / 2, mu, s)
        key = f"{round(100 * lv)}"
        ref[f"coverage_{key}"] = float(((lo <= y) & (y <= hi)).mean())
        ref[f"width_{key}"] = float((hi - lo).mean())
    return ref


# ---------------------------------------------------------------- the main fit (normal)
@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("regfit")
    data = loader(make_data(N_TRAIN, 1)), loader(make_data(N_VAL, 2))
    return checkpointed_fit(tmp, Reg, RegressionMonitor(), data, 2, monitor="val/crps", mode="min")


def test_every_key_logged_each_epoch_equal_to_references(fitted):
    monitor = fitted["monitor"]
    assert monitor.metrics == (
        "crps", "nll", "pit_ece",
        "coverage_50", "width_50", "coverage_80", "width_80",
        "coverage_90", "width_90", "coverage_95", "width_95",
    )  # fmt: skip
    rows = [
        r for r in read_csv(os.path.join(fitted["csv"].log_dir, "metrics.csv")) if r.get("val/crps")
    ]
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    for r in rows:
        assert all(r[f"val/{k}"] != "" for k in monitor.metrics)
    ref = reference("normal", fitted["model"].seen[0])  # the last epoch's outputs
    for k, v in ref.items():
        assert float(rows[-1][f"val/{k}"]) == pytest.approx(v, abs=1e-12), k
        assert monitor.history[-1][k] == pytest.approx(v, abs=1e-12), k
    assert [h["n"] for h in monitor.history] == [N_VAL, N_VAL]
    assert sum(monitor.history[-1]["pit_counts"]) == N_VAL


def test_modelcheckpoint_monitors_val_crps(fitted):
    ck, hist = fitted["ckpt"], fitted["monitor"].history
    assert ck.best_model_path and os.path.exists(ck.best_model_path)
    assert float(ck.best_model_score) == pytest.approx(min(h["crps"] for h in hist), abs=1e-12)
    assert float(fitted["trainer"].callback_metrics["val/crps"]) == pytest.approx(
        hist[-1]["crps"], abs=1e-12
    )


def test_csv_tables_per_epoch(fitted):
    d = fitted["csv"].log_dir
    pit = read_csv(os.path.join(d, "pit.csv"))
    assert list(pit[0]) == ["epoch", "step", "bin", "lo", "hi", "count", "share", "density"]
    for e in (0, 1):  # the sanity check (2 batches) wrote nothing
        assert sum(int(r["count"]) for r in pit if int(r["epoch"]) == e) == N_VAL
    assert len(pit) == 20
    counts = [int(r["count"]) for r in pit if r["epoch"] == "1"]
    assert counts == fitted["monitor"].history[-1]["pit_counts"]
    cov = read_csv(os.path.join(d, "coverage.csv"))
    assert list(cov[0]) == [
        "epoch", "step", "level", "coverage", "stderr", "width", "interval_score",
    ]  # fmt: skip
    last = [r for r in cov if r["epoch"] == "1"]
    assert [float(r["level"]) for r in last] == list(LEVELS)
    h = fitted["monitor"].history[-1]
    for r in last:
        p = float(r["coverage"])
        assert p == pytest.approx(h[f"coverage_{round(100 * float(r['level']))}"], abs=1e-12)
        assert float(r["stderr"]) == pytest.approx(np.sqrt(p * (1 - p) / N_VAL), abs=1e-12)


def test_tensorboard_has_pit_text_and_figure(fitted):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(fitted["tb"].log_dir, size_guidance={"tensors": 0, "images": 0})
    ea.Reload()
    tags = ea.Tags()
    assert {"val/pit/text_summary", "val/coverage/text_summary"} <= set(tags["tensors"])
    text = ea.Tensors("val/pit/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert text.startswith("| bin | lo | hi | count | share | density |")
    assert len(ea.Images("val/pit_histogram")) == 2  # one per epoch
    assert {"val/crps", "val/nll", "val/pit_ece", "val/coverage_90"} <= set(tags["scalars"])


# ---------------------------------------------------------------- other outputs
def run_validate(
    tmp_path: Any, model: Reg, monitor: RegressionMonitor, *loaders: DataLoader, **kw: Any
):
    tr = trainer(tmp_path, callbacks=[monitor], **kw)
    return tr, tr.validate(model, list(loaders) if len(loaders) > 1 else loaders[0], verbose=False)


@pytest.mark.parametrize("family", ["laplace", "logistic"])
def test_other_closed_forms_against_scipy(tmp_path, family):
    torch.manual_seed(0)
    model, monitor = Reg(), RegressionMonitor(family=family, sinks=())
    _, out = run_validate(tmp_path, model, monitor, loader(make_data(N_VAL, 3)))
    assert "val/nll" not in out[0]
    for k, v in reference(family, model.seen[0]).items():
        assert out[0][f"val/{k}"] == pytest.approx(v, abs=1e-12), k
    assert out[0]["val/crps"] > 0


def test_quantile_outputs(tmp_path):
    torch.manual_seed(0)
    model = Reg("quantiles")
    monitor = RegressionMonitor(family="quantiles", sinks=("csv",))
    tr = trainer(tmp_path, callbacks=[monitor], logger=CSVLogger(str(tmp_path), name="q"))
    out = tr.test(model, loader(make_data(N_VAL, 4)), verbose=False)[0]
    assert set(out) == {f"test/{k}" for k in monitor.metrics} and "test/crps" not in out
    seen = model.seen[0]
    q, y = cat(seen, "quantiles"), cat(seen, "target")
    tau = np.array(Q_LEVELS, dtype=np.float32).astype(np.float64)  # the step's float32 levels
    pinball = np.maximum(tau * (y[:, None] - q), (tau - 1) * (y[:, None] - q))
    assert out["test/quantile_score"] == pytest.approx(pinball.mean(), abs=1e-12)
    for lv in LEVELS:
        lo = q[:, np.argmin(np.abs(tau - (1 - lv) / 2))]
        hi = q[:, np.argmin(np.abs(tau - (1 + lv) / 2))]
        key = round(100 * lv)
        assert out[f"test/coverage_{key}"] == pytest.approx(
            ((lo <= y) & (y <= hi)).mean(), abs=1e-12
        )
        assert out[f"test/width_{key}"] == pytest.approx((hi - lo).mean(), abs=1e-12)
    pit = torch.cat(
        [pit_quantiles(s["quantiles"].double(), s["levels"], s["target"].double()) for s in seen]
    )
    assert out["test/pit_ece"] == pytest.approx(pit_ece_np(pit.numpy()), abs=1e-12)
    assert os.path.exists(os.path.join(tr.loggers[0].log_dir, "test_pit.csv"))


def test_ensemble_outputs(tmp_path):
    torch.manual_seed(0)
    model, monitor = Reg("ensemble"), RegressionMonitor(family="ensemble", sinks=(), seed=3)
    _, out = run_validate(tmp_path, model, monitor, loader(make_data(N_VAL, 5)))
    seen = model.seen[0]
    x, y = cat(seen, "samples"), cat(seen, "target")
    # the fair ensemble CRPS, brute force over all member pairs
    fair = np.abs(x - y[:, None]).mean(1) - np.abs(x[:, :, None] - x[:, None, :]).sum((1, 2)) / (
        2 * M * (M - 1)
    )
    assert out[0]["val/crps"] == pytest.approx(fair.mean(), abs=1e-12)
    for lv in LEVELS:
        lo, hi = np.quantile(x, (1 - lv) / 2, axis=1), np.quantile(x, (1 + lv) / 2, axis=1)
        key = round(100 * lv)
        assert out[0][f"val/coverage_{key}"] == pytest.approx(
            ((lo <= y) & (y <= hi)).mean(), abs=1e-12
        )
        assert out[0][f"val/width_{key}"] == pytest.approx((hi - lo).mean(), abs=1e-12)
    g = torch.Generator().manual_seed(3)  # the monitor's seed (+ rank 0), reseeded per epoch
    pit = torch.cat(
        [pit_ensemble(s["samples"].double(), s["target"].double(), generator=g) for s in seen]
    )
    assert out[0]["val/pit_ece"] == pytest.approx(pit_ece_np(pit.numpy()), abs=1e-12)


def test_two_dataloaders(tmp_path):
    torch.manual_seed(0)
    model, monitor = Reg(), RegressionMonitor(levels=(0.9,), dataloader_idx=1, sinks=("csv",))
    tr, out = run_validate(
        tmp_path,
        model,
        monitor,
        loader(make_data(96, 6)),
        loader(make_data(64, 7)),
        logger=CSVLogger(str(tmp_path), name="two"),
    )
    merged = {**out[0], **out[1]}
    assert set(merged) == {f"val/{k}" for k in monitor.metrics} | {
        f"val/{k}/dataloader_idx_0" for k in monitor.metrics
    }
    for idx, sfx in ((0, "/dataloader_idx_0"), (1, "")):
        ref = float(
            ps.crps_gaussian(
                cat(model.seen[idx], "target"),
                cat(model.seen[idx], "loc"),
                cat(model.seen[idx], "scale"),
            ).mean()
        )
        assert merged[f"val/crps{sfx}"] == pytest.approx(ref, abs=1e-12)
    d = tr.loggers[0].log_dir
    assert sum(int(r["count"]) for r in read_csv(os.path.join(d, "pit.csv"))) == 64
    assert sum(int(r["count"]) for r in read_csv(os.path.join(d, "pit_dataloader_idx_0.csv"))) == 96
    assert [h["n"] for h in monitor.history] == [96, 64]


def test_verbose_prints_the_pit_table(tmp_path, caplog):
    torch.manual_seed(0)
    with info_log(caplog):
        run_validate(
            tmp_path,
            Reg(),
            RegressionMonitor(levels=(0.9,), sinks=(), verbose=True),
            loader(make_data(64, 8)),
        )
    text = caplog.text
    assert "[RegressionMonitor] val epoch 0" in text and "crps=" in text
    assert "bin" in text and "density" in text and "#" in text and "coverage" in text


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "kind, bad, match",
    [
        ("normal", "scale", "^scale"),
        ("normal", "loc", "^loc"),
        ("normal", "target", "^target"),
        ("normal", "missing", "^outputs"),
        ("quantiles", "quantiles", "^quantiles"),
        ("quantiles", "levels", "^levels"),
    ],
)
def test_bad_outputs_raise_at_the_first_validation_batch(tmp_path, kind, bad, match):
    model = Reg(kind, bad=bad)
    monitor = RegressionMonitor(family="quantiles" if kind == "quantiles" else "normal", sinks=())
    tr = trainer(tmp_path, callbacks=[monitor], num_sanity_val_steps=1, max_epochs=1)
    with pytest.raises(ValueError, match=match):
        tr.fit(model, loader(make_data(64, 9)), loader(make_data(64, 10)))
    assert model.trained == 0 and len(model.seen[0]) == 1  # the sanity check's first batch


def test_wrong_family_names_the_family(tmp_path):
    with pytest.raises(ValueError, match="^family: .*family='ensemble'"):
        run_validate(
            tmp_path, Reg("ensemble"), RegressionMonitor(sinks=()), loader(make_data(32, 11))
        )


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(levels=(0.9, 0.5)), "^levels"),
        (dict(levels=(0.5, 1.0)), "^levels"),
        (dict(n_bins=0), "^n_bins"),
        (dict(family="gamma"), "^family"),
        (dict(sinks=("email",)), "^sinks"),
        (dict(dataloader_idx=-1), "^dataloader_idx"),
        (dict(name="/x"), "^name"),
    ],
)
def test_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        RegressionMonitor(**kw)


# ---------------------------------------------------------------- DDP
@pytest.mark.ddp
def test_ddp_spawn_matches_single_process(tmp_path):
    from _callbacks_helpers import RankShard

    loaders = [
        DataLoader(RankSplit(make_data(150, 12), 40), batch_size=BATCH),  # unequal shards
        DataLoader(RankShard(make_data(70, 13)), batch_size=BATCH),  # rank 1 has none
    ]
    monitor = lambda: RegressionMonitor(levels=(0.5, 0.9), sinks=("csv",))  # noqa: E731
    single, ddp = single_and_ddp(tmp_path, Reg, monitor, loaders)
    for f in (
        "pit.csv",
        "pit_dataloader_idx_1.csv",
        "coverage.csv",
        "coverage_dataloader_idx_1.csv",
    ):
        a, b = read_csv(os.path.join(single, f)), read_csv(os.path.join(ddp, f))
        assert len(a) == len(b) > 0
        for ra, rb in zip(a, b):
            for col in ra:
                assert float(ra[col]) == pytest.approx(float(rb[col]), rel=1e-12, abs=1e-15), (
                    f,
                    col,
                )
    assert sum(int(r["count"]) for r in read_csv(os.path.join(ddp, "pit.csv"))) == 150
    ma, mb = (
        read_csv(os.path.join(single, "metrics.csv")),
        read_csv(os.path.join(ddp, "metrics.csv")),
    )
    keys = [k for k in ma[0] if k.startswith("val/")]
    assert len(keys) == 2 * 7  # crps, nll, pit_ece, 2 x (coverage, width), for each loader
    for k in keys:
        va = next(float(r[k]) for r in ma if r[k])
        vb = next(float(r[k]) for r in mb if r[k])
        assert va == pytest.approx(vb, rel=1e-12, abs=1e-15), k
