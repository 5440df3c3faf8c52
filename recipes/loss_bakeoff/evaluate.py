"""Score a trained network on the test split, before and after its temperature: every number
comes from :mod:`torchcal.functional` (float64)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import torchcal.functional as TF
from torchcal.functional.calibration.readings import confidence_reading

__all__ = ["METRICS", "ece_noise_floor", "reliability_curve", "score"]

#: per-(loss, seed) test metrics, before and after T (``true_ce`` and ``kl`` need ``p*``)
METRICS = ("true_ce", "ece", "ece_debiased", "nll", "brier", "accuracy", "kl")


def score(
    logits: Tensor, target: Tensor, truth: Tensor | None, *, n_bins: int = 15
) -> dict[str, float | None]:
    """The :data:`METRICS` of ``logits`` ``(N, C)`` against ``target``; ``true_ce`` (the
    binned gap between confidence and ``p*`` of the predicted class) and ``kl``
    (``KL(p* || p)``) from ``truth`` = ``p*`` ``(N, C)``, ``None`` without it.

    Example:
        >>> z = torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
        >>> s = score(z, torch.tensor([0, 0]), torch.tensor([[0.8, 0.2], [0.5, 0.5]]))
        >>> s["accuracy"], round(s["true_ce"], 4)  # |0.8808 - 0.8| / 2 + |0.7311 - 0.5| / 2
        (0.5, 0.1559)
    """
    z = logits.to(torch.float64)
    conf, correct = confidence_reading(z, target)
    out: dict[str, float | None] = {
        "ece": float(TF.calibration_error(z, target, n_bins=n_bins)),
        "ece_debiased": float(
            TF.calibration_error(z, target, n_bins=n_bins, norm="l2", estimator="debiased")
        ),
        "nll": float(TF.log_score(z, target)),
        "brier": float(TF.brier_score(z, target)),
        "accuracy": float(correct.double().mean()),
        "true_ce": None,
        "kl": None,
    }
    if truth is not None:
        pred = z.argmax(dim=1)
        q = truth.to(torch.float64).gather(1, pred[:, None])[:, 0]
        out["true_ce"] = float(TF.true_calibration_error(conf, q, n_bins=n_bins))
        out["kl"] = float(TF.kl_to_truth(torch.log_softmax(z, dim=1), truth))
    return out


def ece_noise_floor(
    confidence: Tensor, *, n_bins: int = 15, draws: int = 200, seed: int = 0
) -> dict[str, float]:
    """The ECE a perfectly calibrated model with these confidences scores at this test size:
    ``y_i ~ Bernoulli(c_i)`` drawn ``draws`` times (seeded), the binned ECE of each draw (one
    grouped call of :func:`torchcal.functional.calibration_error`); returns the mean and the
    standard deviation over draws.

    Example:
        >>> f = ece_noise_floor(torch.full((400,), 0.9, dtype=torch.float64), draws=50)
        >>> 0.005 < f["mean"] < 0.03  # about E|mean of 400 draws - 0.9|, sqrt(0.09/400) * 0.8
        True
    """
    if not isinstance(draws, int) or isinstance(draws, bool) or draws < 2:
        raise ValueError(f"draws: expected an int >= 2, got {draws!r}")
    c = confidence.reshape(-1).to(torch.float64)
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(draws, c.numel(), generator=g, dtype=torch.float64)
    y = (u < c).long().reshape(-1)
    groups = torch.arange(draws).repeat_interleave(c.numel())
    res = TF.calibration_error(
        c.repeat(draws),
        y,
        n_bins=n_bins,
        reading="binary",
        input="probs",
        groups=groups,
        num_groups=draws,
    )
    per = res.per_group
    return {"mean": float(per.mean()), "std": float(per.std())}


def reliability_curve(logits: Tensor, target: Tensor, *, n_bins: int = 15) -> dict[str, Any]:
    """Per non-empty bin: mean confidence, accuracy and count (for the overlay plot)."""
    table = TF.reliability_table(logits.to(torch.float64), target, n_bins=n_bins)
    keep = table.nonempty
    return {
        "conf": table.conf[keep].tolist(),
        "acc": table.acc[keep].tolist(),
        "count": table.count[keep].tolist(),
    }
