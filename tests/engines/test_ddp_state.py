"""DDP: each rank of a 2-process gloo evaluation writes its metric's local state
(``state_from_metric``, docs/engines.md), one rank's shard empty; ``torchcal audit --state
'part-*.parquet'`` merges the parts into the statistics and the report of one process holding
every row. Run with ``pytest -m ddp``.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from ddp_helpers import gloo, spawn

pytest.importorskip("pyarrow")

N = 4001
GROUPS = ("a", "b", "c")


def _data():
    g = torch.Generator().manual_seed(11)
    p = torch.rand(N, generator=g, dtype=torch.float64)
    p[:40] = torch.arange(40, dtype=torch.float64) / 10 % 1  # values on the bin edges
    y = (torch.rand(N, generator=g, dtype=torch.float64) < p**1.3).long()
    grp = torch.randint(0, len(GROUPS), (N,), generator=g)
    return p, y, grp


def _metric():
    from torchcal.metrics import CalibrationError

    return CalibrationError(n_bins=10, reading="binary", input="probs", num_groups=len(GROUPS))


def _worker(rank: int, world: int, port: int, out: str) -> None:
    from torchcal.engines.memory import state_from_metric
    from torchcal.engines.state import write_state

    with gloo(rank, world, port):
        p, y, grp = _data()
        m = _metric()
        if rank == 0:  # rank 1 sees no batch at all (an empty shard)
            for lo in range(0, N, 1000):
                m.update(p[lo : lo + 1000], y[lo : lo + 1000], grp[lo : lo + 1000])
        write_state(
            state_from_metric(m, group_names=GROUPS), os.path.join(out, f"part-{rank}.parquet")
        )
        m.compute()  # the synchronised value still works on every rank (no hang)
        dist.barrier()


@pytest.mark.ddp
@pytest.mark.timeout(120)
def test_rank_states_merge_to_one_process(tmp_path, capsys):
    from torchcal.audit.engine_input import report_from_state
    from torchcal.cli import main
    from torchcal.engines.memory import state_from_metric
    from torchcal.engines.state import read_states

    spawn(_worker, str(tmp_path))
    merged = read_states(str(tmp_path / "part-*.parquet"))
    p, y, grp = _data()
    one = _metric()
    one.update(p, y, grp)
    whole = state_from_metric(one, group_names=GROUPS)
    assert merged.groups == whole.groups
    assert torch.equal(merged.stats.count, whole.stats.count)
    for name in ("conf", "acc", "conf2", "conf_acc"):
        a, b = getattr(merged.stats, name), getattr(whole.stats, name)
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), name
    r_merged = report_from_state(merged, threshold=0.8).to_dict()
    r_whole = report_from_state(whole, threshold=0.8).to_dict()
    assert r_merged["verdict"] == r_whole["verdict"]
    for key in ("n", "ece"):
        assert r_merged["pooled"][key] == pytest.approx(r_whole["pooled"][key], abs=1e-12)
    for key in ("n", "gap", "p_pass", "p_fail"):
        got, want = (
            r_merged["pooled"]["threshold_gap"][key],
            r_whole["pooled"]["threshold_gap"][key],
        )
        assert got == pytest.approx(want, abs=1e-12), key
    # and through the command line, as docs/engines.md tells a user to run it
    code = main(["audit", "--state", str(tmp_path / "part-*.parquet"), "--threshold", "0.8"])
    out = capsys.readouterr().out
    assert code in (0, 1, 3) and f"({N} rows" in out
