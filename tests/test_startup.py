"""Start-up (issue 18): ``import torchcal`` and the torch-only sub-packages import neither
torchmetrics nor Lightning, scipy or matplotlib, and every public name still resolves
(the sub-packages are imported on first attribute access, PEP 562)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torchcal

HEAVY = ("torchmetrics", "lightning", "pytorch_lightning", "scipy", "matplotlib")
ROOT = Path(torchcal.__file__).resolve().parent.parent


def _run(code: str) -> object:
    """Run ``code`` in a fresh interpreter importing this checkout's torchcal; its last line
    of output, read as JSON."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_torch_only_imports_stay_light():
    """One fresh interpreter imports the torch-only parts step by step; after each step none
    of torchmetrics, Lightning, scipy, matplotlib is loaded."""
    code = f"""
import importlib, json, sys
steps = {{}}
for name in ("torchcal", "torchcal.functional", "torchcal.losses", "torchcal.scaling",
             "torchcal.rewards"):
    importlib.import_module(name)
    steps[name] = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
import torchcal
torchcal.functional, torchcal.losses  # attribute access of already imported packages
steps["attributes"] = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
print(json.dumps(steps))
"""
    steps = _run(code)
    assert steps == {k: [] for k in steps}, steps
    assert len(steps) == 6


def test_every_public_name_resolves_and_is_listed():
    assert torchcal.__all__ == [
        "GroupedResult",
        "ReliabilityTable",
        "functional",
        "losses",
        "metrics",
        "rewards",
        "scaling",
        "__version__",
    ]
    assert set(torchcal.__all__) <= set(dir(torchcal))
    for pkg in ("functional", "losses", "metrics", "scaling", "rewards"):
        mod = getattr(torchcal, pkg)
        assert [n for n in mod.__all__ if not hasattr(mod, n)] == [], pkg
        assert set(mod.__all__) <= set(dir(mod)), pkg
    assert torchcal.ReliabilityTable is torchcal.ReliabilityTable
    assert torchcal.metrics.CalibrationError.__module__ == "torchcal.metrics.calibration"


def test_an_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        torchcal.nope  # noqa: B018
    assert isinstance(torchcal.__version__, str)
