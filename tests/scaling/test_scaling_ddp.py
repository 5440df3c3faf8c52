"""Two gloo processes holding different shards fit the same T as one process on the union."""

import json
import os

import pytest
import torch
from ddp_helpers import gloo, spawn

from torchcal.scaling import TemperatureScaler


def _data():
    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(3000, 20, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / 2.0, 1), 1, generator=g).squeeze(1)
    s = 5 * torch.randn(3000, generator=g, dtype=torch.float64)
    b = torch.bernoulli(torch.sigmoid(s / 2.0), generator=g)
    return z, y, s, b


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    with gloo(rank, world, port):
        z, y, s, b = _data()
        # unequal shards: rank 0 holds 1000 rows, rank 1 holds 2000, in uneven chunks
        lo, hi = (0, 1000) if rank == 0 else (1000, 3000)
        zs, ys, ss, bs = z[lo:hi], y[lo:hi], s[lo:hi], b[lo:hi]
        sizes = [300, 700] if rank == 0 else [1500, 499, 1]
        multi = TemperatureScaler().fit_stream(list(zip(zs.split(sizes), ys.split(sizes))))
        binary = TemperatureScaler().fit_stream(list(zip(ss.split(sizes), bs.split(sizes))))
        in_memory = TemperatureScaler().fit(zs, ys, distributed=True)
        # rank 1 holds nothing: it still joins the all-reduces and gets rank 0's T
        lopsided = TemperatureScaler().fit_stream(
            list(zip(z.split(1000), y.split(1000))) if rank == 0 else []
        )
        result = {
            "multi": multi.temperature,
            "binary": binary.temperature,
            "in_memory": in_memory.temperature,
            "lopsided": lopsided.temperature,
            "nll": multi.nll_after,
        }
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)


@pytest.mark.ddp
@pytest.mark.timeout(60)
def test_two_gloo_ranks_fit_the_union(tmp_path):
    spawn(_worker, str(tmp_path))
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    z, y, s, b = _data()
    ref_multi = TemperatureScaler().fit(z, y)
    ref_binary = TemperatureScaler().fit(s, b)
    for r in (r0, r1):
        assert abs(r["multi"] / ref_multi.temperature - 1) <= 1e-7
        assert abs(r["in_memory"] / ref_multi.temperature - 1) <= 1e-7
        assert abs(r["lopsided"] / ref_multi.temperature - 1) <= 1e-7
        assert abs(r["binary"] / ref_binary.temperature - 1) <= 1e-7
        assert abs(r["nll"] - ref_multi.nll_after) <= 1e-12
    assert r0 == r1  # bit-identical on both ranks
    # and not the T of either shard alone
    assert (
        abs(TemperatureScaler().fit(z[:1000], y[:1000]).temperature / ref_multi.temperature - 1)
        > 1e-4
    )
