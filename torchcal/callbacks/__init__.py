"""Lightning callbacks: :class:`CalibrationMonitor` (calibration metrics and reliability
tables per epoch, in the loggers you already use), :class:`RegressionMonitor` (its sibling for
predictive distributions: PIT, coverage, width, CRPS, NLL) and :class:`TemperatureScaling` (a fitted
temperature that travels in the checkpoint).

Importing this package imports ``lightning``; the rest of torchcal does not.
"""

from torchcal.callbacks.monitor import CalibrationMonitor
from torchcal.callbacks.regression import RegressionMonitor
from torchcal.callbacks.temperature import TemperatureScaling

__all__ = ["CalibrationMonitor", "RegressionMonitor", "TemperatureScaling"]
