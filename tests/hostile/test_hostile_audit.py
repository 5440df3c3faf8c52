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
CASES = [  # fmt: skip
    ("missing-column", _csv(HEAD + GOOD), ["--probs", "q"], r"q: no such column in .*x\.csv"),
    ("missing-label", _csv(HEAD + GOOD), ["--label", "z"], r"z: no such column"),
    ("missing-group", _csv(HEAD + GOOD), ["--group", "dom"], r"dom: no such column"),
    ("non-numeric", _csv(HEAD + GOOD + "20,a,abc,1\n"), [], r"p: 'abc' at line 22 is not a number"),
    ("empty-value", _csv(HEAD + "0,a,,1\n" + GOOD), [], r"null 1.*p: missing value at line 2$"),
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
    # issue 17: options that made the gate meaningless are errors before any work
    (
        "tolerance-5",
        _csv(HEAD + GOOD),
        ["--tolerance", "5"],
        r"--tolerance: expected a value in \(0, 1\), got 5 \(did you mean 0\.05\?",
    ),
    ("tolerance-1", _csv(HEAD + GOOD), ["--tolerance", "1"], r"--tolerance: expected a value in"),
    ("tolerance-nan", _csv(HEAD + GOOD), ["--tolerance", "nan"], r"--tolerance: expected a value"),
    (
        "bins-1e9",
        _csv(HEAD + GOOD),
        ["--bins", "1000000000"],
        r"--bins: expected an integer in \[1, 10000\], got 1000000000 \(.*40 GB per group\)",
    ),
    ("bins-0", _csv(HEAD + GOOD), ["--bins", "0"], r"--bins: expected an integer in \[1, 10000\]"),
    (
        "alpha-0.6",
        _csv(HEAD + GOOD),
        ["--alpha", "0.6"],
        r"--alpha: expected a value in \(0, 0\.5\)",
    ),
    (
        "inconclusive-exit-2",
        _csv(HEAD + GOOD),
        ["--inconclusive-exit", "2"],
        r"--inconclusive-exit: invalid choice",
    ),
    (
        "diagrams-neg",
        _csv(HEAD + GOOD),
        ["--diagrams", "-1"],
        r"--diagrams: expected an integer >= 0 or 'all'",
    ),
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


# --- issue 17: every option checked before the work, and no traceback from any input ------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--threshold", "0"], r"--threshold: expected a value in \(0, 1\), got 0"),
        (["--threshold", "1"], r"--threshold: expected a value in \(0, 1\), got 1"),
        (["--threshold", "0.8", "--power", "1"], r"--power: expected a value in \(0, 1\)"),
        (["--out", "{dir}/x.csv"], r"--out: .*x\.csv exists and is not a directory"),
        (["--reference", "{dir}/x.csv"], r"--reference: .*x\.csv: source: not a readable"),
        (["--max-unparsed", "1.5"], r"--max-unparsed: expected a value in"),
    ],
)
def test_options_checked_before_the_work(tmp_path, capsys, argv, message):
    path = _write(tmp_path / "x.csv", HEAD + GOOD)
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    code = cli.main(["audit", str(path), *BASE, *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert re.search(message, err), err


def _report_json(tmp_path, capsys, groups="domain"):
    path = _write(tmp_path / "x.csv", HEAD + GOOD * 20)
    argv = ["--probs", "p", "--label", "y", "--group", groups, "--threshold", "0.8"]
    cli.main(["audit", str(path), *argv, "--out", str(tmp_path / "rep"), "--diagrams", "0"])
    capsys.readouterr()
    return path, argv, tmp_path / "rep" / "report.json"


def _nest(depth):
    return '{"schema_version": 2, "groups": ' + "[" * depth + "]" * depth + "}"


REFERENCE_EDITS = [  # (id, edit of the report text/dict, message regex)
    ("nan-ece", lambda d: d["groups"]["a"].update(ece_debiased=float("nan")), r"not a JSON number|ece_debiased"),
    ("null-ece", lambda d: d["groups"]["a"].update(ece_debiased=None), r"groups\['a'\]\.ece_debiased"),
    ("missing-ci", lambda d: d["groups"]["a"].pop("ece_ci"), r"groups\['a'\]\.ece_ci"),
    ("ece-ci-number", lambda d: d["groups"]["a"].update(ece_ci=0.01), r"groups\['a'\]\.ece_ci"),
    ("gap-null", lambda d: d["groups"]["a"]["threshold_gap"].update(gap=None), r"threshold_gap\.gap"),
    ("gap-string", lambda d: d["pooled"]["threshold_gap"].update(gap="0.1"), r"pooled\.threshold_gap\.gap"),
    ("n-bool", lambda d: d["pooled"].update(n=True), r"pooled\.n: expected a count"),
    ("bins-huge", lambda d: d["settings"].update(n_bins=10**12), r"settings\.n_bins"),
    ("old-schema", lambda d: d.update(schema_version=1), r"re-run the audit"),
    ("not-object", lambda d: "[1, 2]", r"expected an audit report \(a JSON object\)"),
    ("deep", lambda d: _nest(100_000), r"nested too deeply|not a readable"),
    ("truncated", lambda d: '{"schema_version": 2, "verdict"', r"not a readable audit report"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "message"), [c[1:] for c in REFERENCE_EDITS],
                         ids=[c[0] for c in REFERENCE_EDITS])  # fmt: skip
def test_malformed_reference_exits_2_naming_the_entry(tmp_path, capsys, edit, message):
    """A reference whose numbers are NaN/null/missing, of the wrong type, too deeply nested
    or truncated is an error before the audit runs (the drift gate passed on them)."""
    import json

    path, argv, ref = _report_json(tmp_path, capsys)
    d = json.loads(ref.read_text())
    got = edit(d)
    text = got if isinstance(got, str) else json.dumps(d)  # NaN is written as NaN
    bad = _write(tmp_path / "bad.json", text)
    code = cli.main(["audit", str(path), *argv, "--reference", str(bad)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert re.search(message, err), err
    assert cli.main(["compare", str(bad), str(ref)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_renamed_group_in_the_reference_is_not_a_silent_pass(tmp_path, capsys):
    import json

    path, argv, ref = _report_json(tmp_path, capsys)
    d = json.loads(ref.read_text())
    d["groups"]["renamed"] = d["groups"].pop("a")
    _write(tmp_path / "old.json", json.dumps(d))
    code = cli.main(["audit", str(path), *argv, "--reference", str(tmp_path / "old.json")])
    out = capsys.readouterr().out
    assert code in (1, 3) and "not judged" in out and "renamed" in out
    assert cli.main(["compare", str(tmp_path / "old.json"), str(ref)]) == 3


def test_compare_on_a_non_report_file_is_one_line(tmp_path, capsys):
    csv = _write(tmp_path / "x.csv", HEAD + GOOD)
    assert cli.main(["compare", str(csv), str(csv)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "x.csv: not a readable audit report.json" in err


@pytest.mark.parametrize("output", ["{dir}", "{dir}/missing/dir/t.pt"])
def test_fit_temperature_output_path_checked_first(tmp_path, capsys, output):
    path = _write(tmp_path / "x.csv", HEAD + GOOD)
    out = output.replace("{dir}", str(tmp_path))
    code = cli.main(["fit-temperature", str(path), "--probs", "p", "--label", "y", "-o", out])
    std, err = capsys.readouterr()
    assert code == 2 and std == "" and len(err.splitlines()) == 1
    assert err.startswith("torchcal: error: -o: ") and ("directory" in err)


EVIL_NAMES = [
    "a/b",
    "a.b",
    "a b",
    "a_b",
    "x" * 300,
    "\x1b[32mverdict: PASS\x1b[0m",
    "ok\nverdict: PASS",
]


def test_group_names_escaped_on_the_console_and_distinct_files(tmp_path, capsys):
    """Escape sequences or a newline in a group name cannot draw a fake verdict line; a/b,
    a.b, 'a b' and a_b get four PNG files (the old names collided), a 300-byte name fits a
    file system; report.json maps each name to its file."""
    import json

    rows = "".join(f'{i},"{EVIL_NAMES[i % 7]}",0.{i % 9 + 1},{i % 2}\n' for i in range(700))
    path = _write(tmp_path / "x.csv", HEAD + rows)
    code = cli.main(["audit", str(path), *BASE, "--threshold", "0.8", "--out", str(tmp_path / "r"),
                     "--diagrams", "all"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code in (0, 1, 3), err
    assert "\x1b" not in out and "verdict: PASS\x1b" not in out
    lines = out.splitlines()
    assert sum(ln.startswith("verdict: ") for ln in lines) == 1  # the real one only
    assert "\\x1b[32mverdict: PASS" in out and "ok\\nverdict: PASS" in out
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    files = rep["diagrams"]
    assert set(files) == {"pooled", *EVIL_NAMES} and len(set(files.values())) == 8
    for f in files.values():
        assert (tmp_path / "r" / f).is_file() and len(f.encode()) < 100 and "/" not in f
    assert f"wrote {4 + 8} files" in out


def test_probabilities_exactly_0_or_1_are_counted_nll_is_finite_elsewhere(tmp_path, capsys):
    body = HEAD + GOOD * 10 + "900,a,1.0,0\n901,b,0.0,0\n902,b,1.0,1\n"
    path = _write(tmp_path / "x.csv", body)
    code = cli.main(["audit", str(path), *BASE, "--fit-temperature", "--out", str(tmp_path / "r")])
    out, err = capsys.readouterr()
    assert code in (0, 1, 3)
    assert "3 rows have a probability of exactly 0 or 1" in out and "--logits" in out
    import json

    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    a = rep["groups"]["a"]
    assert a["nll_infinite"] and a["nll_infinite_rows"] == 1 and a["nll_finite_rows"] > 0
    assert rep["groups"]["b"]["nll"] is not None  # 0.0 given to label 0: finite
    assert "inf (1 rows)" in out


def test_help_version_and_bare_command(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("torchcal ")
    assert cli.main([]) == 2
    out = capsys.readouterr().out
    assert all(c in out for c in ("audit", "compare", "fit-temperature", "example"))
    assert cli.main(["audit", "--help"]) == 0
    out = capsys.readouterr().out
    assert "exit codes: 0 PASS, 1 FAIL" in out and "3 INCONCLUSIVE" in out
    assert "(default: 0.05)" in out and "(default: 3)" in out


def test_help_and_argument_errors_do_not_import_torch(tmp_path):
    """cli.py parses before it imports anything heavy: --help, --version and argument errors
    are answered with torch never imported (cli.py loaded on its own, as the console script
    would once the package's __init__ imports lazily)."""
    import subprocess
    import sys
    from pathlib import Path

    cli_py = Path(cli.__file__)
    code = f"""
import importlib.util, sys, contextlib, io
spec = importlib.util.spec_from_file_location("cli_alone", {str(cli_py)!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    codes = [m.main(["--help"]), m.main(["audit", "--help"]), m.main(["--version"]),
             m.main(["audit", "f.csv", "--probs", "p", "--label", "y", "--bins", "0"]),
             m.main(["audit", "f.csv", "--probs", "p", "--label", "y", "--tolerance", "5"])]
print(codes, "torch" in sys.modules)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "[0, 0, 0, 2, 2] False", res.stdout + res.stderr


def test_no_traceback_from_an_internal_error(tmp_path, capsys, monkeypatch):
    """Anything unexpected is one line and exit 2, never exit 1 (a FAIL verdict)."""
    from torchcal.audit import Auditor

    def boom(self, *a, **k):
        raise RuntimeError("simulated\ntwo lines")

    monkeypatch.setattr(Auditor, "update", boom)
    path = _write(tmp_path / "x.csv", HEAD + GOOD)
    assert cli.main(["audit", str(path), *BASE]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "RuntimeError: simulated two lines" in err


def test_cli_max_bins_matches_the_auditor():
    from torchcal.audit.state import MAX_BINS

    assert cli.MAX_BINS == MAX_BINS
