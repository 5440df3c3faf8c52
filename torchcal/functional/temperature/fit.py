"""The temperature fit: :func:`fit_temperature` (in memory) and :func:`solve_temperature`
(any re-iterable of chunks, e.g. streamed), the shells' one call (docs/design.md section 4).

:class:`~torchcal.scaling.TemperatureScaler` is a shell over these two: it checks shapes,
stores ``log_temperature`` and warns the returned ``messages``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional.temperature.chunks import Chunk, default_workers, tensor_chunks
from torchcal.functional.temperature.distributed import all_reduce_, check_distributed
from torchcal.functional.temperature.solvers import (
    degenerate_messages,
    log_bounds,
    solve_lbfgs,
    solve_log_beta,
)
from torchcal.functional.temperature.sums import TemperatureSums, temperature_pass
from torchcal.functional.temperature.validation import check_stats, validate_labels

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


def objective(
    chunks: Callable[[], Iterable[Chunk]],
    culprits: Callable[[], Iterable[Chunk]],
    binary: bool,
    num_classes: int | None,
    *,
    num_groups: int = 1,
    reduce: bool = False,
    workers: int = 1,
    check_labels: bool = True,
) -> Callable[[Tensor, bool], Tensor]:
    """The solvers' ``evaluate(u, identity)``: one :func:`temperature_pass` over ``chunks()``
    (the other arguments passed on to it), its sums checked by :func:`check_stats`, which
    scans ``culprits()`` for the positioned error (the full data where ``chunks`` is a
    subsample)."""

    def evaluate(u: Tensor, identity: bool) -> Tensor:
        stats = temperature_pass(
            chunks(),
            u,
            binary=binary,
            num_classes=num_classes,
            num_groups=num_groups,
            identity=identity,
            reduce=reduce,
            workers=workers,
            check_labels=check_labels,
        )
        check_stats(stats, culprits, binary)
        return stats

    return evaluate


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
    evaluate = objective(
        chunks,
        chunks,
        binary,
        num_classes,
        reduce=reduce,
        workers=workers,
        check_labels=check_labels,
    )
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

            def rows(sub: list[Chunk] = sub) -> list[Chunk]:
                return sub

            warm = solve_log_beta(
                objective(
                    rows,
                    lambda: full,  # a bad value is named in the full data
                    binary,
                    num_classes,
                    reduce=distributed,
                    workers=workers,
                    check_labels=False,
                ),
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
        >>> from torchcal.functional.temperature.fit import fit_temperature
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
