"""torchmetrics Metrics over the binned core in :mod:`torchcal.functional.calibration`."""

from torchcal.metrics.calibration import (
    BrierDecomposition,
    CalibrationError,
    ClasswiseCalibrationError,
    MetricStatistics,
    NegativeLogLikelihood,
    ReliabilityDiagram,
)
from torchcal.metrics.regression import IntervalCoverage, PITHistogram, QuantileCalibrationError
from torchcal.metrics.regression_scores import CRPS, GaussianNLL, IntervalScore

__all__ = [
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
]
