"""Quantile recalibration of predictive distributions (Kuleshov, Fenner & Ermon, 2018)."""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Real
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_finite,
    check_floating,
    check_nonempty,
    check_open_unit,
    check_probabilities,
    check_tensor,
)
from torchcal.functional.isotonic import fit_pit_recalibration, interpolate
from torchcal.scaling._base import FittedMixin, QuantileFit

__all__ = ["QuantileRecalibrator"]


def as_levels(name: str, tau: float | Tensor) -> Tensor:
    """Levels in (0, 1) as a float64 tensor (a number gives a 0-dim tensor)."""
    if not isinstance(tau, Tensor):
        if isinstance(tau, bool) or not isinstance(tau, Real):  # numpy floats are Real
            raise TypeError(f"{name}: expected a float or a tensor, got {type(tau).__name__}")
        tau = torch.tensor(float(tau), dtype=torch.float64)
    check_floating(name, tau)
    check_finite(name, tau)
    check_open_unit(name, tau)
    return tau.to(torch.float64)


class QuantileRecalibrator(FittedMixin):
    r"""Recalibrate any predictive CDF through a monotone map of its PIT (Kuleshov et al. 2018).

    Kuleshov, Fenner & Ermon (2018), "Accurate Uncertainties for Deep Learning Using
    Calibrated Regression" (ICML): if the PIT values ``p_i = F_i(y_i)`` of a held-out set are
    not uniform, ``R(p) = P(F(Y) <= p)`` (estimated on that set) composed with ``F`` is
    calibrated: ``R(F(y))`` is the recalibrated CDF, and the recalibrated ``tau``-quantile is
    ``F^{-1}(R^{-1}(tau))``. It repairs any shape error (bias, too narrow, too wide, wrong
    tails) marginally, but not conditionally (one map for every input).

    The estimate of ``R``: the isotonic (PAV, ties pooled) fit of the points
    ``(p_(k), k / (n + 1))`` of the sorted PIT values together with the anchors ``(0, 0)`` and
    ``(1, 1)`` (a PIT value of exactly 0 or 1, which a float32 CDF gives in its far tails,
    keeps its rank but is no knot: the anchors stay), interpolated linearly. ``k / (n + 1)`` is the probability that a new
    exchangeable PIT value falls below ``p_(k)`` (so ``R^{-1}(tau)`` interpolates between
    order statistics the way the conformal quantile does), and with the end points ``R`` is an
    increasing bijection of ``[0, 1]`` (tied PIT values share their mean rank), so
    ``R^{-1}`` exists. This differs from the paper's scikit-learn fit of the empirical CDF
    ``k / n`` (clipped at ``1 / n`` below ``p_(1)``) by ``O(1 / n)``.

    Methods: :meth:`fit` ``(pit)``; :meth:`recalibrate` ``(p) = R(p)`` (recalibrated PIT or
    CDF values); :meth:`levels_for` ``(tau) = R^{-1}(tau)``, the level at which to query the
    original forecast; :meth:`quantile` and :meth:`interval` do that for a
    ``torch.distributions.Distribution`` with an ``icdf``.

    :class:`~torchcal.scaling.QuantileFit`: there is no likelihood here; ``gap_before`` /
    ``gap_after`` are the mean absolute gap between the sorted fitting PIT
    values (before; after the map ``R``) and their nominal ranks ``k / (n + 1)``.

    State: ``x_knots`` / ``y_knots`` (float64, length set by the fit, resized on load and
    checked: strictly increasing, inside ``[0, 1]``) and ``fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import QuantileRecalibrator
        >>> g = torch.Generator().manual_seed(0)
        >>> y = 2 * torch.randn(4000, generator=g)
        >>> forecast = torch.distributions.Normal(torch.zeros(4000), torch.ones(4000))  # too narrow
        >>> rec = QuantileRecalibrator()
        >>> _ = rec.fit(forecast.cdf(y))
        >>> round(float(forecast.cdf(y).le(0.95).double().mean()), 2)    # unrecalibrated
        0.81
        >>> q95 = rec.quantile(forecast, 0.95)
        >>> round(float((y <= q95).double().mean()), 2)
        0.95
    """

    x_knots: Tensor
    y_knots: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("x_knots", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("y_knots", torch.zeros(0, dtype=torch.float64))
        self._init_fitted()

    # ------------------------------------------------------------------ state
    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        xk, yk, fitted = (state.get(k) for k in ("x_knots", "y_knots", "fitted"))
        if xk is None or yk is None:
            return
        if xk.dim() != 1:
            raise ValueError(f"{prefix}x_knots: expected a 1-D tensor, got shape {tuple(xk.shape)}")
        if yk.shape != xk.shape:
            raise ValueError(
                f"{prefix}y_knots: expected the 1-D shape of x_knots {tuple(xk.shape)}, "
                f"got {tuple(yk.shape)}"
            )
        if fitted is not None and bool(fitted) and xk.numel() == 0:
            raise ValueError(f"{prefix}x_knots: a fitted state needs at least one knot, got none")
        if xk.numel() and not (float(xk[0]) == 0.0 and float(xk[-1]) == 1.0):
            raise ValueError(  # fit() always anchors R at both ends: R maps [0, 1] onto itself
                f"{prefix}x_knots: expected knots from 0 to 1 in the loaded state, got "
                f"{xk[:1].tolist()} ... {xk[-1:].tolist()}"
            )
        for name, v in (("x_knots", xk), ("y_knots", yk)):
            v = v.to(torch.float64)
            inside = bool(((v >= 0) & (v <= 1)).all())  # NaN fails
            if not inside or not bool((v[1:] > v[:-1]).all()):
                raise ValueError(
                    f"{prefix}{name}: expected strictly increasing values in [0, 1] in the "
                    f"loaded state"
                )

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        for name in ("x_knots", "y_knots"):
            value = state_dict.get(prefix + name)
            if isinstance(value, Tensor):
                device = getattr(self, name).device
                setattr(self, name, torch.empty_like(value, dtype=torch.float64, device=device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ------------------------------------------------------------------ fitting
    def fit(self, pit: Tensor) -> QuantileFit:
        """Fit ``R`` on held-out PIT values ``pit`` (any shape, values in ``[0, 1]``)."""
        check_tensor("pit", pit)
        check_floating("pit", pit)
        check_nonempty("pit", pit)
        check_probabilities("pit", pit)
        with torch.inference_mode(False), torch.no_grad():
            sol = fit_pit_recalibration(pit)
        device = self.x_knots.device
        self.x_knots = sol.x.to(device)
        self.y_knots = sol.y.to(device)
        self._mark_fitted()
        return QuantileFit(
            gap_before=sol.before,
            gap_after=sol.after,
            iterations=sol.rounds,
            converged=True,
            passes=1,
            method="pav",
        )

    # ------------------------------------------------------------------ maps
    def recalibrate(self, p: Tensor) -> Tensor:
        """``R(p)``: recalibrated PIT / CDF values (same shape, float64), ``p`` in ``[0, 1]``."""
        self._check_fitted()
        check_tensor("p", p)
        check_probabilities("p", p)
        xk, yk = self.x_knots.to(p.device), self.y_knots.to(p.device)
        return interpolate(p.to(torch.float64), xk, yk)

    def levels_for(self, tau: float | Tensor) -> Tensor:
        """``R^{-1}(tau)`` (float64, ``tau``'s shape): query the original forecast's quantile
        at this level to get the recalibrated ``tau``-quantile; ``tau`` in ``(0, 1)``."""
        self._check_fitted()
        tau = as_levels("tau", tau)
        xk, yk = self.x_knots.to(tau.device), self.y_knots.to(tau.device)
        return interpolate(tau, yk, xk)

    def quantile(
        self, distribution: torch.distributions.Distribution, tau: float | Tensor
    ) -> Tensor:
        """Recalibrated ``tau``-quantiles ``distribution.icdf(R^{-1}(tau))``.

        A number ``tau`` gives the distribution's batch shape; a 1-D tensor of ``K`` levels
        gives ``(*batch_shape, K)`` (levels last). Levels are float64 (the result's dtype is
        the promotion of the distribution's and float64).
        """
        if not callable(getattr(distribution, "icdf", None)):
            raise ValueError(
                f"distribution: expected a torch.distributions.Distribution with an icdf, got "
                f"{type(distribution).__name__}"
            )
        levels = self.levels_for(tau)
        if levels.dim() > 1:
            raise ValueError(
                f"tau: expected a number or a 1-D tensor, got shape {tuple(levels.shape)}"
            )
        if levels.dim() == 0:
            return distribution.icdf(levels)
        batch = tuple(distribution.batch_shape)
        out = distribution.icdf(levels.reshape(-1, *([1] * len(batch))))
        return out.movedim(0, -1)

    def interval(
        self, distribution: torch.distributions.Distribution, coverage: float | Tensor
    ) -> tuple[Tensor, Tensor]:
        """Recalibrated central intervals ``(lower, upper)`` at nominal ``coverage`` in
        ``(0, 1)``: the recalibrated ``(1 - c) / 2`` and ``(1 + c) / 2`` quantiles (shapes as
        :meth:`quantile`)."""
        c = as_levels("coverage", coverage)
        return self.quantile(distribution, (1 - c) / 2), self.quantile(distribution, (1 + c) / 2)

    def extra_repr(self) -> str:
        return f"knots={self.x_knots.numel()}, fitted={self.is_fitted}"
