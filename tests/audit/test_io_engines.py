"""The two CSV engines (pyarrow's streaming reader, the numpy path) read every file alike:
the same values, group ids, names and line numbers, the same errors, the same report; pyarrow
hands over to the numpy path (mid-file too) where it cannot read exactly as it does."""

import json
import re

import numpy as np
import pytest
import torch

from torchcal import cli
from torchcal.audit import Auditor, _arrow, _csv
from torchcal.audit import io as tio
from torchcal.audit.io import read_columns

pytest.importorskip("pyarrow.csv")

RNG = np.random.default_rng(1)
N = 300
P = RNG.random(N)
Y = (RNG.random(N) < P).astype(int)
NAMES = np.array(["math", "open_qa", "a_rather_long_domain_name", "x y"])
GID = RNG.integers(0, 4, N)
GID[:3] = [3, 1, 3]
GID[200:] = np.where(GID[200:] == 2, 0, GID[200:])
GID[250] = 2  # a name that first appears late (in a later pyarrow batch with small blocks)


def _rows(names=NAMES):
    return [f"{i},{names[GID[i]]},{float(P[i])!r},{Y[i]}" for i in range(N)]


def _write(path, rows, header="id,domain,p,y", end="\n", bom=False):
    text = header + end + "".join(r + end for r in rows)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


def _read(path, engine, chunk_rows=1 << 20, group="domain"):
    chunks = list(read_columns(path, ["p", "y"], group=group, chunk_rows=chunk_rows, engine=engine))
    cat = np.concatenate
    return {
        "p": cat([c.columns["p"] for c in chunks]),
        "y": cat([c.columns["y"] for c in chunks]),
        "g": None if group is None else cat([c.groups for c in chunks]),
        "names": chunks[-1].group_names,
        "lines": cat([c.lines for c in chunks]),
        "offsets": [c.offset for c in chunks],
        "sizes": [c.rows for c in chunks],
    }


def _same(a, b):
    for k in ("p", "y", "g", "lines"):
        if a[k] is None:
            assert b[k] is None
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert a["names"] == b["names"]
    assert np.cumsum([0] + a["sizes"][:-1]).tolist() == a["offsets"]


@pytest.fixture
def small_blocks(monkeypatch):
    """pyarrow blocks of ~1 KB: many batches in a small file."""
    monkeypatch.setattr(_arrow, "BLOCK", 1024)


