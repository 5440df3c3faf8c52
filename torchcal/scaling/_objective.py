"""The temperature objective and its safeguarded Newton solver (the math lives only here).

With ``beta = 1 / T`` the multiclass negative log-likelihood of logits ``z`` is

    l(beta) = mean_i [ logsumexp_j(beta z_ij) - beta z_iy ]
    l'(beta) = mean_i [ E_p[z_i] - z_iy ],        l''(beta) = mean_i Var_p[z_i],

with ``p = softmax(beta z_i)`` (Guo et al., 2017, "On Calibration of Modern Neural
Networks"). For binary logits ``s`` and ``p = sigmoid(beta s)``:

    l(beta) = mean_i [ softplus(beta s_i) - y_i beta s_i ]
    l'(beta) = mean_i (p_i - y_i) s_i,            l''(beta) = mean_i p_i (1 - p_i) s_i^2.

``l`` is convex in ``beta``; we solve on ``u = log beta = -log T`` where

    dl/du = beta l'(beta),    d2l/du2 = beta l'(beta) + beta^2 l''(beta).

Every statistic is a sum over samples, so one pass over chunks of any size gives the loss,
the gradient and the curvature in float64 (O(chunk) memory), and the sums all-reduce under
``torch.distributed``. The solver is a 1-D Newton iteration on ``u`` safeguarded by a
bracket (the gradient's sign change) and a step cap, vectorised over groups so that
:class:`~torchcal.scaling.GroupTemperatureScaler` reuses it unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import Tensor

from torchcal.functional._validation import first_bad_position, values_checked

__all__ = ["Chunk", "STAT_FIELDS", "chunk_rows", "row_terms", "temperature_pass",
           "NewtonResult", "solve_log_beta", "all_reduce_", "distributed_active",
           "validate_labels", "validate_logits", "check_stats", "tensor_chunks",
           "default_workers", "log_bounds", "binary_nll"]

# Columns of the per-group statistics returned by ``temperature_pass``.
# ``misranked`` (rows whose target is not a row maximum; binary: a score on the wrong side of
# 0) does not depend on T and is only filled by identity passes: when it is 0 the set is
# perfectly separated (the NLL decreases all the way to T -> 0).
STAT_FIELDS = ("count", "loss", "dloss", "d2loss", "loss_identity", "misranked")
_N, _L, _D1, _D2, _L1, _W = range(6)

# Chunks stay below ATen's parallel grain sizes (32768 elements for element-wise ops, 2048
# for the MKL-VML exp/log): each op then runs single-threaded on a cache-resident chunk, with
# no OpenMP barrier per op (which costs milliseconds on an oversubscribed machine).
_CHUNK_ELEMENTS = (1 << 15) - 1
_MAX_ROWS = 2047
_LOG2E = 1.0 / math.log(2.0)
_MASK_FLOOR = -1e300  # finite stand-in for -inf masks: exp(beta * floor) == 0 exactly


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


def binary_nll(t: Tensor, y: Tensor) -> Tensor:
    """Per-sample ``softplus(t) - y t`` with an exact softplus (no identity cut-off at 20)."""
    return torch.relu(t) + torch.log1p(torch.exp(-t.abs())) - y * t


def row_terms(logits: Tensor, target: Tensor, beta: Tensor | float, *, binary: bool,
              identity: bool = False, state: dict | None = None) -> tuple[Tensor, ...]:
    """Per-sample NLL, d/dbeta and d2/dbeta2 in float64 at inverse temperature ``beta``.

    ``beta`` is a float, a float64 scalar or a per-row ``(n,)`` tensor. ``-inf`` logits are
    masks: probability 0 (multiclass) or, in the binary case with target 0, no contribution.
    With ``identity=True`` two more tensors follow: the per-sample NLL at ``beta = 1`` and a
    0/1 flag for rows whose target is not a row maximum (binary: score on the wrong side).
    ``state`` (a dict kept across the chunks of a pass) remembers that masks were seen.
    """
    if binary:
        y = target.to(torch.float64)
        # -inf (masked) with target 0 -> a finite floor: every term below is then exactly 0;
        # with target 1 it stays -inf, the loss is +inf and the pass reports the position
        z = logits.to(torch.float64)
        z = torch.where(y == 0, z.clamp(min=_MASK_FLOOR), z)
        t = z * beta
        # exact softplus: torch's F.softplus switches to the identity beyond t = 20
        loss = binary_nll(t, y)
        p = torch.sigmoid(t)
        d1 = (p - y) * z
        d2 = ((p * torch.sigmoid(-t)) * z) * z  # left to right: 0 * floor, never floor**2
        out: tuple[Tensor, ...] = (loss, d1, d2)
        if identity:
            wrong = ((y == 1) & (z < 0)) | ((y == 0) & (z > 0))
            out = out + (binary_nll(z, y), wrong.to(torch.float64))
        return out
    b = beta.unsqueeze(-1) if isinstance(beta, Tensor) and beta.dim() == 1 else beta
    m = logits.amax(dim=1).to(torch.float64)
    zy = logits.gather(1, target.unsqueeze(1)).squeeze(1).to(torch.float64)
    if logits.dtype == torch.float64:
        d = logits - m.unsqueeze(1)
    else:
        d = logits.to(torch.float64)  # a float64 copy of the chunk
        d.sub_(m.unsqueeze(1))
    scale = b * _LOG2E
    masked = state is not None and state.get("masked", False)
    for attempt in range(2):
        if masked:
            d.clamp_(min=_MASK_FLOOR)  # -inf masks -> a finite floor whose exp is exactly 0
        e = d * scale
        e.exp2_()  # exp via exp2: a serial kernel (exp_ would go to VML's threaded path)
        s0 = e.sum(1)
        e.mul_(d)
        s1 = e.sum(1)
        # a -inf mask gives 0 * -inf = NaN here: redo the chunk with the floor, and keep
        # flooring the following chunks of this pass (clean data never pays for the clamp)
        if masked or attempt == 1 or not bool(torch.isnan(s1).any()):
            break
        masked = True
        if state is not None:
            state["masked"] = True
    e.mul_(d)
    s2 = e.sum(1)
    gap = m - zy
    mean_d = s1 / s0
    loss = torch.log(s0) + beta * gap
    d1 = mean_d + gap
    d2 = (s2 / s0 - mean_d * mean_d).clamp_(min=0.0)
    if identity:
        e1 = (d * _LOG2E).exp2_()
        return loss, d1, d2, torch.log(e1.sum(1)) + gap, (gap > 0).to(torch.float64)
    return loss, d1, d2


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
                raise ValueError(f"target: expected binary labels in {{0, 1}}, got {val!r} at "
                                 f"position {_where(bad, chunk.offset)}")
    else:
        assert num_classes is not None
        bad = (y < 0) | (y >= num_classes)
        if bool(bad.any()):  # always checked: gather would fail with an opaque index error
            val = int(y[bad][0])
            raise ValueError(f"target: expected class indices in [0, {num_classes - 1}], got "
                             f"{val} at position {_where(bad, chunk.offset)}")


def validate_logits(chunk: Chunk, binary: bool) -> None:
    """NaN/+Inf logits and masked targets, with global positions.

    The passes do not run this (it would cost a sixth of a pass): a bad value makes the
    float64 sums non-finite, and only then is the data scanned again with this check to
    name the position (see :func:`check_stats`).
    """
    x, y = chunk.logits, chunk.target
    bad = torch.isnan(x) | torch.isposinf(x)
    if bool(bad.any()):
        raise ValueError(f"logits: expected finite values or -inf masks, found NaN or +Inf at "
                         f"position {_where(bad, chunk.offset)}")
    if binary:
        bad = torch.isneginf(x) & (y == 1)
        if bool(bad.any()):
            raise ValueError(f"logits: a -inf (masked) logit has target 1 at position "
                             f"{_where(bad, chunk.offset)}; its likelihood is 0")
    else:
        zy = x.gather(1, y.unsqueeze(1)).squeeze(1)
        bad = torch.isneginf(zy)
        if bool(bad.any()):
            raise ValueError(f"logits: the target class is masked (-inf) at row "
                             f"{_where(bad, chunk.offset)}; its likelihood is 0")


def check_stats(stats: Tensor, chunks: Callable[[], Iterable[Chunk]], binary: bool) -> None:
    """Raise a positioned error if a pass produced non-finite sums (NaN/+Inf/masked target)."""
    if bool(torch.isfinite(stats).all()):
        return
    for chunk in chunks():
        validate_logits(chunk, binary)
    raise ValueError("logits: the NLL is not finite: NaN or +Inf logits on another rank, or "
                     "logits whose differences overflow float64")


def distributed_active() -> bool:
    """True when ``torch.distributed`` is available and a process group is initialised."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def all_reduce_(stats: Tensor) -> Tensor:
    """Sum a small float64 tensor over all ranks in place (on the backend's device)."""
    dist = torch.distributed
    device = stats.device
    if dist.get_backend() == "nccl" and device.type != "cuda":
        buf = stats.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(buf)
        stats.copy_(buf.to(device))
    else:
        dist.all_reduce(stats)
    return stats


