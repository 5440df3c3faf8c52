"""Post-hoc calibrators fitted on held-out logits.

- :class:`TemperatureScaler` -- one temperature (Guo et al., 2017): keeps every argmax / ranking.
- :class:`GroupTemperatureScaler` -- one temperature per group, shrunk toward the global one.
- :class:`PlattScaler` -- binary ``a * s + b`` (Platt, 1999): moves the offset, keeps the ranking.
- :class:`VectorScaler`, :class:`MatrixScaler` -- per-class affine maps (Guo et al., 2017;
  Kull et al., 2019).
- :class:`IsotonicCalibrator` -- pool-adjacent-violators (Zadrozny & Elkan, 2002).

Every calibrator is an ``nn.Module`` whose ``fit`` returns a :class:`FitResult`, whose state
(including a ``fitted`` flag) round-trips through ``state_dict`` and
``torch.load(weights_only=True)``, and whose ``forward`` raises :class:`NotFittedError` before
it is fitted.
"""

from torchcal.scaling._base import CalibrationWarning, FitResult, NotFittedError
from torchcal.scaling.affine import MatrixScaler, VectorScaler
from torchcal.scaling.group import GroupTemperatureScaler
from torchcal.scaling.isotonic import IsotonicCalibrator
from torchcal.scaling.platt import PlattScaler
from torchcal.scaling.temperature import TemperatureScaler

__all__ = [
    "CalibrationWarning",
    "FitResult",
    "GroupTemperatureScaler",
    "IsotonicCalibrator",
    "MatrixScaler",
    "NotFittedError",
    "PlattScaler",
    "TemperatureScaler",
    "VectorScaler",
]
