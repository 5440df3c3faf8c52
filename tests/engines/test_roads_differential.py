"""The same report whatever the road (issue 29, docs/design.md section 6c.2).

Every example file (judging, stated percents, a 0.05-grid probability file, weights, groups
named out of order, rows that get rejected) goes through ``torchcal audit`` as a file, as a
glob, with ``--engine memory`` (file and glob), ``--engine duckdb`` and, where Java is present,
Spark (the same queries through :func:`torchcal.engines.spark.audit_spark`). The in-process
roads share the reader and the Auditor: their report.json is byte-identical apart from the
engine name. The SQL engines sum in another order (DuckDB's ``fsum``, Spark's ``SUM``): their
numbers agree to 1e-12 and every other field (bins, verdicts, group order, notes, counts)
is identical; the first excluded row's line is unknown to them (``where``/``text``). The exit
code is the same on every road.
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

from torchcal.audit.example import write_judging_csv, write_stated_csv
from torchcal.cli import main

pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")


def _write(path: str, header: str, rows: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(header + "\n" + "\n".join(rows) + "\n")


def _grid(path: str) -> None:
    """Probabilities on the 0.05 grid written as plain numbers (0.85), two groups."""
    rng = np.random.default_rng(1)
    k = rng.integers(2, 21, 4000)
    p = k * 0.05
    y = (rng.random(4000) < np.clip(p + 0.02, 0, 1)).astype(int)
    g = np.where(rng.random(4000) < 0.5, "b", "a")
    _write(path, "p,y,g", [f"{round(v, 2)},{t},{h}" for v, t, h in zip(p, y, g)])


def _weights(path: str) -> None:
    rng = np.random.default_rng(2)
    p = rng.random(3000)
    y = (rng.random(3000) < p).astype(int)
    w = rng.integers(0, 4, 3000)
    _write(path, "p,y,w", [f"{float(a)!r},{b},{c}" for a, b, c in zip(p, y, w)])


def _groups(path: str) -> None:
    """Groups whose order of appearance is not their name order."""
    rng = np.random.default_rng(3)
    names = np.array(["zeta", "alpha", "mid", "Beta"])
    g = names[np.minimum(rng.integers(0, 4, 4000), 3)]
    p = rng.random(4000)
    y = (rng.random(4000) < p).astype(int)
    _write(path, "g,p,y", [f"{a},{float(b)!r},{c}" for a, b, c in zip(g, p, y)])


def _rejected(path: str) -> None:
    """Stated confidences with 5 of 1000 rows unparsed ('high', blank), under --max-unparsed."""
    rng = np.random.default_rng(4)
    rows = []
    for i in range(1000):
        c = f"{5 * int(rng.integers(10, 20))}%" if i % 200 else ("high" if i % 400 else "")
        rows.append(f"{c},{int(rng.random() < 0.8)}")
    _write(path, "confidence,correct", rows)


def _hostile(path: str) -> None:
    """Rows every road rejects by a rule of ``engines/rules.py`` (NaN, out of range, a label
    that is no class or no number (``yes``, blank), a blank or white-space group, a weight
    outside 0 or [1e-100, 1e100] or blank), 0.75 % of 4000, under --max-unparsed: counted by
    reason and left out, the same counts on every road."""
    rng = np.random.default_rng(5)
    rows = [f"{float(a)!r},{int(b)},{g},1" for a, b, g in
            zip(rng.random(4000), rng.random(4000) < 0.6, rng.choice(["a", "b"], 4000))]  # fmt: skip
    bad = ["nan,1,a,1", "1.5,1,b,1", "-0.1,0,a,1", "150%,0,b,1", "0.5,2,a,1", "0.5,-1,b,1",
           "0.5,0.5,a,1", "0.5,1,a,-1", "0.5,1,b,inf", "0.5,1,a,1e300",
           "0.5,yes,a,1", "0.5,,b,1", "0.5,1,,1", "0.5,1,  ,1", "0.5,1,a,"]  # fmt: skip
    for k, text in enumerate(bad * 2):
        rows[130 * k + 7] = text
    _write(path, "p,y,g,w", rows)


def _hostile_text(path: str) -> None:
    """Unweighted, so the file road is the streaming reader: labels that are no number
    (``yes``, ``maybe``, blank, white space), groups that are blank, spaces or an ideographic
    space (U+3000: white space to Python and, by the one class of ``rules.WHITE_SPACE``, to
    SQL), beside values that parse once Unicode white space is stripped (``0.5`` + NBSP,
    ``85`` NBSP ``%``) and names kept as written (`` a ``); and the awkward numbers of
    ``engines/text.py`` (``nan(1)`` is NaN, ``1e1%`` and ``ınf`` (U+0131) are no number on any
    road: the file road once read the first two as NaN and 0.1, ``--engine memory`` crashed
    on the third); 0.65 % of 4000 rejected."""
    rng = np.random.default_rng(6)
    rows = [f"{float(a)!r},{int(b)},{g}" for a, b, g in
            zip(rng.random(4000), rng.random(4000) < 0.6, rng.choice(["a", "b"], 4000))]  # fmt: skip
    bad = ["0.5,yes,a", "0.4,,b", "0.3,maybe,a", "0.6, ,b", "0.5,1,", "0.5,0,  ",
           "0.7,1,\u3000", "nan,1,a", "0.5,2,b", "0.2,1,\t",
           "nan(1),1,a", "\u0131nf,0,b", "1e1%,1,a"]  # fmt: skip
    odd = ["0.5\u00a0,1,a", "85\u00a0%,1,b", "0.25,0, a ", "\u300085%,1,b"]
    for k, text in enumerate(bad * 2 + odd * 3):
        rows[100 * k + 11] = text
    _write(path, "p,y,g", rows)


def _saturated(path: str) -> None:
    """Labels given probability exactly 0 (``0.0``, ``-0.0`` with y = 1, ``1.0`` with
    y = 0): their NLL is infinite, counted apart on every road (DuckDB once summed them into
    an infinite NLL and reported ``nll_infinite: false``)."""
    rng = np.random.default_rng(8)
    rows = [f"{float(a)!r},{int(b)},{'ab'[i % 2]}" for i, (a, b) in
            enumerate(zip(rng.random(1500), rng.random(1500) < 0.5))]  # fmt: skip
    rows[3], rows[40], rows[41] = "0.0,1,a", "-0.0,1,a", "1.0,0,b"
    _write(path, "p,y,g", rows)


#: name -> (writer, column arguments, extra options)
CASES: dict[str, tuple[Any, list[str], list[str]]] = {
    "judging": (
        lambda p: write_judging_csv(p, 1000, 0),
        ["--probs", "p_correct", "--label", "correct", "--group", "domain"],
        ["--threshold", "0.8"],
    ),
    "stated": (
        lambda p: write_stated_csv(p, 1000, 0),
        ["--probs", "confidence", "--label", "correct", "--group", "domain"],
        [],
    ),
    "grid": (_grid, ["--probs", "p", "--label", "y", "--group", "g"], []),
    "weights": (
        _weights,
        ["--probs", "p", "--label", "y", "--weight", "w"],
        ["--threshold", "0.7"],
    ),
    "groups": (_groups, ["--probs", "p", "--label", "y", "--group", "g"], []),
    "rejected": (_rejected, ["--probs", "confidence", "--label", "correct"], []),
    "hostile": (_hostile, ["--probs", "p", "--label", "y", "--group", "g", "--weight", "w"], []),
    "words": (_hostile_text, ["--probs", "p", "--label", "y", "--group", "g"], []),
    "saturated": (_saturated, ["--probs", "p", "--label", "y", "--group", "g"], []),
}
#: the per-reason counts of the hostile cases (each bad row twice)
HOSTILE_WARNING = (
    "30 rows were left out of the state: preds_nan 2, preds_out_of_range 6, label_invalid 10, "
    "group_null 4, weight_invalid 8"
)
HOSTILE_TEXT_WARNING = (
    "22 rows were left out of the state: preds_nan 4, label_invalid 10, group_null 8"
)

#: road -> (use the glob, engine options)
ROADS = {
    "file": (False, []),
    "glob": (True, []),
    "memory": (False, ["--engine", "memory"]),
    "memory-glob": (True, ["--engine", "memory"]),
    "duckdb": (False, ["--engine", "duckdb"]),
}
SQL_ROADS = {"duckdb", "spark"}


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


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("roads")
    out = {}
    for name, (write, _, _) in CASES.items():
        path = str(d / f"{name}.csv")
        write(path)
        out[name] = path
    return out


@pytest.fixture(scope="module")
def reference(files: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each case's report on the file road (the weighted one: --engine memory)."""
    d = tmp_path_factory.mktemp("ref")
    out = {}
    for name, (_, cols, opts) in CASES.items():
        road = ["--engine", "memory"] if "--weight" in cols else []
        out[name] = _audit([files[name], *cols, *opts, *road], str(d / name))
    return out


