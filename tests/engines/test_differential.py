"""Differential tests (issue 20, Must hold): the in-memory path, pyarrow files, DuckDB
(Parquet and CSV globs) and Spark give identical counts, rejected-row counts and groups, sums
equal to 1e-12 and the same reports, on data with every bin edge (k/B in float32 and float64,
0 and 1), NaN, NULL, values outside [0, 1], bad labels, several groups (and NULL groups) and
integer weights (and bad ones)."""

from __future__ import annotations

import pytest
import torch
from _engine_data import (
    arrays,
    assert_reports_close,
    class_arrays,
    class_rows,
    rows,
    write_parts,
)

from torchcal.audit import audit
from torchcal.audit.engine_input import report_from_state
from torchcal.engines.duck import state_from_duckdb
from torchcal.engines.memory import state_from_arrays, state_from_files

CASES = {  # name -> (preds column, group, weight)
    "weighted-grouped": ("p", "g", "w"),
    "plain-grouped": ("p", "g", None),
    "float32-pooled": ("p32", None, None),
}
REPORT = {"threshold": 0.8, "cost_error": 10.0, "cost_escalation": 1.0, "seed": 3}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")
    t = rows(2000, seed=0)
    return {
        "table": t,
        "parquet": write_parts(t, str(d / "pq"), parts=3),
        "csv": write_parts(t, str(d / "csv"), parts=2, csv=True),
        "dir": str(d / "pq"),
    }


def reference(table, preds, group, weight):
    a = arrays(table, preds)
    if group is None:
        a.pop("groups")
    if weight is None:
        a.pop("weight")
    return state_from_arrays(**a, group_column=group, weight_column=weight)


def assert_same_state(st, ref):
    assert st.groups == ref.groups
    h, r = st.header, ref.header
    assert (h.rows_seen, h.rows_rejected, h.group, h.weight) == (
        r.rows_seen,
        r.rows_rejected,
        r.group,
        r.weight,
    )
    assert torch.equal(st.stats.count, ref.stats.count)
    pairs = [
        (getattr(st.stats, f), getattr(ref.stats, f))
        for f in ("conf", "acc", "conf2", "conf_acc", "weight")
    ]
    for a, b in [*pairs, (st.nll, ref.nll), (st.right, ref.right)]:
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def assert_same_report(st, ref):
    a = report_from_state(st, **REPORT).to_dict()
    b = report_from_state(ref, **REPORT).to_dict()
    for d in (a, b):
        d["settings"].pop("engine")
        for e in d["read"].get("excluded", []):  # the reference state names no columns
            e["column"] = None
    assert_reports_close(a, b)


@pytest.mark.parametrize("case", CASES)
def test_duckdb_and_pyarrow_equal_the_in_memory_path(data, case):
    preds, group, weight = CASES[case]
    ref = reference(data["table"], preds, group, weight)
    assert ref.header.rows_kept < ref.header.rows_seen  # bad rows were there
    kw = {"preds": preds, "label": "y", "group": group, "weight": weight}
    states = [
        state_from_duckdb(data["parquet"], **kw),
        state_from_duckdb(data["parquet"], threads=1, **kw),
        state_from_files(data["parquet"], **kw),
    ]
    if preds == "p":  # CSV holds the float64 text; a float32 column does not survive it
        states += [state_from_duckdb(data["csv"], **kw), state_from_files(data["csv"], **kw)]
    for st in states:
        assert_same_state(st, ref)
        assert_same_report(st, ref)


@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")
def test_spark_equals_the_in_memory_path(data, class_data, spark):
    from torchcal.engines.spark import state_from_spark

    df = spark.read.parquet(data["dir"])
    for case in ("weighted-grouped", "float32-pooled"):
        preds, group, weight = CASES[case]
        ref = reference(data["table"], preds, group, weight)
        st = state_from_spark(df, preds=preds, label="y", group=group, weight=weight)
        assert st.header.producer.startswith("spark ")
        assert_same_state(st, ref)
        assert_same_report(st, ref)
    with pytest.raises(ValueError, match="nope: no such column in the DataFrame"):
        state_from_spark(df, preds="nope", label="y")
    ref = state_from_arrays(**class_arrays(class_data["table"]), group_column="g")
    cdf = spark.read.parquet(class_data["dir"])
    st = state_from_spark(cdf, preds=CLASSES, label="y", group="g")
    assert_same_state(st, ref)
    assert_same_report(st, ref)


CLASSES = ["q0", "q1", "q2"]


@pytest.fixture(scope="module")
def class_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("classes")
    t = class_rows(1500, seed=1)
    return {"table": t, "parquet": write_parts(t, str(d / "pq"), parts=2), "dir": str(d / "pq")}


def test_confidence_reading_engines_equal_the_in_memory_path(class_data):
    ref = state_from_arrays(**class_arrays(class_data["table"]), group_column="g")
    assert ref.header.reading == "confidence" and ref.header.num_classes == 3
    assert all(ref.header.rows_rejected[r] for r in ("preds_nan", "preds_not_normalised"))
    kw = {"preds": CLASSES, "label": "y", "group": "g"}
    for st in (
        state_from_duckdb(class_data["parquet"], **kw),
        state_from_files(class_data["parquet"], **kw),
    ):
        assert (st.header.reading, st.header.num_classes) == ("confidence", 3)
        assert_same_state(st, ref)
        assert_same_report(st, ref)


def test_confidence_state_reports_what_the_streaming_auditor_reports():
    t = class_rows(2000, seed=2, bad=False)
    a = class_arrays(t)
    names = sorted(set(a["groups"]))
    ids = torch.tensor([names.index(x) for x in a["groups"]])
    p, y = torch.tensor(a["preds"]), torch.tensor(a["target"]).long()
    ref = audit(p, y, groups=ids, group_names=names, threshold=0.6, seed=4).to_dict()
    got = report_from_state(state_from_arrays(**a), threshold=0.6, seed=4).to_dict()
    assert_reports_close(got["pooled"], ref["pooled"])
    assert_reports_close(got["groups"], ref["groups"])
