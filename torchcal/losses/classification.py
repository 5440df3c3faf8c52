"""Losses over class forecasts (logits): the proper scoring rules and the calibration
regularisers, thin shells over :mod:`torchcal.functional.scoring` and
:mod:`torchcal.functional.regularizers` (options checked in ``__init__``)."""

from __future__ import annotations

from torch import Tensor

import torchcal.functional as TF
from torchcal.functional._checks import (
    check_bool,
    check_floating,
    check_int,
    check_number,
    check_reduction,
)
from torchcal.functional._validation import (
    check_gamma,
    check_kernel_width,
    check_label_smoothing,
    check_norm_power,
)
from torchcal.functional.item_regularizers import confidence_penalty_fast, focal_loss_fast
from torchcal.functional.regularizers import (
    dca_fast,
    mdca_fast,
    mmce_fast,
    soft_binned_ece_fast,
)
from torchcal.functional.scoring import (
    brier_score_fast,
    log_score_fast,
    ranked_probability_score_fast,
    spherical_score_fast,
)
from torchcal.losses._buffers import KeepBufferDtype

__all__ = [
    "LogScoreLoss",
    "BrierLoss",
    "SphericalLoss",
    "RPSLoss",
    "FocalLoss",
    "MMCELoss",
    "SoftBinnedECELoss",
    "ConfidencePenaltyLoss",
    "DCALoss",
    "MDCALoss",
]


class _ClassScoreLoss(KeepBufferDtype):
    """Shared shell: stores ``weight`` (buffer), ``ignore_index``, ``reduction``,
    ``multilabel`` (independent sigmoids over ``(N, C, *)`` 0/1 float targets); a subclass
    sets ``_score`` (and ``_fast``, its hot path) and passes its own options through
    ``_options`` (``_fast_options``).

    ``forward`` first tries the rule's hot path (docs/design.md section 3): without
    ``weight`` and ``multilabel``, the options checked here once, ``_fast(logits, target,
    ignore_index, reduction, *options)`` decides from the shapes whether it applies, runs
    the kernel and its one value check, and returns ``None`` otherwise; then the functional
    rule runs with its full validation (the same numbers, today's messages)."""

    weight: Tensor | None
    _score: staticmethod  # the functional rule, set by each subclass
    _fast: staticmethod  # its hot path: (logits, target, ignore_index, reduction, *options)
    is_proper: str = "strict"  # "strict" | "proper" | "no" (see each subclass)

    def __init__(
        self,
        weight: Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        multilabel: bool = False,
    ) -> None:
        super().__init__()
        self.reduction = check_reduction(reduction)
        self.ignore_index = check_int("ignore_index", ignore_index)
        if weight is not None:
            check_floating("weight", weight)
        self.register_buffer("weight", weight)
        self.multilabel = check_bool("multilabel", multilabel)

    def _options(self) -> dict[str, object]:
        """Keyword options of ``_score`` beyond the shared ones."""
        return {}

    def _fast_options(self) -> tuple[object, ...] | None:
        """Extra positional options of ``_fast``; ``None`` where the hot path never applies."""
        return ()

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        if self._buffers["weight"] is None and not self.multilabel:
            options = self._fast_options()
            if options is not None:
                out = self._fast(logits, target, self.ignore_index, self.reduction, *options)
                if out is not None:
                    return out
        return self._score(
            logits,
            target,
            weight=self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            multilabel=self.multilabel,
            **self._options(),
        )

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

    ``is_proper``: ``"strict"``, or ``"no"`` when ``label_smoothing > 0`` (the expected
    score is then minimised by ``(1 - eps) q + eps / C``, not by ``q``).

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

    _score = staticmethod(TF.log_score)
    _fast = staticmethod(log_score_fast)

    def __init__(
        self,
        weight: Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        multilabel: bool = False,
    ) -> None:
        super().__init__(
            weight=weight, ignore_index=ignore_index, reduction=reduction, multilabel=multilabel
        )
        self.label_smoothing = check_label_smoothing(label_smoothing)

    @property
    def is_proper(self) -> str:  # type: ignore[override]
        return "no" if self.label_smoothing > 0 else "strict"

    def _options(self) -> dict[str, object]:
        return {"label_smoothing": self.label_smoothing}

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        # the shell's hot path, spelled out for the cheapest call (F.cross_entropy's cost)
        if self._buffers["weight"] is None and not (self.multilabel or self.label_smoothing):
            out = log_score_fast(logits, target, self.ignore_index, self.reduction)
            if out is not None:
                return out
        return super().forward(logits, target)

    def _fast_options(self) -> tuple[object, ...] | None:
        return None  # forward above has tried the hot path

    def extra_repr(self) -> str:
        extra = super().extra_repr()
        if self.label_smoothing:
            extra += f", label_smoothing={self.label_smoothing}"
        return extra


