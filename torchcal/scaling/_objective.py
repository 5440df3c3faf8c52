"""The streamed temperature objective: float64 passes over chunks, their sums, the solve.

The formula (per-sample NLL and its derivatives in ``beta = 1 / T``) is
:func:`torchcal.functional.recalibration.temperature_terms`; this module runs it over chunks of
any size in one pass (O(chunk) memory), adds the per-chunk sums in a fixed order (the result is
bit-identical for any number of threads), all-reduces them under ``torch.distributed``, names
the position of a bad value, and solves for ``u = log beta = -log T`` with the bracketed Newton
of :mod:`torchcal.scaling._solvers`, vectorised over groups so that
:class:`~torchcal.scaling.GroupTemperatureScaler` reuses it unchanged
(``docs/design.md`` section 4).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import Tensor

from torchcal.functional._validation import first_bad_position, values_checked
from torchcal.functional.recalibration import log_beta_derivatives, temperature_terms
from torchcal.scaling._solvers import bracketed_newton

__all__ = [
    "Chunk",
    "STAT_FIELDS",
    "COUNT",
    "LOSS",
    "DLOSS",
    "D2LOSS",
    "LOSS_IDENTITY",
    "MISRANKED",
    "WINDOW",
    "BLOCK",
    "chunk_rows",
    "temperature_pass",
    "LogBetaResult",
    "u_derivatives",
    "solve_log_beta",
    "all_reduce_",
    "check_distributed",
    "distributed_active",
    "validate_labels",
    "validate_logits",
    "validate_masked_target",
    "check_stats",
    "tensor_chunks",
    "default_workers",
    "log_bounds",
]

# Columns of the per-group statistics returned by ``temperature_pass``.
# ``misranked`` (rows whose target is not a row maximum; binary: a score on the wrong side of
# 0) does not depend on T and is only filled by identity passes: when it is 0 the set is
# perfectly separated (the NLL decreases all the way to T -> 0).
STAT_FIELDS = ("count", "loss", "dloss", "d2loss", "loss_identity", "misranked")
COUNT, LOSS, DLOSS, D2LOSS, LOSS_IDENTITY, MISRANKED = range(6)

# Chunks stay below ATen's parallel grain sizes (32768 elements for element-wise ops, 2048
# for the MKL-VML exp/log): each op then runs single-threaded on a cache-resident chunk, with
# no OpenMP barrier per op (which costs milliseconds on an oversubscribed machine).
_CHUNK_ELEMENTS = (1 << 15) - 1
_MAX_ROWS = 2047


def chunk_rows(num_columns: int, device: torch.device | None = None) -> int:
    """Rows per chunk: on CPU below 32768 elements and 2048 rows (see ``_CHUNK_ELEMENTS``);
    on accelerators about ``2**24`` elements (few kernel launches, 128 MB of float64)."""
    if device is not None and device.type != "cpu":
        return max(1, (1 << 24) // max(1, num_columns))
    return max(1, min(_MAX_ROWS, _CHUNK_ELEMENTS // max(1, num_columns)))


@dataclass
class Chunk:
    """One slice of the data: logits, target, optional group ids, and its first row index."""

    logits: Tensor
    target: Tensor
    groups: Tensor | None = None
    offset: int = 0


def _where(bad: Tensor, offset: int) -> str:
    pos = first_bad_position(bad)
    if bad.dim() <= 1:
        return str(int(pos) + offset)
    first, rest = pos[1:-1].split(",", 1)
    return f"({int(first) + offset},{rest})"


def validate_labels(chunk: Chunk, binary: bool, num_classes: int | None) -> None:
    """Labels in range; cheap (O(rows)), run on every chunk of every streamed pass (group ids
    are checked once, up front, by :class:`~torchcal.scaling.GroupTemperatureScaler`)."""
    y = chunk.target
    if binary:
        if values_checked():
            bad = (y != 0) & (y != 1)
            if bool(bad.any()):
                val = y[bad][0].item()
                raise ValueError(
                    f"target: expected binary labels in {{0, 1}}, got {val!r} at "
                    f"position {_where(bad, chunk.offset)}"
                )
    else:
        assert num_classes is not None
        bad = (y < 0) | (y >= num_classes)
        if bool(bad.any()):  # always checked: gather would fail with an opaque index error
            val = int(y[bad][0])
            raise ValueError(
                f"target: expected class indices in [0, {num_classes - 1}], got "
                f"{val} at position {_where(bad, chunk.offset)}"
            )


def validate_logits(chunk: Chunk, binary: bool) -> None:
    """NaN/+Inf logits and masked targets, with global positions.

    The passes do not run this (it would cost a sixth of a pass): a bad value makes the
    float64 sums non-finite, and only then is the data scanned again with this check to
    name the position (see :func:`check_stats`).
    """
    x, y = chunk.logits, chunk.target
    bad = torch.isnan(x) | torch.isposinf(x)
    if bool(bad.any()):
        raise ValueError(
            f"logits: expected finite values or -inf masks, found NaN or +Inf at "
            f"position {_where(bad, chunk.offset)}"
        )
    if binary:
        bad = torch.isneginf(x) & (y == 1)
        if bool(bad.any()):
            raise ValueError(
                f"logits: a -inf (masked) logit has target 1 at position "
                f"{_where(bad, chunk.offset)}; its likelihood is 0"
            )
    else:
        validate_masked_target(chunk)


def validate_masked_target(chunk: Chunk) -> None:
    """Multiclass: no row's target class may be masked (``-inf``: its likelihood is 0)."""
    zy = chunk.logits.gather(1, chunk.target.unsqueeze(1)).squeeze(1)
    bad = torch.isneginf(zy)
    if bool(bad.any()):
        raise ValueError(
            f"logits: the target class is masked (-inf) at row "
            f"{_where(bad, chunk.offset)}; its likelihood is 0"
        )


