"""The fold fits of vector scaling's cross-validated strength (docs/design.md section 4,
"Strength by cross-validation"): a damped Newton method with the exact Hessian, its data passes
in float32.

Vector scaling has ``2C`` parameters (a scale and a bias per class); with ``u_i = (z_i * p_i,
p_i)`` the Hessian of the mean NLL is ``diag(mean (z^2 p, z p, p)) - U^T U / n`` in its
``C x C`` blocks, one ``n x 2C`` product. One Newton step costs one pass for the value and
gradient (which leaves ``p`` for the Hessian) and that product; LBFGS took ~20 passes a fold
fit. The fold fits only rank strengths (the refit on all rows is float64), so the passes run in
float32 (float64 ``exp`` is 3-7x slower on CPU) with float64 parameters, sums and the
``(2C, 2C)`` solve: the gradient's error is ~1e-9, far below the fold tolerance
(:data:`~torchcal.functional.cv.FOLD_GRAD_TOL`). A Hessian is reused while the step it gives
cuts the gradient tenfold (the chord method), and the last one starts the next strength: at the
previous strength's optimum the first step for the new one is Newton's step from there (a
predictor along the path).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from torchcal.functional import recalibration as R

# a predicted decrease below this (relative to f) is under the float32 passes' resolution:
# Armijo cannot be checked there, the full Newton step is taken
_RESOLUTION = 1e-7
_ARMIJO = 1e-4
#: up to this many parameters (``C <= 256``); beyond, a Hessian (``n C^2``) costs more than
#: the ~20 LBFGS passes (``n C`` each) of a fold fit (C = 1000: 12 s of CPU against 9 s)
NEWTON_MAX = 512


class VectorFold:
    """The penalised NLL of vector scaling ``z * w + b`` on one fold's fit rows.

    ``z`` float64 ``(n, C)`` with 0 at the masked entries, ``mask`` their positions or
    ``None``, ``y`` the class indices. :meth:`solve` is the fold fit; the parameters are
    ``x = cat(w, b)`` (float64)."""

    def __init__(self, z: Tensor, y: Tensor, mask: Tensor | None) -> None:
        self.n, self.C = z.shape
        self.z = z.to(torch.float32)
        self.y = y
        self.mask = mask
        zy = z.gather(1, y.unsqueeze(1)).squeeze(1)
        self.zy = torch.zeros(self.C, dtype=torch.float64, device=z.device).index_add_(0, y, zy)
        self.ny = torch.bincount(y, minlength=self.C).to(torch.float64)
        self.hessian_data: Tensor | None = None  # the last data Hessian (the next start's)

    def evaluate(self, x: Tensor) -> tuple[float, Tensor, tuple[Tensor, Tensor]]:
        """``(mean NLL, its gradient (2C,) float64, (p, z * p) (n, C) float32)`` at ``x``."""
        C = self.C
        out = torch.addcmul(x[C:].float(), self.z, x[:C].float())
        if self.mask is not None:
            out.masked_fill_(self.mask, -math.inf)
        top = out.amax(1, keepdim=True)
        e = out.sub_(top).exp_()  # out - top at the target is log p_y + log s
        tgt = e.gather(1, self.y.unsqueeze(1))
        s = e.sum(1, keepdim=True)
        nll = float((torch.log(s).double() - torch.log(tgt).double()).sum()) / self.n
        if not math.isfinite(nll):  # a target underflowed in float32: the exact sum
            nll = self._nll64(x)
        p = e.div_(s)
        zp = p * self.z
        # float32 column sums (pairwise): ~1e-7 of sum |z p|, ~1e-9 of the gradient
        gw = (zp.sum(0).double() - self.zy) / self.n
        gb = (p.sum(0).double() - self.ny) / self.n
        return nll, torch.cat([gw, gb]), (p, zp)

    def _nll64(self, x: Tensor) -> float:
        C = self.C
        out = R.masked_affine(R.vector_affine(self.z.double(), x[:C], x[C:]), self.mask)
        return float(torch.nn.functional.cross_entropy(out, self.y))

    def hessian(self, pzp: tuple[Tensor, Tensor]) -> Tensor:
        """The data Hessian ``(2C, 2C)`` float64 of the mean NLL from :meth:`evaluate`'s
        ``(p, z * p)`` (:func:`~torchcal.functional.recalibration.vector_nll_hessian`)."""
        return R.vector_nll_hessian(self.z, *pzp)

    def solve(
        self, x: Tensor, weight_reg: float, bias_reg: float, grad_tol: float, max_iter: int
    ) -> Tensor:
        """The minimiser of the mean NLL plus ``vector_penalty`` at these strengths, from ``x``
        (damped Newton to a max-abs gradient ``<= grad_tol``; Hessians reused as above)."""
        C = self.C
        pen = R.vector_penalty_hessian(C, weight_reg, bias_reg, x.device)

        def objective(v: Tensor) -> tuple[float, Tensor, tuple[Tensor, Tensor]]:
            nll, g, p = self.evaluate(v)
            pw, pb = R.vector_penalty_grad(v[:C], v[C:], weight_reg, bias_reg)
            f = nll + float(R.vector_penalty(v[C:], bias_reg, C, v[:C], weight_reg))
            return f, g + torch.cat([pw, pb]), p

        f, g, p = objective(x)
        h, fresh = self.hessian_data, False
        last_h: Tensor | None = None
        factor: Tensor | None = None
        for _ in range(max_iter):
            size = float(g.abs().max())
            if size <= grad_tol:
                break
            if h is None:
                h, fresh = self.hessian(p), True
            if h is not last_h:
                factor, last_h = _factor(h + pen), h
            d = None if factor is None else _solve(factor, g)
            slope = float(g @ d) if d is not None else math.nan
            accepted, step = None, 1.0
            while d is not None and slope < 0 and step >= 1e-10:
                trial = objective(x + step * d)
                small = -slope * step <= _RESOLUTION * max(1.0, abs(f))
                if trial[0] <= f + _ARMIJO * step * slope or (small and step == 1.0):
                    accepted = trial
                    break
                step /= 2
            if accepted is None or d is None:  # no descent: a fresh Hessian, else stop
                if fresh:
                    break
                h = None
                continue
            x = x + step * d
            f, g_new, p = accepted
            if step < 1.0 or float(g_new.abs().max()) > 0.1 * size:
                h = None  # too slow for the chord: a fresh Hessian at the new point
            else:
                fresh = False
            g = g_new
        self.hessian_data = h if h is not None else self.hessian(p)
        return x


def _factor(h: Tensor) -> Tensor | None:
    """The Cholesky factor of ``h`` plus a ridge ``1e-12 mean|diag h|`` (``None``: failed)."""
    ridge = 1e-12 * float(h.diagonal().abs().mean()) + 1e-300
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    factor, info = torch.linalg.cholesky_ex(h + ridge * eye)
    return None if int(info) != 0 else factor


def _solve(factor: Tensor, g: Tensor) -> Tensor:
    """The Newton direction ``-h^{-1} g`` from :func:`_factor`'s factor."""
    return -torch.cholesky_solve(g.unsqueeze(1), factor).squeeze(1)
