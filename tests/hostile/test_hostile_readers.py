"""Hostile files for the audit's readers (issue 17's reader defects, one regression test each):
every engine reads the rows the file holds -- none invented, none lost -- or rejects the file
with ONE line naming the file, column or line; through the CLI that is exit 2, never a
traceback."""

import re

import numpy as np
import pytest
import torch

from torchcal import cli
from torchcal.audit import _arrow, _csv_blocks
from torchcal.audit._columns import ReadLog
from torchcal.audit.io import read_columns, read_predictions

ENGINES = [
    "numpy",
    pytest.param("pyarrow", marks=pytest.mark.skipif(not _arrow.available(), reason="no pyarrow")),
]


def _cols(path, engine, group=None, cols=("p", "y"), **kw):
    chunks = list(read_columns(path, list(cols), group=group, engine=engine, **kw))
    out = {c: np.concatenate([ch.columns[c] for ch in chunks]).tolist() for c in cols}
    if chunks[0].lines is not None:
        out["lines"] = np.concatenate([ch.lines for ch in chunks]).tolist()
    if group is not None:
        names = chunks[-1].group_names
        out["group"] = [names[i] for ch in chunks for i in ch.groups]
    return out


def _cli_error(capsys, path, *args):
    code = cli.main(["audit", str(path), "--probs", "p", "--label", "y", *args])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchcal: error: "), err
    return lines[0]


# --------------------------------------------------------------------------- rows (CSV)


@pytest.mark.parametrize("engine", ENGINES)
def test_printf_multiline_text_is_3_rows_not_5(tmp_path, engine):
    """Issue 17 reader defect 1: the pyarrow reader audited this file as 5 rows."""
    path = tmp_path / "m.csv"
    path.write_text('id,p,y,t\n0,0.9,1,"ok"\n1,0.8,1,"x:\n1,0.05,0,a\n2,0.05,0,b"\n2,0.3,0,"no"\n')
    got = _cols(path, engine)
    assert got == {"p": [0.9, 0.8, 0.3], "y": [1.0, 1.0, 0.0], "lines": [2, 3, 6]}


@pytest.mark.parametrize("engine", ENGINES)
def test_multiline_text_late_in_a_large_file_gives_no_false_error(tmp_path, engine):
    """Issue 17: a 70 MB CSV with "a\\nb" text exited 2 with a false 'line 960721: expected 4
    fields'. Here 2.5 MB (several pyarrow blocks) with the quoted text late."""
    n = 100_000
    rows = [f"{i},0.{i % 9 + 1},{i % 2},x" for i in range(n)]
    for k in (60_000, 99_990):
        rows[k] = f'{k},0.5,1,"a\nb"'
    path = tmp_path / "big.csv"
    path.write_text("id,p,y,t\n" + "\n".join(rows) + "\n")
    got = _cols(path, engine)
    assert len(got["p"]) == n and got["p"][60_000] == 0.5
    assert got["lines"][60_001] == 60_004  # the row after the two-line record
    assert got["lines"][-1] == n + 3


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("eol", ["\r", "\r\n"], ids=["cr-only", "crlf"])
def test_cr_only_and_crlf_line_ends(tmp_path, engine, eol):
    path = tmp_path / "cr.csv"
    path.write_bytes(eol.join(["p,y,g", "0.5,1,a", "0.25,0,b", "0.75,1,a", ""]).encode())
    got = _cols(path, engine, group="g")
    assert got == {
        "p": [0.5, 0.25, 0.75],
        "y": [1.0, 0.0, 1.0],
        "lines": [2, 3, 4],
        "group": ["a", "b", "a"],
    }


@pytest.mark.parametrize("engine", ENGINES)
def test_header_field_over_131072_characters(tmp_path, engine):
    """The csv module's field limit made this a traceback."""
    path = tmp_path / "h.csv"
    path.write_text(f"p,y,{'n' * 200_000}\n0.5,1,a\n0.25,0,b\n")
    assert _cols(path, engine)["p"] == [0.5, 0.25]