def check_stats(stats: Tensor, chunks: Callable[[], Iterable[Chunk]], binary: bool) -> None:
    """Raise a positioned error if a pass produced non-finite sums (NaN/+Inf/masked target)."""
    if bool(torch.isfinite(stats).all()):
        return
    for chunk in chunks():
        validate_logits(chunk, binary)
    raise ValueError(
        "logits: the NLL is not finite: NaN or +Inf logits on another rank, or "
        "logits whose differences overflow float64"
    )


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


# A threaded pass hands the threads WINDOW chunks at a time: bounded memory for the per-row
# group terms, and few live small tensors (thousands of them, interleaved with the freed chunk
# buffers, fragment the heap: +0.4x the logits of peak RSS at 100k x 1000). The calling thread
# adds the per-chunk sums in chunk order, BLOCK at a time.
WINDOW = 64
BLOCK = 256


def _chunk_sums(
    chunk: Chunk,
    beta0: float,
    beta_g: Tensor,
    *,
    binary: bool,
    num_classes: int | None,
    identity: bool,
    check_labels: bool,
    state: dict,
) -> tuple[int, Tensor, Tensor | None]:
    """One chunk's contribution: ``(rows, column sums (k,), None)`` without groups, else
    ``(rows, per-row columns (n, 1 + k), group ids)`` to be index-added in chunk order.

    A chunk stays below ATen's parallel grain (see ``_CHUNK_ELEMENTS``), so its sums do not
    depend on the thread count. ``state`` may be shared by threads: it only records that
    masks were seen, which changes when (not whether) masks are floored, not the values.
    """
    if check_labels:
        validate_labels(chunk, binary, num_classes)
    n = chunk.target.shape[0]
    if chunk.groups is None:
        terms = temperature_terms(
            chunk.logits, chunk.target, beta0, binary=binary, identity=identity, state=state
        )
        return n, torch.stack(terms, 1).sum(0), None
    beta = beta_g.to(chunk.logits.device)[chunk.groups]
    terms = temperature_terms(
        chunk.logits, chunk.target, beta, binary=binary, identity=identity, state=state
    )
    ones = torch.ones(n, dtype=torch.float64, device=chunk.logits.device)
    return n, torch.stack([ones, *terms], 1), chunk.groups


Sums = tuple[int, Tensor, Tensor | None]


