"""Regression tests of issue 29's smaller defects: each was seen on the command line."""

from __future__ import annotations

import json

import pytest
import torch

from torchcal.audit import audit
from torchcal.audit.example import write_judging_csv, write_stated_csv
from torchcal.audit.state import generator_seed
from torchcal.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_group_named_pooled_does_not_take_the_pooled_diagram(tmp_path):
    pytest.importorskip("matplotlib")
    g = torch.Generator().manual_seed(0)
    p = torch.rand(600, generator=g, dtype=torch.float64)
    y = (torch.rand(600, generator=g, dtype=torch.float64) < p).long()
    r = audit(p, y, groups=torch.arange(600) % 2, group_names=["pooled", "x"])
    r.save(tmp_path)
    d = json.loads((tmp_path / "report.json").read_text())["diagrams"]
    assert d["pooled"] == "reliability_pooled.png"
    assert d["group:pooled"] == "reliability_group_0_pooled.png"
    assert len(set(d.values())) == 3 and all((tmp_path / f).is_file() for f in d.values())


@pytest.mark.parametrize("big", [2**63, 2**64, -1, 10**30])
def test_seeds_of_any_size_have_their_own_sample(big):
    assert generator_seed(big) != generator_seed(0)
    assert generator_seed(big) != generator_seed(big + 1)
    assert 0 <= generator_seed(big) < 2**64 - 1
    p = torch.rand(400, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = (p > 0.5).long()
    a = audit(p, y, seed=0, sample_size=50).sample["preds"]
    b = audit(p, y, seed=big, sample_size=50).sample["preds"]
    assert not torch.equal(a, b)


def test_seeds_outside_int64_on_every_road(tmp_path, capsys):
    pytest.importorskip("duckdb")
    path = str(tmp_path / "j.csv")
    write_judging_csv(path, 300, 0)
    cols = ["--probs", "p_correct", "--label", "correct"]
    for road in ([], ["--engine", "duckdb"]):
        code, out, err = _run(capsys, "audit", path, *cols, *road, "--seed", str(2**70))
        assert code in (0, 1, 3) and not err.strip(), err


def test_reference_of_other_settings_is_refused_unless_allowed(tmp_path, capsys):
    path = str(tmp_path / "j.csv")
    write_judging_csv(path, 300, 0)
    cols = ["audit", path, "--probs", "p_correct", "--label", "correct", "--threshold", "0.8"]
    _run(capsys, *cols, "--out", str(tmp_path / "a"))
    ref = str(tmp_path / "a" / "report.json")
    code, out, err = _run(capsys, *cols, "--reference", ref)
    assert code != 2 and "compared with" in out  # the same settings: compared
    for other in (["--bins", "20"], ["--threshold", "0.7"]):
        code, out, err = _run(capsys, *cols[:-2], *other, "--reference", ref)
        assert code == 2 and not out and len(err.splitlines()) == 1
        assert ref in err and "this audit" in err and "--allow-mismatch" in err
    code, out, err = _run(
        capsys, *cols[:-2], "--bins", "20", "--reference", ref, "--allow-mismatch"
    )
    assert code != 2 and "compared with" in out


def test_user_errors_are_one_line_exit_2_naming_the_input(tmp_path, capsys):
    pytest.importorskip("duckdb")
    path = str(tmp_path / "s.csv")
    write_stated_csv(path, 200, 0)
    cols = ["--probs", "confidence", "--label", "correct"]
    code, out, err = _run(capsys, "audit", path, *cols, "--table", "t")
    assert code == 2 and "internal" not in err and path in err and "--table" in err
    code, out, err = _run(
        capsys, "audit", path, "--probs", "domain", "--label", "correct", "--engine", "memory"
    )
    assert code == 2 and "internal" not in err and "domain" in err and len(err.splitlines()) == 1
    # stated percents through --engine memory: the reader's rule (it crashed in pyarrow)
    code, out, err = _run(capsys, "audit", path, *cols, "--engine", "memory")
    assert code in (0, 1, 3) and "percents read" in out and "engine: memory" in out
