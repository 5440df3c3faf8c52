r"""Split conformal intervals and conformalised quantile regression, optionally per group, and
conformal prediction sets for classes (:class:`ConformalClassifier`).

**The quantile.** With ``n`` calibration scores and miscoverage ``alpha`` (or ``confidence = 1 -
alpha``, read as written: docs/design.md section 6e), the interval uses the ``k``-th smallest
score, ``k = ceil((n + 1)(1 - alpha))`` (Vovk et al. 2005; Lei et al. 2018), computed in
integers (:func:`torchcal.functional.conformal.conformal_rank`: ``0.7`` is ``7 / 10``, ``1 -
0.8`` is ``1 / 5``). Where ``k > n`` (fewer than ``1 / alpha - 1`` points) the score quantile,
hence the interval, is infinite, with a :class:`~torchcal.scaling.CalibrationWarning`.

**The guarantee.** For exchangeable calibration and test points, the coverage
``P(lower <= Y <= upper)`` is at least ``1 - alpha``, and, when the scores have no ties, it is
exactly ``k / (n + 1) < 1 - alpha + 1 / (n + 1)`` (marginally, over the draw of the calibration
set and the test point; not conditionally on ``x``). With Mondrian calibration (``groups``:
one quantile per group from that group's scores, Vovk et al. 2005) the same holds within every
group, with that group's ``n``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from numbers import Real
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_finite,
    check_floating,
    check_nonempty,
    check_option,
    check_positive,
    check_same_shape,
    check_tensor,
)
from torchcal.functional._levels import alpha_fraction, miscoverage
from torchcal.functional._validation import check_group_ids
from torchcal.functional.conformal import (
    METHODS,
    conformal_gather,
    conformal_quantile,
    conformal_score_matrix,
)
from torchcal.scaling._base import FittedMixin, warn_all

__all__ = [
    "ConformalFit",
    "SplitConformal",
    "ConformalQuantileRegression",
    "ConformalClassifier",
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

    def __init__(self, alpha: object | None, confidence: object | None = None) -> None:
        super().__init__()
        # an exact fraction (docs/design.md section 6e: 1 - 0.8 is 1/5); the buffer its float
        self._alpha_exact = miscoverage(alpha, confidence, default=0.1)
        a = float(self._alpha_exact)
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
        self,
        scores: Tensor,
        groups: Tensor | None,
        num_groups: int | None,
        notes: tuple[str, ...] = (),
    ) -> ConformalFit:
        alpha = float(self.alpha)
        q, n, k = conformal_quantile(scores, self._alpha(), groups, num_groups)
        msgs = list(notes)
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

    def _alpha(self) -> Fraction:
        """The exact miscoverage: as constructed, or read from a loaded state's float."""
        exact = self._alpha_exact
        return exact if float(exact) == float(self.alpha) else alpha_fraction(float(self.alpha))

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
    ``alpha`` (default 0.1) or ``confidence = 1 - alpha`` (read as written, section 6e).

    ``fit(pred, target, scale=None, groups=None, num_groups=None)`` returns a
    :class:`ConformalFit`; ``predict(pred, scale=None, groups=None)`` returns ``(lower,
    upper)`` in the dtype of ``pred`` (float64, rounded outwards). Shapes: any, the same for
    every argument. State: ``alpha``, ``score_quantiles``, ``counts`` (validated), ``fitted``.

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

    def __init__(
        self,
        alpha: float | None = None,
        *,
        score: str = "absolute",
        confidence: float | None = None,
    ) -> None:
        super().__init__(alpha, confidence)
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

    A crossing input band (``lower > upper`` on a row, as independently fitted quantile
    regressions produce) is sorted per row before scoring and predicting; the guarantee does not
    need ``lower <= upper`` (any score works), and ``fit`` says how many rows crossed.

    ``fit(lower, upper, target, groups=None, num_groups=None)`` returns a
    :class:`ConformalFit`; ``predict(lower, upper, groups=None)`` returns ``(lower, upper)``
    in the dtype of ``lower`` (rounded outwards). Inputs need equal shapes and finite values.
    ``alpha`` (default 0.1) or ``confidence = 1 - alpha``, as :class:`SplitConformal`.

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

    def __init__(self, alpha: float | None = None, *, confidence: float | None = None) -> None:
        super().__init__(alpha, confidence)

    @staticmethod
    def _sorted_band(lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor, int]:
        """The band in float64, sorted per row, and the number of crossing rows."""
        check_predictions("lower", lower)
        check_predictions("upper", upper, lower, "lower")
        lo, hi = lower.detach().to(torch.float64), upper.detach().to(torch.float64)
        crossed = int((lo > hi).sum())
        return torch.minimum(lo, hi), torch.maximum(lo, hi), crossed

    def fit(
        self,
        lower: Tensor,
        upper: Tensor,
        target: Tensor,
        groups: Tensor | None = None,
        num_groups: int | None = None,
    ) -> ConformalFit:
        """Calibrate on held-out quantile predictions ``(lower, upper)`` and ``target``."""
        lo, hi, crossed = self._sorted_band(lower, upper)
        check_predictions("target", target, lower, "lower")
        y = target.detach().to(torch.float64)
        note = ()
        if crossed:
            note = (
                f"upper: lower > upper on {crossed} of {lo.numel()} calibration rows; the band "
                f"was sorted per row (CQR's guarantee does not need lower <= upper)",
            )
        return self._fit_scores(torch.maximum(lo - y, y - hi), groups, num_groups, note)

    def predict(
        self, lower: Tensor, upper: Tensor, groups: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(lower - q, upper + q)`` of the per-row sorted band; where a negative ``q`` makes
        it cross, its midpoint."""
        lo, hi, _ = self._sorted_band(lower, upper)
        q = self._quantile_at(groups, lower.shape, lower.device)
        new_lo, new_hi = lo - q, hi + q
        cross = new_lo > new_hi
        mid = 0.5 * lo + 0.5 * hi
        new_lo = torch.where(cross, mid, new_lo)
        new_hi = torch.where(cross, mid, new_hi)
        return round_outward(new_lo, new_hi, torch.promote_types(lower.dtype, upper.dtype))


_CONDITIONAL = ("marginal", "class", "group")
_INPUTS = ("logits", "probs")
_T_SOURCES = ("calibration", "manual")


class ConformalClassifier(_Conformal):
    r"""Conformal prediction sets for classes (LAC, APS, RAPS, top-k), marginal, per class or
    per group; a thin shell over :func:`torchcal.functional.conformal_sets`.

    ``alpha`` (default 0.1) or ``confidence`` (``1 - alpha``, read as the decimal written:
    ``confidence=0.8`` is ``alpha = 1/5``; docs/design.md section 6e). ``fit(logits, target,
    groups=None, num_groups=None, size_split=None, u=None, generator=None)`` scores the
    calibration points' true labels and keeps the ``ceil((n + 1)(1 - alpha))``-th smallest
    score (:func:`conformal_quantile`) per stratum: ``conditional="marginal"`` (one threshold),
    ``"class"`` (one per true class: **coverage >= 1 - alpha within every class**) or
    ``"group"`` (Mondrian, one per group id: within every group). ``predict(logits,
    groups=None, u=None, generator=None)`` (and ``forward``) returns the ``(B, C)`` boolean set
    mask; sizes are ``mask.sum(1)``. ``input="probs"`` takes probabilities (rows summing to 1,
    used as given) instead of logits. **Marginal coverage >= 1 - alpha for exchangeable
    data**, and ``< 1 - alpha + 1 / (n + 1)`` without ties (randomized APS / RAPS, LAC on
    continuous scores).

    **The sets are deterministic by default**: ``randomized=False``, and APS / RAPS then use
    the published rule that admits the label crossing the threshold (``include_last=True``: a
    set is never empty, coverage ``>= 1 - alpha``, conservative; ``include_last=False``: the
    plain ``score <= q`` rule, which can return the empty set for the surest rows), so
    ``predict`` twice on the same rows gives the same sets. ``randomized=True`` gives exact
    coverage with one uniform per row: pass ``u`` or a seeded ``generator`` to ``fit`` and
    ``predict`` for reproducible draws; without them every call draws afresh.

    **The set temperature** is its own, stated choice (an NLL temperature can enlarge adaptive
    sets, MAPIE #483): ``None`` (as given), a number with ``temperature_source="calibration"``
    or ``"manual"`` (without a source it warns), or ``"fit_size"``: the ``T`` on a grid ``0.1 ..
    10`` with the smallest mean set size on ``size_split=(logits, target)``, held out from the
    calibration points. State: ``alpha``, ``score_quantiles``, ``counts``,
    ``set_temperature``, ``num_classes``, ``fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import ConformalClassifier
        >>> g = torch.Generator().manual_seed(0)
        >>> logits = torch.randn(500, 5, generator=g) * 2
        >>> y = torch.distributions.Categorical(logits=logits).sample()
        >>> cc = ConformalClassifier(confidence=0.9, method="lac")
        >>> cc.fit(logits[:400], y[:400]).ranks             # ceil(401 * 0.9)
        (361,)
        >>> sets = cc.predict(logits[400:])
        >>> sets.shape, sets.dtype
        (torch.Size([100, 5]), torch.bool)
        >>> aps = ConformalClassifier(alpha=0.1)            # deterministic APS, never empty
        >>> _ = aps.fit(logits[:400], y[:400])
        >>> bool(aps.predict(logits[400:]).any(1).all())
        True
        >>> torch.equal(aps.predict(logits[400:]), aps.predict(logits[400:]))
        True
    """

    set_temperature: Tensor
    num_classes: Tensor

    def __init__(
        self,
        alpha: float | None = None,
        method: str = "aps",
        *,
        confidence: float | None = None,
        randomized: bool = False,
        include_last: bool | None = None,
        input: str = "logits",
        lam: float = 0.01,
        k_reg: int = 5,
        conditional: str = "marginal",
        temperature: float | str | None = None,
        temperature_source: str | None = None,
    ) -> None:
        super().__init__(alpha, confidence)
        check_option("method", method, METHODS)
        check_option("conditional", conditional, _CONDITIONAL)
        check_option("input", input, _INPUTS)
        self.method, self.randomized, self.conditional = method, randomized, conditional
        self.include_last, self.input = include_last, input
        self.lam, self.k_reg = lam, k_reg
        self._scores(torch.full((1, 2), 0.5), 1.0, torch.zeros(1), None, probs=True)  # options
        t = 1.0
        if temperature == "fit_size":
            if temperature_source is not None:
                raise ValueError("temperature_source: not used with temperature='fit_size'")
        elif temperature is not None:
            if isinstance(temperature, (str, bool)) or not (
                isinstance(temperature, Real)
                or (isinstance(temperature, Tensor) and temperature.numel() == 1)
            ):
                raise ValueError(
                    f"temperature: expected None, a number > 0 or 'fit_size', got {temperature!r}"
                )
            t = float(temperature)  # numpy floats and one-element tensors too
            if not (math.isfinite(t) and t > 0):
                raise ValueError(f"temperature: expected a finite value > 0, got {t!r}")
            if temperature_source is None:
                warn_all(
                    [
                        f"temperature: T = {t:g} used for the sets without a stated source; a "
                        f"T fitted for NLL can enlarge adaptive sets: pass "
                        f"temperature_source='calibration' to reuse it on purpose"
                    ]
                )
            else:
                check_option("temperature_source", temperature_source, _T_SOURCES)
        elif temperature_source is not None:
            raise ValueError("temperature_source: given without a temperature")
        self.fit_size = isinstance(temperature, str) and temperature == "fit_size"
        self.register_buffer("set_temperature", torch.tensor(t, dtype=torch.float64))
        # the class count of the calibration logits (0 before fit): predict checks it
        self.register_buffer("num_classes", torch.tensor(0, dtype=torch.int64))

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        super()._check_state(state, prefix)
        c = state.get("num_classes")
        if c is None:
            return
        fitted = state.get("fitted")
        least = 2 if fitted is not None and bool(fitted) else 0
        if c.numel() != 1 or c.is_floating_point() or c.dtype == torch.bool or int(c) < least:
            raise ValueError(
                f"{prefix}num_classes: expected one integer >= {least} in the loaded state, "
                f"got {c.tolist()}"
            )

    def _scores(
        self,
        logits: Tensor,
        t: float,
        u: Tensor | None,
        generator: torch.Generator | None,
        probs: bool = False,
    ) -> Tensor:
        return conformal_score_matrix(
            logits,
            self.method,
            input="probs" if probs else self.input,
            temperature=t,
            randomized=self.randomized,
            include_last=self.include_last,
            lam=self.lam,
            k_reg=self.k_reg,
            u=u,
            generator=generator,
        )

    def _fit_temperature(
        self, size_split: tuple[Tensor, Tensor] | None, generator: torch.Generator | None
    ) -> float:
        if size_split is None:
            raise ValueError("size_split: temperature='fit_size' needs a held-out (logits, target)")
        logits, target = size_split
        grid = torch.logspace(-1, 1, 41, dtype=torch.float64).tolist()
        best, best_size = 1.0, math.inf
        for t in grid:  # a loop over 41 temperatures, vectorised over rows
            s = self._scores(logits, t, None, generator)
            q, _, _ = conformal_quantile(conformal_gather(s, target), self._alpha())
            size = float((s <= q).sum(1).double().mean())
            if size < best_size:
                best, best_size = t, size
        return best

    def fit(
        self,
        logits: Tensor,
        target: Tensor,
        groups: Tensor | None = None,
        num_groups: int | None = None,
        size_split: tuple[Tensor, Tensor] | None = None,
        u: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> ConformalFit:
        """Calibrate on held-out ``logits`` ``(n, C)`` and class ids ``target`` ``(n,)``."""
        if self.fit_size:
            self.set_temperature.fill_(self._fit_temperature(size_split, generator))
        elif size_split is not None:
            raise ValueError("size_split: only used with temperature='fit_size'")
        s = self._scores(logits, float(self.set_temperature), u, generator)
        scores = conformal_gather(s, target)
        if self.conditional == "class":
            if groups is not None:
                raise ValueError("groups: conditional='class' uses the true class as the group")
            groups, num_groups = target, s.shape[1]
        elif self.conditional == "group" and groups is None:
            raise ValueError("groups: conditional='group' needs the group id of every point")
        elif self.conditional == "marginal" and groups is not None:
            raise ValueError("groups: given with conditional='marginal'")
        fit = self._fit_scores(scores, groups, num_groups)
        self.num_classes.fill_(s.shape[1])
        return fit

    def predict(
        self,
        logits: Tensor,
        groups: Tensor | None = None,
        u: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """The ``(B, C)`` boolean set mask."""
        self._check_fitted()
        s = self._scores(logits, float(self.set_temperature), u, generator)
        q = self.score_quantiles.to(s.device)
        calibrated = int(self.num_classes)
        if calibrated != s.shape[1]:
            raise ValueError(
                f"logits: calibrated on {calibrated} classes, got {s.shape[1]} columns"
            )
        if self.conditional == "class":
            if groups is not None:
                raise ValueError("groups: not used with conditional='class'")
            return s <= q[None, :]
        if self.conditional == "marginal" and groups is not None:
            raise ValueError("groups: given with conditional='marginal'")
        return s <= self._quantile_at(groups, torch.Size([s.shape[0]]), s.device)[:, None]

    def forward(self, logits: Tensor, groups: Tensor | None = None) -> Tensor:
        return self.predict(logits, groups)

    def extra_repr(self) -> str:
        return (
            f"alpha={float(self.alpha):g}, method={self.method!r}, input={self.input!r}, "
            f"randomized={self.randomized}, conditional={self.conditional!r}, "
            f"T={float(self.set_temperature):g}"
        )
