"""Hostile input for ``torchcal audit`` (and its readers): every case exits 2 with ONE line on
stderr, ``torchcal: error: <message>``, naming the column or value (and the line for CSV) --
never a traceback, never a plausible report."""

import re

import numpy as np
import pytest
import torch

from torchcal import cli

HEAD = "id,domain,p,y\n"
GOOD = "".join(f"{i},{'ab'[i % 2]},0.{i % 9 + 1},{i % 2}\n" for i in range(20))
BASE = ["--probs", "p", "--label", "y", "--group", "domain"]


def _csv(body):
    return lambda d: _write(d / "x.csv", body)


def _write(path, text):
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


# (id, file factory, extra args (replacing BASE when it starts with "!"), message regex)
CASES = [
    ("missing-column", _csv(HEAD + GOOD), ["--probs", "q"], r"q: no such column in .*x\.csv"),
    ("missing-label", _csv(HEAD + GOOD), ["--label", "z"], r"z: no such column"),
    ("missing-group", _csv(HEAD + GOOD), ["--group", "dom"], r"dom: no such column"),
    ("non-numeric", _csv(HEAD + GOOD + "20,a,abc,1\n"), [], r"p: 'abc' at line 22 is not a number"),
    ("empty-value", _csv(HEAD + "0,a,,1\n" + GOOD), [], r"p: '' at line 2 is not a number"),
    ("prob>1", _csv(HEAD + GOOD + "20,a,1.5,1\n"), [], r"p: value 1\.5 at line 22 is not a prob"),
    ("prob<0", _csv(HEAD + "0,a,-0.1,1\n" + GOOD), [], r"p: value -0\.1 at line 2 is not a prob"),
    ("prob-nan", _csv(HEAD + GOOD + "20,a,nan,1\n"), [], r"p: value nan at line 22"),
    ("label-2", _csv(HEAD + GOOD + "20,a,0.5,2\n"), [], r"y: label 2 at line 22 is not a class"),
    ("label-frac", _csv(HEAD + "0,a,0.5,0.5\n"), [], r"y: label 0\.5 at line 2 is not a class"),
    ("label-neg", _csv(HEAD + "0,a,0.5,-1\n"), [], r"y: label -1 at line 2"),
    ("empty-group", _csv(HEAD + GOOD + "20,,0.5,1\n"), [], r"domain: empty group name at line 22"),
    ("blank-group", _csv(HEAD + '0,"  ",0.5,1\n'), [], r"domain: empty group name at line 2"),
    ("ragged-row", _csv(HEAD + GOOD + "20,a,0.5\n"), [], r"line 22: expected 4 fields"),
    ("empty-file", _csv(""), [], r"x\.csv: empty file"),
    ("header-only", _csv(HEAD), [], r"x\.csv: no data rows"),
    ("unknown-ext", lambda d: _write(d / "x.txt", HEAD + GOOD), [], r"x\.txt: unknown file type"),
    ("no-file", lambda d: d / "nope.csv", [], r"nope\.csv: no such file"),
    ("cost-half", _csv(HEAD + GOOD), ["--cost-error", "5"], r"--cost-error: needs --cost-esc"),
    ("cost-half2", _csv(HEAD + GOOD), ["--cost-escalation", "1"], r"--cost-escalation: needs"),
    ("bad-option", _csv(HEAD + GOOD), ["--bins", "x"], r"--bins: invalid value"),
    ("no-probs", _csv(HEAD + GOOD), ["!", "--label", "y"], r"one of the arguments --probs"),
    ("bad-npz", lambda d: _write(d / "x.npz", b"not a zip"), [], r"x\.npz: cannot be read"),
    ("bad-pt", lambda d: _write(d / "x.pt", b"junk"), [], r"x\.pt: cannot be read as a \.pt"),
    (
        "npz-lengths",
        lambda d: _npz(d, p=np.full(5, 0.5), y=np.zeros(4), domain=np.array(list("aabbb"))),
        [],
        r"y: 4 rows, but p has 5",
    ),
    (
        "npz-text-probs",
        lambda d: _npz(d, p=np.array(["a", "b"]), y=np.zeros(2), domain=np.array(["a", "b"])),
        [],
        r"p: expected a 1-D or 2-D array of numbers",
    ),
    (
        "pt-empty-group",
        lambda d: _pt(d, p=torch.full((3,), 0.5), y=torch.zeros(3), domain=["a", "", "b"]),
        [],
        r"domain: empty group name at row 1",
    ),
    (
        "pt-prob",
        lambda d: _pt(d, p=torch.tensor([0.5, 7.0]), y=torch.zeros(2), domain=["a", "b"]),
        [],
        r"p: value 7\.0 at row 1 is not a probability",
    ),
    (
        "pt-not-dict",
        lambda d: _pt_raw(d, torch.zeros(3)),
        [],
        r"x\.pt: expected a dict of columns, got Tensor",
    ),
]


def _npz(d, **arrays):
    np.savez(d / "x.npz", **arrays)
    return d / "x.npz"


def _pt(d, **cols):
    return _pt_raw(d, cols)


def _pt_raw(d, obj):
    torch.save(obj, d / "x.pt")
    return d / "x.pt"


@pytest.mark.parametrize(
    ("make", "extra", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, make, extra, message):
    path = make(tmp_path)
    args = extra[1:] if extra[:1] == ["!"] else [*BASE, *extra]
    code = cli.main(["audit", str(path), *args, "--threshold", "0.8"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchcal: error: "), err
    assert re.search(message, lines[0]), lines[0]


@pytest.mark.parametrize("chunk_rows", [1, 3, 1000])
def test_error_line_numbers_do_not_depend_on_chunking(tmp_path, capsys, chunk_rows):
    path = _write(tmp_path / "x.csv", HEAD + GOOD + "20,a,1.5,1\n" + GOOD)
    assert cli.main(["audit", str(path), *BASE, "--chunk-rows", str(chunk_rows)]) == 2
    assert "at line 22 " in capsys.readouterr().err


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path, capsys, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_pyarrow(name, *a, **k):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    path = _write(tmp_path / "x.parquet", b"PAR1")
    assert cli.main(["audit", str(path), *BASE]) == 2
    assert "x.parquet: reading Parquet needs pyarrow" in capsys.readouterr().err


def test_compare_bad_json_exits_2(tmp_path, capsys):
    bad = _write(tmp_path / "a.json", "{not json")
    assert cli.main(["compare", str(bad), str(bad)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
