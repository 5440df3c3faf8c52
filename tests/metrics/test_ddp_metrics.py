"""DDP: two gloo processes on uneven shards give the single-process counts and sums.

Run with ``pytest -m ddp`` (CI runs it as a separate step). Each rank updates the metrics
with its shard (6,000 and 4,001 rows), calls ``compute()`` (a collective), and rank 0 writes
the synchronised states and results to a file that the test compares with one process
holding all 10,001 rows.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from ddp_helpers import error_of, gathered

from torchcal.metrics import (
    BrierDecomposition,
    CalibrationError,
    ClasswiseCalibrationError,
    NegativeLogLikelihood,
    ReliabilityDiagram,
)

SHARDS = (6000, 4001)
C = 4


def _data():
    g = torch.Generator().manual_seed(123)
    n = sum(SHARDS)
    logits = torch.randn(n, C, generator=g, dtype=torch.float64) * 2
    target = torch.randint(0, C, (n,), generator=g)
    groups = torch.randint(0, 3, (n,), generator=g)
    return logits, target, groups


def _metrics():
    return {
        "ece": CalibrationError(n_bins=15, estimator="equal_mass"),
        "top": CalibrationError(reading="top_label", num_classes=C, num_groups=3),
        "exact": CalibrationError(estimator="smooth", exact=True),
        "classwise": ClasswiseCalibrationError(num_classes=C, num_groups=3),
        "table": ReliabilityDiagram(n_bins=10),
        "brier": BrierDecomposition(reading="classwise", num_classes=C),
        "nll": NegativeLogLikelihood(num_groups=3),
    }


def _run(metrics, logits, target, groups):
    out = {}
    for name, m in metrics.items():
        grouped = getattr(m, "num_groups", None) is not None
        m.update(logits, target, groups if grouped else None)
        res = m.compute()
        m.sync(should_sync=dist.is_available() and dist.is_initialized())
        states = {k: getattr(m, k) for k in m._defaults}
        states = {
            k: (torch.cat(v) if isinstance(v, list) else v).clone()
            for k, v in states.items()
            if not (isinstance(v, list) and len(v) == 0)
        }
        if dist.is_available() and dist.is_initialized():
            m.unsync()
        out[name] = {"states": states, "result": res}
    return out


def _worker(rank: int) -> dict:
    logits, target, groups = _data()
    lo = sum(SHARDS[:rank])
    sl = slice(lo, lo + SHARDS[rank])
    return _run(_metrics(), logits[sl], target[sl], groups[sl])


def _close(a, b, name):
    if isinstance(a, torch.Tensor):
        if a.dtype in (torch.int64, torch.int32):
            assert torch.equal(a, b), name
        else:
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12, equal_nan=True), name
    elif isinstance(a, dict):
        for k in a:
            _close(a[k], b[k], f"{name}.{k}")
    elif hasattr(a, "pooled"):
        _close(a.pooled, b.pooled, name + ".pooled")
        if isinstance(a.per_group, torch.Tensor):
            _close(a.per_group, b.per_group, name + ".per_group")
        _close(a.counts, b.counts, name + ".counts")
    elif hasattr(a, "count"):  # ReliabilityTable
        for f in ("count", "conf", "acc", "ci_low", "ci_high"):
            _close(getattr(a, f), getattr(b, f), f"{name}.{f}")
    else:
        raise AssertionError(f"{name}: unexpected result type {type(a)}")


@pytest.mark.ddp
@pytest.mark.timeout(60)
def test_two_gloo_ranks_equal_one_process(tmp_path):
    got = gathered(_worker, tmp_path)[0]
    ref = _run(_metrics(), *_data())
    for name in ref:
        for k, v in ref[name]["states"].items():
            w = got[name]["states"][k]
            if k.startswith("sample_"):  # 'cat' states: rank order, same multiset
                v, w = v.sort().values, w.sort().values
            _close(v, w, f"{name}.{k}")
        _close(ref[name]["result"], got[name]["result"], name)
    assert int(got["ece"]["states"]["count"].sum()) == sum(SHARDS)


# ------------------------------------------------------------------ issue 9: DDP edge cases
def _worker_edge(rank: int) -> dict:
    logits, target, _ = _data()
    out = {}
    # exact=True with a rank that never updated (its 'cat' states are empty lists)
    m = CalibrationError(estimator="smooth", exact=True)
    eq = CalibrationError(estimator="equal_mass", exact=True, n_bins=10)
    if rank == 0:
        m.update(logits, target)
        eq.update(logits, target)
    out["smooth"] = m.compute()
    out["equal_mass"] = eq.compute()
    # ranks built with different settings: every rank raises 'other: ...'
    bad = CalibrationError(n_bins=15 if rank == 0 else 10)
    bad.update(logits[:100], target[:100])
    out["mismatch"] = error_of(bad.compute)
    return out


@pytest.mark.ddp
@pytest.mark.timeout(60)
def test_exact_with_an_empty_rank_and_config_mismatch(tmp_path):
    ranks = gathered(_worker_edge, tmp_path)
    logits, target, _ = _data()
    ref_s = CalibrationError(estimator="smooth", exact=True)
    ref_s.update(logits, target)
    ref_e = CalibrationError(estimator="equal_mass", exact=True, n_bins=10)
    ref_e.update(logits, target)
    for got in ranks:
        assert abs(float(got["smooth"]) - float(ref_s.compute())) <= 1e-12
        assert abs(float(got["equal_mass"]) - float(ref_e.compute())) <= 1e-12
        assert got["mismatch"].startswith("other: rank(s) ["), got["mismatch"]
