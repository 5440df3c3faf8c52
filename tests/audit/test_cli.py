"""``torchcal`` end to end on generated files: verdicts, exit codes, report.json, every format,
--fit-temperature, --reference / compare, fit-temperature, the progress bar; one subprocess
run of the real entry point."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from torchcal import cli
from torchcal.audit import AuditReport, audit, load_temperatures
from torchcal.audit.example import make_judging_data, write_judging_csv
from torchcal.scaling import TemperatureScaler

ARGS = ["--probs", "p_correct", "--label", "correct", "--group", "domain", "--threshold", "0.8"]
KEYS = {"n", "ece", "ece_ci", "ece_debiased", "mce", "brier", "nll", "accuracy"}
KEYS |= {"threshold_gap", "verdict", "reasons"}


@pytest.fixture(scope="module")
def judging(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "judging.csv"
    assert cli.main(["example", str(path)]) == 0
    return path


def _audit(capsys, *argv):
    code = cli.main(["audit", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_example_audit_fails_open_qa_with_reason(judging, tmp_path, capsys):
    code, out, err = _audit(capsys, judging, *ARGS, "--out", tmp_path / "rep")
    assert code == 1 and err == ""
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["verdict"] == "fail"
    assert KEYS <= set(rep["pooled"]) and all(KEYS <= set(g) for g in rep["groups"].values())
    assert rep["groups"]["math"]["verdict"] == "pass"
    assert rep["groups"]["open_qa"]["verdict"] == "fail"
    (reason,) = rep["groups"]["open_qa"]["reasons"]
    assert reason.startswith("over-confident by") and "near 0.8" in reason
    assert "open_qa" in out and "FAIL" in out and "over-confident" in out
    for name in ("report.md", "report.txt", "report.html"):
        assert (tmp_path / "rep" / name).stat().st_size > 0


def test_cli_equals_python_api(judging, tmp_path, capsys):
    """The streamed CSV audit in odd chunks == audit() on the in-memory rows."""
    _audit(capsys, judging, *ARGS, "--out", tmp_path, "--chunk-rows", 333)
    got = json.loads((tmp_path / "report.json").read_text())
    d = make_judging_data()
    names = ["math", "open_qa"]
    order = list(dict.fromkeys(d["domain"]))
    g = torch.tensor([order.index(x) for x in d["domain"]])
    ref = audit(d["p_correct"], d["correct"], groups=g, group_names=order, threshold=0.8)
    for name in names:
        for k in ("n", "ece", "ece_debiased", "mce", "brier", "nll", "accuracy"):
            assert got["groups"][name][k] == pytest.approx(ref.groups[name][k], rel=1e-12, abs=0)
        assert got["groups"][name]["ece_ci"] == pytest.approx(ref.groups[name]["ece_ci"], rel=1e-12)


def test_calibrated_only_passes_exit_0(tmp_path, capsys):
    d = make_judging_data(1000, seed=0)
    keep = [i for i, x in enumerate(d["domain"]) if x == "math"]
    rows = [f"{d['p_correct'][i].item()!r},{d['correct'][i].item()}" for i in keep]
    path = tmp_path / "math.csv"
    path.write_text("p,y\n" + "\n".join(rows) + "\n")
    code, out, _ = _audit(capsys, path, "--probs", "p", "--label", "y", "--threshold", "0.8")
    assert code == 0 and "PASS" in out


def test_fit_temperature_repairs_on_held_out_half(judging, tmp_path, capsys):
    code, out, _ = _audit(capsys, judging, *ARGS, "--fit-temperature", "--out", tmp_path)
    assert code == 1  # the verdict is on the data as given
    t = json.loads((tmp_path / "report.json").read_text())["temperature"]
    assert t["group_T"]["open_qa"] > 1.8 and 0.7 < t["group_T"]["math"] < 1.3
    assert t["eval_before"]["groups"]["open_qa"]["verdict"] == "fail"
    assert {g["verdict"] for g in t["eval_after"]["groups"].values()} == {"pass"}
    assert "temperature" in out
    # the held-out lines show the quantity the verdict is judged on (the gap near 0.8)
    (after,) = [ln for ln in out.splitlines() if ln.strip().startswith("eval_after:")]
    assert "open_qa gap " in after and " ECE " not in after


def _drifted_csv(path, seed):
    """math made over-confident (labels from logit / 3), open_qa redrawn unchanged."""
    d = make_judging_data(1000, seed=seed)
    g = torch.Generator().manual_seed(seed)
    p = d["p_correct"]
    drift = torch.tensor([x == "math" for x in d["domain"]])
    true = torch.where(drift, torch.sigmoid(torch.logit(p) / 3), p)
    y = torch.where(drift, torch.bernoulli(true, generator=g).long(), d["correct"])
    rows = [f"{dom},{pi!r},{yi}" for dom, pi, yi in zip(d["domain"], p.tolist(), y.tolist())]
    path.write_text("domain,p_correct,correct\n" + "\n".join(rows) + "\n")
    return path


def test_reference_drift_exit_1_names_the_group(judging, tmp_path, capsys):
    _audit(capsys, judging, *ARGS, "--out", tmp_path / "old")
    old = tmp_path / "old" / "report.json"
    stable = tmp_path / "stable.csv"
    write_judging_csv(stable, 1000, seed=1)
    new = _drifted_csv(tmp_path / "new.csv", seed=1)
    # a stable file against the reference: open_qa still fails its verdict, but no drift
    code, out, _ = _audit(capsys, stable, *ARGS, "--reference", old, "--out", tmp_path / "s")
    assert "DRIFT" not in out
    code, out, _ = _audit(capsys, new, *ARGS, "--reference", old, "--out", tmp_path / "new")
    assert code == 1 and "DRIFT: calibration got worse in math" in out
    assert cli.main(["compare", str(old), str(tmp_path / "s" / "report.json")]) == 0
    assert cli.main(["compare", str(old), str(tmp_path / "new" / "report.json")]) == 1
    out = capsys.readouterr().out
    assert "WORSE" in out and "flagged: math" in out


def _formats(tmp_path):
    d = make_judging_data(400, seed=2)
    p, y, dom = d["p_correct"], d["correct"], np.array(d["domain"])
    np.savez(tmp_path / "j.npz", p_correct=p.numpy(), correct=y.numpy(), domain=dom)
    torch.save({"p_correct": p, "correct": y, "domain": d["domain"]}, tmp_path / "j.pt")
    rows = [f"{a},{b!r},{c}" for a, b, c in zip(d["domain"], p.tolist(), y.tolist())]
    (tmp_path / "j.csv").write_text("domain,p_correct,correct\n" + "\n".join(rows) + "\n")
    paths = [tmp_path / "j.csv", tmp_path / "j.npz", tmp_path / "j.pt"]
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return paths
    table = pa.table({"p_correct": p.numpy(), "correct": y.numpy(), "domain": d["domain"]})
    pq.write_table(table, tmp_path / "j.parquet", row_group_size=150)
    return paths + [tmp_path / "j.parquet"]


def test_every_format_gives_the_same_report(tmp_path, capsys):
    reports = []
    for path in _formats(tmp_path):
        out = tmp_path / path.suffix[1:]
        code, *_ = _audit(capsys, path, *ARGS, "--out", out, "--chunk-rows", 111)
        reports.append((code, AuditReport.from_json(out / "report.json").to_dict()))
    assert len(reports) >= 3
    code0, ref = reports[0]
    for code, rep in reports[1:]:  # chunks differ by format: sums agree to rounding
        assert code == code0
        _assert_close(rep["pooled"], ref["pooled"])
        _assert_close(rep["groups"], ref["groups"])


def _assert_close(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_close(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_close(x, y)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-15)
    else:
        assert a == b


def test_logits_columns_multiclass(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    z = 2 * torch.randn(600, 3, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    rows = [",".join(repr(v) for v in r) + f",{t}" for r, t in zip(z.tolist(), y.tolist())]
    path = tmp_path / "m.csv"
    path.write_text("a,b,c,y\n" + "\n".join(rows) + "\n")
    code, out, _ = _audit(
        capsys, path, "--logits", "a", "b", "c", "--label", "y", "--out", tmp_path
    )
    rep = json.loads((tmp_path / "report.json").read_text())
    ref = audit(z, y, input="logits")
    assert rep["settings"]["reading"] == "confidence"
    assert rep["pooled"]["ece"] == pytest.approx(ref.pooled["ece"], rel=1e-12)
    assert code == cli.EXIT_CODES[ref.verdict]


def test_fit_temperature_command_matches_scaler(judging, tmp_path, capsys):
    out_pt = tmp_path / "t.pt"
    argv = ["fit-temperature", str(judging), "--probs", "p_correct", "--label", "correct"]
    assert cli.main([*argv, "-o", str(out_pt)]) == 0
    out = capsys.readouterr().out
    assert "FitResult" not in out and "pooled T = " in out
    d = make_judging_data()
    p = d["p_correct"]
    ref = TemperatureScaler(method="newton")
    ref.fit(torch.log(p) - torch.log1p(-p), d["correct"])
    state = torch.load(out_pt, weights_only=True)
    fitted = TemperatureScaler()
    fitted.load_state_dict(state["state_dict"])
    assert fitted.temperature == pytest.approx(ref.temperature, rel=1e-9)
    assert load_temperatures(out_pt) == {"pooled": pytest.approx(ref.temperature, rel=1e-9)}
    assert cli.main([*argv, "--group", "domain", "-o", str(out_pt)]) == 0
    out = capsys.readouterr().out
    assert "T[open_qa]" in out and "FitResult" not in out
    temps = load_temperatures(out_pt)  # by group name
    assert sorted(temps) == ["math", "open_qa"] and temps["open_qa"] > 1.8


def test_progress_bar_does_not_change_output(judging, tmp_path, capsys, monkeypatch):
    _, quiet, _ = _audit(capsys, judging, *ARGS, "--no-progress")
    from torchcal.audit import engine_input

    monkeypatch.setattr(engine_input, "PROGRESS_BYTES", 0)
    code, out, _ = _audit(capsys, judging, *ARGS, "--chunk-rows", 100)
    assert code == 1 and out == quiet


def test_module_entry_point_subprocess(judging):
    """The real process (``python -m torchcal.cli``, what the console script calls): exit
    code 1 on the failing example, the report on stdout, nothing on stderr."""
    run = [sys.executable, "-m", "torchcal.cli", "audit", str(judging), *ARGS]
    res = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and res.stderr == ""
    assert "open_qa" in res.stdout and "verdict: FAIL" in res.stdout


GOOD = "p,y,g\n0.2,0,a\n0.9,1,b\n"
BAD_INPUT = [  # (csv text, argv after the file, a word the message must name)
    (GOOD, ["--probs", "q", "--label", "y"], "q: no such column"),
    (GOOD, ["--probs", "p", "--label", "z"], "z: no such column"),
    (GOOD, ["--probs", "p", "--label", "y", "--group", "h"], "h: no such column"),
    ("p,y\n0.2,0\nabc,1\n", ["--probs", "p", "--label", "y"], "p: 'abc' at line 3"),
    ("p,y\n0.2,0\n1.5,1\n", ["--probs", "p", "--label", "y"], "p: value 1.5 at line 3"),
    ("p,y\n0.2,0\nnan,1\n", ["--probs", "p", "--label", "y"], "p: value nan at line 3"),
    ("z,y\n0.2,0\ninf,1\n", ["--logits", "z", "--label", "y"], "z: value inf at line 3"),
    ("p,y\n0.2,0\n0.9,2\n", ["--probs", "p", "--label", "y"], "y: label 2 at line 3"),
    ("p,y\n0.2,0.5\n0.9,1\n", ["--probs", "p", "--label", "y"], "y: label 0.5 at line 2"),
    ("a,b,y\n1,2,0\n1,2,7\n", ["--logits", "a", "b", "--label", "y"], "y: label 7 at line 3"),
    ("p,y,g\n0.2,0,a\n0.9,1,\n", ["--probs", "p", "--label", "y", "--group", "g"], "g: empty"),
    ("p,y\n", ["--probs", "p", "--label", "y"], "no data rows"),
    (GOOD, ["--label", "y"], "--probs --logits is required"),
    (GOOD, ["--probs", "p", "--label", "y", "--threshold", "1.5"], "error: --threshold: "),
    (GOOD, ["--probs", "p", "--label", "y", "--threshold", "x"], "--threshold: invalid"),
    (GOOD, ["--probs", "p", "--label", "y", "--tolerance", "0"], "error: --tolerance: "),
    (GOOD, ["--probs", "p", "--label", "y", "--bins", "0"], "error: --bins: "),
    (GOOD, ["--probs", "p", "--label", "y", "--cost-error", "3"], "--cost-error: needs"),
    (GOOD, ["--probs", "p", "--label", "y", "--cost-error", "-1", "--cost-escalation", "1"],
     "error: --cost-error: "),
    (GOOD, ["--probs", "p", "--label", "y", "--reference", "nope.json"], "--reference"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "argv", "named"), BAD_INPUT)
def test_bad_input_exits_2_with_one_line_naming_it(tmp_path, capsys, text, argv, named):
    path = tmp_path / "in.csv"
    path.write_text(text)
    code, out, err = _audit(capsys, path, *argv, "--no-progress")
    assert code == 2 and out == ""
    assert err.startswith("torchcal: error: ") and err.count("\n") == 1, err
    assert named in err


def test_missing_file_and_bad_reports_exit_2(tmp_path, capsys):
    code, _, err = _audit(capsys, tmp_path / "none.csv", "--probs", "p", "--label", "y")
    assert code == 2 and "none.csv" in err and err.count("\n") == 1
    reports = {
        "schema.json": ('{"schema_version": 3}', "schema_version"),
        "text.json": ("not json", "old"),
        "list.json": ('{"schema_version": 2, "verdict": "pass", "settings": {}, "pooled": {},'
                      ' "groups": [1]}', "settings.n_bins"),
        "keys.json": ('{"schema_version": 2, "verdict": "pass", "settings": {"n_bins": 10, '
                      '"threshold": null, "tolerance": 0.05, "interval_level": 0.9}, "pooled": '
                      '{"n": 0, "verdict": "pass", "threshold_gap": null}, '
                      '"groups": {"math": {"n": 5, "verdict": "pass", "ece": 0.1}}}',
                      "groups['math'].ece_debiased"),
    }  # fmt: skip
    for name, (text, named) in reports.items():
        (tmp_path / name).write_text(text)
        assert cli.main(["compare", str(tmp_path / name), str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("torchcal: error: ") and err.count("\n") == 1 and named in err


def test_options_reach_the_audit(tmp_path, capsys):
    """--tolerance, --bins, --seed and the costs give audit()'s report with those settings
    (and no temperature section without --fit-temperature)."""
    path = tmp_path / "j.csv"
    write_judging_csv(path, 800, seed=3)
    argv = [*ARGS, "--tolerance", "0.3", "--bins", "7", "--seed", "5", "--cost-error", "4"]
    code, _, _ = _audit(capsys, path, *argv, "--cost-escalation", "1", "--out", tmp_path)
    got = json.loads((tmp_path / "report.json").read_text())
    d = make_judging_data(800, seed=3)
    order = list(dict.fromkeys(d["domain"]))
    g = torch.tensor([order.index(x) for x in d["domain"]])
    ref = audit(d["p_correct"], d["correct"], groups=g, group_names=order, threshold=0.8,
                tolerance=0.3, n_bins=7, seed=5, cost_error=4.0, cost_escalation=1.0)  # fmt: skip
    assert ref.verdict == "pass" and code == 0  # tolerance 0.3: both domains pass
    assert got["temperature"] is None
    assert got["settings"] == ref.to_dict()["settings"]
    _assert_close(got["groups"], ref.to_dict()["groups"])
    assert (
        got["groups"]["open_qa"]["cost"]["threshold"] == ref.groups["open_qa"]["cost"]["threshold"]
    )


def test_drift_alone_exits_1(tmp_path, capsys):
    """Every verdict passes (large tolerance) but calibration drifted: exit 1."""
    old, new = tmp_path / "old.csv", _drifted_csv(tmp_path / "new.csv", seed=4)
    write_judging_csv(old, 1000, seed=4)
    loose = [*ARGS, "--tolerance", "0.5", "--no-progress"]
    assert _audit(capsys, old, *loose, "--out", tmp_path / "o")[0] == 0
    code, out, _ = _audit(capsys, new, *loose, "--reference", tmp_path / "o" / "report.json")
    assert code == 1 and "verdict: PASS" in out and "DRIFT: calibration got worse in math" in out
