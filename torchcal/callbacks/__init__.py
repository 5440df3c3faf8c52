"""Lightning callbacks: :class:`CalibrationMonitor` (calibration metrics and reliability
tables per epoch, in the loggers you already use) and :class:`TemperatureScaling` (a fitted
temperature that travels in the checkpoint).

Importing this package imports ``lightning``; the rest of torchcal does not.
"""

from torchcal.callbacks.monitor import CalibrationMonitor
from torchcal.callbacks.temperature import TemperatureScaling

__all__ = ["CalibrationMonitor", "TemperatureScaling"]
