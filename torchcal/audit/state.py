"""What every audit road hands to the report (docs/design.md section 6c.2): the settings,
given once (:class:`AuditSettings`), and the filled state (:class:`AuditState`).

The streaming :class:`~torchcal.audit.Auditor`, a state file and the engines (DuckDB, Spark,
the in-process reader) each fill one :class:`AuditState`; :func:`~torchcal.audit._evaluate
.build_report` reads only these two typed objects, so every road reports through the same
code: the same bin rule (one bin per value on a 0.05/0.1 grid, :func:`grid_stats`), the same
group order (by name), the same notes. Seeds are arbitrary Python integers
(:func:`generator_seed`: no two seeds share a generator).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_bool, check_int, check_number
from torchcal.functional.calibration.binning import BinnedStats, bin_index
from torchcal.functional.histogram_scores import FineHistogram
from torchcal.functional.verdict import check_alpha, check_weights

#: the finest grid whose per-value counts are kept (values k / GRID)
GRID = 100
#: bins when none are given and the confidences sit on no 0.05/0.1 grid
DEFAULT_BINS = 10
#: most bins an audit accepts (40 bytes per bin and group of state; the tables list them)
MAX_BINS = 10_000

_INT64 = 1 << 63


def generator_seed(seed: int) -> int:
    """The torch generator seed of an audit ``seed`` (any Python int): itself in [0, 2^63),
    else 2^63 plus a 63-bit BLAKE2 hash of its decimal text, so distinct seeds never share a
    generator (``2**63`` and ``-1`` are not ``0``) and the seeds used so far keep their samples.

    Example:
        >>> generator_seed(7), generator_seed(2**63) != generator_seed(0) != generator_seed(-1)
        (7, True)
    """
    seed = check_int("seed", seed)
    if 0 <= seed < _INT64:
        return seed
    h = hashlib.blake2b(str(seed).encode(), digest_size=8).digest()
    return _INT64 + int.from_bytes(h, "big") % (_INT64 - 2)  # room for the fit split's + 1


@dataclass(frozen=True)
class AuditSettings:
    """The options of one audit, checked once (each bad one a ``ValueError``/``TypeError``
    naming it): ``threshold`` (``None``: judge the ECE), ``tolerance``, ``alpha``, ``power``,
    ``n_bins`` (``None``: 10, or one bin per value on a 0.05/0.1 grid), ``seed`` (any int),
    ``cost_error``/``cost_escalation`` (both or neither), ``fit_temperature``, ``min_group``
    (groups below it get a warning), ``sample_size`` (rows kept for the page and the fit) and
    ``max_unparsed`` (the share of rejected rows above which the input is refused),
    ``weights`` (how the verdict reads sample weights: ``"importance"``, by their effective
    sample size, or ``"frequency"``, as repetitions; docs/design.md section 6f) and the
    segments (``segments`` columns, ``segment_bins`` quantile buckets of a numeric column,
    ``depth`` columns crossed at most, ``min_segment`` rows; docs/design.md section 6g.1).

    Example:
        >>> AuditSettings(threshold=0.8).rule
        'threshold_gap'
        >>> AuditSettings(tolerance=5)
        Traceback (most recent call last):
        ...
        ValueError: tolerance: expected a fraction in (0, 1), e.g. 0.05 for 5 points, got 5 (did you mean 0.05, i.e. 5 points?)
    """

    threshold: float | None = None
    tolerance: float = 0.05
    alpha: float = 0.05
    power: float = 0.8
    n_bins: int | None = None
    seed: int = 0
    cost_error: float | None = None
    cost_escalation: float | None = None
    fit_temperature: bool = False
    min_group: int = 200
    sample_size: int = 20000
    max_unparsed: float = 0.01
    weights: str = "importance"
    segments: tuple[str, ...] = ()
    segment_bins: int = 4
    depth: int = 2
    min_segment: int = 200

    def __post_init__(self) -> None:
        if self.threshold is not None:
            t = check_number("threshold", self.threshold, strict=True)
            if not t < 1:
                raise ValueError(f"threshold: expected a value in (0, 1), got {self.threshold!r}")
        tol = check_number("tolerance", self.tolerance, strict=True)
        if not tol < 1:
            hint = f" (did you mean {tol / 100:g}, i.e. {tol:g} points?)" if tol < 100 else ""
            raise ValueError(
                f"tolerance: expected a fraction in (0, 1), e.g. 0.05 for 5 points, got "
                f"{self.tolerance!r}{hint}"
            )
        if (self.cost_error is None) != (self.cost_escalation is None):
            missing = "cost_escalation" if self.cost_escalation is None else "cost_error"
            raise ValueError(f"{missing}: expected both cost_error and cost_escalation, or neither")
        if self.cost_error is not None:
            check_number("cost_error", self.cost_error, strict=True)
            check_number("cost_escalation", self.cost_escalation, strict=True)
        if self.n_bins is not None:
            n = check_int("n_bins", self.n_bins, minimum=1)
            if n > MAX_BINS:
                raise ValueError(
                    f"n_bins: expected at most {MAX_BINS:,} bins, got {n:,} (the audit keeps 40 "
                    f"bytes per bin and group: {40 * n / 1e3:.3g} kB per group)"
                )
        check_int("seed", self.seed)
        check_bool("fit_temperature", self.fit_temperature)
        check_int("min_group", self.min_group, minimum=0)
        check_int("sample_size", self.sample_size, minimum=0)
        check_alpha(self.alpha)
        pw = check_number("power", self.power, strict=True)
        if not pw < 1:
            raise ValueError(f"power: expected a value in (0, 1), e.g. 0.8, got {self.power!r}")
        m = check_number("max_unparsed", self.max_unparsed)
        if not m < 1:
            raise ValueError(f"max_unparsed: expected a fraction in [0, 1), got {m}")
        check_weights(self.weights)
        segs = self.segments
        if not isinstance(segs, tuple) or not all(isinstance(c, str) and c for c in segs):
            raise ValueError(f"segments: expected a tuple of column names, got {segs!r}")
        if len(set(segs)) != len(segs):
            raise ValueError(f"segments: a column is named twice in {list(segs)!r}")
        check_int("segment_bins", self.segment_bins, minimum=1)
        check_int("depth", self.depth, minimum=1)
        check_int("min_segment", self.min_segment, minimum=0)

    @property
    def rule(self) -> str:
        """``"threshold_gap"`` with a threshold, else ``"ece"``."""
        return "ece" if self.threshold is None else "threshold_gap"

    @property
    def costs(self) -> tuple[float, float] | None:
        """``(cost_error, cost_escalation)`` as floats, or ``None``."""
        if self.cost_error is None or self.cost_escalation is None:
            return None
        return float(self.cost_error), float(self.cost_escalation)


@dataclass(frozen=True)
class GridCounts:
    """Exact per-value counts on the 0.01 grid, ``(G, GRID + 1)`` per group: ``count`` rows,
    ``pos`` the outcome sum (weighted: sum w y), ``weight`` sum w and ``weight2`` sum w * w
    (``None`` unweighted).
    Filled only while every kept confidence is a multiple of 0.01 (to 1e-9)."""

    count: Tensor
    pos: Tensor
    weight: Tensor | None = None
    weight2: Tensor | None = None

    def step(self) -> float | None:
        """The coarsest of the grids 0.1 and 0.05 every counted value sits on, else None."""
        if int(self.count.sum()) == 0:
            return None
        k = torch.nonzero(self.count.sum(0) > 0).squeeze(1)
        for g in (10, 5):
            if bool((k % g == 0).all()):
                return g / GRID
        return None

    def take(self, index: Tensor) -> GridCounts:
        """The rows ``index`` (a permutation or selection of the groups)."""
        w = None if self.weight is None else self.weight[index]
        w2 = None if self.weight2 is None else self.weight2[index]
        return GridCounts(self.count[index], self.pos[index], w, w2)


def grid_stats(grid: GridCounts, step: float) -> BinnedStats:
    """Per-group statistics with one bin per multiple of ``step`` (``1 / step + 1`` bins:
    value ``k * step`` lands in bin ``k`` by the one bin rule), from the exact counts.

    Example:
        >>> c = torch.zeros(1, GRID + 1, dtype=torch.int64); c[0, [50, 95]] = 3
        >>> grid_stats(GridCounts(c, c.double() / 3), 0.05).count[0, 0, [10, 19]].tolist()
        [3, 3]
    """
    m = round(step * GRID)
    B = GRID // m + 1
    values = torch.arange(GRID + 1, dtype=torch.float64) / GRID
    b = bin_index(values, B)

    def per_bin(x: Tensor) -> Tensor:
        out = torch.zeros(x.shape[0], B, dtype=x.dtype)
        return out.index_add_(1, b, x)[:, None]

    mass = grid.count.to(torch.float64) if grid.weight is None else grid.weight
    return BinnedStats(
        per_bin(grid.count),
        per_bin(mass * values),
        per_bin(grid.pos),
        per_bin(mass * values * values),
        per_bin(grid.pos * values),
        weight=None if grid.weight is None else per_bin(grid.weight),
        weight2=None if grid.weight2 is None else per_bin(grid.weight2),
    )


def empty_sample(reading: str, num_classes: int | None) -> dict[str, Tensor]:
    """A sample of no rows (``row``, ``preds``, ``target``, ``group``)."""
    shape = (0,) if reading != "confidence" else (0, num_classes or 0)
    return {
        "row": torch.zeros(0, dtype=torch.int64),
        "preds": torch.zeros(shape, dtype=torch.float64),
        "target": torch.zeros(0, dtype=torch.int64),
        "group": torch.zeros(0, dtype=torch.int64),
    }


@dataclass(frozen=True)
class AuditState:
    """Everything an audit road fills, per group in name order (docs/design.md 6c.2).

    Attributes:
        stats: binned sums ``(G, 1, B)`` at the configured bins (10 when automatic).
        nll, nll_inf, hits: per group: summed finite NLL, rows whose label got probability
            0, rows (weighted: weight) decided right (float64).
        names: the group names (``("all",)`` ungrouped); ``grouped`` whether a column gave them.
        input, reading, num_classes: ``"probs"``/``"logits"``, ``"binary"``/``"confidence"``.
        n_rows: rows kept; ``saturated``: rows with a probability exactly 0 or 1.
        grid: exact per-value counts while every confidence sits on the 0.01 grid, or None.
        sample: kept rows (``row``, ``preds``, ``target``, ``group`` ids into ``names``).
        engine: which road computed it (``"stream"``, ``"duckdb 1.3.0"``, ...).
        read_log: the reader's log (``ReadLog.to_dict()``: excluded rows, percents read).
        rejected: rows an engine left out, by reason (``preds_nan``: 3).
        weight: the weight column, or None.
        fine: the fine histogram of the confidence (global ECCE, resolution; docs/design.md
            6g), or None (more than 128 groups, or a state written without it).
        segments: the segments' binned sums (``--segments``; docs/design.md 6g.1), or None.
    """

    stats: BinnedStats
    nll: Tensor
    nll_inf: Tensor
    hits: Tensor
    names: tuple[str, ...]
    grouped: bool
    input: str
    reading: str
    num_classes: int | None
    n_rows: int
    saturated: int
    engine: str
    grid: GridCounts | None = None
    sample: dict[str, Tensor] = field(default_factory=dict)
    read_log: dict[str, Any] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    weight: str | None = None
    fine: FineHistogram | None = None
    segments: Any = None

    def __post_init__(self) -> None:
        G = len(self.names)
        if self.stats.count.shape[0] != G:
            raise ValueError(
                f"stats: expected {G} groups (one per name), got {self.stats.count.shape[0]}"
            )
        if len(set(self.names)) != G:
            raise ValueError(f"names: expected unique group names, got {list(self.names)!r}")

    def by_name(self) -> AuditState:
        """The same state with its groups sorted by name (every road reports in this order)."""
        order = sorted(range(len(self.names)), key=lambda i: self.names[i])
        if order == list(range(len(self.names))):
            return self
        idx = torch.tensor(order, dtype=torch.int64)
        new_id = torch.empty_like(idx)
        new_id[idx] = torch.arange(len(order))
        sample = dict(self.sample)
        if sample and sample["group"].numel():
            sample["group"] = new_id[sample["group"]]
        return replace(
            self,
            stats=self.stats.map(lambda t: t[idx]),
            nll=self.nll[idx],
            nll_inf=self.nll_inf[idx],
            hits=self.hits[idx],
            names=tuple(self.names[i] for i in order),
            grid=None if self.grid is None else self.grid.take(idx),
            fine=None if self.fine is None else self.fine.take(idx),
            sample=sample,
        )

    def sample_rows(self) -> dict[str, Tensor]:
        """The kept sample, or a sample of no rows."""
        return dict(self.sample) if self.sample else empty_sample(self.reading, self.num_classes)
