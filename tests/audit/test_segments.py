"""``torchcal audit --segments`` (issue 31, docs/design.md section 6g.1): the column rules, the
per-segment sums against the functional core, the report's segment section and the CLI's
errors."""

from __future__ import annotations

import contextlib
import io
import json
import os

import numpy as np
import pytest
import torch

from torchcal.audit.engine_input import AuditRequest, run_audit
from torchcal.audit.report import AuditReport
from torchcal.audit.segments import SegmentAccumulator
from torchcal.audit.state import AuditSettings
from torchcal.cli import main
from torchcal.engines.segments import ColumnRule, column_rule, quantile_edges
from torchcal.functional.calibration.binning import bin_ids, binned_statistics
from torchcal.functional.histogram_scores import FINE_BINS
from torchcal.functional.multicalibration import (
    apply_segments,
    ecce,
    ecce_from_stats,
    segment_spec,
)


def _csv(path, n: int = 3000, seed: int = 0, blank: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d = {
        "p": rng.random(n).round(6),
        "a": rng.integers(0, 5, n),
        "b": rng.integers(0, 3, n),
        "x": rng.normal(size=n).round(4),
    }
    d["y"] = (rng.random(n) < d["p"]).astype(int)
    with open(path, "w") as f:
        f.write("p,y,a,b,x\n")
        for i in range(n):
            b = "" if blank and i == 7 else str(d["b"][i])
            f.write(f"{d['p'][i]},{d['y'][i]},{d['a'][i]},{b},{d['x'][i]}\n")
    return d


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_quantile_edges_are_torch_quantile_on_the_rows():
    rng = np.random.default_rng(1)
    for _ in range(20):
        values = np.unique(rng.normal(size=rng.integers(2, 30)))
        counts = rng.integers(1, 6, values.size)
        rows = torch.from_numpy(np.repeat(values, counts))
        for bins in (1, 2, 3, 4, 7):
            q = torch.quantile(rows, torch.linspace(0, 1, bins + 1, dtype=torch.float64))
            assert quantile_edges(values, counts, bins) == q.tolist()


def test_column_rule_kinds():
    assert column_rule("c", ["b", "a", "10"], [1, 1, 1], 4).values == ("10", "a", "b")
    assert column_rule("c", ["1.5", "nan", "2"], [1, 1, 1], 4).kind == "category"  # not finite
    # integer codes (at most MAX_INTEGER_CODES values) are categories, ordered by value
    assert column_rule("c", ["10", "2", "1"], [1, 1, 1], 2).values == ("1", "2", "10")
    r = column_rule("c", ["2.5", "1.0", "1", " 3.5 "], [1, 1, 1, 1], 4)  # "1" and "1.0": one
    assert (r.kind, r.cuts) == ("values", (1.0, 2.5, 3.5))
    assert r.codes(["1", "1.0", "3.5", "4"]).tolist() == [0, 0, 2, -1]
    e = column_rule("c", [str(i + 0.5) for i in range(10)], [1] * 10, 4)
    assert e.kind == "edges" and e.cuts == (2.75, 5.0, 7.25)
    # (e_{k-1}, e_k]: an edge belongs to the bucket below it
    assert e.codes(["2.75", "2.76", "-5", "99"]).tolist() == [0, 1, 0, 3]
    assert [e.label(k) for k in range(4)] == ["<=2.75", " in (2.75, 5]", " in (5, 7.25]", ">7.25"]
    many = column_rule("n", [str(i) for i in range(100)], [1] * 100, 4)  # a count: numeric
    assert many.kind == "edges" and len(many.cuts) == 3


def test_edges_equal_the_functional_segment_spec():
    """A numeric column's buckets are the functional core's (torch.quantile, merged edges)."""
    x = torch.tensor(np.random.default_rng(2).normal(size=500).round(2))
    texts, counts = np.unique([repr(float(v)) for v in x.tolist()], return_counts=True)
    rule = column_rule("x", list(texts), counts.tolist(), 4)
    spec = segment_spec({"x": x}, depth=1, bins=4)
    assert spec.kinds == ("edges",) and rule.cuts == tuple(spec.cuts[0].tolist())


def test_stream_sums_equal_the_functional_masks(tmp_path):
    """Each segment's counts and sums equal those of the functional core's masks on the rows
    (the same segments in the same order: crosses in column order, values ascending)."""
    path = str(tmp_path / "s.csv")
    d = _csv(path)
    rep, _ = run_audit(
        AuditRequest(file=path, preds=("p",), label="y", chunk_rows=700),
        AuditSettings(n_bins=10, segments=("a", "b", "x"), min_segment=150),
    )
    cols = {"a": torch.tensor(d["a"]), "b": torch.tensor(d["b"]), "x": torch.tensor(d["x"])}
    spec = segment_spec(cols, depth=2, min_rows=150, bins=4)
    masks = apply_segments(spec, cols)[1:]  # row 0: the whole data set
    seg = rep.segments
    assert seg["tested"] == masks.shape[0]
    assert seg["skipped"] == sum(
        1 for m in apply_segments(segment_spec(cols, depth=2, min_rows=1, bins=4), cols)[1:]
        if int(m.sum()) < 150
    )  # fmt: skip
    p, y = torch.tensor(d["p"]), torch.tensor(d["y"])
    from torchcal.audit.engine_input import _stream_state

    st = _stream_state(
        AuditRequest(file=path, preds=("p",), label="y", chunk_rows=700),
        AuditSettings(n_bins=10, segments=("a", "b", "x"), min_segment=150),
        [path],
        "stream",
    ).segments
    assert torch.equal(st.cells, spec.cells[1:])
    for i, m in enumerate(masks):
        ref = binned_statistics(p[m], y[m], n_bins=10, reading="binary", input="probs")
        assert torch.equal(st.stats.count[i], ref.count[0])
        torch.testing.assert_close(st.stats.conf[i], ref.conf[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(st.stats.acc[i], ref.acc[0], rtol=1e-12, atol=1e-12)


def test_binned_ecce_is_the_row_ecce_when_each_row_has_its_bin():
    g = torch.Generator().manual_seed(3)
    p = (torch.randperm(1000, generator=g)[:50].double() + 0.5) / 1000  # one row per bin
    y = torch.bernoulli(p, generator=g)
    s = binned_statistics(p, y, n_bins=1000, reading="binary", input="probs")
    got = ecce_from_stats(s)
    want = ecce(p, y)
    assert abs(float(got[0][0]) - float(want[0])) < 1e-12
    assert abs(float(got[1][0]) - float(want[1])) < 1e-12
    coarse = ecce_from_stats(binned_statistics(p, y, n_bins=5, reading="binary", input="probs"))
    assert float(coarse[0][0]) <= float(want[0]) + 1e-15  # read at fewer ends: never larger


def test_accumulator_chunking_does_not_change_the_counts():
    g = torch.Generator().manual_seed(4)
    p = torch.rand(900, generator=g, dtype=torch.float64)
    y = torch.bernoulli(p, generator=g).long()
    codes = torch.stack([torch.randint(0, 3, (900,), generator=g) for _ in range(2)], 1)
    rules = [ColumnRule(c, "category", ("0", "1", "2")) for c in ("u", "v")]
    whole, parts = (
        SegmentAccumulator(rules, 2, 10, "probs"),
        SegmentAccumulator(rules, 2, 10, "probs"),
    )
    whole.update(p, y, codes, None)
    for k in range(0, 900, 250):
        parts.update(p[k : k + 250], y[k : k + 250], codes[k : k + 250], None)
    a, b = whole.result(4, 1), parts.result(4, 1)
    assert torch.equal(a.cells, b.cells) and torch.equal(a.stats.count, b.stats.count)
    assert a.names()[:4] == ["u=0", "u=1", "u=2", "v=0"]


def test_report_lists_the_worst_segments(tmp_path):
    path = str(tmp_path / "s.csv")
    _csv(path)
    out = str(tmp_path / "out")
    code, text, _ = _cli("audit", path, "--probs", "p", "--label", "y", "--segments", "a", "b",
                         "--out", out, "--diagrams", "0")  # fmt: skip
    with open(os.path.join(out, "report.json")) as f:
        d = json.load(f)
    sg = d["segments"]
    assert sg["tested"] + sg["skipped"] == 5 + 3 + 15 and sg["skipped"] > 0  # some a x b < 200
    assert sg["depth"] == 2 and sg["min_segment"] == 200
    assert d["settings"]["family"] == 1 + sg["tested"]
    w = sg["worst"][0]
    assert set(w) >= {"segment", "n", "value", "ci", "sigma", "p_fail_holm", "verdict"}
    ps = [x["p_fail_holm"] for x in sg["worst"]]
    assert ps == sorted(ps) and len(sg["worst"]) == 10
    assert f"worst segments (10 of {sg['tested']} tested" in text
    assert AuditReport.from_json(os.path.join(out, "report.json")).segments == sg
    with open(os.path.join(out, "report.md")) as f:
        assert "## worst segments" in f.read()
    with open(os.path.join(out, "report.html")) as f:
        assert 'id="segments"' in f.read()
    assert code in (0, 3)  # calibrated data: no segment fails


@pytest.mark.parametrize(
    "args, message",
    [
        (["--segments", "nope"], "nope"),
        (["--segments", "a", "a"], "named twice"),
        (["--segments", "a", "--depth", "0"], "--depth"),
        (["--segments", "a", "--min-segment", "0"], "--min-segment"),
    ],
)
def test_bad_segment_options_are_one_line_errors(tmp_path, args, message):
    path = str(tmp_path / "s.csv")
    _csv(path, 300)
    code, _, err = _cli("audit", path, "--probs", "p", "--label", "y", *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("engine", [[], ["--engine", "duckdb"]])
def test_missing_segment_value_is_an_error(tmp_path, engine):
    if engine:
        pytest.importorskip("duckdb")
    path = str(tmp_path / "s.csv")
    _csv(path, 300, blank=True)
    code, _, err = _cli("audit", path, "--probs", "p", "--label", "y", "--segments", "b", *engine)
    assert code == 2 and "b" in err and len(err.strip().splitlines()) == 1, err


def test_a_state_has_no_segments(tmp_path):
    code, _, err = _cli("audit", "--state", str(tmp_path / "x.parquet"), "--segments", "a")
    assert code == 2 and "--segments" in err


def test_python_api_equals_the_file_road(tmp_path):
    """``audit(preds, target, segments={...})`` (texts and tensors) judges the segments the
    file road judges, with the same numbers."""
    from torchcal.audit import audit
    from torchcal.audit.example_segments import make_segments_data, write_segments_csv

    path = str(tmp_path / "s.csv")
    write_segments_csv(path, 1000, 0)
    d = make_segments_data(1000, 0)
    cols = {"lang": d["lang"], "doc": d["doc"], "length": d["length"]}
    got = audit(d["p"], d["correct"], segments=cols, min_segment=100).segments
    want, _ = run_audit(
        AuditRequest(file=path, preds=("p",), label="correct"),
        AuditSettings(segments=("lang", "doc", "length"), min_segment=100),
    )
    ref = want.segments
    assert got["columns"] == ref["columns"] and got["tested"] == ref["tested"]
    for a, b in zip(got["worst"], ref["worst"], strict=True):
        assert (a["segment"], a["n"], a["verdict"]) == (b["segment"], b["n"], b["verdict"])
        assert a["value"] == pytest.approx(b["value"], rel=1e-12, abs=1e-12)
        assert a["sigma"] == pytest.approx(b["sigma"], rel=1e-9)
    with pytest.raises(ValueError, match="segments\\['lang'\\]: expected 4000 values"):
        audit(d["p"], d["correct"], segments={"lang": d["lang"][:10]})


def test_segment_names_are_escaped(tmp_path):
    """A hostile category value reaches the page and the console escaped."""
    path = str(tmp_path / "h.csv")
    rng = np.random.default_rng(7)
    with open(path, "w") as f:
        f.write("p,y,a\n")
        for i in range(600):
            a = "<img src=x onerror=alert(1)>" if i % 2 else "ok\x1b[2J"
            p = rng.random()
            f.write(f"{p},{int(rng.random() < p)},{a}\n")
    out = str(tmp_path / "out")
    _, text, _ = _cli("audit", path, "--probs", "p", "--label", "y", "--segments", "a",
                      "--out", out, "--diagrams", "0")  # fmt: skip
    with open(os.path.join(out, "report.html")) as f:
        page = f.read()
    assert "<img src=x" not in page and "a=&lt;img src=x onerror=alert(1)&gt;" in page
    assert "\x1b" not in text


def test_a_segment_fails_by_its_signed_gap(tmp_path):
    """Rows with a = 0 are 15 points over-confident: that segment FAILs by its signed gap
    (report, reason), the other values do not (docs/design.md 6g.1)."""
    path = str(tmp_path / "g.csv")
    rng = np.random.default_rng(5)
    n = 3000
    p, a = 0.2 + 0.6 * rng.random(n).round(6), rng.integers(0, 5, n)
    y = (rng.random(n) < p - 0.15 * (a == 0)).astype(int)
    with open(path, "w") as f:
        f.write("p,y,a\n" + "".join(f"{p[i]},{y[i]},{a[i]}\n" for i in range(n)))
    out = str(tmp_path / "out")
    code, text, _ = _cli("audit", path, "--probs", "p", "--label", "y", "--segments", "a",
                         "--out", out, "--diagrams", "0")  # fmt: skip
    with open(os.path.join(out, "report.json")) as f:
        d = json.load(f)
    w = d["segments"]["worst"]
    assert code == 1 and d["verdict"] == "fail" and d["segments"]["failed"] == 1
    assert w[0]["columns"] == {"a": "=0"} and w[0]["statistic"] == "gap"
    m = a == 0
    assert w[0]["value"] == pytest.approx(float(p[m].mean() - y[m].mean()), abs=1e-9)
    assert w[0]["reason"].startswith("over-confident by")
    assert any(r.startswith("segment a=0: over-confident") for r in d["reasons"])
    roc_auc_score = pytest.importorskip("sklearn.metrics").roc_auc_score
    res = w[0]["resolution"]  # the segment's fine histogram, read as a group's
    ids = bin_ids(torch.as_tensor(p[m], dtype=torch.float64), FINE_BINS).numpy()
    assert res["auroc"] == pytest.approx(roc_auc_score(y[m], ids), abs=1e-12)
    assert res["auroc_ci"][0] < res["auroc"] < res["auroc_ci"][1] and res["separates"] is True
    _, counts = np.unique(ids, return_counts=True)
    assert res["distinct"] == counts.size and res["top_share"] == counts.max() / m.sum()
    assert f"{res['auroc']:.3f} [" in text and f" {counts.size} " in text


def test_over_the_cap_segments_read_their_resolution_at_their_bins(tmp_path):
    """More than MAX_FINE_GROUPS segments found: no fine histogram per segment (the groups'
    memory cap), the resolution at the segments' bins (``bins``, AUROC of the bin ids), the
    same on the file road and DuckDB."""
    path = str(tmp_path / "many.csv")
    rng = np.random.default_rng(1)
    n = 20000
    p, a, b = 0.2 + 0.6 * rng.random(n).round(6), rng.integers(0, 12, n), rng.integers(0, 12, n)
    y = (rng.random(n) < p).astype(int)
    with open(path, "w") as f:
        f.write("p,y,a,b\n" + "".join(f"{p[i]},{y[i]},{a[i]},{b[i]}\n" for i in range(n)))
    got = []
    for engine in ([], ["--engine", "duckdb"]):
        out = str(tmp_path / f"out{len(engine)}")
        code, _, _ = _cli("audit", path, "--probs", "p", "--label", "y", "--segments", "a", "b",
                          "--min-segment", "50", "--out", out, "--diagrams", "0", *engine)  # fmt: skip
        with open(os.path.join(out, "report.json")) as f:
            got.append(json.load(f)["segments"])
    assert got[0]["tested"] == 12 + 12 + 144
    for sg in got:
        w = sg["worst"][0]
        m = (a == int(w["columns"]["a"].strip("="))) if "a" in w["columns"] else np.ones(n, bool)
        if "b" in w["columns"]:
            m &= b == int(w["columns"]["b"].strip("="))
        ids = bin_ids(torch.as_tensor(p[m], dtype=torch.float64), 10).numpy()
        roc_auc_score = pytest.importorskip("sklearn.metrics").roc_auc_score
        assert "distinct" not in w["resolution"] and w["resolution"]["n_bins"] == 10
        assert w["resolution"]["auroc"] == pytest.approx(roc_auc_score(y[m], ids), abs=1e-12)
    for u, v in zip(got[0]["worst"], got[1]["worst"], strict=True):
        r, q = u["resolution"], v["resolution"]
        assert r.keys() == q.keys() and r["bins"] == q["bins"] and r["separates"] == q["separates"]
        for k in ("top_share", "top_value", "auroc"):
            assert r[k] == pytest.approx(q[k], rel=1e-12)


def test_a_segment_whose_confidence_does_not_separate_is_a_finding():
    """Issue 31 item 5: a segment where the confidence says nothing about correctness (the
    outcome independent of it) gets a report-level finding naming it, whatever its gap; where
    every segment separates there is none."""
    from torchcal.audit import audit

    g = torch.Generator().manual_seed(0)
    n = 6000
    p = 0.05 + 0.9 * torch.rand(n, generator=g, dtype=torch.float64)
    lang = ["de" if i % 3 == 0 else ("fr" if i % 3 == 1 else "en") for i in range(n)]
    flat = torch.tensor([v == "de" for v in lang])
    q = torch.where(flat, torch.full_like(p, float(p[flat].mean())), p)  # de: no separation
    y = (torch.rand(n, generator=g, dtype=torch.float64) < q).long()
    rep = audit(p, y, segments={"lang": lang})
    seg = rep.segments
    assert seg["not_separating"] == 1
    assert [w["segment"] for w in seg["not_separating_lowest"]] == ["lang=de"]
    found = [r for r in rep.reasons if r.startswith("segments: finding: confidence does not")]
    assert len(found) == 1 and "1 of 3 segments" in found[0] and "lang=de (n=2000)" in found[0]
    y2 = (torch.rand(n, generator=g, dtype=torch.float64) < p).long()
    rep2 = audit(p, y2, segments={"lang": lang})
    assert rep2.segments["not_separating"] == 0
    assert not any("does not separate" in r for r in rep2.reasons)
