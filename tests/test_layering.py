"""torchcal's modules import one another along the layers of docs/design.md section 1, with no
cycle: every module under torchcal/ is parsed (not imported), every ``import`` of a torchcal
module found, function-local ones included (``if TYPE_CHECKING:`` blocks left out: they never
run), and the graph checked."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "torchcal"

#: docs/design.md section 1: what each part may import besides itself (and the standard
#: library and third-party packages). `torchcal.report` re-exports the result types of
#: `functional`, so it sits with it.
MAY_IMPORT = {
    "functional": set(),
    "report": {"functional"},
    "losses": {"functional"},
    "rewards": {"functional"},
    "plotting": {"functional"},
    "metrics": {"functional", "report", "plotting"},
    "scaling": {"functional", "report"},
    "callbacks": {"functional", "report", "metrics", "scaling", "plotting"},
    "engines": {"functional"},
    "audit": {"functional", "report", "metrics", "scaling", "plotting", "engines"},
    "integrations": {"functional", "report", "metrics", "scaling", "audit"},
    "_segment_options": set(),  # argparse only (the parser imports no torch)
    "cli": {
        "_segment_options",
        "torchcal",
        "functional",
        "report",
        "metrics",
        "scaling",
        "plotting",
        "audit",
        "integrations",
    },
    "torchcal": {
        "functional",
        "report",
        "losses",
        "rewards",
        "plotting",
        "metrics",
        "scaling",
        "callbacks",
        "audit",
        "engines",
        "integrations",
        "cli",
    },
}

#: Known exceptions, each with its reason; the test fails when one no longer occurs, so that
#: the list only shrinks.
ALLOWED_AGAINST_LAYERS = {
    # the deprecated ReliabilityTable.plot() alias calls the plotting layer (CHANGELOG:
    # removed in the release after next)
    ("torchcal.functional.calibration.results", "torchcal.plotting"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child)

    visit(tree)
    return found


def imported_modules(name: str, path: Path) -> set[str]:
    """The torchcal modules that module ``name`` imports (``from a import b`` counts as ``a.b``
    when that is a module, else as ``a``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in runtime_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        for target in targets:
            while target and target not in MODULES:  # `import torchcal.x.y` -> the module
                target = target.rpartition(".")[0]
            if target.startswith("torchcal") and target != name:
                out.add(target)
    return out


GRAPH = {name: imported_modules(name, path) for name, path in MODULES.items()}


def part(module: str) -> str:
    """The layer of a module: ``torchcal`` for the package itself, else its first name."""
    parts = module.split(".")
    return "torchcal" if len(parts) == 1 else parts[1]


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_the_parser_sees_the_imports():
    # the graph is read right: known edges, a function-local one included
    assert (
        "torchcal.functional.calibration.results" in GRAPH["torchcal.functional.calibration.tables"]
    )
    assert "torchcal.plotting" in GRAPH["torchcal.functional.calibration.results"]  # local
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    found = set(cycles(GRAPH))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


def test_imports_follow_the_layers():
    wrong = sorted(
        (name, target)
        for name, targets in GRAPH.items()
        for target in targets
        if part(target) != part(name)
        and part(target) not in MAY_IMPORT[part(name)]
        and (name, target) not in ALLOWED_AGAINST_LAYERS
    )
    assert not wrong, "imports against docs/design.md section 1: " + ", ".join(
        f"{a} -> {b}" for a, b in wrong
    )
    assert set(MAY_IMPORT) >= {part(m) for m in MODULES}, "a new part: add it to MAY_IMPORT"


def test_allowed_exceptions_still_occur():
    for name, target in ALLOWED_AGAINST_LAYERS:
        assert target in GRAPH.get(name, ()), f"{name} -> {target} is gone: delete the entry"


#: docs/design.md section 1: a module does one job and stays under this many lines
MAX_MODULE_LINES = 600


def test_no_module_is_over_the_line_limit():
    long = {
        name: n
        for name, path in MODULES.items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"


#: issue 29 item 6: a function over this many code lines is split by job, or its ``def`` line
#: says why not (``# long: <why>``)
MAX_FUNCTION_LINES = 80


def code_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef, source: list[str]) -> int:
    """A function's lines that hold code: not blank, not only a comment, not its docstring
    (nested functions count in the function that holds them)."""
    doc: set[int] = set()
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            doc = set(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    lines = range(first, (fn.end_lineno or fn.lineno) + 1)
    return sum(
        1 for i in lines if i not in doc and (t := source[i - 1].strip()) and not t.startswith("#")
    )


def long_functions(text: str) -> dict[str, int]:
    """The functions of a module's ``text`` over :data:`MAX_FUNCTION_LINES` code lines whose
    ``def`` line carries no ``# long:`` comment."""
    source = text.splitlines()
    out = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = code_lines(node, source)
            if n > MAX_FUNCTION_LINES and "# long:" not in source[node.lineno - 1]:
                out[f"{node.name} (line {node.lineno})"] = n
    return out


def test_the_function_counter_counts_code_lines():
    body = "\n".join(f"    x{i} = {i}  # c" for i in range(MAX_FUNCTION_LINES - 1))
    text = f'def f():\n    """Doc.\n\n    more."""\n    # a comment\n\n{body}\n'
    assert long_functions(text) == {}  # 80 code lines with the def, docstring not counted
    assert long_functions(text + "    y = 1\n") == {"f (line 1)": 81}
    assert long_functions(text.replace("def f():", "def f():  # long: why") + "    y = 1\n") == {}


def test_no_function_is_over_the_line_limit():
    long = {
        f"{name}.{fn}": n
        for name, path in MODULES.items()
        for fn, n in long_functions(path.read_text(encoding="utf-8")).items()
    }
    assert not long, (
        f"functions over {MAX_FUNCTION_LINES} code lines (split them by job, or say why on the "
        f"def line: '# long: <why>'): {long}"
    )
