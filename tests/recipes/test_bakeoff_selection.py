"""The bake-off's checkpoint selections (refine, then calibrate): the checkpoint kept by
``val/nll`` and by ``val/refinement_nll`` are the epochs of lowest value, each with its own T,
and the report carries both, scored on test after that T."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
import torch.nn.functional as F

from recipes.loss_bakeoff.cli import main
from recipes.loss_bakeoff.data import make_data
from recipes.loss_bakeoff.losses import build_loss
from recipes.loss_bakeoff.model import train_one
from recipes.loss_bakeoff.report import selection_rows

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "bakeoff" / "tiny.yaml")


@pytest.fixture(scope="module")
def trained():
    data = make_data(0, n_train=200, n_val=200, n_test=500)
    # a high learning rate on 200 points: the raw NLL turns up an epoch before the NLL after T
    out = train_one(
        build_loss("log_score"), data.train, data.val, data.num_classes, seed=0,
        hidden=128, epochs=6, batch_size=50, lr=0.05, val_every=1, progress=False,
    )  # fmt: skip
    return data, out


def _argmin(history: list[dict], key: str) -> int:
    return min(history, key=lambda h: h[key])["epoch"]


def test_picks_are_the_epochs_of_lowest_value(trained):
    data, t = trained
    assert [h["epoch"] for h in t.temperature_history] == list(range(6))
    assert t.picks["val_nll"].epoch == _argmin(t.val_history, "nll")
    assert t.picks["refinement_nll"].epoch == _argmin(t.temperature_history, "refinement_nll")
    assert t.picks["val_nll"].epoch != t.picks["refinement_nll"].epoch  # a real difference
    x, y = data.val
    for pick in t.picks.values():
        h = t.temperature_history[pick.epoch]
        assert pick.temperature == pytest.approx(h["temperature"], rel=1e-12)
        with torch.no_grad():
            z = pick.net(x).double() / pick.temperature
        # the kept weights are that epoch's: they reproduce its validation NLL after T
        assert float(F.cross_entropy(z, y)) == pytest.approx(h["refinement_nll"], rel=1e-6)
    assert t.temperature == t.temperature_history[-1]["temperature"]  # the run's T: the last


def test_val_every_must_divide_the_epochs():
    data = make_data(0, n_train=20, n_val=10, n_test=10)
    for bad in (3, 0, True):
        with pytest.raises(ValueError, match=r"^model\.val_every: expected None or an int"):
            train_one(
                build_loss("log_score"), data.train, data.val, 5, seed=0, epochs=4,
                val_every=bad, progress=False,
            )  # fmt: skip


def test_report_has_both_selections(tmp_path, capsys):
    assert main(["--config", TINY, "--output_dir", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    for row in rep["rows"]:
        for s in row["seeds"]:
            assert set(s["picked"]) == {"val_nll", "refinement_nll"}
            for pick in s["picked"].values():
                assert 0 <= pick["epoch"] <= 3 and pick["temperature"] > 0
                assert pick["after"]["nll"] > 0
        assert set(row["picked"]["val_nll"]) >= {"epoch", "nll", "kl"}
    header, rows = selection_rows(rep)
    assert header[3] == "picked by val/nll" and header[5] == "picked by val/refinement_nll"
    assert [r[0] for r in rows] == ["log_score", "flsd53", "mmce"]
    for r, row in zip(rows, rep["rows"]):
        differ = sum(
            s["picked"]["val_nll"]["epoch"] != s["picked"]["refinement_nll"]["epoch"]
            for s in row["seeds"]
        )
        assert r[-2] == f"{differ}/2" and r[-1].endswith(f"/{differ}")
    text = (tmp_path / "report.txt").read_text()
    assert "Checkpoint selection: refine, then calibrate" in text
