"""The option checks of :class:`~torchcal.callbacks.CalibrationMonitor`: where its results can
go (:data:`SINKS`) and the constructor's checks of the reading options, in the order the
constructor runs them."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

from torchcal.functional._checks import check_int, check_open_unit, check_option
from torchcal.functional.calibration.intervals import INTERVALS
from torchcal.functional.calibration.readings import INPUTS, READINGS

#: Where the monitor's results can go (``sinks=``): ``"loggers"`` (tables, and with
#: ``"figures"`` the diagrams, to the attached loggers), ``"figures"`` (draw the reliability
#: diagram each epoch for the image loggers, and the calibration-over-epochs figure at fit
#: end), ``"csv"`` (append the tables to the CSV files), ``"prog_bar"`` (``ece`` in the
#: progress bar).
SINKS = ("loggers", "figures", "csv", "prog_bar")
Sink = Literal["loggers", "figures", "csv", "prog_bar"]


def check_sinks(sinks: Any) -> frozenset[str]:
    """``sinks``: one of :data:`SINKS` or a collection of them."""
    items = (sinks,) if isinstance(sinks, str) else sinks
    if not isinstance(items, Collection):
        raise ValueError(f"sinks: expected a collection of {SINKS!r}, got {type(sinks).__name__}")
    for s in items:
        check_option("sinks", s, SINKS)
    return frozenset(items)


def check_reading_options(
    *,
    n_bins: Any,
    reading: Any,
    input: Any,
    interval: Any,
    level: Any,
    num_classes: Any,
    num_groups: Any,
    name: Any,
) -> None:
    """``n_bins``, ``reading``, ``input``, ``interval``, ``level``, ``num_classes`` (required
    by ``top_label``/``classwise``), ``num_groups`` and ``name`` (no leading or trailing
    ``/``), checked in this order."""
    check_int("n_bins", n_bins, minimum=1)
    check_option("reading", reading, READINGS)
    check_option("input", input, INPUTS)
    check_option("interval", interval, INTERVALS)
    check_open_unit("level", level)
    if reading in ("top_label", "classwise") and num_classes is None:
        raise ValueError(
            f"num_classes: expected the number of classes for reading={reading!r}, got None"
        )
    if num_classes is not None:
        check_int("num_classes", num_classes, minimum=2)
    if num_groups is not None:
        check_int("num_groups", num_groups, minimum=1)
    if not isinstance(name, str) or name.strip("/") != name:
        raise ValueError(f"name: expected a string without leading/trailing '/', got {name!r}")
