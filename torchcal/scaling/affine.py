"""Vector and matrix scaling: per-class affine maps of multiclass logits."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torchcal.functional._validation import (
    check_class_target,
    check_finite,
    check_int,
    first_bad_position,
)
from torchcal.scaling._base import (
    FitResult,
    FittedMixin,
    check_logits_target,
    check_state_finite,
    warn_all,
    warn_if_probabilities,
)

__all__ = ["VectorScaler", "MatrixScaler"]


def _check_reg(name: str, value: float) -> float:
    v = float(value)
    if not (v >= 0 and v < float("inf")):
        raise ValueError(f"{name}: expected a finite value >= 0, got {value!r}")
    return v


# Up to this many parameters the fit is Newton's method with the exact Hessian (P backward
# passes per step, quadratic convergence); beyond it, LBFGS with strong-Wolfe line search.
_NEWTON_MAX_PARAMS = 256
_MAX_ABS_LOGIT = 1e100


class _AffineScaler(FittedMixin):
    """Shared fit: float64, full batch, on a convex objective (Newton or LBFGS)."""

    weight: nn.Parameter
    bias: nn.Parameter

    def __init__(self, num_classes: int, grad_tol: float, max_iter: int) -> None:
        super().__init__()
        self.num_classes = check_int("num_classes", num_classes, minimum=2)
        self.grad_tol = float(grad_tol)
        self.max_iter = check_int("max_iter", max_iter, minimum=1)
        self._init_fitted()

    def _affine(self, z: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        raise NotImplementedError

    def _penalty(self, weight: Tensor, bias: Tensor) -> Tensor:
        raise NotImplementedError

    def _identity(self) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        check_state_finite(state, prefix, "weight", "bias")

    def _masked_affine(self, z: Tensor, weight: Tensor, bias: Tensor,
                       mask: Tensor | None) -> Tensor:
        """The affine map of ``z`` (masked entries already 0), masked outputs ``-inf``."""
        out = self._affine(z, weight, bias)
        return out if mask is None else out.masked_fill(mask, float("-inf"))

    def forward(self, logits: Tensor) -> Tensor:
        """Calibrated logits ``(N, C)`` in the dtype of ``logits``; a ``-inf`` (masked) logit
        stays ``-inf`` (probability 0) and contributes nothing to the other classes."""
        self._check_fitted()
        if not isinstance(logits, Tensor) or not logits.is_floating_point() or \
                logits.dim() != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(f"logits: expected a floating-point tensor of shape "
                             f"(N, {self.num_classes})")
        check_finite("logits", logits, allow_neg_inf=True)
        w = self.weight.to(device=logits.device, dtype=logits.dtype)
        b = self.bias.to(device=logits.device, dtype=logits.dtype)
        mask = torch.isneginf(logits)
        if not bool(mask.any()):
            return self._affine(logits, w, b)
        return self._masked_affine(logits.masked_fill(mask, 0.0), w, b, mask)

    def objective(self, logits: Tensor, target: Tensor, weight: Tensor, bias: Tensor,
                  mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(mean NLL + penalty, mean NLL)`` at the given parameters (float64); with
        ``mask``, ``logits`` holds 0 at the masked entries (see :meth:`forward`)."""
        nll = F.cross_entropy(self._masked_affine(logits, weight, bias, mask), target)
        return nll + self._penalty(weight, bias), nll

    def fit(self, logits: Tensor, target: Tensor) -> FitResult:
        """Fit the weights and biases on multiclass logits ``(N, C)`` and class indices."""
        check_logits_target(logits, target, multiclass_only=True)
        if logits.shape[1] != self.num_classes:
            raise ValueError(f"logits: expected {self.num_classes} columns (num_classes), got "
                             f"shape {tuple(logits.shape)}")
        check_finite("logits", logits, allow_neg_inf=True)
        check_class_target("target", target, self.num_classes)
        warn_if_probabilities(logits)
        with torch.inference_mode(False), torch.no_grad():
            z = logits.detach().to(torch.float64).clone()
            y = target.detach().to(device=z.device, dtype=torch.long).clone()
            big = float(z.masked_fill(torch.isneginf(z), 0.0).abs().max())
            if big > _MAX_ABS_LOGIT:
                raise ValueError(f"logits: expected |logits| <= {_MAX_ABS_LOGIT:g} (their squares "
                                 f"enter the float64 Hessian), got {big:g}")
            neg = torch.isneginf(z)
            mask: Tensor | None = None
            if bool(neg.any()):
                bad = neg.gather(1, y.unsqueeze(1)).squeeze(1)
                if bool(bad.any()):
                    raise ValueError(f"logits: the target class is masked (-inf) at row "
                                     f"{first_bad_position(bad)}; its likelihood is 0")
                mask = neg
                z = z.masked_fill(mask, 0.0)
            w0, b0 = self._identity()
            w0, b0 = w0.to(z.device), b0.to(z.device)
            nw = w0.numel()

            def split(x: Tensor) -> tuple[Tensor, Tensor]:
                return x[:nw].reshape(w0.shape), x[nw:]

            def total(x: Tensor) -> Tensor:
                return self.objective(z, y, *split(x), mask)[0]

            x = torch.cat([w0.flatten(), b0])
            nll_before = float(self.objective(z, y, w0, b0, mask)[1])
            with torch.enable_grad():
                if x.numel() <= _NEWTON_MAX_PARAMS:
                    def hessian(x: Tensor) -> Tensor:
                        w, b = split(x)
                        pen = torch.autograd.functional.hessian(
                            lambda v: self._penalty(*split(v)), x)  # tiny: no data involved
                        return self._nll_hessian(z, w, b, mask) + pen

                    x, iterations, passes, method = self._newton(total, hessian, x)
                else:
                    x, iterations, passes, method = self._lbfgs(total, x)
                xg = x.detach().clone().requires_grad_(True)
                loss = total(xg)
                (grad,) = torch.autograd.grad(loss, [xg])
            w, b = split(x.detach())
            nll = self.objective(z, y, w, b, mask)[1]
            grad_norm = float(torch.linalg.vector_norm(grad))
        msgs = []
        if z.shape[0] < x.numel():
            msgs.append(f"{type(self).__name__}: fewer samples ({z.shape[0]}) than parameters "
                        f"({x.numel()}): the map interpolates the fitting set; use more data, "
                        f"a regulariser, or TemperatureScaler")
        elif float(nll) <= 1e-8:
            msgs.append(f"{type(self).__name__}: the fitted map separates the fitting set (NLL "
                        f"{float(nll):.3g}): a separable set has no finite optimum; the "
                        f"parameters are where the gradient fell below grad_tol")
        if not grad_norm <= max(1e-8, math.sqrt(x.numel()) * self.grad_tol):
            msgs.append(f"{type(self).__name__}: LBFGS stopped before the tolerance was met "
                        f"(|grad| = {grad_norm:.3g}); a separable set without regularisation "
                        f"has no finite optimum")
        self._store("weight", w.detach())
        self._store("bias", b.detach())
        self._mark_fitted()
        return FitResult(temperature=None, nll_before=nll_before, nll_after=float(nll.detach()),
                         grad_norm=grad_norm, iterations=iterations, converged=not msgs,
                         warnings=warn_all(msgs, stacklevel=3), passes=passes, method=method)

    def _nll_hessian(self, z: Tensor, weight: Tensor, bias: Tensor,
                     mask: Tensor | None = None) -> Tensor:
        """Exact Hessian of the mean NLL w.r.t. ``cat(weight.flatten(), bias)`` (``z`` holds 0
        at masked entries: their output is constant, ``p = 0`` there)."""
        raise NotImplementedError

    def _newton(self, total: Callable[[Tensor], Tensor], hessian: Callable[[Tensor], Tensor],
                x: Tensor) -> tuple[Tensor, int, int, str]:
        """Damped Newton with the exact Hessian (small problems) and Armijo backtracking."""
        passes = 0
        iterations = 0
        eye = torch.eye(x.numel(), dtype=x.dtype, device=x.device)
        while True:
            xg = x.detach().clone().requires_grad_(True)
            f = total(xg)
            (g,) = torch.autograd.grad(f, [xg])
            passes += 1
            if float(g.abs().max()) <= self.grad_tol or iterations >= self.max_iter:
                return x.detach(), iterations, passes, "newton"
            h = hessian(x.detach())
            ridge = 1e-12 * float(h.diagonal().abs().mean()) + 1e-300
            try:
                d = -torch.linalg.solve(h + ridge * eye, g)
            except RuntimeError:
                d = -g
            slope = float(g @ d)
            if slope >= 0:
                d, slope = -g, -float(g @ g)
            step, f0 = 1.0, float(f.detach())
            if -slope <= 1e-13 * max(1.0, abs(f0)):
                # the predicted decrease is below float64 resolution of the loss: Armijo cannot
                # be checked, and the full Newton step is the quadratically convergent one
                x = x.detach() + d
                iterations += 1
                continue
            while True:
                x_new = x.detach() + step * d
                f_new = float(total(x_new))
                passes += 1
                if f_new <= f0 + 1e-4 * step * slope or step < 1e-12:
                    break
                step *= 0.5
            if f_new > f0:  # no descent left at float64 resolution
                return x.detach(), iterations, passes, "newton"
            x = x_new
            iterations += 1

    def _lbfgs(self, total: Callable[[Tensor], Tensor], x: Tensor
               ) -> tuple[Tensor, int, int, str]:
        """Full-batch LBFGS with strong-Wolfe line search (many parameters)."""
        xp = x.detach().clone().requires_grad_(True)
        opt = torch.optim.LBFGS([xp], lr=1.0, max_iter=self.max_iter, max_eval=2 * self.max_iter,
                                tolerance_grad=self.grad_tol, tolerance_change=0.0,
                                history_size=50, line_search_fn="strong_wolfe")

        def closure() -> Tensor:
            opt.zero_grad()
            loss = total(xp)
            loss.backward()
            return loss

        opt.step(closure)
        state = opt.state[xp]
        return xp.detach(), int(state["n_iter"]), int(state["func_evals"]), "lbfgs"


