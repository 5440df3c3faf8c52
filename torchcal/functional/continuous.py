"""Proper scoring rules for real-valued (continuous) forecasts.

Every score is negatively oriented (lower is better) and returns per-item values that
are reduced with ``reduction='mean'|'sum'|'none'``. The CRPS family (closed forms,
ensembles, the energy score) lives in :mod:`torchcal.functional.crps` and is re-exported
here; this module holds the contract below and the other scores:

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
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_bool,
    check_floating,
    check_reduction,
    check_tensor,
    check_values,
    reduce,
    values_checked,
)
from torchcal.functional._forecast import (
    broadcast_or_none,
    cast_forecast,
    check_after,
    check_location_scale,
    check_target_shape,
    gaussian_spread,
    plain_cpu,
)
from torchcal.functional._validation import check_alpha, check_interval_bounds, check_levels

__all__ = [
    "interval_score",
    "quantile_score",
    "gaussian_nll",
    "dawid_sebastiani_score",
]

_LOG_2PI = math.log(2.0 * math.pi)


# ------------------------------------------------------------------- interval and quantile


def interval_inputs(
    lower: Tensor, upper: Tensor, target: Tensor, alpha: float | Tensor
) -> tuple[Tensor, Tensor, Tensor, float | Tensor]:
    """Checked and cast ``(lower, upper, target, alpha)`` of :func:`interval_score` (shapes,
    finite values, ``alpha`` in (0, 1)); for ``K`` levels at once (bounds ``(..., K)``,
    ``alpha`` ``(K,)``, target ``(...)``) the target comes back as ``(..., 1)``. The
    ``lower <= upper`` check is :func:`check_interval_width`."""
    alpha = check_alpha(alpha)
    for name, x in (("lower", lower), ("upper", upper), ("target", target)):
        check_tensor(name, x)
    options = [("alpha", alpha)] if isinstance(alpha, Tensor) else []
    forecast = [("lower", lower.shape), ("upper", upper.shape)] + [(n, x.shape) for n, x in options]
    if (
        isinstance(alpha, Tensor)
        and alpha.dim() == 1
        and target.shape != broadcast_or_none([s for _, s in forecast] + [target.shape])
    ):
        # K levels at once: bounds (..., K), alpha (K,), target (...), as quantile_score
        check_target_shape(target.shape, [(n, s[:-1]) for n, s in forecast[:2]])
        for n, s in forecast[:2]:
            if s.numel() and (len(s) == 0 or s[-1] != alpha.shape[0]):
                raise ValueError(
                    f"{n}: expected shape (..., K) with K = {alpha.shape[0]} "
                    f"(the number of alpha levels) for a target of shape "
                    f"{tuple(target.shape)}, got {tuple(s)}"
                )
        target = target.unsqueeze(-1)
    else:
        check_target_shape(target.shape, forecast)
    named = [("lower", lower), ("upper", upper), ("target", target)]
    tensors = cast_forecast(named, options)
    return tensors[0], tensors[1], tensors[2], tensors[3] if options else alpha


def check_interval_width(width: Tensor, lower: Tensor, upper: Tensor) -> None:
    """``lower <= upper``, read from ``width = upper - lower`` (or from block minima of it):
    :math:`u - l < 0` exactly when :math:`u < l` (IEEE subtraction keeps the sign), one
    ``amin`` pass; where it fails, the full check names the position
    (``ValueError('upper: ...')``). Off with the value checks."""
    if values_checked() and width.numel():
        check_values(
            width.detach().amin() >= 0,
            "upper: expected upper >= lower",
            lambda: check_interval_bounds(lower, upper),
        )


def interval_parts(lower: Tensor, upper: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    r"""Width and penalty of intervals, the two parts of the interval score and the
    coverage (one place for both; bounds and target already checked and cast, ``lower <=
    upper`` checked with :func:`check_interval_width`).

    ``width`` :math:`u - l` (the bounds' broadcast shape) and ``penalty``, the distance
    :math:`|y - \mathrm{clamp}(y, l, u)| = (l - y)\,1\{y < l\} + (y - u)\,1\{y > u\}`
    from the target to the interval (the shape of all three broadcast), in the inputs'
    dtype (for ``lower <= upper``; unchecked ``lower > upper`` gives
    :math:`(l - y)^+ + (y - u)^+`).
    ``penalty == 0`` exactly when :math:`l \le y \le u` (IEEE subtraction of two different
    floats is never 0 without flush-to-zero), so the coverage is read from it.

    Example:
        >>> import torch
        >>> from torchcal.functional.continuous import interval_parts
        >>> l, u = torch.tensor([0.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 1.0])
        >>> width, penalty = interval_parts(l, u, torch.tensor([-0.5, 1.0, 3.0]))
        >>> width.tolist(), penalty.tolist()
        ([1.0, 1.0, 1.0], [0.5, 0.0, 2.0])
    """
    width = upper - lower
    if lower.shape == upper.shape == target.shape:
        shape = target.shape
    else:
        shape = broadcast_or_none([lower.shape, upper.shape, target.shape])
    if target.shape != shape:  # e.g. (N, 1) against (N, K) bounds: contiguous loops are faster
        target = target.expand(shape).contiguous()
    # (l - y)^+ + (y - u)^+: one term is exactly 0, so this is the distance to [l, u] with one
    # rounding; cheaper to differentiate than a clamp between tensor bounds
    penalty = (lower - target).clamp_min(0.0) + (target - upper).clamp_min(0.0)
    return width, penalty


def interval_score_from_parts(width: Tensor, penalty: Tensor, alpha: float | Tensor) -> Tensor:
    r"""The interval score from its parts (:func:`interval_parts`):
    :math:`\mathrm{width} + \frac{2}{\alpha}\,\mathrm{penalty}`; linear, so it also turns
    summed widths and penalties into a summed score. A float ``alpha`` takes one kernel
    (``torch.add`` with ``alpha=``: one autograd node, and on the CPU a fused multiply-add,
    one rounding instead of two)."""
    if isinstance(alpha, Tensor):
        return width + (2.0 / alpha) * penalty
    return torch.add(width, penalty, alpha=2.0 / alpha)


def _interval_checks(
    lower: Tensor, upper: Tensor, target: Tensor, alpha: float, width: Tensor
) -> None:
    """The full checks of :func:`interval_score`, in today's order (its fast path's fallback)."""
    interval_inputs(lower, upper, target, alpha)
    check_interval_width(width, lower, upper)


def interval_score(
    lower: Tensor, upper: Tensor, target: Tensor, *, alpha: float | Tensor, reduction: str = "mean"
) -> Tensor:
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
    if type(alpha) is float and 0.0 < alpha < 1.0 and plain_cpu(lower, upper, target):
        # the common layout: nothing to cast or broadcast; checked from what is computed
        width, penalty = interval_parts(lower, upper, target)
        out = reduce(interval_score_from_parts(width, penalty, alpha), reduction)
        # NaN/Inf anywhere: the result is not finite; lower > upper: a negative width
        check_after(
            out,
            reduction,
            _interval_checks,
            lower,
            upper,
            target,
            alpha,
            width,
            extra_ok=lambda: width.data.amin().item() >= 0,
        )
        return out
    lower, upper, target, alpha = interval_inputs(lower, upper, target, alpha)
    width, penalty = interval_parts(lower, upper, target)
    check_interval_width(width, lower, upper)
    return reduce(interval_score_from_parts(width, penalty, alpha), reduction)


def quantile_score(
    pred: Tensor, target: Tensor, quantiles: Tensor | Sequence[float], *, reduction: str = "mean"
) -> Tensor:
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
    return quantile_score_of(pred, target, check_levels(quantiles), reduction)


def quantile_score_of(pred: Tensor, target: Tensor, quantiles: Tensor, reduction: str) -> Tensor:
    """:func:`quantile_score` of checked ``quantiles`` (:func:`check_levels`, e.g. the buffer of
    ``QuantileLoss``) and ``reduction``; ``pred`` and ``target`` are checked here."""
    if (
        plain_cpu(target)
        and type(pred) is Tensor
        and pred.dtype == target.dtype
        and pred.is_cpu
        and pred.dim() == target.dim() + 1
        and pred.shape[:-1] == target.shape
        and pred.shape[-1] == quantiles.shape[0]
    ):  # the common layout: nothing to broadcast; checked from the result
        levels = quantiles.to(pred.dtype)
        diff = target.unsqueeze(-1) - pred  # y - q
        out = reduce(torch.maximum(levels * diff, (levels - 1.0) * diff), reduction)
        check_after(
            out,
            reduction,
            lambda: cast_forecast(
                [("pred", pred), ("target", target.unsqueeze(-1))], [("quantiles", quantiles)]
            ),
        )
        return out
    check_tensor("pred", pred)
    check_tensor("target", target)
    check_floating("pred", pred)
    if pred.dim() < 1 or pred.shape[-1] != quantiles.shape[0]:
        raise ValueError(
            f"pred: expected shape (..., Q) with Q = {quantiles.shape[0]} "
            f"(the number of quantiles), got {tuple(pred.shape)}"
        )
    check_floating("target", target)
    check_target_shape(target.shape, [("pred without its last dim", pred.shape[:-1])])
    pred, target, levels = cast_forecast(
        [("pred", pred), ("target", target.unsqueeze(-1))], [("quantiles", quantiles)]
    )
    diff = target - pred  # y - q
    score = torch.maximum(levels * diff, (levels - 1.0) * diff)
    return reduce(score, reduction)


# ----------------------------------------------------------- Gaussian NLL and Dawid-Sebastiani


def _normal_log_term(loc: Tensor, scale: Tensor, target: Tensor) -> Tensor:
    """``log(scale) + z^2 / 2`` with ``z = (target - loc) / scale``: the Gaussian NLL without
    its constant, and half the Dawid-Sebastiani score."""
    z = (target - loc) / scale
    return torch.log(scale) + 0.5 * z * z


def gaussian_nll(
    loc: Tensor,
    spread: Tensor | None = None,
    target: Tensor | None = None,
    *,
    var: Tensor | None = None,
    sd: Tensor | None = None,
    full: bool = True,
    reduction: str = "mean",
) -> Tensor:
    r"""Negative log-likelihood of ``target`` under :math:`N(\mu, \sigma^2)` (log score).

    :math:`\frac12\left[\log\sigma^2 + (y-\mu)^2/\sigma^2\right] + \frac12\log 2\pi`
    (the constant only with ``full=True``, the default: then this is exactly the
    logarithmic score, Gneiting & Raftery 2007). Unlike ``F.gaussian_nll_loss`` nothing is
    clamped: non-positive spreads raise.

    **The spread** is given once: by name, ``var=`` (the variance :math:`\sigma^2`) or
    ``sd=`` (the standard deviation :math:`\sigma`), or positionally as ``spread``, which
    is the **standard deviation** (as the ``GaussianNLL`` metric's ``scale``; the loss
    ``GaussianNLLLoss`` reads its positional spread as the variance, as torch). ``var=`` with
    ``sd=`` raise ``ValueError``; a positional spread with a named one, or none, raise
    ``TypeError``. The spread is never guessed from its values. The old flag ``var=True``
    (the positional spread is the variance) still works for one release, with a
    ``FutureWarning``.

    Argument order: forecast first, observations last, as every score in this module
    (``crps_normal(loc, scale, target)``). This is **not** the order of
    ``F.gaussian_nll_loss(input, target, var)``: an old call ``gaussian_nll(loc, target,
    var=v)`` gives the spread twice and fails with a ``TypeError`` instead of running with
    swapped arguments.

    Args:
        loc: mean :math:`\mu`, broadcastable to the target's shape.
        spread: the standard deviation :math:`\sigma > 0`, broadcastable to the target's
            shape (or pass ``var=`` / ``sd=`` by name instead).
        target: observations, never broadcast.
        var: the variance :math:`\sigma^2 > 0`, by name.
        sd: the standard deviation :math:`\sigma > 0`, by name.
        full: include :math:`\frac12\log 2\pi`.
        reduction: ``'mean'`` | ``'sum'`` | ``'none'`` (the target's shape).

    Example:
        >>> import torch
        >>> from torchcal.functional import gaussian_nll
        >>> round(gaussian_nll(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(0.0)).item(), 5)
        0.91894
        >>> loc, y = torch.tensor(0.0), torch.tensor(2.0)
        >>> round(gaussian_nll(loc, target=y, var=torch.tensor(4.0)).item(), 5)
        2.11209
        >>> round(gaussian_nll(loc, target=y, sd=torch.tensor(2.0)).item(), 5)
        2.11209
    """
    check_reduction(reduction)
    positional = "sd"
    if isinstance(var, bool):  # the flag of the previous release: spread is the variance
        warnings.warn(
            "gaussian_nll(..., var=True) is deprecated and will be removed in the next "
            "release; pass the variance by name, gaussian_nll(loc, target=y, var=v), or the "
            "standard deviation, sd=s",
            FutureWarning,
            stacklevel=2,
        )
        positional, var = ("var" if var else "sd"), None
    elif var is not None and not isinstance(var, Tensor):
        raise TypeError(f"var: expected a Tensor (the variance), got {type(var).__name__}")
    name = "var" if var is not None else "sd" if sd is not None else "spread"
    spread, is_var = gaussian_spread("gaussian_nll", spread, var, sd, positional)
    if target is None:
        raise TypeError("gaussian_nll: missing target (the observations, after the forecast)")
    check_bool("full", full)
    return gaussian_nll_of(loc, spread, target, is_var, full, reduction, name)


def gaussian_nll_of(
    loc: Tensor,
    spread: Tensor,
    target: Tensor,
    is_var: bool,
    full: bool,
    reduction: str,
    spread_name: str = "spread",
) -> Tensor:
    """:func:`gaussian_nll` once the spread is resolved (``is_var``: it is the variance) and
    the options checked; the tensors are checked here (``spread_name`` names the spread in
    the messages). The one formula, shared by the loss and the metric."""
    fast = plain_cpu(loc, spread, target)
    if not fast:
        (loc, spread, target) = check_location_scale(loc, spread, target, spread_name)
    if is_var:
        d = target - loc
        nll = 0.5 * (torch.log(spread) + d * d / spread)
    else:
        nll = _normal_log_term(loc, spread, target)
    if full:
        nll = nll + 0.5 * _LOG_2PI
    out = reduce(nll, reduction)
    if fast:  # log(spread) is -inf or NaN for spread <= 0: the result shows every bad value
        check_after(out, reduction, check_location_scale, loc, spread, target, spread_name)
    return out


def dawid_sebastiani_score(
    loc: Tensor, scale: Tensor, target: Tensor, *, reduction: str = "mean"
) -> Tensor:
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
    fast = plain_cpu(loc, scale, target)
    if not fast:
        (loc, scale, target) = check_location_scale(loc, scale, target)
    # z^2 + 2 log s, bitwise 2 (log s + z^2 / 2) (scaling by 2 is exact), two ops fewer (not
    # addcmul: it fuses the product and the sum, another rounding); square() is z * z bitwise
    # and its backward is one op fewer than the product's
    z = (target - loc) / scale
    out = reduce(z.square() + 2.0 * torch.log(scale), reduction)
    if fast:  # log(scale) is -inf or NaN for scale <= 0: the result shows every bad value
        check_after(out, reduction, check_location_scale, loc, scale, target)
    return out
