"""``benchmarks/bench_maps.py --quick`` runs end to end (every data set, a row per map, the
table's columns) and a map that cannot be imported is a row, not a crash; no timing is
asserted (speed goals live in the script, never in tests)."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench_module():
    spec = importlib.util.spec_from_file_location(
        "bench_maps", ROOT / "benchmarks" / "bench_maps.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    path = list(sys.path)  # the script puts the checkout first
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
        sys.path[:] = path
    return module


def test_bench_maps_quick_prints_every_case():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_maps.py"),
            "--quick",
            "--sources",
            "torchcal",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("| data (fit / test rows) | map | source | test NLL | ECE |")
    for case in ("synthetic-T C=4", "synthetic-bias C=12", "synthetic-beta binary", "digits MLP"):
        assert any(line.startswith(f"| {case} (") for line in lines), case
    ts = [line for line in lines if "| TemperatureScaler | torchcal |" in line]
    assert len(ts) == 4 and all(line.count("|") == 8 and " s) |" in line for line in ts)
    # the first case's rows: none, truth, then the maps; a temperature beats no map there
    first = [line.split("|") for line in lines[2:] if line.startswith("|")][:3]
    assert [r[2].strip() for r in first] == ["none", "truth", "TemperatureScaler"]
    assert float(first[2][4]) < float(first[0][4])


def test_missing_map_is_listed_not_raised():
    bench = _bench_module()
    assert bench._import("torchcal.scaling.no_such_module:Scaler").startswith("not available")
    assert bench._import("torchcal.scaling:NoSuchScaler").startswith("not available")
    case = bench.synthetic(3, 40, 50, "T")
    m = bench.Map("Missing", "torchcal", "multiclass", bench._torchcal("torchcal.nope:X"))
    rows = bench.run_case(case, [m])
    assert rows[-1]["map"] == "Missing" and rows[-1]["note"].startswith("not available")
    assert [r["map"] for r in rows[:2]] == ["none", "truth"]


def test_scores_are_those_of_the_probabilities():
    import torch

    bench = _bench_module()
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], dtype=torch.float64)
    y = torch.tensor([0, 1])
    s = bench.score(p, y, binary=False)
    assert abs(s["nll"] + (math.log(0.7) + math.log(0.3)) / 2) < 1e-12
    assert s["accuracy"] == 0.5
    b = bench.score(torch.tensor([0.9, 0.4], dtype=torch.float64), y, binary=True)
    assert abs(b["nll"] + (math.log(0.1) + math.log(0.4)) / 2) < 1e-12
    assert b["accuracy"] == 0.0
