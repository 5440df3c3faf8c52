"""Pure tensor math: scoring rules, continuous scores, regularisers, calibration statistics."""

from torchcal.functional._checks import validation_enabled
from torchcal.functional._moved import moved
from torchcal.functional.calibration.binning import BinnedStats, binned_statistics
from torchcal.functional.calibration.estimators import (
    brier_decomposition_from_stats,
    calibration_error_from_stats,
)
from torchcal.functional.calibration.nll import negative_log_likelihood
from torchcal.functional.calibration.tables import reliability_table_from_stats
from torchcal.functional.calibration.truth import kl_to_truth, true_calibration_error
from torchcal.functional.calibration.wrappers import (
    brier_decomposition,
    calibration_error,
    calibration_error_bootstrap,
    reliability_table,
)
from torchcal.functional.conformal import (
    conformal_risk_control,
    conformal_score_matrix,
    conformal_scores,
    conformal_sets,
    multilabel_fnr_losses,
    set_size_losses,
)
from torchcal.functional.continuous import (
    dawid_sebastiani_score,
    gaussian_nll,
    interval_score,
    quantile_score,
)
from torchcal.functional.coverage import (
    frequency_calibration_error,
    interval_coverage,
    observed_frequencies,
    pit_calibration_error,
    pit_calibration_error_from_counts,
    pit_histogram,
    quantile_calibration_error,
    sharpness,
)
from torchcal.functional.crps import (
    crps_ensemble,
    crps_laplace,
    crps_logistic,
    crps_normal,
    energy_score,
)
from torchcal.functional.decision import (
    cost_threshold_from_stats,
    drift_from_summaries,
    ece_interval_from_stats,
    probs_to_logits,
    threshold_window,
    window_gap_from_stats,
)
from torchcal.functional.invariants import (
    MonotoneMapCheck,
    check_monotone_map,
    ulp_distance,
)
from torchcal.functional.item_regularizers import confidence_penalty, focal_loss
from torchcal.functional.multicalibration import (
    MulticalibrationResult,
    ecce,
    ecce_pvalue,
    multicalibration_error,
    segment_masks,
)
from torchcal.functional.regression import (
    central_interval_factor,
    pit,
    pit_ensemble,
    pit_laplace,
    pit_logistic,
    pit_normal,
    pit_quantiles,
)
from torchcal.functional.regularizers import dca, mdca, mmce, soft_binned_ece
from torchcal.functional.resolution import AurocInterval, auroc_interval
from torchcal.functional.scoring import (
    brier_score,
    log_score,
    ranked_probability_score,
    spherical_score,
)
from torchcal.functional.selective import (
    RiskCoverage,
    augrc,
    aurc,
    coverage_at_risk,
    risk_at_coverage,
    risk_coverage_curve,
    risk_coverage_from_stats,
    selective_binned_bound,
)
from torchcal.functional.sets import (
    CoverageSummary,
    SetCoverageCounts,
    SetCoverageResult,
    set_coverage,
    set_coverage_counts,
    set_coverage_from_counts,
)
from torchcal.functional.shrinkage import (
    between_group_variance,
    empirical_bayes_shrinkage,
)

__all__ = [
    "BinnedStats",
    "binned_statistics",
    "calibration_error_from_stats",
    "reliability_table_from_stats",
    "brier_decomposition_from_stats",
    "between_group_variance",
    "empirical_bayes_shrinkage",
    "cost_threshold_from_stats",
    "drift_from_summaries",
    "ece_interval_from_stats",
    "probs_to_logits",
    "threshold_window",
    "window_gap_from_stats",
    "brier_decomposition",
    "brier_score",
    "calibration_error",
    "calibration_error_bootstrap",
    "true_calibration_error",
    "kl_to_truth",
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
    "pit",
    "pit_normal",
    "pit_laplace",
    "pit_logistic",
    "pit_ensemble",
    "pit_quantiles",
    "pit_histogram",
    "pit_calibration_error",
    "pit_calibration_error_from_counts",
    "interval_coverage",
    "observed_frequencies",
    "frequency_calibration_error",
    "quantile_calibration_error",
    "sharpness",
    "central_interval_factor",
    "conformal_score_matrix",
    "conformal_scores",
    "conformal_sets",
    "conformal_risk_control",
    "multilabel_fnr_losses",
    "set_size_losses",
    "RiskCoverage",
    "risk_coverage_curve",
    "aurc",
    "augrc",
    "risk_at_coverage",
    "coverage_at_risk",
    "risk_coverage_from_stats",
    "selective_binned_bound",
    "CoverageSummary",
    "SetCoverageCounts",
    "SetCoverageResult",
    "set_coverage",
    "set_coverage_counts",
    "set_coverage_from_counts",
    "MulticalibrationResult",
    "ecce",
    "ecce_pvalue",
    "multicalibration_error",
    "segment_masks",
    "AurocInterval",
    "auroc_interval",
]

#: the rewards' one path is :mod:`torchcal.rewards` (deprecated here for one release)
__getattr__ = moved(
    __name__,
    {
        "brier_reward": ("torchcal.functional.rewards", "torchcal.rewards"),
        "correctness_brier_reward": ("torchcal.functional.rewards", "torchcal.rewards"),
        "log_reward": ("torchcal.functional.rewards", "torchcal.rewards"),
        "spherical_reward": ("torchcal.functional.rewards", "torchcal.rewards"),
    },
)
