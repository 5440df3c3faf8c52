"""The result types of binned reliability, under their earlier path.

They live in :mod:`torchcal.functional.calibration.results`; the public path is
``torchcal.ReliabilityTable``. This module keeps ``torchcal.report.ReliabilityTable``,
``GroupedResult`` and ``CSV_COLUMNS`` importable for one release.
"""

from torchcal.functional.calibration.results import CSV_COLUMNS, GroupedResult, ReliabilityTable

__all__ = ["CSV_COLUMNS", "GroupedResult", "ReliabilityTable"]
