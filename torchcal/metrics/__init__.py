"""torchmetrics Metrics over the binned core in :mod:`torchcal.functional.calibration`."""

from torchcal.metrics.calibration import (
    BrierDecomposition,
    CalibrationError,
    ClasswiseCalibrationError,
    MetricStatistics,
    NegativeLogLikelihood,
    ReliabilityDiagram,
)

__all__ = [
    "BrierDecomposition",
    "CalibrationError",
    "ClasswiseCalibrationError",
    "MetricStatistics",
    "NegativeLogLikelihood",
    "ReliabilityDiagram",
]
