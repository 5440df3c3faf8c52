"""The contestants: every training objective of the bake-off, built from
:mod:`torchcal.losses`, with its properness tag.

Proper scoring rules (alone): the log score, Brier, spherical. Non-proper objectives: focal
loss (fixed ``gamma = 3``, Mukhoti et al. 2020) and FLSD-53 (``gamma = 5`` where the true
class has probability < 0.2, else 3; Mukhoti et al. 2020), label smoothing 0.1 (Szegedy et
al. 2016; Muller et al. 2019). Regularisers added to the (mean) log score
(:data:`PAPER_WEIGHTS`; every one can be changed in the config):

* MMCE, ``lambda = 2``: Kumar, Sarawagi & Jain 2018 train ``NLL + lambda * MMCE`` with
  ``MMCE = (MMCE^2)^(1/2)``, the square root of the kernel statistic (Laplacian kernel,
  width 0.4); their released code returns ``sqrt(mmd + 1e-10)`` and its default
  coefficient is 4 (20 Newsgroups). ``lambda = 2`` is the setting of Mukhoti et al. 2020's
  released scripts (``--loss mmce_weighted --lamda 2.0``). Both use the *weighted* MMCE_w;
  we add the root of the unweighted MMCE_m (:func:`torchcal.functional.mmce`,
  ``squared=False``), so the weight is the papers' but the statistic is not identical.
* soft-binned ECE, ``beta = 1``: Karandikar et al. 2021, ``NLL + beta * SB-ECE`` with the
  root (``p = 2``; their code returns ``sqrt(sum_b w_b (C_b - A_b)^2)``), 15 bins,
  soft-binning temperature 0.01. The paper tunes ``beta`` per dataset; 1 is our nominal
  choice, not a value quoted from it.
* DCA, ``beta = 5``: Liang, Zhang, Wang & Jacobs 2020, ``CE + beta * DCA`` (5 is the default
  of the authors' code).
* MDCA, ``beta = 1``: Hebbalaguppe, Prakash, Madan & Arora 2022, ``NLL + beta * MDCA``
  (their NLL+MDCA setting).
* confidence penalty, ``beta = 0.1``: Pereyra et al. 2017, ``NLL - beta * H(p)``. They tune
  ``beta`` per task; 0.1 is our nominal choice, not a value quoted from the paper.

Properness of ``log score + w * penalty`` (checked in
tests/functional/test_properness_tags.py with one context ``q`` and a batch of ``m`` items
drawn from it): in one context either penalty is
``(mean(o) - r)^2`` in its smooth squared form (``o`` the correctness, ``r`` the top
confidence), so ``log score + w * MMCE^2`` (or ``SB-ECE^2``) is still minimised at the
truth, for any ``w`` and ``m`` (both terms are). The root forms used here, as in the
papers, are ``|mean(o) - r|``, minimised by a median instead of the mean, and move the
minimiser: at ``w = 2`` and ``q = (0.6, 0.25, 0.15)`` its top probability is 0.686
(``m = 1``), 0.576 (``m = 4``), 0.641 (``m = 6``). DCA, MDCA and the confidence penalty
move it for any non-zero weight. All of them are tagged ``"no"``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from torchcal.losses import (
    BrierLoss,
    ConfidencePenaltyLoss,
    DCALoss,
    FocalLoss,
    LogScoreLoss,
    MDCALoss,
    MMCELoss,
    SoftBinnedECELoss,
    SphericalLoss,
)

__all__ = ["LOSS_NAMES", "PAPER_WEIGHTS", "RegularisedLoss", "build_loss", "properness"]

#: weight of each regulariser beside the log score (see the module docstring for sources)
PAPER_WEIGHTS: dict[str, float] = {
    "mmce": 2.0,
    "sb_ece": 1.0,
    "dca": 5.0,
    "mdca": 1.0,
    "confidence_penalty": 0.1,
}
FOCAL_GAMMA = 3.0
LABEL_SMOOTHING = 0.1

_TAGS = ("strict", "proper", "no")


class RegularisedLoss(nn.Module):
    """``log score + weight * penalty``: a proper score with a calibration regulariser.

    ``is_proper`` is ``"no"`` for any non-zero weight (the penalty is a batch statistic, not
    a scoring rule; see the module docstring for when it moves the minimiser), else the
    base loss's tag.

    Example:
        >>> import torch
        >>> loss = RegularisedLoss(LogScoreLoss(), DCALoss(), 5.0)
        >>> float(loss(torch.zeros(2, 3), torch.tensor([0, 1]))) > 0, loss.is_proper
        (True, 'no')
    """

    def __init__(self, base: nn.Module, penalty: nn.Module, weight: float) -> None:
        super().__init__()
        self.base, self.penalty, self.weight = base, penalty, float(weight)

    @property
    def is_proper(self) -> str:
        return "no" if self.weight != 0 else properness(self.base)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return self.base(logits, target) + self.weight * self.penalty(logits, target)

    def extra_repr(self) -> str:
        return f"weight={self.weight}"


def properness(loss: nn.Module) -> str:
    """The loss's ``is_proper`` tag: ``"strict" | "proper" | "no"`` (every loss of
    :mod:`torchcal.losses` has one).

    Example:
        >>> properness(LogScoreLoss()), properness(LogScoreLoss(label_smoothing=0.1))
        ('strict', 'no')
    """
    tag = getattr(loss, "is_proper", None)
    if tag not in _TAGS:
        raise ValueError(f"loss: expected an is_proper tag in {_TAGS}, got {tag!r}")
    return tag


def _regularised(name: str, penalty: nn.Module, weights: dict[str, float]) -> nn.Module:
    return RegularisedLoss(LogScoreLoss(), penalty, weights[name])


_BUILDERS: dict[str, Callable[[dict[str, float]], nn.Module]] = {
    "log_score": lambda w: LogScoreLoss(),
    "brier": lambda w: BrierLoss(),
    "spherical": lambda w: SphericalLoss(),
    "focal_gamma3": lambda w: FocalLoss(gamma=FOCAL_GAMMA),
    "flsd53": lambda w: FocalLoss(gamma="adaptive"),
    "label_smoothing": lambda w: LogScoreLoss(label_smoothing=LABEL_SMOOTHING),
    "mmce": lambda w: _regularised("mmce", MMCELoss(squared=False), w),
    "sb_ece": lambda w: _regularised("sb_ece", SoftBinnedECELoss(root=True), w),
    "dca": lambda w: _regularised("dca", DCALoss(beta=1.0), w),
    "mdca": lambda w: _regularised("mdca", MDCALoss(beta=1.0), w),
    "confidence_penalty": lambda w: _regularised(
        "confidence_penalty", ConfidencePenaltyLoss(beta=1.0), w
    ),
}
LOSS_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def build_loss(name: str, weights: dict[str, float] | None = None) -> nn.Module:
    """The objective called ``name`` (one of :data:`LOSS_NAMES`); ``weights`` overrides
    entries of :data:`PAPER_WEIGHTS`.

    Example:
        >>> build_loss("flsd53")
        FocalLoss(gamma='adaptive', ignore_index=-100, reduction='mean')
    """
    if name not in _BUILDERS:
        raise ValueError(f"losses: expected names from {LOSS_NAMES}, got {name!r}")
    merged = dict(PAPER_WEIGHTS)
    for k, v in (weights or {}).items():
        if k not in PAPER_WEIGHTS:
            raise ValueError(f"weights: expected keys from {tuple(PAPER_WEIGHTS)}, got {k!r}")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
            raise ValueError(f"weights: expected a number >= 0 for {k!r}, got {v!r}")
        merged[k] = float(v)
    return _BUILDERS[name](merged)
