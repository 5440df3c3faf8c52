"""Platt scaling: a logistic map ``a * s + b`` of a binary score (Platt, 1999)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from torchcal.functional._validation import check_binary_target, check_finite
from torchcal.scaling._base import (
    FitResult,
    FittedMixin,
    as_binary_vector,
    check_logits_target,
    check_state_finite,
    warn_all,
    warn_if_probabilities,
)
from torchcal.scaling._objective import binary_nll
from torchcal.scaling.temperature import check_bounds

__all__ = ["PlattScaler"]


class PlattScaler(FittedMixin):
    r"""Platt scaling of binary logits: ``forward(s) = a * s + b`` (calibrated logits).

    Fit by minimising the mean cross-entropy of ``sigmoid(a s + b)`` (Platt, 1999,
    "Probabilistic Outputs for Support Vector Machines and Comparisons to Regularized
    Likelihood Methods"), a convex problem in ``(a, b)``, solved in float64 by Newton's method
    with the exact 2x2 Hessian (a Cholesky solve; a gradient step where the Hessian is
    singular, e.g. on saturated scores) and an Armijo backtracking line search, to
    ``grad_tol`` on the gradient norm. Unlike a temperature, ``b`` moves the score level (an
    offset): use it when the model's scores are ranked well but sit at the wrong base rate.

    Targets: by default (``smooth_targets=True``) Platt's regularised targets (section 2.2 of
    the paper; scikit-learn's ``_sigmoid_calibration`` does the same):

        t = (N+ + 1) / (N+ + 2) for positives,     t = 1 / (N- + 2) for negatives,

    a prior that keeps the optimum finite even on a perfectly separated set (the slope then
    grows with N like ``log N``, not without bound). ``smooth_targets=False`` fits the plain
    0/1 labels (maximum likelihood). ``nll_before`` / ``nll_after`` in the
    :class:`~torchcal.scaling.FitResult` are always the NLL of the 0/1 labels (at ``a = 1,
    b = 0`` and at the fitted map); ``grad_norm`` is that of the optimised objective.

    The slope is kept in ``[1 / t_max, 1 / t_min]`` (``bounds`` as for a temperature), so
    ``a > 0``: when the data push it further (0/1 targets on a perfectly separated set --
    every negative score ``<=`` every positive one -- is detected up front: ``a -> inf``;
    scores anti-correlated with the target: ``a <= 0``) it stops on the bound with a
    :class:`~torchcal.scaling.CalibrationWarning` and ``converged=False`` (separated: ``a =
    1 / t_min`` and the threshold ``-b / a`` in the middle of the gap between the classes).

    Invariance (tested): ``a > 0``, so the ranking of the scores, hence the AUC, is kept (in
    the logits' dtype, rounding can tie adjacent scores, never invert them); the decision
    threshold moves (logit 0 maps to ``b``). The NLL of the fitted objective never
    increases (``a = 1, b = 0`` is feasible).

    State: ``weight`` (``a``) and ``bias`` (``b``), 0-dim float64 parameters, and ``fitted``;
    float64 under ``.to(dtype)`` / ``.half()`` / ``.bfloat16()``; validated on load (finite,
    ``a > 0``). ``forward`` before ``fit`` raises :class:`~torchcal.scaling.NotFittedError`.
    Logits may be ``(N,)`` or ``(N, 1)`` (the output has the input's shape and dtype).

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
                 max_iter: int = 100, smooth_targets: bool = True) -> None:
        super().__init__()
        self.bounds = check_bounds(bounds)
        self.grad_tol = float(grad_tol)
        self.max_iter = int(max_iter)
        if not isinstance(smooth_targets, bool):
            raise ValueError(f"smooth_targets: expected a bool, got {smooth_targets!r}")
        self.smooth_targets = smooth_targets
        self.weight = nn.Parameter(torch.ones((), dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros((), dtype=torch.float64))
        self._init_fitted()

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        check_state_finite(state, prefix, "weight", "bias")
        a = state.get("weight")
        if a is not None and a.numel() == 1 and not float(a) > 0:
            raise ValueError(f"{prefix}weight: expected a slope a > 0 (a map that keeps the "
                             f"ranking), got {float(a)!r}")

    def forward(self, logits: Tensor) -> Tensor:
        """``a * logits + b`` (calibrated binary logits, shape and dtype of ``logits``)."""
        self._check_fitted()
        if not isinstance(logits, Tensor) or not logits.is_floating_point():
            raise ValueError("logits: expected a floating-point tensor")
        check_finite("logits", logits, allow_neg_inf=True)
        a = self.weight.to(device=logits.device, dtype=logits.dtype)
        b = self.bias.to(device=logits.device, dtype=logits.dtype)
        return logits * a + b

    def fit(self, logits: Tensor, target: Tensor) -> FitResult:
        """Fit ``(a, b)`` on binary logits ``(N,)`` (or ``(N, 1)``) and targets in {0, 1}."""
        logits, target, _ = as_binary_vector(logits, target)
        check_logits_target(logits, target, binary_only=True)
        check_finite("logits", logits)
        check_binary_target("target", target)
        warn_if_probabilities(logits)
        with torch.inference_mode(False), torch.no_grad():
            s = logits.detach().to(torch.float64)
            y = target.detach().to(device=s.device, dtype=torch.float64)
            if bool((y == y[0]).all()):
                raise ValueError("target: expected both classes 0 and 1 (Platt's offset is "
                                 "unbounded on a single class)")
            n_pos = float(y.sum())
            n_neg = float(y.numel()) - n_pos
            if self.smooth_targets:
                t = torch.where(y > 0.5, y.new_tensor((n_pos + 1.0) / (n_pos + 2.0)),
                                y.new_tensor(1.0 / (n_neg + 2.0)))  # float64, not default
            else:
                t = y
            a_lo, a_hi = 1.0 / self.bounds[1], 1.0 / self.bounds[0]

            passes = 0  # objective evaluations, each one pass over the data

            def fgh(a: float, b: float) -> tuple[float, Tensor, Tensor]:
                nonlocal passes
                passes += 1
                z = s * a + b
                p = torch.sigmoid(z)
                r = p - t
                w = p * torch.sigmoid(-z)
                g = torch.stack([(r * s).mean(), r.mean()])
                ws = w * s
                h = torch.stack([torch.stack([(ws * s).mean(), ws.mean()]),
                                 torch.stack([ws.mean(), w.mean()])])
                return float(binary_nll(z, t).mean()), g, h

            nll_before = float(binary_nll(s, y).mean())
            max_neg = float(s[y < 0.5].max())
            min_pos = float(s[y > 0.5].min())
            separated = not self.smooth_targets and max_neg <= min_pos
            if separated:
                a, b, iterations, at_bound = self._separated(fgh, a_hi, max_neg, min_pos)
                f, g, h = fgh(a, b)
            else:
                a, b, f, g, h, iterations, at_bound = self._newton(
                    fgh, a_lo, a_hi, math.log((n_pos + 1.0) / (n_neg + 1.0)))
            nll_after = float(binary_nll(s * a + b, y).mean())
        fixed_a = (a <= a_lo and g[0] > 0) or (a >= a_hi and g[0] < 0)
        pg = abs(float(g[1])) if fixed_a else float(torch.linalg.vector_norm(g))
        msgs = []
        if separated:
            msgs.append(f"a: a perfectly separated set (every negative score <= every positive "
                        f"one, max {max_neg:g} <= min {min_pos:g}): with 0/1 targets the NLL "
                        f"keeps decreasing as a grows; a is bounded at 1/t_min = {a_hi:g} "
                        f"(smooth_targets=True keeps the optimum finite)")
        elif fixed_a or at_bound:
            side = "t_min (a perfectly separated set, or nearly)" if a >= a_hi else \
                "t_max (scores no better than, or anti-correlated with, the target)"
            msgs.append(f"a: the NLL keeps decreasing beyond the slope bound; a is bounded at "
                        f"1/{side}")
        elif pg > self.grad_tol:
            msgs.append(f"a, b: stopped before the tolerance was met (|grad| = {pg:.3g})")
        self._store("weight", a)
        self._store("bias", b)
        self._mark_fitted()
        return FitResult(temperature=None, nll_before=nll_before, nll_after=nll_after,
                         grad_norm=pg, iterations=iterations, converged=not msgs,
                         warnings=warn_all(msgs, stacklevel=3), passes=passes, method="newton")

    def _separated(self, fgh: Callable[[float, float], tuple[float, Tensor, Tensor]],
                   a_hi: float, max_neg: float, min_pos: float
                   ) -> tuple[float, float, int, bool]:
        """0/1 targets on a separated set: ``a`` on its bound, the threshold in the middle of
        the gap, then (where any score is not saturated) 1-D Newton steps on ``b``."""
        a, b = a_hi, -a_hi * (0.5 * max_neg + 0.5 * min_pos)
        f, g, h = fgh(a, b)
        iterations = 0
        while iterations < self.max_iter and abs(float(g[1])) > self.grad_tol:
            if not float(h[1, 1]) > 0:
                break
            b_new = b - float(g[1]) / float(h[1, 1])
            f_new, g_new, h_new = fgh(a, b_new)
            if not f_new < f:
                break
            b, f, g, h = b_new, f_new, g_new, h_new
            iterations += 1
        return a, b, iterations, True

    def _newton(self, fgh: Callable[[float, float], tuple[float, Tensor, Tensor]],
                a_lo: float, a_hi: float, b_prior: float
                ) -> tuple[float, float, float, Tensor, Tensor, int, bool]:
        """Projected Newton with Armijo backtracking from the better of ``(1, 0)`` (no change)
        and ``(a_lo, b_prior)`` (the base rate: no score saturates there)."""
        a, b = 1.0, 0.0
        f, g, h = fgh(a, b)
        f2, g2, h2 = fgh(a_lo, b_prior)
        if f2 < f or not math.isfinite(f):
            a, b, f, g, h = a_lo, b_prior, f2, g2, h2
        iterations = 0
        at_bound = False
        eye = torch.eye(2, dtype=torch.float64)
        while True:
            fixed_a = (a <= a_lo and g[0] > 0) or (a >= a_hi and g[0] < 0)
            pg = abs(float(g[1])) if fixed_a else float(torch.linalg.vector_norm(g))
            if pg <= self.grad_tol or iterations >= self.max_iter:
                at_bound = fixed_a
                break
            d = None
            if fixed_a:
                if float(h[1, 1]) > 0:
                    d = torch.stack([torch.zeros((), dtype=torch.float64), -g[1] / h[1, 1]])
            else:
                ridge = 1e-14 * float(h.diagonal().sum())
                chol, info = torch.linalg.cholesky_ex(h + ridge * eye)
                if int(info) == 0:
                    d = -torch.cholesky_solve(g.unsqueeze(1), chol).squeeze(1)
            newton = d is not None and bool(torch.isfinite(d).all()) and float(g @ d) < 0
            if not newton:
                # singular Hessian (every score saturated): a steepest-descent step
                d = -g if not fixed_a else torch.stack([torch.zeros_like(g[1]), -g[1]])
            slope = float(g @ d)
            if newton and -slope <= 1e-13 * max(1.0, abs(f)):
                # the predicted decrease is below the float64 resolution of the loss: Armijo
                # cannot be checked; the full Newton step is the quadratically convergent one
                a = min(max(a + float(d[0]), a_lo), a_hi)
                b = b + float(d[1])
                f, g, h = fgh(a, b)
                iterations += 1
                continue
            step = 1.0
            while True:
                a_new = min(max(a + step * float(d[0]), a_lo), a_hi)
                b_new = b + step * float(d[1])
                f_new, g_new, h_new = fgh(a_new, b_new)
                if f_new <= f + 1e-4 * step * slope or step < 1e-10:
                    break
                step *= 0.5
            if not f_new <= f:  # no descent possible at float64 resolution
                at_bound = fixed_a
                break
            a, b, f, g, h = a_new, b_new, f_new, g_new, h_new
            iterations += 1
        return a, b, f, g, h, iterations, at_bound
