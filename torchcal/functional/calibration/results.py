"""Result types for binned reliability: :class:`ReliabilityTable` (text, markdown, CSV,
dict) and :class:`GroupedResult`. The public path is ``torchcal.ReliabilityTable``.

They live in ``functional`` because ``functional`` builds them (``docs/design.md`` section 1:
``functional`` imports nothing else of ours); the ECE of a table is the one formula of
:mod:`torchcal.functional.calibration.estimators`, and figures are drawn the other way round,
by :func:`torchcal.plotting.reliability_diagram` from a table. The tables are built by
:func:`torchcal.functional.reliability_table` and :class:`torchcal.metrics.ReliabilityDiagram`
from binned sufficient statistics; every bin carries its count and an interval for its
accuracy, so a bin of seven right out of seven reads as "accuracy at least about 0.65 (95 %
Wilson)", not as a certified 1.0.
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from torchcal.functional.calibration.binning import BinnedStats
from torchcal.functional.calibration.estimators import calibration_error_from_stats

__all__ = [
    "GroupedResult",
    "ReliabilityTable",
]

#: Columns of :meth:`ReliabilityTable.rows` and :meth:`ReliabilityTable.to_csv` (long format).
CSV_COLUMNS = ("bin", "lo", "hi", "count", "conf", "acc", "gap", "ci_low", "ci_high")

T = TypeVar("T")


@dataclass(eq=False)
class GroupedResult(Generic[T]):
    """A pooled result beside one result per group (domain), so a pooled average cannot hide
    a badly calibrated group.

    Attributes:
        pooled: the result over all samples (a scalar ``Tensor``, a :class:`ReliabilityTable`
            or a ``dict`` of scalars, depending on the metric).
        per_group: one entry per group id ``0 .. G-1``: a ``Tensor`` of shape ``(G,)`` for
            scalar metrics (``NaN`` for a group without samples), a ``list`` of
            :class:`ReliabilityTable` for tables, a ``dict`` of ``(G,)`` tensors for
            decompositions.
        counts: ``int64`` tensor ``(G,)``, samples seen per group (for ``classwise``: samples,
            not sample x class pairs).

    Example:
        >>> import torch
        >>> r = GroupedResult(torch.tensor(0.1), torch.tensor([0.05, 0.3]), torch.tensor([90, 10]))
        >>> r.worst_group()
        1
    """

    pooled: T
    per_group: Any
    counts: Tensor

    def worst_group(self) -> int:
        """Id of the group with the largest scalar value (ignores empty groups)."""
        if not isinstance(self.per_group, Tensor):
            raise TypeError("per_group: worst_group() needs a tensor of per-group scalars")
        vals = torch.where(
            self.counts > 0,
            self.per_group.double(),
            torch.full_like(self.per_group, -math.inf, dtype=torch.float64),
        )
        return int(torch.argmax(vals))


def _fmt(x: float, digits: int = 4) -> str:
    return f"{x:.{digits}f}"


_INTERVAL_NAMES = {"wilson": "Wilson", "clopper_pearson": "Clopper-Pearson"}


@dataclass(eq=False)
class ReliabilityTable:
    """Equal-width reliability table with counts and per-bin accuracy intervals.

    Bins are ``[lo, hi)`` (the last one closed); a confidence ``c`` goes to bin
    ``min(floor(c * B), B - 1)`` computed in float64. ``conf``/``acc`` are the mean confidence
    and the mean outcome (accuracy) of the bin, ``gap = conf - acc`` (positive: overconfident),
    ``ci_low``/``ci_high`` an interval for the bin's accuracy at ``level`` (Wilson 1927, or
    Clopper & Pearson 1934). Empty bins have ``count == 0`` and ``NaN`` in the float columns;
    :meth:`to_text` lists them as omitted, :meth:`rows`/:meth:`to_csv` leave them out (the CSV
    is NaN-free).

    Attributes:
        lo, hi: bin edges, float64 ``(B,)``.
        count: samples per bin, int64 ``(B,)``.
        conf, acc: mean confidence and accuracy per bin, float64 ``(B,)``.
        ci_low, ci_high: interval for ``acc`` per bin, float64 ``(B,)``.
        level: confidence level of the interval, e.g. 0.95.
        interval: ``"wilson"`` or ``"clopper_pearson"``.
        reading: what was binned (``"binary"``, ``"confidence"``, ``"top_label"`` or
            ``"classwise"``; the latter two pooled over classes, see ``per_class``).
        per_class: for ``top_label``/``classwise``, one table per class (else ``None``).

    Example:
        >>> import torch
        >>> from torchcal.functional import reliability_table
        >>> conf = torch.tensor([0.95] * 7 + [0.3, 0.35], dtype=torch.float64)
        >>> hit = torch.tensor([1] * 7 + [0, 1])
        >>> t = reliability_table(conf, hit, n_bins=10, reading="binary", input="probs")
        >>> print(t.to_text())  # doctest: +NORMALIZE_WHITESPACE
        reliability table: reading=binary, n=9, 10 bins, 95% wilson intervals
        bin     lo     hi  count    conf     acc      gap  ci
          3  0.300  0.400      2  0.3250  0.5000  -0.1750  [0.0945, 0.9055]
          9  0.900  1.000      7  0.9500  1.0000  -0.0500  [0.6457, 1.0000]
        omitted (empty): bins 0, 1, 2, 4, 5, 6, 7, 8
        ECE (l1, equal-width) = 0.0778
        gap = conf - acc (> 0: overconfident); ci = 95% Wilson interval for acc
    """

    lo: Tensor
    hi: Tensor
    count: Tensor
    conf: Tensor
    acc: Tensor
    ci_low: Tensor
    ci_high: Tensor
    level: float
    interval: str
    reading: str
    per_class: tuple[ReliabilityTable, ...] | None = field(default=None, compare=False)

    # ----------------------------------------------------------------- derived values
    @property
    def n_bins(self) -> int:
        """Number of bins ``B``."""
        return int(self.count.numel())

    @property
    def n(self) -> int:
        """Total number of samples in the table."""
        return int(self.count.sum())

    @property
    def gap(self) -> Tensor:
        """``conf - acc`` per bin (positive: overconfident; ``NaN`` for empty bins)."""
        return self.conf - self.acc

    @property
    def nonempty(self) -> Tensor:
        """Boolean mask of bins with at least one sample."""
        return self.count > 0

    @property
    def ece(self) -> float:
        """Equal-width L1 ECE of the reading, by the one formula of
        :func:`~torchcal.functional.calibration_error_from_stats` applied to the
        table's bins (sums ``count_b * conf_b``, ``count_b * acc_b``): ``sum_b count_b / n *
        |gap_b|``; with ``per_class`` tables, over the (class, bin) cells for ``top_label``
        (Gupta & Ramdas 2021) and the mean of the per-class errors for ``classwise`` (Kull et
        al. 2019). ``NaN`` for an empty table."""
        tables = (
            self.per_class
            if self.per_class is not None and self.reading in ("top_label", "classwise")
            else (self,)
        )
        count = torch.stack([t.count for t in tables])
        seen = count > 0
        conf = torch.where(seen, torch.stack([t.conf for t in tables]) * count, 0.0)
        acc = torch.where(seen, torch.stack([t.acc for t in tables]) * count, 0.0)
        unused = torch.full_like(conf, math.nan)  # second moments: not needed by the L1 ECE
        stats = BinnedStats(count, conf, acc, unused, unused)
        return float(calibration_error_from_stats(stats, norm="l1", reading=self.reading))

    @property
    def interval_label(self) -> str:
        """The per-bin interval in words, e.g. ``"95% Wilson"``."""
        return f"{self._level()} {_INTERVAL_NAMES.get(self.interval, self.interval)}"

    # ----------------------------------------------------------------- exports
    def rows(self) -> list[dict[str, float | int]]:
        """Non-empty bins as dicts with the keys of :data:`CSV_COLUMNS` (NaN-free).

        Example:
            >>> import torch
            >>> from torchcal.functional import reliability_table
            >>> t = reliability_table(torch.tensor([0.2, 0.9]), torch.tensor([0, 1]),
            ...                       n_bins=2, reading="binary", input="probs")
            >>> [(r["bin"], r["count"]) for r in t.rows()]
            [(0, 1), (1, 1)]
        """
        out = []
        cols = [
            self.lo,
            self.hi,
            self.count,
            self.conf,
            self.acc,
            self.gap,
            self.ci_low,
            self.ci_high,
        ]
        lists = [c.reshape(-1).tolist() for c in cols]
        for b in range(self.n_bins):
            if lists[2][b] == 0:
                continue
            out.append(
                {
                    "bin": b,
                    "lo": lists[0][b],
                    "hi": lists[1][b],
                    "count": int(lists[2][b]),
                    "conf": lists[3][b],
                    "acc": lists[4][b],
                    "gap": lists[5][b],
                    "ci_low": lists[6][b],
                    "ci_high": lists[7][b],
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python summary: metadata plus ``rows`` (non-empty bins) and ``omitted`` bins.

        Example:
            >>> import torch
            >>> from torchcal.functional import reliability_table
            >>> d = reliability_table(torch.tensor([0.2, 0.9]), torch.tensor([0, 1]),
            ...                       n_bins=4, reading="binary", input="probs").to_dict()
            >>> d["n"], d["omitted"], sorted(d["rows"][0])[:3]
            (2, [1, 2], ['acc', 'bin', 'ci_high'])
        """
        return {
            "reading": self.reading,
            "n_bins": self.n_bins,
            "n": self.n,
            "interval": self.interval,
            "level": self.level,
            "ece": self.ece,
            "rows": self.rows(),
            "omitted": self.omitted_bins(),
        }

    def to_csv(self, header: bool = True) -> str:
        """Long-format CSV (columns :data:`CSV_COLUMNS`), one line per non-empty bin.

        Example:
            >>> import torch
            >>> from torchcal.functional import reliability_table
            >>> t = reliability_table(torch.tensor([0.2, 0.9]), torch.tensor([0, 1]),
            ...                       n_bins=2, reading="binary", input="probs")
            >>> print(t.to_csv().splitlines()[0])
            bin,lo,hi,count,conf,acc,gap,ci_low,ci_high
        """
        buf = io.StringIO()
        if header:
            buf.write(",".join(CSV_COLUMNS) + "\n")
        for cells in self.csv_rows():
            buf.write(",".join(cells) + "\n")
        return buf.getvalue()

    def csv_rows(self) -> list[list[str]]:
        """The CSV cells of the non-empty bins (columns :data:`CSV_COLUMNS`; floats as
        ``repr``, so they read back exactly)."""
        return [
            [repr(r[c]) if isinstance(r[c], float) else str(r[c]) for c in CSV_COLUMNS]
            for r in self.rows()
        ]

    def omitted_bins(self) -> list[int]:
        """The empty bins (left out of :meth:`rows` and the exports)."""
        return [b for b, c in enumerate(self.count.reshape(-1).tolist()) if c == 0]

    def _level(self) -> str:
        return f"{round(self.level * 100, 6):g}%"

    def _header(self) -> str:
        pairs = " (sample x class pairs)" if self.reading == "classwise" else ""
        pooled = (
            "; rows pool the classes bin by bin (per-class tables in .per_class)"
            if self.per_class is not None
            else ""
        )
        return (
            f"reliability table: reading={self.reading}, n={self.n}{pairs}, "
            f"{self.n_bins} bins, {self._level()} {self.interval} intervals{pooled}"
        )

    def _ece_line(self) -> str:
        how = ""
        if self.per_class is not None:
            how = {
                "top_label": "; top-label: over (class, bin) cells",
                "classwise": "; classwise: mean over classes",
            }.get(self.reading, "")
        return f"ECE (l1, equal-width{how}) = {_fmt(self.ece)}"

    def _legend(self) -> str:
        return f"gap = conf - acc (> 0: overconfident); ci = {self.interval_label} interval for acc"

    def _cells(self) -> list[list[str]]:
        cells = []
        for r in self.rows():
            cells.append(
                [
                    str(r["bin"]),
                    _fmt(r["lo"], 3),
                    _fmt(r["hi"], 3),
                    str(r["count"]),
                    _fmt(r["conf"]),
                    _fmt(r["acc"]),
                    _fmt(r["gap"]),
                    f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]",
                ]
            )
        return cells

    def _omitted(self) -> str:
        om = [str(b) for b in self.omitted_bins()]
        return "omitted (empty): " + (("bins " + ", ".join(om)) if om else "none")

    def to_text(self) -> str:
        """Aligned ``bin lo hi count conf acc gap ci`` columns, then the omitted (empty) bins,
        the ECE and a legend (see the class example)."""
        head = ["bin", "lo", "hi", "count", "conf", "acc", "gap", "ci"]
        cells = self._cells()
        widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head)]
        lines = [self._header()]
        fmt_row = [h.rjust(w) if i < 7 else h for i, (h, w) in enumerate(zip(head, widths))]
        lines.append("  ".join(fmt_row))
        for c in cells:
            lines.append(
                "  ".join(v.rjust(w) if i < 7 else v for i, (v, w) in enumerate(zip(c, widths)))
            )
        lines += [self._omitted(), self._ece_line(), self._legend()]
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """A GitHub-flavoured markdown table of the non-empty bins plus the omitted ones.

        Example:
            >>> import torch
            >>> from torchcal.functional import reliability_table
            >>> t = reliability_table(torch.tensor([0.2, 0.9]), torch.tensor([0, 1]),
            ...                       n_bins=2, reading="binary", input="probs")
            >>> print(t.to_markdown().splitlines()[0])
            | bin | lo | hi | count | conf | acc | gap | ci |
        """
        head = ["bin", "lo", "hi", "count", "conf", "acc", "gap", "ci"]
        lines = [
            "| " + " | ".join(head) + " |",
            "|" + "|".join("---:" if h != "ci" else ":---" for h in head) + "|",
        ]
        for c in self._cells():
            lines.append("| " + " | ".join(c) + " |")
        lines.append("")
        lines.append(f"{self._header()}; {self._ece_line()}; {self._legend()}; {self._omitted()}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def plot(self, ax: Any = None) -> Any:
        """Deprecated: ``torchcal.plotting.reliability_diagram(table, ax=ax)`` draws the
        diagram (figures are drawn from tables, not by them). Removed in the release after
        next."""
        warnings.warn(
            "ReliabilityTable.plot() is deprecated: use "
            "torchcal.plotting.reliability_diagram(table, ax=ax)",
            DeprecationWarning,
            stacklevel=2,
        )
        # the one import against the layers (docs/design.md section 1), until the alias goes
        from torchcal.plotting import reliability_diagram

        return reliability_diagram(self, ax=ax)
