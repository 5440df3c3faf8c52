"""Empirical-Bayes shrinkage of per-group estimates toward a common value.

The normal-normal model of a random-effects meta-analysis: group ``g`` has a true value
``theta_g ~ N(mu, tau^2)`` and an estimate ``x_g ~ N(theta_g, 1 / w_g)`` with known precision
``w_g`` (for a maximum-likelihood estimate, the observed information: the curvature of the
summed negative log-likelihood at ``x_g``). The posterior mean of ``theta_g`` given a
``center`` for ``mu`` is

    center + B_g (x_g - center),      B_g = w_g tau^2 / (1 + w_g tau^2),

so a group with little information (``w_g -> 0``) gets the ``center`` and one with much
(``w_g tau^2 >> 1``) keeps its own estimate. When ``w_g`` grows like ``n_g h_g`` (``n_g``
samples, ``h_g`` the information per sample), ``B_g = n_g / (n_g + k_g)`` with the prior
pseudo-count ``k_g = 1 / (h_g tau^2)``.

``tau^2`` is estimated from the data by the method of moments of DerSimonian & Laird (1986,
"Meta-analysis in clinical trials", Controlled Clinical Trials 7: 177-188):

    xbar = sum w x / sum w,   Q = sum w (x - xbar)^2,
    tau^2 = max(0, (Q - (G - 1)) / (sum w - sum w^2 / sum w)),

over the ``G`` groups with ``w_g > 0`` (fewer than two such groups: ``tau^2 = 0``, nothing
to compare, everything goes to the ``center``). Groups with ``w_g = 0`` (no information: no
samples, or an estimate on a bound) take no part and get the ``center``; their estimate may
be anything, even infinite.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchcal.functional._checks import check_finite

__all__ = ["between_group_variance", "empirical_bayes_shrinkage"]


def _check(estimates: Tensor, precisions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    if not isinstance(estimates, Tensor) or estimates.dim() != 1 or estimates.numel() == 0:
        raise ValueError(
            "estimates: expected a non-empty 1-d tensor (one estimate per group), got "
            f"{type(estimates).__name__} of shape {tuple(getattr(estimates, 'shape', ()))}"
        )
    if not isinstance(precisions, Tensor) or precisions.shape != estimates.shape:
        raise ValueError(
            f"precisions: expected a tensor of the estimates' shape {tuple(estimates.shape)}, "
            f"got shape {tuple(getattr(precisions, 'shape', ()))}"
        )
    w = precisions.to(torch.float64)
    check_finite("precisions", w)
    if bool((w < 0).any()):
        raise ValueError(f"precisions: expected values >= 0, got minimum {float(w.min())}")
    x = estimates.to(torch.float64)
    used = w > 0
    if bool((~torch.isfinite(x[used])).any()):
        raise ValueError("estimates: expected finite values where the precision is > 0")
    return torch.where(used, x, torch.zeros_like(x)), w, used


def between_group_variance(estimates: Tensor, precisions: Tensor) -> Tensor:
    """DerSimonian-Laird moment estimate of the between-group variance ``tau^2`` (a 0-d
    float64 tensor, ``>= 0``) of per-group ``estimates`` with ``precisions`` (inverse
    sampling variances, ``>= 0``; groups with precision 0 are left out). See the module
    docstring.

    Example (the BCG vaccine trials, log relative risks, as in R's ``metafor``:
    ``rma(yi, vi, method="DL")`` gives ``tau^2 = 0.3088``):
        >>> import torch
        >>> t = torch.tensor([[4, 119, 11, 128], [6, 300, 29, 274], [3, 228, 11, 209],
        ...     [62, 13536, 248, 12619], [33, 5036, 47, 5761], [180, 1361, 372, 1079],
        ...     [8, 2537, 10, 619], [505, 87886, 499, 87892], [29, 7470, 45, 7232],
        ...     [17, 1699, 65, 1600], [186, 50448, 141, 27197], [5, 2493, 3, 2338],
        ...     [27, 16886, 29, 17825]], dtype=torch.float64)
        >>> a, b, c, d = t.unbind(1)
        >>> yi = torch.log(a / (a + b)) - torch.log(c / (c + d))
        >>> vi = 1 / a - 1 / (a + b) + 1 / c - 1 / (c + d)
        >>> round(float(between_group_variance(yi, 1 / vi)), 4)
        0.3088
    """
    x, w, used = _check(estimates, precisions)
    g = int(used.sum())
    if g < 2:
        return torch.zeros((), dtype=torch.float64)
    sw = w.sum()
    xbar = (w * x).sum() / sw
    q = (w * (x - xbar) ** 2).sum()
    c = sw - (w * w).sum() / sw
    return torch.clamp((q - (g - 1)) / c, min=0.0)


def empirical_bayes_shrinkage(
    estimates: Tensor, precisions: Tensor, center: Tensor | float
) -> tuple[Tensor, Tensor, Tensor]:
    """Shrink per-group ``estimates`` toward ``center`` by the normal-normal posterior mean
    with ``tau^2`` from :func:`between_group_variance`: returns ``(shrunk, weights, tau2)``,
    ``shrunk = center + weights * (estimates - center)``, ``weights = w tau^2 / (1 + w
    tau^2)`` in ``[0, 1)`` (0 where ``w = 0``: the group gets ``center``).

    Example:
        >>> import torch
        >>> x = torch.tensor([0.0, 1.0, 2.0, 5.0], dtype=torch.float64)
        >>> w = torch.tensor([100.0, 100.0, 100.0, 0.01], dtype=torch.float64)
        >>> shrunk, weights, tau2 = empirical_bayes_shrinkage(x, w, 1.0)
        >>> [round(v, 3) for v in shrunk.tolist()], round(float(tau2), 3)
        ([0.01, 1.0, 1.99, 1.039], 0.986)
    """
    x, w, used = _check(estimates, precisions)
    center_t = torch.as_tensor(center, dtype=torch.float64)
    check_finite("center", center_t)
    tau2 = between_group_variance(estimates, precisions)
    weights = torch.where(used, w * tau2 / (1 + w * tau2), torch.zeros_like(w))
    shrunk = torch.where(used, center_t + weights * (x - center_t), center_t.expand_as(x))
    return shrunk, weights, tau2