@pytest.mark.parametrize("engine", ENGINES)
def test_long_rows_read_in_bounded_blocks(tmp_path, engine, monkeypatch):
    """64 kB rows: the numpy reader sized its block as chunk_rows x row length (64 GB:
    MemoryError). Blocks are now at most MAX_BLOCK bytes (here 1 MB: chunks of <= 17 rows)."""
    monkeypatch.setattr(_csv_blocks, "MAX_BLOCK", 1 << 20)
    path = tmp_path / "long.csv"
    text = "t" * 65_536
    path.write_text("p,y,t\n" + "".join(f"0.{i % 9 + 1},{i % 2},{text}\n" for i in range(200)))
    chunks = list(read_columns(path, ["p", "y"], engine=engine))
    assert sum(c.rows for c in chunks) == 200
    if engine == "numpy":
        assert max(c.rows for c in chunks) <= 17


@pytest.mark.parametrize("engine", ENGINES)
def test_bom_quoted_commas_blank_lines(tmp_path, engine):
    path = tmp_path / "b.csv"
    path.write_bytes(b'\xef\xbb\xbfp,y,g\n0.5,1,"a,b"\n\n0.25,0,"say ""hi"""\n')
    log = ReadLog()
    got = _cols(path, engine, group="g", log=log)
    assert got == {"p": [0.5, 0.25], "y": [1.0, 0.0], "lines": [2, 4], "group": ["a,b", 'say "hi"']}
    assert log.blank_lines == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_stray_quote_is_reported_where_it_is_not_at_the_end(tmp_path, engine):
    """A quote inside an unquoted field (``5"``) is rejected (the csv module would read it as
    text, and no block reader can know where such a record ends): at its line, at once, not
    after holding the rest of the file as one record."""
    path = tmp_path / "q.csv"
    path.write_text('p,y,t\n0.5,1,a\n0.5,1,5"x\n' + "0.25,0,b\n" * 100_000)
    with pytest.raises(ValueError, match=r"^line 3: a quote inside an unquoted field: quote a"):
        _cols(path, engine, chunk_rows=1000)


@pytest.mark.parametrize("engine", ENGINES)
def test_nul_bytes(tmp_path, engine):
    """NUL in a text column is text; group names differing only in trailing NULs were merged
    by the numpy reader (numpy's bytes ignore trailing NULs): now rejected, with the line."""
    path = tmp_path / "n.csv"
    path.write_bytes(b"p,y,g,t\n0.5,1,a,x\x00y\n0.25,0,b,z\n")
    assert _cols(path, engine, group="g")["group"] == ["a", "b"]
    for name in (b"a", b"abcdefghijk"):
        path.write_bytes(b"p,y,g\n0.5,1,%s\n0.25,0,%s\x00\n" % (name, name))
        with pytest.raises(ValueError, match=r"^g: group name .* holds a NUL character at line 3$"):
            _cols(path, engine, group="g")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("group", [None, "g"])
def test_ragged_rows_rejected_with_or_without_group(tmp_path, engine, group):
    """Extra fields were accepted by the numpy reader when --group was absent."""
    for row, n in (("0.25,0,b,extra", 4), ("0.25,0", 2)):
        path = tmp_path / "r.csv"
        path.write_text(f"p,y,g\n0.5,1,a\n{row}\n0.75,1,a\n")
        with pytest.raises(
            ValueError, match=rf"^line 3: expected 3 fields \(as the header\), got {n}$"
        ):
            _cols(path, engine, group=group)


