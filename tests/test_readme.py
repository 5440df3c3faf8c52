"""Every ```python block of README.md runs as written (so the quickstarts cannot rot)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import matplotlib
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_quickstarts():
    assert len(BLOCKS) >= 4, "README.md lost its python quickstarts"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path, monkeypatch):
    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)  # blocks may write logs or checkpoints
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {"__name__": "__readme__"})
