"""One hostile file to every engine: identical counts per rejection reason (issue 29 item 2).

The reasons come from one table (``torchcal/engines/rules.py``) from which the SQL of every
dialect and the numpy path are generated; the text values (percents, ``True``, strict numbers,
blanks) are parsed by one rule (``torchcal.engines.sql``: in SQL, and its Python twin
``parse_text`` for the in-process reader). The file holds every reason at a known count.
"""

from __future__ import annotations

import pytest

from torchcal.engines.rules import REJECT_REASONS
from torchcal.engines.text import parse_text

pytest.importorskip("pyarrow")

#: (confidence, label, group, weight) -> the reason it must get (None: kept)
ROWS = [
    ("85%", "1", "a", "1", None),
    (" 85 % ", "True", "b", "2", None),
    ("0.25", "false", "a", "0", None),
    ("1e-1", "0", "b", "1.5", None),
    ("high", "1", "a", "1", "preds_unparsed"),
    ("0_8", "1", "a", "1", "preds_unparsed"),
    ("", "1", "a", "1", "preds_null"),
    ("nan", "1", "a", "1", "preds_nan"),
    ("1.5", "1", "b", "1", "preds_out_of_range"),
    ("-0.1", "1", "b", "1", "preds_out_of_range"),
    ("150%", "0", "a", "1", "preds_out_of_range"),
    ("0.5", "2", "a", "1", "label_invalid"),
    ("0.5", "yes", "a", "1", "label_invalid"),
    ("0.5", "", "a", "1", "label_invalid"),
    ("0.5", "1", "", "1", "group_null"),
    ("0.5", "1", "  ", "1", "group_null"),  # only white space: no name (rules.blank)
    ("0.5", "1", "\u3000", "1", "group_null"),  # U+3000 is white space to Python and the SQL
    ("0.5", "1", " a ", "1", None),  # any other name as written
    ("0.5\u00a0", "1", "a", "1", None),  # NBSP stripped as Python strips it
    ("0.5", "1", "a", "-1", "weight_invalid"),
    ("0.5", "1", "a", "", "weight_invalid"),
    ("0.5", "1", "b", "inf", "weight_invalid"),
]
WANT = {r: sum(row[4] == r for row in ROWS) for r in REJECT_REASONS}
KW = {"preds": "c", "label": "y", "group": "g", "weight": "w", "n_bins": 10}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    csv = d / "hostile.csv"
    body = "\n".join(",".join(r[:4]) for r in ROWS * 3)  # 3 of each
    csv.write_text("c,y,g,w\n" + body + "\n", encoding="utf-8")
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = list(zip(*[r[:4] for r in ROWS * 3], strict=True))
    table = pa.table({k: [v or None for v in col] for k, col in zip("cygw", cols, strict=True)})
    pq.write_table(table, d / "hostile.parquet")  # string columns, blanks as NULL
    return {"csv": str(csv), "parquet": str(d / "hostile.parquet")}


def _check(st):
    assert st.header.rows_rejected == {r: 3 * n for r, n in WANT.items()}
    assert int(st.stats.count.sum()) == 3 * sum(r[4] is None for r in ROWS)


def test_white_space_is_pythons():
    """The SQL's white space is exactly ``str.isspace`` (``str.strip``'s)."""
    import sys

    from torchcal.engines.rules import WHITE_SPACE

    assert [c for c in range(sys.maxunicode + 1) if chr(c).isspace()] == list(WHITE_SPACE)


def test_the_table_covers_every_reason_but_one_class_rule():
    assert {r for r, n in WANT.items() if n} == set(REJECT_REASONS) - {"preds_not_normalised"}


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_duckdb_and_the_in_process_reader_count_alike(hostile, fmt):
    from torchcal.engines.memory import state_from_files

    _check(state_from_files(hostile[fmt], **KW))
    pytest.importorskip("duckdb")
    from torchcal.engines.duck import audit_duckdb, state_from_duckdb

    _check(state_from_duckdb(hostile[fmt], **KW))
    result = audit_duckdb(hostile[fmt], **{**KW, "n_bins": None})
    _check(result.state)
    assert result.text["c"]["percent"] == 3 * 3  # 85%, ' 85 % ', 150%


