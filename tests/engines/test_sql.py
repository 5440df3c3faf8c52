"""The generated SQL: every row lands in the bin of the in-memory rule (edges, 0 and 1, in
float32 and float64 columns), bad rows are counted by reason, and the dialects' text."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from _engine_data import edges

from torchcal.engines.duck import NO_STATS, source_sql, state_from_duckdb
from torchcal.engines.memory import state_from_arrays
from torchcal.engines.sql import state_from_rows, state_sql
from torchcal.engines.state import StateHeader
from torchcal.functional.calibration.binning import bin_ids

duckdb = pytest.importorskip("duckdb")


def _bins_sql(values: pa.Array, n_bins: int) -> np.ndarray:
    """Each row's bin by the generated query (one row per value, kept in order by an id)."""
    con = duckdb.connect()
    con.execute(NO_STATS)
    t = pa.table({"p": values, "y": pa.array(np.zeros(len(values))), "id": np.arange(len(values))})
    con.register("t", t)
    sql = state_sql("t", preds="p", label="y", group="id", n_bins=n_bins)
    rows = con.execute(sql).fetchall()
    out = np.full(len(values), -1)
    for r in rows:
        assert r[0] is None and r[3] == 1
        out[int(r[1])] = r[2]
    return out


@pytest.mark.parametrize("n_bins", [1, 3, 7, 10, 15, 100])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_edge_lands_in_the_in_memory_bin(n_bins, dtype):
    v = edges(n_bins).astype(dtype)
    got = _bins_sql(pa.array(v), n_bins)
    want = bin_ids(torch.from_numpy(v), n_bins).numpy()
    assert (got == want).all()
    assert got[v == 1.0].tolist() == [n_bins - 1] * int((v == 1.0).sum())  # 1.0 in the last bin
    assert (got[v == 0.0] == 0).all()


def test_a_float_column_is_cast_before_the_product():
    # float32 values whose float32 product with B rounds up onto an edge but whose exact
    # (float64) product lies below it: multiplying before the cast would move them a bin up
    B = 100  # (at 10 bins no float32 within 40 ulps of an edge falls into the trap)
    c = (np.arange(1, B, dtype=np.float64) / B).astype(np.float32)
    steps = []
    for _ in range(8):
        c = np.nextafter(c, np.float32(0))
        steps.append(c)
    cand = np.concatenate(steps)
    f32 = np.floor(cand * np.float32(B))  # the trap: product in float32
    f64 = np.floor(cand.astype(np.float64) * B)
    trap = cand[f32 != f64]
    assert len(trap) > 0  # the data exercise the trap
    got = _bins_sql(pa.array(trap), B)
    assert (got == bin_ids(torch.from_numpy(trap), B).numpy()).all()
    assert (got == np.floor(trap.astype(np.float64) * B)).all()


def test_bad_rows_are_counted_by_reason_like_the_memory_path(tmp_path):
    p = [0.5, None, float("nan"), -0.1, 1.1, float("inf"), 0.3, 0.3, 0.3, 0.3]
    y = [1, 1, 1, 1, 1, 1, 2, None, 1, 1]
    g = ["a", "a", "a", "a", "a", "a", "a", "a", None, "b"]
    w = [1.0, 1, 1, 1, 1, 1, 1, 1, 1, float("nan")]
    pq.write_table(
        pa.table({"p": p, "y": pa.array(y, pa.float64()), "g": g, "w": w}), tmp_path / "x.parquet"
    )
    duck = state_from_duckdb(tmp_path / "x.parquet", preds="p", label="y", group="g", weight="w")
    mem = state_from_arrays(
        np.array([np.nan if v is None else v for v in p]),
        np.array([0 if v is None else v for v in y], dtype=float),
        preds_null=[v is None for v in p],
        target_null=[v is None for v in y],
        groups=np.array(g, dtype=object),
        weight=w,
    )
    want = {
        "preds_unparsed": 0,
        "preds_null": 1,
        "preds_nan": 1,
        "preds_out_of_range": 3,
        "preds_not_normalised": 0,
        "label_invalid": 2,
        "group_null": 1,
        "weight_invalid": 1,
    }
    assert duck.header.rows_rejected == want == mem.header.rows_rejected
    assert duck.header.rows_seen == 10 and int(duck.stats.count.sum()) == 1


def test_nan_in_a_parquet_file_is_not_hidden_by_its_statistics(tmp_path):
    # DuckDB folds isnan() and range checks from Parquet min/max statistics, which leave NaN
    # out: a file whose only bad values are NaN must still count them
    pq.write_table(
        pa.table({"p": [0.2, float("nan"), 0.9], "y": [0, 1, 1]}), tmp_path / "n.parquet"
    )
    st = state_from_duckdb(tmp_path / "n.parquet", preds="p", label="y")
    assert st.header.rows_rejected["preds_nan"] == 1 and int(st.stats.count.sum()) == 2


