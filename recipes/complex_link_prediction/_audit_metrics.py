"""The calibration metrics both audits of :mod:`.audit` report, all from torchcal on float64
logits: ECE and the Brier decomposition of one score column, ECE before/after per relation and
against true labels, and the reliability tables. Internal: the audits import these.
"""

from __future__ import annotations

import torch
from torch import Tensor

import torchcal.functional as TF
from torchcal import ReliabilityTable

#: Relations with fewer evaluation items than this get no per-relation ECE row.
MIN_RELATION_ITEMS = 50


def calibration_metrics(
    logits: Tensor, target: Tensor, reading: str, n_bins: int
) -> dict[str, float]:
    """ECE (L1, binned), debiased ECE (L2) and the Brier decomposition, all from torchcal on
    the logits themselves: ``reading="confidence"`` for ``(N, E)`` tail logits (max softmax
    against argmax == target; ``-inf`` masks allowed), ``"binary"`` for triple logits."""
    kw = {"n_bins": n_bins, "reading": reading, "input": "logits"}
    out = {
        "ece": float(TF.calibration_error(logits, target, **kw)),
        "ece_debiased": float(
            TF.calibration_error(logits, target, estimator="debiased", norm="l2", **kw)
        ),
    }
    dec = TF.brier_decomposition(logits, target, **kw)
    for key in ("brier", "reliability", "resolution", "uncertainty"):
        out[key] = float(dec[key])
    return out


def per_relation(
    logits_before: Tensor,
    logits_after: Tensor,
    target: Tensor,
    rel: Tensor,
    relations: list[str],
    reading: str,
    n_bins: int,
) -> list[dict[str, object]]:
    """ECE before/after per relation (torchcal's ``groups``), for relations with at least
    :data:`MIN_RELATION_ITEMS` items."""
    kw = {
        "n_bins": n_bins,
        "reading": reading,
        "input": "logits",
        "groups": rel,
        "num_groups": len(relations),
    }
    before = TF.calibration_error(logits_before, target, **kw)
    after = TF.calibration_error(logits_after, target, **kw)
    return [
        {
            "relation": relations[r],
            "n": int(before.counts[r]),
            "ece_before": float(before.per_group[r]),
            "ece_after": float(after.per_group[r]),
        }
        for r in torch.nonzero(before.counts >= MIN_RELATION_ITEMS).flatten().tolist()
    ]


def true_label_ece(
    logits_before: Tensor, logits_after: Tensor, true_target: Tensor, reading: str, n_bins: int
) -> dict[str, float]:
    """ECE before/after against the true labels (hidden true triples count as true)."""
    kw = {"n_bins": n_bins, "reading": reading, "input": "logits"}
    return {
        "ece_true_before": float(TF.calibration_error(logits_before, true_target, **kw)),
        "ece_true_after": float(TF.calibration_error(logits_after, true_target, **kw)),
    }


def reliability_tables(
    logits: dict[str, Tensor], target: Tensor, reading: str, n_bins: int
) -> dict[str, ReliabilityTable]:
    """One reliability table per named column of logits, against the same target."""
    return {
        key: TF.reliability_table(x, target, n_bins=n_bins, reading=reading, input="logits")
        for key, x in logits.items()
    }
