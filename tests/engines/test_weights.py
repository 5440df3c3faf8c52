"""Sample weights (frequency weights): a weighted result equals the integer-repeated dataset
to 1e-12, through the binned core, every estimator and the audit report; no weights keeps
every number."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _engine_data import arrays, assert_reports_close, rows

from torchcal.audit.engine_input import report_from_state
from torchcal.engines.duck import state_from_duckdb
from torchcal.engines.memory import state_from_arrays
from torchcal.functional import (
    brier_decomposition_from_stats,
    calibration_error_from_stats,
    reliability_table_from_stats,
)
from torchcal.functional.calibration.binning import accumulate
from torchcal.functional.calibration.estimators import debiased_calibration_error_from_stats
from torchcal.functional.calibration.readings import prepare_inputs
from torchcal.functional.calibration.weights import accumulate_weighted
from torchcal.functional.decision import (
    cost_threshold_from_stats,
    ece_interval_from_stats,
    window_gap_from_stats,
)


def _data(n=3000, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, generator=g, dtype=torch.float64)
    p[:11] = torch.arange(11, dtype=torch.float64) / 10  # every edge, 0 and 1
    y = (torch.rand(n, generator=g, dtype=torch.float64) < p**1.3).long()
    grp = torch.randint(0, 3, (n,), generator=g)
    w = torch.randint(0, 5, (n,), generator=g)  # zeros included
    return p, y, grp, w


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_weighted_statistics_equal_the_repeated_dataset():
    p, y, grp, w = _data()
    prep = prepare_inputs(p, y, reading="binary", input="probs", groups=grp, num_groups=3)
    ws = accumulate_weighted(prep, 10, w)
    rep = prepare_inputs(
        p.repeat_interleave(w),
        y.repeat_interleave(w),
        reading="binary",
        input="probs",
        groups=grp.repeat_interleave(w),
        num_groups=3,
    )
    rs = accumulate(rep, 10)
    assert torch.equal(ws.count, accumulate(prep, 10).count)  # count stays rows
    _close(ws.weight, rs.count.to(torch.float64))
    for a, b in (
        (ws.conf, rs.conf),
        (ws.acc, rs.acc),
        (ws.conf2, rs.conf2),
        (ws.conf_acc, rs.conf_acc),
    ):
        _close(a, b)
    for norm in ("l1", "l2", "max"):
        _close(
            calibration_error_from_stats(ws, norm=norm, reading="binary"),
            calibration_error_from_stats(rs, norm=norm, reading="binary"),
        )
    _close(debiased_calibration_error_from_stats(ws), debiased_calibration_error_from_stats(rs))
    for k, v in brier_decomposition_from_stats(ws).items():
        _close(v, brier_decomposition_from_stats(rs)[k])
    tw, tr = reliability_table_from_stats(ws.pooled()), reliability_table_from_stats(rs.pooled())
    for f in ("conf", "acc", "ci_low", "ci_high"):
        _close(getattr(tw, f), getattr(tr, f))
    gw, gr = window_gap_from_stats(ws, 0.7, 0.9), window_gap_from_stats(rs, 0.7, 0.9)
    for k in ("confidence", "accuracy", "gap", "accuracy_ci"):
        _close(gw[k], gr[k])
    cw, cr = cost_threshold_from_stats(ws, 10.0, 1.0), cost_threshold_from_stats(rs, 10.0, 1.0)
    for k in cw:
        _close(cw[k].to(torch.float64), cr[k].to(torch.float64))
    for a, b in zip(ece_interval_from_stats(ws, seed=3), ece_interval_from_stats(rs, seed=3)):
        _close(a, b)


def test_no_weights_keeps_every_number():
    p, y, grp, _ = _data()
    s = accumulate(prepare_inputs(p, y, reading="binary", input="probs"), 10)
    assert s.weight is None and torch.equal(s.mass(), s.count.to(torch.float64))
    # the mass of a weight of ones is the count, and every estimator gives the same bits
    ones = accumulate_weighted(
        prepare_inputs(p, y, reading="binary", input="probs"), 10, torch.ones(len(p))
    )
    assert torch.equal(ones.mass(), s.mass())
    assert torch.equal(
        calibration_error_from_stats(s, reading="binary").view(torch.int64),
        calibration_error_from_stats(s.map(lambda t: t), reading="binary").view(torch.int64),
    )


def test_check_weight_names_the_argument():
    prep = prepare_inputs(
        torch.tensor([0.2, 0.7]), torch.tensor([0, 1]), reading="binary", input="probs"
    )
    with pytest.raises(ValueError, match=r"weight: expected finite values >= 0, got -1.0 at 1"):
        accumulate_weighted(prep, 10, torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"weight: expected a tensor of shape \(2,\)"):
        accumulate_weighted(prep, 10, torch.ones(3))


def _strip_n(x):
    """A report dict without the row counts (a weighted report counts rows, the repeated one
    repetitions; the reasons' text quotes them)."""
    if isinstance(x, dict):
        return {k: _strip_n(v) for k, v in x.items() if k not in ("n", "reasons")}
    if isinstance(x, list):
        return [_strip_n(v) for v in x]
    return x


def test_weighted_report_equals_the_repeated_rows_report_memory_and_duckdb(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = rows(2000, seed=1, bad=False)
    a = arrays(t)
    reps = a["weight"].astype(np.int64)
    rep = {k: np.repeat(a[k], reps) for k in ("preds", "target", "groups")}
    weighted = state_from_arrays(**a, group_column="g", weight_column="w")
    repeated = state_from_arrays(**rep, group_column="g")
    pq.write_table(t, tmp_path / "w.parquet")
    duck = state_from_duckdb(tmp_path / "w.parquet", preds="p", label="y", group="g", weight="w")
    # frequency weights: the verdict reads w as repetitions (the default, importance weights,
    # reads the effective sample size; docs/design.md section 6f)
    kw = {"threshold": 0.8, "cost_error": 10.0, "cost_escalation": 1.0, "seed": 5}
    kw["weights"] = "frequency"
    rr = report_from_state(repeated, **kw).to_dict()
    for st in (weighted, duck):
        r = report_from_state(st, **kw).to_dict()
        for part in ("pooled", "groups"):
            assert_reports_close(_strip_n(r[part]), _strip_n(rr[part]))
        assert r["verdict"] == rr["verdict"]
    pq.write_table(
        pa.table({"p": rep["preds"], "y": rep["target"], "g": list(rep["groups"])}),
        tmp_path / "r.parquet",
    )
    duck_rep = state_from_duckdb(tmp_path / "r.parquet", preds="p", label="y", group="g")
    assert torch.equal(duck_rep.stats.count.to(torch.float64), duck.stats.weight)
