"""Hostile state files and sample weights for ``torchcal audit`` (issue 30 item 7: W1, W7, W8,
W11 and the state files' "internal error" exits; docs/design.md section 6f).

Real Parquet states are written with pyarrow, then one header field or one cell is edited; each
case must exit 2 with ONE stderr line naming the field or the cell, never an "internal error"
and never a report. The weights' cases run the CLI on a file of rows: the verdict reads
importance weights by their effective sample size (Kish), so it is scale-free, and a seeded
simulation measures its error rates with normalised random weights.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from scipy.stats import binom

from torchcal import cli
from torchcal.engines.memory import state_from_arrays
from torchcal.engines.state import METADATA_KEY, BinnedState, merge_states, read_state
from torchcal.functional import BinnedStats
from torchcal.functional.verdict import FAIL, PASS, decide, ece_test_from_stats

N = 3000


def _rows(n: int = N, seed: int = 0, gap: float = 0.0) -> dict[str, np.ndarray]:
    """Stated confidences p, labels drawn at p - gap, three groups, weights ~ Exp(1)."""
    rng = np.random.default_rng(seed)
    p = 0.5 + 0.5 * rng.random(n)
    y = (rng.random(n) < np.clip(p - gap, 0, 1)).astype(np.float64)
    g = rng.choice(["a", "b", "c"], n).astype(object)
    return {"p": p, "y": y, "g": g, "w": rng.exponential(size=n)}


def _state_table(weighted: bool = False) -> pa.Table:
    r = _rows()
    st = state_from_arrays(
        r["p"],
        r["y"],
        groups=r["g"],
        weight=r["w"] if weighted else None,
        group_column="g",
        weight_column="w" if weighted else None,
    )
    return st.to_arrow()


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def _header(t: pa.Table) -> dict:
    return json.loads(t.schema.metadata[METADATA_KEY])


def _with_header(t: pa.Table, raw: bytes) -> pa.Table:
    return t.replace_schema_metadata({METADATA_KEY: raw})


def head(**changes):
    """Set header fields."""

    def f(t: pa.Table) -> pa.Table:
        return _with_header(t, json.dumps({**_header(t), **changes}).encode())

    return f


def raw_head(raw: bytes):
    return lambda t: _with_header(t, raw)


def rejected(**changes):
    def f(t: pa.Table) -> pa.Table:
        h = _header(t)
        h["rows_rejected"] = {**h["rows_rejected"], **changes}
        return _with_header(t, json.dumps(h).encode())

    return f


def cell(column: str, value, row: int = 0, type_=None):
    """Set one cell of ``column`` (``type_``: the column's new Arrow type)."""

    def f(t: pa.Table) -> pa.Table:
        v = t.column(column).to_pylist()
        v[row] = value(v[row]) if callable(value) else value
        i = t.column_names.index(column)
        arr = pa.array(v, type_ or t.schema.field(column).type)
        return t.set_column(i, column, arr).replace_schema_metadata(t.schema.metadata)

    return f


def as_float_n(delta: float):
    """The ``n`` column as float64 with ``delta`` added to cell 0 (``n`` 150.7)."""

    def f(t: pa.Table) -> pa.Table:
        n = t.column("n").to_numpy().astype(np.float64)
        n[0] += delta
        i = t.column_names.index("n")
        return t.set_column(i, "n", pa.array(n)).replace_schema_metadata(t.schema.metadata)

    return f


# (id, weighted state?, edit, regex of the one stderr line)
STATE_CASES = [
    # W8: the metrics' state rules on read
    ("sum_y>n", False, cell("sum_y", lambda v: v + 1e4), r"cell 0 \(group 'a', .*sum_y must lie in \[0, n\]"),
    ("right>n", False, cell("right", 1e6), r"cell 0 .*right must be in \[0, n\]"),
    ("sum_w-nan", True, cell("sum_w", math.nan), r"cell 0 .*sum_w must be finite"),
    ("sum_w-negative", True, cell("sum_w", -1.0), r"cell 0 .*sum_w must be >= 0"),
    ("lying-n_bins", False, head(n_bins=20), r"cell \d+ .*sum_c must lie in its bin's range.*a lying n_bins"),
    ("sum_c-outside-bin", False, cell("sum_c", 0.0), r"cell 0 .*sum_c must lie in its bin's range"),
    ("sum_cy>sum_c", False, cell("sum_cy", lambda v: v * 3), r"cell 0 .*sum_cy must lie in"),
    ("rows_rejected-negative", False, rejected(preds_nan=-5), r"rows_rejected: header field preds_nan must be an integer in \[0"),
    ("rows_rejected-unknown", False, rejected(sneaky=3), r"rows_rejected names unknown reasons \['sneaky'\]"),
    ("rows_seen-lies", False, head(rows_seen=10**6), r"header field rows_seen is 1000000, but the cells hold 3000 rows"),
    ("rows_seen-hides-rejects", False, rejected(preds_unparsed=2000), r"rows_seen is 3000, but the cells hold 3000 rows and rows_rejected 2000"),
    ("rows_saturated>kept", False, head(rows_saturated=10**5), r"rows_saturated is 100000, more than the 3000 rows"),
    ("sum_w2-below-cauchy", True, cell("sum_w2", 1e-9), r"cell 0 .*sum_w2 must be finite and in \[sum_w\^2 / n, sum_w\^2\]"),
    ("nll-partly-null", False, cell("nll", None), r"cell 0 .*nll is null in some cells but not in others"),
    ("nll-negative", False, cell("nll", -1.0), r"cell 0 .*nll must be >= 0"),
    ("group-null", False, cell("group", None), r"cell 0: group must be a string, got None"),
    # W7: NaN and overflow never reach the verdict
    ("sum_c2-nan", False, cell("sum_c2", math.nan), r"cell 0 .*sum_c2 must be finite, got nan"),
    ("sum_y-inf", False, cell("sum_y", math.inf), r"cell 0 .*sum_y must be finite, got inf"),
    ("sum_c-nan-weighted", True, cell("sum_c", math.nan), r"cell 0 .*sum_c must be finite"),
    ("sum_w2-inf", True, cell("sum_w2", math.inf), r"cell 0 .*sum_w2 must be finite"),
    # W11: a stated bound before any allocation
    ("n_bins-2e9", False, head(n_bins=2_000_000_000), r"header field n_bins must be an integer in \[1, 10000\], got 2000000000"),
    # the header: every field of its type
    ("header-number", False, raw_head(b"5"), r"the state header is a JSON int, not an object"),
    ("header-string", False, raw_head(b'"torchcal"'), r"the state header is a JSON str, not an object"),
    ("header-not-json", False, raw_head(b"{schema_version: 1"), r"s\.parquet: the state header is not JSON"),
    ("header-list", False, raw_head(b"[1, 2]"), r"the state header is a JSON list"),
    ("kind", False, head(kind="something.else"), r"kind is 'something.else', this torchcal reads 'torchcal.binned_state'"),
    ("bin_rule-ceil", False, head(bin_rule="ceil(c * B)"), r"bin_rule is 'ceil\(c \* B\)', this torchcal reads"),
    ("schema_version-true", False, head(schema_version=True), r"schema_version is True, this torchcal reads 1"),
    ("schema_version-2", False, head(schema_version=2), r"schema_version is 2, this torchcal reads 1"),
    ("n_bins-10.9", False, head(n_bins=10.9), r"header field n_bins must be an integer in \[1, 10000\], got 10\.9"),
    ("n_bins-true", False, head(n_bins=True), r"header field n_bins must be an integer"),
    ("reading", False, head(reading="sideways"), r"header field reading must be one of"),
    ("input", False, head(input=3), r"header field input must be one of"),
    ("group-number", False, head(group=7), r"header field group must be a string, got 7"),
    ("rows_seen-float", False, head(rows_seen=3000.5), r"header field rows_seen must be an integer"),
    ("rows_rejected-list", False, head(rows_rejected=[1]), r"header field rows_rejected must be an object"),
    ("missing-field", False, lambda t: _with_header(t, json.dumps({k: v for k, v in _header(t).items() if k != "n_bins"}).encode()), r"the header lacks n_bins"),
    # the cells' counts: whole, >= 1, <= 2^53
    ("n-150.7", False, as_float_n(0.7), r"cell 0: n must be a whole number, got \d+\.7"),
    ("n-negative", False, cell("n", -5), r"cell 0 .*n must be in \[1, 2\^53\], got -5"),
    ("n-zero", False, cell("n", 0), r"cell 0 .*n must be in \[1, 2\^53\], got 0"),
    ("n-2^62", False, cell("n", 2**62), r"cell 0 .*n must be in \[1, 2\^53\], got 4611686018427387904"),
    ("bin-out-of-range", False, cell("bin", 99), r"bins must lie in \[0, 10\)"),
]  # fmt: skip


@pytest.mark.parametrize(
    "case, weighted, edit, message", STATE_CASES, ids=[c[0] for c in STATE_CASES]
)
def test_a_hostile_state_exits_2_naming_the_field(tmp_path, capsys, case, weighted, edit, message):
    path = tmp_path / "s.parquet"
    pq.write_table(edit(_state_table(weighted)), path)
    code, out, err = _run(["audit", "--state", str(path)], capsys)
    lines = err.strip().splitlines()
    assert code == 2, (case, out[-300:], err)
    assert len(lines) == 1 and lines[0].startswith("torchcal: error: "), err
    assert "internal error" not in err, err
    assert str(path) in lines[0] or "s.parquet" in lines[0], err
    assert re.search(message, lines[0]), (message, lines[0])


def test_the_unedited_states_audit(tmp_path, capsys):
    """The base of every case reads and reports (so each case fails for its own edit)."""
    for weighted in (False, True):
        path = tmp_path / f"s{weighted}.parquet"
        pq.write_table(_state_table(weighted), path)
        code, out, err = _run(["audit", "--state", str(path)], capsys)
        assert code in (0, 1, 3) and not err.strip(), err
        assert read_state(path).header.rows_seen == N


def _grid_state_table(groups: int, n_bins: int) -> pa.Table:
    """A valid-looking 3 kB-per-1000-groups state: one row per group in bin 0."""
    h = _header(_state_table())
    h.update(n_bins=n_bins, rows_seen=groups, group="g")
    h.pop("fine_bins", None)
    h["rows_rejected"] = dict.fromkeys(h["rows_rejected"], 0)
    c = 0.5 / n_bins
    cols = {
        "group": pa.array([f"g{i:06d}" for i in range(groups)]),
        "slot": pa.array(np.zeros(groups, np.int32)),
        "bin": pa.array(np.zeros(groups, np.int32)),
        "n": pa.array(np.ones(groups, np.int64)),
        "sum_c": pa.array(np.full(groups, c)),
        "sum_y": pa.array(np.zeros(groups)),
        "sum_c2": pa.array(np.full(groups, c * c)),
        "sum_cy": pa.array(np.zeros(groups)),
        "nll": pa.nulls(groups, pa.float64()),
        "right": pa.nulls(groups, pa.float64()),
    }
    return pa.table(cols).replace_schema_metadata({METADATA_KEY: json.dumps(h).encode()})


def test_w11_a_small_state_declaring_a_huge_dense_size_is_refused_before_allocating(
    tmp_path, capsys
):
    path = tmp_path / "big.parquet"
    pq.write_table(_grid_state_table(groups=2000, n_bins=10_000), path)  # 2e7 cells
    assert path.stat().st_size < 100_000
    code, _, err = _run(["audit", "--state", str(path)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert (
        "2,000 groups x 1 slots x 10,000 bins = 20,000,000 cells, more than the 16,777,216" in err
    )
    ok = tmp_path / "ok.parquet"
    pq.write_table(_grid_state_table(groups=100, n_bins=10_000), ok)
    assert read_state(ok).stats.count.shape == (100, 1, 10_000)


def test_w11_bins_10000_with_20k_groups_exits_2_before_allocating(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n = 20_000
    t = pa.table({"p": rng.random(n), "y": rng.integers(0, 2, n).astype(float),
                  "g": [f"g{i}" for i in range(n)]})  # fmt: skip
    pq.write_table(t, tmp_path / "x.parquet")
    for extra in ([], ["--engine", "duckdb"], ["--engine", "memory"]):
        args = ["audit", str(tmp_path / "x.parquet"), "--probs", "p", "--label", "y"]
        code, _, err = _run([*args, "--group", "g", "--bins", "10000", *extra], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, (extra, err)
        assert "bins = " in err and "more than the 16,777,216 a state may hold" in err, err


def test_merge_refuses_states_of_other_prediction_columns():
    r = _rows()
    a = state_from_arrays(r["p"], r["y"], n_bins=10)
    cols = {"preds": ["p"], "label": "y"}
    other = {"preds": ["p_calibrated"], "label": "y"}
    sa = BinnedState(
        a.header.__class__(**{**a.header.__dict__, "columns": cols}), a.groups, a.stats
    )
    sb = BinnedState(
        a.header.__class__(**{**a.header.__dict__, "columns": other}), a.groups, a.stats
    )
    with pytest.raises(ValueError, match=r"state 1: columns is .*p_calibrated.* but state 0 has"):
        merge_states([sa, sb])
    assert merge_states([sa, sa]).header.columns == cols


def _weights_file(tmp_path, w: np.ndarray, gap: float, name: str = "w.parquet", n: int = N):
    r = _rows(n=n, gap=gap)
    path = tmp_path / name
    pq.write_table(pa.table({"p": r["p"], "y": r["y"], "w": w}), path)
    return path


def _audit_rows(path, capsys, *extra: str) -> tuple[int, dict]:
    out = path.parent / "out"
    args = ["audit", str(path), "--probs", "p", "--label", "y", "--weight", "w", "--out", str(out)]
    code, _, err = _run([*args, *extra], capsys)
    assert "internal error" not in err, err
    rep = json.loads((out / "report.json").read_text()) if code in (0, 1, 3) else {}
    return code, rep


def test_w1_normalised_importance_weights_fail_an_ece_0245_model_as_weights_of_1_do(
    tmp_path, capsys
):
    """Weights summing to 1 once PASSed this model (debiased ECE '0 (clipped)', interval
    [0, 0]); read by their effective sample size they FAIL it as weights of 1 do."""
    u = np.random.default_rng(1).exponential(size=N)
    for w in (np.ones(N), u / u.sum()):
        path = _weights_file(tmp_path, w, gap=0.245)
        for engine in ("duckdb", "memory"):
            code, rep = _audit_rows(path, capsys, "--engine", engine)
            assert code == 1 and rep["verdict"] == "fail", (
                engine,
                rep.get("pooled", {}).get("ece_ci"),
            )
            assert rep["pooled"]["ece_ci"][0] > 0.15
    # the frequency reading of the same weights is the old defect (a sum of 1 is one row)
    code, rep = _audit_rows(path, capsys, "--engine", "memory", "--weights", "frequency")
    assert rep["verdict"] != "fail" and rep["settings"]["weights"] == "frequency"


@pytest.mark.parametrize("gap", [0.0, 0.04, 0.245])
def test_w1_multiplying_every_weight_by_a_constant_changes_no_verdict(tmp_path, capsys, gap):
    u = np.random.default_rng(2).exponential(size=N)
    seen = {}
    for k in (1e-6, 1e-3, 1.0, 7.0, 1e3, 1e6):
        path = _weights_file(tmp_path, u * k, gap=gap, name=f"w{k:g}.parquet")
        for engine in ("duckdb", "memory"):
            code, rep = _audit_rows(path, capsys, "--engine", engine)
            p = rep["pooled"]
            table = [x for row in p["table"] for x in (row["ci_lo"], row["ci_hi"])]
            nums = [*p["ece_ci"], p["ece_test"]["p_pass"], p["ece_test"]["p_fail"], *table]
            seen[(k, engine)] = (code, rep["verdict"], nums)
    ref = seen[(1.0, "memory")]
    for key, got in seen.items():
        assert got[:2] == ref[:2], (key, got, ref)
        np.testing.assert_allclose(got[2], ref[2], rtol=1e-9, atol=1e-12)


def test_w1_the_threshold_gap_is_scale_free(tmp_path, capsys):
    u = np.random.default_rng(5).exponential(size=N)
    seen = []
    for k in (1e-6, 1.0, 1e6):
        path = _weights_file(tmp_path, u * k, gap=0.03, name=f"t{k:g}.parquet")
        code, rep = _audit_rows(path, capsys, "--engine", "duckdb", "--threshold", "0.8")
        g = rep["pooled"]["threshold_gap"]
        seen.append(
            (code, rep["verdict"], [*g["gap_ci"], *g["accuracy_ci"], g["p_pass"], g["p_fail"]])
        )
    for got in seen:
        assert got[:2] == seen[0][:2], seen
        np.testing.assert_allclose(got[2], seen[0][2], rtol=1e-9, atol=1e-12)


def test_w1_the_state_file_road_is_scale_free_too(tmp_path, capsys):
    u = np.random.default_rng(3).exponential(size=N)
    got = []
    for k in (1e-6, 1.0, 1e6):
        path = _weights_file(tmp_path, u * k, gap=0.04, name=f"r{k:g}.parquet")
        st = tmp_path / f"s{k:g}.parquet"
        base = ["audit", str(path), "--probs", "p", "--label", "y", "--weight", "w"]
        _run([*base, "--engine", "duckdb", "--write-state", str(st)], capsys)
        code, out, err = _run(
            ["audit", "--state", str(st), "--out", str(tmp_path / f"o{k:g}")], capsys
        )
        rep = json.loads((tmp_path / f"o{k:g}" / "report.json").read_text())
        got.append((code, rep["verdict"], rep["pooled"]["ece_ci"]))
    assert all(g[:2] == got[0][:2] for g in got), got
    for g in got:
        np.testing.assert_allclose(g[2], got[0][2], rtol=1e-9)


def test_w1_a_weighted_state_without_sum_w2_is_refused_by_the_importance_reading(tmp_path, capsys):
    t = _state_table(weighted=True)
    old = t.drop_columns(["sum_w2"])  # a weighted state written before sum_w2
    path = tmp_path / "old.parquet"
    pq.write_table(old, path)
    code, _, err = _run(["audit", "--state", str(path)], capsys)
    assert (
        code == 2 and "weights: importance weights are read by their effective sample size" in err
    )
    code, _, err = _run(["audit", "--state", str(path), "--weights", "frequency"], capsys)
    assert code in (0, 1, 3) and not err.strip(), err


@pytest.mark.parametrize(
    "w, engine",
    [
        (1e306, "duckdb"),
        (1e306, "memory"),
        (5e-324, "duckdb"),
        (5e-324, "memory"),
        (1e101, "memory"),
    ],
)
def test_w7_weights_whose_squares_overflow_or_underflow_are_refused(tmp_path, capsys, w, engine):
    """Weights of 1e306 once gave ECE 0.0 and a PASS; 5e-324 gave ECE 0.2467 for 0.0445."""
    path = _weights_file(tmp_path, np.full(N, w), gap=0.0)
    args = ["audit", str(path), "--probs", "p", "--label", "y", "--weight", "w", "--engine", engine]
    code, _, err = _run(args, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    # the engine counts the rows as weight_invalid; the in-process reader names the value
    named = r"weight_invalid 3000|weight: expected 0 or a value in \[1e-100, 1e\+100\], got"
    assert re.search(named, err) and "internal error" not in err, err


def test_w7_a_few_subnormal_weights_are_counted_not_misread(tmp_path, capsys):
    u = np.random.default_rng(4).exponential(size=N)
    u[:10] = 5e-324
    path = _weights_file(tmp_path, u, gap=0.0)
    code, rep = _audit_rows(path, capsys, "--engine", "duckdb", "--max-unparsed", "0.05")
    assert code in (0, 1, 3) and rep["pooled"]["n"] == N - 10
    assert any("weight_invalid 10" in x for x in rep["warnings"]), rep["warnings"]


def test_all_zero_weights_exit_2_naming_the_weights(tmp_path, capsys):
    """Once 'unsupported format string passed to NoneType.__format__' (a NaN ECE)."""
    path = _weights_file(tmp_path, np.zeros(N), gap=0.0)
    for engine in ("duckdb", "memory"):
        args = ["audit", str(path), "--probs", "p", "--label", "y", "--weight", "w"]
        code, _, err = _run([*args, "--engine", engine], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "internal error" not in err and "weight" in err, err


@pytest.mark.parametrize("rule", [[], ["--threshold", "0.8"]], ids=["ece", "threshold"])
def test_a_group_of_weight_0_is_never_judged(tmp_path, capsys, rule):
    """Rows of weight 0 only once crashed the threshold reason (NoneType.__format__) and PASSed
    the window test; now nothing to judge: INCONCLUSIVE, said so."""
    r = _rows()
    w = np.where(r["g"] == "a", 0.0, r["w"])
    pq.write_table(
        pa.table({"p": r["p"], "y": r["y"], "g": list(r["g"]), "w": w}), tmp_path / "z.parquet"
    )
    for engine in ("duckdb", "memory"):
        args = [
            "audit",
            str(tmp_path / "z.parquet"),
            "--probs",
            "p",
            "--label",
            "y",
            "--weight",
            "w",
        ]
        out = tmp_path / f"o{engine}"
        code, _, err = _run(
            [*args, "--group", "g", "--engine", engine, "--out", str(out), *rule], capsys
        )
        assert "internal error" not in err and code in (1, 3), (code, err)
        a = json.loads((out / "report.json").read_text())["groups"]["a"]
        assert (
            a["verdict"] == "inconclusive" and "have weight 0: nothing to judge" in a["reasons"][0]
        )


def test_check_weight_names_the_bounds():
    from torchcal.functional.calibration.weights import check_weight

    ok = torch.tensor([0.0, 1e-100, 1e100], dtype=torch.float64)
    assert check_weight(ok, 3).tolist() == [0.0, 1e-100, 1e100]
    for bad in (5e-324, 1e-101, 1e101):
        with pytest.raises(
            ValueError, match=r"weight: expected 0 or a value in \[1e-100, 1e\+100\]"
        ):
            check_weight(torch.tensor([1.0, bad], dtype=torch.float64), 2)


# --- the verdict's error rates with normalised importance weights, by seeded simulation ---

R, B, TOL, ALPHA = 400, 10, 0.05, 0.05


def _weighted_family(p: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> BinnedStats:
    """Per replicate the weighted statistics ``(R, 1, B)`` (one bincount per sum)."""
    reps = p.shape[0]
    idx = ((torch.arange(reps)[:, None]) * B + (p * B).floor().long().clamp(0, B - 1)).reshape(-1)

    def s(v: torch.Tensor) -> torch.Tensor:
        return torch.bincount(idx, weights=v.reshape(-1), minlength=reps * B).view(reps, 1, B)

    count = torch.bincount(idx, minlength=reps * B).view(reps, 1, B)
    yf = y.double()
    return BinnedStats(count, s(w * p), s(w * yf), s(w * p * p), s(w * p * yf), s(w), s(w * w))


def _draw(model: str, n: int, gen: torch.Generator, tilt: float):
    u = torch.rand(R, n, generator=gen, dtype=torch.float64)
    q = u if model == "calibrated" else 0.95 * u
    p = q if model == "calibrated" else q + TOL  # boundary: a gap of exactly the tolerance
    y = (torch.rand(R, n, generator=gen, dtype=torch.float64) < q).long()
    e = -torch.log(torch.rand(R, n, generator=gen, dtype=torch.float64))  # Exp(1)
    w = e * torch.exp(tilt * p)  # weights that depend on the confidence too
    return p, y, w / w.sum(1, keepdim=True)  # normalised: each replicate's weights sum to 1


def _rates(model: str, n: int, tilt: float, weights: str) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(1000 + n + int(10 * tilt))
    p, y, w = _draw(model, n, gen, tilt)
    t = ece_test_from_stats(_weighted_family(p, y, w), TOL, alpha=ALPHA, weights=weights)
    rows, _ = decide(t["p_pass"][:, None], t["p_fail"][:, None], ALPHA)
    return float((rows == PASS).double().mean()), float((rows == FAIL).double().mean())


#: a rate above this is off (1-in-1000 Monte-Carlo tolerance on R replicates at level alpha)
BOUND = binom.ppf(0.999, R, ALPHA) / R


@pytest.mark.parametrize("n", [500, 3000])
@pytest.mark.parametrize("tilt", [0.0, 3.0])
def test_normalised_importance_weights_keep_the_verdicts_error_rates(n, tilt):
    """At the tolerance (gap 0.05 in every bin, any weights) a PASS is wrong; for a calibrated
    model a FAIL is wrong: both at most alpha with weights summing to 1. Read as frequency
    weights (a total of 1 row) the same data PASS wrongly almost always (the W1 defect)."""
    wrong_pass, _ = _rates("boundary", n, tilt, "importance")
    _, wrong_fail = _rates("calibrated", n, tilt, "importance")
    assert wrong_pass <= BOUND and wrong_fail <= BOUND, (wrong_pass, wrong_fail, BOUND)
    freq_pass, _ = _rates("boundary", n, tilt, "frequency")
    assert freq_pass > 0.5, freq_pass


def test_importance_weights_still_pass_a_calibrated_model_with_enough_rows():
    """The test keeps its power: a calibrated model with 20k rows and normalised weights
    PASSes at tolerance 0.05 in most replicates."""
    right_pass, _ = _rates("calibrated", 20_000, 0.0, "importance")
    assert right_pass > 0.9, right_pass
