"""Judges that say the same thing to everyone (issue 31 item 5, docs/design.md 6c, 6g): the
audit's resolution per row (distinct values, the share at the most common one, the AUROC of
confidence vs correct with DeLong's interval) and the global ECCE, both from the fine
histogram of the state; the finding when the AUROC interval holds 0.5; the INCONCLUSIVE
reason's rows-to-decide; the fine histogram through state files (merges, old files)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os

import numpy as np
import pytest
import torch

from torchcal.audit import audit
from torchcal.audit.report import AuditReport, check_report_dict
from torchcal.audit.resolution import NO_SEPARATION
from torchcal.functional.histogram_scores import MAX_FINE_GROUPS
from torchcal.functional.multicalibration import ecce
from torchcal.functional.resolution import auroc_interval


def _same_to_everyone(n: int, seed: int, tilt: float = 0.6) -> tuple[torch.Tensor, torch.Tensor]:
    """An LLM judge that says 85-95 % for every answer (0.01 grid) and is right about 89 % of
    the time whatever it says (a weak tilt: AUROC about 0.55; ``tilt=0``: none)."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(85, 96, (n,), generator=g).double() / 100
    p = 0.89 + tilt * (c - 0.9)
    return c, (torch.rand(n, generator=g, dtype=torch.float64) < p).long()


