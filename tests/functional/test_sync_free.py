"""The device path of the value checks never synchronises the host (docs/design.md section 3).

CPU tensors take the device (sync-free) code path under ``force_sync_free()``; a
``TorchFunctionMode`` records every tensor method and torch function the forward and the
backward call from Python, and none of the methods that read a device value on the host
(``.item()``, ``bool(t)``, ``.tolist()``, ``.cpu()``, ``nonzero`` ...) may appear. The
same calls on the CPU path do use them (the test of the recorder itself), and bad values
still fail on the device path (as a device-side assertion, ``RuntimeError``).
"""

from __future__ import annotations

import pytest
import torch
from _hotpath_cases import LOSS_CASES, SCORE_CASES, all_cases, functional_scores, leaves
from torch import Tensor
from torch.overrides import TorchFunctionMode

import torchcal.losses as L
from torchcal.functional import log_score
from torchcal.functional._checks import force_sync_free, sync_free

#: methods / functions that read a device value on the host
SYNC_NAMES = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy"}
SYNC_NAMES |= {"nonzero", "argwhere", "masked_select", "unique", "__len__"}


class Recorder(TorchFunctionMode):
    """Records the name of every torch function / tensor method called from Python."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))


def _run(fn, inputs: tuple[Tensor, ...]) -> None:
    out = fn(*inputs)
    out.sum().backward()


def test_every_loss_and_score_has_a_case():
    assert set(L.__all__) <= set(LOSS_CASES), set(L.__all__) - set(LOSS_CASES)
    assert set(functional_scores()) <= set(SCORE_CASES), set(functional_scores()) - set(SCORE_CASES)
    assert "log_score" in functional_scores() and "crps_normal" in functional_scores()


def test_sync_free_decides_by_device_and_switch():
    x = torch.zeros(2)
    assert not sync_free(x)
    with force_sync_free():
        assert sync_free(x)
    assert not sync_free(x)
    assert sync_free(torch.zeros(2, device="meta"))


def test_recorder_sees_the_cpu_path_read_values():
    """The recorder works: the CPU path of the value check reads its result on the host."""
    z, y = torch.randn(4, 3), torch.tensor([0, 1, 2, -100])  # an ignored item: the full check
    rec = Recorder()
    with rec:
        log_score(z, y)
    assert SYNC_NAMES & set(rec.names), rec.names


@pytest.mark.parametrize("name", sorted(all_cases()))
def test_device_path_calls_no_sync_method(name):
    fn, make = all_cases()[name]
    inputs = leaves(make(8, torch.Generator().manual_seed(1)))
    _run(fn, inputs)  # warm-up (lazy imports, caches)
    rec = Recorder()
    with force_sync_free(), rec:
        _run(fn, leaves(inputs))
    assert rec.names, "the recorder saw no call"
    used = SYNC_NAMES & set(rec.names)
    assert not used, f"{name}: host-synchronising calls on the device path: {sorted(used)}"


def test_device_path_still_rejects_bad_values():
    z = torch.randn(4, 3)
    z[1, 2] = float("nan")
    y = torch.tensor([0, 1, 2, 0])
    with force_sync_free(), pytest.raises(RuntimeError, match="log_score: expected"):
        log_score(z, y)
    with pytest.raises(ValueError, match=r"position \(1, 2\)|item 1"):
        log_score(z, y)  # CPU eager: today's ValueError naming the position
    scale = torch.tensor([1.0, -1.0])
    with force_sync_free(), pytest.raises(RuntimeError, match="scale: expected"):
        L.CRPSLoss()(torch.zeros(2), scale, torch.zeros(2))
    with force_sync_free(), pytest.raises(RuntimeError, match="target: expected class indices"):
        L.BrierLoss()(torch.randn(2, 3), torch.tensor([0, 3]))