@pytest.mark.parametrize("engine", ENGINES)
def test_strict_number_syntax(tmp_path, engine):
    """`0.0_5` was read as 0.05 and `0_8` as 8: underscores are not numbers (a label: an
    error; a stated confidence: an excluded row, counted)."""
    path = tmp_path / "u.csv"
    path.write_text("p,y\n0.5,1\n0.5,0_1\n")
    with pytest.raises(ValueError, match=r"^y: label '0_1' at line 3 is not a number"):
        _cols(path, engine, kinds={"y": "label"})
    path.write_text("p,y\n" + "0.5,1\n" * 200 + "0.0_5,1\n0_8,0\n")
    log = ReadLog()
    got = _cols(path, engine, kinds={"p": "stated"}, log=log, max_unparsed=0.05)
    assert len(got["p"]) == 200 and log.excluded_rows == 2
    (e,) = log.excluded.values()
    assert (e.where, e.text, e.count) == ("line 202", "0.0_5", 2)
    path.write_text("p,y\n0.0_5,1\n")
    with pytest.raises(ValueError, match=r"^p: '0\.0_5' at line 2 is not a number$"):
        _cols(path, engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_duplicate_column_names(tmp_path, engine, capsys):
    path = tmp_path / "d.csv"
    path.write_text("p,y,p\n0.5,1,0.9\n")
    msg = _cli_error(capsys, path)
    assert msg.endswith(
        r"p: 2 columns of this name in " + str(path) + " (columns 1 and 3): rename one"
    )
    path.write_text("p,y,n,n\n0.5,1,a,b\n")  # an unused duplicate is harmless
    assert _cols(path, engine)["p"] == [0.5]


def test_parquet_duplicate_columns_string_confidences_and_nulls(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    t = pa.Table.from_arrays(
        [pa.array([0.5, 0.6]), pa.array([1, 0]), pa.array([0.1, 0.2])], names=["p", "y", "p"]
    )
    pq.write_table(t, tmp_path / "d.parquet")
    assert re.search(
        r"p: 2 columns of this name in .*d\.parquet", _cli_error(capsys, tmp_path / "d.parquet")
    )
    p = ["0.85", "85%", " 85 % ", None, "high", "0.5"] + ["0.5"] * 300
    t = pa.table({"p": p, "y": [True, False] * 153})
    pq.write_table(t, tmp_path / "s.parquet", row_group_size=100)
    log = ReadLog()
    (b, *rest) = read_predictions(
        tmp_path / "s.parquet", preds=["p"], label="y", log=log, chunk_rows=1000
    )
    assert b.preds[:4].tolist() == [0.85, 0.85, 0.85, 0.5] and b.target[:4].tolist() == [1, 0, 1, 0]
    # a null in a text column is unparsed text, as an engine counts it (preds_null: missing)
    assert (
        log.kept == 304
        and log.missing == 1
        and log.to_dict()["excluded"]
        == [
            {
                "column": "p",
                "reason": "not a number nor a percent",
                "count": 2,
                "where": "row 3",
                "text": "null",
            },
        ]
    )
    assert log.percent == {"p": 2}


# --------------------------------------------------------------------- stated confidences


@pytest.mark.parametrize("engine", ENGINES)
def test_stated_confidences_percent_and_unparsed(tmp_path, engine):
    rows = ["0.85,1", "85%,1", " 85 % ,0", "85.5%,1", "high,0", ",1"] + ["0.5,1"] * 294
    path = tmp_path / "s.csv"
    path.write_text("p,y\n" + "\n".join(rows) + "\n")
    log = ReadLog()
    batches = list(read_predictions(path, preds=["p"], label="y", engine=engine, log=log))
    p = torch.cat([b.preds for b in batches])
    assert p[:4].tolist() == [0.85, 0.85, 0.85, 0.855] and p.numel() == 298
    assert log.percent == {"p": 3} and log.kept == 298 and log.rows == 300
    (e,) = log.excluded.values()
    assert (e.column, e.count, e.where, e.text) == ("p", 2, "line 6", "high")
    with pytest.raises(  # the engines' words: the blank is NULL to them (preds_null)
        ValueError,
        match=r"s\.csv: 2 of 300 rows are invalid \(preds_unparsed 1, preds_null 1\), more than "
        r"--max-unparsed 0\.005 of them; the first: p: 'high' at line 6 is not a number nor a "
        r"percent$",
    ):
        list(read_predictions(path, preds=["p"], label="y", engine=engine, max_unparsed=0.005))


def test_a_percent_without_its_sign_says_how_to_write_it(tmp_path, capsys):
    path = tmp_path / "s.csv"
    path.write_text("p,y\n0.5,1\n85,1\n")
    assert _cli_error(capsys, path).endswith(
        "p: value 85.0 at line 3 is not a probability (expected a value in [0, 1]; "
        "a percent is written 85%)"
    )


def test_unparsed_share_through_the_cli_is_exit_2(tmp_path, capsys):
    path = tmp_path / "s.csv"
    path.write_text("p,y\n" + "high,1\n" + "0.5,1\n" * 20)
    assert re.search(
        r"s\.csv: 1 of 21 rows are invalid \(preds_unparsed 1\), more than --max-unparsed 0\.01 "
        r"of them; the first: p: 'high' at line 2 is not a number nor a percent$",
        _cli_error(capsys, path),
    )


# ---------------------------------------------------------------------------------- labels


@pytest.mark.parametrize("engine", ENGINES)
def test_pandas_boolean_labels_read_yes_no_rejected(tmp_path, engine, capsys):
    path = tmp_path / "b.csv"
    path.write_text("p,y\n0.9,True\n0.2,False\n0.7,true\n0.6,FALSE\n")
    (b,) = read_predictions(path, preds=["p"], label="y", engine=engine)
    assert b.target.tolist() == [1, 0, 1, 0]
    path.write_text("p,y\n0.9,yes\n0.2,no\n")
    msg = _cli_error(capsys, path)
    assert msg.endswith(
        "y: label 'yes' at line 2 is not a number nor True/False (map words such as yes/no to 1/0 first)"
    )


# ---------------------------------------------------------------------------- array inputs


def _pt(path, **cols):
    torch.save(cols, path)
    return path


def test_2d_group_tensor_is_an_error_not_flattened(tmp_path, capsys):
    """A (300, 2) group tensor was flattened: group 0 n = 600, group 1 n = 0."""
    p = torch.full((300,), 0.5)
    path = _pt(tmp_path / "g.pt", p=p, y=torch.zeros(300), g=torch.zeros(300, 2, dtype=torch.long))
    assert _cli_error(capsys, path, "--group", "g").endswith(
        "g: expected a 1-D column of group names, got shape (300, 2)"
    )
    np.savez(tmp_path / "g.npz", p=p.numpy(), y=np.zeros(300), g=np.zeros((300, 2), dtype=int))
    assert "g: expected a 1-D column of group names" in _cli_error(
        capsys, tmp_path / "g.npz", "--group", "g"
    )


def test_low_precision_tensors_are_upcast(tmp_path):
    p = torch.tensor([0.5, 0.25, 0.75])
    for dtype in (torch.bfloat16, torch.float16):
        path = _pt(tmp_path / "h.pt", p=p.to(dtype), y=torch.tensor([1, 0, 1], dtype=torch.uint8))
        (b,) = read_predictions(path, preds=["p"], label="y")
        assert b.preds.dtype == torch.float64 and b.preds.tolist() == [0.5, 0.25, 0.75]


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda: torch.tensor([0.5, 0.25]).to_sparse(), "a sparse_coo tensor"),
        (lambda: torch.empty(2, device="meta"), "a meta tensor"),
        (lambda: torch.tensor([0.5 + 1j, 0.25]), "a complex tensor"),
    ],
    ids=["sparse", "meta", "complex"],
)
def test_unreadable_tensors_are_one_line_errors(tmp_path, capsys, make, what):
    path = _pt(tmp_path / "x.pt", p=make(), y=torch.tensor([1, 0]))
    msg = _cli_error(capsys, path)
    assert f"p: expected a dense tensor of real numbers, got {what}" in msg