@pytest.mark.parametrize("road", list(ROADS))
@pytest.mark.parametrize("case", list(CASES))
def test_same_report_on_every_road(case, road, files, reference, tmp_path):
    glob, engine = ROADS[road]
    _, cols, opts = CASES[case]
    path = files[case]
    src = path[:-4] + "*.csv" if glob else path
    code, rep, text = _audit([src, *cols, *opts, *engine], str(tmp_path / "out"))
    ref_code, ref, ref_text = reference[case]
    # a glob, and --weight without an engine, take DuckDB (--engine auto) where installed
    sql = road in ("duckdb", "glob") or ("--weight" in cols and road == "file")
    assert code == ref_code
    a, b = _norm(ref, sql), _norm(rep, sql)
    if sql:
        assert _diff(a, b) is None, _diff(a, b)
        assert rep["settings"]["engine"].startswith("duckdb")
    else:
        assert a == b  # byte-identical report.json apart from the engine name
        assert rep["settings"]["engine"] == "memory"
    assert _text(text, sql) == _text(ref_text, sql)  # the console, line by line


def test_cases_cover_the_rules(reference):
    """The cases exercise what they are named for (a mutation of the grid rule, the group
    order or the percent parser shows up here, not only as a difference between roads)."""
    assert reference["stated"][1]["settings"]["n_bins"] == 21
    assert reference["grid"][1]["settings"]["n_bins"] == 21
    assert reference["judging"][1]["settings"]["n_bins"] == 10
    assert list(reference["groups"][1]["groups"]) == ["Beta", "alpha", "mid", "zeta"]
    read = reference["rejected"][1]["read"]
    assert read["excluded"][0]["count"] == 5 and read["percent"] == {"confidence": 995}
    assert reference["weights"][1]["settings"]["weight"] == "w"
    assert HOSTILE_WARNING in reference["hostile"][1]["warnings"]
    sat = reference["saturated"][1]
    assert sat["pooled"]["nll_infinite_rows"] == 3 and sat["pooled"]["nll_finite_rows"] > 0
    assert [g["nll_infinite_rows"] for g in sat["groups"].values()] == [2, 1]
    text = reference["words"][1]
    assert HOSTILE_TEXT_WARNING in text["warnings"]
    assert list(text["groups"]) == [" a ", "a", "b"]  # a name as written; blanks are no name
    assert text["groups"][" a "]["n"] == 3 and text["read"]["percent"] == {"p": 6}
    (unparsed,) = text["read"]["excluded"]  # 1e1% and ınf; nan(1) is NaN, counted above
    assert (unparsed["count"], unparsed["text"]) == (4, "\u0131nf")