def _in_order(
    chunks: list[Chunk], compute: Callable[[Chunk], Sums], pool: ThreadPoolExecutor, workers: int
) -> Iterator[Sums]:
    """The chunks' sums computed on ``workers`` threads, yielded in chunk order: one task per
    worker and window, worker k taking every workers-th chunk of the window."""

    def share(part: list[Chunk]) -> list:
        return [compute(c) for c in part]

    for s in range(0, len(chunks), WINDOW):
        win = chunks[s : s + WINDOW]
        futures = [pool.submit(share, win[k::workers]) for k in range(workers)]
        shares = [f.result() for f in futures]
        for i in range(len(win)):
            yield shares[i % workers][i // workers]


def _accumulate(parts: Iterable[Sums], num_groups: int) -> Tensor | None:
    """Add the per-chunk sums in chunk order (ungrouped: BLOCK chunks at a time)."""
    acc: Tensor | None = None
    count = 0
    block: list[Tensor] = []  # ungrouped column sums, added BLOCK chunks at a time
    for n, sums, groups in parts:
        if acc is None:
            acc = torch.zeros(num_groups, len(STAT_FIELDS), dtype=torch.float64, device=sums.device)
        if groups is None:
            count += n
            block.append(sums)
            if len(block) == BLOCK:
                acc[0, 1 : 1 + sums.shape[0]] += torch.stack(block).sum(0)
                block.clear()
        else:
            acc[:, : sums.shape[1]].index_add_(0, groups, sums)
    if acc is not None:
        if block:
            acc[0, 1 : 1 + block[0].shape[0]] += torch.stack(block).sum(0)
        acc[0, COUNT] += count
    return acc


def temperature_pass(
    chunks: Iterable[Chunk],
    u: Tensor,
    *,
    binary: bool,
    num_classes: int | None = None,
    num_groups: int = 1,
    identity: bool = False,
    reduce: bool = False,
    workers: int = 1,
    check_labels: bool = True,
) -> Tensor:
    """One pass: per-group sums ``(G, 6)`` of :data:`STAT_FIELDS` at ``u = log beta``.

    ``u`` holds one value per group (``(G,)``, float64). Derivatives are w.r.t. ``beta``.
    ``reduce=True`` all-reduces the sums over the process group. ``workers > 1`` (a list of
    chunks only) computes the chunks' sums on that many threads (torch releases the GIL inside
    its kernels); the sums are always added in chunk order, in fixed blocks, so the result is
    bit-identical for any number of workers or torch threads.
    ``check_labels=False`` skips the per-chunk label check (in-memory data checked once).
    """
    beta_g = torch.exp(u.to(torch.float64))
    beta0 = float(beta_g[0])  # a Python float: no tensor-scalar dispatch per chunk
    state: dict = {}

    def compute(chunk: Chunk) -> Sums:
        return _chunk_sums(
            chunk,
            beta0,
            beta_g,
            binary=binary,
            num_classes=num_classes,
            identity=identity,
            check_labels=check_labels,
            state=state,
        )

    if workers > 1 and isinstance(chunks, list) and len(chunks) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            acc = _accumulate(_in_order(chunks, compute, pool, workers), num_groups)
    else:
        acc = _accumulate(map(compute, chunks), num_groups)
    stats = torch.zeros(num_groups, len(STAT_FIELDS), dtype=torch.float64)
    if acc is not None:
        stats += acc.cpu()
    if reduce:
        all_reduce_(stats)
    return stats


@dataclass
class LogBetaResult:
    """Solution of :func:`solve_log_beta` (per group)."""

    u: Tensor  # log beta at the last evaluated point
    stats: Tensor  # (G, 6) sums at u
    grad: Tensor  # d(objective)/du per sample (penalty included), at u
    curv: Tensor  # d2(objective)/du2 per sample, at u
    converged: Tensor  # bool (G,)
    at_lower: Tensor  # stopped at the lower bound of u (T at its maximum)
    at_upper: Tensor  # stopped at the upper bound of u (T at its minimum)
    iterations: int  # Newton iterations (evaluations after the first)
    passes: int  # data passes
    identity_stats: Tensor | None = None


def u_derivatives(
    stats: Tensor, u: Tensor, center: Tensor | None = None, strength: float = 0.0
) -> tuple[Tensor, Tensor, Tensor]:
    """Objective, d/du and d2/du2 (sums, per group) of a pass's ``(G, 6)`` sums at ``u``."""
    return log_beta_derivatives(
        stats[:, LOSS], stats[:, DLOSS], stats[:, D2LOSS], u, center, strength
    )


def solve_log_beta(
    evaluate: Callable[[Tensor, bool], Tensor],
    u0: Tensor,
    *,
    lower: float,
    upper: float,
    grad_tol: float,
    step_tol: float,
    max_iter: int,
    center: Tensor | None = None,
    strength: float = 0.0,
    identity_first: bool = False,
    max_step: float = 2.0,
    detect_separation: bool = True,
) -> LogBetaResult:
    """The temperature(s) by :func:`~torchcal.scaling._solvers.bracketed_newton` on
    ``u = log beta`` in ``[lower, upper]``, vectorised over groups.

    ``evaluate(u, identity)`` returns the ``(G, 6)`` sums of one pass. The objective per group
    is the summed NLL plus ``strength / 2 * (u - center)**2``; the NLL is unimodal in ``u``
    (convex in ``beta``), so the solver's bracket always holds the optimum.

    With ``identity_first`` and ``detect_separation``, a group without prior whose set is
    perfectly separated (``misranked == 0``: its NLL decreases all the way to ``T -> 0``, but
    its gradient underflows below any tolerance at a finite, arbitrary T) goes straight to
    the upper bound of ``u`` (``at_upper``), if its NLL there is below the NLL at ``T = 1``
    (else every row is constant: the NLL does not depend on T, the group stays where it is).
    """
    u = u0.to(torch.float64).clone().clamp_(lower, upper)
    G = u.shape[0]
    done = torch.zeros(G, dtype=torch.bool)
    stats = evaluate(u, identity_first)
    identity_stats = stats[:, LOSS_IDENTITY].clone() if identity_first else None
    passes = 1
    free = torch.full((G,), center is None or strength == 0, dtype=torch.bool)
    sep = free & (stats[:, MISRANKED] == 0) & (stats[:, COUNT] > 0)
    if identity_first and detect_separation and bool(sep.any()):
        u_try = torch.where(sep, torch.full_like(u, upper), u)
        at_bound = evaluate(u_try, False)
        passes += 1
        lower_there = sep & (at_bound[:, LOSS] < stats[:, LOSS_IDENTITY])  # below NLL at T=1
        stats = torch.where(lower_there.unsqueeze(1), at_bound, stats)
        u = torch.where(lower_there, u_try, u)
        done |= lower_there

    def derivatives(u: Tensor, stats: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        _, g, h = u_derivatives(stats, u, center, strength)
        return stats, g, h, stats[:, COUNT]

    def step(u: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        nonlocal passes
        passes += 1
        return derivatives(u, evaluate(u, False))

    res = bracketed_newton(
        step,
        u,
        derivatives(u, stats),
        lower=lower,
        upper=upper,
        grad_tol=grad_tol,
        step_tol=step_tol,
        max_iter=max_iter,
        max_step=max_step,
        done=done,
        at_upper=done,
    )
    assert isinstance(res.payload, Tensor)
    return LogBetaResult(
        u=res.u,
        stats=res.payload,
        grad=res.grad,
        curv=res.curv,
        converged=res.converged,
        at_lower=res.at_lower,
        at_upper=res.at_upper,
        iterations=res.iterations,
        passes=passes,
        identity_stats=identity_stats,
    )


def tensor_chunks(
    logits: Tensor, target: Tensor, groups: Tensor | None = None, rows: int | None = None
) -> list[Chunk]:
    """Row slices (views, no copies) of in-memory data as :class:`Chunk` s."""
    n = target.shape[0]
    if rows is None:
        rows = chunk_rows(logits.shape[1] if logits.dim() == 2 else 1, logits.device)
    return [
        Chunk(
            logits[s : s + rows],
            target[s : s + rows],
            None if groups is None else groups[s : s + rows],
            s,
        )
        for s in range(0, n, rows)
    ]


def default_workers(logits: Tensor) -> int:
    """Threads for an in-memory pass: torch's intra-op thread count on CPU, else 1."""
    if logits.device.type != "cpu" or (logits.dim() == 2 and logits.shape[1] > _CHUNK_ELEMENTS):
        return 1
    return max(1, torch.get_num_threads())


def log_bounds(t_min: float, t_max: float) -> tuple[float, float]:
    """``(lower, upper)`` bounds on ``u = log beta = -log T`` from bounds on T."""
    return -math.log(t_max), -math.log(t_min)
