"""``torch.distributed`` for the temperature fit: is a process group there, is it asked for,
and the one all-reduce of a pass's float64 sums (docs/design.md section 4).
"""

from __future__ import annotations

import torch
from torch import Tensor


def distributed_active() -> bool:
    """True when ``torch.distributed`` is available and a process group is initialised."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def check_distributed(distributed: object) -> bool:
    """``distributed=True`` needs an initialised ``torch.distributed`` process group: a
    ``ValueError`` naming the argument instead of torch's message from inside the fit."""
    if not isinstance(distributed, bool):
        raise ValueError(f"distributed: expected a bool, got {distributed!r}")
    if distributed and not distributed_active():
        raise ValueError(
            "distributed: True needs an initialised torch.distributed process group "
            "(torch.distributed.init_process_group), but none is; pass distributed=False "
            "to fit on this process's data alone"
        )
    return distributed


def all_reduce_(stats: Tensor) -> Tensor:
    """Sum a small float64 tensor over all ranks in place (on the backend's device)."""
    check_distributed(True)
    dist = torch.distributed
    device = stats.device
    if dist.get_backend() == "nccl" and device.type != "cuda":
        buf = stats.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(buf)
        stats.copy_(buf.to(device))
    else:
        dist.all_reduce(stats)
    return stats
