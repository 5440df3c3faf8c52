"""Work on a report's kept sample (:meth:`AuditReport.ece_at`) and its stored tables (the PNG
diagrams)."""

from __future__ import annotations

import math
from typing import Any

import torch

from torchcal.functional._checks import check_int, check_number
from torchcal.functional.calibration.results import ReliabilityTable
from torchcal.functional.calibration.wrappers import calibration_error


def sample_ece(report: Any, temperature: float, n_bins: int, group: str | None) -> float:
    """L1 equal-width ECE of the sample's logits divided by ``temperature`` (see
    :meth:`~torchcal.audit.AuditReport.ece_at`). Probabilities at ``temperature == 1`` are
    binned as given (``sigmoid(logit(0.3))`` may fall below the edge 0.3); otherwise their
    logits are not clamped (``+-inf`` become confidences 1 and 0, as in the page)."""
    t = check_number("temperature", temperature, strict=True)
    n_bins = check_int("n_bins", n_bins, minimum=1)
    smp = report.sample
    if not smp or smp["target"].numel() == 0:
        raise ValueError("report: no kept sample (a report read from JSON, or sample_size=0)")
    preds, y = smp["preds"], smp["target"]
    if group is not None:
        names = list(smp["names"])
        if group not in names:
            raise ValueError(f"group: expected one of {names}, got {group!r}")
        keep = smp["group"] == names.index(group)
        preds, y = preds[keep], y[keep]
        if y.numel() == 0:
            raise ValueError(f"group: no kept rows in group {group!r}")
    binary = report.settings["reading"] == "binary"
    reading = "binary" if binary else "confidence"
    if report.settings["input"] == "probs" and t == 1.0:  # as given: the report's own bins
        return float(calibration_error(preds, y, n_bins=n_bins, reading=reading, input="probs"))
    z = preds.to(torch.float64)
    if report.settings["input"] == "probs":
        z = torch.log(z) - torch.log1p(-z) if binary else torch.log(z)
    if binary:
        conf = torch.sigmoid(z / t)
        return float(calibration_error(conf, y, n_bins=n_bins, reading="binary", input="probs"))
    # softmax(z / t) shifted by the raw maximum first ((z - max) / t <= 0): logits near 1e308
    # at t < 1 stay finite, as in the page; the first arg-max is the prediction
    top = z.max(1, keepdim=True).values
    conf = 1.0 / torch.exp((z - top) / t).sum(1)
    right = (z.argmax(1) == y).long()
    return float(calibration_error(conf, right, n_bins=n_bins, reading="binary", input="probs"))


def table_of(summary: dict[str, Any], n_bins: int, reading: str) -> ReliabilityTable:
    """A :class:`~torchcal.ReliabilityTable` rebuilt from a summary's ``table`` rows
    (for the diagrams of a report, also one read from JSON)."""
    B = n_bins
    edges = torch.arange(B + 1, dtype=torch.float64) / B
    count = torch.zeros(B, dtype=torch.int64)
    cols = {k: torch.full((B,), math.nan, dtype=torch.float64) for k in ("c", "a", "l", "h")}
    for r in summary["table"]:
        b = int(r["bin"])
        count[b] = int(r["n"])
        for k, src in (("c", "confidence"), ("a", "accuracy"), ("l", "ci_lo"), ("h", "ci_hi")):
            cols[k][b] = math.nan if r[src] is None else float(r[src])
    return ReliabilityTable(
        edges[:-1],
        edges[1:],
        count,
        cols["c"],
        cols["a"],
        cols["l"],
        cols["h"],
        0.95,
        "wilson",
        reading,
    )
