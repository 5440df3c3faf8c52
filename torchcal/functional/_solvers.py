"""The solvers every calibrator's ``fit`` calls (the objectives live in
:mod:`torchcal.functional.recalibration`).

- :func:`bracketed_newton`: a safeguarded 1-D Newton iteration, vectorised over independent
  problems (the temperature, one per group), kept inside a bracket of the optimum. Its
  evaluations are sums, so it streams and all-reduces (``docs/design.md`` section 4).
- :func:`damped_newton`: a bounded (projected), damped Newton method for a small coupled problem
  (Platt's ``(a, b)``, vector and matrix scaling up to 256 parameters): exact Hessian, Armijo
  backtracking, a steepest-descent step where the Newton system fails.
- :func:`lbfgs`: ``torch.optim.LBFGS`` with a strong-Wolfe line search, optionally inside box
  bounds (the in-memory temperature fit; affine maps with many parameters).

Why two Newton methods: a temperature is a 1-D convex problem per group whose gradient sign
brackets the optimum (bisection is a free safeguard and the groups run in one pass each); the
affine and Platt problems are coupled in several dimensions and need a line search instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


# ----------------------------------------------------------------------------- 1-D, bracketed
@dataclass
class BracketedResult:
    """Solution of :func:`bracketed_newton` (per problem)."""

    u: Tensor  # the last evaluated point
    payload: object  # what ``evaluate`` returned with the derivatives at u
    grad: Tensor  # d(objective)/du per sample, at u
    curv: Tensor  # d2(objective)/du2 per sample, at u
    converged: Tensor  # bool
    at_lower: Tensor  # stopped on the lower bound, the gradient pointing outwards
    at_upper: Tensor  # stopped on the upper bound, the gradient pointing outwards
    iterations: int  # Newton iterations (evaluations after the first)


Evaluation = tuple[object, Tensor, Tensor, Tensor]  # (payload, grad sums, curvature sums, count)


def _safeguarded_step(
    u: Tensor,
    g: Tensor,
    h: Tensor,
    lo: Tensor,
    hi: Tensor,
    lo_eval: Tensor,
    hi_eval: Tensor,
    max_step: float,
) -> Tensor:
    """The Newton step capped at ``max_step``; where it leaves the bracket ``[lo, hi]``, the
    bracket's midpoint (or the bound itself while that side is not an evaluated point)."""
    step = torch.where(h > 0, -g / h.clamp(min=1e-300), -torch.sign(g) * max_step)
    step = step.clamp(-max_step, max_step)
    un = u + step
    below, above = un <= lo, un >= hi
    mid = 0.5 * (lo + hi)
    un = torch.where(below, torch.where(lo_eval, mid, lo), un)
    return torch.where(above, torch.where(hi_eval, mid, hi), un)


def bracketed_newton(
    evaluate: Callable[[Tensor], Evaluation],
    u: Tensor,
    first: Evaluation,
    *,
    lower: float,
    upper: float,
    grad_tol: float,
    step_tol: float,
    max_iter: int,
    max_step: float = 2.0,
    done: Tensor | None = None,
    at_upper: Tensor | None = None,
) -> BracketedResult:
    """Safeguarded Newton on ``G`` independent 1-D convex problems ``u in [lower, upper]``.

    ``evaluate(u)`` returns ``(payload, g, h, count)``: the gradient and curvature sums
    ``(G,)`` at ``u`` and the number of samples per problem; ``first`` is that at the start
    ``u``. A problem stops when ``|g| / count <= grad_tol`` or the Newton step
    ``|g / h| <= step_tol`` (at the evaluated point, the one returned), or when it sits on a
    bound with the gradient pointing outwards. Newton steps are capped at ``max_step`` and
    replaced by bisection of the bracket (the gradient's sign change) when they leave it.
    ``done`` / ``at_upper`` mark problems settled before the first iteration.
    """
    G = u.shape[0]
    lo = torch.full((G,), lower, dtype=torch.float64)
    hi = torch.full((G,), upper, dtype=torch.float64)
    lo_eval = torch.zeros(G, dtype=torch.bool)  # lo is an evaluated point (not a bound)
    hi_eval = torch.zeros(G, dtype=torch.bool)
    done = torch.zeros(G, dtype=torch.bool) if done is None else done.clone()
    converged = torch.zeros(G, dtype=torch.bool)
    at_lower = torch.zeros(G, dtype=torch.bool)
    at_upper = torch.zeros(G, dtype=torch.bool) if at_upper is None else at_upper.clone()
    payload, g, h, count = first
    iterations = 0
    while True:
        count = count.clamp(min=1.0)
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
        un = _safeguarded_step(u, g, h, lo, hi, lo_eval, hi_eval, max_step)
        # tiny brackets: converged to the bracket's resolution
        tight = ~done & lo_eval & hi_eval & ((hi - lo) <= step_tol)
        converged |= tight
        done |= tight
        u = torch.where(done, u, un)
        if bool(done.all()):
            break
        payload, g, h, count = evaluate(u)
        iterations += 1
    return BracketedResult(
        u=u,
        payload=payload,
        grad=g / count,
        curv=h / count,
        converged=converged,
        at_lower=at_lower,
        at_upper=at_upper,
        iterations=iterations,
    )


