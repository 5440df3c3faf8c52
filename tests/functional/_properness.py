"""The properness harness shared by test_scoring.py, test_regularizers.py and
test_properness_tags.py (a module, not a conftest, imported as ``from _properness import``).

For a true class distribution ``q`` and one forecast ``p = softmax(z)``, minimise the
expected loss ``E_{y ~ q} L(z, y) = sum_c q_c L(z[None], c)`` over ``z`` by LBFGS in float64
and compare the argmin with ``q``: a strictly proper rule gives ``q``, an improper one
something else (or leaves ``q`` one of many minimisers).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["Q", "argmin_forecast", "entropy", "expected", "log_plus", "lbfgs_minimise"]

Q = torch.tensor([0.6, 0.25, 0.15], dtype=torch.float64)


def lbfgs_minimise(
    objective: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor, max_iter: int = 500
) -> torch.Tensor:
    """argmin of the scalar ``objective(x)`` by LBFGS (strong Wolfe line search) from
    ``start``; returns the detached minimiser."""
    x = start.detach().clone().requires_grad_(True)
    opt = torch.optim.LBFGS(
        [x],
        max_iter=max_iter,
        tolerance_grad=1e-12,
        tolerance_change=1e-20,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective(x)
        loss.backward()
        return loss

    opt.step(closure)
    return x.detach()


def argmin_forecast(
    expected_score: Callable[[torch.Tensor], torch.Tensor], num_classes: int, max_iter: int = 500
) -> torch.Tensor:
    """argmin over ``p = softmax(z)`` of the scalar ``expected_score(z)``, LBFGS from ``z = 0``."""
    z0 = torch.zeros(num_classes, dtype=torch.float64)
    return torch.softmax(lbfgs_minimise(expected_score, z0, max_iter), 0)


def expected(loss: Callable, q: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``z -> E_{y ~ q} loss(z[None], y)`` for one forecast (a batch of one per label)."""
    labels = [torch.tensor([c]) for c in range(q.numel())]
    return lambda z: sum(q[c] * loss(z[None], labels[c]) for c in range(q.numel()))


def log_plus(weight: float, regulariser: Callable) -> Callable:
    """The regulariser as used in training: ``log score + weight * regulariser``."""
    from torchcal.losses import LogScoreLoss

    log = LogScoreLoss()
    return lambda z, y: log(z, y) + weight * regulariser(z, y)


def entropy(p: torch.Tensor) -> float:
    """Shannon entropy (nats) of a probability vector."""
    return -(p * p.log()).sum().item()
