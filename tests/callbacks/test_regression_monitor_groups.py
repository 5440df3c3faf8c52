"""RegressionMonitor(num_groups=...): per-group PIT tables, coverage and width per level with
their standard errors, as scalars (``val/group_{g}/coverage_90``), in the CSV/text/markdown
tables and the history; every value against filtering by group and the functional API (and
scipy/numpy float64); bad group ids at the first batch; two dataloaders; checkpoints."""

from __future__ import annotations

import csv
import os
from typing import Any

import numpy as np
import pytest
import torch
from _callbacks_helpers import LocScaleNet, checkpointed_fit, info_log, quiet_warnings, trainer
from _ddp_runs import RankSplit, single_and_ddp
from scipy import stats
from torch.utils.data import DataLoader, TensorDataset

from torchcal.callbacks import RegressionMonitor
from torchcal.callbacks import _regression_parts as P
from torchcal.functional import interval_coverage, pit_calibration_error, pit_normal, pit_quantiles

LEVELS = (0.5, 0.9)
G = 4  # group 3 never occurs: an empty group
Q_LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)  # holds the ends of LEVELS


@pytest.fixture(autouse=True)
def _quiet():
    quiet_warnings()


def make_data(n: int, seed: int) -> TensorDataset:
    """x ~ U(0, 1), y = 2x + N(0, (0.1 + 0.5x)^2), group = the third of [0, 1] holding x (the
    noise grows with x, so a homoscedastic forecast covers the groups differently)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g)
    y = 2 * x[:, 0] + (0.1 + 0.5 * x[:, 0]) * torch.randn(n, generator=g)
    return TensorDataset(x, y, torch.clamp((3 * x[:, 0]).long(), max=2))


def loader(ds: TensorDataset, batch_size: int = 32) -> DataLoader:
    return DataLoader(ds, batch_size=batch_size, shuffle=False)


class Reg(LocScaleNet):
    """A (loc, scale) network; the step returns the group ids under ``key`` (``bad`` corrupts
    them) and records every output of the epoch in ``seen``."""

    def __init__(self, kind: str = "normal", bad: str = "", key: str = "group") -> None:
        super().__init__()
        self.kind, self.bad, self.key = kind, bad, key

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        loc, scale = self(batch[0])
        if self.kind == "quantiles":
            lv = torch.tensor(Q_LEVELS, dtype=torch.float64)
            q = loc[:, None].double() + scale[:, None].double() * torch.special.ndtri(lv)
            out: dict[str, Any] = {"quantiles": q, "levels": lv}
        else:
            out = {"loc": loc, "scale": scale}
        out = {**out, "target": batch[1], self.key: batch[2]}
        if self.bad == "missing":
            del out[self.key]
        elif self.bad == "range":
            out[self.key] = batch[2].clone()
            out[self.key][5] = 7
        elif self.bad == "negative":
            out[self.key] = batch[2] - 1
        elif self.bad == "float":
            out[self.key] = batch[2].float()
        elif self.bad == "shape":
            out[self.key] = batch[2][:, None]
        self.seen.setdefault(dataloader_idx, []).append(
            {k: v.detach().clone() for k, v in out.items()}
        )
        return out


def cat(seen: list[dict[str, torch.Tensor]], key: str) -> torch.Tensor:
    return torch.cat([s[key] for s in seen])


def read_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def group_reference(seen: list[dict[str, torch.Tensor]], n_bins: int = 10) -> dict[int, dict]:
    """Per group: filter the epoch's outputs, then the functional API (PIT, its calibration
    error, coverage) and scipy/numpy (interval ends, width, stderr), all float64."""
    mu, s, y = (cat(seen, k).double() for k in ("loc", "scale", "target"))
    gid = cat(seen, "group")
    ref = {}
    for g in range(G):
        m = gid == g
        if not bool(m.any()):
            continue
        pit = pit_normal(mu[m], s[m], y[m])
        r: dict[str, Any] = {
            "n": int(m.sum()),
            "pit_ece": float(pit_calibration_error(pit, n_bins)),
            "pit_counts": np.bincount(
                np.minimum(np.floor(pit.numpy() * n_bins), n_bins - 1).astype(int),
                minlength=n_bins,
            ).tolist(),
        }
        for lv in LEVELS:
            lo, hi = (
                torch.from_numpy(stats.norm.ppf(p, mu[m].numpy(), s[m].numpy()))
                for p in ((1 - lv) / 2, (1 + lv) / 2)
            )
            cov = float(interval_coverage(lo, hi, y[m]))
            key = f"{round(100 * lv)}"
            r[f"coverage_{key}"] = cov
            r[f"width_{key}"] = float((hi - lo).mean())
            r[f"stderr_{key}"] = float(np.sqrt(cov * (1 - cov) / r["n"]))
        ref[g] = r
    return ref


# ---------------------------------------------------------------- a fit with checkpoints
@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reggroups")
    monitor = RegressionMonitor(levels=LEVELS, num_groups=G, sinks=("csv",))
    data = loader(make_data(96, 1)), loader(make_data(150, 2))
    return checkpointed_fit(tmp, Reg, monitor, data, 1, monitor="val/crps", save_last=True)


def test_group_scalars_equal_filtered_functional(fitted):
    monitor, tr = fitted["monitor"], fitted["trainer"]
    assert monitor.group_metrics == (
        "pit_ece",
        "coverage_50",
        "width_50",
        "coverage_90",
        "width_90",
    )
    ref = group_reference(fitted["model"].seen[0])  # the last epoch's outputs
    assert sorted(ref) == [0, 1, 2]
    rows = [
        r for r in read_csv(os.path.join(fitted["csv"].log_dir, "metrics.csv")) if r.get("val/crps")
    ]
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    hist = monitor.history[-1]["group_metrics"]
    assert len(hist) == G and hist[3] is None
    for g, r in ref.items():
        assert hist[g]["n"] == r["n"]
        for key in monitor.group_metrics:
            name = f"val/group_{g}/{key}"
            assert float(rows[-1][name]) == pytest.approx(r[key], abs=1e-12), name
            assert float(tr.callback_metrics[name]) == pytest.approx(r[key], abs=1e-12), name
            assert hist[g][key] == pytest.approx(r[key], abs=1e-12), name
    assert not any(k.startswith("val/group_3/") for k in rows[-1])  # the empty group
    # the conditional failure the pooled number hides: the groups' coverages differ
    assert {round(ref[g]["coverage_90"], 6) for g in ref} != {
        round(monitor.history[-1]["coverage_90"], 6)
    }
    assert sum(r["n"] for r in ref.values()) == monitor.history[-1]["n"] == 150


def test_group_csv_tables(fitted):
    d = fitted["csv"].log_dir
    ref = group_reference(fitted["model"].seen[0])
    pit = read_csv(os.path.join(d, "pit_groups.csv"))
    assert list(pit[0]) == [
        "epoch", "step", "group", "bin", "lo", "hi", "count", "share", "density",
    ]  # fmt: skip
    cov = read_csv(os.path.join(d, "coverage_groups.csv"))
    assert list(cov[0]) == [
        "epoch", "step", "group", "n", "level", "coverage", "stderr", "width", "interval_score",
    ]  # fmt: skip
    for e in (0, 1):  # one block per epoch (the sanity check wrote nothing)
        assert sorted({int(r["group"]) for r in pit if int(r["epoch"]) == e}) == [0, 1, 2]
        assert len([r for r in cov if int(r["epoch"]) == e]) == 3 * len(LEVELS)
    for g, r in ref.items():
        counts = [int(x["count"]) for x in pit if x["epoch"] == "1" and int(x["group"]) == g]
        assert counts == r["pit_counts"]
        for x in (x for x in cov if x["epoch"] == "1" and int(x["group"]) == g):
            key = f"{round(100 * float(x['level']))}"
            assert int(x["n"]) == r["n"]
            for col in ("coverage", "width", "stderr"):
                assert float(x[col]) == pytest.approx(r[f"{col}_{key}"], abs=1e-12), (g, col)
    # the pooled tables are those of an ungrouped monitor
    assert (
        sum(int(r["count"]) for r in read_csv(os.path.join(d, "pit.csv")) if r["epoch"] == "1")
        == 150
    )


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_checkpoint_keeps_group_history_and_resumes(fitted, tmp_path):
    ckpt, monitor = fitted["ckpt"], fitted["monitor"]
    state = torch.load(ckpt.last_model_path, weights_only=False)["callbacks"]
    assert "'num_groups': 4" in monitor.state_key and monitor.state_key in state
    assert state[monitor.state_key]["history"] == monitor.history
    assert "num_groups" not in RegressionMonitor(levels=LEVELS).state_key  # ungrouped: unchanged
    resumed = RegressionMonitor(levels=LEVELS, num_groups=G, sinks=())
    tr = trainer(tmp_path, max_epochs=3, callbacks=[resumed], num_sanity_val_steps=0)
    tr.fit(
        Reg(), loader(make_data(96, 1)), loader(make_data(150, 2)), ckpt_path=ckpt.last_model_path
    )
    assert resumed.history[:2] == monitor.history
    assert len(resumed.history) == 3 and resumed.history[-1]["group_metrics"][3] is None


# ---------------------------------------------------------------- other runs
def test_two_dataloaders_per_group(tmp_path):
    torch.manual_seed(0)
    model, monitor = Reg(), RegressionMonitor(levels=(0.9,), num_groups=G, sinks=())
    tr = trainer(tmp_path, callbacks=[monitor])
    out = tr.validate(model, [loader(make_data(80, 6)), loader(make_data(60, 7))], verbose=False)
    for idx, sfx in ((0, ""), (1, "/dataloader_idx_1")):
        for g, r in group_reference(model.seen[idx]).items():
            for key in monitor.group_metrics:
                assert out[idx][f"val/group_{g}/{key}{sfx}"] == pytest.approx(r[key], abs=1e-12)
    assert [sum(h["n"] for h in m["group_metrics"] if h) for m in monitor.history] == [80, 60]


def test_quantile_family_per_group(tmp_path):
    torch.manual_seed(0)
    model = Reg("quantiles")
    monitor = RegressionMonitor(levels=LEVELS, family="quantiles", num_groups=G, sinks=())
    out = trainer(tmp_path, callbacks=[monitor]).validate(
        model, loader(make_data(120, 8)), verbose=False
    )[0]
    seen = model.seen[0]
    q, y, gid = cat(seen, "quantiles"), cat(seen, "target").double(), cat(seen, "group")
    for g in range(3):
        m = gid == g
        pit = pit_quantiles(q[m], Q_LEVELS, y[m])
        assert out[f"val/group_{g}/pit_ece"] == pytest.approx(
            float(pit_calibration_error(pit)), abs=1e-12
        )
        lo, hi = q[m][:, 0], q[m][:, -1]  # the 0.05 and 0.95 quantiles: the 90 % interval
        assert out[f"val/group_{g}/coverage_90"] == pytest.approx(
            float(interval_coverage(lo, hi, y[m])), abs=1e-12
        )
        assert out[f"val/group_{g}/width_90"] == pytest.approx(float((hi - lo).mean()), abs=1e-12)


def test_verbose_and_markdown_group_tables(tmp_path, caplog):
    torch.manual_seed(0)
    monitor = RegressionMonitor(levels=(0.9,), num_groups=G, sinks=(), verbose=True)
    with info_log(caplog):
        trainer(tmp_path, callbacks=[monitor]).validate(
            Reg(), loader(make_data(64, 9)), verbose=False
        )
    assert "group" in caplog.text and "stderr" in caplog.text
    groups = {
        "n": torch.tensor([3, 0]),
        "pit": {"counts": torch.tensor([[1, 2], [0, 0]])},
        "coverage": {c: torch.tensor([[2 / 3], [float("nan")]]) for c in P.COVERAGE_COLUMNS},
    }
    pit, cov = P.group_rows(torch.tensor([0.9], dtype=torch.float64), groups)
    assert [r["group"] for r in pit] == [0, 0] and [r["count"] for r in pit] == [1, 2]
    md = P.rows_markdown(cov).splitlines()
    assert md[0] == "| group | n | level | coverage | stderr | width | interval_score |"
    assert md[2] == "| 0 | 3 | 0.9000 | 0.6667 | 0.6667 | 0.6667 | 0.6667 |" and len(md) == 3


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "bad, key, match",
    [
        ("missing", "group", r"^group: RegressionMonitor\(num_groups=4\) needs"),
        ("missing", "domain", "^domain: "),
        ("range", "group", r"^group: expected group ids in \[0, 3\], got 7 at position"),
        ("negative", "group", r"^group: expected group ids in \[0, 3\], got -1"),
        ("float", "group", "^group: expected integer group ids"),
        ("shape", "domain", r"^domain: expected one group id per sample, shape \(32,\)"),
    ],
)
def test_bad_groups_raise_at_the_first_batch(tmp_path, bad, key, match):
    model = Reg(bad=bad, key=key)
    monitor = RegressionMonitor(num_groups=G, group_key=key, sinks=())
    tr = trainer(tmp_path, callbacks=[monitor], num_sanity_val_steps=1, max_epochs=1)
    with pytest.raises(ValueError, match=match):
        tr.fit(model, loader(make_data(64, 9)), loader(make_data(64, 10)))
    assert model.trained == 0 and len(model.seen[0]) == 1  # the sanity check's first batch


def test_group_ids_without_num_groups_warn_once(tmp_path):
    monitor = RegressionMonitor(levels=(0.9,), sinks=())
    with pytest.warns(UserWarning, match="num_groups is not set") as rec:
        out = trainer(tmp_path, callbacks=[monitor]).validate(
            Reg(), loader(make_data(96, 3)), verbose=False
        )
    assert len([w for w in rec if "num_groups is not set" in str(w.message)]) == 1  # 3 batches
    assert not any("group_" in k for k in out[0]) and monitor.history[-1]["group_metrics"] is None


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(num_groups=0), "^num_groups"),
        (dict(group_key=""), "^group_key"),
        (dict(group_key="target"), "^group_key"),
        (dict(group_key="levels", family="quantiles"), "^group_key"),
    ],
)
def test_bad_group_options(kw, match):
    with pytest.raises(ValueError, match=match):
        RegressionMonitor(**kw)
    with pytest.raises(TypeError, match="^num_groups: expected an int"):
        RegressionMonitor(num_groups=2.5)


# ---------------------------------------------------------------- DDP
@pytest.mark.ddp
def test_ddp_spawn_groups_match_single_process(tmp_path):
    monitor = lambda: RegressionMonitor(levels=LEVELS, num_groups=G, sinks=("csv",))  # noqa: E731
    val = DataLoader(RankSplit(make_data(150, 12), 40), batch_size=32)
    single, ddp = single_and_ddp(tmp_path, Reg, monitor, val)
    for f in ("pit_groups.csv", "coverage_groups.csv"):
        a, b = read_csv(os.path.join(single, f)), read_csv(os.path.join(ddp, f))
        assert len(a) == len(b) > 0
        for ra, rb in zip(a, b):
            for col in ra:
                assert float(ra[col]) == pytest.approx(float(rb[col]), rel=1e-12, abs=1e-15)
    ma, mb = (read_csv(os.path.join(d, "metrics.csv")) for d in (single, ddp))
    keys = [k for k in ma[0] if k.startswith("val/group_")]
    assert len(keys) == 3 * 5  # groups 0-2 (3 is empty) x (pit_ece, 2 x (coverage, width))
    for k in keys:
        va = next(float(r[k]) for r in ma if r[k])
        vb = next(float(r[k]) for r in mb if r[k])
        assert va == pytest.approx(vb, rel=1e-12, abs=1e-15), k
