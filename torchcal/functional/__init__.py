"""Pure tensor math: scoring rules, continuous scores, regularisers, calibration statistics."""

from torchcal.functional._validation import validation_enabled
from torchcal.functional.calibration import (
    brier_decomposition,
    calibration_error,
    calibration_error_bootstrap,
    negative_log_likelihood,
    reliability_table,
)
from torchcal.functional.continuous import (
    crps_ensemble,
    crps_laplace,
    crps_logistic,
    crps_normal,
    dawid_sebastiani_score,
    energy_score,
    gaussian_nll,
    interval_score,
    quantile_score,
)
from torchcal.functional.invariants import (
    MonotoneMapCheck,
    check_monotone_map,
    ulp_distance,
)
from torchcal.functional.regularizers import (
    confidence_penalty,
    dca,
    focal_loss,
    mdca,
    mmce,
    soft_binned_ece,
)
from torchcal.functional.scoring import (
    brier_score,
    log_score,
    ranked_probability_score,
    spherical_score,
)

__all__ = [
    "brier_decomposition",
    "brier_score",
    "calibration_error",
    "calibration_error_bootstrap",
    "crps_ensemble",
    "crps_laplace",
    "crps_logistic",
    "crps_normal",
    "dawid_sebastiani_score",
    "energy_score",
    "gaussian_nll",
    "interval_score",
    "log_score",
    "negative_log_likelihood",
    "quantile_score",
    "ranked_probability_score",
    "reliability_table",
    "spherical_score",
    "validation_enabled",
    "focal_loss",
    "mmce",
    "soft_binned_ece",
    "confidence_penalty",
    "dca",
    "mdca",
    "MonotoneMapCheck",
    "check_monotone_map",
    "ulp_distance",
]
