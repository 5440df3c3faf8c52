"""Calibration metrics from one streaming, mergeable binned core.

Everything here is derived from **binned sufficient statistics** (:class:`BinnedStats`): per
bin the count (int64) and, in float64, the sums of confidence ``c``, outcome ``y``, ``c**2``
and ``c*y``. Two streams merge by adding their statistics (one all-reduce under DDP), memory
is O(bins) whatever the number of samples, and the numbers are exact up to float64 rounding:

* the reliability table with Wilson (1927) or Clopper-Pearson (1934) intervals per bin;
* equal-width ECE / RMSCE / MCE (``norm="l1" | "l2" | "max"``; Naeini et al. 2015,
  Guo et al. 2017), the debiased L2 ECE of Kumar, Liang & Ma (2019);
* the Brier score with its exact Murphy (1973) decomposition including the two within-bin
  terms of Stephenson, Coelho & Jolliffe (2008);
* from a *fine* histogram (default 4096 sub-bins, opt-in): equal-mass ECE and ECE_sweep
  (Roelofs et al. 2022) and the smooth ECE (Blasiok & Nakkiran 2023);
* a seeded streaming Poisson bootstrap interval for ECE (Hanley & MacGibbon 2006; Chamandy
  et al. 2012).

**Readings** (what is binned against what) are explicit: ``"binary"`` (P(y=1) against y),
``"confidence"`` (max probability against correct-or-not, Guo et al. 2017), ``"top_label"``
(also conditioned on the predicted class, Gupta & Ramdas 2021: one cell per (class, bin)),
``"classwise"`` (one-vs-rest per class, Kull et al. 2019). ``input="logits" | "probs"`` is an
argument, never guessed.

**Binning.** ``c`` goes to bin ``min(floor(c * B), B - 1)`` computed in float64 after
upcasting (bins ``[k/B, (k+1)/B)``, the last closed: 1.0 is in the last bin, 0.0 in the
first).

**Groups.** An optional ``groups`` tensor (a domain id per sample, in ``[0, num_groups)``)
adds a leading group axis to the statistics; results then come as
:class:`~torchcal.GroupedResult` with the pooled value beside one per group.

**Errors.** NaN/Inf scores, probabilities outside [0, 1] with ``input="probs"``, labels out
of range, shape mismatches, ``n_bins < 1`` and empty input raise ``ValueError`` naming the
argument (value checks can be switched off with
:func:`torchcal.functional.validation_enabled`).

**Where is X** (one job per module; docs/design.md section 3):

* :mod:`.readings`: input checks and readings (:func:`prepare_inputs`,
  :func:`confidence_reading`, :class:`PreparedInputs`, :class:`CalibrationSamples`);
* :mod:`.binning`: the bin rule and :class:`BinnedStats` (:func:`accumulate`,
  :func:`accumulate_batches`, :func:`binned_statistics`);
* :mod:`.intervals`: Wilson and Clopper-Pearson intervals;
* :mod:`.tables`: reliability tables from statistics;
* :mod:`.estimators`: equal-width ECE/RMSCE/MCE, debiased L2, Brier decomposition;
* :mod:`.adaptive`: equal-mass ECE and ECE_sweep; :mod:`.smooth`: the smooth ECE;
* :mod:`.bootstrap`: the streaming Poisson bootstrap;
* :mod:`.nll`: the negative log-likelihood;
* :mod:`.wrappers`: the one-shot public functionals and the estimator dispatch.


The public names are imported from :mod:`torchcal.functional`; this package exports none itself
(the names it re-exported before are served for one release with a ``FutureWarning``).
"""

from __future__ import annotations

from torchcal.functional._moved import moved

__all__: list[str] = []

#: the names each module of this package defines that users now import from that module
_FROM_THEIR_MODULE = {
    "adaptive": (
        "ece_sweep_from_samples",
        "ece_sweep_from_stats",
        "equal_mass_calibration_error_from_samples",
        "equal_mass_calibration_error_from_stats",
    ),
    "binning": (
        "SUM_BLOCK",
        "accumulate",
        "accumulate_batches",
        "bin_ids",
        "bin_index",
        "require_nonempty",
        "require_single_slot",
    ),
    "bootstrap": ("bootstrap_statistics", "ece_bootstrap_from_stats"),
    "estimators": ("NORMS", "class_mean", "debiased_calibration_error_from_stats"),
    "intervals": ("INTERVALS", "clopper_pearson_interval", "wilson_interval", "z_of_level"),
    "nll": ("as_float64", "logits_look_like_probs", "nll_items", "nll_sum", "nll_terms"),
    "readings": (
        "CalibrationSamples",
        "INPUTS",
        "PROBS_AS_LOGITS",
        "PreparedInputs",
        "READINGS",
        "confidence_reading",
        "prepare_checked",
        "prepare_inputs",
        "samples_from",
        "warn_probs_as_logits",
    ),
    "smooth": ("smooth_calibration_error_from_samples", "smooth_calibration_error_from_stats"),
    "wrappers": ("ESTIMATORS", "FINE_ESTIMATORS", "estimate", "per_group", "stack_scalars"),
}
#: the public names, now imported from torchcal.functional
_FROM_FUNCTIONAL = {
    "binning": ("BinnedStats", "binned_statistics"),
    "estimators": ("brier_decomposition_from_stats", "calibration_error_from_stats"),
    "nll": ("negative_log_likelihood",),
    "tables": ("reliability_table_from_stats",),
    "truth": ("kl_to_truth", "true_calibration_error"),
    "wrappers": (
        "brier_decomposition",
        "calibration_error",
        "calibration_error_bootstrap",
        "reliability_table",
    ),
}

__getattr__ = moved(
    __name__,
    {
        name: (f"{__name__}.{module}", f"{__name__}.{module}" if home is None else home)
        for table, home in ((_FROM_THEIR_MODULE, None), (_FROM_FUNCTIONAL, "torchcal.functional"))
        for module, names in table.items()
        for name in names
    },
)
