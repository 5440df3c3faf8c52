"""The portable binned state: :class:`BinnedState`, one long-format Arrow table / Parquet file.

One row per non-empty (group, slot, bin) cell (docs/design.md section 6f)::

    group   string   group name ("all" when ungrouped)
    slot    int32    0 for the binary and confidence readings
    bin     int32    min(floor(c * B), B - 1) in float64
    n       int64    rows in the cell
    sum_c   float64  sum of c          (weighted: sum w c)
    sum_y   float64  sum of y (0/1)    (weighted: sum w y)
    sum_c2  float64  sum of c * c      (weighted: sum w (c c))
    sum_cy  float64  sum of c * y      (weighted: sum w (c y))
    sum_w   float64  sum of w          (only in weighted states)
    sum_w2  float64  sum of w * w      (weighted states; absent in those written before it:
                     their importance-weight verdict is refused, docs/design.md 6f)
    nll     float64  sum of -log p(y)  (weighted: sum w nll; null where the producer had none)
    right   float64  rows decided right: binary (c >= 0.5) == y, confidence argmax == y
                     (weighted: their weight; null where the producer had none)
    nll_inf float64  rows whose label got probability 0 (weight > 0), their NLL infinite:
                     where present, ``nll`` sums the other rows' (absent in states written
                     before it: ``nll`` is then +inf in their cells)

The file's schema metadata holds the header under the key ``torchcal.state`` (JSON):
``schema_version``, ``kind``, ``bin_rule``, ``n_bins``, ``reading``, ``input``,
``num_classes``, ``columns`` (preds, label), ``group``, ``weight`` (column names or null),
``rows_seen``, ``rows_rejected`` (reason -> rows), ``producer``, ``rows_saturated`` (kept rows
with a probability exactly 0 or 1; 0 where the producer did not count them), ``fine_bins``
(present when the state carries the fine histogram: extra rows with ``slot = -1``,
``torchcal/engines/fine.py``).

Reading a state applies its rules (``torchcal/engines/_state_checks.py``): every header field
of its type and range, at most ``MAX_CELLS`` cells (checked before allocating), and cells the
rows could have produced (whole counts >= 1, finite sums, ``0 <= sum_y <= n``, ``sum_c`` in its
bin's range, ``rows_seen`` = kept + rejected); a failure is one ``ValueError`` naming the file
and the field or the cell.

:func:`merge_states` adds states of one configuration (any other header field that differs is
an error naming it): counts as integers, every float sum as ``math.fsum`` over the parts, the
correctly rounded sum of the parts' values, so any order of the same parts gives the same bits.
"""

from __future__ import annotations

import glob as _glob
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchcal.engines import _state_checks as _checks
from torchcal.engines.fine import fine_bins_of, fine_from_table, fine_table, merge_fine, split_fine
from torchcal.engines.rules import REJECT_REASONS as _REASONS
from torchcal.functional.calibration.binning import BinnedStats
from torchcal.functional.histogram_scores import FineHistogram

__all__ = ["BinnedState", "StateHeader", "merge_states", "read_state", "read_states", "write_state"]

SCHEMA_VERSION = 1
METADATA_KEY = b"torchcal.state"
BIN_RULE = "min(floor(float64(c) * B), B - 1)"
KIND = "torchcal.binned_state"
#: why a row was left out (torchcal/engines/rules.py: the one table)
REJECT_REASONS = _REASONS
REJECT_REASONS = (
    "preds_unparsed",
    "preds_null",
    "preds_nan",
    "preds_out_of_range",
    "preds_not_normalised",
    "label_invalid",
    "group_null",
    "weight_invalid",
)
#: header fields two states must share to be merged
CONFIG_FIELDS = (
    "schema_version",
    "kind",
    "bin_rule",
    "n_bins",
    "reading",
    "input",
    "num_classes",
    "group",
    "weight",
)
UNGROUPED = "all"
_SUMS = ("sum_c", "sum_y", "sum_c2", "sum_cy")