# ----------------------------------------------------------------------------- n-D, damped
class Probe(Protocol):
    """The objective at one point, evaluated lazily (each evaluation is a pass over the data).

    ``f`` is the objective (float); ``gradient()`` returns ``(f, g)`` and ``hessian()`` the
    Hessian. An implementation computes each only when it is asked for (the line search reads
    ``f`` only) or all at once, and counts its own passes.
    """

    @property
    def f(self) -> float: ...

    def gradient(self) -> tuple[float, Tensor]: ...

    def hessian(self) -> Tensor: ...


@dataclass
class NewtonResult:
    """Solution of :func:`damped_newton`."""

    x: Tensor
    probe: Probe  # the objective at x
    iterations: int
    at_bound: bool  # stopped with a coordinate on a bound, the gradient pointing outwards
    grad_norm: float  # norm of the gradient's free part at x (the stopping test's)


def active_bounds(x: Tensor, g: Tensor, lower: Tensor | None, upper: Tensor | None) -> Tensor:
    """Coordinates on a bound whose gradient points outwards (fixed for a projected step)."""
    if lower is None or upper is None:
        return torch.zeros_like(g, dtype=torch.bool)
    return ((x <= lower) & (g > 0)) | ((x >= upper) & (g < 0))


def projected_grad_norm(g: Tensor, fixed: Tensor, norm: str = "l2") -> float:
    """The ``norm`` (``"l2"`` or ``"max"``) of the gradient's free coordinates."""
    v = g[~fixed]
    if v.numel() == 1:
        return abs(float(v[0]))
    if norm == "max":
        return float(v.abs().max())
    return float(torch.linalg.vector_norm(v))


def cholesky_direction(g: Tensor, h: Tensor, free: Tensor) -> Tensor | None:
    """Newton direction by Cholesky with a ridge ``1e-14 * trace(H)`` (``None`` where the
    matrix is not positive definite); on one free coordinate ``-g / h`` where ``h > 0``."""
    idx = torch.nonzero(free).flatten()
    if idx.numel() == 1:
        i = int(idx[0])
        if not float(h[i, i]) > 0:
            return None
        d = torch.zeros_like(g)
        d[i] = -g[i] / h[i, i]
        return d
    hf, gf = h[idx][:, idx], g[idx]
    ridge = 1e-14 * float(hf.diagonal().sum())
    eye = torch.eye(idx.numel(), dtype=h.dtype, device=h.device)
    chol, info = torch.linalg.cholesky_ex(hf + ridge * eye)
    if int(info) != 0:
        return None
    df = -torch.cholesky_solve(gf.unsqueeze(1), chol).squeeze(1)
    return df if idx.numel() == g.numel() else torch.zeros_like(g).index_copy_(0, idx, df)


def solve_direction(g: Tensor, h: Tensor, free: Tensor) -> Tensor | None:
    """Newton direction by an LU solve with a ridge ``1e-12 * mean|diag H| + 1e-300``
    (``None`` where the solve fails). Every coordinate free (an unbounded problem)."""
    eye = torch.eye(g.numel(), dtype=g.dtype, device=g.device)
    ridge = 1e-12 * float(h.diagonal().abs().mean()) + 1e-300
    try:
        return -torch.linalg.solve(h + ridge * eye, g)
    except RuntimeError:
        return None


