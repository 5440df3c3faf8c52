"""Temperature scaling's fit: :func:`fit_temperature`, and the float64 passes it is made of.

The formula (per-sample NLL and its derivatives in ``beta = 1 / T``) is
:func:`torchcal.functional.recalibration.temperature_terms`; this module runs it over chunks of
any size in one pass (O(chunk) memory), adds the per-chunk sums in a fixed order (the result is
bit-identical for any number of threads), all-reduces them under ``torch.distributed``, names
the position of a bad value, and solves for ``u = log beta = -log T``: by the bracketed Newton
of :mod:`torchcal.functional._solvers`, vectorised over groups so that
:class:`~torchcal.scaling.GroupTemperatureScaler` reuses it unchanged, or by LBFGS judged by
Newton's tests (``docs/design.md`` section 4). :class:`~torchcal.scaling.TemperatureScaler`
is a shell over :func:`fit_temperature` (in memory) and :func:`solve_temperature` (streamed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional._checks import first_bad_position, values_checked
from torchcal.functional._solvers import bracketed_newton, lbfgs
from torchcal.functional.recalibration import log_beta_derivatives, temperature_terms
from torchcal.functional.shrinkage import empirical_bayes_shrinkage

__all__ = [
    "Chunk",
    "STAT_FIELDS",
    "TemperatureSums",
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
    "degenerate_messages",
    "solve_lbfgs",
    "flattest_near_min",
    "judge",
    "SUBSAMPLE_ELEMENTS",
    "TemperatureSolution",
    "solve_temperature",
    "warm_start",
    "fit_temperature",
    "GroupSolution",
    "fit_group_temperatures",
]

# Columns of the per-group statistics returned by ``temperature_pass``.
# ``misranked`` (rows whose target is not a row maximum; binary: a score on the wrong side of
# 0) does not depend on T and is only filled by identity passes: when it is 0 the set is
# perfectly separated (the NLL decreases all the way to T -> 0).


class TemperatureSums(NamedTuple):
    """The sums of one pass, per group (each ``(G,)`` float64): the rows (``rows``), the NLL
    and its first two derivatives in ``u = log beta`` (``loss``, ``dloss``, ``d2loss``), the
    NLL at ``T = 1`` (``loss_identity``) and the misranked rows (``misranked``).

    A pass returns them stacked as one ``(G, 6)`` tensor (one all-reduce under DDP);
    :meth:`of` names its columns (views: an in-place update of a field updates the tensor).

    Example:
        >>> import torch
        >>> stats = torch.tensor([[4.0, 2.5, -0.5, 1.0, 2.8, 1.0]], dtype=torch.float64)
        >>> sums = TemperatureSums.of(stats)
        >>> float(sums.loss[0] / sums.rows[0])
        0.625
    """

    rows: Tensor
    loss: Tensor
    dloss: Tensor
    d2loss: Tensor
    loss_identity: Tensor
    misranked: Tensor

    @classmethod
    def of(cls, stats: Tensor) -> TemperatureSums:
        """The named columns of a pass's ``(G, 6)`` sums."""
        return cls(*stats.unbind(1))