@dataclass(frozen=True)
class StateHeader:
    """What a state is (see the module docstring for each field)."""

    n_bins: int
    reading: str = "binary"
    input: str = "probs"
    num_classes: int = 1
    columns: dict[str, Any] = field(default_factory=dict)
    group: str | None = None
    weight: str | None = None
    rows_seen: int = 0
    rows_rejected: dict[str, int] = field(default_factory=dict)
    producer: str = "torchcal"
    rows_saturated: int = 0
    schema_version: int = SCHEMA_VERSION
    kind: str = "torchcal.binned_state"  # KIND
    bin_rule: str = BIN_RULE
    fine_bins: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": self.kind,
            "bin_rule": self.bin_rule,
            "n_bins": self.n_bins,
            "reading": self.reading,
            "input": self.input,
            "num_classes": self.num_classes,
            "columns": dict(self.columns),
            "group": self.group,
            "weight": self.weight,
            "rows_seen": self.rows_seen,
            "rows_rejected": {r: int(self.rows_rejected.get(r, 0)) for r in REJECT_REASONS},
            "producer": self.producer,
            "rows_saturated": self.rows_saturated,
            **({"fine_bins": self.fine_bins} if self.fine_bins else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "state") -> StateHeader:
        if not isinstance(d, dict):
            raise ValueError(f"{where}: the state header is a {type(d).__name__}, not an object")
        missing = [k for k in (*CONFIG_FIELDS, "rows_seen", "rows_rejected") if k not in d]
        if missing:
            raise ValueError(f"{where}: the header lacks {', '.join(missing)}")
        fixed = {"schema_version": SCHEMA_VERSION, "kind": KIND, "bin_rule": BIN_RULE}
        _checks.check_header(d, where, fixed)
        _checks.check_reasons(d["rows_rejected"], REJECT_REASONS, where)
        return cls(
            n_bins=int(d["n_bins"]),
            reading=str(d["reading"]),
            input=str(d["input"]),
            num_classes=int(d["num_classes"]),
            columns=dict(d.get("columns") or {}),
            group=d["group"],
            weight=d["weight"],
            rows_seen=int(d["rows_seen"]),
            rows_rejected={str(k): int(v) for k, v in d["rows_rejected"].items()},
            producer=str(d.get("producer", "")),
            rows_saturated=int(d.get("rows_saturated", 0)),
            fine_bins=fine_bins_of(d, where),
            schema_version=int(d["schema_version"]),
            kind=str(d["kind"]),
            bin_rule=str(d["bin_rule"]),
        )

    @property
    def rows_kept(self) -> int:
        return self.rows_seen - sum(self.rows_rejected.values())