def damped_newton(
    evaluate: Callable[[Tensor], Probe],
    x: Tensor,
    *,
    direction: Callable[[Tensor, Tensor, Tensor], Tensor | None],
    grad_tol: float,
    max_iter: int,
    lower: Tensor | None = None,
    upper: Tensor | None = None,
    norm: str = "l2",
    min_step: float = 1e-10,
    first: Probe | None = None,
) -> NewtonResult:
    """Projected damped Newton from ``x`` (float64) in the box ``[lower, upper]``.

    A coordinate on a bound whose gradient points outwards is fixed for the step; the rest
    take the Newton step ``direction(g, H, free)``, or steepest descent where that fails or
    does not descend, with Armijo backtracking (halving down to ``min_step``). Where the
    predicted decrease of a Newton step is below the float64 resolution of ``f`` the full step
    is taken (Armijo cannot be checked; it is the quadratically convergent one). Stops when
    the ``norm`` (``"l2"`` or ``"max"``) of the free gradient is ``<= grad_tol``, after
    ``max_iter`` steps, or when no step decreases ``f`` any more.
    """
    bounded = lower is not None and upper is not None

    def project(v: Tensor) -> Tensor:
        return torch.minimum(torch.maximum(v, lower), upper) if bounded else v  # type: ignore

    probe = evaluate(x) if first is None else first
    iterations = 0
    while True:
        f, g = probe.gradient()
        fixed = active_bounds(x, g, lower, upper)
        pg = projected_grad_norm(g, fixed, norm)
        if pg <= grad_tol or iterations >= max_iter:
            break
        d = direction(g, probe.hessian(), ~fixed)
        newton = d is not None and bool(torch.isfinite(d).all()) and float(g @ d) < 0
        if not newton:  # singular Hessian (e.g. every score saturated): steepest descent
            d = torch.where(fixed, torch.zeros_like(g), -g)
        assert d is not None
        slope = float(g @ d)
        if newton and -slope <= 1e-13 * max(1.0, abs(f)):
            x = project(x + d)
            probe = evaluate(x)
            iterations += 1
            continue
        step = 1.0
        while True:
            x_new = project(x + step * d)
            p_new = evaluate(x_new)
            if p_new.f <= f + 1e-4 * step * slope or step < min_step:
                break
            step *= 0.5
        if not p_new.f <= f:  # no descent left at float64 resolution
            break
        x, probe = x_new, p_new
        iterations += 1
    return NewtonResult(
        x=x, probe=probe, iterations=iterations, at_bound=bool(fixed.any()), grad_norm=pg
    )


# ----------------------------------------------------------------------------- LBFGS
class OnBound(Exception):
    """Raised inside the LBFGS closure: the optimum lies beyond a bound (at ``x``)."""

    def __init__(self, x: Tensor) -> None:
        super().__init__(x)
        self.x = x


@dataclass
class LbfgsResult:
    """Solution of :func:`lbfgs`: the last point (or the bound point it stopped on)."""

    x: Tensor
    iterations: int
    evaluations: int
    on_bound: bool


def lbfgs(
    evaluate: Callable[[Tensor], tuple[Tensor, Tensor]],
    x0: Tensor,
    *,
    max_iter: int,
    grad_tol: float,
    history_size: int,
    max_eval: int | None = None,
    lower: Tensor | None = None,
    upper: Tensor | None = None,
    curvature: Callable[[Tensor], Tensor] | None = None,
) -> LbfgsResult:
    """``torch.optim.LBFGS`` (strong-Wolfe line search) on ``evaluate(x) -> (f, grad)``.

    ``tolerance_change=0``: near the optimum the objective is flat to float64 resolution, so
    a loss-change test would stop early; only ``|grad| <= grad_tol``, ``max_iter`` or the
    evaluation cap stop it. With bounds, ``evaluate`` sees the point clamped into the box; an
    evaluation on a bound whose gradient points outwards ends the fit there (``on_bound``: for
    a unimodal objective the optimum lies beyond it). Past a bound the objective continues as
    its C1 quadratic extension (curvature ``max(curvature(x), |g|, 1)``): clamping would show
    the line search a flat function with a non-zero gradient, on which it stalls; the
    extension's minimum lies inside, so the search comes back.
    """
    xp = x0.detach().clone().requires_grad_(True)
    opt = torch.optim.LBFGS(
        [xp],
        lr=1.0,
        max_iter=max_iter,
        max_eval=max_eval,
        tolerance_grad=grad_tol,
        tolerance_change=0.0,
        history_size=history_size,
        line_search_fn="strong_wolfe",
    )
    bounded = lower is not None and upper is not None

    def closure() -> Tensor:
        raw = xp.detach()
        if not bounded:
            f, g = evaluate(raw)
            xp.grad = g
            return f
        assert lower is not None and upper is not None
        x = torch.minimum(torch.maximum(raw, lower), upper)
        f, g = evaluate(x)
        if bool((((x <= lower) & (g > 0)) | ((x >= upper) & (g < 0))).any()):
            raise OnBound(x)
        if not torch.equal(raw, x):
            assert curvature is not None
            d = raw - x
            c = torch.maximum(torch.maximum(curvature(x), g.abs()), torch.ones_like(g))
            f, g = f + (g * d).sum() + (0.5 * c * d * d).sum(), g + c * d
        xp.grad = g
        return f

    try:
        with torch.enable_grad():
            opt.step(closure)
        x, on_bound = xp.detach(), False
    except OnBound as stop:
        x, on_bound = stop.x, True
    state = opt.state[xp] if xp in opt.state else {}
    return LbfgsResult(
        x=x,
        iterations=int(state.get("n_iter", 0)),
        evaluations=int(state.get("func_evals", 0)),
        on_bound=on_bound,
    )
