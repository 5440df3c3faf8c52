"""DDP: SetCoverage on two gloo processes with uneven shards equals one process holding all
rows, bitwise (summed int64 histograms). Run with ``pytest -m ddp``."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchcal.metrics import SetCoverage

SHARDS = (1500, 701)


def _data():
    g = torch.Generator().manual_seed(11)
    n = sum(SHARDS)
    sets = torch.rand(n, 5, generator=g) < 0.4
    return sets, torch.randint(0, 5, (n,), generator=g), torch.randint(0, 3, (n,), generator=g)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, path: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        sets, y, grp = _data()
        lo, hi = (0, SHARDS[0]) if rank == 0 else (SHARDS[0], sum(SHARDS))
        m = SetCoverage(num_classes=5, num_groups=3)
        m.update(sets[lo:hi], y[lo:hi], grp[lo:hi])
        torch.save(m.compute(), f"{path}.{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
@pytest.mark.timeout(180)
def test_two_ranks_equal_one_process_bitwise(tmp_path):
    path = str(tmp_path / "sets.pt")
    mp.spawn(_worker, args=(2, _free_port(), path), nprocs=2, join=True)
    sets, y, grp = _data()
    ref = SetCoverage(num_classes=5, num_groups=3)
    ref.update(sets, y, grp)
    want = ref.compute()
    for rank in (0, 1):
        got = torch.load(f"{path}.{rank}", weights_only=False)
        for part in ("pooled", "per_class", "per_group"):
            for a, b in zip(getattr(got, part), getattr(want, part)):
                assert torch.equal(a, b), (rank, part)