#: case -> the refusal above --max-unparsed 0.004 (every road), and the first bad row as the
#: in-process roads name it (an engine does not know the line)
REFUSALS = {
    "rejected": (  # a blank confidence is NULL to an engine: preds_null on every road
        "5 of 1000 rows are invalid (preds_unparsed 2, preds_null 3), more than "
        "--max-unparsed 0.004 of them",
        "confidence: missing value at line 2",
    ),
    "hostile": (
        "30 of 4000 rows are invalid (preds_nan 2, preds_out_of_range 6, label_invalid 10, "
        "group_null 4, weight_invalid 8), more than --max-unparsed 0.004 of them",
        "p: value nan at line 9 is not a probability",
    ),
    "words": (
        "26 of 4000 rows are invalid (preds_unparsed 4, preds_nan 4, label_invalid 10, "
        "group_null 8), more than --max-unparsed 0.004 of them",
        "y: label 'yes' at line 13 is not a number nor True/False",
    ),
}


@pytest.mark.parametrize("road", list(ROADS))
@pytest.mark.parametrize("case", list(REFUSALS))
def test_rejected_rows_refuse_alike_above_max_unparsed(case, road, files, tmp_path, capsys):
    """Above --max-unparsed every road refuses the hostile files: exit 2, the counts named in
    one line (the same words on every road; the first bad row's line where the road reads the
    rows itself)."""
    glob, engine = ROADS[road]
    _, cols, _ = CASES[case]
    src = files[case][:-4] + "*.csv" if glob else files[case]
    out = str(tmp_path / "out")
    code = main(["audit", src, *cols, *engine, "--max-unparsed", "0.004", "--out", out])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    counts, first = REFUSALS[case]
    sql = road in ("duckdb", "glob") or ("--weight" in cols and road == "file")
    if sql:
        assert err == f"torchcal: error: {src}: {counts}", err
    else:  # the in-process roads name the first bad row (and its file, in a glob)
        where = f"{files[case]}: " if glob else ""
        want = f"torchcal: error: {src}: {counts}; the first: {where}{first}"
        assert err.startswith(want) and "\n" not in err, err