class BrierLoss(_ClassScoreLoss):
    r"""Brier score as a loss (:func:`torchcal.functional.brier_score`).

    Multiclass ``sum_c (p_c - y_c)^2``; binary ``(p - y)^2`` (half the 2-class value).
    ``is_proper = "strict"``.

    Example:
        >>> import torch
        >>> from torchcal.losses import BrierLoss
        >>> round(BrierLoss()(torch.zeros(2, 4), torch.tensor([0, 3])).item(), 4)
        0.75
    """

    _score = staticmethod(TF.brier_score)
    _fast = staticmethod(brier_score_fast)


class SphericalLoss(_ClassScoreLoss):
    r"""Spherical score ``1 - p_y / ||p||_2`` as a loss (:func:`torchcal.functional.spherical_score`).

    ``is_proper = "strict"``.

    Example:
        >>> import torch
        >>> from torchcal.losses import SphericalLoss
        >>> round(SphericalLoss()(torch.zeros(1, 4), torch.tensor([2])).item(), 4)
        0.5
    """

    _score = staticmethod(TF.spherical_score)
    _fast = staticmethod(spherical_score_fast)


class RPSLoss(_ClassScoreLoss):
    r"""Ranked probability score for ordered classes as a loss.

    See :func:`torchcal.functional.ranked_probability_score` (not normalised by
    ``C - 1``; the class order along ``dim=1`` is the ordinal order).
    ``is_proper = "strict"``.

    Example:
        >>> import torch
        >>> from torchcal.losses import RPSLoss
        >>> round(RPSLoss()(torch.zeros(1, 3), torch.tensor([0])).item(), 4)
        0.5556
    """

    _score = staticmethod(TF.ranked_probability_score)
    _fast = staticmethod(ranked_probability_score_fast)


class FocalLoss(_ClassScoreLoss):
    r"""Focal loss, or FLSD-53 with ``gamma='adaptive'`` (:func:`torchcal.functional.focal_loss`).

    Not a proper scoring rule: a training objective that tends to reduce over-confidence.
    ``is_proper``: ``"strict"`` only at ``gamma == 0`` (the log score), else ``"no"``.

    Example:
        >>> import torch
        >>> from torchcal.losses import FocalLoss
        >>> loss = FocalLoss(gamma="adaptive")
        >>> round(loss(torch.zeros(2, 4), torch.tensor([0, 3])).item(), 4)
        0.5848
    """

    _score = staticmethod(TF.focal_loss)
    _fast = staticmethod(focal_loss_fast)

    def __init__(
        self,
        gamma: float | str = 2.0,
        weight: Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        multilabel: bool = False,
    ) -> None:
        super().__init__(
            weight=weight, ignore_index=ignore_index, reduction=reduction, multilabel=multilabel
        )
        self.gamma = check_gamma(gamma)

    @property
    def is_proper(self) -> str:  # type: ignore[override]
        return "strict" if self.gamma == 0 else "no"

    def _options(self) -> dict[str, object]:
        return {"gamma": self.gamma}

    def _fast_options(self) -> tuple[object, ...] | None:
        return (self.gamma,)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma!r}, " + super().extra_repr()


