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
