"""One import path per public name (docs/design.md section 2).

A public name lives in exactly one public namespace (the API reference's pages); inside the
package every name is imported from the module that defines it, and a module's ``__all__``
lists only what it defines, so there are no re-export facades. Names that moved are served
from their old path for one release with a ``FutureWarning`` naming the new one.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest

import torchcal

PACKAGE = Path(torchcal.__file__).resolve().parent
PUBLIC = [
    "torchcal",
    "torchcal.audit",
    "torchcal.callbacks",
    "torchcal.engines",
    "torchcal.functional",
    "torchcal.integrations",
    "torchcal.losses",
    "torchcal.metrics",
    "torchcal.plotting",
    "torchcal.rewards",
    "torchcal.scaling",
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def bindings(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names a module defines, names it binds by ``from ... import``), top level."""
    defined: set[str] = set()
    imported: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined.update(
                    n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)
                )
            elif isinstance(node, ast.ImportFrom):
                imported.update(a.asname or a.name for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                walk(node.body + node.orelse + getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    walk(handler.body)

    walk(tree.body)
    return defined - imported, imported


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
TREES = {m: ast.parse(p.read_text(encoding="utf-8")) for m, p in MODULES.items()}
DEFINED = {m: bindings(t)[0] for m, t in TREES.items()}


def declared_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return list(ast.literal_eval(node.value))
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "__all__":
            return list(ast.literal_eval(node.value)) if node.value else []
    return None


def test_a_public_name_has_one_public_namespace() -> None:
    home: dict[int, list[str]] = {}
    for ns in PUBLIC:
        module = importlib.import_module(ns)
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type(module)) or isinstance(value, (str, int, float, tuple)):
                continue  # sub-namespaces and plain constants (equal values need not be one object)
            home.setdefault(id(value), []).append(f"{ns}.{name}")
    assert [paths for paths in home.values() if len(paths) > 1] == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_exports_only_what_it_defines(module: str) -> None:
    names = declared_all(TREES[module])
    if names is None or module in PUBLIC or MODULES[module].name == "__init__.py":
        return
    assert [n for n in names if n not in DEFINED[module]] == []


def public_names() -> set[tuple[str, str]]:
    """``(defining module, name)`` of every name a public namespace exports."""
    found: set[tuple[str, str]] = set()
    for ns in PUBLIC:
        module = importlib.import_module(ns)
        sources = {  # constants carry no __module__: the namespace's own import says where
            alias.asname or alias.name: node.module
            for node in ast.walk(TREES[ns])
            if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names
        }
        for name in module.__all__:
            value = getattr(module, name)
            home = sources.get(name) or getattr(value, "__module__", None) or ns
            found.add((home, name))
            found.add((getattr(value, "__module__", home), name))
    return found


def test_a_module_all_lists_only_public_names() -> None:
    """A name is public iff a public namespace exports it (docs/design.md section 2): every
    other module's ``__all__`` lists only such names, so an internal helper has no entry."""
    public = public_names()
    half_public = {
        module: wrong
        for module in sorted(MODULES)
        if module not in PUBLIC
        and (names := declared_all(TREES[module]))
        and (wrong := [n for n in names if (module, n) not in public])
    }
    count = sum(map(len, half_public.values()))
    assert not half_public, f"{count} names in __all__ no public namespace exports: {half_public}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_name_is_imported_from_the_module_that_defines_it(module: str) -> None:
    """Function-local imports included; a package may be asked for its sub-modules."""
    wrong = []
    for node in ast.walk(TREES[module]):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
            continue
        if not node.module.startswith("torchcal") or node.module not in MODULES:
            continue
        for alias in node.names:
            if f"{node.module}.{alias.name}" in MODULES:
                continue
            if alias.name not in DEFINED[node.module]:
                wrong.append(f"line {node.lineno}: {alias.name} from {node.module}")
    assert wrong == []


MOVED = [
    ("torchcal.functional.calibration", "calibration_error", "torchcal.functional"),
    ("torchcal.functional.calibration", "BinnedStats", "torchcal.functional"),
    ("torchcal.functional.calibration", "as_float64", "torchcal.functional.calibration.nll"),
    (
        "torchcal.functional.calibration",
        "prepare_inputs",
        "torchcal.functional.calibration.readings",
    ),
    ("torchcal.report", "ReliabilityTable", "torchcal"),
    ("torchcal.report", "GroupedResult", "torchcal"),
    ("torchcal.report", "CSV_COLUMNS", "torchcal.functional.calibration.results"),
    ("torchcal.functional", "brier_reward", "torchcal.rewards"),
    ("torchcal.functional", "log_reward", "torchcal.rewards"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED)
def test_a_moved_name_warns_and_is_the_same_object(old: str, name: str, new: str) -> None:
    with pytest.warns(FutureWarning, match=f"{old}.{name} moved: import it from {new} "):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="has no attribute 'nope'"):
            _ = importlib.import_module("torchcal.report").nope


def test_every_name_the_old_calibration_package_exported_is_served() -> None:
    shim = importlib.import_module("torchcal.functional.calibration")
    names = shim.__getattr__.moved
    assert len(names) >= 54 and shim.__all__ == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for name, (module, _) in names.items():
            assert getattr(shim, name) is getattr(importlib.import_module(module), name)
