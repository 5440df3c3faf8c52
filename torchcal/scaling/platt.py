"""Platt scaling: a logistic map ``a * s + b`` of a binary score (Platt, 1999)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from torchcal.functional._validation import check_binary_target, check_finite
from torchcal.scaling._base import FitResult, FittedMixin, check_logits_target, warn_all
from torchcal.scaling._objective import binary_nll
from torchcal.scaling.temperature import check_bounds

__all__ = ["PlattScaler"]


class PlattScaler(FittedMixin):
    r"""Platt scaling of binary logits: ``forward(s) = a * s + b`` (calibrated logits).

    Fit by minimising the mean NLL of ``sigmoid(a s + b)`` (Platt, 1999, "Probabilistic
    Outputs for Support Vector Machines and Comparisons to Regularized Likelihood Methods"),
    a convex problem in ``(a, b)``, solved in float64 by Newton's method with the exact 2x2
    Hessian and an Armijo backtracking line search, to ``grad_tol`` on the gradient norm.
    Unlike a temperature, ``b`` moves the score level (an offset): use it when the model's
    scores are ranked well but sit at the wrong base rate.

    The slope is kept in ``[1 / t_max, 1 / t_min]`` (``bounds`` as for a temperature), so
    ``a > 0``: when the data push it further (perfectly separated: ``a -> inf``; scores
    anti-correlated with the target: ``a <= 0``) it stops on the bound with a
    :class:`~torchcal.scaling.CalibrationWarning` and ``converged=False``.

    Invariance (tested): ``a > 0``, so the ranking of the scores, hence the AUC, is kept (in
    the logits' dtype, rounding can tie adjacent scores, never invert them); the decision
    threshold moves (logit 0 maps to ``b``). The NLL on the fitting set never
    increases (``a = 1, b = 0`` is feasible).

    State: ``weight`` (``a``) and ``bias`` (``b``), 0-dim float64 parameters, and ``fitted``.
    ``forward`` before ``fit`` raises :class:`~torchcal.scaling.NotFittedError`.

    Example:
        >>> import torch
        >>> from torchcal.scaling import PlattScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> s = 2 * torch.randn(5000, generator=g)
        >>> y = torch.bernoulli(torch.sigmoid(0.5 * s - 1.0), generator=g)   # shifted scores
        >>> platt = PlattScaler()
        >>> res = platt.fit(s, y)
        >>> round(platt.weight.item(), 1), round(platt.bias.item(), 1), res.converged
        (0.5, -1.0, True)
        >>> bool((platt(s).argsort() == s.argsort()).all())    # the ranking (AUC) is kept
        True
    """

    weight: nn.Parameter
    bias: nn.Parameter

    def __init__(self, *, bounds: tuple[float, float] = (1e-3, 1e3), grad_tol: float = 1e-12,
                 max_iter: int = 100) -> None:
        super().__init__()
        self.bounds = check_bounds(bounds)
        self.grad_tol = float(grad_tol)
        self.max_iter = int(max_iter)
        self.weight = nn.Parameter(torch.ones((), dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros((), dtype=torch.float64))
        self._init_fitted()

    def forward(self, logits: Tensor) -> Tensor:
        """``a * logits + b`` (calibrated binary logits, dtype of ``logits``)."""
        self._check_fitted()
        if not isinstance(logits, Tensor) or not logits.is_floating_point():
            raise ValueError("logits: expected a floating-point tensor")
        a = self.weight.to(device=logits.device, dtype=logits.dtype)
        b = self.bias.to(device=logits.device, dtype=logits.dtype)
        return logits * a + b

    def fit(self, logits: Tensor, target: Tensor) -> FitResult:
        """Fit ``(a, b)`` on binary logits ``(N,)`` and targets in {0, 1}."""
        check_logits_target(logits, target, binary_only=True)
        check_finite("logits", logits)
        check_binary_target("target", target)
        with torch.inference_mode(False), torch.no_grad():
            s = logits.detach().to(torch.float64)
            y = target.detach().to(device=s.device, dtype=torch.float64)
            if bool((y == y[0]).all()):
                raise ValueError("target: expected both classes 0 and 1 (Platt's offset is "
                                 "unbounded on a single class)")
            a_lo, a_hi = 1.0 / self.bounds[1], 1.0 / self.bounds[0]

            passes = 0  # objective evaluations, each one pass over the data

            def fgh(a: float, b: float) -> tuple[float, Tensor, Tensor]:
                nonlocal passes
                passes += 1
                t = s * a + b
                p = torch.sigmoid(t)
                r = p - y
                w = p * torch.sigmoid(-t)
                g = torch.stack([(r * s).mean(), r.mean()])
                ws = w * s
                h = torch.stack([torch.stack([(ws * s).mean(), ws.mean()]),
                                 torch.stack([ws.mean(), w.mean()])])
                return float(binary_nll(t, y).mean()), g, h

            a, b = 1.0, 0.0
            f, g, h = fgh(a, b)
            nll_before = f
            iterations = 0
            at_bound = False
            while True:
                fixed_a = (a <= a_lo and g[0] > 0) or (a >= a_hi and g[0] < 0)
                pg = abs(float(g[1])) if fixed_a else float(torch.linalg.vector_norm(g))
                if pg <= self.grad_tol or iterations >= self.max_iter:
                    at_bound = fixed_a
                    break
                if fixed_a:
                    d = torch.stack([torch.zeros((), dtype=torch.float64),
                                     -g[1] / h[1, 1].clamp(min=1e-300)])
                else:
                    ridge = 1e-14 * float(h.diagonal().sum())
                    d = -torch.linalg.solve(h + ridge * torch.eye(2, dtype=torch.float64), g)
                slope = float(g @ d)
                step = 1.0
                while True:
                    a_new = min(max(a + step * float(d[0]), a_lo), a_hi)
                    b_new = b + step * float(d[1])
                    f_new, g_new, h_new = fgh(a_new, b_new)
                    if f_new <= f + 1e-4 * step * slope or step < 1e-10:
                        break
                    step *= 0.5
                if f_new > f:  # no descent possible at float64 resolution
                    at_bound = fixed_a
                    break
                a, b, f, g, h = a_new, b_new, f_new, g_new, h_new
                iterations += 1
        fixed_a = (a <= a_lo and g[0] > 0) or (a >= a_hi and g[0] < 0)
        pg = abs(float(g[1])) if fixed_a else float(torch.linalg.vector_norm(g))
        msgs = []
        if fixed_a or at_bound:
            side = "t_min (a perfectly separated set, or nearly)" if a >= a_hi else \
                "t_max (scores no better than, or anti-correlated with, the target)"
            msgs.append(f"a: the NLL keeps decreasing beyond the slope bound; a is bounded at "
                        f"1/{side}")
        elif pg > self.grad_tol:
            msgs.append(f"a, b: stopped before the tolerance was met (|grad| = {pg:.3g})")
        self._store("weight", a)
        self._store("bias", b)
        self._mark_fitted()
        return FitResult(temperature=None, nll_before=nll_before, nll_after=f, grad_norm=pg,
                         iterations=iterations, converged=not msgs,
                         warnings=warn_all(msgs, stacklevel=3), passes=passes, method="newton")
