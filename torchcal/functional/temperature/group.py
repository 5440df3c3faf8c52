"""One temperature per group, penalised or shrunk toward the global one
(:func:`fit_group_temperatures`, the call of
:class:`~torchcal.scaling.GroupTemperatureScaler`; docs/design.md section 4).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional.shrinkage import empirical_bayes_shrinkage
from torchcal.functional.temperature.chunks import Chunk, default_workers, tensor_chunks
from torchcal.functional.temperature.fit import TemperatureSolution, fit_temperature, objective
from torchcal.functional.temperature.solvers import (
    LogBetaResult,
    degenerate_messages,
    log_bounds,
    solve_log_beta,
    u_derivatives,
)
from torchcal.functional.temperature.sums import TemperatureSums


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
        >>> from torchcal.functional.temperature.group import fit_group_temperatures
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
    u_global = -math.log(math.exp(sol_g.log_temperature))  # as a scaler stores and reads T
    chunks = tensor_chunks(logits, target, groups)
    workers = default_workers(logits)
    num_classes = None if binary else logits.shape[1]

    def rows() -> list[Chunk]:
        return chunks

    evaluate = objective(
        rows, rows, binary, num_classes, num_groups=num_groups, workers=workers, check_labels=False
    )

    eb = shrinkage == "empirical_bayes"
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
    if not eb:
        return _solution(res, sol_g, degenerate_messages(res, bounds, what="T_g"))
    shrunk, weights, tau2 = _shrunk(res, evaluate, u_global)
    # shrunk groups leave no bound: a raw fit on a bound gets the global T
    return _solution(shrunk, sol_g, [], raw_u=res.u, weights=weights, tau2=float(tau2))


def _shrunk(
    res: LogBetaResult, evaluate: Callable[[Tensor, bool], Tensor], u_global: float
) -> tuple[LogBetaResult, Tensor, Tensor]:
    """The unpenalised solve ``res`` shrunk toward ``u_global`` by empirical Bayes, with the
    curvature of each group's summed NLL as precision (none for an empty group or one on a
    bound), evaluated in one more pass; and the shrinkage weights and ``tau^2``."""
    _, _, curv = u_derivatives(res.stats, res.u)  # summed NLL's d2/du2 per group
    informative = (TemperatureSums.of(res.stats).rows > 0) & ~(res.at_lower | res.at_upper)
    info = torch.where(informative, curv.clamp(min=0.0), torch.zeros_like(curv))
    u, weights, tau2 = empirical_bayes_shrinkage(res.u, info, u_global)
    stats = evaluate(u, False)
    _, grad, curv_u = u_derivatives(stats, u)
    no = torch.zeros_like(res.converged)
    shrunk = LogBetaResult(
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
    return shrunk, weights, tau2


def _solution(
    res: LogBetaResult,
    sol_g: TemperatureSolution,
    msgs: list[str],
    *,
    raw_u: Tensor | None = None,
    weights: Tensor | None = None,
    tau2: float | None = None,
) -> GroupSolution:
    """The :class:`GroupSolution` of the groups' result ``res`` beside the global fit
    ``sol_g``; ``msgs`` are the solve's own, an empty group's is added first."""
    sums = TemperatureSums.of(res.stats)
    empty = torch.nonzero(sums.rows == 0).flatten().tolist()
    if empty:
        msgs = [f"groups: no samples in group(s) {empty}; they use the global T", *msgs]
    n = float(sums.rows.sum())
    assert res.identity_stats is not None
    return GroupSolution(
        log_temperatures=-res.u,
        global_solution=sol_g,
        nll_before=float(res.identity_stats.sum()) / n,
        nll_after=float(sums.loss.sum()) / n,
        grad_norm=float(torch.linalg.vector_norm(res.grad)),
        iterations=res.iterations,
        converged=bool(res.converged.all()) and sol_g.converged,
        messages=tuple(msgs),
        passes=res.passes + sol_g.passes,
        raw_log_temperatures=None if raw_u is None else -raw_u,
        shrinkage_weights=weights,
        between_group_variance=tau2,
    )
