"""torchmetrics Metrics over the binned core in :mod:`torchcal.functional.calibration`."""

from torchcal.metrics._base import MetricStatistics
from torchcal.metrics.calibration import (
    BrierDecomposition,
    CalibrationError,
    ClasswiseCalibrationError,
    ReliabilityDiagram,
)
from torchcal.metrics.multicalibration import MulticalibrationError
from torchcal.metrics.nll import NegativeLogLikelihood
from torchcal.metrics.regression import IntervalCoverage, PITHistogram, QuantileCalibrationError
from torchcal.metrics.regression_scores import CRPS, GaussianNLL, IntervalScore
from torchcal.metrics.selective import (
    AUGRC,
    AURC,
    CoverageAtRisk,
    RiskAtCoverage,
    RiskCoverageCurve,
)
from torchcal.metrics.sets import SetCoverage

__all__ = [
    "MulticalibrationError",
    "BrierDecomposition",
    "CalibrationError",
    "ClasswiseCalibrationError",
    "MetricStatistics",
    "NegativeLogLikelihood",
    "ReliabilityDiagram",
    "CRPS",
    "GaussianNLL",
    "IntervalCoverage",
    "IntervalScore",
    "PITHistogram",
    "QuantileCalibrationError",
    "AURC",
    "AUGRC",
    "RiskAtCoverage",
    "CoverageAtRisk",
    "RiskCoverageCurve",
    "SetCoverage",
]
