"""Hostile engine and command-line inputs of issue 30 item 7 (W2-W6, W9, W10, W12-W14 and the
engine-input "internal error" exits), one regression test each: the audit reads the file and
columns it was given, by their exact names, or exits 2 with ONE line naming the file, column
or flag; outputs never overwrite an input; names are escaped where they are written."""

from re import _parser  # the parser re compiles with

import pytest

from torchcal import cli
from torchcal.audit import _columns
from torchcal.engines import sql

duckdb = pytest.importorskip("duckdb")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _error(capsys, *argv):
    code, out, err = _run(capsys, *argv)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("torchcal: error: "), (
        code,
        out[-500:],
        err,
    )
    assert "internal error" not in err
    return lines[0]


# -- W10: the number syntax is matched in linear time ------------------------------------------


def _nested_repeats(pattern):
    """Two unbounded-or-repeated runs of the same characters in one branch with only optional
    items between them (``[0-9]+\\.?[0-9]*``: the digits split many ways, so a failing match
    backtracks quadratically); the patterns' repeats, as ``re``'s parser reads them."""
    rep = (_parser.MAX_REPEAT, _parser.MIN_REPEAT)
    bad = []

    def walk(items):
        seq = list(items)
        for i, (op, av) in enumerate(seq):
            if op not in rep or av[1] == 1:
                continue
            for op2, av2 in seq[i + 1 :]:
                if op2 in rep and list(av2[2]) == list(av[2]):
                    bad.append(str(av[2]))
                    break
                if not (op2 in rep and av2[0] == 0):  # a required item separates them
                    break
        for op, av in seq:
            if op == _parser.SUBPATTERN:
                walk(av[-1])
            elif op == _parser.BRANCH:
                for b in av[1]:
                    walk(b)
            elif op in rep:
                walk(av[2])

    walk(_parser.parse(pattern))
    return bad


@pytest.mark.parametrize(
    "pattern",
    [
        _columns._NUMBER.pattern,
        _columns._DECIMAL.pattern,
        sql.NUMBER_RE,
        sql.PERCENT_RE,
    ],
    ids=["columns-number", "columns-decimal", "sql-number", "sql-percent"],
)
def test_w10_number_patterns_have_no_ambiguous_repeat(pattern):
    assert _nested_repeats(pattern) == []
    # the old pattern is caught by the check (the check can fail)
    assert _nested_repeats(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)")


def test_w10_a_million_digit_cell_is_rejected_with_its_line(tmp_path, capsys):
    # quadratic backtracking would take hours here; linear matching takes well under a second
    cell = "1" * 1_000_000 + "x"
    assert _columns.parse_number(cell) is None
    assert sql.parse_text([cell, cell + "%"], "stated")[1].tolist() == [True, True]
    f = tmp_path / "x.csv"
    f.write_text("p,y\n0.5,1\n" + cell + ",0\n")
    line = _error(capsys, "audit", f, "--probs", "p", "--label", "y", "--max-unparsed", "0.1")
    assert "line 3" in line or "p:" in line
