"""DDP for the issue 11 metrics: two gloo processes equal one process.

Run with ``pytest -m ddp``. One spawn, three scenarios per rank: unequal shards (1,800 and
1,201 rows), a rank that never updates (all rows on rank 0), and ranks built with different
settings (every rank raises ``other: ...``). Each rank writes its synchronised results to a
file; the test compares them with one process holding all 3,001 rows.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from ddp_helpers import error_of, gathered
from scipy import stats

from torchcal.functional import pit_normal
from torchcal.metrics import (
    CRPS,
    GaussianNLL,
    IntervalCoverage,
    IntervalScore,
    PITHistogram,
    QuantileCalibrationError,
)

SHARDS = (1800, 1201)
G = 3
LEVELS = (0.5, 0.8, 0.9, 0.95)
QLEVELS = (0.1, 0.5, 0.9)


def _data():
    g = torch.Generator().manual_seed(7)
    n = sum(SHARDS)
    loc = torch.randn(n, generator=g, dtype=torch.float64)
    scale = 0.5 + torch.rand(n, generator=g, dtype=torch.float64)
    y = loc + 1.2 * scale * torch.randn(n, generator=g, dtype=torch.float64)
    samples = loc[:, None] + scale[:, None] * torch.randn(n, 8, generator=g, dtype=torch.float64)
    groups = torch.randint(0, G, (n,), generator=g)
    return loc, scale, y, samples, groups


def _metrics():
    return {
        "pit": PITHistogram(10, num_groups=G),
        "pit_pooled": PITHistogram(5),
        "cov": IntervalCoverage(LEVELS, num_groups=G),
        "qce": QuantileCalibrationError(QLEVELS, num_groups=G),
        "qce_l2": QuantileCalibrationError(QLEVELS, norm="l2"),
        "crps": CRPS("normal", num_groups=G),
        "crps_ens": CRPS("ensemble"),
        "nll": GaussianNLL(num_groups=G),
        "is": IntervalScore(0.2),
    }


def _update(ms, loc, scale, y, samples, groups):
    z = torch.tensor([stats.norm.ppf(0.5 + c / 2) for c in LEVELS], dtype=torch.float64)
    lo, hi = loc[:, None] - scale[:, None] * z, loc[:, None] + scale[:, None] * z
    q = loc[:, None] + scale[:, None] * torch.tensor(stats.norm.ppf(QLEVELS))
    u = pit_normal(loc, scale, y)
    ms["pit"].update(u, groups)
    ms["pit_pooled"].update(u)
    ms["cov"].update(lo, hi, y, groups)
    ms["qce"].update(q, y, groups)
    ms["qce_l2"].update(q, y)
    ms["crps"].update(loc, scale, y, groups=groups)
    ms["crps_ens"].update(samples, y)
    ms["nll"].update(loc, scale, y, groups)
    ms["is"].update(lo[:, 1], hi[:, 1], y)


def _results(ms):
    out = {name: m.compute() for name, m in ms.items()}
    out["qce_observed"] = ms["qce"].compute_observed()
    return out


def _worker(rank: int) -> dict:
    data = _data()
    lo = sum(SHARDS[:rank])
    out = {}
    ms = _metrics()
    _update(ms, *(x[lo : lo + SHARDS[rank]] for x in data))
    out["unequal"] = _results(ms)
    ms = _metrics()
    if rank == 0:  # rank 1 never updates
        _update(ms, *data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torchmetrics: compute before update
        out["empty_rank"] = _results(ms)
    bad = IntervalCoverage((0.5, 0.9) if rank == 0 else (0.5, 0.8))
    bounds = data[0][:10, None].expand(-1, 2)
    bad.update(bounds, bounds, data[0][:10])
    out["mismatch"] = error_of(bad.compute)
    return out


def _close(a, b, name):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), name
        for k in a:
            _close(a[k], b[k], f"{name}.{k}")
    elif hasattr(a, "pooled"):
        _close(a.pooled, b.pooled, name + ".pooled")
        _close(a.per_group, b.per_group, name + ".per_group")
        assert torch.equal(a.counts, b.counts), name
    elif a.dtype == torch.int64:
        assert torch.equal(a, b), name
    else:
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12, equal_nan=True), (name, a, b)


@pytest.mark.ddp
@pytest.mark.timeout(120)
def test_two_gloo_ranks_equal_one_process(tmp_path):
    ranks = gathered(_worker, tmp_path)
    ms = _metrics()
    _update(ms, *_data())
    ref = _results(ms)
    assert int(ref["cov"].pooled["n"]) == sum(SHARDS)
    for rank, got in enumerate(ranks):
        for scenario in ("unequal", "empty_rank"):
            for name in ref:
                _close(ref[name], got[scenario][name], f"rank{rank}.{scenario}.{name}")
        assert got["mismatch"].startswith("other: rank(s) ["), got["mismatch"]
