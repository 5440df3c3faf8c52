"""The forecasts the recipe compares and the numbers it reports for each.

Three kinds: :class:`GaussianForecast` (``N(loc, scale^2)`` per point: the homoscedastic and
heteroscedastic references, the networks before and after variance scaling),
:class:`EmpiricalForecast` (one ensemble shared by every point: the climatology, the empirical
distribution of past observations) and :class:`IntervalForecast` (a 90 % interval and nothing
else: the conformal intervals). :func:`evaluate` scores any of them with torchcal's functionals;
a score a forecast does not define (the NLL of an empirical law, the PIT of an interval) is
``None``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

import torchcal.functional as TF

__all__ = [
    "LEVEL",
    "EmpiricalForecast",
    "Forecast",
    "GaussianForecast",
    "IntervalForecast",
    "evaluate",
    "x_region",
]

LEVEL = 0.9  # the level of the reported central interval (the keys say ``coverage90``)
X_BINS = 10  # bins of x for the coverage-by-x curve
X_REGIONS = ("low_x", "mid_x", "high_x")  # x < 1/3, 1/3 <= x <= 2/3, x > 2/3


def normal_ppf(p: Tensor) -> Tensor:
    """The standard normal quantile, float64."""
    return math.sqrt(2.0) * torch.special.erfinv(2.0 * p.double() - 1.0)


@dataclass(frozen=True)
class GaussianForecast:
    """``N(loc, scale^2)`` at each point (``loc``, ``scale``: ``(N,)`` float64)."""

    loc: Tensor
    scale: Tensor

    def quantiles(self, levels: Tensor) -> Tensor:
        """``(N, K)`` quantiles at ``levels``."""
        return self.loc.unsqueeze(-1) + self.scale.unsqueeze(-1) * normal_ppf(levels)

    def interval(self, level: float) -> tuple[Tensor, Tensor]:
        """The central interval of probability ``level``."""
        half = normal_ppf(torch.tensor(0.5 + level / 2, dtype=torch.float64)) * self.scale
        return self.loc - half, self.loc + half

    def pit(self, target: Tensor, generator: torch.Generator) -> Tensor:
        return TF.pit_normal(self.loc, self.scale, target)

    def crps(self, target: Tensor) -> float:
        return float(TF.crps_normal(self.loc, self.scale, target))

    def nll(self, target: Tensor) -> Optional[float]:
        return float(TF.gaussian_nll(self.loc, self.scale, target))

    def sharpness(self) -> float:
        return float(TF.sharpness(self.scale))


@dataclass(frozen=True)
class EmpiricalForecast:
    """The empirical distribution of ``members`` ``(M,)`` at each of ``n`` points (the
    climatology). Its quantile at level ``tau`` is the inverse of the empirical CDF, the
    ``ceil(M tau)``-th smallest member. Its PIT and CRPS are torchcal's ensemble functionals
    with the ``(M,)`` members broadcast to the targets (each sorts the members once)."""

    members: Tensor
    n: int

    def quantiles(self, levels: Tensor) -> Tensor:
        x, _ = torch.sort(self.members.double())
        m = x.numel()
        idx = torch.ceil(levels.double() * m - 1e-9).long().clamp(1, m) - 1
        return x[idx].expand(self.n, -1)

    def interval(self, level: float) -> tuple[Tensor, Tensor]:
        q = self.quantiles(torch.tensor([0.5 - level / 2, 0.5 + level / 2], dtype=torch.float64))
        return q[:, 0], q[:, 1]

    def pit(self, target: Tensor, generator: torch.Generator) -> Tensor:
        # members (M,) shared by every target: pit_ensemble sorts once, O((M + N) log M)
        return TF.pit_ensemble(self.members, target, generator=generator)

    def crps(self, target: Tensor) -> float:
        # the CRPS of the empirical law itself: the 'nrg' estimator (sorted once, shared)
        return float(TF.crps_ensemble(self.members, target, estimator="nrg"))

    def nll(self, target: Tensor) -> Optional[float]:
        return None  # an empirical law has no density

    def sharpness(self) -> float:
        sd = self.members.double().std(correction=0)
        return float(TF.sharpness(sd.reshape(1)))


@dataclass(frozen=True)
class IntervalForecast:
    """A central interval at :data:`LEVEL` and nothing else (conformal intervals)."""

    lower: Tensor
    upper: Tensor

    def interval(self, level: float) -> tuple[Tensor, Tensor]:
        if level != LEVEL:
            raise ValueError(f"level: this interval forecast is at {LEVEL}, got {level}")
        return self.lower, self.upper


Forecast = Union[GaussianForecast, EmpiricalForecast, IntervalForecast]


def x_region(x: Tensor) -> Tensor:
    """0 for ``x < 1/3``, 2 for ``x > 2/3``, 1 between (int64).

    Example:
        >>> import torch
        >>> x_region(torch.tensor([0.1, 0.5, 0.9])).tolist()
        [0, 1, 2]
    """
    return (x > 2.0 / 3.0).long() * 2 + ((x >= 1.0 / 3.0) & (x <= 2.0 / 3.0)).long()


def group_rates(hits: Tensor, groups: Tensor, num_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per group: the rate of ``hits`` (0/1), its standard error ``sqrt(p(1-p)/n)`` and ``n``
    (float64 sums; NaN for an empty group)."""
    n = torch.bincount(groups, minlength=num_groups).double()
    p = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, groups, hits.double()) / n
    return p, torch.sqrt(p * (1 - p) / n), n


