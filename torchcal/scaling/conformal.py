r"""Split conformal intervals and conformalised quantile regression, optionally per group.

**The quantile.** With ``n`` calibration scores and miscoverage ``alpha``, the interval uses the
``k``-th smallest score, ``k = ceil((n + 1)(1 - alpha))`` (Vovk et al. 2005; Lei et al. 2018,
"Distribution-free predictive inference for regression"), i.e. the empirical quantile at level
``k / n``, not ``1 - alpha`` (too narrow) nor ``ceil((n + 1)(1 - alpha)) / n`` read through an
interpolating or "higher" quantile of the ``n + 1`` augmented scores (one order statistic too
many). ``k`` is computed in integers, ``k = (n + 1) - floor((n + 1) alpha)`` with ``alpha`` as
the closest fraction of denominator at most ``1e9`` (so ``alpha = 0.7`` gives the same ``k`` as
``7 / 10``, where ``(n + 1) * (1 - 0.7)`` in floating point would not). Where ``k > n`` (fewer
than ``1 / alpha - 1`` points) the score quantile, hence the interval, is infinite, with a
:class:`~torchcal.scaling.CalibrationWarning`.

**The guarantee.** For exchangeable calibration and test points, the coverage
``P(lower <= Y <= upper)`` is at least ``1 - alpha``, and, when the scores have no ties, it is
exactly ``k / (n + 1) < 1 - alpha + 1 / (n + 1)`` (marginally, over the draw of the calibration
set and the test point; not conditionally on ``x``). With Mondrian calibration (``groups``:
one quantile per group from that group's scores, Vovk et al. 2005) the same holds within every
group, with that group's ``n``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._validation import (
    check_alpha,
    check_finite,
    check_floating,
    check_group_ids,
    check_nonempty,
    check_option,
    check_positive,
    check_same_shape,
    check_tensor,
)
from torchcal.scaling._base import FittedMixin, warn_all

__all__ = [
    "ConformalFit",
    "conformal_rank",
    "conformal_quantile",
    "SplitConformal",
    "ConformalQuantileRegression",
]

_SCORES = ("absolute", "normalized")


@dataclass(frozen=True)
class ConformalFit:
    """What a conformal ``fit`` computed, per group (one entry without groups).

    Attributes:
        quantiles: the score quantile ``q`` per group (``inf`` where ``k > n``).
        counts: the calibration points ``n`` per group.
        ranks: ``k = ceil((n + 1)(1 - alpha))`` per group (the order statistic used).
        alpha: the miscoverage.
        warnings: the warnings issued (also as :class:`~torchcal.scaling.CalibrationWarning`).
    """

    quantiles: tuple[float, ...]
    counts: tuple[int, ...]
    ranks: tuple[int, ...]
    alpha: float
    warnings: tuple[str, ...] = ()


def conformal_rank(n: Tensor | int, alpha: float) -> Tensor:
    """``k = ceil((n + 1)(1 - alpha))`` exactly (int64, ``n``'s shape), see the module docstring.

    Example:
        >>> from torchcal.scaling import conformal_rank
        >>> conformal_rank(9, 0.2).item(), conformal_rank(9, 0.7).item(), conformal_rank(9, 0.05).item()
        (8, 3, 10)
    """
    a = float(check_alpha(alpha))  # type: ignore[arg-type]
    frac = Fraction(a).limit_denominator(10**9)
    m = torch.as_tensor(n, dtype=torch.int64) + 1
    return m - (m * frac.numerator) // frac.denominator


def conformal_quantile(
    scores: Tensor, alpha: float, groups: Tensor | None = None, num_groups: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The conformal score quantile per group: the ``k``-th smallest score of each group.

    Args:
        scores: finite conformity scores (any shape).
        alpha: miscoverage in ``(0, 1)``.
        groups: integer group ids of ``scores``' shape (``None``: one group).
        num_groups: the number of groups (``None``: ``max(groups) + 1``).

    Returns:
        ``(q, n, k)``: float64 quantiles ``(G,)`` (``inf`` where ``k > n``), int64 counts and
        ranks ``(G,)``. One sort; no loop over groups.

    Example:
        >>> import torch
        >>> from torchcal.scaling import conformal_quantile
        >>> s = torch.tensor([3.0, 1.0, 2.0, 5.0, 4.0, 9.0, 7.0, 8.0, 6.0])
        >>> q, n, k = conformal_quantile(s, 0.2)           # k = ceil(10 * 0.8) = 8
        >>> q.tolist(), n.tolist(), k.tolist()
        ([8.0], [9], [8])
    """
    check_floating("scores", check_tensor("scores", scores))
    check_nonempty("scores", scores)
    check_finite("scores", scores)
    x = scores.detach().reshape(-1).to(torch.float64)
    if groups is None:
        if num_groups is not None:
            raise ValueError("num_groups: given without groups")
        g = torch.zeros(x.shape, dtype=torch.long, device=x.device)
        G = 1
    else:
        G = check_group_ids(groups, scores.shape, num_groups)
        g = groups.detach().reshape(-1).to(device=x.device, dtype=torch.long)
    order = torch.argsort(x, stable=True)
    order = order[torch.argsort(g[order], stable=True)]  # by group, then by score
    sorted_x = x[order]
    n = torch.bincount(g, minlength=G)
    k = conformal_rank(n, alpha).to(x.device)
    start = torch.cumsum(n, 0) - n
    idx = (start + k - 1).clamp(0, x.numel() - 1)
    q = torch.where(k <= n, sorted_x[idx], torch.full_like(sorted_x[idx], float("inf")))
    return q, n, k


def round_outward(lower: Tensor, upper: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """float64 bounds cast to ``dtype``, rounded outwards (the interval never shrinks)."""
    lo, hi = lower.to(dtype), upper.to(dtype)
    if dtype != torch.float64:
        lo = torch.where(
            lo.double() > lower, torch.nextafter(lo, torch.full_like(lo, -float("inf"))), lo
        )
        hi = torch.where(
            hi.double() < upper, torch.nextafter(hi, torch.full_like(hi, float("inf"))), hi
        )
    return lo, hi


class _Conformal(FittedMixin):
    """State, fitting and group lookup shared by the two conformal predictors."""

    score_quantiles: Tensor
    counts: Tensor
    alpha: Tensor
    _nonnegative = True  # scores are >= 0 (CQR's may be negative)

    def __init__(self, alpha: float) -> None:
        super().__init__()
        a = float(check_alpha(alpha))  # type: ignore[arg-type]
        self.register_buffer("alpha", torch.tensor(a, dtype=torch.float64))
        self.register_buffer("score_quantiles", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("counts", torch.zeros(0, dtype=torch.int64))
        self._init_fitted()

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        a, q, n = (state.get(k) for k in ("alpha", "score_quantiles", "counts"))
        if a is not None and (a.numel() != 1 or not 0 < float(a) < 1):
            raise ValueError(f"{prefix}alpha: expected one value in (0, 1), got {a.tolist()}")
        if q is None:
            return
        ok = ~torch.isnan(q) & (q > -float("inf"))
        if self._nonnegative:
            ok &= q >= 0
        if q.dim() != 1 or not bool(ok.all()):
            raise ValueError(
                f"{prefix}score_quantiles: expected a 1-D tensor of "
                f"{'non-negative' if self._nonnegative else 'finite or +inf'} quantiles "
                f"(no NaN) in the loaded state"
            )
        if n is not None and (
            n.shape != q.shape
            or n.is_floating_point()
            or n.dtype == torch.bool
            or bool((n < 0).any())
        ):
            raise ValueError(f"{prefix}counts: expected {tuple(q.shape)} integer counts >= 0")
        fitted = state.get("fitted")
        if fitted is not None and bool(fitted) and q.numel() == 0:
            raise ValueError(
                f"{prefix}score_quantiles: a fitted state needs at least one, got none"
            )

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        for name in ("score_quantiles", "counts"):
            value = state_dict.get(prefix + name)
            if isinstance(value, Tensor):
                old = getattr(self, name)
                setattr(self, name, torch.empty_like(value, dtype=old.dtype, device=old.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _fit_scores(
        self, scores: Tensor, groups: Tensor | None, num_groups: int | None
    ) -> ConformalFit:
        alpha = float(self.alpha)
        q, n, k = conformal_quantile(scores, alpha, groups, num_groups)
        msgs = []
        if bool(torch.isinf(q).any()):
            bad = torch.nonzero(torch.isinf(q)).reshape(-1)[:5].tolist()
            msgs.append(
                f"alpha: ceil((n + 1)(1 - alpha)) > n for group(s) {bad} (n = "
                f"{n[bad].tolist()}, alpha = {alpha:g}): too few calibration points, the "
                f"interval is infinite there"
            )
        device = self.score_quantiles.device
        self.score_quantiles = q.to(device)
        self.counts = n.to(device)
        self._mark_fitted()
        return ConformalFit(
            quantiles=tuple(q.tolist()),
            counts=tuple(n.tolist()),
            ranks=tuple(k.tolist()),
            alpha=alpha,
            warnings=warn_all(msgs, stacklevel=4),
        )

    def _quantile_at(self, groups: Tensor | None, shape: torch.Size, device: Any) -> Tensor:
        """The fitted score quantile of each point (``shape``), float64."""
        self._check_fitted()
        q = self.score_quantiles.to(device)
        if groups is None:
            if q.numel() != 1:
                raise ValueError(
                    f"groups: this predictor was calibrated per group ({q.numel()} groups); "
                    f"pass the group ids"
                )
            return q.expand(shape)
        check_group_ids(groups, shape, q.numel())
        return q[groups.to(device=device, dtype=torch.long)]

    def extra_repr(self) -> str:
        return f"alpha={float(self.alpha):g}, groups={self.score_quantiles.numel()}"


def check_predictions(
    name: str, x: Tensor, like: Tensor | None = None, like_name: str = ""
) -> None:
    """A floating, non-empty, finite tensor (of ``like``'s shape where given)."""
    check_floating(name, check_tensor(name, x))
    check_nonempty(name, x)
    if like is not None:
        check_same_shape(like_name, like, name, x)
    check_finite(name, x)


class SplitConformal(_Conformal):
    r"""Split conformal intervals ``pred +- q`` (or ``pred +- q * scale``) around a point forecast.

    Scores on the calibration set: ``score="absolute"``: ``|y - pred|`` (constant width
    ``2 q``); ``score="normalized"``: ``|y - pred| / scale`` with a predicted spread ``scale > 0``
    (width ``2 q scale``, adaptive; Lei et al. 2018, section 5.2). ``q`` is the
    ``ceil((n + 1)(1 - alpha))``-th smallest score (see :mod:`torchcal.scaling.conformal`:
    **coverage >= 1 - alpha for exchangeable data, and < 1 - alpha + 1 / (n + 1) without
    ties**), one per group with ``groups`` (Mondrian: the guarantee holds in every group).

    ``fit(pred, target, scale=None, groups=None, num_groups=None)`` returns a
    :class:`ConformalFit`; ``predict(pred, scale=None, groups=None)`` returns ``(lower,
    upper)`` in the dtype of ``pred`` (computed in float64 and rounded outwards). Shapes: any,
    the same for every argument (nothing broadcasts). State: ``alpha``, ``score_quantiles``
    ``(G,)``, ``counts`` ``(G,)`` (float64 / int64, validated on load), ``fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import SplitConformal
        >>> pred = torch.zeros(9)
        >>> y = torch.tensor([3.0, -1.0, 2.0, -5.0, 4.0, 9.0, -7.0, 8.0, 6.0])
        >>> cp = SplitConformal(alpha=0.2)
        >>> cp.fit(pred, y).quantiles                      # the 8th smallest |y| of 9
        (8.0,)
        >>> cp.predict(torch.tensor([1.0, 2.0]))
        (tensor([-7., -6.]), tensor([ 9., 10.]))
    """

    def __init__(self, alpha: float = 0.1, *, score: str = "absolute") -> None:
        super().__init__(alpha)
        check_option("score", score, _SCORES)
        self.score = score

    def _scale(self, scale: Tensor | None, pred: Tensor) -> Tensor | None:
        if self.score == "absolute":
            if scale is not None:
                raise ValueError("scale: given with score='absolute' (use score='normalized')")
            return None
        if scale is None:
            raise ValueError("scale: score='normalized' needs the predicted scale")
        check_predictions("scale", scale, pred, "pred")
        check_positive("scale", scale)
        return scale.detach().to(torch.float64)

    def fit(
        self,
        pred: Tensor,
        target: Tensor,
        scale: Tensor | None = None,
        groups: Tensor | None = None,
        num_groups: int | None = None,
    ) -> ConformalFit:
        """Calibrate on held-out point forecasts ``pred`` and observations ``target``."""
        check_predictions("pred", pred)
        check_predictions("target", target, pred, "pred")
        s = self._scale(scale, pred)
        scores = (target.detach().to(torch.float64) - pred.detach().to(torch.float64)).abs()
        if s is not None:
            scores = scores / s
        return self._fit_scores(scores, groups, num_groups)

    def predict(
        self, pred: Tensor, scale: Tensor | None = None, groups: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(pred - q, pred + q)`` (``q * scale`` with ``score="normalized"``)."""
        check_predictions("pred", pred)
        s = self._scale(scale, pred)
        half = self._quantile_at(groups, pred.shape, pred.device)
        if s is not None:
            half = half * s
        p = pred.detach().to(torch.float64)
        return round_outward(p - half, p + half, pred.dtype)


class ConformalQuantileRegression(_Conformal):
    r"""Conformalised quantile regression (CQR; Romano, Patterson & Candes 2019).

    Given a model's lower and upper quantile predictions (e.g. at ``alpha / 2`` and
    ``1 - alpha / 2``), the calibration scores are ``E = max(lower - y, y - upper)``
    (negative inside the band) and the interval is ``[lower - q, upper + q]`` with ``q`` the
    ``ceil((n + 1)(1 - alpha))``-th smallest score (per group with ``groups``). **Coverage
    >= 1 - alpha for exchangeable data, < 1 - alpha + 1 / (n + 1) without ties** (see
    :mod:`torchcal.scaling.conformal`). A negative ``q`` narrows the band; where it would
    cross (``upper - lower < -2 q``) both ends are set to the band's midpoint (a point, which
    covers a continuous ``y`` with probability 0, as the empty set of the paper does).

    ``fit(lower, upper, target, groups=None, num_groups=None)`` returns a
    :class:`ConformalFit`; ``predict(lower, upper, groups=None)`` returns ``(lower, upper)``
    in the dtype of ``lower`` (rounded outwards). Inputs need ``lower <= upper``, equal
    shapes, finite values.

    Example:
        >>> import torch
        >>> from torchcal.scaling import ConformalQuantileRegression
        >>> lo, hi = -torch.ones(9), torch.ones(9)
        >>> y = torch.tensor([0.0, 0.5, -2.0, 3.0, 1.5, -0.5, 4.0, 0.2, -1.2])
        >>> cqr = ConformalQuantileRegression(alpha=0.2)
        >>> cqr.fit(lo, hi, y).quantiles                   # 8th smallest of max(lo - y, y - hi)
        (2.0,)
        >>> cqr.predict(torch.tensor([0.0]), torch.tensor([1.0]))
        (tensor([-2.]), tensor([3.]))
    """

    _nonnegative = False

    def __init__(self, alpha: float = 0.1) -> None:
        super().__init__(alpha)

    @staticmethod
    def _check_band(lower: Tensor, upper: Tensor) -> None:
        check_predictions("lower", lower)
        check_predictions("upper", upper, lower, "lower")
        bad = lower > upper
        if bool(bad.any()):
            pos = int(torch.nonzero(bad.reshape(-1))[0, 0])
            raise ValueError(
                f"upper: expected upper >= lower everywhere, got lower > upper at flat "
                f"position {pos} ({float(lower.reshape(-1)[pos])!r} > "
                f"{float(upper.reshape(-1)[pos])!r})"
            )

    def fit(
        self,
        lower: Tensor,
        upper: Tensor,
        target: Tensor,
        groups: Tensor | None = None,
        num_groups: int | None = None,
    ) -> ConformalFit:
        """Calibrate on held-out quantile predictions ``(lower, upper)`` and ``target``."""
        self._check_band(lower, upper)
        check_predictions("target", target, lower, "lower")
        lo, hi = lower.detach().to(torch.float64), upper.detach().to(torch.float64)
        y = target.detach().to(torch.float64)
        return self._fit_scores(torch.maximum(lo - y, y - hi), groups, num_groups)

    def predict(
        self, lower: Tensor, upper: Tensor, groups: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(lower - q, upper + q)``, a crossing band collapsed to its midpoint."""
        self._check_band(lower, upper)
        q = self._quantile_at(groups, lower.shape, lower.device)
        lo, hi = lower.detach().to(torch.float64), upper.detach().to(torch.float64)
        new_lo, new_hi = lo - q, hi + q
        cross = new_lo > new_hi
        mid = 0.5 * lo + 0.5 * hi
        new_lo = torch.where(cross, mid, new_lo)
        new_hi = torch.where(cross, mid, new_hi)
        return round_outward(new_lo, new_hi, torch.promote_types(lower.dtype, upper.dtype))
