"""The CRPS sums a scale fit reads: :func:`crps_scale_sums`, the weighted CRPS of a
location-scale family (normal, Laplace, logistic) and its first two derivatives in the scale,
in closed form from one pass (no autograd), for
:class:`~torchcal.scaling.VarianceScaler`'s CRPS fit (:mod:`torchcal.functional.variance`).

The closed forms themselves (with their exact gradients) are :mod:`torchcal.functional.crps`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from torchcal.functional._checks import fixed_sum

_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


#: values per block of the one-factor sums below (128 KB of float64: the temporaries stay in
#: cache; fresh full-size buffers cost page faults, about 3-10x slower on 1M values). At most
#: PARALLEL_GRAIN, so each block's sums run on one thread: the result does not depend on the
#: thread count (BLAS ``dot`` and larger sums do, measured)
SCALE_BLOCK = 1 << 14


def _wdot(w: Tensor, x: Tensor) -> float:
    """``sum(w * x)`` of one block, on one thread (see :data:`SCALE_BLOCK`)."""
    return float(torch.mul(w, x).sum())


_SCALE_FAMILIES = ("normal", "laplace", "logistic")


def _scale_term_sums(family: str, a: Tensor, e: Tensor, w: Tensor) -> tuple[float, float, float]:
    """``(sum w P, sum w C, sum w |z| g'(|z|))`` of one block, in place on ``a = |z|`` (``e``
    a buffer): ``d/ds = k1 sum w P + k0 sum w`` and ``s d2/ds2 = sum w C`` (see
    :func:`crps_scale_sums`)."""
    if family == "normal":  # P = e = exp(-z^2/2), C = sqrt(2/pi) z^2 e, g' = erf(|z| / sqrt 2)
        v = _wdot(w, torch.mul(a, _INV_SQRT2, out=e).erf_().mul_(a))
        z2 = a.mul_(a)
        torch.mul(z2, -0.5, out=e).exp_()
        return _wdot(w, e), _SQRT_2_OVER_PI * _wdot(w, z2.mul_(e)), v
    wa = _wdot(w, a)
    torch.neg(a, out=e).exp_()  # e = exp(-|z|)
    if family == "laplace":  # P = e (1 + |z|), C = z^2 e, g' = 1 - e
        ae = a * e
        w_ae = _wdot(w, ae)
        return _wdot(w, e) + w_ae, _wdot(w, ae.mul_(a)), wa - w_ae
    # logistic, q = sigmoid(-|z|): P = softplus(-|z|) + |z| q, C = 2 z^2 q (1 - q), g' = 1 - 2q
    q = e.div_(e + 1.0)
    aq = a * q
    w_aq = _wdot(w, aq)
    p = w_aq - _wdot(w, torch.log1p(q.neg()))  # softplus(-|z|) = -log(1 - q)
    c = 2.0 * _wdot(w, aq.mul_(a).mul_(q.neg_().add_(1.0)))
    return p, c, wa - 2.0 * w_aq


def crps_scale_sums(
    family: str, residual: Tensor, scale_factor: float, weight: Tensor
) -> tuple[float, float, float]:
    r"""Weighted sums of the CRPS of ``F_{0, s}`` (normal / Laplace / logistic) and of its
    first two derivatives in the scale ``s``, over float64 residuals ``r`` (1-D, with 1-D
    ``weight``): ``(sum w CRPS, sum w d/ds, sum w s d2/ds2)`` at ``s = scale_factor``.

    With :math:`\mathrm{CRPS}(F_{0,s}, r) = s\,g(z)`, :math:`z = r / s`, :math:`g'(z) =
    2F_0(z) - 1` (odd): :math:`\partial_s = g(z) - z g'(z)` (the closed forms' backward),
    :math:`s\,\partial_s^2 = z^2 g''(z) = 2 z^2 f_0(z)` (:math:`f_0` the unit density) and
    the value :math:`s\,g(z) = s\,(\partial_s + |z|\,g'(|z|))`. So a one-factor fit on the
    scale (``VarianceScaler``) reads value, gradient and curvature from one pass, without
    double backward: normal :math:`\partial_s = (\sqrt 2 e - 1)/\sqrt\pi`,
    :math:`s\partial_s^2 = \sqrt{2/\pi} z^2 e`, :math:`e = e^{-z^2/2}`,
    :math:`g' = \mathrm{erf}(z/\sqrt 2)`; Laplace :math:`e(1 + |z|) - 3/4`, :math:`z^2 e`,
    :math:`e = e^{-|z|}`, :math:`g' = 1 - e`; logistic :math:`2\,\mathrm{softplus}(-|z|) +
    2|z|q - 1`, :math:`2 z^2 q (1 - q)`, :math:`q = \sigma(-|z|)`, :math:`g' = 1 - 2q`.
    Inputs are the caller's (``VarianceScaler`` checks them): 1-D float64 ``residual`` and
    ``weight`` of one length. Computed in blocks of :data:`SCALE_BLOCK` values in reused
    buffers (a loop over blocks, not over samples); ``|z|`` is capped at 1e150 (the curvature
    is 0 there, not ``inf * 0``).

    Example:
        >>> import torch
        >>> r = torch.tensor([0.0, 1.0], dtype=torch.float64)
        >>> f, d, c = crps_scale_sums("normal", r, 1.0, torch.ones(2, dtype=torch.float64))
        >>> round(f, 6), round(d, 6), round(c, 6)  # d: 2 phi(0) + 2 phi(1) - 2 / sqrt(pi)
        (0.836136, 0.153447, 0.483941)
    """
    if family not in _SCALE_FAMILIES:
        raise ValueError(f"family: expected one of {list(_SCALE_FAMILIES)}, got {family!r}")
    n = residual.numel()
    a_buf = torch.empty(min(n, SCALE_BLOCK), dtype=torch.float64)
    e_buf = torch.empty_like(a_buf)
    p = c = v = 0.0
    for start in range(0, n, SCALE_BLOCK):
        r, w = residual[start : start + SCALE_BLOCK], weight[start : start + SCALE_BLOCK]
        a = torch.div(r, scale_factor, out=a_buf[: r.numel()]).abs_().clamp_(max=1e150)
        bp, bc, bv = _scale_term_sums(family, a, e_buf[: r.numel()], w)
        p, c, v = p + bp, c + bc, v + bv
    total = float(fixed_sum(weight))
    d = {
        "normal": (math.sqrt(2.0) * p - total) * _INV_SQRT_PI,
        "laplace": p - 0.75 * total,
        "logistic": 2.0 * p - total,
    }[family]
    return scale_factor * (d + v), d, c