@dataclass(frozen=True)
class BinnedState:
    """Binned statistics of named groups with their header; ``stats`` is ``(G, K, B)`` in the
    order of ``groups`` (sorted names), ``nll``/``right`` ``(G, K, B)`` float64 or ``None``.

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> s = binned_statistics(torch.tensor([0.2, 0.9]), torch.tensor([0, 1]),
        ...                       n_bins=4, reading="binary", input="probs")
        >>> st = BinnedState(StateHeader(n_bins=4, rows_seen=2), ("all",), s)
        >>> t = st.to_arrow()
        >>> t.column("bin").to_pylist(), t.column("n").to_pylist()
        ([0, 3], [1, 1])
        >>> BinnedState.from_arrow(t).stats.count.tolist() == s.count.tolist()
        True
    """

    header: StateHeader
    groups: tuple[str, ...]
    stats: BinnedStats
    nll: Tensor | None = None
    right: Tensor | None = None
    fine: FineHistogram | None = None  # the fine histogram (torchcal/engines/fine.py)
    #: rows whose label got probability 0 ``(G, K, B)``, counted apart from ``nll`` (None: a
    #: producer that did not, whose ``nll`` holds +inf there)
    nll_inf: Tensor | None = None

    def nll_total(self) -> Tensor | None:
        """``nll`` with +inf in the cells of ``nll_inf`` (the one meaning of every state)."""
        if self.nll is None or self.nll_inf is None:
            return self.nll
        return torch.where(self.nll_inf > 0, math.inf, self.nll)

    def __post_init__(self) -> None:
        G, K, B = self.stats.count.shape
        if G != len(self.groups) or B != self.header.n_bins:
            raise ValueError(
                f"stats: expected ({len(self.groups)}, K, {self.header.n_bins}), got "
                f"{tuple(self.stats.count.shape)}"
            )
        if (self.stats.weight is None) != (self.header.weight is None):
            raise ValueError("weight: the header's weight column and the weight sums disagree")

    @property
    def weighted(self) -> bool:
        return self.stats.weight is not None

    def to_arrow(self) -> Any:
        """The long-format table (non-empty cells, sorted by group, slot, bin) with the header
        in the schema metadata."""
        import pyarrow as pa

        s = self.stats
        count = s.count.numpy()
        g, k, b = np.nonzero(count)
        cols: dict[str, Any] = {
            "group": pa.array([self.groups[i] for i in g], pa.string()),
            "slot": pa.array(k.astype(np.int32)),
            "bin": pa.array(b.astype(np.int32)),
            "n": pa.array(count[g, k, b].astype(np.int64)),
        }
        for name, t in zip(_SUMS, (s.conf, s.acc, s.conf2, s.conf_acc), strict=True):
            cols[name] = pa.array(t.numpy()[g, k, b], pa.float64())
        if s.weight is not None:
            cols["sum_w"] = pa.array(s.weight.numpy()[g, k, b], pa.float64())
        if s.weight2 is not None:
            cols["sum_w2"] = pa.array(s.weight2.numpy()[g, k, b], pa.float64())
        for name, t in (("nll", self.nll), ("right", self.right)):
            if t is None:
                cols[name] = pa.nulls(len(g), pa.float64())
            else:
                cols[name] = pa.array(t.numpy()[g, k, b], pa.float64())
        if self.nll_inf is not None and self.nll is not None:
            cols["nll_inf"] = pa.array(self.nll_inf.numpy()[g, k, b], pa.float64())
        fine_bins = None if self.fine is None else int(self.fine.count.shape[1])
        header = replace(self.header, fine_bins=fine_bins)
        meta = {METADATA_KEY: json.dumps(header.to_dict()).encode()}
        return fine_table(pa.table(cols), self.fine, self.groups).replace_schema_metadata(meta)

    @classmethod
    def from_arrow(cls, table: Any, where: str = "state") -> BinnedState:
        """Read a table written by :meth:`to_arrow` (``where`` names it in errors)."""
        meta = table.schema.metadata or {}
        if METADATA_KEY not in meta:
            raise ValueError(
                f"{where}: not a torchcal state (no {METADATA_KEY.decode()!r} header in the "
                f"file's metadata)"
            )
        header = StateHeader.from_dict(_checks.parse_header(meta[METADATA_KEY], where), where)
        table, fine_rows = split_fine(table)  # the fine histogram's rows (slot -1)
        need = ["group", "slot", "bin", "n", *_SUMS, "nll", "right"]
        if header.weight is not None:
            need.append("sum_w")
        missing = [c for c in need if c not in table.column_names]
        if missing:
            raise ValueError(f"{where}: the state table lacks the columns {missing}")
        if header.weight is not None and "sum_w2" in table.column_names:
            need.append("sum_w2")  # absent in weighted states written before it
        if "nll_inf" in table.column_names:
            need.append("nll_inf")  # absent in states written before it
        d = {c: table.column(c).to_numpy(zero_copy_only=False) for c in need}
        n_cells, slot, b = _checks.cell_indices(d, where)
        names = sorted(set(d["group"].tolist()))
        if not names and header.group is None:  # an ungrouped state without rows
            names = [UNGROUPED]
        # a grouped state without rows (a DDP rank with an empty shard) has no group, never
        # a phantom ungrouped one (tests/engines/test_ddp_state.py)
        gi = np.searchsorted(np.array(names, dtype=object), d["group"]).astype(np.int64)
        K = 1 if header.reading in ("binary", "confidence") else header.num_classes
        B = header.n_bins
        if len(b) and (b.min() < 0 or b.max() >= B or slot.min() < 0 or slot.max() >= K):
            raise ValueError(f"{where}: bins must lie in [0, {B}) and slots in [0, {K})")
        _checks.check_cells(len(names), K, B, where)  # before any dense allocation
        _checks.check_cell_values(d, n_cells, b, B, header.weight is not None, where)
        flat = (gi * K + slot) * B + b
        if len(np.unique(flat)) != len(flat):
            raise ValueError(f"{where}: a (group, slot, bin) cell appears twice")
        _checks.check_rows(header, int(n_cells.sum()), where)
        shape = (len(names), K, B)

        def dense(v: np.ndarray, dtype: Any) -> Tensor:
            out = np.zeros(int(np.prod(shape)), dtype=dtype)
            out[flat] = v
            return torch.from_numpy(out.reshape(shape))

        sums = [dense(d[c].astype(np.float64), np.float64) for c in _SUMS]
        weight = None if header.weight is None else dense(d["sum_w"], np.float64)
        weight2 = dense(d["sum_w2"], np.float64) if "sum_w2" in d else None
        stats = BinnedStats(dense(n_cells, np.int64), *sums[:4], weight, weight2)
        opt = {}
        for name in ("nll", "right"):
            v = d[name].astype(np.float64)
            opt[name] = None if np.isnan(v).all() and len(v) else dense(v, np.float64)
        fine = fine_from_table(fine_rows, names, header, stats.count.sum((1, 2)), where)
        inf = None
        if "nll_inf" in d and opt["nll"] is not None:
            inf = dense(d["nll_inf"].astype(np.float64), np.float64)
        return cls(header, tuple(names), stats, opt["nll"], opt["right"], fine, inf)

    def pooled_groups(self) -> BinnedState:
        """One group holding every row (the header's ``group`` set to ``None``)."""
        nll = None if self.nll is None else self.nll.sum(0, keepdim=True)
        right = None if self.right is None else self.right.sum(0, keepdim=True)
        stats = self.stats.map(lambda t: t.sum(0, keepdim=True))
        fine = (
            None
            if self.fine is None
            else FineHistogram(*(t.sum(0, keepdim=True) for t in self.fine))
        )
        header = replace(self.header, group=None)
        inf = None if self.nll_inf is None else self.nll_inf.sum(0, keepdim=True)
        return BinnedState(header, (UNGROUPED,), stats, nll, right, fine, inf)