def _no_numpy_path(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("the numpy path was used")

    monkeypatch.setattr(_csv, "read_csv", fail)


@pytest.mark.parametrize("chunk_rows", [1, 7, 1 << 20])
def test_plain_file_is_read_by_pyarrow_alone_as_numpy_reads_it(
    tmp_path, monkeypatch, small_blocks, chunk_rows
):
    path = _write(tmp_path / "x.csv", _rows())
    ref = _read(path, "numpy", chunk_rows)
    _no_numpy_path(monkeypatch)
    got = _read(path, "pyarrow", chunk_rows)
    _same(got, ref)
    np.testing.assert_array_equal(got["p"], P)  # repr round-trips: exactly the float64s
    np.testing.assert_array_equal(got["lines"], np.arange(2, N + 2))
    assert got["names"] == ["x y", "open_qa", "math", "a_rather_long_domain_name"]
    assert max(got["sizes"]) <= chunk_rows and (len(got["sizes"]) > 1 or chunk_rows >= N)
    plain = _read(path, "pyarrow", chunk_rows, group=None)
    assert plain["g"] is None
    for k in ("p", "y", "lines"):
        np.testing.assert_array_equal(plain[k], got[k])


def test_numbers_in_other_spellings_parse_alike(tmp_path, monkeypatch):
    """Exponents, signs, no leading digit, integers, 17 significant digits, subnormals."""
    vals = ["1e-3", "+.5", "5.", "0", "1", "0.1000000000000000055511151231257827", "4.9e-324"]
    vals += [f"{v:.17g}" for v in RNG.random(50)] + [f"{v:.3E}" for v in RNG.random(50)]
    rows = [f"{i},d{i % 3},{v},{i % 2}" for i, v in enumerate(vals)]
    path = _write(tmp_path / "n.csv", rows)
    ref = _read(path, "numpy")
    np.testing.assert_array_equal(ref["p"], [float(v) for v in vals])
    _no_numpy_path(monkeypatch)
    _same(_read(path, "pyarrow"), ref)


@pytest.mark.parametrize(
    "case",
    ["quoted-group", "quoted-comma-elsewhere", "quoted-newline", "blank-line", "crlf-bom", "nan"],
)
def test_files_pyarrow_hands_over_read_alike(tmp_path, monkeypatch, small_blocks, case):
    """Quotes, a blank line (numbering kept), CRLF with a BOM: the same rows and lines either way
    (the hand-over happens after pyarrow has delivered the first batches)."""
    rows = _rows()
    header, end, bom = "id,domain,p,y", "\n", False
    if case == "quoted-group":
        rows[150] = f'150,"{NAMES[GID[150]]}",{float(P[150])!r},{Y[150]}'
    elif case == "quoted-comma-elsewhere":
        header = "id,domain,p,y,text"
        rows = [r + (',"a, b"' if i == 170 else ",plain") for i, r in enumerate(rows)]
    elif case == "quoted-newline":
        header = "id,domain,p,y,text"
        rows = [r + (',"two\nlines"' if i == 170 else ",t") for i, r in enumerate(rows)]
    elif case == "blank-line":
        rows.insert(160, "")
    elif case == "crlf-bom":
        end, bom = "\r\n", True
    else:
        rows[120] = f"120,math,nan,{Y[120]}"
    path = _write(tmp_path / "x.csv", rows, header=header, end=end, bom=bom)
    arrow_rows, numpy_used = [], []
    arrow_read, numpy_read = _arrow.read_csv, _csv.read_csv

    def arrow(*a, **k):
        for c in arrow_read(*a, **k):
            arrow_rows.append(c.rows)
            yield c

    monkeypatch.setattr(_arrow, "read_csv", arrow)
    monkeypatch.setattr(_csv, "read_csv", lambda *a: numpy_used.append(1) or numpy_read(*a))
    for chunk_rows in (1 << 20, 33):
        ref = _read(path, "numpy", chunk_rows)
        got = _read(path, "pyarrow", chunk_rows)
        _same(got, ref)
        assert got["p"].size == N
    # pyarrow reads CRLF, a BOM and nan itself; a file with a quote anywhere is the numpy
    # path's from the start; at a blank line pyarrow hands over after some batches
    if case in ("crlf-bom", "nan"):
        assert len(numpy_used) == 2 and sum(arrow_rows) == 2 * N  # the references only
    elif case == "blank-line":
        assert len(numpy_used) == 4 and 0 < sum(arrow_rows) < 2 * N, (numpy_used, arrow_rows)
    else:
        assert len(numpy_used) == 4 and sum(arrow_rows) == 0
    if case == "blank-line":
        assert got["lines"][159] == 161 and got["lines"][160] == 163


HOSTILE = [
    ("non-numeric", [(150, "150,a,0.5,abc")], r"y: label 'abc' at line 152 is not a number"),
    ("empty-value", [(150, "150,a,0.5,")], r"y: label '' at line 152 is not a number"),
    (
        "unparsed-share",
        [(i, f"{i},a,high,1") for i in (40, 150, 151, 152)],
        r"4 of 300 rows are invalid \(preds_unparsed 4\), more than --max-unparsed 0 of them; "
        r"the first: p: 'high' at line 42 is not a number nor a percent",
    ),
    (
        "ragged-long",
        [(200, "200,a,0.5,1,extra")],
        r"line 202: expected 4 fields \(as the header\), got 5",
    ),
    (
        "underscores",
        [(i, f"{i},a,0.0_5,1") for i in (120, 121, 122, 123)],
        r"p: '0\.0_5' at li"
        r"ne 122 is not a number nor a percent",
    ),
    ("underscore-y", [(120, "120,a,0.5,0_1")], r"y: label '0_1' at line 122 is not a number"),
    ("prob>1", [(250, "250,a,1.5,1")], r"p: value 1\.5 at line 252 is not a probability"),
    ("label", [(299, "299,a,0.5,2")], r"y: label 2 at line 301 is not a class"),
    ("empty-group", [(180, "180,,0.5,1")], r"domain: empty group name at line 182"),
    ("blank-group", [(180, '180,"  ",0.5,1')], r"domain: empty group name at line 182"),
    ("ragged", [(200, "200,a,0.5")], r"line 202: expected 4 fields"),
    ("late-blank+bad", [(100, ""), (200, "200,a,-1,0")], r"p: value -1\.0 at line 202"),
]


@pytest.mark.parametrize(
    ("edits", "message"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE]
)
def test_errors_are_the_same_with_either_engine(
    tmp_path, capsys, monkeypatch, small_blocks, edits, message
):
    rows = _rows()
    for i, text in edits:
        rows[i] = text
    path = _write(tmp_path / "x.csv", rows)
    errs = []
    for engine in ("pyarrow", "numpy"):
        monkeypatch.setattr(tio, "CSV_ENGINE", engine)
        args = ["audit", str(path), "--probs", "p", "--label", "y", "--group", "domain"]
        # --max-unparsed 0: a row a rule rejects (out of range, not a class) refuses the file
        assert cli.main([*args, "--chunk-rows", "40", "--max-unparsed", "0"]) == 2
        errs.append(capsys.readouterr().err)
    assert errs[0] == errs[1]
    assert re.search(message, errs[0]), errs[0]


def test_same_report_with_either_engine(tmp_path, monkeypatch, small_blocks):
    """End to end through the CLI: report.json agrees (the chunking differs, so float64 sums
    agree to rounding); the kept sample is identical."""
    path = _write(tmp_path / "x.csv", _rows())
    reports = {}
    for engine in ("pyarrow", "numpy"):
        monkeypatch.setattr(tio, "CSV_ENGINE", engine)
        out = tmp_path / engine
        args = ["audit", str(path), "--probs", "p", "--label", "y", "--group", "domain"]
        assert cli.main([*args, "--threshold", "0.8", "--out", str(out), "--no-progress"]) in (
            0,
            1,
            3,
        )
        reports[engine] = json.loads((out / "report.json").read_text())
    a, b = reports["pyarrow"], reports["numpy"]
    assert a["verdict"] == b["verdict"] and list(a["groups"]) == list(b["groups"])
    _close(a, b)


def _close(a, b, path="report"):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-12), path
    else:
        assert a == b, path