class MMCELoss(KeepBufferDtype):
    r"""MMCE calibration penalty of a batch (:func:`torchcal.functional.mmce`).

    Usually added to a proper score. Kumar, Sarawagi & Jain 2018 train
    ``NLL + lambda * MMCE`` with the root, ``MMCE = (MMCE^2)^(1/2)`` (their released code
    returns ``sqrt(mmd + 1e-10)``; they use the weighted MMCE_w): that is ``squared=False``
    here. The default ``squared=True`` is torchcal's smooth form ``MMCE^2`` (the root has an
    infinite slope at 0, where ``squared=False`` takes the subgradient 0). With every item
    in one context, ``MMCE^2 = (mean(o) - r)^2`` is minimised in expectation at the true
    probability of being right; the root ``|mean(o) - r|`` is not.
    ``is_proper = "no"`` (a calibration penalty, not a scoring rule).

    Example:
        >>> import torch
        >>> from torchcal.losses import MMCELoss
        >>> logits = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 0.5]])
        >>> round(MMCELoss()(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.0271
        >>> round(MMCELoss(squared=False)(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.1647
    """

    is_proper = "no"

    def __init__(
        self,
        width: float = 0.4,
        squared: bool = True,
        ignore_index: int = -100,
        multilabel: bool = False,
    ) -> None:
        super().__init__()
        self.width = check_kernel_width(width)
        self.squared = check_bool("squared", squared)
        self.ignore_index = check_int("ignore_index", ignore_index)
        self.multilabel = check_bool("multilabel", multilabel)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        if not self.multilabel:  # the hot path (docs/design.md section 3), else the full one
            out = mmce_fast(logits, target, self.ignore_index, self.width, self.squared)
            if out is not None:
                return out
        return TF.mmce(
            logits,
            target,
            width=self.width,
            squared=self.squared,
            ignore_index=self.ignore_index,
            multilabel=self.multilabel,
        )

    def extra_repr(self) -> str:
        return f"width={self.width}, squared={self.squared}, ignore_index={self.ignore_index}"


class SoftBinnedECELoss(KeepBufferDtype):
    r"""Soft-binned ECE of a batch (:func:`torchcal.functional.soft_binned_ece`).

    Defaults to the smooth form ``root=False``: ``SB-ECE_p^p``, whose gradient is finite
    and continuous at 0; ``root=True`` returns ``SB-ECE_p`` (subgradient 0 at 0).
    ``is_proper = "no"`` (a calibration penalty, not a scoring rule).

    Example:
        >>> import torch
        >>> from torchcal.losses import SoftBinnedECELoss
        >>> logits = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 0.5]])
        >>> round(SoftBinnedECELoss()(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.1019
        >>> round(SoftBinnedECELoss(root=True)(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.3192
    """

    is_proper = "no"

    def __init__(
        self,
        bins: int = 15,
        temperature: float = 0.01,
        p: float = 2.0,
        ignore_index: int = -100,
        root: bool = False,
        multilabel: bool = False,
    ) -> None:
        super().__init__()
        self.bins = check_int("bins", bins, minimum=1)
        self.temperature = check_number("temperature", temperature, strict=True)
        self.p = check_norm_power("p", p)
        self.ignore_index = check_int("ignore_index", ignore_index)
        self.root = check_bool("root", root)
        self.multilabel = check_bool("multilabel", multilabel)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        if not self.multilabel:  # the hot path (docs/design.md section 3), else the full one
            out = soft_binned_ece_fast(
                logits, target, self.ignore_index, self.bins, self.temperature, self.p, self.root
            )
            if out is not None:
                return out
        return TF.soft_binned_ece(
            logits,
            target,
            bins=self.bins,
            temperature=self.temperature,
            p=self.p,
            ignore_index=self.ignore_index,
            root=self.root,
            multilabel=self.multilabel,
        )

    def extra_repr(self) -> str:
        return (
            f"bins={self.bins}, temperature={self.temperature}, p={self.p}, "
            f"ignore_index={self.ignore_index}, root={self.root}"
        )


