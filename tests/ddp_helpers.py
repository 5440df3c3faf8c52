"""The plumbing every two-process gloo test shares (docs/design.md section 7).

Import as ``from ddp_helpers import gloo, spawn`` from any test directory (``tests/`` is on
``sys.path`` through its conftest, and spawned workers inherit the parent's path). A worker is a
module-level function ``worker(rank, world, port, *args)`` whose body runs inside
``with gloo(rank, world, port):``; the test starts it with ``spawn(worker, *args)``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on the loopback interface that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gloo(rank: int, world: int, port: int) -> Iterator[None]:
    """One rank of a gloo process group on ``127.0.0.1:port``, one intra-op thread."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def spawn(worker: Callable[..., None], *args: Any, world: int = 2) -> None:
    """Run ``worker(rank, world, port, *args)`` on ``world`` processes and wait for them."""
    mp.spawn(worker, args=(world, free_port(), *args), nprocs=world, join=True)
