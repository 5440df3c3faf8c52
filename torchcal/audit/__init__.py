"""Verify a model's probabilities on labelled data before they automate decisions.

:func:`audit` (one call) or :class:`Auditor` (streamed chunk by chunk) give an
:class:`AuditReport`: per-domain reliability tables with Wilson intervals, ECE with an
interval, debiased ECE, MCE, Brier with its decomposition, NLL, accuracy, the calibration gap
around the decision threshold, and a verdict that is a statistical test (PASS, FAIL or
INCONCLUSIVE at a stated level) with its reason, optionally the threshold
from the costs of errors and a temperature fit evaluated on held-out rows. :func:`compare`
flags groups whose calibration got significantly worse since the last audit. The formulas
live in :mod:`torchcal.functional.decision` and :mod:`torchcal.functional.calibration`; the
JSON schema is documented in :mod:`torchcal.audit.report`.
"""

from torchcal.audit.compare import Comparison, compare
from torchcal.audit.core import Auditor, audit
from torchcal.audit.report import AuditReport
from torchcal.audit.temperatures import fit_temperature_file, load_temperatures

__all__ = [
    "AuditReport",
    "Auditor",
    "Comparison",
    "audit",
    "compare",
    "fit_temperature_file",
    "load_temperatures",
]