def test_pt_group_names_keep_trailing_nuls_and_are_rejected(tmp_path, capsys):
    """A list of names goes through numpy's string arrays, which drop trailing NULs: kept as
    objects, so 'a' and 'a\\x00' are not merged but rejected."""
    path = _pt(tmp_path / "n.pt", p=torch.full((2,), 0.5), y=torch.zeros(2), g=["a", "a\x00"])
    assert _cli_error(capsys, path, "--group", "g").endswith(
        "g: group name 'a\\x00' holds a NUL character at row 1"
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_bytes_that_are_not_utf8_and_escapes(tmp_path, engine, capsys):
    """Invalid UTF-8 in a column not read is harmless; in a value it is escaped in the message
    (and in the ReadLog), as is an escape sequence: one printable line."""
    path = tmp_path / "u.csv"
    path.write_bytes(b"p,y,t\n0.5,1,\xff\xfe\n0.25,0,ok\n")
    assert _cols(path, engine)["p"] == [0.5, 0.25]
    path.write_bytes(b"p,y\n0.5,1\n0.25,\x1b[2J\xff\n")
    msg = _cli_error(capsys, path)
    assert msg.endswith(
        "y: label '\\x1b[2J\\udcff' at line 3 is not a number nor True/False (map words such as yes/no to 1/0 first)"
    )
    path.write_bytes(b"p,y\n" + b"0.5,1\n" * 300 + b"\xffhigh,1\n")
    log = ReadLog()
    list(read_predictions(path, preds=["p"], label="y", engine=engine, log=log))
    (e,) = log.excluded.values()
    assert e.text == "\\xffhigh" and e.where == "line 302"


def test_blank_first_line_is_named(tmp_path, capsys):
    path = tmp_path / "b.csv"
    path.write_text("\np,y\n0.5,1\n")
    assert _cli_error(capsys, path).endswith(
        "b.csv: line 1 is blank (expected a header naming the columns)"
    )
