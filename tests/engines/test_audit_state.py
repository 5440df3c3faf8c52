"""``torchcal audit`` on states and engines: the state path reports what the streaming
Auditor reports, the command line (--engine, --state, --write-state, --weight, --table), and
states written by DDP ranks (one metric per rank) merged by ``torchcal audit --state``."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from _engine_data import assert_reports_close, rows, write_parts

from torchcal.audit import audit
from torchcal.audit.engine_input import report_from_state
from torchcal.cli import main
from torchcal.engines.memory import state_from_arrays, state_from_metric
from torchcal.engines.state import read_states, write_state
from torchcal.functional import calibration_error
from torchcal.metrics import CalibrationError


def _clean(n=4000, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, generator=g, dtype=torch.float64)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < p**1.2).long()
    grp = torch.randint(0, 3, (n,), generator=g)
    return p, y, grp


def test_the_state_path_reports_what_the_streaming_auditor_reports():
    p, y, grp = _clean()
    names = ["a", "b", "c"]
    kw = {"threshold": 0.7, "cost_error": 5.0, "cost_escalation": 1.0, "seed": 2}
    ref = audit(p, y, groups=grp, group_names=names, **kw).to_dict()
    st = state_from_arrays(p.numpy(), y.numpy(), groups=np.array(names, dtype=object)[grp.numpy()])
    got = report_from_state(st, **kw).to_dict()
    assert got["verdict"] == ref["verdict"]
    assert_reports_close(got["pooled"], ref["pooled"])
    assert_reports_close(got["groups"], ref["groups"])


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_glob_engines_and_state_files_agree(tmp_path, capsys):
    glob = write_parts(rows(1500, seed=4), str(tmp_path / "logs"))
    cols = ["--probs", "p", "--label", "y", "--group", "g", "--threshold", "0.8"]
    # about 2% of these rows are invalid: more than the default --max-unparsed 0.01 stops
    code, out, err = _cli(capsys, "audit", glob, *cols, "--engine", "duckdb")
    assert code == 2 and "rows are invalid" in err and "more than --max-unparsed" in err
    # the in-process road is the file reader: the first invalid value stops it, named
    code, out, err = _cli(capsys, "audit", glob, *cols, "--engine", "memory")
    assert code == 2 and " at row " in err and len(err.splitlines()) == 1
    cols += ["--max-unparsed", "0.05"]  # allowed: left out and named
    s = str(tmp_path / "state.parquet")
    code, out_duck, err = _cli(
        capsys, "audit", glob, *cols, "--engine", "duckdb", "--write-state", s
    )
    assert code in (0, 1, 3) and "rows were left out of the state" in out_duck
    state_cols = ["--threshold", "0.8", "--max-unparsed", "0.05"]
    code3, out_state, _ = _cli(
        capsys, "audit", "--state", s, *state_cols, "--out", str(tmp_path / "o")
    )
    # the same tables and verdict; a state file has no rows, so no sampled concentration line
    same = [ln for ln in out_duck.splitlines() if not ln.startswith("confidences:")]
    assert code3 == code and out_state.splitlines()[: len(same)] == same
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["settings"]["engine"].startswith("duckdb")
    ref = str(tmp_path / "o" / "report.json")  # drift against an earlier report: none
    code5, out_ref, _ = _cli(capsys, "audit", "--state", s, *state_cols, "--reference", ref)
    assert code5 == code and f"compared with {ref}" in out_ref and "DRIFT" not in out_ref
    # a glob alone picks the engine (auto)
    code4, out_auto, _ = _cli(capsys, "audit", glob, *cols)
    assert code4 == code and out_auto == out_duck


def test_cli_weight_table_and_fit_temperature(tmp_path, capsys):
    import duckdb

    t = rows(1500, seed=5, bad=False)
    pq.write_table(t, tmp_path / "a.parquet")
    db = str(tmp_path / "db.duckdb")
    con = duckdb.connect(db)
    con.execute(
        "CREATE TABLE preds AS SELECT * FROM read_parquet(?)", [str(tmp_path / "a.parquet")]
    )
    con.close()
    cols = ["--probs", "p", "--label", "y"]
    code, out_w, _ = _cli(capsys, "audit", str(tmp_path / "a.parquet"), *cols, "--weight", "w")
    assert code in (0, 1, 3)
    _, out_t, _ = _cli(capsys, "audit", db, "--table", "preds", *cols, "--weight", "w")
    assert out_t == out_w
    _, fit1, _ = _cli(capsys, "audit", db, "--table", "preds", *cols, "--fit-temperature")
    _, fit2, _ = _cli(
        capsys,
        "audit",
        str(tmp_path / "a.parquet"),
        *cols,
        "--engine",
        "duckdb",
        "--fit-temperature",
    )
    assert "temperature: pooled T" in fit1 and fit1 == fit2  # seeded, repeatable sample


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--state", "S", "--probs", "p"], "--state: audits state files; --probs belongs"),
        (["--state", "S", "--fit-temperature"], "--fit-temperature: a state holds binned sums"),
        (["--state", "NONE-*.parquet"], "--state: no file matches"),
        (["G", "--logits", "p", "--label", "y"], "--logits: the engines read probabilities"),
        (["G", "--probs", "p"], "the following arguments are required: --label"),
        (["--engine", "duckdb"], "the following arguments are required: file"),
        (["G", "--probs", "nope", "--label", "y"], "nope: no such column in "),
    ],
)
def test_cli_errors_are_one_line_exit_2(tmp_path, capsys, argv, message):
    glob = write_parts(rows(200, seed=6), str(tmp_path / "g"))
    s = str(tmp_path / "s.parquet")
    write_state(state_from_arrays([0.5], [1]), s)
    argv = [
        {"S": s, "G": glob}.get(a, str(tmp_path / a) if a.startswith("NONE") else a) for a in argv
    ]
    code, out, err = _cli(capsys, "audit", *argv)
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_ddp_ranks_write_parts_and_audit_state_merges_them(tmp_path, capsys):
    """Each rank updates its metric on its shard and writes ``state_from_metric`` (the local,
    unsynchronised statistics); ``torchcal audit --state 'part-*'`` merges them into the
    numbers of one metric over all rows (2 ranks simulated in one process)."""
    p, y, grp = _clean(3000, seed=8)
    ranks = [
        CalibrationError(n_bins=10, reading="binary", input="probs", num_groups=3) for _ in range(2)
    ]
    for r, m in enumerate(ranks):
        sl = slice(r, None, 2)  # a DistributedSampler-like shard
        m.update(p[sl], y[sl], grp[sl])
        write_state(
            state_from_metric(m, group_names=["x", "y", "z"]), tmp_path / f"part-{r}.parquet"
        )
    merged = read_states(str(tmp_path / "part-*.parquet"))
    whole = CalibrationError(n_bins=10, reading="binary", input="probs", num_groups=3)
    whole.update(p, y, grp)
    assert torch.equal(merged.stats.count, whole.statistics().stats.count)
    code, out, err = _cli(
        capsys, "audit", "--state", str(tmp_path / "part-*.parquet"), "--out", str(tmp_path / "o")
    )
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    want = calibration_error(p, y, n_bins=10, reading="binary", input="probs")
    assert rep["pooled"]["ece"] == pytest.approx(float(want), rel=1e-12)
    assert rep["pooled"]["n"] == 3000 and sorted(rep["groups"]) == ["x", "y", "z"]
    assert rep["pooled"]["nll"] is None  # a metric keeps no NLL


def test_infinite_nll_rows_are_counted_apart_in_a_state(tmp_path, capsys):
    """Rows whose label got probability 0 are counted apart (``nll_inf``) by DuckDB and the
    in-memory engine as by the streaming audit, through ``--write-state`` and ``--state``
    (the state once held only an infinite ``nll``: ``nll_infinite: false``, no finite NLL);
    a state written before the column (``nll`` +inf there) still merges, as +inf."""
    import pyarrow as pa

    from torchcal.engines.state import merge_states

    rng = np.random.default_rng(9)
    p, y = rng.random(2000), (rng.random(2000) < 0.5).astype(np.int64)
    p[[5, 6, 7]], y[[5, 6, 7]] = [0.0, -0.0, 1.0], [1, 1, 0]
    path = tmp_path / "x.csv"
    path.write_text("p,y\n" + "".join(f"{float(a)!r},{b}\n" for a, b in zip(p, y)))
    s = str(tmp_path / "s.parquet")
    args = ["audit", str(path), "--probs", "p", "--label", "y", "--diagrams", "0"]
    reports = {}
    for name, extra in (("file", []), ("duckdb", ["--engine", "duckdb", "--write-state", s])):
        assert main([*args, *extra, "--out", str(tmp_path / name)]) in (0, 1, 3)
        reports[name] = json.loads((tmp_path / name / "report.json").read_text())["pooled"]
    assert main(["audit", "--state", s, "--out", str(tmp_path / "st"), "--diagrams", "0"]) in (
        0, 1, 3,
    )  # fmt: skip
    reports["state"] = json.loads((tmp_path / "st" / "report.json").read_text())["pooled"]
    capsys.readouterr()
    mem = state_from_arrays(p, y)
    assert float(mem.nll_inf.sum()) == 3 and torch.isfinite(mem.nll).all()
    for name, r in reports.items():
        assert (r["nll_infinite"], r["nll_infinite_rows"]) == (True, 3), name
        assert r["nll_finite_rows"] == pytest.approx(reports["file"]["nll_finite_rows"], 1e-12)
    st = read_states([s])
    assert float(st.nll_inf.sum()) == 3 and torch.isfinite(st.nll).all()
    old = pq.read_table(s).drop_columns(["nll_inf"])  # as written before the column
    nll = old.column("nll").to_numpy().copy()
    cell = int(np.flatnonzero(old.column("bin").to_numpy() == 0)[0])
    nll[cell] = np.inf
    old = old.set_column(old.schema.get_field_index("nll"), "nll", pa.array(nll))
    pq.write_table(old, tmp_path / "old.parquet")
    both = merge_states([st, read_states([str(tmp_path / "old.parquet")])])
    assert both.nll_inf is None and torch.isinf(both.nll).sum() >= 1
    bad = pq.read_table(s)
    n = bad.column("n").to_numpy()
    bad = bad.set_column(
        bad.schema.get_field_index("nll_inf"), "nll_inf", pa.array(n.astype(float) + 1)
    )
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="nll_inf must be a whole number in"):
        read_states([str(tmp_path / "bad.parquet")])
