"""``nn.Module`` losses: thin shells over :mod:`torchcal.functional`.

:mod:`~torchcal.losses.classification` holds the losses over logits (proper scoring rules
and calibration regularisers), :mod:`~torchcal.losses.continuous` those over real-valued
forecasts. Every loss keeps its floating buffers in the dtype they were given under
``.to(dtype)`` (:mod:`torchcal.losses._buffers`); state dicts are unchanged.
"""

from torchcal.losses.classification import (
    BrierLoss,
    ConfidencePenaltyLoss,
    DCALoss,
    FocalLoss,
    LogScoreLoss,
    MDCALoss,
    MMCELoss,
    RPSLoss,
    SoftBinnedECELoss,
    SphericalLoss,
)
from torchcal.losses.continuous import (
    CRPSLoss,
    DawidSebastianiLoss,
    EnergyScoreLoss,
    GaussianNLLLoss,
    IntervalScoreLoss,
    QuantileLoss,
)

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
    "CRPSLoss",
    "EnergyScoreLoss",
    "IntervalScoreLoss",
    "QuantileLoss",
    "GaussianNLLLoss",
    "DawidSebastianiLoss",
]