class VectorScaler(_AffineScaler):
    r"""Vector scaling: ``forward(z) = z * weight + bias`` with one scale and bias per class.

    Guo et al. (2017, "On Calibration of Modern Neural Networks") fit ``weight, bias in R^C``
    by minimising the NLL; we add an optional L2 penalty ``bias_reg / C * ||bias||^2``. The
    objective is convex; it is minimised in float64, full batch, to ``grad_tol`` (max-abs
    gradient): by Newton's method with the exact Hessian and backtracking while there are at
    most 256 parameters, else by LBFGS with strong-Wolfe line search. The gradient norm is
    reported (``<= 1e-8`` is tested against ``scipy.optimize`` on the same objective).

    Invariance: none guaranteed -- per-class scales and biases can change the argmax (and the
    accuracy). ``-inf`` logits are masks (fit and forward): a masked entry stays ``-inf``
    (probability 0), whatever the sign of its weight. ``forward`` before ``fit`` raises.

    State: ``weight`` ``(C,)``, ``bias`` ``(C,)`` (float64 parameters, float64 under
    ``.to(dtype)``; finite on load), ``fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import VectorScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(3000, 3, generator=g)
        >>> y = torch.multinomial(torch.softmax(z / 2 + torch.tensor([0.5, 0.0, -0.5]), 1), 1,
        ...                       generator=g).squeeze(1)
        >>> res = VectorScaler(3).fit(z, y)
        >>> res.converged, res.grad_norm <= 1e-8, res.nll_after < res.nll_before
        (True, True, True)
    """

    def __init__(self, num_classes: int, *, bias_reg: float = 0.0, grad_tol: float = 1e-10,
                 max_iter: int = 500) -> None:
        super().__init__(num_classes, grad_tol, max_iter)
        self.bias_reg = _check_reg("bias_reg", bias_reg)
        self.weight = nn.Parameter(torch.ones(num_classes, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(num_classes, dtype=torch.float64))

    def _affine(self, z: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        return z * weight + bias

    def _penalty(self, weight: Tensor, bias: Tensor) -> Tensor:
        return self.bias_reg / self.num_classes * (bias * bias).sum()

    def _identity(self) -> tuple[Tensor, Tensor]:
        C = self.num_classes
        return torch.ones(C, dtype=torch.float64), torch.zeros(C, dtype=torch.float64)

    def _nll_hessian(self, z: Tensor, weight: Tensor, bias: Tensor,
                     mask: Tensor | None = None) -> Tensor:
        # a_ic = w_c z_ic + b_c; with u_ic = (z_ic, 1) and S_i = diag(p_i) - p_i p_i^T:
        # H[(k, c), (l, d)] = mean_i S_i[c, d] u_ic[k] u_id[l]  (params ordered w then b)
        p = torch.softmax(self._masked_affine(z, weight, bias, mask), dim=1)
        u = torch.stack([z, torch.ones_like(z)], dim=1)                   # (N, 2, C)
        pu = p.unsqueeze(1) * u                                           # (N, 2, C)
        C = self.num_classes
        diag = torch.einsum("ikc,ilc->klc", pu, u) / z.shape[0]           # diag(p) part
        h = -torch.einsum("ikc,ild->kcld", pu, pu) / z.shape[0]
        idx = torch.arange(C)
        h[:, idx, :, idx] += diag.permute(2, 0, 1)
        return h.reshape(2 * C, 2 * C)


class MatrixScaler(_AffineScaler):
    r"""Matrix scaling: ``forward(z) = z @ weight.T + bias`` with a full ``C x C`` matrix.

    Fit by minimising the NLL plus the ODIR penalty of Kull et al. (2019, "Beyond temperature
    scaling: Obtaining well-calibrated multi-class probabilities with Dirichlet calibration"):

        off_diagonal_reg / (C (C - 1)) * sum_{i != j} W_ij^2 + bias_reg / C * sum_j b_j^2,

    which keeps the map near a per-class scaling (``C^2`` free parameters overfit easily).
    Convex; minimised from the identity in float64 as :class:`VectorScaler` (Newton up to 256
    parameters, i.e. ``C <= 15``, LBFGS with strong-Wolfe line search beyond).

    Invariance: none guaranteed (argmax may change). ``-inf`` logits are masks (fit and
    forward): a masked entry contributes nothing to the other classes (it enters the product
    as 0) and its own output stays ``-inf`` (probability 0). ``forward`` before ``fit`` raises.

    State: ``weight`` ``(C, C)``, ``bias`` ``(C,)`` (float64 parameters, float64 under
    ``.to(dtype)``; finite on load), ``fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import MatrixScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(3000, 3, generator=g)
        >>> y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
        >>> res = MatrixScaler(3).fit(z, y)
        >>> res.converged, res.nll_after < res.nll_before
        (True, True)
    """

    def __init__(self, num_classes: int, *, off_diagonal_reg: float = 1e-2,
                 bias_reg: float = 1e-2, grad_tol: float = 1e-10, max_iter: int = 500) -> None:
        super().__init__(num_classes, grad_tol, max_iter)
        self.off_diagonal_reg = _check_reg("off_diagonal_reg", off_diagonal_reg)
        self.bias_reg = _check_reg("bias_reg", bias_reg)
        self.weight = nn.Parameter(torch.eye(num_classes, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(num_classes, dtype=torch.float64))

    def _affine(self, z: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        return z @ weight.T + bias

    def _penalty(self, weight: Tensor, bias: Tensor) -> Tensor:
        C = self.num_classes
        off = weight - torch.diag(torch.diagonal(weight))
        return (self.off_diagonal_reg / (C * (C - 1)) * (off * off).sum()
                + self.bias_reg / C * (bias * bias).sum())

    def _identity(self) -> tuple[Tensor, Tensor]:
        C = self.num_classes
        return torch.eye(C, dtype=torch.float64), torch.zeros(C, dtype=torch.float64)

    def _nll_hessian(self, z: Tensor, weight: Tensor, bias: Tensor,
                     mask: Tensor | None = None) -> Tensor:
        # a_i = A u_i with A = [W | b], u_i = (z_i, 1); S_i = diag(p_i) - p_i p_i^T:
        # H[(c, k), (d, l)] = mean_i S_i[c, d] u_i[k] u_i[l]
        n, C = z.shape
        p = torch.softmax(self._masked_affine(z, weight, bias, mask), dim=1)
        u = torch.cat([z, torch.ones(n, 1, dtype=z.dtype, device=z.device)], dim=1)  # (N, K)
        uu = torch.einsum("ik,il->ikl", u, u)                             # (N, K, K)
        h = -torch.einsum("ic,id,ikl->ckdl", p, p, uu)
        h[torch.arange(C), :, torch.arange(C), :] += torch.einsum("ic,ikl->ckl", p, uu)
        h = h / n
        K = C + 1
        # reorder A's entries (c, k) into the parameter vector cat(W.flatten(), b)
        order = torch.empty(C * K, dtype=torch.long)
        ck = torch.arange(C * K)
        c, k = ck // K, ck % K
        order[ck] = torch.where(k < C, c * C + k, C * C + c)
        h = h.reshape(C * K, C * K)
        out = torch.empty_like(h)
        out[order.unsqueeze(1), order.unsqueeze(0)] = h
        return out