def test_engine_is_checked(tmp_path):
    path = _write(tmp_path / "x.csv", _rows())
    with pytest.raises(ValueError, match="^engine"):
        next(read_columns(path, ["p"], engine="polars"))


def test_auditor_sample_does_not_depend_on_the_cut(monkeypatch):
    """The threshold filter before the sample's top-k only skips keys that cannot enter: a cut
    that is always too low (every key re-examined) gives the same sample."""
    g = torch.Generator().manual_seed(3)
    p = torch.rand(30_000, generator=g, dtype=torch.float64)
    y = (torch.rand(30_000, generator=g, dtype=torch.float64) < p).long()
    grp = torch.randint(0, 3, (30_000,), generator=g)
    a = Auditor(sample_size=1000)
    for s in range(0, 30_000, 7000):
        a.update(p[s : s + 7000], y[s : s + 7000], grp[s : s + 7000])
    from torchcal.audit import core

    monkeypatch.setattr(core, "_cut", lambda k, n: 1e-9)
    b = Auditor(sample_size=1000)
    b.update(p[:50], y[:50], grp[:50])
    b.update(p[50:], y[50:], grp[50:])
    for k, v in a.sample().items():
        assert torch.equal(v, b.sample()[k]), k
    keys = torch.rand(30_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.equal(a.sample()["row"], keys.argsort()[:1000].sort().values)
