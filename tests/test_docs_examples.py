"""Every ```python block of README.md and of docs/**/*.md runs as written (so the quickstarts
cannot rot): each block in a fresh temporary folder, as a script of its own."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import matplotlib
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCKS = [
    (page.relative_to(ROOT).as_posix(), i, code)
    for page in PAGES
    for i, code in enumerate(re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M))
]


def test_readme_has_a_runnable_example():
    assert any(page == "README.md" for page, _, _ in BLOCKS), "README.md lost its example"


def test_docs_have_the_quickstarts():
    pages = {page for page, _, _ in BLOCKS}
    for name in ("losses", "metrics", "scaling", "lightning", "regression"):
        assert f"docs/getting-started/{name}.md" in pages, f"{name} quickstart lost its example"


@pytest.mark.parametrize(("page", "index", "code"), BLOCKS, ids=[f"{p}:{i}" for p, i, _ in BLOCKS])
def test_block_runs(page, index, code, tmp_path, monkeypatch):
    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)  # blocks may write logs or checkpoints
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, f"{page} block {index}", "exec"), {"__name__": "__docs__"})
