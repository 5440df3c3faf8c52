"""Isotonic calibration by pool-adjacent-violators (no scikit-learn at run time)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_binary_target,
    check_class_target,
    check_finite,
    check_option,
)
from torchcal.functional.isotonic import fit_isotonic
from torchcal.functional.recalibration import confidence_log_odds
from torchcal.scaling._base import FittedMixin, NLLFit, as_binary_vector, check_logits_target

__all__ = ["IsotonicCalibrator"]

_READINGS = ("binary", "confidence")
# stand-in for an infinite log-odds (a -inf mask, or all other classes masked): the largest
# float64, so that no finite score is clamped (1e300 used to merge scores beyond it into ties)
_BIG = torch.finfo(torch.float64).max
# forward returns logit(p) with p clamped to [_P_EPS, 1 - _P_EPS]: +-27.63, finite in every
# float dtype (predict_proba returns the unclamped p, 0 and 1 included)
_P_EPS = 1e-12


class IsotonicCalibrator(FittedMixin):
    r"""Isotonic calibration: a non-decreasing map from a score to a probability.

    Fit by pool-adjacent-violators (Zadrozny & Elkan, 2002, "Transforming classifier scores
    into accurate multiclass probability estimates"; Ayer et al., 1955): the least-squares
    non-decreasing fit of the outcome against the score, which is also the NLL-optimal
    monotone fit. Ties in the score are pooled first (weighted mean), and predictions
    interpolate linearly between the fitted points and are clipped at the ends -- the same
    estimator as scikit-learn's ``IsotonicRegression(out_of_bounds="clip")`` on the same
    scores (tested to 1e-12), with no scikit-learn at run time.

    Readings: ``"binary"`` -- logits ``(N,)``, targets in {0, 1}, output ``P(y = 1)``;
    ``"confidence"`` -- logits ``(N, C)``, class indices, output the calibrated probability
    that the top-1 prediction is right (Guo et al.'s confidence reading). The score is the
    log-odds (the logit itself; for confidence, ``-logsumexp_{j != top}(z_j - z_top)``), so
    nothing saturates the way float32 probabilities do. ``-inf`` logits (masks) are allowed.

    ``forward(logits)`` returns **calibrated logits**, as every other calibrator here:
    ``logit(p)`` of the calibrated probability ``p``, which the isotonic map can make exactly 0
    or 1, so ``p`` is first clamped to ``[1e-12, 1 - 1e-12]`` (logits within +-27.63; finite in
    every dtype). The output has the input's dtype and, for ``reading="binary"``, its shape
    (``(N,)`` or ``(N, 1)``); ``reading="confidence"`` gives ``(N,)`` logits of the top-1
    confidence. :meth:`predict_proba` returns the unclamped float64 probabilities. Before
    ``fit`` both raise :class:`~torchcal.scaling.NotFittedError`.

    Invariance (tested): the map is non-decreasing, so no pair of scores is inverted, but ties
    are created -- rankings hold only weakly and the AUC may drop. The argmax is untouched
    (the confidence reading recalibrates the top-1 probability only).

    State: ``x_thresholds``, ``y_thresholds`` (float64 buffers whose length is set by the fit;
    ``load_state_dict`` resizes them and checks them: ``x`` finite and increasing, ``y`` a
    non-decreasing map into ``[0, 1]``, non-empty when fitted) and ``fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import IsotonicCalibrator
        >>> s = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0, 3.0])
        >>> y = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
        >>> iso = IsotonicCalibrator()
        >>> _ = iso.fit(s, y)
        >>> iso.predict_proba(torch.tensor([-2.0, -0.5, 2.5])).tolist()
        [0.0, 0.5, 1.0]
        >>> [round(v, 2) for v in iso(torch.tensor([-2.0, -0.5, 2.5])).tolist()]  # logits
        [-27.63, 0.0, 27.63]
    """

    x_thresholds: Tensor
    y_thresholds: Tensor

    def __init__(self, *, reading: str = "binary") -> None:
        super().__init__()
        check_option("reading", reading, _READINGS)
        self.reading = reading
        self.register_buffer("x_thresholds", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("y_thresholds", torch.zeros(0, dtype=torch.float64))
        self._init_fitted()

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        xt, yt, fitted = (state.get(k) for k in ("x_thresholds", "y_thresholds", "fitted"))
        if xt is None or yt is None:
            return
        if xt.dim() != 1 or yt.shape != xt.shape:
            raise ValueError(
                f"{prefix}y_thresholds: expected the 1-D shape of x_thresholds "
                f"{tuple(xt.shape)}, got {tuple(yt.shape)}"
            )
        if fitted is not None and bool(fitted) and xt.numel() == 0:
            raise ValueError(
                f"{prefix}x_thresholds: a fitted state needs at least one threshold, got none"
            )
        xd, yd = xt.to(torch.float64), yt.to(torch.float64)
        if not bool(torch.isfinite(xd).all()) or not bool((xd[1:] > xd[:-1]).all()):
            raise ValueError(
                f"{prefix}x_thresholds: expected finite, strictly increasing "
                f"values in the loaded state"
            )
        if not bool(((yd >= 0) & (yd <= 1)).all()) or not bool((yd[1:] >= yd[:-1]).all()):
            raise ValueError(
                f"{prefix}y_thresholds: expected a non-decreasing map into "
                f"[0, 1] in the loaded state, got values in "
                f"[{float(yd.min()):g}, {float(yd.max()):g}]"
                if yd.numel()
                else f"{prefix}y_thresholds: expected values in [0, 1]"
            )

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        for name in ("x_thresholds", "y_thresholds"):
            value = state_dict.get(prefix + name)
            if isinstance(value, Tensor):
                setattr(
                    self,
                    name,
                    torch.empty_like(value, dtype=torch.float64, device=getattr(self, name).device),
                )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _scores(self, logits: Tensor, target: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """(log-odds score in float64, binary outcome or None)."""
        if self.reading == "binary":
            if logits.dim() != 1:
                raise ValueError(
                    f"logits: expected (N,) binary logits for reading='binary', "
                    f"got shape {tuple(logits.shape)}"
                )
            x = logits.to(torch.float64)
            out = None if target is None else target.to(device=x.device, dtype=torch.float64)
        else:
            if logits.dim() != 2 or logits.shape[1] < 2:
                raise ValueError(
                    f"logits: expected (N, C) multiclass logits for "
                    f"reading='confidence', got shape {tuple(logits.shape)}"
                )
            x, top = confidence_log_odds(logits)
            out = None if target is None else (top == target.to(x.device)).to(torch.float64)
        return x.clamp(-_BIG, _BIG), out

    def fit(self, logits: Tensor, target: Tensor) -> NLLFit:
        """Fit the isotonic map on held-out logits and targets (see the class docstring)."""
        if self.reading == "binary":
            logits, target, _ = as_binary_vector(logits, target)
        check_logits_target(
            logits,
            target,
            binary_only=self.reading == "binary",
            multiclass_only=self.reading == "confidence",
        )
        check_finite("logits", logits, allow_neg_inf=True)
        if self.reading == "binary":
            check_binary_target("target", target)
        else:
            check_class_target("target", target, logits.shape[1])
        with torch.inference_mode(False), torch.no_grad():
            x, o = self._scores(logits.detach(), target.detach())
            assert o is not None
            sol = fit_isotonic(x, o)
        self.x_thresholds = sol.x
        self.y_thresholds = sol.y
        self._mark_fitted()
        return NLLFit(
            nll_before=sol.before,
            nll_after=sol.after,
            grad_norm=0.0,
            iterations=sol.rounds,
            converged=True,
            passes=1,
            method="pav",
        )

    def forward(self, logits: Tensor) -> Tensor:
        """Calibrated logits (``logit(p)``, ``p`` clamped to ``[1e-12, 1 - 1e-12]``) in the
        dtype of ``logits``: shape ``(N,)`` / ``(N, 1)`` as the input (binary), ``(N,)``
        (confidence)."""
        p = self.predict_proba(logits)
        p = p.clamp(_P_EPS, 1.0 - _P_EPS)
        out = (torch.log(p) - torch.log1p(-p)).to(logits.dtype)
        return out.reshape(logits.shape) if self.reading == "binary" else out

    def predict_proba(self, logits: Tensor) -> Tensor:
        """Calibrated probabilities ``(N,)`` (float64, 0 and 1 included): ``P(y=1)``
        (binary) or the probability that the top-1 prediction is right (confidence)."""
        self._check_fitted()
        if not isinstance(logits, Tensor) or not logits.is_floating_point():
            raise ValueError("logits: expected a floating-point tensor")
        check_finite("logits", logits, allow_neg_inf=True)
        if self.reading == "binary":
            logits = as_binary_vector(logits)[0]
        x, _ = self._scores(logits, None)
        xt = self.x_thresholds.to(x.device)
        yt = self.y_thresholds.to(x.device)
        if xt.numel() == 1:
            return yt.expand(x.shape).clone()
        x = x.clamp(float(xt[0]), float(xt[-1]))
        idx = torch.searchsorted(xt, x, right=True).clamp(1, xt.numel() - 1)
        x0, x1 = xt[idx - 1], xt[idx]
        y0, y1 = yt[idx - 1], yt[idx]
        # halves first: differences of scores near +-float64 max must not overflow to inf
        frac = ((0.5 * x - 0.5 * x0) / (0.5 * x1 - 0.5 * x0)).clamp(0.0, 1.0)
        return y0 + frac * (y1 - y0)
