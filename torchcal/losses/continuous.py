"""Losses over real-valued forecasts, thin shells over :mod:`torchcal.functional.continuous`
and :mod:`torchcal.functional.crps` (forecast first, observations last)."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from torchcal.functional._checks import check_bool, check_int, check_option, check_reduction
from torchcal.functional._forecast import gaussian_spread, renamed_keyword
from torchcal.functional._validation import check_alpha, check_ensemble_estimator, check_levels
from torchcal.functional.continuous import (
    dawid_sebastiani_score,
    gaussian_nll_of,
    interval_score,
    quantile_score_of,
)
from torchcal.functional.crps import (
    crps_ensemble,
    crps_laplace,
    crps_logistic,
    crps_normal,
    energy_score,
)
from torchcal.losses._buffers import KeepBufferDtype

__all__ = [
    "CRPSLoss",
    "EnergyScoreLoss",
    "IntervalScoreLoss",
    "QuantileLoss",
    "GaussianNLLLoss",
    "DawidSebastianiLoss",
]

_CRPS_FAMILIES = ("normal", "laplace", "logistic", "ensemble")
_CLOSED_FORMS = {"normal": crps_normal, "laplace": crps_laplace, "logistic": crps_logistic}


class CRPSLoss(KeepBufferDtype):
    r"""Continuous ranked probability score as a loss (see :func:`torchcal.functional.crps_normal`).

    One module for the closed forms and for ensembles; ``family`` fixes the ``forward``
    arguments, positional or by name:

    * ``'normal'`` | ``'laplace'`` | ``'logistic'``: ``forward(loc, scale, target)``
      (:func:`~torchcal.functional.crps_normal` etc., exact closed-form gradients);
    * ``'ensemble'``: ``forward(samples, target)`` with members along ``ensemble_dim``
      (:func:`~torchcal.functional.crps_ensemble`, ``estimator='fair'`` by default: the
      ``'nrg'`` estimator under-disperses trained ensembles).

    ``estimator`` and ``ensemble_dim`` are used only with ``'ensemble'``.
    ``is_proper = "strict"`` (CRPS is strictly proper for distributions with a finite mean).
    ``distribution=`` is the deprecated spelling of ``family=`` (one release, with a
    ``FutureWarning``; both given raise ``ValueError``).

    Example:
        >>> import torch
        >>> from torchcal.losses import CRPSLoss
        >>> loss = CRPSLoss("normal")
        >>> round(loss(torch.zeros(3), torch.ones(3), torch.zeros(3)).item(), 5)
        0.23369
        >>> round(loss(loc=torch.zeros(3), scale=torch.ones(3), target=torch.zeros(3)).item(), 5)
        0.23369
        >>> ens = CRPSLoss(family="ensemble")
        >>> round(ens(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), torch.tensor([1.5])).item(), 4)
        0.1667
        >>> round(ens(samples=torch.tensor([[0.0, 1.0, 2.0, 3.0]]), target=torch.tensor([1.5])).item(), 4)
        0.1667
    """

    is_proper = "strict"

    def __init__(
        self,
        family: str | None = None,
        *,
        estimator: str = "fair",
        ensemble_dim: int = -1,
        reduction: str = "mean",
        distribution: str | None = None,
    ) -> None:
        super().__init__()
        family = renamed_keyword("CRPSLoss", "family", family, "distribution", distribution)
        self.family = check_option("family", "normal" if family is None else family, _CRPS_FAMILIES)
        self.ensemble_dim = check_int("ensemble_dim", ensemble_dim)
        self.estimator = check_ensemble_estimator(estimator)
        self.reduction = check_reduction(reduction)
        self._arity = 2 if self.family == "ensemble" else 3
        self._fn = _CLOSED_FORMS.get(self.family)

    @property
    def distribution(self) -> str:
        """Deprecated: :attr:`family`."""
        warnings.warn(
            "CRPSLoss.distribution is deprecated; use CRPSLoss.family", FutureWarning, stacklevel=2
        )
        return self.family

    def _arguments(self, inputs: tuple[Tensor, ...], named: dict[str, Tensor | None]) -> list:
        """The family's arguments in order, from positional ``inputs`` then ``named``."""
        want = ("samples", "target") if self.family == "ensemble" else ("loc", "scale", "target")
        wrong = [k for k, v in named.items() if v is not None and k not in want]
        if wrong or len(inputs) > len(want):
            got = f"{len(inputs)} positional tensors" + "".join(f", {k}=" for k in wrong)
            raise TypeError(
                f"CRPSLoss({self.family!r}).forward expects ({', '.join(want)}), got {got}"
            )
        args = list(inputs)
        for k in want[len(inputs) :]:
            args.append(named[k])
        for k in want[: len(inputs)]:
            if named[k] is not None:
                raise TypeError(f"CRPSLoss({self.family!r}).forward got {k} twice")
        missing = [k for k, v in zip(want, args) if v is None]
        if missing:
            raise TypeError(
                f"CRPSLoss({self.family!r}).forward expects ({', '.join(want)}), missing "
                f"{', '.join(missing)}"
            )
        return args

    def forward(
        self,
        *inputs: Tensor,
        loc: Tensor | None = None,
        scale: Tensor | None = None,
        samples: Tensor | None = None,
        target: Tensor | None = None,
    ) -> Tensor:
        """``forward(loc, scale, target)`` (closed forms) or ``forward(samples, target)``
        (ensembles), positional or by name."""
        if len(inputs) == self._arity and loc is scale is samples is target is None:
            args = list(inputs)  # the positional call: nothing to sort out
        else:
            named = {"loc": loc, "scale": scale, "samples": samples, "target": target}
            args = self._arguments(inputs, named)
        if self._fn is not None:
            return self._fn(*args, reduction=self.reduction)
        if self.family == "ensemble":
            return crps_ensemble(
                *args,
                estimator=self.estimator,
                ensemble_dim=self.ensemble_dim,
                reduction=self.reduction,
            )
        raise AssertionError("unreachable")

    def extra_repr(self) -> str:
        if self.family == "ensemble":
            return (
                f"family='ensemble', estimator={self.estimator!r}, "
                f"ensemble_dim={self.ensemble_dim}, reduction={self.reduction!r}"
            )
        return f"family={self.family!r}, reduction={self.reduction!r}"


