"""Solving for ``u = log beta = -log T`` over a pass's sums (docs/design.md section 4).

:func:`solve_log_beta`: the bracketed Newton of :mod:`torchcal.functional._solvers`,
vectorised over groups (the per-group fit reuses it unchanged); :func:`solve_lbfgs`: LBFGS on
``log T``, judged by Newton's tests (:func:`judge`); :func:`degenerate_messages`: why a solve
stopped on a bound or at the cap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from torchcal.functional._solvers import bracketed_newton, lbfgs
from torchcal.functional.recalibration import log_beta_derivatives
from torchcal.functional.temperature.sums import TemperatureSums


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