def write_state(state: BinnedState, path: str | os.PathLike[str]) -> None:
    """Write ``state`` as a Parquet file (or ``.arrow``/``.feather``: Arrow IPC)."""
    import pyarrow.parquet as pq

    table = state.to_arrow()
    if os.fspath(path).endswith((".arrow", ".feather")):
        import pyarrow.feather as feather

        feather.write_feather(table, path, compression="uncompressed")
        return
    pq.write_table(table, path)


def read_state(path: str | os.PathLike[str]) -> BinnedState:
    """Read one state file written by :func:`write_state`."""
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise ValueError(f"{p}: no such state file")
    try:
        if p.endswith((".arrow", ".feather")):
            import pyarrow.feather as feather

            table = feather.read_table(p)
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(p)
    except Exception as e:  # a file that is not Arrow/Parquet
        if isinstance(e, ValueError) and str(e).startswith(p):
            raise
        raise ValueError(f"{p}: cannot read a state ({type(e).__name__}: {e})") from None
    return BinnedState.from_arrow(table, where=p)


def expand_paths(patterns: str | Sequence[str], what: str = "--state") -> list[str]:
    """Files matching each glob pattern (a plain path must exist), sorted, each file once: a
    file reached twice (``./a`` and ``a``, a symlink, a hard link) is read once, by what it
    resolves to (docs/design.md section 6c.2)."""
    if isinstance(patterns, str | os.PathLike):
        patterns = [os.fspath(patterns)]
    out: list[str] = []
    for pat in patterns:
        # an existing file is itself, brackets and all (day[1].parquet is no character class)
        magic = _glob.has_magic(pat) and not os.path.isfile(pat)
        hits = sorted(_glob.glob(pat)) if magic else [pat]
        if not hits or not all(os.path.isfile(h) for h in hits):
            raise ValueError(f"{what}: no file matches {pat}")
        out.extend(hits)
    seen: set[object] = set()
    unique = []
    for h in out:
        st = os.stat(h)
        key = (st.st_dev, st.st_ino) if st.st_ino else os.path.realpath(h)
        if key not in seen:
            seen.add(key)
            unique.append(h)
    return unique


def read_states(patterns: str | Sequence[str]) -> BinnedState:
    """Read every state matching ``patterns`` (globs) and merge them (:func:`merge_states`)."""
    paths = expand_paths(patterns)
    return merge_states([read_state(p) for p in paths], names=paths)