def test_spark_counts_alike(spark, hostile):
    from torchcal.engines.spark import state_from_spark

    df = spark.read.csv(hostile["csv"], header=True)  # every column a string, blanks NULL
    _check(state_from_spark(df, **KW))


#: awkward tokens for the text rule: separators, non-ASCII digits / letters / spaces, percents
#: with and without an exponent, ``nan`` payloads (pyarrow and DuckDB read them as NaN)
TOKENS = ["85%", " 85 % ", "85.5%", "33.3%", "0.3", ".5", "5.", "1E+3", "-inf", "Infinity",
          "NaN", "0_8", "", "1e-3%", "٣", "0x10", "+.5e-2", "1.234567890123%",
          "0.5\u00a0", "\u30000.5", "85\u00a0%", "\u2028.5\x1c", "\u200b0.5",
          "nan(1)", "-NaN(ab_C)", "nan()", "nan(1", "nan(-1)", "nan%", "1e1%", ".5e-1%",
          "\u0131nf", "\u0130NF", "inf\u0131nity", "true", " FALSE ", "yes"]  # fmt: skip


def _same(kind, got, bad):
    """``got`` values and ``bad`` flags (SQL, by token) equal parse_text's."""
    ref, ref_bad = parse_text(TOKENS, kind)
    for t, a, b, ba, bb in zip(TOKENS, got, ref.tolist(), bad, ref_bad.tolist()):
        assert ba == bb, (kind, t)
        assert (a is None and b != b) or a == b or (a != a and b != b), (kind, t, a, b)


def test_the_text_rule_reads_the_awkward_tokens():
    """The values themselves (so a rule both sides got wrong alike is caught too)."""
    v, bad = parse_text(TOKENS, "stated")
    got = dict(zip(TOKENS, v.tolist()))
    assert got["85%"] == got[" 85 % "] == 0.85 and got["85.5%"] == 0.855
    assert got["nan(1)"] != got["nan(1)"] and got["-NaN(ab_C)"] != got["-NaN(ab_C)"]
    unparsed = {t for t, b in zip(TOKENS, bad) if b}
    assert unparsed >= {"0_8", "٣", "0x10", "nan(1", "nan(-1)", "nan%", "1e1%", ".5e-1%",
                        "\u0131nf", "\u0130NF", "\u200b0.5", "true", "yes"}  # fmt: skip
    assert parse_text(TOKENS, "label")[0][TOKENS.index(" FALSE ")] == 0.0


def test_the_python_rule_is_the_sql_rule():
    """parse_text and the SQL of text_value_sql give the same values on awkward tokens."""
    duckdb = pytest.importorskip("duckdb")
    from torchcal.engines.sql import text_value_sql

    con = duckdb.connect()
    for kind in ("number", "stated", "label"):
        v, bad, _ = text_value_sql("x", kind, "duckdb")
        rows = con.execute(
            f"SELECT {v}, {bad} FROM (SELECT unnest(?) AS x, generate_subscripts(?, 1) AS i) "
            "ORDER BY i",
            [TOKENS, TOKENS],
        ).fetchall()
        _same(kind, [r[0] for r in rows], [r[1] for r in rows])


def test_the_python_rule_is_the_spark_rule(spark):
    from pyspark.sql import functions as F

    from torchcal.engines.sql import text_value_sql

    df = spark.createDataFrame([(i, t) for i, t in enumerate(TOKENS)], "i long, x string")
    for kind in ("number", "stated", "label"):
        v, bad, _ = text_value_sql("x", kind, "spark")
        rows = df.select("i", F.expr(v), F.expr(bad)).orderBy("i").collect()
        _same(kind, [r[1] for r in rows], [r[2] for r in rows])