def test_spark_gives_the_same_report(spark, files, reference):
    """Spark (a DataFrame of the CSV, every column a string) through the same queries."""
    from torchcal.audit._evaluate import build_report
    from torchcal.audit.engine_input import state_of_engine
    from torchcal.audit.state import AuditSettings
    from torchcal.engines.spark import audit_spark

    for case in ("stated", "grid", "groups", "rejected", "hostile", "words"):
        _, cols, opts = CASES[case]
        kw = dict(zip([c.lstrip("-") for c in cols[::2]], cols[1::2]))
        df = spark.read.csv(files[case], header=True)
        result = audit_spark(
            df, preds=kw["probs"], label=kw["label"], group=kw.get("group"), weight=kw.get("weight")
        )
        report = build_report(state_of_engine(result), AuditSettings())
        got = json.loads(report.to_json())
        assert got["settings"]["engine"].startswith("spark")
        assert _diff(_norm(reference[case][1], True), _norm(got, True)) is None, case


def test_a_glob_is_refused_by_its_pooled_share_on_every_road(tmp_path, capsys):
    """--max-unparsed counts the rows of a glob together on every road: 15 bad rows in one
    file of 1,000 (1.5 %) beside a clean one is 0.75 % of the glob, under the default 1 %
    (``--engine memory`` once refused at the end of the first file), and over 0.5 %."""
    rng = np.random.default_rng(1)
    for name, bad in (("a", 15), ("b", 0)):
        rows = [f"{rng.random()!r},{int(rng.random() < 0.5)}" for _ in range(1000)]
        for k in range(bad):
            rows[10 + 3 * k] = "high,1"
        _write(str(tmp_path / f"{name}.csv"), "p,y", rows)
    src = str(tmp_path / "*.csv")
    args = [src, "--probs", "p", "--label", "y"]
    got = {}
    for road in ("file", "memory", "duckdb"):
        engine = [] if road == "file" else ["--engine", road]
        code, got[road], _ = _audit([*args, *engine], str(tmp_path / road))
        assert code in (0, 1, 3) and got[road]["read"]["excluded"][0]["count"] == 15, road
        assert _diff(_norm(got["file"], True), _norm(got[road], True)) is None, road
        out = ["--out", str(tmp_path / "o"), "--max-unparsed", "0.005"]
        assert main(["audit", *args, *engine, *out]) == 2
        err = capsys.readouterr().err.strip()
        want = f"torchcal: error: {src}: 15 of 2000 rows are invalid (preds_unparsed 15), more "
        assert err.startswith(want + "than --max-unparsed 0.005 of them"), err
        if road == "memory":
            assert err.endswith(f"the first: {tmp_path / 'a.csv'}: p: 'high' at line 12 is not "
                                "a number nor a percent"), err  # fmt: skip


def test_an_empty_file_in_a_glob_is_no_error_on_any_road(tmp_path, capsys):
    """A header-only file in a glob adds no rows on every road (``--engine memory`` once
    refused the glob when the empty file came first); a glob of empty files is one line
    naming the glob, the same on every road (DuckDB said ``preds: no rows were given``)."""
    rng = np.random.default_rng(2)
    rows = [f"{rng.random()!r},{int(rng.random() < 0.5)},{'ab'[i % 2]}" for i in range(800)]
    for name in ("a", "e1", "e2"):  # the header alone (no blank line: DuckDB counts none)
        (tmp_path / f"{name}.csv").write_text("p,y,g\n")
    _write(str(tmp_path / "b.csv"), "p,y,g", rows)
    cols = ["--probs", "p", "--label", "y", "--group", "g"]
    got = {}
    for road in ("file", "memory", "duckdb"):
        engine = [] if road == "file" else ["--engine", road]
        code, got[road], _ = _audit(
            [str(tmp_path / "[ab].csv"), *cols, *engine], str(tmp_path / road)
        )
        assert code in (0, 1, 3) and got[road]["pooled"]["n"] == 800, road
        assert _diff(_norm(got["file"], True), _norm(got[road], True)) is None, road
        empty = str(tmp_path / "e*.csv")
        assert main(["audit", empty, *cols, *engine, "--out", str(tmp_path / "o")]) == 2
        assert capsys.readouterr().err.strip() == f"torchcal: error: {empty}: no data rows", road