class EnergyScoreLoss(KeepBufferDtype):
    r"""Energy score of a multivariate ensemble as a loss (:func:`torchcal.functional.energy_score`).

    ``forward(samples, target)`` with ``samples`` ``(..., M, D)`` and ``target`` ``(..., D)``.
    ``is_proper = "strict"`` (for distributions with a finite mean).

    Example:
        >>> import torch
        >>> from torchcal.losses import EnergyScoreLoss
        >>> x = torch.tensor([[[0.0, 0.0], [3.0, 4.0]]])
        >>> EnergyScoreLoss(estimator="nrg")(x, torch.tensor([[0.0, 0.0]])).item()
        1.25
    """

    is_proper = "strict"

    def __init__(self, *, estimator: str = "fair", reduction: str = "mean") -> None:
        super().__init__()
        self.estimator = check_ensemble_estimator(estimator)
        self.reduction = check_reduction(reduction)

    def forward(self, samples: Tensor, target: Tensor) -> Tensor:
        return energy_score(samples, target, estimator=self.estimator, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"estimator={self.estimator!r}, reduction={self.reduction!r}"


class IntervalScoreLoss(KeepBufferDtype):
    r"""Interval score of central ``(1 - alpha)`` intervals (:func:`torchcal.functional.interval_score`).

    ``alpha`` is a float in (0, 1) or a tensor of levels (kept as a buffer, so it moves
    with ``.to(device)``). ``forward(lower, upper, target)``.
    ``is_proper = "proper"``: minimised by the true ``alpha/2`` and ``1 - alpha/2``
    quantiles, but every distribution sharing them scores the same.

    Example:
        >>> import torch
        >>> from torchcal.losses import IntervalScoreLoss
        >>> loss = IntervalScoreLoss(alpha=0.5, reduction="sum")
        >>> loss(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.5, 2.0])).item()
        6.0
    """

    alpha: Tensor | float

    is_proper = "proper"

    def __init__(self, alpha: float | Tensor, *, reduction: str = "mean") -> None:
        super().__init__()
        alpha = check_alpha(alpha)
        if isinstance(alpha, Tensor):
            self.register_buffer("alpha", alpha.detach().clone())
        else:
            self.alpha = alpha
        self.reduction = check_reduction(reduction)

    def forward(self, lower: Tensor, upper: Tensor, target: Tensor) -> Tensor:
        return interval_score(lower, upper, target, alpha=self.alpha, reduction=self.reduction)

    def extra_repr(self) -> str:
        alpha = self.alpha if isinstance(self.alpha, float) else "tensor"
        return f"alpha={alpha}, reduction={self.reduction!r}"


class QuantileLoss(KeepBufferDtype):
    r"""Pinball loss over several quantile levels (:func:`torchcal.functional.quantile_score`).

    ``quantiles`` (``Q`` levels in (0, 1)) are stored as a float64 buffer;
    ``forward(pred, target)`` with ``pred`` ``(..., Q)`` and ``target`` ``(...)``.
    1x convention (level 0.5 gives half the absolute error), as scoringrules.
    ``is_proper = "proper"``: it elicits the true quantiles at the given levels, not the
    whole distribution (any distribution with those quantiles scores the same).

    Example:
        >>> import torch
        >>> from torchcal.losses import QuantileLoss
        >>> loss = QuantileLoss([0.1, 0.5, 0.9])
        >>> round(loss(torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([1.5])).item(), 4)
        0.15
    """

    quantiles: Tensor

    is_proper = "proper"

    def __init__(
        self, quantiles: Tensor | list[float] | tuple[float, ...], *, reduction: str = "mean"
    ) -> None:
        super().__init__()
        levels = check_levels(quantiles)
        self.register_buffer("quantiles", levels.detach().to(torch.float64, copy=True))
        self.reduction = check_reduction(reduction)

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        return quantile_score_of(pred, target, self.quantiles, self.reduction)

    def extra_repr(self) -> str:
        return f"quantiles={self.quantiles.tolist()}, reduction={self.reduction!r}"


class GaussianNLLLoss(KeepBufferDtype):
    r"""Gaussian negative log-likelihood (:func:`torchcal.functional.gaussian_nll`).

    ``forward(loc, spread, target)``: forecast first, observations last, like every
    distributional loss here (``CRPSLoss``, ``DawidSebastianiLoss``). **Not** the order
    of ``torch.nn.GaussianNLLLoss`` (``input, target, var``): porting code from it means
    swapping the last two arguments (a swapped positive target would run silently).
    The positional ``spread`` is the **variance** by default (as in torch), the standard
    deviation with ``spread='scale'``; or name it in the call, ``forward(loc, target=y,
    var=v)`` or ``forward(loc, target=y, sd=s)`` (the name wins over ``spread=``; ``var=``
    with ``sd=`` raise ``ValueError``, a positional spread with a named one ``TypeError``).
    ``full=True`` by default (the true log score) and no ``eps`` clamp of the variance
    (non-positive spreads raise). ``is_proper = "strict"`` (the log score of the normal
    forecast).

    Example:
        >>> import torch
        >>> from torchcal.losses import GaussianNLLLoss
        >>> round(GaussianNLLLoss()(torch.zeros(2), torch.ones(2), torch.zeros(2)).item(), 5)
        0.91894
        >>> loss, loc, y = GaussianNLLLoss(), torch.zeros(1), torch.full((1,), 2.0)
        >>> round(loss(loc, target=y, var=torch.full((1,), 4.0)).item(), 5)
        2.11209
        >>> round(loss(loc, target=y, sd=torch.full((1,), 2.0)).item(), 5)
        2.11209
    """

    is_proper = "strict"

    def __init__(self, *, full: bool = True, spread: str = "var", reduction: str = "mean") -> None:
        super().__init__()
        self.full = check_bool("full", full)
        self.spread = check_option("spread", spread, ("var", "scale"))
        self.reduction = check_reduction(reduction)

    def forward(
        self,
        loc: Tensor,
        spread: Tensor | None = None,
        target: Tensor | None = None,
        *,
        var: Tensor | None = None,
        sd: Tensor | None = None,
    ) -> Tensor:
        if var is None and sd is None and spread is not None and target is not None:
            return gaussian_nll_of(
                loc, spread, target, self.spread == "var", self.full, self.reduction
            )
        name = "var" if var is not None else "sd"
        positional = "var" if self.spread == "var" else "sd"
        value, is_var = gaussian_spread("GaussianNLLLoss.forward", spread, var, sd, positional)
        if target is None:
            raise TypeError("GaussianNLLLoss.forward: missing target (the observations)")
        return gaussian_nll_of(loc, value, target, is_var, self.full, self.reduction, name)

    def extra_repr(self) -> str:
        return f"full={self.full}, spread={self.spread!r}, reduction={self.reduction!r}"


class DawidSebastianiLoss(KeepBufferDtype):
    r"""Dawid-Sebastiani score as a loss (:func:`torchcal.functional.dawid_sebastiani_score`).

    ``forward(loc, scale, target)`` with ``scale`` the predictive standard deviation.
    ``is_proper = "proper"``: it depends on the forecast's mean and variance only, so
    every distribution with the true mean and variance scores the same.

    Example:
        >>> import torch
        >>> from torchcal.losses import DawidSebastianiLoss
        >>> DawidSebastianiLoss()(torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)).item()
        4.0
    """

    is_proper = "proper"

    def __init__(self, *, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = check_reduction(reduction)

    def forward(self, loc: Tensor, scale: Tensor, target: Tensor) -> Tensor:
        return dawid_sebastiani_score(loc, scale, target, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"