def _coverage(forecast: Forecast, x: Tensor, y: Tensor) -> dict[str, object]:
    lower, upper = forecast.interval(LEVEL)
    hit = TF.interval_coverage(lower, upper, y, reduction="none").double()
    p = float(hit.mean())
    out: dict[str, object] = {
        "coverage90": p,
        "coverage90_se": math.sqrt(p * (1 - p) / len(y)),
        "width90": float((upper - lower).double().mean()),
    }
    rates, se, _ = group_rates(hit, x_region(x), len(X_REGIONS))
    for i, name in enumerate(X_REGIONS):
        out[f"coverage90_{name}"] = float(rates[i])
        out[f"coverage90_{name}_se"] = float(se[i])
    return out


def _coverage_by_x(forecast: Forecast, x: Tensor, y: Tensor) -> dict[str, object]:
    """Coverage of the central interval in ``X_BINS`` equal-width bins of ``x``."""
    lower, upper = forecast.interval(LEVEL)
    hit = TF.interval_coverage(lower, upper, y, reduction="none")
    bins = torch.clamp((x.double() * X_BINS).floor().long(), 0, X_BINS - 1)
    rates, se, _ = group_rates(hit, bins, X_BINS)
    return {"coverage_by_x": rates.tolist(), "coverage_by_x_se": se.tolist()}


def evaluate(
    forecast: Forecast,
    x: Tensor,
    y: Tensor,
    *,
    pit_bins: int,
    levels: Tensor,
    generator: torch.Generator,
) -> tuple[dict[str, object], dict[str, object]]:
    """Score ``forecast`` on ``(x, y)``: ``(numbers, curves)``. ``numbers`` has the keys of
    ``report.json``'s ``forecasts`` entries (``coverage90``, ``width90``,
    ``coverage90_low_x``/``_mid_x``/``_high_x`` each with ``_se``, ``pit_shares`` over
    ``pit_bins`` equal bins, ``pit_ece``, ``nll``, ``crps``, ``sharpness``,
    ``quantile_calibration_error`` over ``levels``), ``None`` where the forecast defines no such
    thing; ``curves`` the observed frequency at each quantile level (the reliability curve),
    ``None`` for an interval forecast."""
    out = _coverage(forecast, x, y)
    curves: dict[str, object] = {**_coverage_by_x(forecast, x, y), "observed_frequencies": None}
    for key in ("pit_shares", "pit_ece", "nll", "crps", "sharpness", "quantile_calibration_error"):
        out[key] = None
    if isinstance(forecast, IntervalForecast):
        return out, curves
    pit = forecast.pit(y, generator)
    counts = TF.pit_histogram(pit, n_bins=pit_bins).reshape(-1).double()
    quantiles = forecast.quantiles(levels)
    out.update(
        pit_shares=(counts / counts.sum()).tolist(),
        pit_ece=float(TF.pit_calibration_error(pit, n_bins=pit_bins)),
        nll=forecast.nll(y),
        crps=forecast.crps(y),
        sharpness=forecast.sharpness(),
        quantile_calibration_error=float(TF.quantile_calibration_error(quantiles, levels, y)),
    )
    curves["observed_frequencies"] = TF.observed_frequencies(quantiles, levels, y).tolist()
    return out, curves