def _discriminating(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    c = torch.sigmoid(1.2 + torch.randn(n, generator=g, dtype=torch.float64))
    return c, (torch.rand(n, generator=g, dtype=torch.float64) < c).long()


def test_a_judge_that_says_the_same_to_everyone_gets_the_finding():
    c, y = _same_to_everyone(800, 0)
    r = audit(c, y)
    res = r.pooled["resolution"]
    ref = auroc_interval(c, y, level=0.9)
    assert 0.5 < res["auroc"] < 0.6 and math.isclose(res["auroc"], ref.auroc, rel_tol=1e-12)
    assert res["auroc_ci"][0] <= 0.5 <= res["auroc_ci"][1]
    assert res["separates"] is False
    assert res["distinct"] == 11 and res["distinct_exact"] is True  # on the 0.01 grid
    top = torch.unique(c, return_counts=True)[1].max().item() / 800
    assert math.isclose(res["top_share"], top, rel_tol=1e-12)
    finding = [x for x in r.reasons if NO_SEPARATION in x]
    assert len(finding) == 1 and finding[0].startswith("pooled: finding:")
    assert NO_SEPARATION in r.pooled["reasons"][-1]
    assert NO_SEPARATION in r.to_text() and NO_SEPARATION in r.to_markdown()
    page = r.to_html()
    assert 'id="resolution"' in page and 'class="no-separation"' in page
    # the finding stands whatever the ECE verdict: the same rows, a loose tolerance, PASS
    loose = audit(c, y, tolerance=0.2)
    assert loose.verdict == "pass" and any(NO_SEPARATION in x for x in loose.reasons)


def test_a_discriminating_judge_gets_no_finding():
    c, y = _discriminating(3000, 1)
    r = audit(c, y)
    res = r.pooled["resolution"]
    assert res["auroc_ci"][0] > 0.6 and res["separates"] is True
    assert not any("finding" in x for x in r.reasons)
    assert res["distinct_exact"] is False and res["distinct"] > 1000  # fine bins, not values
    exact, sigma = ecce(c, y)
    assert 0 <= float(exact) - res["ecce"] <= res["ecce_bound"]
    assert math.isclose(res["ecce_scale"], float(sigma), rel_tol=1e-12)
    assert math.isclose(res["ecce_sigma"], res["ecce"] / res["ecce_scale"], rel_tol=1e-12)


def test_the_finding_rate_by_simulation():
    """Seeded replicates through the audit: a judge without resolution gets the finding in
    about 90 % (the interval's level) of audits, the discriminating one in none."""
    hits = []
    for s in range(60):
        c, _ = _same_to_everyone(400, s)
        gen = torch.Generator().manual_seed(1000 + s)
        y = (torch.rand(400, generator=gen, dtype=torch.float64) < 0.9).long()  # no resolution
        hits.append(NO_SEPARATION in " ".join(audit(c, y).reasons))
    assert 0.75 <= sum(hits) / len(hits) <= 0.98
    assert not any(
        NO_SEPARATION in " ".join(audit(*_discriminating(600, s)).reasons) for s in range(20)
    )


def test_groups_get_their_own_resolution():
    c1, y1 = _same_to_everyone(1500, 2, tilt=0.0)
    c2, y2 = _discriminating(1500, 3)
    g = torch.cat([torch.zeros(1500), torch.ones(1500)]).long()
    r = audit(torch.cat([c1, c2]), torch.cat([y1, y2]), groups=g, group_names=["judge", "model"])
    assert r.groups["judge"]["resolution"]["separates"] is False
    assert r.groups["model"]["resolution"]["separates"] is True
    named = [x for x in r.reasons if NO_SEPARATION in x]
    assert [x.split(":")[0] for x in named] == ["judge"]
    ref = auroc_interval(c2, y2, level=0.9)
    got = r.groups["model"]["resolution"]  # continuous values: a few share a fine bin (ties)
    assert abs(got["auroc"] - ref.auroc) < 1e-3 and math.isclose(
        got["auroc_se"], ref.se, rel_tol=1e-2
    )


def test_report_json_round_trip_and_schema():
    c, y = _same_to_everyone(500, 4)
    r = audit(c, y)
    d = json.loads(r.to_json())
    check_report_dict(d)
    back = AuditReport.from_json(d)
    assert back.pooled["resolution"] == r.to_dict()["pooled"]["resolution"]
    keys = {"ecce", "ecce_sigma", "ecce_scale", "ecce_pvalue", "ecce_bound", "distinct",
            "distinct_exact", "top_value", "top_share", "auroc", "auroc_ci", "auroc_se",
            "separates"}  # fmt: skip
    assert set(d["pooled"]["resolution"]) == keys


def test_inconclusive_reason_says_how_many_rows_would_decide():
    """The hint is the n at which the interval, at this spread, lies on one side; at three
    times that n (the same model) the audit decides in most seeds."""
    g = torch.Generator().manual_seed(5)
    c = torch.rand(600, generator=g, dtype=torch.float64)
    y = (torch.rand(600, generator=g, dtype=torch.float64) < c).long()
    r = audit(c, y)
    assert r.verdict == "inconclusive"
    text = r.pooled["reasons"][0]
    assert "rows at this spread would decide" in text
    need = int(text.split("about ")[1].split(" rows")[0].replace(",", ""))
    assert 600 < need < 600 * 50
    decided = 0
    for s in range(10):
        g = torch.Generator().manual_seed(100 + s)
        c2 = torch.rand(3 * need, generator=g, dtype=torch.float64)
        y2 = (torch.rand(3 * need, generator=g, dtype=torch.float64) < c2).long()
        decided += audit(c2, y2).verdict != "inconclusive"
    assert decided >= 7
    rt = audit(c, y, threshold=0.8)
    if rt.verdict == "inconclusive":
        assert "rows in the window at this spread would decide" in rt.pooled["reasons"][0]


def test_too_many_groups_keep_no_fine_histogram():
    G = MAX_FINE_GROUPS + 1
    g = torch.Generator().manual_seed(6)
    c = torch.rand(20 * G, generator=g, dtype=torch.float64)
    y = (torch.rand(20 * G, generator=g, dtype=torch.float64) < c).long()
    r = audit(c, y, groups=torch.arange(20 * G) % G, min_group=0)
    assert r.pooled["resolution"] is None
    assert any("no fine histogram" in w for w in r.warnings)


# -- state files: the fine histogram is part of the state, merges, and old files load ----


def _cli(args: list[str], out: str) -> tuple[int, dict]:
    from torchcal.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(["audit", *args, "--out", out, "--diagrams", "0"])
    with open(os.path.join(out, "report.json")) as f:
        return code, json.load(f)


def _write_csv(path: str, c: torch.Tensor, y: torch.Tensor, g: list[str]) -> None:
    with open(path, "w") as f:
        f.write("p,y,g\n")
        f.writelines(f"{a!r},{b},{h}\n" for a, b, h in zip(c.tolist(), y.tolist(), g))


def test_state_files_carry_and_merge_the_fine_histogram(tmp_path):
    pytest.importorskip("duckdb")
    from torchcal.engines.state import merge_states, read_state

    c, y = _same_to_everyone(3000, 7)
    g = ["a" if i % 3 else "b" for i in range(3000)]
    whole = str(tmp_path / "whole.csv")
    _write_csv(whole, c, y, g)
    for i, (lo, hi) in enumerate([(0, 1000), (1000, 3000)]):
        _write_csv(str(tmp_path / f"part{i}.csv"), c[lo:hi], y[lo:hi], g[lo:hi])
    cols = ["--probs", "p", "--label", "y", "--group", "g"]
    for name in ("whole", "part0", "part1"):
        _cli([str(tmp_path / f"{name}.csv"), *cols, "--engine", "duckdb", "--write-state",
              str(tmp_path / f"{name}.parquet")], str(tmp_path / f"o_{name}"))  # fmt: skip
    parts = [read_state(tmp_path / f"part{i}.parquet") for i in (0, 1)]
    ref = read_state(tmp_path / "whole.parquet")
    assert ref.fine is not None and ref.header.fine_bins == 4096
    for m in (merge_states(parts), merge_states(parts[::-1])):
        assert m.fine is not None and torch.equal(m.fine.count, ref.fine.count)
        for a, b in zip(m.fine[1:], ref.fine[1:], strict=True):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    a, b = merge_states(parts), merge_states(parts[::-1])
    assert all(torch.equal(x, z) for x, z in zip(a.fine, b.fine, strict=True))  # same bits
    _, merged = _cli(["--state", str(tmp_path / "part*.parquet")], str(tmp_path / "o_m"))
    _, direct = _cli([whole, *cols], str(tmp_path / "o_d"))
    for key in ("pooled",):
        x, z = merged[key]["resolution"], direct[key]["resolution"]
        assert x.keys() == z.keys()
        for k in x:
            if isinstance(x[k], float):
                assert math.isclose(x[k], z[k], rel_tol=1e-12, abs_tol=1e-14), k
    assert merged["groups"]["a"]["resolution"]["distinct"] == 11
    # a state file's report says the values are distinct per fine bin (no value grid in it)
    assert merged["pooled"]["resolution"]["distinct_exact"] is False


def test_an_old_state_file_without_it_still_loads(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from torchcal.engines.memory import state_from_arrays
    from torchcal.engines.state import METADATA_KEY, merge_states, read_state, write_state

    c, y = _same_to_everyone(2000, 8)
    st = state_from_arrays(c.numpy(), y.numpy(), n_bins=10)
    new = str(tmp_path / "new.parquet")
    write_state(st, new)
    t = pq.read_table(new)
    keep = pa.compute.greater_equal(t.column("slot"), 0)
    old = t.filter(keep).drop_columns([c for c in t.column_names if c.startswith("fine_")])
    header = json.loads(t.schema.metadata[METADATA_KEY])
    header.pop("fine_bins")
    old = old.replace_schema_metadata({METADATA_KEY: json.dumps(header).encode()})
    pq.write_table(old, tmp_path / "old.parquet")
    loaded = read_state(tmp_path / "old.parquet")
    assert loaded.fine is None and loaded.header.fine_bins is None
    assert torch.equal(loaded.stats.count, st.stats.count)
    code, rep = _cli(["--state", str(tmp_path / "old.parquet")], str(tmp_path / "o"))
    assert code != 2 and rep["pooled"]["resolution"] is None
    assert any("no fine histogram" in w for w in rep["warnings"])
    both = merge_states([loaded, read_state(new)])
    assert both.fine is None  # one part without it: the merge has none
    _, fresh = _cli(["--state", new], str(tmp_path / "o2"))
    assert fresh["pooled"]["resolution"]["auroc"] is not None
    # a header that claims a fine histogram the table does not hold is refused, named
    bad = old.replace_schema_metadata(
        {METADATA_KEY: json.dumps({**header, "fine_bins": 4096}).encode()}
    )
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="bad.parquet: .*fine"):
        read_state(tmp_path / "bad.parquet")
    odd = old.replace_schema_metadata(
        {METADATA_KEY: json.dumps({**header, "fine_bins": 1 << 30}).encode()}
    )
    pq.write_table(odd, tmp_path / "odd.parquet")
    with pytest.raises(ValueError, match="odd.parquet: header field fine_bins must be 4096"):
        read_state(tmp_path / "odd.parquet")


def test_weighted_frequency_report_equals_the_repeated_rows():
    c, y = _discriminating(2000, 9)
    w = torch.from_numpy(np.random.default_rng(0).integers(0, 4, 2000)).double()
    from torchcal.audit.core import Auditor

    a = Auditor()
    a.update(c, y, weight=w)
    st = a.state()
    b = Auditor()
    rep = w.long()
    b.update(c.repeat_interleave(rep), y.repeat_interleave(rep))
    hw, hr = st.fine, b.state().fine
    assert hw is not None and hr is not None
    assert torch.allclose(hw.mass, hr.mass) and torch.allclose(hw.var_w, hr.var_w)
    assert torch.allclose(hw.gap, hr.gap, atol=1e-9)
