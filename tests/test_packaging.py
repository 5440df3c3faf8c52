"""What a user installs: one version string, only the ``torchcal`` package, Lightning optional.

The wheel itself (its file list, a fresh venv, a smoke test) is checked by ``.ci/run``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import torchcal
from torchcal.cli import main

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (CI); 3.10 has no TOML reader
ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_comes_from_the_package_metadata():
    assert torchcal.__version__ == PYPROJECT["project"]["version"]


def test_cli_prints_the_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"torchcal {torchcal.__version__}"


def test_only_torchcal_is_installed():
    # a top-level `recipes` package in site-packages would shadow any user module of that name
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["torchcal*"]


def test_core_dependencies_are_the_library_only():
    names = {
        d.split(">")[0].split("=")[0].split("[")[0] for d in PYPROJECT["project"]["dependencies"]
    }
    assert names == {"torch", "numpy", "torchmetrics"}
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {"audit", "lightning", "engines", "docs", "dev"} <= set(extras)


BLOCK_LIGHTNING = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("lightning", "pytorch_lightning", "pyarrow"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, Block())
import torch
import torchcal
from torchcal.functional import brier_score
from torchcal.losses import LogScoreLoss
from torchcal.metrics import CalibrationError
from torchcal.scaling import TemperatureScaler
import torchcal.audit, torchcal.cli

logits, y = torch.randn(64, 3), torch.randint(0, 3, (64,))
LogScoreLoss()(logits, y).item(), brier_score(logits, y).item()
m = CalibrationError(n_bins=5)
m.update(logits, y)
TemperatureScaler().fit(logits, y)
print(float(m.compute()) >= 0)
"""


@pytest.mark.timeout(120)
def test_library_works_without_lightning_or_pyarrow():
    # the core install (torch, numpy, torchmetrics) is enough for every non-Lightning module
    out = subprocess.run(
        [sys.executable, "-c", BLOCK_LIGHTNING],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
