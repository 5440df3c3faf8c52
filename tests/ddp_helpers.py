"""The plumbing every two-process gloo test shares (docs/design.md section 7).

Import as ``from ddp_helpers import gloo, spawn`` from any test directory (``tests/`` is on
``sys.path`` through its conftest, and spawned workers inherit the parent's path). A worker is a
module-level function ``worker(rank, world, port, *args)`` whose body runs inside
``with gloo(rank, world, port):``; the test starts it with ``spawn(worker, *args)``.

A worker that only computes something to compare is simpler still: ``worker(rank, *args)``
returns it, and ``gathered(worker, tmp_path, *args)`` runs it inside the gloo group on every
rank and returns the per-rank values in rank order (each rank saves its value with
``torch.save`` and waits at a barrier). ``error_of(fn)`` is the message of the ``ValueError``
``fn()`` raises (``"no error"`` if none), for the every-rank-raises checks.
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


def _saved(rank: int, world: int, port: int, worker: Callable[..., Any], path: str, *args) -> None:
    with gloo(rank, world, port):
        torch.save(worker(rank, *args), f"{path}.{rank}")
        dist.barrier()


def gathered(worker: Callable[..., Any], tmp_path: Any, *args: Any, world: int = 2) -> list[Any]:
    """``[worker(r, *args) for r in range(world)]``, each call on its own rank of a gloo group
    (``worker`` a module-level function, so the spawned processes can import it)."""
    path = str(tmp_path / f"{worker.__name__}.pt")
    spawn(_saved, worker, path, *args, world=world)
    return [torch.load(f"{path}.{rank}", weights_only=False) for rank in range(world)]


def error_of(fn: Callable[[], Any]) -> str:
    """The message of the ``ValueError`` that ``fn()`` raises, or ``"no error"``."""
    try:
        fn()
    except ValueError as e:
        return str(e)
    return "no error"