def test_csv_glob_and_database_table_give_the_parquet_state(tmp_path):
    import pyarrow.csv as pcsv

    rng = np.random.default_rng(0)
    p = np.concatenate([edges(10), rng.random(500)])
    y = (rng.random(len(p)) < p).astype(np.int64)
    t = pa.table({"p": p, "y": y})
    pq.write_table(t, tmp_path / "a.parquet")
    pcsv.write_csv(t, tmp_path / "a.csv")
    db = str(tmp_path / "x.duckdb")
    con = duckdb.connect(db)
    con.execute(
        "CREATE SCHEMA s; CREATE TABLE s.preds AS SELECT * FROM read_parquet(?)",
        [str(tmp_path / "a.parquet")],
    )
    con.close()
    ref = state_from_duckdb(tmp_path / "*.parquet", preds="p", label="y")
    for st in (
        state_from_duckdb(tmp_path / "a.csv", preds="p", label="y"),
        state_from_duckdb(db, table="s.preds", preds="p", label="y"),
    ):
        assert torch.equal(st.stats.count, ref.stats.count)
        torch.testing.assert_close(st.stats.conf, ref.stats.conf, rtol=1e-12, atol=0)


def test_errors_name_the_source_or_column(tmp_path):
    pq.write_table(pa.table({"p": [0.5], "y": [1]}), tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=r"nope: no such column in .*a\.parquet \(columns: p, y\)"):
        state_from_duckdb(tmp_path / "a.parquet", preds="nope", label="y")
    with pytest.raises(ValueError, match="expected a .parquet/.pq/.csv path or glob"):
        source_sql("x.txt")
    with pytest.raises(ValueError, match="dialect: expected one of"):
        state_sql("t", preds="p", label="y", dialect="mysql")


def test_snowflake_text_runs_in_duckdb_and_gives_the_same_state():
    # Snowflake's spelling (double-quoted names, DOUBLE, 'NaN'::DOUBLE, SUM) is DuckDB's too
    rng = np.random.default_rng(2)
    p = np.concatenate([edges(10), rng.random(300), [np.nan, 1.5]])
    t = pa.table(
        {
            "p": p,
            "y": (rng.random(len(p)) < 0.5).astype(np.int64),
            "g": rng.choice(["a", "b"], len(p)),
        }
    )
    con = duckdb.connect()
    con.register("t", t)
    h = StateHeader(n_bins=10, group="g")
    ref = state_from_rows(
        con.execute(state_sql("t", preds="p", label="y", group="g")).fetchall(), h
    )
    snow = state_sql("t", preds="p", label="y", group="g", dialect="snowflake")
    st = state_from_rows(con.execute(snow).fetchall(), h)
    assert (
        torch.equal(st.stats.count, ref.stats.count)
        and st.header.rows_rejected == ref.header.rows_rejected
    )
    torch.testing.assert_close(st.stats.conf2, ref.stats.conf2, rtol=1e-12, atol=0)


def test_dialect_text():
    big = state_sql(
        "proj.ds.preds", preds="p", label="y", group="g", weight="w", dialect="bigquery"
    )
    for part in (
        "CAST(`p` AS FLOAT64) AS p0",
        "CAST(`g` AS STRING) AS g",
        "WHEN IS_NAN(p0) THEN 'preds_nan'",
        "CAST(LEAST(FLOOR(c * 10), 9) AS INT64)",
        "SUM(w * (c * c)) AS sum_c2",
        "FROM proj.ds.preds",
    ):
        assert part in big
    spark = state_sql("v", preds="my col", label="y", dialect="spark")
    assert "CAST(`my col` AS DOUBLE)" in spark and "AS INT)" in spark and "fsum" not in spark
    snow = state_sql("db.s.t", preds="P", label="Y", n_bins=15, dialect="snowflake")
    assert "(p0 = 'NaN'::DOUBLE)" in snow and "LEAST(FLOOR(c * 15), 14)" in snow
    duck = state_sql("t", preds='we"ird', label="y")
    assert 'CAST("we""ird" AS DOUBLE)' in duck and "fsum(c)" in duck


def test_duckdb_sums_do_not_depend_on_the_thread_count(tmp_path):
    # fsum (compensated) makes DuckDB's sums the correctly rounded ones here, whatever the
    # threads' partial aggregates: identical bits for 1, 2 and 4 threads
    import math

    rng = np.random.default_rng(0)
    n = 100_000
    p, w = rng.random(n), rng.random(n) * 3
    y = (rng.random(n) < p).astype(np.int8)
    pq.write_table(
        pa.table({"p": p, "y": y, "w": w}), tmp_path / "d.parquet", row_group_size=20_000
    )
    states = [
        state_from_duckdb(tmp_path / "d.parquet", preds="p", label="y", weight="w", threads=t)
        for t in (1, 2, 4)
    ]
    for st in states[1:]:
        for f in ("conf", "acc", "conf2", "conf_acc", "weight"):
            a, b = getattr(st.stats, f), getattr(states[0].stats, f)
            assert torch.equal(a.view(torch.int64), b.view(torch.int64))
    b = np.minimum(np.floor(p * 10), 9).astype(int)
    exact = [math.fsum((w * p)[b == k]) for k in range(10)]
    assert states[0].stats.conf.flatten().tolist() == exact