# A threaded pass hands the threads _WINDOW chunks at a time: bounded memory for the per-row
# group terms, and few live small tensors (thousands of them, interleaved with the freed chunk
# buffers, fragment the heap: +0.4x the logits of peak RSS at 100k x 1000). The calling thread
# adds the per-chunk sums in chunk order, _BLOCK at a time.
_WINDOW = 64
_BLOCK = 256


def _chunk_sums(chunk: Chunk, beta0: float, beta_g: Tensor, *, binary: bool,
                num_classes: int | None, identity: bool, check_labels: bool,
                state: dict) -> tuple[int, Tensor, Tensor | None]:
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
        terms = row_terms(chunk.logits, chunk.target, beta0, binary=binary, identity=identity,
                          state=state)
        return n, torch.stack(terms, 1).sum(0), None
    beta = beta_g.to(chunk.logits.device)[chunk.groups]
    terms = row_terms(chunk.logits, chunk.target, beta, binary=binary, identity=identity,
                      state=state)
    ones = torch.ones(n, dtype=torch.float64, device=chunk.logits.device)
    return n, torch.stack([ones, *terms], 1), chunk.groups


def temperature_pass(chunks: Iterable[Chunk], u: Tensor, *, binary: bool,
                     num_classes: int | None = None, num_groups: int = 1,
                     identity: bool = False, reduce: bool = False, workers: int = 1,
                     check_labels: bool = True) -> Tensor:
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

    def compute(chunk: Chunk) -> tuple[int, Tensor, Tensor | None]:
        return _chunk_sums(chunk, beta0, beta_g, binary=binary, num_classes=num_classes,
                           identity=identity, check_labels=check_labels, state=state)

    def run(pool: ThreadPoolExecutor | None) -> Tensor | None:
        if pool is None:
            parts: Iterable = map(compute, chunks)
        else:
            assert isinstance(chunks, list)
            # one task per worker and window: worker k takes every workers-th chunk of the
            # window; the results are put back in chunk order before they are added
            def share(part: list[Chunk]) -> list:
                return [compute(c) for c in part]

            def ordered() -> Iterator[tuple[int, Tensor, Tensor | None]]:
                for s in range(0, len(chunks), _WINDOW):
                    win = chunks[s:s + _WINDOW]
                    futures = [pool.submit(share, win[k::workers]) for k in range(workers)]
                    shares = [f.result() for f in futures]
                    for i in range(len(win)):
                        yield shares[i % workers][i // workers]

            parts = ordered()
        acc: Tensor | None = None
        count = 0
        block: list[Tensor] = []  # ungrouped column sums, added _BLOCK chunks at a time
        for n, sums, groups in parts:
            if acc is None:
                acc = torch.zeros(num_groups, len(STAT_FIELDS), dtype=torch.float64,
                                  device=sums.device)
            if groups is None:
                count += n
                block.append(sums)
                if len(block) == _BLOCK:
                    acc[0, 1:1 + sums.shape[0]] += torch.stack(block).sum(0)
                    block.clear()
            else:
                acc[:, :sums.shape[1]].index_add_(0, groups, sums)
        if acc is not None:
            if block:
                acc[0, 1:1 + block[0].shape[0]] += torch.stack(block).sum(0)
            acc[0, _N] += count
        return acc

    if workers > 1 and isinstance(chunks, list) and len(chunks) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            acc = run(pool)
    else:
        acc = run(None)
    stats = torch.zeros(num_groups, len(STAT_FIELDS), dtype=torch.float64)
    if acc is not None:
        stats += acc.cpu()
    if reduce:
        all_reduce_(stats)
    return stats


@dataclass
class NewtonResult:
    """Solution of :func:`solve_log_beta` (per group)."""

    u: Tensor           # log beta at the last evaluated point
    stats: Tensor       # (G, 6) sums at u
    grad: Tensor        # d(objective)/du per sample (penalty included), at u
    curv: Tensor        # d2(objective)/du2 per sample, at u
    converged: Tensor   # bool (G,)
    at_lower: Tensor    # stopped at the lower bound of u (T at its maximum)
    at_upper: Tensor    # stopped at the upper bound of u (T at its minimum)
    iterations: int     # Newton iterations (evaluations after the first)
    passes: int         # data passes
    identity_stats: Tensor | None = None


def _u_derivatives(stats: Tensor, u: Tensor, center: Tensor | None,
                   strength: float) -> tuple[Tensor, Tensor, Tensor]:
    """Objective, d/du and d2/du2 (sums) from the beta-derivative sums, with the prior."""
    beta = torch.exp(u)
    f = stats[:, _L].clone()
    g = beta * stats[:, _D1]
    h = g + beta * beta * stats[:, _D2]
    if center is not None and strength > 0:
        diff = u - center
        f = f + 0.5 * strength * diff * diff
        g = g + strength * diff
        h = h + strength
    return f, g, h


def solve_log_beta(evaluate: Callable[[Tensor, bool], Tensor], u0: Tensor, *,
                   lower: float, upper: float, grad_tol: float, step_tol: float,
                   max_iter: int, center: Tensor | None = None, strength: float = 0.0,
                   identity_first: bool = False, max_step: float = 2.0,
                   detect_separation: bool = True) -> NewtonResult:
    """Safeguarded Newton on ``u = log beta`` in ``[lower, upper]``, vectorised over groups.

    ``evaluate(u, identity)`` returns the ``(G, 5)`` sums of one pass. The objective per group
    is the summed NLL plus ``strength / 2 * (u - center)**2``. A group stops when
    ``|grad| / count <= grad_tol`` or the Newton step ``|grad / curv| <= step_tol`` (both at
    the evaluated point, which is the one returned), or when it sits on a bound with the
    gradient pointing outwards. Newton steps are capped at ``max_step`` and replaced by
    bisection of the bracket when they leave it; the NLL is unimodal in ``u`` (convex in
    ``beta``), so the bracket always holds the optimum.

    With ``identity_first`` and ``detect_separation``, a group without prior whose set is
    perfectly separated (``misranked == 0``: its NLL decreases all the way to ``T -> 0``, but
    its gradient underflows below any tolerance at a finite, arbitrary T) goes straight to
    the upper bound of ``u`` (``at_upper``), if its NLL there is below the NLL at ``T = 1``
    (else every row is constant: the NLL does not depend on T, the group stays where it is).
    """
    u = u0.to(torch.float64).clone().clamp_(lower, upper)
    G = u.shape[0]
    lo = torch.full((G,), lower, dtype=torch.float64)
    hi = torch.full((G,), upper, dtype=torch.float64)
    lo_eval = torch.zeros(G, dtype=torch.bool)  # lo is an evaluated point (not a bound)
    hi_eval = torch.zeros(G, dtype=torch.bool)
    done = torch.zeros(G, dtype=torch.bool)
    converged = torch.zeros(G, dtype=torch.bool)
    at_lower = torch.zeros(G, dtype=torch.bool)
    at_upper = torch.zeros(G, dtype=torch.bool)
    stats = evaluate(u, identity_first)
    identity_stats = stats[:, _L1].clone() if identity_first else None
    passes, iterations = 1, 0
    free = torch.full((G,), center is None or strength == 0, dtype=torch.bool)
    sep = free & (stats[:, _W] == 0) & (stats[:, _N] > 0)
    if identity_first and detect_separation and bool(sep.any()):
        u_try = torch.where(sep, torch.full_like(u, upper), u)
        at_bound = evaluate(u_try, False)
        passes += 1
        lower_there = sep & (at_bound[:, _L] < stats[:, _L1])  # below the NLL at T = 1
        stats = torch.where(lower_there.unsqueeze(1), at_bound, stats)
        u = torch.where(lower_there, u_try, u)
        at_upper |= lower_there
        done |= lower_there
    while True:
        _, g, h = _u_derivatives(stats, u, center, strength)
        count = stats[:, _N].clamp(min=1.0)
        small_grad = g.abs() / count <= grad_tol
        small_step = (h > 0) & ((g / h).abs() <= step_tol)
        newly = ~done & (small_grad | small_step)
        converged |= newly
        done |= newly
        # on a bound, with the gradient pushing outwards: the optimum is beyond the bound
        out_lo = ~done & (u <= lower) & (g > 0)
        out_hi = ~done & (u >= upper) & (g < 0)
        at_lower |= out_lo
        at_upper |= out_hi
        done |= out_lo | out_hi
        if bool(done.all()) or iterations >= max_iter:
            break
        # shrink the bracket with the sign of the gradient at u
        pos = ~done & (g > 0)
        neg = ~done & (g < 0)
        hi = torch.where(pos, u, hi)
        hi_eval |= pos
        lo = torch.where(neg, u, lo)
        lo_eval |= neg
        step = torch.where(h > 0, -g / h.clamp(min=1e-300), -torch.sign(g) * max_step)
        step = step.clamp(-max_step, max_step)
        un = u + step
        below, above = un <= lo, un >= hi
        mid = 0.5 * (lo + hi)
        un = torch.where(below, torch.where(lo_eval, mid, lo), un)
        un = torch.where(above, torch.where(hi_eval, mid, hi), un)
        # tiny brackets: converged to the bracket's resolution
        tight = ~done & lo_eval & hi_eval & ((hi - lo) <= step_tol)
        converged |= tight
        done |= tight
        u = torch.where(done, u, un)
        if bool(done.all()):
            break
        stats = evaluate(u, False)
        passes += 1
        iterations += 1
    _, g, h = _u_derivatives(stats, u, center, strength)
    count = stats[:, _N].clamp(min=1.0)
    return NewtonResult(u=u, stats=stats, grad=g / count, curv=h / count, converged=converged,
                        at_lower=at_lower, at_upper=at_upper, iterations=iterations,
                        passes=passes, identity_stats=identity_stats)


def tensor_chunks(logits: Tensor, target: Tensor, groups: Tensor | None = None,
                  rows: int | None = None) -> list[Chunk]:
    """Row slices (views, no copies) of in-memory data as :class:`Chunk` s."""
    n = target.shape[0]
    if rows is None:
        rows = chunk_rows(logits.shape[1] if logits.dim() == 2 else 1, logits.device)
    return [Chunk(logits[s:s + rows], target[s:s + rows],
                  None if groups is None else groups[s:s + rows], s) for s in range(0, n, rows)]


def default_workers(logits: Tensor) -> int:
    """Threads for an in-memory pass: torch's intra-op thread count on CPU, else 1."""
    if logits.device.type != "cpu" or (logits.dim() == 2 and logits.shape[1] > _CHUNK_ELEMENTS):
        return 1
    return max(1, torch.get_num_threads())


def log_bounds(t_min: float, t_max: float) -> tuple[float, float]:
    """``(lower, upper)`` bounds on ``u = log beta = -log T`` from bounds on T."""
    return -math.log(t_max), -math.log(t_min)
