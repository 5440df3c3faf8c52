"""Pieces of :class:`~torchcal.scaling.TemperatureScaler`'s fit: streamed chunks, the LBFGS
solve judged by Newton's tests, and the warnings for a degenerate solve."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

from torchcal.scaling import _objective as obj
from torchcal.scaling._base import as_binary_vector, check_logits_target
from torchcal.scaling._solvers import lbfgs


def degenerate_messages(
    res: obj.LogBetaResult, bounds: tuple[float, float], what: str = "T"
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


def stream_chunks(batches: Iterable, kind: dict[str, Any]) -> Iterator[obj.Chunk]:
    """Cache-sized :class:`Chunk` views of ``(logits, target)`` pairs with global offsets;
    ``kind`` (kept across passes) holds the first pair's kind, which every pair must share."""
    offset = 0
    for item in batches:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError("batches: expected (logits, target) pairs")
        lg, tg, _ = as_binary_vector(*item)
        binary = check_logits_target(lg, tg)
        c = None if binary else lg.shape[1]
        if "binary" not in kind:
            kind["binary"], kind["classes"] = binary, c
        elif kind["binary"] != binary or kind["classes"] != c:
            raise ValueError(
                f"batches: every chunk must have the same kind and number "
                f"of classes; got shape {tuple(lg.shape)} after "
                f"{'binary' if kind['binary'] else kind['classes']}"
            )
        lg = lg.detach()
        tg = tg.detach().to(lg.device)
        if not binary:
            tg = tg.long()
        for piece in obj.tensor_chunks(lg, tg):  # cache-sized slices, no copies
            piece.offset += offset
            yield piece
        offset += tg.shape[0]


def solve_lbfgs(
    evaluate: Callable[[Tensor, bool], Tensor],
    lo: float,
    hi: float,
    u0: Tensor,
    *,
    max_iter: int,
    grad_tol: float,
    step_tol: float,
) -> tuple[obj.LogBetaResult, float]:
    """:func:`~torchcal.scaling._solvers.lbfgs` on ``log T = -u`` within the bounds, over
    the same float64 sums as Newton, judged by the same tests at the returned point; returns
    that result and the mean NLL at ``T = 1``.

    A perfectly separated set goes to ``t_min`` at once (see
    :func:`~torchcal.scaling._objective.solve_log_beta`). LBFGS's last point is not always
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
        f, g, h = obj.u_derivatives(stats_at(u), torch.tensor([u], dtype=torch.float64))
        return float(f[0]) / n, float(g[0]) / n, float(h[0]) / n

    start = min(max(float(u0[0]), lo), hi)
    first = stats_at(start, True)
    n = float(first[0, obj.COUNT])
    if n == 0:
        raise ValueError("batches: every rank's shard is empty")
    nll_before = float(first[0, obj.LOSS_IDENTITY]) / n

    def on_log_t(log_t: Tensor) -> tuple[Tensor, Tensor]:
        f, g, _ = derivatives(-float(log_t))
        return torch.tensor(f, dtype=torch.float64), torch.tensor(-g, dtype=torch.float64)

    separated = float(first[0, obj.MISRANKED]) == 0 and float(stats_at(hi)[0, obj.LOSS]) < float(
        first[0, obj.LOSS]
    )
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
    loss = {v: float(st[0, obj.LOSS]) / n for v, st in cache.items()}
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
) -> obj.LogBetaResult:
    """The LBFGS point judged by Newton's tests (bounds, gradient, Newton step)."""
    ut = torch.tensor([u], dtype=torch.float64)
    _, g, h = obj.u_derivatives(stats, ut)
    g, h = g / n, h / n
    at_lower = (ut <= lo) & (g > 0)
    at_upper = ((ut >= hi) & (g < 0)) | torch.tensor([separated])
    converged = ~(at_lower | at_upper) & (
        (g.abs() <= grad_tol) | ((h > 0) & ((g / h).abs() <= step_tol))
    )
    return obj.LogBetaResult(
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
