"""DDP: the selective metrics on two gloo processes with uneven shards equal one process
holding all rows, bitwise (summed O(bins) states; concatenated samples in exact mode).

Run with ``pytest -m ddp``.
"""

from __future__ import annotations

import pytest
import torch
from ddp_helpers import gathered

from torchcal.metrics import AUGRC, AURC, CoverageAtRisk, RiskAtCoverage

SHARDS = (3000, 2001)


def _data():
    g = torch.Generator().manual_seed(7)
    n = sum(SHARDS)
    logits = torch.randn(n, 4, generator=g, dtype=torch.float64) * 2
    logits = (logits * 4).round() / 4  # many tied confidences
    return logits, torch.randint(0, 4, (n,), generator=g)


def _metrics():
    return {
        "aurc": AURC(),
        "aurc_exact": AURC(exact=True),
        "augrc": AUGRC(n_bins=50),
        "risk_exact": RiskAtCoverage(0.7, exact=True),
        "cov_exact": CoverageAtRisk(0.3, exact=True),
    }


def _worker(rank: int) -> dict[str, torch.Tensor]:
    logits, target = _data()
    lo = 0 if rank == 0 else SHARDS[0]
    hi = SHARDS[0] if rank == 0 else sum(SHARDS)
    out = {}
    for name, m in _metrics().items():
        m.update(logits[lo:hi], target[lo:hi])
        out[name] = m.compute()
    return out


@pytest.mark.ddp
@pytest.mark.timeout(60)
def test_two_ranks_equal_one_process_bitwise(tmp_path):
    ranks = gathered(_worker, tmp_path)
    logits, target = _data()
    for rank, got in enumerate(ranks):
        for name, m in _metrics().items():
            m.update(logits, target)
            assert torch.equal(got[name], m.compute()), (rank, name)
