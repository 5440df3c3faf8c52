"""Proper scoring rules for real-valued (continuous) forecasts.

Every score is negatively oriented (lower is better) and returns per-item values that
are reduced with ``reduction='mean'|'sum'|'none'``.

* CRPS in closed form for the normal, Laplace and logistic families
  (Gneiting, Raftery, Westveld & Goldman 2005, Mon. Wea. Rev. 133, for the normal;
  Jordan, Krueger & Lerch 2019, *scoringRules*, J. Stat. Softw. 90(12), for all three;
  Gneiting & Raftery 2007, J. Am. Stat. Assoc. 102, for the CRPS itself). They
  carry exact hand-written gradients (``torch.autograd.Function``) that stay correct
  as ``scale -> 0`` and for ``|z|`` up to the overflow of the dtype.
* CRPS of an ensemble in O(M log M) with a sort (Zamo & Naveau 2018, Math. Geosci.
  50, 209-234), with the *fair* estimator of Ferro (2014, Q. J. R. Meteorol. Soc. 140,
  1917-1923) as default and the biased energy-form estimator ("nrg") for parity.
* The energy score (Gneiting & Raftery 2007, eq. 22) for multivariate ensembles.
* The interval score (Gneiting & Raftery 2007, eq. 43) and the quantile (pinball)
  score (Koenker & Bassett 1978; Gneiting & Raftery 2007, sec. 6).
* The Gaussian negative log-likelihood (the logarithmic score of a normal forecast)
  and the Dawid-Sebastiani score (Dawid & Sebastiani 1999; Gneiting & Raftery 2007).

Argument order and shapes (one contract for every function): the forecast's parameters
come first, the observations ``target`` last (``crps_normal(loc, scale, target)``,
``gaussian_nll(loc, spread, target)``, ``crps_ensemble(samples, target)``, ...). The
forecast parameters may broadcast *up to* the target's shape (a scalar ``scale``, one
ensemble shared by every item); the target itself is never broadcast: a ``target`` whose
shape differs from the broadcast of everything (e.g. ``(N, 1)`` against ``(N,)``
predictions, which would silently score all ``N x N`` pairs) raises
``ValueError("target: ...")``. ``reduction='none'`` therefore returns the target's shape
(``quantile_score``: ``(*target.shape, Q)``).

Dtypes: float16/bfloat16 inputs are computed (and returned) in float32; mixed dtypes
follow torch's type promotion. Sample-based scores subtract the detached ensemble mean
from samples and target first (the scores are shift-invariant), so float32 stays
accurate for data far from zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from torchcal.functional._validation import (
    check_finite,
    check_floating,
    check_nonempty,
    check_open_unit,
    check_option,
    check_positive,
    check_reduction,
    check_tensor,
    first_bad_position,
    reduce,
    values_checked,
)

__all__ = [
    "crps_normal",
    "crps_laplace",
    "crps_logistic",
    "crps_ensemble",
    "energy_score",
    "interval_score",
    "quantile_score",
    "gaussian_nll",
    "dawid_sebastiani_score",
]

_ESTIMATORS = ("fair", "nrg")
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_LOG2 = math.log(2.0)
_LOG_2PI = math.log(2.0 * math.pi)


# --------------------------------------------------------------------------- helpers


def _prepare(named: Sequence[tuple[str, Tensor]],
             options: Sequence[tuple[str, Tensor]] = ()) -> list[Tensor]:
    """Validate floating, non-empty, finite, mutually broadcastable tensors; cast them.

    The compute dtype is torch's promotion of the ``named`` tensors, at least float32;
    ``options`` (e.g. levels) are validated alike and cast to it without promoting it.
    Returns the cast tensors (not broadcast), ``named`` first.
    """
    everything = list(named) + list(options)
    for name, x in everything:
        check_floating(name, x)
        check_nonempty(name, x)
    shape = everything[0][1].shape
    for name, x in everything[1:]:
        try:
            shape = torch.broadcast_shapes(shape, x.shape)
        except RuntimeError:
            others = ", ".join(n for n, _ in everything if n != name)
            raise ValueError(f"{name}: expected a shape broadcastable with {others} "
                             f"{tuple(shape)}, got {tuple(x.shape)}") from None
    for name, x in everything:
        check_finite(name, x)
    dtype = named[0][1].dtype
    for _, x in named[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    if dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    return [x.to(dtype) for _, x in everything]


def _check_target_shape(target_shape: torch.Size, forecast: Sequence[tuple[str, torch.Size]],
                        what: str = "") -> None:
    """The forecast shapes must broadcast to ``target_shape``; the target is never broadcast.

    ``forecast`` holds (name, shape) pairs already compared with the target's shape
    (e.g. without the ensemble dimension); ``what`` says which part of the target's
    shape is meant in the message.
    """
    shape = torch.Size([])
    for i, (name, s) in enumerate(forecast):
        try:
            shape = torch.broadcast_shapes(shape, s)
        except RuntimeError:
            others = ", ".join(f"{n} {tuple(t)}" for n, t in forecast[:i])
            raise ValueError(f"{name}: expected a shape broadcastable with {others}, got "
                             f"{tuple(s)}") from None
    if _broadcast_or_none([shape, target_shape]) != target_shape:
        names = ", ".join(f"{n} {tuple(s)}" for n, s in forecast)
        raise ValueError(f"target: expected {what}shape {tuple(target_shape)} to match the "
                         f"forecast ({names}); the forecast may broadcast to the target's "
                         f"shape, the target is never broadcast (an (N, 1) target against "
                         f"(N,) predictions would score all N x N pairs)")


def _broadcast_or_none(shapes: Sequence[torch.Size]) -> torch.Size | None:
    try:
        return torch.broadcast_shapes(*shapes)
    except RuntimeError:
        return None


def _check_estimator(estimator: str) -> str:
    check_option("estimator", estimator, _ESTIMATORS)
    return estimator


def _check_alpha(alpha: float | Tensor) -> float | Tensor:
    """``alpha``: a number or a non-empty floating tensor, strictly inside (0, 1)."""
    if isinstance(alpha, Tensor):
        check_floating("alpha", alpha)
        check_nonempty("alpha", alpha)
        check_finite("alpha", alpha)
    elif isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha: expected a float or a tensor, got {type(alpha).__name__}")
    check_open_unit("alpha", alpha)
    return alpha if isinstance(alpha, Tensor) else float(alpha)


def _check_levels(quantiles: Tensor | Sequence[float]) -> Tensor:
    """``quantiles``: a non-empty 1-d tensor (or sequence) of levels in (0, 1)."""
    if not isinstance(quantiles, Tensor):
        try:
            quantiles = torch.as_tensor(list(quantiles), dtype=torch.float64)
        except (TypeError, ValueError):
            raise TypeError("quantiles: expected a 1-d tensor or a sequence of floats, got "
                            f"{type(quantiles).__name__}") from None
    check_floating("quantiles", quantiles)
    if quantiles.dim() != 1 or quantiles.numel() == 0:
        raise ValueError(f"quantiles: expected a non-empty 1-d tensor of levels, got shape "
                         f"{tuple(quantiles.shape)}")
    check_finite("quantiles", quantiles)
    check_open_unit("quantiles", quantiles)
    return quantiles


# ------------------------------------------------------------ closed-form CRPS (exact grads)
#
# Each family has CRPS(F_{mu,s}, y) = s * g(z), z = (y - mu) / s, with g'(z) = 2 F_0(z) - 1,
# so  d/dy = g'(z),  d/dmu = -g'(z),  d/ds = g(z) - z g'(z).  The values are written as
# |y - mu| * (...) + s * (...) so that nothing multiplies an overflowing z by a small s,
# and d/ds is written without the cancellation of g(z) - z g'(z) for large |z|.
# The backward passes are built from differentiable torch ops on the saved inputs, so
# double backward (e.g. gradient penalties, Hessian-vector products) works as well.


def _normal_value(loc: Tensor, scale: Tensor, target: Tensor) -> Tensor:
    d = target - loc
    z = d / scale
    pdf = torch.exp(-0.5 * z * z) * (1.0 / math.sqrt(2.0 * math.pi))
    return d * torch.erf(z * _INV_SQRT2) + scale * (2.0 * pdf - _INV_SQRT_PI)


def _normal_grads(loc: Tensor, scale: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    z = (target - loc) / scale
    d_target = torch.erf(z * _INV_SQRT2)  # 2 Phi(z) - 1
    # 2 phi(z) - 1/sqrt(pi) = (sqrt(2) exp(-z^2/2) - 1) / sqrt(pi) = expm1((ln 2 - z^2)/2)/sqrt(pi)
    d_scale = torch.expm1(0.5 * (_LOG2 - z * z)) * _INV_SQRT_PI
    return d_target, d_scale


def _laplace_value(loc: Tensor, scale: Tensor, target: Tensor) -> Tensor:
    d = target - loc
    a = d.abs() / scale
    return d.abs() + scale * (torch.exp(-a) - 0.75)


def _laplace_grads(loc: Tensor, scale: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    d = target - loc
    a = (d.abs() / scale).clamp(max=torch.finfo(d.dtype).max)  # z overflow -> finite limits
    d_target = torch.sign(d) * -torch.expm1(-a)  # sign(z) (1 - exp(-|z|))
    d_scale = torch.exp(-a) * (1.0 + a) - 0.75
    return d_target, d_scale


def _logistic_value(loc: Tensor, scale: Tensor, target: Tensor) -> Tensor:
    d = target - loc
    a = d.abs() / scale
    return d.abs() + scale * (2.0 * torch.nn.functional.softplus(-a) - 1.0)


def _logistic_grads(loc: Tensor, scale: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    z = (target - loc) / scale
    a = z.abs().clamp(max=torch.finfo(z.dtype).max)
    d_target = torch.tanh(0.5 * z)  # 2 F(z) - 1
    # g(z) - z g'(z) = 2 softplus(-|z|) + 2 |z| sigmoid(-|z|) - 1
    d_scale = 2.0 * (torch.nn.functional.softplus(-a) + a * torch.sigmoid(-a)) - 1.0
    return d_target, d_scale


def _make_crps_function(value_fn, grads_fn, name: str) -> type[torch.autograd.Function]:
    class _CRPS(torch.autograd.Function):
        @staticmethod
        def forward(ctx, loc: Tensor, scale: Tensor, target: Tensor) -> Tensor:
            ctx.save_for_backward(loc, scale, target)
            return value_fn(loc, scale, target)

        @staticmethod
        def backward(ctx, grad: Tensor):
            loc, scale, target = ctx.saved_tensors
            d_target, d_scale = grads_fn(loc, scale, target)
            need_loc, need_scale, need_target = ctx.needs_input_grad
            return (-grad * d_target if need_loc else None,
                    grad * d_scale if need_scale else None,
                    grad * d_target if need_target else None)

    _CRPS.__name__ = _CRPS.__qualname__ = name
    return _CRPS


_CRPSNormal = _make_crps_function(_normal_value, _normal_grads, "_CRPSNormal")
_CRPSLaplace = _make_crps_function(_laplace_value, _laplace_grads, "_CRPSLaplace")
_CRPSLogistic = _make_crps_function(_logistic_value, _logistic_grads, "_CRPSLogistic")


def _location_scale(loc: Tensor, scale: Tensor, target: Tensor, scale_name: str = "scale"
                    ) -> list[Tensor]:
    """Validate ``(loc, scale, target)`` of a location-scale forecast, target last."""
    for name, x in (("loc", loc), (scale_name, scale), ("target", target)):
        check_tensor(name, x)
    out = _prepare([("loc", loc), (scale_name, scale), ("target", target)])
    _check_target_shape(target.shape, [("loc", loc.shape), (scale_name, scale.shape)])
    return out


def _crps_closed_form(fn, loc: Tensor, scale: Tensor, target: Tensor, reduction: str) -> Tensor:
    check_reduction(reduction)
    (loc, scale, target) = _location_scale(loc, scale, target)
    check_positive("scale", scale)
    loc, scale, target = torch.broadcast_tensors(loc, scale, target)
    return reduce(fn.apply(loc, scale, target), reduction)


def crps_normal(loc: Tensor, scale: Tensor, target: Tensor, *, reduction: str = "mean") -> Tensor:
    r"""CRPS of a normal forecast :math:`N(\mu, \sigma^2)` for observations ``target``.

    :math:`\mathrm{CRPS} = \sigma\,[z(2\Phi(z) - 1) + 2\varphi(z) - 1/\sqrt{\pi}]` with
    :math:`z = (y - \mu)/\sigma` (Gneiting et al. 2005). Gradients are exact
    closed forms: :math:`\partial/\partial y = 2\Phi(z) - 1`,
    :math:`\partial/\partial\sigma = 2\varphi(z) - 1/\sqrt{\pi}` (evaluated as
    ``expm1((ln 2 - z^2)/2) / sqrt(pi)``), correct as :math:`\sigma \to 0` where plain
    autograd through ``z`` is not. Double backward is supported.

    Args:
        loc: mean :math:`\mu`, broadcastable to the target's shape.
        scale: standard deviation :math:`\sigma > 0`, broadcastable to the target's shape.
        target: observations :math:`y`; never broadcast (an ``(N, 1)`` target against
            ``(N,)`` parameters raises).
        reduction: ``'mean'`` | ``'sum'`` | ``'none'`` (the target's shape).

    Example:
        >>> import torch
        >>> from torchcal.functional import crps_normal
        >>> round(crps_normal(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(0.0)).item(), 5)
        0.23369
    """
    return _crps_closed_form(_CRPSNormal, loc, scale, target, reduction)


def crps_laplace(loc: Tensor, scale: Tensor, target: Tensor, *,
                 reduction: str = "mean") -> Tensor:
    r"""CRPS of a Laplace forecast with location :math:`\mu` and scale :math:`b`.

    :math:`\mathrm{CRPS} = b\,[|z| + e^{-|z|} - 3/4]`, :math:`z = (y - \mu)/b`
    (Jordan, Krueger & Lerch 2019, scoringRules). Exact closed-form gradients
    (:math:`\partial/\partial b = e^{-|z|}(1 + |z|) - 3/4`); double backward supported.

    Args:
        loc: location :math:`\mu`.
        scale: scale :math:`b > 0` (the standard deviation is :math:`\sqrt{2} b`).
        target: observations, never broadcast (``loc``/``scale`` broadcast to its shape).
        reduction: ``'mean'`` | ``'sum'`` | ``'none'`` (the target's shape).

    Example:
        >>> import torch
        >>> from torchcal.functional import crps_laplace
        >>> round(crps_laplace(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(0.0)).item(), 5)
        0.25
    """
    return _crps_closed_form(_CRPSLaplace, loc, scale, target, reduction)


def crps_logistic(loc: Tensor, scale: Tensor, target: Tensor, *,
                  reduction: str = "mean") -> Tensor:
    r"""CRPS of a logistic forecast with location :math:`\mu` and scale :math:`s`.

    :math:`\mathrm{CRPS} = s\,[z - 2\log F(z) - 1]` with :math:`F` the standard logistic
    CDF and :math:`z = (y - \mu)/s` (Jordan, Krueger & Lerch 2019, scoringRules),
    evaluated stably as :math:`|y-\mu| + s\,[2\,\mathrm{softplus}(-|z|) - 1]`. Exact
    closed-form gradients; double backward supported.

    Args:
        loc: location :math:`\mu`.
        scale: scale :math:`s > 0` (the standard deviation is :math:`s\pi/\sqrt{3}`).
        target: observations, never broadcast (``loc``/``scale`` broadcast to its shape).
        reduction: ``'mean'`` | ``'sum'`` | ``'none'`` (the target's shape).

    Example:
        >>> import torch
        >>> from torchcal.functional import crps_logistic
        >>> round(crps_logistic(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(0.0)).item(), 5)
        0.38629
    """
    return _crps_closed_form(_CRPSLogistic, loc, scale, target, reduction)


# ------------------------------------------------------------------------ ensemble scores


def _ensemble_size_check(m: int, estimator: str) -> None:
    if estimator == "fair" and m < 2:
        raise ValueError(f"samples: the fair estimator (estimator='fair') needs at least 2 "
                         f"ensemble members, got {m}; use estimator='nrg' for a single member")


def _argsort_last(x: Tensor) -> Tensor:
    """Indices sorting ``x`` along its last dim.

    On CPU, numpy's introsort is an order of magnitude faster than ``torch.sort`` for many
    short rows (measured 1.2 ms vs 15 ms for 2000 x 100 float32); elsewhere ``torch.sort``.
    """
    if x.device.type == "cpu" and type(x) is Tensor and x.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(x.detach().contiguous().numpy().argsort(axis=-1))
    return torch.sort(x.detach(), dim=-1).indices


class _CRPSEnsemble(torch.autograd.Function):
    """Ensemble CRPS of centred members ``x`` (..., M) and target ``y`` (..., 1).

    ``mean_i |x_i - y| - sum_i (2i - M - 1) x_(i) / denom``. The score is piecewise linear,
    so its gradient is a per-element coefficient saved in the forward:
    ``d/dx_j = sign(x_j - y)/M - (2 rank_j - M - 1)/denom`` and
    ``d/dy = -sum_j sign(x_j - y)/M`` (the rank weights sum to zero). The backward is
    linear in the incoming gradient, so double backward is exact (second derivatives are
    zero almost everywhere).
    """

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, denom: int) -> Tensor:
        m = x.shape[-1]
        idx = _argsort_last(x).to(x.device)
        sorted_x = x.gather(-1, idx)
        w = torch.arange(1 - m, m, 2, dtype=x.dtype, device=x.device)  # 2i - M - 1
        half_pairs = (sorted_x * w).sum(dim=-1)  # = (1/2) sum_ij |x_i - x_j|
        diff = x - y
        score = diff.abs().mean(dim=-1) - half_pairs / denom
        if any(ctx.needs_input_grad[:2]):
            coef = torch.sign(diff).div_(m)
            coef.scatter_add_(-1, idx, (w / -denom).expand_as(x))
            ctx.save_for_backward(coef)
        return score

    @staticmethod
    def backward(ctx, grad: Tensor):
        (coef,) = ctx.saved_tensors
        grad = grad.unsqueeze(-1)
        grad_x = grad * coef if ctx.needs_input_grad[0] else None
        grad_y = -grad * coef.sum(dim=-1, keepdim=True) if ctx.needs_input_grad[1] else None
        return grad_x, grad_y, None


def crps_ensemble(samples: Tensor, target: Tensor, *, estimator: str = "fair",
                  ensemble_dim: int = -1, reduction: str = "mean") -> Tensor:
    r"""CRPS of an ensemble (empirical) forecast, in O(M log M) per item.

    :math:`\mathrm{CRPS} = \frac1M\sum_i |x_i - y| - \frac{1}{2M(M-1)}\sum_{i,j}|x_i - x_j|`
    for ``estimator='fair'`` (Ferro 2014; unbiased for the CRPS of the distribution the
    members are drawn from) and with :math:`2M^2` in the denominator for ``'nrg'``
    (the kernel form, Gneiting & Raftery 2007, eq. 21: the CRPS of the empirical law, as in
    properscoring and scoringrules' ``estimator='nrg'``). The pair sum uses the sorted
    members: :math:`\sum_{i,j}|x_i - x_j| = 2\sum_i (2i - M - 1)\,x_{(i)}` (Zamo &
    Naveau 2018). Samples and target are centred on the detached ensemble mean first,
    which keeps float32 accurate at large offsets. The gradient is exact (the score is
    piecewise linear: ``sign(x_j - y)/M`` minus the rank weight of ``x_j``) and saved
    during the forward, so the backward costs one multiply; ties get the subgradient of
    one ordering. On CPU the sort uses numpy's argsort (much faster than ``torch.sort``
    for many short rows), elsewhere ``torch.sort``.

    Use the default ``'fair'`` for training: the ``'nrg'`` estimator is biased towards
    under-dispersed ensembles (fitting the spread of a 4-member Gaussian ensemble to
    N(0, 1) data with it learns sigma ~ 0.64; with ``'fair'`` it learns 1).

    Args:
        samples: ensemble members, ``ensemble_dim`` holds the ``M`` members; without that
            dim, broadcastable to the target's shape (e.g. ``(N, M)`` for ``(N,)``).
        target: observations, never broadcast: shape ``(N,)`` for samples ``(N, M)``.
        estimator: ``'fair'`` (default, needs ``M >= 2``) or ``'nrg'``.
        ensemble_dim: the dimension of ``samples`` that indexes members (default last).
        reduction: ``'mean'`` | ``'sum'`` | ``'none'`` (the target's shape).

    Example:
        >>> import torch
        >>> from torchcal.functional import crps_ensemble
        >>> x = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
        >>> y = torch.tensor([1.5])
        >>> round(crps_ensemble(x, y).item(), 4), round(crps_ensemble(x, y, estimator="nrg").item(), 4)
        (0.1667, 0.375)
    """
    check_reduction(reduction)
    _check_estimator(estimator)
    check_tensor("samples", samples)
    if isinstance(ensemble_dim, bool) or not isinstance(ensemble_dim, int):
        raise TypeError(f"ensemble_dim: expected an int, got {type(ensemble_dim).__name__}")
    if samples.dim() == 0 or not -samples.dim() <= ensemble_dim < samples.dim():
        raise ValueError(f"ensemble_dim: expected a dimension of samples (shape "
                         f"{tuple(samples.shape)}), got {ensemble_dim}")
    check_floating("samples", samples)
    check_nonempty("samples", samples)
    x = samples.movedim(ensemble_dim, -1)
    m = x.shape[-1]
    _ensemble_size_check(m, estimator)
    check_floating("target", target)
    check_nonempty("target", target)
    _check_target_shape(target.shape, [("samples without ensemble_dim", x.shape[:-1])])
    (x, target) = _prepare([("samples", x), ("target", target.unsqueeze(-1))])
    x = x.expand(*torch.broadcast_shapes(x.shape[:-1], target.shape[:-1]), m)

    centre = x.detach().mean(dim=-1, keepdim=True)
    x = x - centre
    y = (target - centre).expand(*x.shape[:-1], 1)
    denom = m * (m - 1) if estimator == "fair" else m * m
    return reduce(_CRPSEnsemble.apply(x, y, denom), reduction)


def energy_score(samples: Tensor, target: Tensor, *, estimator: str = "fair",
                 reduction: str = "mean") -> Tensor:
    r"""Energy score of a multivariate ensemble (Gneiting & Raftery 2007, eq. 22).

    :math:`\mathrm{ES} = \frac1M\sum_i\|x_i - y\| - \frac{1}{2M(M-1)}\sum_{i,j}\|x_i - x_j\|`
    (``'fair'``, default) or with :math:`2M^2` (``'nrg'``, scoringrules' ``es_ensemble``
    default). Euclidean norms via ``torch.linalg.vector_norm`` and ``torch.cdist`` in its
    exact (no-matmul) mode after centring on the detached ensemble mean. Memory is
    O(M^2) per item for the pair term. Double backward is not supported (``cdist``).

    Args:
        samples: ``(..., M, D)`` ensemble of ``M`` members in ``D`` dimensions.
        target: ``(..., D)`` observations; ``samples``' batch dims broadcast to the
            target's, never the other way round.
        estimator: ``'fair'`` (needs ``M >= 2``) or ``'nrg'``.
        reduction: ``'mean'`` | ``'sum'`` | ``'none'`` (batch shape ``...``).

    Example:
        >>> import torch
        >>> from torchcal.functional import energy_score
        >>> x = torch.tensor([[[0.0, 0.0], [3.0, 4.0]]])
        >>> energy_score(x, torch.tensor([[0.0, 0.0]]), estimator="nrg").item()
        1.25
    """
    check_reduction(reduction)
    _check_estimator(estimator)
    check_tensor("samples", samples)
    check_tensor("target", target)
    check_floating("samples", samples)
    check_nonempty("samples", samples)
    if samples.dim() < 2:
        raise ValueError(f"samples: expected shape (..., M, D) with at least 2 dims, got "
                         f"{tuple(samples.shape)}")
    m, dim = samples.shape[-2], samples.shape[-1]
    _ensemble_size_check(m, estimator)
    check_floating("target", target)
    check_nonempty("target", target)
    if target.dim() < 1 or target.shape[-1] != dim:
        raise ValueError(f"target: expected shape (..., D) with D = {dim} (the last dim of "
                         f"samples), got {tuple(target.shape)}")
    _check_target_shape(target.shape[:-1], [("samples' batch dims", samples.shape[:-2])],
                        "batch ")
    (x, y) = _prepare([("samples", samples), ("target", target.unsqueeze(-2))])

    centre = x.detach().mean(dim=-2, keepdim=True)
    x = x - centre
    y = y - centre  # (..., 1, D)
    abs_err = torch.linalg.vector_norm(x - y, dim=-1).mean(dim=-1)
    batch = x.shape[:-2]
    flat = x.reshape(-1, m, dim)
    pair_sum = torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist")
    pair_sum = pair_sum.sum(dim=(-2, -1)).reshape(batch)
    denom = 2 * m * (m - 1) if estimator == "fair" else 2 * m * m
    return reduce(abs_err - pair_sum / denom, reduction)


# ------------------------------------------------------------------- interval and quantile


def interval_score(lower: Tensor, upper: Tensor, target: Tensor, *, alpha: float | Tensor,
                   reduction: str = "mean") -> Tensor:
    r"""Interval score of a central :math:`(1-\alpha)` prediction interval ``[lower, upper]``.

    :math:`\mathrm{IS}_\alpha = (u - l) + \frac{2}{\alpha}(l - y)\,1\{y < l\}
    + \frac{2}{\alpha}(y - u)\,1\{y > u\}` (Gneiting & Raftery 2007, eq. 43; the same
    convention as scoringrules' ``interval_score``).

    Args:
        lower, upper: interval bounds, ``lower <= upper``, broadcastable to the target's
            shape.
        target: observations, never broadcast: the bounds and ``alpha`` broadcast to its
            shape; or, for ``K`` levels at once (as scoringrules), bounds ``(..., K)``,
            ``alpha`` of shape ``(K,)`` and ``target`` ``(...)``.
        alpha: miscoverage level in (0, 1): a float or a tensor (see ``target``).
        reduction: ``'mean'`` | ``'sum'`` | ``'none'`` (the target's shape, or
            ``(..., K)`` for ``K`` levels).

    Example:
        >>> import torch
        >>> from torchcal.functional import interval_score
        >>> l, u, y = torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.5, 2.0])
        >>> interval_score(l, u, y, alpha=0.5, reduction="none").tolist()
        [1.0, 5.0]
    """
    check_reduction(reduction)
    alpha = _check_alpha(alpha)
    for name, x in (("lower", lower), ("upper", upper), ("target", target)):
        check_tensor(name, x)
    options = [("alpha", alpha)] if isinstance(alpha, Tensor) else []
    forecast = [("lower", lower.shape), ("upper", upper.shape)] + [
        (n, x.shape) for n, x in options]
    if isinstance(alpha, Tensor) and alpha.dim() == 1 and target.shape != _broadcast_or_none(
            [s for _, s in forecast] + [target.shape]):
        # K levels at once: bounds (..., K), alpha (K,), target (...), as quantile_score
        _check_target_shape(target.shape, [(n, s[:-1]) for n, s in forecast[:2]])
        for n, s in forecast[:2]:
            if s.numel() and (len(s) == 0 or s[-1] != alpha.shape[0]):
                raise ValueError(f"{n}: expected shape (..., K) with K = {alpha.shape[0]} "
                                 f"(the number of alpha levels) for a target of shape "
                                 f"{tuple(target.shape)}, got {tuple(s)}")
        target = target.unsqueeze(-1)
    else:
        _check_target_shape(target.shape, forecast)
    named = [("lower", lower), ("upper", upper), ("target", target)]
    tensors = _prepare(named, options)
    lower, upper, target = tensors[:3]
    if isinstance(alpha, Tensor):
        alpha = tensors[3]
    if values_checked():
        bad = lower > upper
        if bool(bad.any()):
            raise ValueError(f"upper: expected upper >= lower, got upper < lower at position "
                             f"{first_bad_position(bad)}")
    penalty = torch.relu(lower - target) + torch.relu(target - upper)
    return reduce((upper - lower) + (2.0 / alpha) * penalty, reduction)


def quantile_score(pred: Tensor, target: Tensor, quantiles: Tensor | Sequence[float], *,
                   reduction: str = "mean") -> Tensor:
    r"""Quantile (pinball) score of predicted quantiles at several levels at once.

    :math:`\mathrm{QS}_\tau(q, y) = (1\{y < q\} - \tau)(q - y)`, i.e. :math:`\tau(y - q)`
    if :math:`y > q` and :math:`(1-\tau)(q - y)` otherwise (Koenker & Bassett 1978;
    Gneiting & Raftery 2007, sec. 6). This is the 1x convention of
    scoringrules' ``quantile_score`` (not the 2x one whose level-0.5 score is the absolute
    error); averaged over many levels it approximates CRPS / 2.

    Args:
        pred: ``(..., Q)`` predicted quantiles, one per level.
        target: ``(...)`` observations, never broadcast (``pred[..., 0]`` broadcasts to
            the target's shape).
        quantiles: ``(Q,)`` levels in (0, 1), a tensor or a sequence of floats.
        reduction: ``'none'`` returns ``(..., Q)``; ``'mean'``/``'sum'`` run over all
            items and levels.

    Example:
        >>> import torch
        >>> from torchcal.functional import quantile_score
        >>> pred = torch.tensor([[0.0, 1.0, 2.0]])
        >>> qs = quantile_score(pred, torch.tensor([1.5]), [0.1, 0.5, 0.9], reduction="none")
        >>> [round(v, 4) for v in qs[0].tolist()]
        [0.15, 0.25, 0.05]
    """
    check_reduction(reduction)
    quantiles = _check_levels(quantiles)
    check_tensor("pred", pred)
    check_tensor("target", target)
    check_floating("pred", pred)
    if pred.dim() < 1 or pred.shape[-1] != quantiles.shape[0]:
        raise ValueError(f"pred: expected shape (..., Q) with Q = {quantiles.shape[0]} "
                         f"(the number of quantiles), got {tuple(pred.shape)}")
    check_floating("target", target)
    _check_target_shape(target.shape, [("pred without its last dim", pred.shape[:-1])])
    pred, target, levels = _prepare([("pred", pred), ("target", target.unsqueeze(-1))],
                                    [("quantiles", quantiles)])
    diff = target - pred  # y - q
    score = torch.maximum(levels * diff, (levels - 1.0) * diff)
    return reduce(score, reduction)


# ----------------------------------------------------------- Gaussian NLL and Dawid-Sebastiani


def gaussian_nll(loc: Tensor, spread: Tensor, target: Tensor, *, var: bool = False,
                 full: bool = True, reduction: str = "mean") -> Tensor:
    r"""Negative log-likelihood of ``target`` under :math:`N(\mu, \sigma^2)` (log score).

    :math:`\frac12\left[\log\sigma^2 + (y-\mu)^2/\sigma^2\right] + \frac12\log 2\pi`
    (the constant only with ``full=True``, the default: then this is exactly the
    logarithmic score, Gneiting & Raftery 2007). ``spread`` is the standard deviation
    :math:`\sigma` by default, the variance :math:`\sigma^2` with ``var=True``. Unlike
    ``F.gaussian_nll_loss`` nothing is clamped: non-positive spreads raise.

    Argument order: forecast first, observations last, as every score in this module
    (``crps_normal(loc, scale, target)``). This is **not** the order of
    ``F.gaussian_nll_loss(input, target, var)``; the keyword-only ``var=True`` flag
    makes an old call ``gaussian_nll(loc, target, var=v)`` fail with a ``TypeError``
    instead of running with swapped arguments.

    Args:
        loc: mean :math:`\mu`, broadcastable to the target's shape.
        spread: standard deviation :math:`\sigma > 0` (or the variance with
            ``var=True``), broadcastable to the target's shape.
        target: observations, never broadcast.
        var: read ``spread`` as the variance.
        full: include :math:`\frac12\log 2\pi`.
        reduction: ``'mean'`` | ``'sum'`` | ``'none'`` (the target's shape).

    Example:
        >>> import torch
        >>> from torchcal.functional import gaussian_nll
        >>> round(gaussian_nll(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(0.0)).item(), 5)
        0.91894
        >>> round(gaussian_nll(torch.tensor(0.0), torch.tensor(4.0), torch.tensor(2.0),
        ...                    var=True).item(), 5)
        2.11209
    """
    check_reduction(reduction)
    if not isinstance(var, bool):
        raise TypeError(f"var: expected a bool (spread is the variance), got "
                        f"{type(var).__name__}; the signature is gaussian_nll(loc, spread, "
                        f"target, *, var=False)")
    if not isinstance(full, bool):
        raise TypeError(f"full: expected a bool, got {type(full).__name__}")
    (loc, spread, target) = _location_scale(loc, spread, target, "spread")
    check_positive("spread", spread)
    if var:
        d = target - loc
        nll = 0.5 * (torch.log(spread) + d * d / spread)
    else:
        z = (target - loc) / spread
        nll = torch.log(spread) + 0.5 * z * z
    if full:
        nll = nll + 0.5 * _LOG_2PI
    return reduce(nll, reduction)


def dawid_sebastiani_score(loc: Tensor, scale: Tensor, target: Tensor, *,
                           reduction: str = "mean") -> Tensor:
    r"""Dawid-Sebastiani score :math:`((y - \mu)/\sigma)^2 + 2\log\sigma`.

    Proper for every forecast with mean :math:`\mu` and standard deviation :math:`\sigma`
    (Dawid & Sebastiani 1999, Ann. Statist. 27; Gneiting & Raftery 2007); for a normal forecast it
    equals ``2 * gaussian_nll(..., full=False)``.

    Args:
        loc: predictive mean :math:`\mu`, broadcastable to the target's shape.
        scale: predictive standard deviation :math:`\sigma > 0`, likewise.
        target: observations, never broadcast.
        reduction: ``'mean'`` | ``'sum'`` | ``'none'`` (the target's shape).

    Example:
        >>> import torch
        >>> from torchcal.functional import dawid_sebastiani_score
        >>> dawid_sebastiani_score(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(2.0)).item()
        4.0
    """
    check_reduction(reduction)
    (loc, scale, target) = _location_scale(loc, scale, target)
    check_positive("scale", scale)
    z = (target - loc) / scale
    return reduce(z * z + 2.0 * torch.log(scale), reduction)