def _check_same(states: Sequence[BinnedState], names: Sequence[str]) -> None:
    first = states[0].header.to_dict()
    for st, name in zip(states[1:], names[1:], strict=True):
        h = st.header.to_dict()
        for f in (*CONFIG_FIELDS, "columns"):
            if f == "columns" and not (h[f] and first[f]):  # a metric's state names none
                continue
            if h[f] != first[f] or type(h[f]) is not type(first[f]):
                raise ValueError(
                    f"{name}: {f} is {h[f]!r} but {names[0]} has {first[f]!r}: states of "
                    f"other configurations cannot be merged"
                )


def _fsum_parts(parts: list[np.ndarray]) -> np.ndarray:
    """Cell by cell ``math.fsum`` over the parts: the correctly rounded sum, whatever their
    order."""
    if len(parts) == 1:
        return parts[0].copy()
    stacked = np.stack([p.reshape(-1) for p in parts], 1)
    return np.array([math.fsum(row) for row in stacked], dtype=np.float64).reshape(parts[0].shape)


def merge_states(states: Iterable[BinnedState], names: Sequence[str] | None = None) -> BinnedState:
    """Merge states of one configuration: the union of their groups, counts added as
    integers, float sums by :func:`math.fsum` over all parts at once (so the result does not
    depend on the parts' order; merge all parts in one call). ``names`` label the parts in
    error messages.

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> s = binned_statistics(torch.tensor([0.2, 0.9]), torch.tensor([0, 1]),
        ...                       n_bins=4, reading="binary", input="probs")
        >>> a = BinnedState(StateHeader(n_bins=4, rows_seen=2), ("all",), s)
        >>> merge_states([a, a]).stats.count.sum().item(), merge_states([a, a]).header.rows_seen
        (4, 4)
        >>> b = BinnedState(StateHeader(n_bins=4, reading="confidence", num_classes=3), ("all",), s)
        >>> merge_states([a, b])
        Traceback (most recent call last):
        ...
        ValueError: state 1: reading is 'confidence' but state 0 has 'binary': ...
    """
    states = list(states)
    if not states:
        raise ValueError("states: expected at least one state, got none")
    names = [f"state {i}" for i in range(len(states))] if names is None else list(names)
    _check_same(states, names)
    groups = tuple(sorted(set().union(*(st.groups for st in states))))
    K, B = states[0].stats.count.shape[1:]
    pos = {g: i for i, g in enumerate(groups)}

    def spread(t: Tensor, st: BinnedState) -> np.ndarray:
        out = np.zeros((len(groups), K, B), dtype=t.numpy().dtype)
        out[[pos[g] for g in st.groups]] = t.numpy()
        return out

    def merged(get: Any) -> Tensor | None:
        vals = [get(st) for st in states]
        if any(v is None for v in vals):
            return None
        parts = [spread(v, st) for v, st in zip(vals, states, strict=True)]
        if parts[0].dtype == np.int64:
            return torch.from_numpy(np.sum(parts, axis=0, dtype=np.int64))
        return torch.from_numpy(_fsum_parts(parts))

    stats = BinnedStats(
        merged(lambda s: s.stats.count),  # type: ignore[arg-type]
        merged(lambda s: s.stats.conf),  # type: ignore[arg-type]
        merged(lambda s: s.stats.acc),  # type: ignore[arg-type]
        merged(lambda s: s.stats.conf2),  # type: ignore[arg-type]
        merged(lambda s: s.stats.conf_acc),  # type: ignore[arg-type]
        weight=merged(lambda s: s.stats.weight),
        weight2=merged(lambda s: s.stats.weight2),
    )
    h0 = states[0].header
    rejected = {r: sum(st.header.rows_rejected.get(r, 0) for st in states) for r in REJECT_REASONS}
    producers = sorted({st.header.producer for st in states})
    header = replace(
        h0,
        rows_seen=sum(st.header.rows_seen for st in states),
        rows_rejected=rejected,
        rows_saturated=sum(st.header.rows_saturated for st in states),
        producer=" + ".join(producers),
        columns=h0.columns if all(st.header.columns == h0.columns for st in states) else {},
    )
    inf = merged(lambda s: s.nll_inf)  # None unless every part counted them apart
    nll = merged(lambda s: s.nll if inf is not None else s.nll_total())
    right = merged(lambda s: s.right)
    fine = merge_fine([st.fine for st in states], [st.groups for st in states], groups)
    header = replace(header, fine_bins=None if fine is None else int(fine.count.shape[1]))
    return BinnedState(header, groups, stats, nll, right, fine, inf)
