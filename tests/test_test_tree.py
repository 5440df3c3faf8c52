"""The test tree collects from a clean clone: pytest's default import mode (rootdir-relative,
no ``__init__.py`` in the test folders) refuses two test modules of one basename, so CI would
stop at collection."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for folder in ("tests", "recipes", "torchcal"):
        for path in (ROOT / folder).rglob("test_*.py"):
            seen[path.name].append(str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"test modules sharing a basename: {clashes}"