class ConfidencePenaltyLoss(KeepBufferDtype):
    r"""Confidence penalty ``-beta * H(p)`` (:func:`torchcal.functional.confidence_penalty`).

    Pereyra et al. 2017: add it to a proper score, ``loss = log_score + penalty``; it is
    ``<= 0`` and rewards entropy. ``forward(logits, target=None)``: without a target the
    logits are multiclass ``(N, C, *)``; a target selects the layout and ``ignore_index``.
    ``is_proper = "no"`` (alone or added to the log score: the minimiser is flatter than q).

    Example:
        >>> import torch
        >>> from torchcal.losses import ConfidencePenaltyLoss
        >>> round(ConfidencePenaltyLoss(beta=0.5)(torch.zeros(2, 4)).item(), 4)  # -0.5 log 4
        -0.6931
    """

    is_proper = "no"

    def __init__(
        self,
        beta: float = 1.0,
        ignore_index: int = -100,
        reduction: str = "mean",
        multilabel: bool = False,
    ) -> None:
        super().__init__()
        self.beta = check_number("beta", beta)
        self.ignore_index = check_int("ignore_index", ignore_index)
        self.reduction = check_reduction(reduction)
        self.multilabel = check_bool("multilabel", multilabel)

    def forward(self, logits: Tensor, target: Tensor | None = None) -> Tensor:
        if target is None:  # the hot path (docs/design.md section 3), else the full one
            out = confidence_penalty_fast(logits, self.reduction, self.beta)
            if out is not None:
                return out
        return TF.confidence_penalty(
            logits,
            target,
            beta=self.beta,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            multilabel=self.multilabel,
        )

    def extra_repr(self) -> str:
        return f"beta={self.beta}, ignore_index={self.ignore_index}, reduction={self.reduction!r}"


class _BatchPenaltyLoss(KeepBufferDtype):
    """Shared shell of the batch-level penalties: ``beta * fn(logits, target)``."""

    _penalty: staticmethod
    _fast: staticmethod  # its hot path: (logits, target, ignore_index) -> Tensor | None
    is_proper = "no"

    def __init__(
        self, beta: float = 1.0, ignore_index: int = -100, multilabel: bool = False
    ) -> None:
        super().__init__()
        self.beta = check_number("beta", beta)
        self.ignore_index = check_int("ignore_index", ignore_index)
        self.multilabel = check_bool("multilabel", multilabel)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        out = None
        if not self.multilabel:  # the hot path (docs/design.md section 3), else the full one
            out = self._fast(logits, target, self.ignore_index)
        if out is None:
            out = self._penalty(
                logits, target, ignore_index=self.ignore_index, multilabel=self.multilabel
            )
        return out if self.beta == 1.0 else self.beta * out

    def extra_repr(self) -> str:
        return f"beta={self.beta}, ignore_index={self.ignore_index}"


class DCALoss(_BatchPenaltyLoss):
    r"""``beta * DCA`` of a batch (:func:`torchcal.functional.dca`, Liang et al. 2020).

    ``beta`` multiplies the output (the paper's ``log_score + beta * DCA``); add the
    result to a proper score. ``is_proper = "no"``.

    Example:
        >>> import torch
        >>> from torchcal.losses import DCALoss
        >>> logits = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 0.5]])
        >>> round(DCALoss(beta=10.0)(logits, torch.tensor([0, 0, 0, 1])).item(), 4)
        0.4672
    """

    _penalty = staticmethod(TF.dca)
    _fast = staticmethod(dca_fast)


class MDCALoss(_BatchPenaltyLoss):
    r"""``beta * MDCA`` of a batch (:func:`torchcal.functional.mdca`, Hebbalaguppe et al. 2022).

    ``beta`` multiplies the output (the paper's ``log_score + beta * MDCA``).
    ``is_proper = "no"`` (per item; a batch penalty, not a scoring rule).

    Example:
        >>> import torch
        >>> from torchcal.losses import MDCALoss
        >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
        >>> round(MDCALoss(beta=2.0)(logits, torch.tensor([0, 2])).item(), 4)
        0.4164
    """

    _penalty = staticmethod(TF.mdca)
    _fast = staticmethod(mdca_fast)