STAT_FIELDS = TemperatureSums._fields

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
        TemperatureSums.of(acc).rows[0] += count
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
    sums = TemperatureSums.of(stats)
    return log_beta_derivatives(sums.loss, sums.dloss, sums.d2loss, u, center, strength)


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
    first = TemperatureSums.of(stats)
    identity_stats = first.loss_identity.clone() if identity_first else None
    passes = 1
    free = torch.full((G,), center is None or strength == 0, dtype=torch.bool)
    sep = free & (first.misranked == 0) & (first.rows > 0)
    if identity_first and detect_separation and bool(sep.any()):
        u_try = torch.where(sep, torch.full_like(u, upper), u)
        at_bound = evaluate(u_try, False)
        passes += 1
        # below the NLL at T = 1
        lower_there = sep & (TemperatureSums.of(at_bound).loss < first.loss_identity)
        stats = torch.where(lower_there.unsqueeze(1), at_bound, stats)
        u = torch.where(lower_there, u_try, u)
        done |= lower_there

    def derivatives(u: Tensor, stats: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        _, g, h = u_derivatives(stats, u, center, strength)
        return stats, g, h, TemperatureSums.of(stats).rows

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


# ----------------------------------------------------------------------------- LBFGS
def degenerate_messages(
    res: LogBetaResult, bounds: tuple[float, float], what: str = "T"
) -> list[str]:
    """Warnings for a solve that stopped on a bound or at the iteration cap."""
    msgs = []
    if bool(res.at_lower.any()):
        msgs.append(
            f"{what}: the NLL keeps decreasing as T grows (logits no better than "
            f"uniform, or nearly); T is bounded at t_max={bounds[1]:g}"
        )
    if bool(res.at_upper.any()):
        msgs.append(
            f"{what}: the NLL keeps decreasing as T shrinks (a perfectly separated "
            f"set, or nearly); T is bounded at t_min={bounds[0]:g}"
        )
    stuck = ~(res.converged | res.at_lower | res.at_upper)
    if bool(stuck.any()):
        msgs.append(
            f"{what}: stopped (max_iter, or no progress left at float64 resolution) "
            f"before the tolerance was met (|grad| = {float(res.grad.abs().max()):.3g})"
        )
    return msgs


def solve_lbfgs(
    evaluate: Callable[[Tensor, bool], Tensor],
    lo: float,
    hi: float,
    u0: Tensor,
    *,
    max_iter: int,
    grad_tol: float,
    step_tol: float,
) -> tuple[LogBetaResult, float]:
    """:func:`~torchcal.functional._solvers.lbfgs` on ``log T = -u`` within the bounds, over
    the same float64 sums as Newton, judged by the same tests at the returned point; returns
    that result and the mean NLL at ``T = 1``.

    A perfectly separated set goes to ``t_min`` at once (see
    :func:`solve_log_beta`). LBFGS's last point is not always
    its best: near the optimum the NLL is flat to a few ulps, its line search rejects
    steps on rounding noise and the final point can sit further out than one already
    evaluated. Among the evaluated points whose NLL is within rounding of the lowest, the
    one with the smallest gradient is returned (the gradient sums stay accurate where the
    NLL is flat).
    """
    cache: dict[float, Tensor] = {}  # u -> sums: LBFGS re-evaluates points; passes = len

    def stats_at(u: float, identity: bool = False) -> Tensor:
        if u not in cache:
            cache[u] = evaluate(torch.tensor([u], dtype=torch.float64), identity)
        return cache[u]

    def derivatives(u: float) -> tuple[float, float, float]:
        """Mean NLL, d/du and d2/du2 at ``u``."""
        f, g, h = u_derivatives(stats_at(u), torch.tensor([u], dtype=torch.float64))
        return float(f[0]) / n, float(g[0]) / n, float(h[0]) / n

    start = min(max(float(u0[0]), lo), hi)
    first = stats_at(start, True)
    n = float(TemperatureSums.of(first).rows[0])
    if n == 0:
        raise ValueError("batches: every rank's shard is empty")
    nll_before = float(TemperatureSums.of(first).loss_identity[0]) / n

    def on_log_t(log_t: Tensor) -> tuple[Tensor, Tensor]:
        f, g, _ = derivatives(-float(log_t))
        return torch.tensor(f, dtype=torch.float64), torch.tensor(-g, dtype=torch.float64)

    separated = float(TemperatureSums.of(first).misranked[0]) == 0 and float(
        TemperatureSums.of(stats_at(hi)).loss[0]
    ) < float(TemperatureSums.of(first).loss[0])
    iterations = 0
    if separated:
        u = hi
    else:
        run = lbfgs(
            on_log_t,
            torch.full((), -start, dtype=torch.float64),
            max_iter=max_iter,
            grad_tol=grad_tol,
            history_size=10,
            lower=torch.tensor(-hi, dtype=torch.float64),
            upper=torch.tensor(-lo, dtype=torch.float64),
            curvature=lambda x: torch.tensor(derivatives(-float(x))[2], dtype=torch.float64),
        )
        iterations = run.iterations
        if run.on_bound:
            u = -float(run.x)
        else:
            u = flattest_near_min(cache, n, lambda v: derivatives(v)[1])
    res = judge(
        u,
        stats_at(u),
        n,
        lo,
        hi,
        separated,
        iterations,
        len(cache),
        grad_tol=grad_tol,
        step_tol=step_tol,
    )
    return res, nll_before


def flattest_near_min(
    cache: dict[float, Tensor], n: float, grad: Callable[[float], float]
) -> float:
    """Among the evaluated points (``u -> sums`` over ``n`` samples) whose mean NLL is within
    rounding of the lowest, the one with the smallest ``|grad(u)|``."""
    loss = {v: float(TemperatureSums.of(st).loss[0]) / n for v, st in cache.items()}
    f_min = min(loss.values())
    near = [v for v in cache if loss[v] <= f_min + 8e-16 * max(1.0, abs(f_min))]
    return min(near, key=lambda v: abs(grad(v)))


def judge(
    u: float,
    stats: Tensor,
    n: float,
    lo: float,
    hi: float,
    separated: bool,
    iterations: int,
    passes: int,
    *,
    grad_tol: float,
    step_tol: float,
) -> LogBetaResult:
    """The LBFGS point judged by Newton's tests (bounds, gradient, Newton step)."""
    ut = torch.tensor([u], dtype=torch.float64)
    _, g, h = u_derivatives(stats, ut)
    g, h = g / n, h / n
    at_lower = (ut <= lo) & (g > 0)
    at_upper = ((ut >= hi) & (g < 0)) | torch.tensor([separated])
    converged = ~(at_lower | at_upper) & (
        (g.abs() <= grad_tol) | ((h > 0) & ((g / h).abs() <= step_tol))
    )
    return LogBetaResult(
        u=ut,
        stats=stats,
        grad=g,
        curv=h,
        converged=converged,
        at_lower=at_lower,
        at_upper=at_upper,
        iterations=iterations,
        passes=passes,
    )


# ----------------------------------------------------------------------------- the fit
# Above this many logits the in-memory fit first solves on strided subsamples (1/64, then 1/8
# of the rows), so that the full passes start within ~1e-2 of the optimum.
SUBSAMPLE_ELEMENTS = 1 << 24


class TemperatureSolution(NamedTuple):
    """What :func:`fit_temperature` / :func:`solve_temperature` found (nothing is stored or
    warned here: the scaler stores ``log_temperature`` and issues ``messages``)."""

    log_temperature: float  # log T at the returned point
    nll_before: float  # mean NLL at T = 1
    nll_after: float  # mean NLL at the returned T
    grad_norm: float  # |d mean NLL / d log T| there
    iterations: int
    converged: bool
    messages: tuple[str, ...]  # why it did not converge (bounds, cap, a flat NLL)
    passes: int  # objective evaluations, each one pass over the data (or a subsample)
    method: str


def solve_temperature(
    chunks: Callable[[], Iterable[Chunk]],
    binary: bool,
    num_classes: int | None,
    u0: Tensor,
    *,
    bounds: tuple[float, float],
    method: str,
    grad_tol: float,
    step_tol: float,
    max_iter: int,
    reduce: bool = False,
    workers: int = 1,
    pre_passes: int = 0,
    check_labels: bool = True,
) -> TemperatureSolution:
    """The temperature minimising the mean NLL of the chunks ``chunks()`` (re-iterable: one
    pass per evaluation), from ``u0 = log beta`` (``(1,)``), by ``method`` (``"lbfgs"`` or
    ``"newton"``) within ``bounds`` on T; ``reduce=True`` all-reduces every pass's sums."""
    lo, hi = log_bounds(*bounds)

    def evaluate(u: Tensor, identity: bool) -> Tensor:
        stats = temperature_pass(
            chunks(),
            u,
            binary=binary,
            num_classes=num_classes,
            identity=identity,
            reduce=reduce,
            workers=workers,
            check_labels=check_labels,
        )
        check_stats(stats, chunks, binary)
        return stats

    if method == "lbfgs":
        res, nll_before = solve_lbfgs(
            evaluate, lo, hi, u0, max_iter=max_iter, grad_tol=grad_tol, step_tol=step_tol
        )
    else:
        res = solve_log_beta(
            evaluate,
            u0,
            lower=lo,
            upper=hi,
            grad_tol=grad_tol,
            step_tol=step_tol,
            max_iter=max_iter,
            identity_first=True,
        )
        n = float(TemperatureSums.of(res.stats).rows[0])
        if n == 0:
            raise ValueError("batches: every rank's shard is empty")
        assert res.identity_stats is not None
        nll_before = float(res.identity_stats[0]) / n
    msgs = degenerate_messages(res, bounds)
    converged = bool(res.converged[0])
    sums = TemperatureSums.of(res.stats)
    # zero curvature inside the bounds: Var_p[z] = 0 in every row, i.e. every row's logits
    # are equal (no better than uniform at any T): the NLL does not depend on T
    if not msgs and float(sums.d2loss[0]) == 0.0:
        converged = False
        msgs.append(
            f"T: the NLL does not depend on T (every row's logits are equal: no "
            f"better than uniform); T is left at {math.exp(-float(res.u[0])):g}"
        )
    return TemperatureSolution(
        log_temperature=-float(res.u[0]),
        nll_before=nll_before,
        nll_after=float(sums.loss[0]) / float(sums.rows[0]),
        grad_norm=abs(float(res.grad[0])),
        iterations=res.iterations,
        converged=converged,
        messages=tuple(msgs),
        passes=res.passes + pre_passes,
        method="lbfgs" if method == "lbfgs" else "newton",
    )


def warm_start(
    logits: Tensor,
    target: Tensor,
    full: list[Chunk],
    binary: bool,
    num_classes: int | None,
    *,
    bounds: tuple[float, float],
    max_iter: int,
    distributed: bool,
    workers: int,
) -> tuple[Tensor, int]:
    """Start point ``u0 = log beta`` of the full fit and the passes spent finding it.

    Above :data:`SUBSAMPLE_ELEMENTS` logits (over all ranks): a warm start on every 64th,
    then every 8th row, each only to the accuracy its sampling error allows; the full
    passes then start within ~1e-2 in log T. Else ``u0 = 0`` (``T = 1``).
    """
    u0 = torch.zeros(1, dtype=torch.float64)
    numel = torch.tensor([float(logits.numel())], dtype=torch.float64)
    if distributed:
        all_reduce_(numel)
    pre_passes = 0
    if float(numel) > SUBSAMPLE_ELEMENTS:
        lo, hi = log_bounds(*bounds)
        for stride, tol in ((64, 1e-2), (8, 1e-3)):
            sub = tensor_chunks(logits[::stride], target[::stride])

            def sub_eval(u: Tensor, identity: bool, sub: list = sub) -> Tensor:
                stats = temperature_pass(
                    sub,
                    u,
                    binary=binary,
                    num_classes=num_classes,
                    identity=identity,
                    reduce=distributed,
                    workers=workers,
                    check_labels=False,
                )
                check_stats(stats, lambda: full, binary)
                return stats

            warm = solve_log_beta(
                sub_eval,
                u0,
                lower=lo,
                upper=hi,
                grad_tol=1e-8,
                step_tol=tol,
                max_iter=max_iter,
                detect_separation=False,
            )
            u0 = warm.u
            pre_passes += warm.passes
    return u0, pre_passes


def fit_temperature(
    logits: Tensor,
    target: Tensor,
    *,
    bounds: tuple[float, float] = (1e-3, 1e3),
    method: str = "lbfgs",
    grad_tol: float = 1e-10,
    step_tol: float = 1e-8,
    max_iter: int = 100,
    distributed: bool = False,
) -> TemperatureSolution:
    """The temperature ``T`` minimising the mean NLL of ``softmax(logits / T)`` (multiclass
    ``(N, C)`` logits, class indices) or ``sigmoid(logits / T)`` (binary ``(N,)``, 0/1).

    Shapes are those :class:`~torchcal.scaling.TemperatureScaler` checks (it is the shell of
    this function: its docstring describes the solvers, the degenerate sets and the
    invariances); label ranges and non-finite logits are checked here, with positions.
    ``distributed=True`` all-reduces the sums (every rank calls it with its shard). Above
    :data:`SUBSAMPLE_ELEMENTS` logits the solve starts from a warm start on subsamples.

    Example:
        >>> import torch
        >>> from torchcal.functional.temperature import fit_temperature
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 4 * torch.randn(2000, 10, generator=g)
        >>> y = torch.multinomial(torch.softmax(z / 4, 1), 1, generator=g).squeeze(1)
        >>> sol = fit_temperature(z, y)
        >>> abs(math.exp(sol.log_temperature) - 4) < 0.3, sol.converged
        (True, True)
    """
    check_distributed(distributed)
    binary = logits.dim() == 1
    logits = logits.detach()
    target = target.detach().to(logits.device)
    if not binary:
        target = target.long()
    num_classes = None if binary else logits.shape[1]
    workers = default_workers(logits)
    with torch.inference_mode(False), torch.no_grad():
        # labels once, up front (O(N)); logits only if a pass comes out non-finite
        validate_labels(Chunk(logits, target), binary, num_classes)
        full = tensor_chunks(logits, target)
        u0, pre_passes = warm_start(
            logits,
            target,
            full,
            binary,
            num_classes,
            bounds=bounds,
            max_iter=max_iter,
            distributed=distributed,
            workers=workers,
        )
        return solve_temperature(
            lambda: full,
            binary,
            num_classes,
            u0,
            bounds=bounds,
            method=method,
            grad_tol=grad_tol,
            step_tol=step_tol,
            max_iter=max_iter,
            reduce=distributed,
            workers=workers,
            pre_passes=pre_passes,
            check_labels=False,
        )


# ----------------------------------------------------------------------------- per group
class GroupSolution(NamedTuple):
    """What :func:`fit_group_temperatures` found (``G`` groups)."""

    log_temperatures: Tensor  # (G,) log T_g
    global_solution: TemperatureSolution  # the global fit (method "newton")
    nll_before: float  # mean NLL at T = 1, all groups
    nll_after: float  # mean NLL at the T_g, all groups
    grad_norm: float  # L2 norm over the groups of d objective / d log beta_g (per sample)
    iterations: int
    converged: bool  # every group and the global fit
    messages: tuple[str, ...]  # the groups' (the global fit's are in global_solution)
    passes: int  # the global fit's and the groups'
    raw_log_temperatures: Tensor | None  # empirical Bayes: the unshrunk log T_g
    shrinkage_weights: Tensor | None  # empirical Bayes: (G,) weights in [0, 1)
    between_group_variance: float | None  # empirical Bayes: tau^2 of log T


def fit_group_temperatures(
    logits: Tensor,
    target: Tensor,
    groups: Tensor,
    num_groups: int,
    *,
    shrinkage: float | str,
    bounds: tuple[float, float] = (1e-3, 1e3),
    grad_tol: float = 1e-10,
    step_tol: float = 1e-8,
    max_iter: int = 100,
) -> GroupSolution:
    """The global temperature (:func:`fit_temperature`, Newton) and one ``T_g`` per group
    (``groups`` checked ids in ``[0, num_groups)``), each minimising its group's summed NLL
    plus ``shrinkage / 2 * (log T_g - log T)^2``, all groups at once; or, with
    ``shrinkage="empirical_bayes"``, the unpenalised ``log T_g`` shrunk toward ``log T`` by
    :func:`~torchcal.functional.shrinkage.empirical_bayes_shrinkage` with the curvature of
    each group's NLL as precision (see :class:`~torchcal.scaling.GroupTemperatureScaler`,
    the shell).

    Example:
        >>> import torch
        >>> from torchcal.functional.temperature import fit_group_temperatures
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(4000, 5, generator=g)
        >>> grp = torch.arange(4000) % 2
        >>> t_true = torch.tensor([1.5, 4.0])[grp].unsqueeze(1)
        >>> y = torch.multinomial(torch.softmax(z / t_true, 1), 1, generator=g).squeeze(1)
        >>> sol = fit_group_temperatures(z, y, grp, 2, shrinkage=0.0)
        >>> [round(t, 1) for t in sol.log_temperatures.exp().tolist()]
        [1.5, 4.1]
    """
    binary = logits.dim() == 1
    logits = logits.detach()
    target = target.detach().to(logits.device)
    if not binary:
        target = target.long()
    sol_g = fit_temperature(
        logits,
        target,
        bounds=bounds,
        grad_tol=grad_tol,
        step_tol=step_tol,
        max_iter=max_iter,
        method="newton",
    )
    t_global = math.exp(sol_g.log_temperature)  # as a scaler stores and reads it
    u_global = -math.log(t_global)
    num_classes = None if binary else logits.shape[1]
    eb = shrinkage == "empirical_bayes"
    chunks = tensor_chunks(logits, target, groups)
    workers = default_workers(logits)

    def evaluate(u: Tensor, identity: bool) -> Tensor:
        stats = temperature_pass(
            chunks,
            u,
            binary=binary,
            num_classes=num_classes,
            num_groups=num_groups,
            identity=identity,
            workers=workers,
            check_labels=False,
        )
        check_stats(stats, lambda: chunks, binary)
        return stats

    center = torch.full((num_groups,), u_global, dtype=torch.float64)
    lo, hi = log_bounds(*bounds)
    res = solve_log_beta(
        evaluate,
        center.clone(),
        lower=lo,
        upper=hi,
        grad_tol=grad_tol,
        step_tol=step_tol,
        max_iter=max_iter,
        center=center,
        strength=0.0 if eb else float(shrinkage),
        identity_first=True,
    )
    raw_u = weights = tau2 = None
    if eb:
        raw_u = res.u
        _, _, curv = u_derivatives(res.stats, res.u)  # summed NLL's d2/du2 per group
        informative = (TemperatureSums.of(res.stats).rows > 0) & ~(res.at_lower | res.at_upper)
        info = torch.where(informative, curv.clamp(min=0.0), torch.zeros_like(curv))
        u, weights, tau2 = empirical_bayes_shrinkage(res.u, info, u_global)
        stats = evaluate(u, False)
        _, grad, curv_u = u_derivatives(stats, u)
        no = torch.zeros_like(res.converged)
        res = LogBetaResult(
            u=u,
            stats=stats,
            grad=grad,
            curv=curv_u,
            converged=res.converged | res.at_lower | res.at_upper,
            at_lower=no,
            at_upper=no,
            iterations=res.iterations,
            passes=res.passes + 1,
            identity_stats=res.identity_stats,
        )
    msgs = []
    empty = torch.nonzero(TemperatureSums.of(res.stats).rows == 0).flatten().tolist()
    if empty:
        msgs.append(f"groups: no samples in group(s) {empty}; they use the global T")
    if not eb:  # shrunk groups leave no bound: a raw fit on a bound gets the global T
        msgs += degenerate_messages(res, bounds, what="T_g")
    n = float(TemperatureSums.of(res.stats).rows.sum())
    assert res.identity_stats is not None
    return GroupSolution(
        log_temperatures=-res.u,
        global_solution=sol_g,
        nll_before=float(res.identity_stats.sum()) / n,
        nll_after=float(TemperatureSums.of(res.stats).loss.sum()) / n,
        grad_norm=float(torch.linalg.vector_norm(res.grad)),
        iterations=res.iterations,
        converged=bool(res.converged.all()) and sol_g.converged,
        messages=tuple(msgs),
        passes=res.passes + sol_g.passes,
        raw_log_temperatures=None if raw_u is None else -raw_u,
        shrinkage_weights=weights,
        between_group_variance=None if tau2 is None else float(tau2),
    )
