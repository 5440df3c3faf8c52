"""A Hugging Face ``evaluate`` metric module: torchcal's calibration numbers of probabilities
(docs/design.md section 6h). Load it offline by path::

    import evaluate
    from torchcal.integrations.lm_eval import evaluate_module_path

    metric = evaluate.load(evaluate_module_path())
    metric.compute(predictions=[[0.7, 0.3], [0.2, 0.8]], references=[0, 1])

``predictions`` are probabilities: ``P(y=1)`` per item (binary, ``references`` in {0, 1}) or
a row per item summing to 1 (``references`` class indices). The result: ``ece`` (L1 ECE
with ``n_bins`` equal-width bins of the confidence, ``P(y=1)`` binary, the top probability
otherwise; bin ``min(floor(c * n_bins), n_bins - 1)``, stated in ``bin_rule``), ``ece_low``/
``ece_high`` (its seeded Poisson-bootstrap percentile interval at ``level``), ``mce`` (the
largest bin gap), ``brier`` (``(p - y)^2`` binary, ``sum_c (p_c - [c = y])^2`` otherwise) and
``nll``, equal to :mod:`torchcal.metrics` on the same data (``CalibrationError``,
``NegativeLogLikelihood``) to 1e-12. Every formula is :mod:`torchcal.functional`'s.
"""

from __future__ import annotations

from typing import Any

import datasets  # type: ignore[import-untyped]
import evaluate  # type: ignore[import-untyped]
import torch

from torchcal.functional.calibration.nll import negative_log_likelihood
from torchcal.functional.calibration.wrappers import (
    calibration_error,
    calibration_error_bootstrap,
)
from torchcal.functional.decision import probs_to_logits
from torchcal.functional.scoring import brier_score

_DESCRIPTION = "Calibration of probabilities: ECE (stated bins) with an interval, MCE, Brier, NLL."
_KWARGS = """
Args:
    predictions: probabilities, (N,) P(y=1) or (N, C) rows summing to 1.
    references: (N,) labels in {0, 1} (binary) or class indices.
    n_bins: equal-width bins (default 15).
    replicates: Poisson-bootstrap replicates of the ECE interval (default 200).
    level: level of the interval (default 0.95).
    seed: seed of the bootstrap (default 0).
Returns:
    ece, ece_low, ece_high, mce, brier, nll (floats), n_bins (int), bin_rule (str).
"""


class TorchcalCalibration(evaluate.Metric):  # type: ignore[misc]
    """The metric (module docstring)."""

    def _info(self) -> Any:
        label = datasets.Value("int64")
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS,
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Sequence(datasets.Value("float64")),
                        "references": label,
                    }
                ),
                datasets.Features({"predictions": datasets.Value("float64"), "references": label}),
            ],
        )

    def _compute(
        self,
        predictions: Any,
        references: Any,
        n_bins: int = 15,
        replicates: int = 200,
        level: float = 0.95,
        seed: int = 0,
    ) -> dict[str, Any]:
        p = torch.tensor(predictions, dtype=torch.float64)
        y = torch.tensor(references, dtype=torch.int64)
        reading = "binary" if p.dim() == 1 else "confidence"
        kw: dict[str, Any] = {"reading": reading, "input": "probs", "n_bins": n_bins}
        ece, lo, hi = calibration_error_bootstrap(
            p, y, replicates=replicates, level=level, seed=seed, **kw
        )
        mce = calibration_error(p, y, norm="max", **kw)
        z, _ = probs_to_logits(p, binary=reading == "binary")
        target = y.to(torch.float64) if reading == "binary" else y
        return {
            "ece": float(ece),
            "ece_low": float(lo),
            "ece_high": float(hi),
            "mce": float(mce),  # type: ignore[arg-type]
            "brier": float(brier_score(z, target)),
            "nll": float(negative_log_likelihood(p, y, input="probs")),
            "n_bins": n_bins,
            "bin_rule": f"equal-width: bin min(floor(c * {n_bins}), {n_bins - 1}) of the "
            f"confidence c ({'P(y=1)' if reading == 'binary' else 'top probability'})",
        }
