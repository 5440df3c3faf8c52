"""The audit's readers: every format and every CSV path (fast, loadtxt, csv module) gives the
values numpy/the csv module read independently, in any chunking, with group ids in order of
first appearance."""

import csv

import numpy as np
import pytest
import torch

from torchcal.audit import _csv
from torchcal.audit._columns import first_appearance
from torchcal.audit.io import read_columns, read_predictions

RNG = np.random.default_rng(0)
N = 257
P = RNG.random(N)
Y = (RNG.random(N) < P).astype(int)
NAMES = np.array(["math", "open_qa", "a_rather_long_domain_name", "x"])
GID = RNG.integers(0, 4, N)
GID[:5] = [1, 1, 3, 0, 1]  # first appearances: open_qa, x, math, ...


def _write_csv(path, rows, header="id,domain,p,y", end="\n"):
    path.write_text(header + end + "".join(r + end for r in rows))
    return path


def _rows(fmt="{p!r}"):
    return [f"{i},{NAMES[GID[i]]},{fmt.format(p=float(P[i]))},{Y[i]}" for i in range(N)]


def _read_all(path, chunk_rows=1 << 20, group="domain"):
    chunks = list(read_columns(path, ["p", "y"], group=group, chunk_rows=chunk_rows))
    p = np.concatenate([c.columns["p"] for c in chunks])
    y = np.concatenate([c.columns["y"] for c in chunks])
    g = None if group is None else np.concatenate([c.groups for c in chunks])
    return p, y, g, chunks[-1].group_names, chunks


def _reference_ids():
    order = list(dict.fromkeys(NAMES[GID].tolist()))
    return np.array([order.index(n) for n in NAMES[GID]]), order


@pytest.mark.parametrize("chunk_rows", [1, 7, 100, 1 << 20])
def test_csv_values_and_groups_any_chunking(tmp_path, chunk_rows):
    path = _write_csv(tmp_path / "x.csv", _rows())
    p, y, g, names, chunks = _read_all(path, chunk_rows)
    ref = np.loadtxt(path, delimiter=",", usecols=(2, 3), skiprows=1)
    np.testing.assert_array_equal(p, ref[:, 0])  # repr round-trips: exactly the float64s
    np.testing.assert_array_equal(P, p)
    np.testing.assert_array_equal(y, Y)
    ids, order = _reference_ids()
    np.testing.assert_array_equal(g, ids)
    assert names == order == ["open_qa", "x", "math", "a_rather_long_domain_name"]
    lines = np.concatenate([c.lines for c in chunks])
    np.testing.assert_array_equal(lines, np.arange(2, N + 2))
    if chunk_rows < N:
        assert len(chunks) > 1


def test_csv_slow_path_quotes_crlf_blank_lines(tmp_path):
    """Quoted names with commas, CRLF, a blank line and no final newline: the csv module path,
    checked against csv.reader itself."""
    rows = [f'{i},"{NAMES[GID[i]]}, q",{float(P[i])!r},{Y[i]}' for i in range(N)]
    rows.insert(10, "")
    text = "id,domain,p,y\r\n" + "\r\n".join(rows)
    path = tmp_path / "q.csv"
    path.write_bytes(text.encode())
    p, y, g, names, chunks = _read_all(path, 50)
    with open(path, newline="") as f:
        ref = [r for r in csv.reader(f)][1:]
    ref = [r for r in ref if r]
    np.testing.assert_array_equal(p, [float(r[2]) for r in ref])
    np.testing.assert_array_equal(y, [float(r[3]) for r in ref])
    assert [names[i] for i in g] == [r[1] for r in ref]
    lines = np.concatenate([c.lines for c in chunks])
    assert lines[9] == 11 and lines[10] == 13  # the blank line 12 is skipped, numbering kept


def test_csv_general_numbers_go_through_loadtxt(tmp_path):
    rows = [f"{i},{NAMES[GID[i]]},{P[i]:.3e},{Y[i]}" for i in range(N)]
    path = _write_csv(tmp_path / "e.csv", rows)
    p, *_ = _read_all(path, 64)
    np.testing.assert_array_equal(p, [float(f"{v:.3e}") for v in P])


