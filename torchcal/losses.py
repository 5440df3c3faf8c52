"""``nn.Module`` losses: thin shells over :mod:`torchcal.functional`.

Every loss keeps its floating buffers (class ``weight``, quantile levels, ``alpha``) in
the dtype they were given under ``.to(dtype)``, ``.half()``, ``.bfloat16()``, ``.double()``
and Lightning's true-precision plugins (which call ``module.to(dtype)``): a quantile level
0.9 must not become 0.898 in bfloat16. ``.to(device)`` still moves them; state dicts are
unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

import torchcal.functional as TF


class _KeepBufferDtype(nn.Module):
    """A module whose floating buffers follow device moves but never dtype casts."""

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> nn.Module:
        before = {name: buf for name, buf in self._buffers.items()
                  if buf is not None and buf.is_floating_point()}
        super()._apply(fn, recurse)
        for name, old in before.items():
            new = self._buffers[name]
            if new is not None and new.dtype != old.dtype:
                self._buffers[name] = old.to(device=new.device)
        return self

# ---- classification scoring rules (owner: scoring) ----


class _ClassScoreLoss(_KeepBufferDtype):
    """Shared shell: stores ``weight`` (buffer), ``ignore_index``, ``reduction``,
    ``multilabel`` (independent sigmoids over ``(N, C, *)`` 0/1 float targets)."""

    weight: Tensor | None
    _score: staticmethod  # the functional rule, set by each subclass

    def __init__(self, weight: Tensor | None = None, ignore_index: int = -100,
                 reduction: str = "mean", multilabel: bool = False) -> None:
        super().__init__()
        TF._validation.check_reduction(reduction)
        TF.scoring._check_ignore_index(ignore_index)
        if weight is not None:
            TF._validation.check_floating("weight", weight)
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.multilabel = TF.scoring._check_multilabel(multilabel)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return self._score(logits, target, weight=self.weight, ignore_index=self.ignore_index,
                           reduction=self.reduction, multilabel=self.multilabel)

    def extra_repr(self) -> str:
        extra = f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"
        return extra + (", multilabel=True" if self.multilabel else "")


class LogScoreLoss(_ClassScoreLoss):
    r"""Logarithmic score (cross-entropy) as a loss (:func:`torchcal.functional.log_score`).

    Binary (``target`` of the logits' shape, floats in {0, 1}; also a ``(N, 1)`` head),
    multiclass (``logits`` ``(N, C, *)``, class indices ``(N, *)`` or float class
    probabilities of the logits' shape, as ``nn.CrossEntropyLoss``) or, only with
    ``multilabel=True``, independent sigmoids over ``(N, C, *)``; ``weight``, ``ignore_index``,
    ``reduction`` and ``label_smoothing`` as in ``nn.CrossEntropyLoss`` (``weight`` is a
    buffer). ``label_smoothing > 0`` (multiclass only) is not a proper score.

    Example:
        >>> import torch
        >>> from torchcal.losses import LogScoreLoss
        >>> loss = LogScoreLoss(weight=torch.tensor([1.0, 2.0, 1.0]))
        >>> round(loss(torch.zeros(2, 3), torch.tensor([0, 1])).item(), 4)
        1.0986
        >>> smoothed = LogScoreLoss(label_smoothing=0.1)
        >>> round(smoothed(torch.tensor([[2.0, 0.0]]), torch.tensor([0])).item(), 4)
        0.2269
    """

    def __init__(self, weight: Tensor | None = None, ignore_index: int = -100,
                 reduction: str = "mean", label_smoothing: float = 0.0,
                 multilabel: bool = False) -> None:
        super().__init__(weight=weight, ignore_index=ignore_index, reduction=reduction,
                         multilabel=multilabel)
        self.label_smoothing = TF.scoring._check_label_smoothing(label_smoothing)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return TF.log_score(logits, target, weight=self.weight, ignore_index=self.ignore_index,
                            reduction=self.reduction, label_smoothing=self.label_smoothing,
                            multilabel=self.multilabel)

    def extra_repr(self) -> str:
        extra = super().extra_repr()
        if self.label_smoothing:
            extra += f", label_smoothing={self.label_smoothing}"
        return extra


class BrierLoss(_ClassScoreLoss):
    r"""Brier score as a loss (:func:`torchcal.functional.brier_score`).

    Multiclass ``sum_c (p_c - y_c)^2``; binary ``(p - y)^2`` (half the 2-class value).

    Example:
        >>> import torch
        >>> from torchcal.losses import BrierLoss
        >>> round(BrierLoss()(torch.zeros(2, 4), torch.tensor([0, 3])).item(), 4)
        0.75
    """

    _score = staticmethod(TF.brier_score)


class SphericalLoss(_ClassScoreLoss):
    r"""Spherical score ``1 - p_y / ||p||_2`` as a loss (:func:`torchcal.functional.spherical_score`).

    Example:
        >>> import torch
        >>> from torchcal.losses import SphericalLoss
        >>> round(SphericalLoss()(torch.zeros(1, 4), torch.tensor([2])).item(), 4)
        0.5
    """

    _score = staticmethod(TF.spherical_score)


class RPSLoss(_ClassScoreLoss):
    r"""Ranked probability score for ordered classes as a loss.

    See :func:`torchcal.functional.ranked_probability_score` (not normalised by
    ``C - 1``; the class order along ``dim=1`` is the ordinal order).

    Example:
        >>> import torch
        >>> from torchcal.losses import RPSLoss
        >>> round(RPSLoss()(torch.zeros(1, 3), torch.tensor([0])).item(), 4)
        0.5556
    """

    _score = staticmethod(TF.ranked_probability_score)


class FocalLoss(_ClassScoreLoss):
    r"""Focal loss, or FLSD-53 with ``gamma='adaptive'`` (:func:`torchcal.functional.focal_loss`).

    Not a proper scoring rule: a training objective that tends to reduce over-confidence.

    Example:
        >>> import torch
        >>> from torchcal.losses import FocalLoss
        >>> loss = FocalLoss(gamma="adaptive")
        >>> round(loss(torch.zeros(2, 4), torch.tensor([0, 3])).item(), 4)
        0.5848
    """

    def __init__(self, gamma: float | str = 2.0, weight: Tensor | None = None,
                 ignore_index: int = -100, reduction: str = "mean",
                 multilabel: bool = False) -> None:
        super().__init__(weight=weight, ignore_index=ignore_index, reduction=reduction,
                         multilabel=multilabel)
        self.gamma = TF.regularizers._check_gamma(gamma)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return TF.focal_loss(logits, target, gamma=self.gamma, weight=self.weight,
                             ignore_index=self.ignore_index, reduction=self.reduction,
                             multilabel=self.multilabel)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma!r}, " + super().extra_repr()


class MMCELoss(_KeepBufferDtype):
    r"""MMCE calibration penalty of a batch (:func:`torchcal.functional.mmce`).

    Usually added to a proper score: ``loss = log_score + lam * mmce``. Defaults to the
    smooth form ``squared=True`` (``MMCE^2``, as Kumar et al. train with): the root has an
    infinite slope at 0, where ``squared=False`` takes the subgradient 0.

    Example:
        >>> import torch
        >>> from torchcal.losses import MMCELoss
        >>> logits = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 0.5]])
        >>> round(MMCELoss()(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.0271
        >>> round(MMCELoss(squared=False)(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.1647
    """

    def __init__(self, width: float = 0.4, squared: bool = True,
                 ignore_index: int = -100, multilabel: bool = False) -> None:
        super().__init__()
        self.width, self.squared = TF.regularizers._check_mmce_options(width, squared)
        self.ignore_index = TF.scoring._check_ignore_index(ignore_index)
        self.multilabel = TF.scoring._check_multilabel(multilabel)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return TF.mmce(logits, target, width=self.width, squared=self.squared,
                       ignore_index=self.ignore_index, multilabel=self.multilabel)

    def extra_repr(self) -> str:
        return f"width={self.width}, squared={self.squared}, ignore_index={self.ignore_index}"


class SoftBinnedECELoss(_KeepBufferDtype):
    r"""Soft-binned ECE of a batch (:func:`torchcal.functional.soft_binned_ece`).

    Defaults to the smooth form ``root=False``: ``SB-ECE_p^p``, whose gradient is finite
    and continuous at 0; ``root=True`` returns ``SB-ECE_p`` (subgradient 0 at 0).

    Example:
        >>> import torch
        >>> from torchcal.losses import SoftBinnedECELoss
        >>> logits = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 0.5]])
        >>> round(SoftBinnedECELoss()(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.1019
        >>> round(SoftBinnedECELoss(root=True)(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.3192
    """

    def __init__(self, bins: int = 15, temperature: float = 0.01, p: float = 2.0,
                 ignore_index: int = -100, root: bool = False,
                 multilabel: bool = False) -> None:
        super().__init__()
        self.bins, self.temperature, self.p = TF.regularizers._check_soft_bin_options(
            bins, temperature, p)
        self.ignore_index = TF.scoring._check_ignore_index(ignore_index)
        self.root = TF.regularizers._check_bool("root", root)
        self.multilabel = TF.scoring._check_multilabel(multilabel)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return TF.soft_binned_ece(logits, target, bins=self.bins, temperature=self.temperature,
                                  p=self.p, ignore_index=self.ignore_index, root=self.root,
                                  multilabel=self.multilabel)

    def extra_repr(self) -> str:
        return (f"bins={self.bins}, temperature={self.temperature}, p={self.p}, "
                f"ignore_index={self.ignore_index}, root={self.root}")


class ConfidencePenaltyLoss(_KeepBufferDtype):
    r"""Confidence penalty ``-beta * H(p)`` (:func:`torchcal.functional.confidence_penalty`).

    Pereyra et al. 2017: add it to a proper score, ``loss = log_score + penalty``; it is
    ``<= 0`` and rewards entropy. ``forward(logits, target=None)``: without a target the
    logits are multiclass ``(N, C, *)``; a target selects the layout and ``ignore_index``.

    Example:
        >>> import torch
        >>> from torchcal.losses import ConfidencePenaltyLoss
        >>> round(ConfidencePenaltyLoss(beta=0.5)(torch.zeros(2, 4)).item(), 4)  # -0.5 log 4
        -0.6931
    """

    def __init__(self, beta: float = 1.0, ignore_index: int = -100,
                 reduction: str = "mean", multilabel: bool = False) -> None:
        super().__init__()
        self.beta = TF.regularizers._check_beta(beta)
        self.ignore_index = TF.scoring._check_ignore_index(ignore_index)
        TF._validation.check_reduction(reduction)
        self.reduction = reduction
        self.multilabel = TF.scoring._check_multilabel(multilabel)

    def forward(self, logits: Tensor, target: Tensor | None = None) -> Tensor:
        return TF.confidence_penalty(logits, target, beta=self.beta,
                                     ignore_index=self.ignore_index, reduction=self.reduction,
                                     multilabel=self.multilabel)

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, ignore_index={self.ignore_index}, "
                f"reduction={self.reduction!r}")


class _BatchPenaltyLoss(_KeepBufferDtype):
    """Shared shell of the batch-level penalties: ``beta * fn(logits, target)``."""

    _penalty: staticmethod

    def __init__(self, beta: float = 1.0, ignore_index: int = -100,
                 multilabel: bool = False) -> None:
        super().__init__()
        self.beta = TF.regularizers._check_beta(beta)
        self.ignore_index = TF.scoring._check_ignore_index(ignore_index)
        self.multilabel = TF.scoring._check_multilabel(multilabel)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return self.beta * self._penalty(logits, target, ignore_index=self.ignore_index,
                                         multilabel=self.multilabel)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, ignore_index={self.ignore_index}"


class DCALoss(_BatchPenaltyLoss):
    r"""``beta * DCA`` of a batch (:func:`torchcal.functional.dca`, Liang et al. 2020).

    ``beta`` multiplies the output (the paper's ``log_score + beta * DCA``); add the
    result to a proper score.

    Example:
        >>> import torch
        >>> from torchcal.losses import DCALoss
        >>> logits = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 0.5]])
        >>> round(DCALoss(beta=10.0)(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.4672
    """

    _penalty = staticmethod(TF.dca)


class MDCALoss(_BatchPenaltyLoss):
    r"""``beta * MDCA`` of a batch (:func:`torchcal.functional.mdca`, Hebbalaguppe et al. 2022).

    ``beta`` multiplies the output (the paper's ``log_score + beta * MDCA``).

    Example:
        >>> import torch
        >>> from torchcal.losses import MDCALoss
        >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
        >>> round(MDCALoss(beta=2.0)(logits, torch.tensor([0, 2])).item(), 4)
        0.4164
    """

    _penalty = staticmethod(TF.mdca)


# ---- continuous scoring rules (owner: continuous) ----

_CRPS_DISTRIBUTIONS = ("normal", "laplace", "logistic", "ensemble")


def _check_reduction_option(reduction: str) -> str:
    TF._validation.check_reduction(reduction)
    return reduction


class CRPSLoss(_KeepBufferDtype):
    r"""Continuous ranked probability score as a loss (see :func:`torchcal.functional.crps_normal`).

    One module for the closed forms and for ensembles; ``distribution`` fixes the
    ``forward`` signature:

    * ``'normal'`` | ``'laplace'`` | ``'logistic'``: ``forward(loc, scale, target)``
      (:func:`~torchcal.functional.crps_normal` etc., exact closed-form gradients);
    * ``'ensemble'``: ``forward(samples, target)`` with members along ``ensemble_dim``
      (:func:`~torchcal.functional.crps_ensemble`, ``estimator='fair'`` by default: the
      ``'nrg'`` estimator under-disperses trained ensembles).

    ``estimator`` and ``ensemble_dim`` are used only with ``'ensemble'``.

    Example:
        >>> import torch
        >>> from torchcal.losses import CRPSLoss
        >>> loss = CRPSLoss("normal")
        >>> round(loss(torch.zeros(3), torch.ones(3), torch.zeros(3)).item(), 5)
        0.23369
        >>> ens = CRPSLoss("ensemble")
        >>> round(ens(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), torch.tensor([1.5])).item(), 4)
        0.1667
    """

    def __init__(self, distribution: str = "normal", *, estimator: str = "fair",
                 ensemble_dim: int = -1, reduction: str = "mean") -> None:
        super().__init__()
        TF._validation.check_option("distribution", distribution, _CRPS_DISTRIBUTIONS)
        if isinstance(ensemble_dim, bool) or not isinstance(ensemble_dim, int):
            raise TypeError(f"ensemble_dim: expected an int, got {type(ensemble_dim).__name__}")
        self.distribution = distribution
        self.estimator = TF.continuous._check_estimator(estimator)
        self.ensemble_dim = ensemble_dim
        self.reduction = _check_reduction_option(reduction)

    def forward(self, *inputs: Tensor) -> Tensor:
        if self.distribution == "ensemble":
            if len(inputs) != 2:
                raise TypeError(f"CRPSLoss('ensemble').forward expects (samples, target), got "
                                f"{len(inputs)} tensors")
            samples, target = inputs
            return TF.crps_ensemble(samples, target, estimator=self.estimator,
                                    ensemble_dim=self.ensemble_dim, reduction=self.reduction)
        if len(inputs) != 3:
            raise TypeError(f"CRPSLoss({self.distribution!r}).forward expects (loc, scale, "
                            f"target), got {len(inputs)} tensors")
        fn = {"normal": TF.crps_normal, "laplace": TF.crps_laplace,
              "logistic": TF.crps_logistic}[self.distribution]
        return fn(*inputs, reduction=self.reduction)

    def extra_repr(self) -> str:
        if self.distribution == "ensemble":
            return (f"distribution='ensemble', estimator={self.estimator!r}, "
                    f"ensemble_dim={self.ensemble_dim}, reduction={self.reduction!r}")
        return f"distribution={self.distribution!r}, reduction={self.reduction!r}"


class EnergyScoreLoss(_KeepBufferDtype):
    r"""Energy score of a multivariate ensemble as a loss (:func:`torchcal.functional.energy_score`).

    ``forward(samples, target)`` with ``samples`` ``(..., M, D)`` and ``target`` ``(..., D)``.

    Example:
        >>> import torch
        >>> from torchcal.losses import EnergyScoreLoss
        >>> x = torch.tensor([[[0.0, 0.0], [3.0, 4.0]]])
        >>> EnergyScoreLoss(estimator="nrg")(x, torch.tensor([[0.0, 0.0]])).item()
        1.25
    """

    def __init__(self, *, estimator: str = "fair", reduction: str = "mean") -> None:
        super().__init__()
        self.estimator = TF.continuous._check_estimator(estimator)
        self.reduction = _check_reduction_option(reduction)

    def forward(self, samples: Tensor, target: Tensor) -> Tensor:
        return TF.energy_score(samples, target, estimator=self.estimator,
                               reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"estimator={self.estimator!r}, reduction={self.reduction!r}"


class IntervalScoreLoss(_KeepBufferDtype):
    r"""Interval score of central ``(1 - alpha)`` intervals (:func:`torchcal.functional.interval_score`).

    ``alpha`` is a float in (0, 1) or a tensor of levels (kept as a buffer, so it moves
    with ``.to(device)``). ``forward(lower, upper, target)``.

    Example:
        >>> import torch
        >>> from torchcal.losses import IntervalScoreLoss
        >>> loss = IntervalScoreLoss(alpha=0.5, reduction="sum")
        >>> loss(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.5, 2.0])).item()
        6.0
    """

    alpha: Tensor | float

    def __init__(self, alpha: float | Tensor, *, reduction: str = "mean") -> None:
        super().__init__()
        alpha = TF.continuous._check_alpha(alpha)
        if isinstance(alpha, Tensor):
            self.register_buffer("alpha", alpha.detach().clone())
        else:
            self.alpha = alpha
        self.reduction = _check_reduction_option(reduction)

    def forward(self, lower: Tensor, upper: Tensor, target: Tensor) -> Tensor:
        return TF.interval_score(lower, upper, target, alpha=self.alpha,
                                 reduction=self.reduction)

    def extra_repr(self) -> str:
        alpha = self.alpha if isinstance(self.alpha, float) else "tensor"
        return f"alpha={alpha}, reduction={self.reduction!r}"


class QuantileLoss(_KeepBufferDtype):
    r"""Pinball loss over several quantile levels (:func:`torchcal.functional.quantile_score`).

    ``quantiles`` (``Q`` levels in (0, 1)) are stored as a float64 buffer;
    ``forward(pred, target)`` with ``pred`` ``(..., Q)`` and ``target`` ``(...)``.
    1x convention (level 0.5 gives half the absolute error), as scoringrules.

    Example:
        >>> import torch
        >>> from torchcal.losses import QuantileLoss
        >>> loss = QuantileLoss([0.1, 0.5, 0.9])
        >>> round(loss(torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([1.5])).item(), 4)
        0.15
    """

    quantiles: Tensor

    def __init__(self, quantiles: Tensor | list[float] | tuple[float, ...], *,
                 reduction: str = "mean") -> None:
        super().__init__()
        levels = TF.continuous._check_levels(quantiles)
        self.register_buffer("quantiles", levels.detach().to(torch.float64, copy=True))
        self.reduction = _check_reduction_option(reduction)

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        return TF.quantile_score(pred, target, self.quantiles, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"quantiles={self.quantiles.tolist()}, reduction={self.reduction!r}"


class GaussianNLLLoss(_KeepBufferDtype):
    r"""Gaussian negative log-likelihood (:func:`torchcal.functional.gaussian_nll`).

    ``forward(loc, spread, target)``: forecast first, observations last, like every
    distributional loss here (``CRPSLoss``, ``DawidSebastianiLoss``). **Not** the order
    of ``torch.nn.GaussianNLLLoss`` (``input, target, var``): porting code from it means
    swapping the last two arguments (a swapped positive target would run silently).
    ``spread`` is the variance by default (as in torch), the standard deviation with
    ``spread='scale'``. ``full=True`` by default (the true log score) and no ``eps`` clamp
    of the variance (non-positive spreads raise).

    Example:
        >>> import torch
        >>> from torchcal.losses import GaussianNLLLoss
        >>> round(GaussianNLLLoss()(torch.zeros(2), torch.ones(2), torch.zeros(2)).item(), 5)
        0.91894
    """

    def __init__(self, *, full: bool = True, spread: str = "var",
                 reduction: str = "mean") -> None:
        super().__init__()
        if not isinstance(full, bool):
            raise TypeError(f"full: expected a bool, got {type(full).__name__}")
        TF._validation.check_option("spread", spread, ("var", "scale"))
        self.full = full
        self.spread = spread
        self.reduction = _check_reduction_option(reduction)

    def forward(self, loc: Tensor, spread: Tensor, target: Tensor) -> Tensor:
        return TF.gaussian_nll(loc, spread, target, var=self.spread == "var", full=self.full,
                               reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"full={self.full}, spread={self.spread!r}, reduction={self.reduction!r}"


class DawidSebastianiLoss(_KeepBufferDtype):
    r"""Dawid-Sebastiani score as a loss (:func:`torchcal.functional.dawid_sebastiani_score`).

    ``forward(loc, scale, target)`` with ``scale`` the predictive standard deviation.

    Example:
        >>> import torch
        >>> from torchcal.losses import DawidSebastianiLoss
        >>> DawidSebastianiLoss()(torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)).item()
        4.0
    """

    def __init__(self, *, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = _check_reduction_option(reduction)

    def forward(self, loc: Tensor, scale: Tensor, target: Tensor) -> Tensor:
        return TF.dawid_sebastiani_score(loc, scale, target, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"
