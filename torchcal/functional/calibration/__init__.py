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

__getattr__ = moved(
    __name__,
    {
        "BinnedStats": ("torchcal.functional.calibration.binning", "torchcal.functional"),
        "CalibrationSamples": (
            "torchcal.functional.calibration.readings",
            "torchcal.functional.calibration.readings",
        ),
        "ESTIMATORS": (
            "torchcal.functional.calibration.wrappers",
            "torchcal.functional.calibration.wrappers",
        ),
        "FINE_ESTIMATORS": (
            "torchcal.functional.calibration.wrappers",
            "torchcal.functional.calibration.wrappers",
        ),
        "INPUTS": (
            "torchcal.functional.calibration.readings",
            "torchcal.functional.calibration.readings",
        ),
        "INTERVALS": (
            "torchcal.functional.calibration.intervals",
            "torchcal.functional.calibration.intervals",
        ),
        "NORMS": (
            "torchcal.functional.calibration.estimators",
            "torchcal.functional.calibration.estimators",
        ),
        "PROBS_AS_LOGITS": (
            "torchcal.functional.calibration.readings",
            "torchcal.functional.calibration.readings",
        ),
        "PreparedInputs": (
            "torchcal.functional.calibration.readings",
            "torchcal.functional.calibration.readings",
        ),
        "READINGS": (
            "torchcal.functional.calibration.readings",
            "torchcal.functional.calibration.readings",
        ),
        "SUM_BLOCK": (
            "torchcal.functional.calibration.binning",
            "torchcal.functional.calibration.binning",
        ),
        "accumulate": (
            "torchcal.functional.calibration.binning",
            "torchcal.functional.calibration.binning",
        ),
        "accumulate_batches": (
            "torchcal.functional.calibration.binning",
            "torchcal.functional.calibration.binning",
        ),
        "as_float64": (
            "torchcal.functional.calibration.nll",
            "torchcal.functional.calibration.nll",
        ),
        "bin_ids": (
            "torchcal.functional.calibration.binning",
            "torchcal.functional.calibration.binning",
        ),
        "bin_index": (
            "torchcal.functional.calibration.binning",
            "torchcal.functional.calibration.binning",
        ),
        "binned_statistics": ("torchcal.functional.calibration.binning", "torchcal.functional"),
        "bootstrap_statistics": (
            "torchcal.functional.calibration.bootstrap",
            "torchcal.functional.calibration.bootstrap",
        ),
        "brier_decomposition": ("torchcal.functional.calibration.wrappers", "torchcal.functional"),
        "brier_decomposition_from_stats": (
            "torchcal.functional.calibration.estimators",
            "torchcal.functional",
        ),
        "calibration_error": ("torchcal.functional.calibration.wrappers", "torchcal.functional"),
        "calibration_error_bootstrap": (
            "torchcal.functional.calibration.wrappers",
            "torchcal.functional",
        ),
        "calibration_error_from_stats": (
            "torchcal.functional.calibration.estimators",
            "torchcal.functional",
        ),
        "class_mean": (
            "torchcal.functional.calibration.estimators",
            "torchcal.functional.calibration.estimators",
        ),
        "clopper_pearson_interval": (
            "torchcal.functional.calibration.intervals",
            "torchcal.functional.calibration.intervals",
        ),
        "confidence_reading": (
            "torchcal.functional.calibration.readings",
            "torchcal.functional.calibration.readings",
        ),
        "debiased_calibration_error_from_stats": (
            "torchcal.functional.calibration.estimators",
            "torchcal.functional.calibration.estimators",
        ),
        "ece_bootstrap_from_stats": (
            "torchcal.functional.calibration.bootstrap",
            "torchcal.functional.calibration.bootstrap",
        ),
        "ece_sweep_from_samples": (
            "torchcal.functional.calibration.adaptive",
            "torchcal.functional.calibration.adaptive",
        ),
        "ece_sweep_from_stats": (
            "torchcal.functional.calibration.adaptive",
            "torchcal.functional.calibration.adaptive",
        ),
        "equal_mass_calibration_error_from_samples": (
            "torchcal.functional.calibration.adaptive",
            "torchcal.functional.calibration.adaptive",
        ),
        "equal_mass_calibration_error_from_stats": (
            "torchcal.functional.calibration.adaptive",
            "torchcal.functional.calibration.adaptive",
        ),
        "estimate": (
            "torchcal.functional.calibration.wrappers",
            "torchcal.functional.calibration.wrappers",
        ),
        "kl_to_truth": ("torchcal.functional.calibration.truth", "torchcal.functional"),
        "logits_look_like_probs": (
            "torchcal.functional.calibration.nll",
            "torchcal.functional.calibration.nll",
        ),
        "negative_log_likelihood": ("torchcal.functional.calibration.nll", "torchcal.functional"),
        "nll_items": ("torchcal.functional.calibration.nll", "torchcal.functional.calibration.nll"),
        "nll_sum": ("torchcal.functional.calibration.nll", "torchcal.functional.calibration.nll"),
        "nll_terms": ("torchcal.functional.calibration.nll", "torchcal.functional.calibration.nll"),
        "per_group": (
            "torchcal.functional.calibration.wrappers",
            "torchcal.functional.calibration.wrappers",
        ),
        "prepare_checked": (
            "torchcal.functional.calibration.readings",
            "torchcal.functional.calibration.readings",
        ),
        "prepare_inputs": (
            "torchcal.functional.calibration.readings",
            "torchcal.functional.calibration.readings",
        ),
        "reliability_table": ("torchcal.functional.calibration.wrappers", "torchcal.functional"),
        "reliability_table_from_stats": (
            "torchcal.functional.calibration.tables",
            "torchcal.functional",
        ),
        "require_nonempty": (
            "torchcal.functional.calibration.binning",
            "torchcal.functional.calibration.binning",
        ),
        "require_single_slot": (
            "torchcal.functional.calibration.binning",
            "torchcal.functional.calibration.binning",
        ),
        "samples_from": (
            "torchcal.functional.calibration.readings",
            "torchcal.functional.calibration.readings",
        ),
        "smooth_calibration_error_from_samples": (
            "torchcal.functional.calibration.smooth",
            "torchcal.functional.calibration.smooth",
        ),
        "smooth_calibration_error_from_stats": (
            "torchcal.functional.calibration.smooth",
            "torchcal.functional.calibration.smooth",
        ),
        "stack_scalars": (
            "torchcal.functional.calibration.wrappers",
            "torchcal.functional.calibration.wrappers",
        ),
        "true_calibration_error": ("torchcal.functional.calibration.truth", "torchcal.functional"),
        "warn_probs_as_logits": (
            "torchcal.functional.calibration.readings",
            "torchcal.functional.calibration.readings",
        ),
        "wilson_interval": (
            "torchcal.functional.calibration.intervals",
            "torchcal.functional.calibration.intervals",
        ),
        "z_of_level": (
            "torchcal.functional.calibration.intervals",
            "torchcal.functional.calibration.intervals",
        ),
    },
)
