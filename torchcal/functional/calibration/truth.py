"""Calibration against a known truth: when the true conditional distribution ``p*(y | x)`` is
known (a simulation), calibration can be measured without label noise.

* :func:`true_calibration_error`: the binned gap between the confidence and the true
  probability that the prediction is right, ``p*_{pred}(x)`` (the expected outcome of each
  prediction in place of the outcome itself), binned by the one bin rule
  (:func:`~torchcal.functional.calibration.binning.bin_ids`) and reduced by the same estimator as the
  ECE (:func:`~torchcal.functional.calibration_error_from_stats`);
* :func:`kl_to_truth`: the mean ``KL(p* || p)`` of predicted rows from the true rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_finite,
    check_floating,
    check_int,
    check_nonempty,
    check_option,
    check_probabilities,
    check_same_shape,
    check_tensor,
)
from torchcal.functional._validation import check_probability_rows
from torchcal.functional.calibration.binning import accumulate
from torchcal.functional.calibration.estimators import NORMS, calibration_error_from_stats
from torchcal.functional.calibration.readings import PreparedInputs

__all__ = ["kl_to_truth", "true_calibration_error"]


def true_calibration_error(
    confidence: Tensor, true_prob: Tensor, *, n_bins: int = 15, norm: str = "l1"
) -> Tensor:
    r"""Binned calibration error against the truth, a float64 scalar.

    ``confidence`` ``c_i`` is the stated probability of each prediction (for a classifier the
    top softmax probability) and ``true_prob`` ``q_i`` the true probability that this
    prediction is right (``p*_{argmax p(x_i)}(x_i)``). With equal-width bins ``b`` by the bin
    rule of every other estimator (``min(floor(c * B), B - 1)`` in float64), ``n_b`` items,
    ``C_b`` and ``Q_b`` the bin means of ``c`` and ``q``::

        l1:  sum_b n_b / N |C_b - Q_b|
        l2:  sqrt(sum_b n_b / N (C_b - Q_b)^2)
        max: max_b |C_b - Q_b|   (over non-empty bins)

    It is the ECE with each 0/1 outcome replaced by its expectation, so it has no label
    noise: a model whose confidence equals ``q`` scores exactly 0 at any ``N`` (the ECE of
    such a model is positive, of order ``sqrt(B / N)``). The ECE against labels estimates it
    plus that noise. Only the binning (the grouping of items by confidence) remains.

    Args:
        confidence: stated probabilities in [0, 1], any shape (flattened).
        true_prob: true probabilities in [0, 1] of the same shape (never broadcast).
        n_bins: number of equal-width bins ``B >= 1``.
        norm: ``"l1"``, ``"l2"`` or ``"max"``.

    Example:
        >>> import torch
        >>> c = torch.tensor([0.95, 0.85, 0.35])
        >>> q = torch.tensor([0.75, 0.85, 0.40])
        >>> round(float(true_calibration_error(c, q, n_bins=10)), 4)  # (0.2 + 0 + 0.05) / 3
        0.0833
        >>> round(float(true_calibration_error(c, q, n_bins=2)), 4)  # |1.8 - 1.6| + |0.35 - 0.4|
        0.0833
    """
    check_tensor("confidence", confidence)
    check_tensor("true_prob", true_prob)
    check_same_shape("confidence", confidence, "true_prob", true_prob)
    check_nonempty("confidence", confidence)
    check_probabilities("confidence", confidence)
    check_probabilities("true_prob", true_prob)
    check_option("norm", norm, NORMS)
    n_bins = check_int("n_bins", n_bins, minimum=1)
    prep = PreparedInputs(
        conf=confidence.detach().reshape(-1).to(torch.float64),
        outcome=true_prob.detach().reshape(-1).to(torch.float64),
        lead=None,
        num_groups=1,
        num_slots=1,
        group_counts=torch.tensor([confidence.numel()], dtype=torch.int64),
    )
    stats = accumulate(prep, n_bins).pooled()
    return calibration_error_from_stats(stats, norm=norm, reading="confidence")


def kl_to_truth(log_probs: Tensor, true_probs: Tensor) -> Tensor:
    r"""Mean Kullback-Leibler divergence ``KL(p* || p)`` over rows, a float64 scalar.

    ``mean_i sum_c p*_ic (log p*_ic - log p_ic)`` with ``0 log 0 = 0`` (a class the truth
    gives probability 0 contributes 0, whatever ``p``). It is the expected log score of ``p``
    minus that of ``p*`` (the log score's divergence), so it is >= 0 and 0 only at
    ``p = p*``.

    Args:
        log_probs: predicted log-probabilities ``(N, C)`` (e.g. ``log_softmax(logits)``);
            ``-inf`` is allowed where the truth is 0 (else the divergence is ``inf``).
        true_probs: true probabilities ``(N, C)``, rows summing to 1.

    Example:
        >>> import torch
        >>> p = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
        >>> q = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
        >>> round(float(kl_to_truth(q.log(), p)), 4)  # (0 + 0.9 ln 1.8 + 0.1 ln 0.2) / 2
        0.184
    """
    check_floating("log_probs", log_probs)
    check_floating("true_probs", true_probs)
    check_same_shape("log_probs", log_probs, "true_probs", true_probs)
    check_nonempty("log_probs", log_probs)
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs: expected rows (N, C), got shape {tuple(log_probs.shape)}")
    check_finite("log_probs", log_probs, allow_neg_inf=True)
    check_probability_rows("true_probs", true_probs)
    lp = log_probs.to(torch.float64)
    ps = true_probs.to(torch.float64)
    positive = ps > 0
    terms = torch.where(positive, ps * (torch.log(torch.where(positive, ps, 1.0)) - lp), 0.0)
    return terms.sum(dim=1).mean()
