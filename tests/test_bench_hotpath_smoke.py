"""``benchmarks/bench_hotpath.py`` runs (a case for every loss, the control row, the table's
columns); no timing is asserted (speed goals live in the script, never in tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_hotpath_runs_and_prints_the_control_row():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_hotpath.py"),
            "--only",
            "Brier",
            "--sizes",
            "16x4",
            "--rounds",
            "7",
            "--runs",
            "1",
            "--block-ms",
            "0.2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("control ") for line in lines)
    shell = [line for line in lines if line.startswith("nn.CrossEntropyLoss ")]
    assert shell and "MISS" not in shell[0] and "ok" not in shell[0]  # context, no target
    assert any(line.startswith("BrierLoss ") and "x" in line for line in lines)
    assert lines[-2].startswith("on the line:") and lines[-1].startswith("misses:")


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_hotpath", ROOT / "benchmarks" / "bench_hotpath.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    path = list(sys.path)  # the script puts the working directory first
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
        sys.path[:] = path
    return module


def test_verdict_flags_runs_that_straddle_the_target():
    verdict = _bench_module().verdict
    assert verdict([1.08, 1.09, 1.10], 1.1) == "ok"  # every run within
    assert verdict([1.09, 1.10, 1.11], 1.1) == "line"  # median within, one run over
    assert verdict([1.08, 1.11, 1.12], 1.1) == "MISS"  # median over
    assert verdict([1.16], 1.15) == "MISS"
    assert verdict([1.15], 1.15) == "ok"