def test_a_parquet_file_of_text_confidences_reads_alike_on_every_road(tmp_path):
    """A Parquet string column of stated confidences (percents, the awkward tokens of
    ``engines/text.py``, nulls and empty strings) and a nullable group: the same report on
    the in-process roads and DuckDB. The in-process reader once left percents out of the
    percent note (``{}`` for 3) and listed a null as its own 'missing value' entry, where
    DuckDB counts it with the unparsed text (``preds_null`` in a refusal on both)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(3)
    n = 3000
    p: list[str | None] = [repr(float(x)) for x in rng.random(n)]
    odd = ["nan(1)", "\u0131nf", "1e1%", "85%", " 85 % ", "", None, "inf", "-0", "0x1", "1_0",
           "50%", "nan", "1.5", "True", "0.5\u00a0", "\u00a0", "1e-3", "+.5", "5.", None]  # fmt: skip
    for i, t in zip(range(5, n, 140), odd, strict=False):
        p[i] = t
    g: list[str | None] = ["ab"[i % 2] for i in range(n)]
    g[7], g[8] = None, " "
    y = (rng.random(n) < 0.5).astype(np.int64)
    table = {"p": pa.array(p, pa.string()), "y": y, "g": pa.array(g, pa.string())}
    path = str(tmp_path / "s.parquet")
    pq.write_table(pa.table(table), path)
    args = [path, "--probs", "p", "--label", "y", "--group", "g", "--max-unparsed", "0.5"]
    got = {}
    for road in ("file", "memory", "duckdb"):
        engine = [] if road == "file" else ["--engine", road]
        code, got[road], _ = _audit([*args, *engine], str(tmp_path / road))
        assert code in (0, 1, 3), road
        assert _diff(_norm(got["file"], True), _norm(got[road], True)) is None, road
    read = got["file"]["read"]
    assert read["percent"] == {"p": 3}
    (e,) = read["excluded"]
    assert (e["reason"], e["count"]) == ("not a number nor a percent", 9)


def test_segments_leave_out_rows_without_a_group_on_every_road(tmp_path):
    """Rows of --group with no name (blank, white space) are left out of the segments as of
    the state (group_null), on every road: the streaming road reads --group beside the
    segment columns (it refused such files once; DuckDB left the rows out), so a segment
    counts the same rows (s=x: 201 rows, one without a group) and the reports agree."""
    rng = np.random.default_rng(7)
    rows = [f"{float(a)!r},{int(b)},{'ab'[i % 2]},{'xyz'[i % 3]},{i % 4}" for i, (a, b) in
            enumerate(zip(rng.random(600), rng.random(600) < 0.5))]  # fmt: skip
    rows[5], rows[17] = "0.5,1,,x,1", "0.9,0, ,y,2"
    path = str(tmp_path / "s.csv")
    _write(path, "p,y,g,s,t", rows)
    args = [path, "--probs", "p", "--label", "y", "--group", "g", "--segments", "s", "t"]
    got = {}
    for road, engine in (("file", []), ("memory", ["--engine", "memory"]), ("duckdb", ["--engine", "duckdb"])):  # fmt: skip
        code, got[road], _ = _audit([*args, *engine], str(tmp_path / road))
        assert code in (0, 1, 3), road
        assert "2 rows were left out of the state: group_null 2" in got[road]["warnings"]
    (x,) = [s for s in got["file"]["segments"]["worst"] if s["segment"] == "s=x"]
    assert x["n"] == 200
    for road in ("memory", "duckdb"):
        sql = road == "duckdb"
        assert _diff(_norm(got["file"], sql), _norm(got[road], sql)) is None, road
