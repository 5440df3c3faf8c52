"""The data of the recipe: ``x ~ U(0, 1)``, ``y = 2x + eps``, ``eps ~ N(0, (0.1 + 0.5x)^2)``.

Four independent samples of the same process, drawn in float64 from one seeded generator:
``train`` (the networks), ``calibration`` (the held-out split that fits the variance scaler and
the conformal quantile), ``eval`` (every reported number) and ``past`` (the observations whose
empirical distribution is the climatological forecast; only their ``y`` is used).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["RegressionData", "make_data", "simulate", "true_loc", "true_scale"]

SLOPE = 2.0
SCALE_INTERCEPT = 0.1
SCALE_SLOPE = 0.5


def true_loc(x: Tensor) -> Tensor:
    """The conditional mean ``E[y | x] = 2x``.

    Example:
        >>> import torch
        >>> true_loc(torch.tensor([0.0, 0.5])).tolist()
        [0.0, 1.0]
    """
    return SLOPE * x


def true_scale(x: Tensor) -> Tensor:
    """The conditional standard deviation ``sd(y | x) = 0.1 + 0.5x``.

    Example:
        >>> import torch
        >>> true_scale(torch.tensor([0.0, 1.0], dtype=torch.float64)).tolist()
        [0.1, 0.6]
    """
    return SCALE_INTERCEPT + SCALE_SLOPE * x


def mean_true_variance() -> float:
    """``E_x[(0.1 + 0.5x)^2]`` for ``x ~ U(0, 1)``: ``0.01 + 0.05 + 0.25/3`` (the pooled
    variance of the homoscedastic forecast, exact rather than estimated).

    Example:
        >>> round(mean_true_variance(), 6)
        0.143333
    """
    a, b = SCALE_INTERCEPT, SCALE_SLOPE
    return a * a + a * b + b * b / 3.0


def simulate(n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``n`` draws ``(x, y)`` of the process, float64.

    Example:
        >>> import torch
        >>> x, y = simulate(4, torch.Generator().manual_seed(0))
        >>> x.shape, y.dtype
        (torch.Size([4]), torch.float64)
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n: expected an int >= 1, got {n!r}")
    x = torch.rand(n, generator=generator, dtype=torch.float64)
    eps = torch.randn(n, generator=generator, dtype=torch.float64)
    return x, true_loc(x) + true_scale(x) * eps


@dataclass(frozen=True)
class RegressionData:
    """The four samples (each ``(x, y)``, float64)."""

    train: tuple[Tensor, Tensor]
    calibration: tuple[Tensor, Tensor]
    eval: tuple[Tensor, Tensor]
    past: tuple[Tensor, Tensor]

    def sizes(self) -> dict[str, int]:
        """The sample sizes, for the report."""
        return {
            "n_train": len(self.train[0]),
            "n_calibration": len(self.calibration[0]),
            "n_eval": len(self.eval[0]),
            "n_past": len(self.past[0]),
        }


def make_data(
    seed: int,
    n_train: int = 20_000,
    n_calibration: int = 5_000,
    n_eval: int = 20_000,
    n_past: int = 20_000,
) -> RegressionData:
    """Draw the four samples from one generator seeded with ``seed``. The command line's
    ``--data.*`` options are this signature's.

    Args:
        seed: the generator's seed.
        n_train: training points of the two networks.
        n_calibration: held-out points that fit the variance scaler and the conformal
            quantile.
        n_eval: evaluation points (every reported number).
        n_past: past observations whose empirical distribution is the climatology.

    Example:
        >>> d = make_data(0, n_train=10, n_calibration=5, n_eval=20, n_past=30)
        >>> d.sizes()
        {'n_train': 10, 'n_calibration': 5, 'n_eval': 20, 'n_past': 30}
    """
    for name, n in (
        ("n_train", n_train),
        ("n_calibration", n_calibration),
        ("n_eval", n_eval),
        ("n_past", n_past),
    ):
        if not isinstance(n, int) or isinstance(n, bool) or n < 2:
            raise ValueError(f"data.{name}: expected an int >= 2, got {n!r}")
    g = torch.Generator().manual_seed(seed)
    return RegressionData(
        train=simulate(n_train, g),
        calibration=simulate(n_calibration, g),
        eval=simulate(n_eval, g),
        past=simulate(n_past, g),
    )
