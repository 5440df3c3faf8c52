r"""Calibration of predictive distributions: PIT values, coverage, quantile calibration,
sharpness.

A predictive CDF :math:`F_x` is calibrated when the probability integral transform (PIT)
:math:`F_x(y)` is uniform on [0, 1] (Dawid 1984; Gneiting, Balabdaoui & Raftery 2007,
J. R. Stat. Soc. B 69): a U-shaped PIT histogram means too narrow forecasts, a hump too
wide ones, a tilt a biased mean. Calibration is necessary, not sufficient (a climatological
forecast is calibrated and useless), so report :func:`sharpness` beside it and rank
forecasts with a proper score (:mod:`torchcal.functional.continuous`).

* PIT values: :func:`pit` (any ``torch.distributions.Distribution`` with a ``cdf``),
  :func:`pit_normal`, :func:`pit_laplace`, :func:`pit_logistic` (closed forms, the three
  families of the closed-form CRPS), :func:`pit_ensemble` (randomised rank of the target
  among the members) and :func:`pit_quantiles` (a piecewise-linear CDF through a quantile
  set, with exponential tails).
* Readings (in :mod:`torchcal.functional.coverage`, re-exported here):
  :func:`pit_histogram`, :func:`pit_calibration_error`, :func:`interval_coverage`,
  :func:`observed_frequencies`, :func:`quantile_calibration_error`, :func:`sharpness`, and
  the forms on summed statistics :func:`pit_calibration_error_from_counts`,
  :func:`frequency_calibration_error`.

Shapes follow :mod:`torchcal.functional.continuous`: the forecast comes first and may
broadcast up to the target's shape; the target is never broadcast. Dtypes: PIT values are
returned in the forecast's compute dtype (float16/bfloat16 -> float32); the readings
(counts, frequencies, coverage, errors, sharpness) are int64 or float64, summed in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_bool,
    check_floating,
    check_nonempty,
    check_option,
    check_tensor,
    validation_enabled,
    values_checked,
)
from torchcal.functional._ensemble import counts_below_and_at, members_last, shared_layout
from torchcal.functional._forecast import cast_forecast, check_location_scale, check_target_shape
from torchcal.functional._validation import check_level_grid, values_within
from torchcal.functional.coverage import (
    quantile_inputs,
)

__all__ = [
    "pit",
    "pit_normal",
    "pit_laplace",
    "pit_logistic",
    "pit_ensemble",
    "pit_quantiles",
    "central_interval_factor",
]

_SQRT1_2 = 0.7071067811865476  # 1 / sqrt(2)

# ------------------------------------------------------------------------------ PIT values


def pit(distribution: torch.distributions.Distribution, target: Tensor) -> Tensor:
    r"""PIT values :math:`F(y)` of a univariate ``torch.distributions.Distribution``.

    ``distribution.cdf(target)`` after the checks, clipped to [0, 1]. The target must have
    exactly the distribution's ``batch_shape`` (neither side is broadcast). A target outside
    the distribution's support raises when the distribution validates its arguments
    (torch's default); for the closed forms of the CRPS families use :func:`pit_normal`,
    :func:`pit_laplace` and :func:`pit_logistic` (accurate in the tails; torch has no
    logistic distribution).

    Args:
        distribution: a univariate distribution (``event_shape == ()``) with ``cdf``.
        target: observations of shape ``distribution.batch_shape``, finite.

    Example:
        >>> import torch
        >>> from torchcal.functional import pit
        >>> d = torch.distributions.Normal(torch.zeros(2), torch.ones(2))
        >>> pit(d, torch.tensor([0.0, 1.0])).tolist()
        [0.5, 0.8413447141647339]
    """
    if not isinstance(distribution, torch.distributions.Distribution):
        raise TypeError(
            "distribution: expected a torch.distributions.Distribution, got "
            f"{type(distribution).__name__}"
        )
    if distribution.event_shape != torch.Size([]):
        raise ValueError(
            "distribution: expected a univariate distribution (event_shape ()), got "
            f"event_shape {tuple(distribution.event_shape)}"
        )
    check_tensor("target", target)
    (target,) = cast_forecast([("target", target)])
    if target.shape != distribution.batch_shape:
        raise ValueError(
            f"target: expected the distribution's batch_shape "
            f"{tuple(distribution.batch_shape)}, got {tuple(target.shape)} (neither is broadcast)"
        )
    try:
        u = distribution.cdf(target)
    except NotImplementedError:
        raise TypeError(
            f"distribution: {type(distribution).__name__} does not implement cdf"
        ) from None
    except ValueError as err:  # torch's support check (validate_args)
        raise ValueError(f"target: rejected by the distribution's cdf: {err}") from None
    return u.clamp(0.0, 1.0)


def _closed_form(loc: Tensor, scale: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Checked, cast and broadcast ``z = (y - mu) / s`` and its absolute value."""
    fast = all(isinstance(x, Tensor) and x.is_floating_point() for x in (loc, scale, target))
    if fast:  # one aminmax per tensor; the full checks only to word a failure
        big = [torch.finfo(x.dtype).max for x in (loc, scale, target)]
        fast = (
            values_within(loc, -big[0], big[0])
            and values_within(scale, 0.0, big[1], strict_low=True)
            and values_within(target, -big[2], big[2])
        )
    with validation_enabled(values_checked() and not fast):  # shape checks always run
        loc, scale, target = check_location_scale(loc, scale, target)
    z = (target - loc) / scale
    z = z.expand(target.shape) if z.shape != target.shape else z
    return z, z.abs()


def pit_normal(loc: Tensor, scale: Tensor, target: Tensor) -> Tensor:
    r"""PIT of a normal forecast: :math:`\Phi((y - \mu)/\sigma)`.

    Evaluated as :math:`\frac12\operatorname{erfc}(-z/\sqrt2)`: relative accuracy ~1e-13 far
    into the lower tail, where ``(1 + erf(z / sqrt 2)) / 2`` (``Normal.cdf``, and
    ``torch.special.ndtr`` on CPU in torch 2.x) returns 0 from :math:`z \approx -8.3` on.

    Args:
        loc: mean :math:`\mu`, broadcastable to the target's shape.
        scale: standard deviation :math:`\sigma > 0`, broadcastable to the target's shape.
        target: observations, never broadcast; the result has its shape.

    Example:
        >>> import torch
        >>> from torchcal.functional import pit_normal
        >>> pit_normal(torch.tensor(0.0), torch.tensor(2.0), torch.tensor([0.0, 2.0])).tolist()
        [0.5, 0.8413447141647339]
    """
    z, _ = _closed_form(loc, scale, target)
    return 0.5 * torch.special.erfc(z * -_SQRT1_2)


def pit_laplace(loc: Tensor, scale: Tensor, target: Tensor) -> Tensor:
    r"""PIT of a Laplace forecast: :math:`\frac12 e^{z}` for :math:`z < 0`, else
    :math:`1 - \frac12 e^{-z}`, with :math:`z = (y - \mu)/b`.

    Args:
        loc: location :math:`\mu`, broadcastable to the target's shape.
        scale: scale :math:`b > 0` (the standard deviation is :math:`\sqrt2 b`).
        target: observations, never broadcast; the result has its shape.

    Example:
        >>> import torch
        >>> from torchcal.functional import pit_laplace
        >>> pit_laplace(torch.tensor(0.0), torch.tensor(1.0), torch.tensor([0.0, -1.0])).tolist()
        [0.5, 0.18393972516059875]
    """
    z, a = _closed_form(loc, scale, target)
    half_tail = 0.5 * torch.exp(-a)
    return torch.where(z < 0, half_tail, 1.0 - half_tail)


def pit_logistic(loc: Tensor, scale: Tensor, target: Tensor) -> Tensor:
    r"""PIT of a logistic forecast: :math:`1 / (1 + e^{-z})`, :math:`z = (y - \mu)/s`.

    Args:
        loc: location :math:`\mu`, broadcastable to the target's shape.
        scale: scale :math:`s > 0` (the standard deviation is :math:`s\pi/\sqrt3`).
        target: observations, never broadcast; the result has its shape.

    Example:
        >>> import torch
        >>> from torchcal.functional import pit_logistic
        >>> pit_logistic(torch.tensor(0.0), torch.tensor(1.0), torch.tensor([0.0, 1.0])).tolist()
        [0.5, 0.7310585975646973]
    """
    z, _ = _closed_form(loc, scale, target)
    return torch.sigmoid(z)


def pit_ensemble(
    samples: Tensor,
    target: Tensor,
    *,
    ensemble_dim: int = -1,
    randomized: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""PIT of an ensemble forecast: the randomised rank of the target among the members.

    :math:`(\#\{x_m < y\} + U\,(\#\{x_m = y\} + 1)) / (M + 1)` with :math:`U \sim U(0, 1)`
    drawn per item. If the target and the :math:`M` members are exchangeable (a
    calibrated ensemble) its rank among the :math:`M + 1` values is uniform on
    :math:`\{0, \dots, M\}`, ties broken at random, so the PIT is exactly uniform on
    [0, 1], also for discrete data with many ties and for a target below or above every
    member (the rank histogram of Anderson 1996 / Hamill 2001, made continuous as the
    randomised PIT of Czado, Gneiting & Held 2009). ``randomized=False`` uses
    :math:`U = 1/2` (the mid-point; deterministic, but not uniform for a small ensemble).

    An ensemble shared by several targets (its batch shape broadcasts to the target's, e.g.
    members ``(M,)`` for a target ``(N,)``: a climatology) is sorted once and the two counts
    found by binary search, O((M + N) log M) instead of O(N M); the values are those of the
    expanded ensemble bit for bit, and :math:`U` is drawn alike.

    Args:
        samples: ensemble members, ``ensemble_dim`` holds the ``M >= 1`` members; without
            that dim, broadcastable to the target's shape (e.g. ``(N, M)``, or one shared
            ``(M,)``, for ``(N,)``).
        target: observations, never broadcast; the result has its shape.
        ensemble_dim: the dimension of ``samples`` that indexes members (default last).
        randomized: draw :math:`U` (default) or use :math:`1/2`.
        generator: the ``torch.Generator`` that draws :math:`U` (on its own device; the
            values are then moved to the target's).

    Example:
        >>> import torch
        >>> from torchcal.functional import pit_ensemble
        >>> x = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
        >>> pit_ensemble(x, torch.tensor([1.5]), randomized=False).tolist()
        [0.5]
        >>> pit_ensemble(x[0], torch.tensor([-1.0, 1.0, 9.0]), randomized=False) * 10
        tensor([1., 4., 9.])
    """
    x = members_last(samples, ensemble_dim)
    check_bool("randomized", randomized)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator)}")
    check_tensor("target", target)
    check_floating("target", target)
    check_nonempty("target", target)
    check_target_shape(target.shape, [("samples without ensemble_dim", x.shape[:-1])])
    x, y = cast_forecast([("samples", x), ("target", target.unsqueeze(-1))])
    m = x.shape[-1]
    layout = shared_layout(x.shape[:-1], target.shape)
    if layout is not None:  # sort each shared ensemble once, count by binary search
        below, ties = counts_below_and_at(x, y.squeeze(-1), layout)
    else:
        below = (x < y).sum(dim=-1, dtype=torch.float64)
        ties = (x == y).sum(dim=-1, dtype=torch.float64)
        below, ties = below.expand(target.shape), ties.expand(target.shape)
    if randomized:
        device = generator.device if generator is not None else target.device
        u = torch.rand(target.shape, generator=generator, dtype=torch.float64, device=device)
        u = u.to(target.device)
    else:
        u = torch.full(target.shape, 0.5, dtype=torch.float64, device=target.device)
    return ((below + u * (ties + 1.0)) / (m + 1)).to(x.dtype)


def pit_quantiles(quantiles: Tensor, levels: Tensor | Sequence[float], target: Tensor) -> Tensor:
    r"""PIT of a forecast given by quantiles :math:`q_1 \le \dots \le q_K` at levels
    :math:`\tau_1 < \dots < \tau_K`.

    The CDF is piecewise linear through the points :math:`(q_k, \tau_k)`. Outside
    :math:`[q_1, q_K]` it has exponential tails whose density continues the adjacent
    segment's (no mass is put at the ends and no support bound is assumed):
    :math:`F(y) = \tau_1 \exp((y - q_1) / b_1)` below :math:`q_1` with
    :math:`b_1 = \tau_1 (q_2 - q_1) / (\tau_2 - \tau_1)`, and
    :math:`F(y) = 1 - (1 - \tau_K) \exp(-(y - q_K) / b_K)` above :math:`q_K` with
    :math:`b_K = (1 - \tau_K)(q_K - q_{K-1}) / (\tau_K - \tau_{K-1})`. Equal quantiles
    (a jump of the CDF) are allowed, the CDF is then right-continuous; an end segment of
    zero width gives a tail of zero width. For the true quantiles of a continuous law on a
    fine level grid the PIT is uniform up to the interpolation error.

    Args:
        quantiles: ``(..., K)`` quantiles, non-decreasing along the last dim (crossing
            quantiles raise); the batch dims broadcast to the target's shape.
        levels: ``(K,)`` levels, ``K >= 2``, strictly increasing in (0, 1).
        target: observations, never broadcast; the result has its shape.

    Example:
        >>> import torch
        >>> from torchcal.functional import pit_quantiles
        >>> q = torch.tensor([[0.1, 0.5, 0.9]])
        >>> [round(v, 6) for v in pit_quantiles(q, [0.1, 0.5, 0.9], torch.tensor([0.3])).tolist()]
        [0.3]
    """
    q, lv, y = quantile_inputs(quantiles, levels, target, min_levels=2)
    k = lv.shape[0]
    q = q.expand(*target.shape, k).contiguous()
    i = torch.searchsorted(q, y.expand(*target.shape, 1).contiguous(), right=True)
    j = i.clamp(1, k - 1)
    q_lo, q_hi = q.gather(-1, j - 1), q.gather(-1, j)
    t_lo, t_hi = lv[j - 1], lv[j]
    width = q_hi - q_lo
    safe = torch.where(width > 0, width, torch.ones_like(width))
    inner = t_lo + (t_hi - t_lo) * ((y - q_lo) / safe)
    # tails: F = tau_1 exp(rate_1 (y - q_1)), 1 - F = (1 - tau_K) exp(-rate_K (y - q_K))
    rate_lo = (lv[1] - lv[0]) / (lv[0] * (q[..., 1:2] - q[..., 0:1]))
    rate_hi = (lv[-1] - lv[-2]) / ((1.0 - lv[-1]) * (q[..., -1:] - q[..., -2:-1]))
    low = lv[0] * torch.exp((y - q[..., 0:1]).clamp(max=0.0) * rate_lo)
    # a zero-width end segment: rate inf, a jump to 1 at q_K itself (0 * inf would be NaN)
    above = torch.where(rate_hi == math.inf, -math.inf, -(y - q[..., -1:]).clamp(min=0.0) * rate_hi)
    high = 1.0 - (1.0 - lv[-1]) * torch.exp(above)
    out = torch.where(i == 0, low, torch.where(i == k, high, inner))
    return out.squeeze(-1).clamp(0.0, 1.0)


def central_interval_factor(family: str, levels: Tensor | Sequence[float]) -> Tensor:
    r"""``c`` such that ``[loc - c scale, loc + c scale]`` is the central interval of nominal
    coverage ``levels`` for a location-scale ``family`` (float64): the standard quantile at
    :math:`(1 + l) / 2`. Normal :math:`\Phi^{-1}((1 + l)/2)`, Laplace :math:`-\log(1 - l)`,
    logistic :math:`\log((1 + l)/(1 - l))` (the same parameterisation as :func:`pit_normal`,
    :func:`pit_laplace`, :func:`pit_logistic`).

    Example:
        >>> round(float(central_interval_factor("normal", [0.9])[0]), 4)
        1.6449
    """
    check_option("family", family, ("normal", "laplace", "logistic"))
    lv = check_level_grid("levels", levels).to(torch.float64)
    if family == "normal":
        return torch.special.ndtri((1.0 + lv) / 2.0)
    if family == "laplace":
        return -torch.log1p(-lv)
    return torch.log1p(lv) - torch.log1p(-lv)
