"""Post-hoc calibrators fitted on held-out logits.

- :class:`TemperatureScaler` -- one temperature (Guo et al., 2017): keeps every argmax / ranking.
- :class:`GroupTemperatureScaler` -- one temperature per group, shrunk toward the global one.
- :class:`PlattScaler` -- binary ``a * s + b`` (Platt, 1999): moves the offset, keeps the ranking.
- :class:`VectorScaler`, :class:`MatrixScaler`, :class:`DirichletScaler` -- per-class affine
  maps of logits or log-probabilities, their strength cross-validated with a temperature guard
  (a :class:`CVFit`; Guo et al., 2017; Kull et al., 2019).
- :class:`IsotonicCalibrator` -- pool-adjacent-violators (Zadrozny & Elkan, 2002).
- :class:`StructuredScaler` -- a temperature plus per-class scales, biases and a low-rank
  correction, regularised toward it (structured matrix scaling; Berta et al., 2026).
- :class:`BetaScaler` -- binary beta calibration ``a ln p - b ln(1 - p) + c`` (Kull et al., 2017).
- :class:`VennAbersCalibrator` -- inductive Venn-Abers ``(p0, p1)`` and their merge (Vovk et al.,
  2015), binary and one-vs-rest.

Regression (predictive distributions and intervals):

- :class:`VarianceScaler` -- one factor on the predicted scale, fitted by NLL or CRPS.
- :class:`QuantileRecalibrator` -- isotonic map of the PIT (Kuleshov et al., 2018).
- :class:`SplitConformal`, :class:`ConformalQuantileRegression` -- split conformal and CQR
  intervals with the exact finite-sample quantile, optionally per group (Mondrian).
- :class:`ConformalClassifier` -- conformal prediction sets for classes (LAC, APS, RAPS, top-k),
  marginal, per class or per group, with a stated set temperature.

Every calibrator is an ``nn.Module`` whose ``fit`` returns a result of its kind (a :class:`FitResult`:
:class:`TemperatureFit`, :class:`NLLFit`, :class:`VarianceFit`, ...), whose state
(including a ``fitted`` flag) round-trips through ``state_dict`` and
``torch.load(weights_only=True)``, and whose ``forward`` raises :class:`NotFittedError` before
it is fitted.
"""

from torchcal.functional.conformal import conformal_quantile, conformal_rank
from torchcal.scaling._base import (
    CalibrationWarning,
    FitResult,
    GroupTemperatureFit,
    NLLFit,
    NotFittedError,
    QuantileFit,
    TemperatureFit,
    VarianceFit,
)
from torchcal.scaling.affine import CVFit, MatrixScaler, VectorScaler
from torchcal.scaling.beta import BetaScaler
from torchcal.scaling.conformal import (
    ConformalClassifier,
    ConformalFit,
    ConformalQuantileRegression,
    SplitConformal,
)
from torchcal.scaling.dirichlet import DirichletScaler
from torchcal.scaling.group import GroupTemperatureScaler
from torchcal.scaling.isotonic import IsotonicCalibrator
from torchcal.scaling.platt import PlattScaler
from torchcal.scaling.quantile import QuantileRecalibrator
from torchcal.scaling.segments import SegmentCalibrator, SegmentFit
from torchcal.scaling.select import Calibrated, Candidate, calibrate, register_calibrator
from torchcal.scaling.structured import StructuredScaler
from torchcal.scaling.temperature import TemperatureScaler
from torchcal.scaling.variance import VarianceScaler
from torchcal.scaling.venn_abers import VennAbersCalibrator

__all__ = [
    "CalibrationWarning",
    "FitResult",
    "TemperatureFit",
    "GroupTemperatureFit",
    "NLLFit",
    "VarianceFit",
    "QuantileFit",
    "GroupTemperatureScaler",
    "IsotonicCalibrator",
    "MatrixScaler",
    "DirichletScaler",
    "CVFit",
    "calibrate",
    "Calibrated",
    "Candidate",
    "register_calibrator",
    "NotFittedError",
    "PlattScaler",
    "TemperatureScaler",
    "VectorScaler",
    "VarianceScaler",
    "QuantileRecalibrator",
    "StructuredScaler",
    "SplitConformal",
    "ConformalQuantileRegression",
    "ConformalFit",
    "conformal_quantile",
    "conformal_rank",
    "ConformalClassifier",
    "BetaScaler",
    "VennAbersCalibrator",
    "SegmentCalibrator",
    "SegmentFit",
]
