"""DDP: SetCoverage on two gloo processes with uneven shards equals one process holding all
rows, bitwise (summed int64 histograms). Run with ``pytest -m ddp``."""

from __future__ import annotations

import pytest
import torch
from ddp_helpers import gathered

from torchcal.metrics import SetCoverage

SHARDS = (1500, 701)


def _data():
    g = torch.Generator().manual_seed(11)
    n = sum(SHARDS)
    sets = torch.rand(n, 5, generator=g) < 0.4
    return sets, torch.randint(0, 5, (n,), generator=g), torch.randint(0, 3, (n,), generator=g)


def _worker(rank: int):
    sets, y, grp = _data()
    lo, hi = (0, SHARDS[0]) if rank == 0 else (SHARDS[0], sum(SHARDS))
    m = SetCoverage(num_classes=5, num_groups=3)
    m.update(sets[lo:hi], y[lo:hi], grp[lo:hi])
    return m.compute()


@pytest.mark.ddp
@pytest.mark.timeout(180)
def test_two_ranks_equal_one_process_bitwise(tmp_path):
    ranks = gathered(_worker, tmp_path)
    sets, y, grp = _data()
    ref = SetCoverage(num_classes=5, num_groups=3)
    ref.update(sets, y, grp)
    want = ref.compute()
    for rank, got in enumerate(ranks):
        for part in ("pooled", "per_class", "per_group"):
            for a, b in zip(getattr(got, part), getattr(want, part)):
                assert torch.equal(a, b), (rank, part)
