"""Deprecated path of the result types of binned reliability (removed in the next release).

Import :class:`~torchcal.ReliabilityTable` and :class:`~torchcal.GroupedResult` from
``torchcal``; they are defined in :mod:`torchcal.functional.calibration.results`.
"""

from __future__ import annotations

from torchcal.functional._moved import moved

__all__: list[str] = []

_RESULTS = "torchcal.functional.calibration.results"
__getattr__ = moved(
    __name__,
    {
        "ReliabilityTable": (_RESULTS, "torchcal"),
        "GroupedResult": (_RESULTS, "torchcal"),
        "CSV_COLUMNS": (_RESULTS, _RESULTS),
    },
)