def test_group_keys_equal_iff_bytes_equal():
    """Brute force over short and long names, including prefixes and NUL-free near misses."""
    words = [b"", b"a", b"ab", b"ba", b"abc", b"abcdefg", b"abcdefh", b"abcdefgh", b"abcdefgh1"]
    words += [b"zz" * 6, b"zz" * 6 + b"z"]
    for subset in (words[:7], words):  # uint64 packing (<= 7 bytes), fixed-width bytes
        body = b",".join(subset) + b","
        buf = np.frombuffer(body + bytes(_csv.PAD), dtype=np.uint8)
        ends = np.flatnonzero(buf[: len(body)] == 44)
        starts = np.r_[0, ends[:-1] + 1]
        keys = _csv.group_keys(buf, starts, ends)
        for i, a in enumerate(subset):
            for j, b in enumerate(subset):
                assert bool(keys[i] == keys[j]) == (a == b), (a, b)


def test_first_appearance_matches_python():
    vals = RNG.integers(0, 9, 100)
    uniq, first, inv = np.unique(vals, return_index=True, return_inverse=True)
    f, ids = first_appearance(first, inv)
    order = list(dict.fromkeys(vals.tolist()))
    np.testing.assert_array_equal(ids, [order.index(v) for v in vals])
    np.testing.assert_array_equal(vals[f], order)


def _formats(tmp_path):
    names = NAMES[GID]
    np.savez(tmp_path / "x.npz", p=P, y=Y, domain=names)
    torch.save(
        {"p": torch.tensor(P), "y": torch.tensor(Y), "domain": names.tolist()}, tmp_path / "x.pt"
    )
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"p": P, "y": Y, "domain": names.tolist()})
    pq.write_table(table, tmp_path / "x.parquet", row_group_size=60)
    return ["x.npz", "x.pt", "x.parquet"]


def test_npz_pt_parquet_equal_csv(tmp_path):
    pytest.importorskip("pyarrow")
    csv_p, csv_y, csv_g, csv_names, _ = _read_all(_write_csv(tmp_path / "x.csv", _rows()))
    for name in _formats(tmp_path):
        for chunk_rows in (1 << 20, 50):
            p, y, g, names, chunks = _read_all(tmp_path / name, chunk_rows)
            np.testing.assert_array_equal(p, csv_p)
            np.testing.assert_array_equal(y, csv_y)
            np.testing.assert_array_equal(g, csv_g)
            assert names == csv_names, name
            assert chunks[0].where(3) == "row 3"


def test_read_predictions_multiclass_and_2d_column(tmp_path):
    probs = RNG.dirichlet(np.ones(3), N)
    target = RNG.integers(0, 3, N)
    np.savez(tmp_path / "m.npz", probs=probs, y=target)
    (b,) = read_predictions(tmp_path / "m.npz", preds=["probs"], label="y")
    assert b.preds.shape == (N, 3) and b.target.dtype == torch.int64
    rows = [",".join(repr(float(v)) for v in probs[i]) + f",{target[i]}" for i in range(N)]
    path = _write_csv(tmp_path / "m.csv", rows, header="a,b,c,y")
    (c,) = read_predictions(path, preds=["a", "b", "c"], label="y")
    torch.testing.assert_close(c.preds, b.preds, rtol=0, atol=0)
    torch.testing.assert_close(c.target, b.target, rtol=0, atol=0)


#: (label, group, weight) edits of one row each and the reason the row gets (docs/design.md
#: section 6c.2: the engines' reasons, no longer the reader's errors)
SOFT_EDITS = [
    ("yes", "math", "1", "label_invalid"),
    ("", "x", "1", "label_invalid"),
    (" ", "x", "1", "label_invalid"),
    ("1", "", "1", "group_null"),
    ("0", "   ", "1", "group_null"),
    ("1", "\u3000", "1", "group_null"),
    ("1", "math", "", "weight_invalid"),
    ("0", "math", "heavy", "weight_invalid"),
]


