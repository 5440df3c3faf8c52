"""Stated confidences (an LLM judge's "85%"): the report says how concentrated they are and,
on a 0.05 / 0.1 grid, bins them one grid value per bin (and says so)."""

from __future__ import annotations

import json

import pytest
import torch

from torchcal import cli
from torchcal.audit import Auditor, audit
from torchcal.audit.example import make_stated_data


def _grid_data(step: float, n: int = 3000, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(0, round(1 / step) + 1, (n,), generator=g)
    p = k.double() * step
    p = torch.tensor([float(f"{v:.2f}") for v in p.tolist()], dtype=torch.float64)  # as parsed
    y = (torch.rand(n, generator=g, dtype=torch.float64) < p).long()
    return p, y


@pytest.mark.parametrize(("step", "bins"), [(0.1, 11), (0.05, 21)])
def test_grid_values_get_one_bin_each(step: float, bins: int) -> None:
    p, y = _grid_data(step)
    r = audit(p, y, threshold=0.8)
    assert r.settings["n_bins"] == bins and r.settings["bins_from_grid"] == step
    rows = r.pooled["table"]
    values = sorted(set(p.tolist()))
    assert len(rows) == len(values)  # one non-empty bin per value used
    for row, v in zip(rows, values):
        assert row["confidence"] == pytest.approx(v, abs=1e-12)  # a bin holds one value
        assert row["n"] == int((p == v).sum())
    c = r.settings["confidences"]
    assert c["grid"] == step and c["distinct"] == len(values) and c["min"] == min(values)
    assert f"sit on a {step:g} grid: {bins} bins" in r.to_text()


def test_explicit_bins_and_off_grid_values_keep_equal_width_bins() -> None:
    p, y = _grid_data(0.1)
    assert audit(p, y, n_bins=10).settings["n_bins"] == 10  # asked for: kept
    q = p.clone()
    q[0] = 0.123  # one value off the grid
    r = audit(q, y)
    assert r.settings["n_bins"] == 10 and r.settings["bins_from_grid"] is None


def test_grid_is_tracked_across_chunks_and_groups() -> None:
    p, y = _grid_data(0.05, n=4000, seed=1)
    g = torch.arange(4000) % 3
    one = audit(p, y, groups=g, group_names=["a", "b", "c"])
    a = Auditor()
    for i in range(0, 4000, 333):
        a.update(p[i : i + 333], y[i : i + 333], g[i : i + 333])
    many = a.report(group_names=["a", "b", "c"])
    assert one.settings["n_bins"] == many.settings["n_bins"] == 21
    for name in ("a", "b", "c"):
        assert one.groups[name]["table"] == many.groups[name]["table"]
        assert one.groups[name]["n"] == int((g == "abc".index(name)).sum())


def test_concentration_is_a_finding() -> None:
    p = torch.full((500,), 0.9, dtype=torch.float64)
    p[:50] = 0.85
    y = (torch.arange(500) % 10 < 7).long()
    r = audit(p, y)
    c = r.settings["confidences"]
    assert c["distinct"] == 2 and c["top_value"] == 0.9 and c["top_share"] == 0.9
    assert c["iqr"] == 0.0 and "90% of the rows state the same confidence 0.9" in r.to_text()


def test_example_stated_writes_percent_strings_the_audit_reads(tmp_path, capsys) -> None:
    path = tmp_path / "stated.csv"
    assert cli.main(["example", str(path), "--kind", "stated", "--n", "1500"]) == 0
    lines = path.read_text().splitlines()
    assert lines[0] == "id,domain,confidence,correct" and lines[1].split(",")[2].endswith("%")
    capsys.readouterr()
    argv = ["--probs", "confidence", "--label", "correct", "--group", "domain", "--out"]
    code = cli.main(["audit", str(path), *argv, str(tmp_path / "r")])
    out = capsys.readouterr().out
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert rep["settings"]["n_bins"] == 21 and rep["settings"]["bins_from_grid"] == 0.05
    assert rep["groups"]["open_qa"]["verdict"] == "fail" and code == 1
    assert "sit on a 0.05 grid" in out and "percents read" in out
    d = make_stated_data(1500)
    assert rep["pooled"]["n"] == len(d["domain"])
