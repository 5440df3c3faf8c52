"""``--segments`` gives the same report whatever the road (issue 31, docs/design.md 6g.1).

The segments example (two opposite hidden gaps, a numeric column in quantile buckets), a
weighted variant judged at a threshold and a file whose numeric column has few values go
through ``torchcal audit --segments`` as a file, a glob, ``--engine memory`` (file and glob),
``--engine duckdb`` and, where Java is present, Spark. The in-process roads share the reader:
their report.json is byte-identical apart from the engine name; DuckDB and Spark sum in
another order and agree to 1e-12, every other field (segments, their order, edges, verdicts,
counts) identical.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from typing import Any

import numpy as np
import pytest

from torchcal.audit.example_segments import write_segments_csv
from torchcal.cli import main

pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")


def _write(path: str, header: str, rows: list[str]) -> None:
    with open(path, "w") as f:
        f.write(header + "\n" + "\n".join(rows) + "\n")


def _audit(args: list[str], out: str) -> tuple[int, dict[str, Any], str]:
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
        code = main(["audit", *args, "--out", out, "--diagrams", "0"])
    with open(os.path.join(out, "report.json")) as f:
        return code, json.load(f), text.getvalue()


def _norm(d: dict[str, Any], sql: bool) -> dict[str, Any]:
    d = json.loads(json.dumps(d))
    d["settings"].pop("engine")
    d.pop("diagrams")  # written by save() (the Spark leg has no --out)
    if sql:  # an engine does not know the line of the first excluded row
        for e in d["read"].get("excluded", []):
            e["where"] = e["text"] = None
    return d


def _diff(a: Any, b: Any, path: str = "") -> str | None:
    """The first path where ``a`` and ``b`` differ (floats within 1e-12), else None."""
    if isinstance(a, float) or isinstance(b, float):
        ok = isinstance(a, (int, float)) and isinstance(b, (int, float))
        ok = ok and math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
        return None if ok else f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{path}: keys {list(a)} != {list(b)}"
        return next((r for k in a if (r := _diff(a[k], b[k], f"{path}.{k}"))), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        return next(
            (r for i, (x, y) in enumerate(zip(a, b)) if (r := _diff(x, y, f"{path}[{i}]"))), None
        )
    return None if a == b else f"{path}: {a!r} != {b!r}"


def _text(t: str, sql: bool = False) -> list[str]:
    skip = ("engine:", "wrote ") + (("excluded rows:",) if sql else ())
    return [line for line in t.splitlines() if not line.startswith(skip)]


SEG = ["--segments", "lang", "doc", "length", "--min-segment", "100"]


def _weighted(path: str) -> None:
    rng = np.random.default_rng(5)
    n = 3000
    p = rng.random(n)
    a = rng.integers(0, 3, n)
    y = (rng.random(n) < np.clip(p + np.where(a == 0, -0.15, 0.0), 0, 1)).astype(int)
    x = rng.normal(size=n)
    w = rng.integers(0, 4, n)
    rows = [f"{float(v)!r},{t},k{c},{float(z)!r},{u}" for v, t, c, z, u in zip(p, y, a, x, w)]
    _write(path, "p,y,a,x,w", rows)


def _few_values(path: str) -> None:
    """A numeric column with 3 distinct values (kept as values) and a group column."""
    rng = np.random.default_rng(6)
    n = 2000
    p = rng.random(n)
    y = (rng.random(n) < p).astype(int)
    lvl = rng.choice([0.5, 1.5, 10.0], n)
    g = rng.choice(["x", "y"], n)
    _write(path, "p,y,lvl,g", [f"{float(a)!r},{b},{c},{d}" for a, b, c, d in zip(p, y, lvl, g)])


CASES: dict[str, tuple[Any, list[str]]] = {
    "example": (
        lambda p: write_segments_csv(p, 1000, 0),
        ["--probs", "p", "--label", "correct", *SEG],
    ),
    "weighted": (
        _weighted,
        [
            "--probs",
            "p",
            "--label",
            "y",
            "--weight",
            "w",
            "--segments",
            "a",
            "x",
            "--segment-bins",
            "3",
            "--threshold",
            "0.6",
            "--min-segment",
            "50",
        ],
    ),  # fmt: skip
    "few_values": (
        _few_values,
        ["--probs", "p", "--label", "y", "--group", "g", "--segments", "lvl", "g", "--depth", "1"],
    ),  # fmt: skip
}
ROADS = {
    "file": (False, []),
    "glob": (True, []),
    "memory": (False, ["--engine", "memory"]),
    "memory-glob": (True, ["--engine", "memory"]),
    "duckdb": (False, ["--engine", "duckdb"]),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("segroads")
    out = {}
    for name, (write, _) in CASES.items():
        out[name] = str(d / f"{name}.csv")
        write(out[name])
    return out


@pytest.fixture(scope="module")
def reference(files: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("segref")
    return {
        name: _audit([files[name], *args, "--engine", "memory"], str(d / name))
        for name, (_, args) in CASES.items()
    }


@pytest.mark.parametrize("road", list(ROADS))
@pytest.mark.parametrize("case", list(CASES))
def test_same_segments_on_every_road(case, road, files, reference, tmp_path):
    glob, engine = ROADS[road]
    _, args = CASES[case]
    src = files[case][:-4] + "*.csv" if glob else files[case]
    code, rep, text = _audit([src, *args, *engine], str(tmp_path / "out"))
    ref_code, ref, ref_text = reference[case]
    sql = road in ("duckdb", "glob") or (case == "weighted" and road == "file")
    assert code == ref_code
    a, b = _norm(ref, sql), _norm(rep, sql)
    if sql:
        assert _diff(a, b) is None, _diff(a, b)
        assert rep["settings"]["engine"].startswith("duckdb")
    else:
        assert a == b
    assert _text(text, sql) == _text(ref_text, sql)


def test_cases_exercise_the_segments(reference):
    """What the cases are named for: the example's hidden segments FAIL while the pooled row
    PASSes; the weighted file's numeric column is cut into 3 buckets; 3 values stay values."""
    code, ex, _ = reference["example"]
    assert code == 1 and ex["pooled"]["verdict"] == "pass"
    worst = [w["segment"] for w in ex["segments"]["worst"][:2]]
    assert sorted(worst) == ["lang=de & doc=form", "lang=fr & doc=chat"]
    assert [c["kind"] for c in ex["segments"]["columns"]] == ["category", "category", "edges"]
    x = reference["weighted"][1]["segments"]["columns"][1]
    assert x["kind"] == "edges" and len(x["edges"]) == 2
    lvl = reference["few_values"][1]["segments"]["columns"][0]
    assert lvl == {"column": "lvl", "kind": "values", "size": 3, "values": [0.5, 1.5, 10.0]}


def test_spark_gives_the_same_segments(spark, files, reference):
    """Spark (a DataFrame of the CSV, every column a string) through the same queries."""
    from torchcal.audit._evaluate import build_report
    from torchcal.audit.engine_input import segment_options, state_of_engine
    from torchcal.audit.state import AuditSettings
    from torchcal.engines.spark import audit_spark

    settings = AuditSettings(segments=("lang", "doc", "length"), min_segment=100)
    df = spark.read.csv(files["example"], header=True)
    result = audit_spark(df, preds="p", label="correct", segments=segment_options(settings))
    got = json.loads(build_report(state_of_engine(result), settings).to_json())
    assert got["settings"]["engine"].startswith("spark")
    assert _diff(_norm(reference["example"][1], True), _norm(got, True)) is None