def _soft_file(tmp_path, quoted=False):
    rows = [f"{i},{NAMES[GID[i]]},{float(P[i])!r},{Y[i]},1" for i in range(N)]
    for k, (y, g, w, _) in enumerate(SOFT_EDITS):
        i = 20 * k + 3
        p = float(P[i])
        rows[i] = f'{i},"{g}",{p!r},{y},{w}' if quoted else f"{i},{g},{p!r},{y},{w}"
    path = tmp_path / ("q.csv" if quoted else "s.csv")
    path.write_text("id,domain,p,y,w\n" + "".join(r + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("engine", ["pyarrow", "numpy"])
@pytest.mark.parametrize("quoted", [False, True])
@pytest.mark.parametrize("chunk_rows", [16, 1 << 20])
def test_a_bad_label_weight_or_group_is_a_rejected_row_not_an_error(
    tmp_path, engine, quoted, chunk_rows
):
    """The old reader errors (``y: label 'yes' ... is not a number``, ``empty group name``, a
    blank weight) no longer fire with --probs: the rows are counted by reason and left out,
    as DuckDB and Spark count them; the first is named as the error was."""
    path = _soft_file(tmp_path, quoted)
    kw = dict(preds=["p"], label="y", group="domain", weight="w", max_unparsed=0.05)
    batches = list(read_predictions(path, engine=engine, chunk_rows=chunk_rows, **kw))
    log = batches[-1].log
    want: dict[str, int] = {}
    for *_, r in SOFT_EDITS:
        want[r] = want.get(r, 0) + 1
    assert log.rejected == want
    assert log.first_rejected.startswith("y: label 'yes' at line 5 is not a number nor True/False")
    assert sum(b.preds.numel() for b in batches) == N - len(SOFT_EDITS) == log.kept
    names = batches[-1].group_names
    assert sorted(names) == sorted(set(NAMES[GID].tolist())), names  # no blank group
    assert all(int(b.groups.min()) >= 0 for b in batches)
    kw.update(max_unparsed=0.01, engine=engine, chunk_rows=chunk_rows)
    counts = r"label_invalid 3, group_null 3, weight_invalid 2"
    with pytest.raises(ValueError, match=rf"8 of 257 rows are invalid \({counts}\)"):
        list(read_predictions(path, **kw))


def test_logits_keep_the_readers_errors(tmp_path):
    """--logits reads no row rules: a label that is no number is still the reader's error."""
    path = _soft_file(tmp_path)
    with pytest.raises(ValueError, match=r"^y: label 'yes' at line 5 is not a number nor True/"):
        list(read_predictions(path, preds=["p"], label="y", group="domain", input="logits"))


def test_parquet_nulls_and_words_are_rejected_rows(tmp_path):
    """Parquet: a null or unparsed label, a null or blank group (string or integer column), a
    null weight are rows the rules reject, with the row they were at."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    n = 200
    y = ["1" if i % 2 else "0" for i in range(n)]
    g = ["a" if i % 3 else "b" for i in range(n)]
    w = [1.0] * n
    y[5], y[9], g[11], g[13], w[17] = None, "yes", None, "  ", None
    k = [i % 4 if i != 7 else None for i in range(n)]
    t = pa.table({"p": [0.5] * n, "y": y, "g": g, "w": w, "k": k})
    pq.write_table(t, tmp_path / "x.parquet")
    kw = dict(preds=["p"], label="y", weight="w", max_unparsed=0.05, chunk_rows=64)
    b = list(read_predictions(tmp_path / "x.parquet", group="g", **kw))
    assert b[-1].log.rejected == {"label_invalid": 2, "group_null": 2, "weight_invalid": 1}
    assert b[-1].log.first_rejected.startswith("y: label '' at row 5 is not a number")
    b = list(read_predictions(tmp_path / "x.parquet", group="k", **kw))  # an integer group
    assert b[-1].log.rejected == {"label_invalid": 2, "group_null": 1, "weight_invalid": 1}
    assert sorted(b[-1].group_names) == ["0", "1", "2", "3"]
