"""The binned state in process: from arrays (:func:`state_from_arrays`, the reference every
engine is tested against), from Parquet/CSV files read by pyarrow (:func:`state_from_files`)
and from a torchcal metric's local statistics (:func:`state_from_metric`, one DDP rank's part).

Rows are checked with the rules of :func:`torchcal.engines.sql.state_sql` (the same reasons,
in the same order); the kept rows go through :func:`~torchcal.functional.calibration
.prepare_inputs` and :func:`~torchcal.functional.calibration.binning.accumulate` (weighted:
:func:`~torchcal.functional.calibration.weights.accumulate_weighted`), the NLL through
:func:`~torchcal.functional.calibration.nll.nll_terms`, exactly as the audit does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import torch

from torchcal.engines._names import locate_columns
from torchcal.engines._state_checks import check_cells
from torchcal.engines.rules import Rows, reasons_of
from torchcal.engines.state import (
    REJECT_REASONS,
    UNGROUPED,
    BinnedState,
    StateHeader,
    expand_paths,
    merge_states,
)
from torchcal.engines.text import parse_text
from torchcal.functional._checks import check_int, validation_enabled
from torchcal.functional._validation import probability_sum_tolerance
from torchcal.functional.calibration.binning import BinnedStats, accumulate, bin_ids
from torchcal.functional.calibration.nll import nll_terms
from torchcal.functional.calibration.readings import prepare_inputs
from torchcal.functional.calibration.weights import accumulate_weighted, cell_sums
from torchcal.functional.histogram_scores import (
    FINE_BINS,
    MAX_FINE_GROUPS,
    FineHistogram,
    fine_histogram,
)

__all__ = ["state_from_arrays", "state_from_files", "state_from_metric"]

try:  # the package's version without importing the package (docs/design.md section 1)
    VERSION = version("torchcal")
except PackageNotFoundError:  # pragma: no cover - a checkout never installed
    VERSION = "0+unknown"
PRODUCER = f"torchcal {VERSION} (memory)"


def _as_float(name: str, a: Any, n: int | None) -> np.ndarray:
    x = np.asarray(a, dtype=np.float64)
    if x.ndim != 1 or (n is not None and x.shape[0] != n):
        raise ValueError(f"{name}: expected a 1-D array of {n} values, got shape {x.shape}")
    return x


def state_from_arrays(
    preds: Any,
    target: Any,
    *,
    groups: Any = None,
    weight: Any = None,
    n_bins: int = 10,
    preds_null: Any = None,
    target_null: Any = None,
    unparsed: Any = None,
    columns: dict[str, Any] | None = None,
    group_column: str | None = None,
    weight_column: str | None = None,
) -> BinnedState:
    """The binned state of ``preds`` (P(y = 1) ``(N,)``: binary reading, 0/1 ``target``; or
    class probabilities ``(N, C)``: confidence reading, class-index ``target``), optional
    ``groups`` (names; ``None`` entries are rejected) and ``weight`` (frequency weights).

    Bad rows are counted by reason (:data:`~torchcal.engines.rules.ROW_RULES`) and left out,
    never raised on (``preds_null`` / ``target_null``: masks of NULL entries, for readers of
    nullable columns; ``unparsed``: rows whose text confidence did not parse).

    Example:
        >>> st = state_from_arrays([0.1, 0.95, float("nan"), 1.5], [0, 1, 1, 0], n_bins=10)
        >>> st.stats.count.sum().item(), st.header.rows_rejected["preds_out_of_range"]
        (2, 1)
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    x = np.asarray(preds, dtype=np.float64)
    if x.ndim == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if x.ndim not in (1, 2):
        raise ValueError(f"preds: expected (N,) or (N, C) probabilities, got shape {x.shape}")
    C = 1 if x.ndim == 1 else x.shape[1]
    n = x.shape[0]
    y = _as_float("target", target, n)
    w = None if weight is None else _as_float("weight", weight, n)
    g = None if groups is None else np.asarray(groups, dtype=object)
    if g is not None and g.shape != (n,):
        raise ValueError(f"groups: expected {n} group names, got shape {g.shape}")
    x2 = x.reshape(n, C)
    none = np.zeros(n, bool)
    p_null = none if preds_null is None else np.asarray(preds_null, bool).reshape(n, -1).any(1)
    rows = Rows(
        p=x2,
        y=y,
        p_null=p_null[:, None],
        y_null=none if target_null is None else np.asarray(target_null, bool),
        g=g,
        w=w,
        u=none if unparsed is None else np.asarray(unparsed, bool),
        tol=float(probability_sum_tolerance(torch.float64, C)),
    )
    reason = reasons_of(rows)
    rejected = {r: int((reason == i).sum()) for i, r in enumerate(REJECT_REASONS)}
    keep = reason < 0
    names: list[str]
    if g is None:
        names, ids = [UNGROUPED], None
    else:
        kept_g = np.array([str(v) for v in g[keep]], dtype=object)
        names = sorted(set(kept_g.tolist())) or [UNGROUPED]
        ids = np.searchsorted(np.array(names, dtype=object), kept_g).astype(np.int64)
    check_cells(len(names), 1, n_bins, "groups")  # before allocating
    header = StateHeader(
        n_bins=n_bins,
        reading="binary" if C == 1 else "confidence",
        num_classes=C,
        columns=dict(columns or {}),
        group=None if g is None else (group_column or "group"),
        weight=None if w is None else (weight_column or "weight"),
        rows_seen=n,
        rows_rejected=rejected,
        producer=PRODUCER,
        fine_bins=FINE_BINS if len(names) <= MAX_FINE_GROUPS else None,
        rows_saturated=int(((x2 == 0) | (x2 == 1)).any(1)[keep].sum()),
    )
    return _kept_state(header, names, x[keep], y[keep], None if w is None else w[keep], ids)


def _kept_state(
    header: StateHeader,
    names: list[str],
    x: np.ndarray,
    y: np.ndarray,
    w: np.ndarray | None,
    ids: np.ndarray | None,
) -> BinnedState:
    """The state of the kept rows (``ids``: each one's group index; None: ungrouped)."""
    C, n_bins = header.num_classes, header.n_bins
    p = torch.from_numpy(np.ascontiguousarray(x))
    t = torch.from_numpy(y).long()
    reading = "binary" if C == 1 else "confidence"
    G = len(names)
    gt = None if ids is None else torch.from_numpy(ids)
    B = n_bins
    if p.numel() == 0:
        stats = BinnedStats.zeros(G, 1, B)
        if w is not None:
            s = stats
            w0 = s.conf.clone()
            stats = BinnedStats(s.count, s.conf, s.acc, s.conf2, s.conf_acc, w0, w0.clone())
        z = torch.zeros(G, 1, B, dtype=torch.float64)
        empty = FineHistogram.zeros(G) if G <= MAX_FINE_GROUPS else None
        return BinnedState(header, tuple(names), stats, z, z.clone(), empty, z.clone())
    prep = prepare_inputs(p, t, reading=reading, input="probs", groups=gt, num_groups=G)
    if w is None:
        stats = accumulate(prep, B)
        wk = None
    else:
        wk = torch.from_numpy(np.ascontiguousarray(w))
        stats = accumulate_weighted(prep, B, wk)
    idx = bin_ids(prep.conf, B)
    if gt is not None:
        idx = idx + gt * B
    with validation_enabled(False):
        rows2 = torch.stack([1.0 - p, p], 1) if C == 1 else p
        nll, _ = nll_terms(rows2, t, input="probs")
    if C == 1:
        hit = ((p >= 0.5) == (t == 1)).to(torch.float64)
    else:
        hit = prep.outcome.to(torch.float64)  # the arg-max was the label
    inf = torch.isinf(nll)  # a label with probability 0: counted apart, as the audit does
    if wk is not None:
        inf = inf & (wk > 0)
        nll = torch.where(wk == 0, 0.0, wk * nll)
        hit = wk * hit
    nll = torch.where(inf, 0.0, nll)
    size = G * B
    nll_c = cell_sums(idx, size, nll.to(torch.float64)).view(G, 1, B)
    inf_c = cell_sums(idx, size, inf.to(torch.float64)).view(G, 1, B)
    hit_c = cell_sums(idx, size, hit).view(G, 1, B)
    fine = None  # the fine histogram (global ECCE, resolution), at most MAX_FINE_GROUPS groups
    if G <= MAX_FINE_GROUPS:
        fine = fine_histogram(prep.conf, prep.outcome, groups=gt, num_groups=G, weight=wk)
    return BinnedState(header, tuple(names), stats, nll_c, hit_c, fine, inf_c)


def _column(
    batch: Any, name: str, where: str, kind: str = "number"
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """A column as float64, its NULL mask and (text columns, parsed by
    :func:`~torchcal.engines.text.parse_text`) its unparsed mask."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if name not in batch.schema.names:
        raise ValueError(f"{name}: no such column in {where} (columns: {batch.schema.names})")
    col = batch.column(batch.schema.get_field_index(name))
    null = pc.is_null(col).to_numpy(zero_copy_only=False) if col.null_count else None
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        values, bad = parse_text(col.to_pylist(), kind)
        return values, null, bad
    t = col.type
    if not any(f(t) for f in (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean,
                              pa.types.is_decimal, pa.types.is_null)):  # fmt: skip
        raise ValueError(f"{name}: expected a numeric or text column in {where}, got {t}")
    try:
        col = pc.fill_null(col, 0).cast(pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise ValueError(f"{name}: expected a numeric column in {where} ({e})") from None
    return col.to_numpy(zero_copy_only=False), null, None


def _batches(path: str, names: list[str], chunk_rows: int, group: str | None = None) -> Any:
    """Batches of the ``names`` columns of one file, each found by its exact name, once
    (:func:`~torchcal.engines._names.locate_columns`); a CSV's ``group`` column is read as
    text (``01`` and ``1`` are two groups, as on every road)."""
    ext = os.path.splitext(path)[1].lower()
    if ext in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        locate_columns(path, pf.schema_arrow.names, names)
        yield from pf.iter_batches(batch_size=chunk_rows, columns=names)
    elif ext == ".csv":
        import csv

        import pyarrow as pa
        import pyarrow.csv as pcsv

        with open(path, newline="", encoding="utf-8", errors="surrogateescape") as fh:
            locate_columns(path, next(csv.reader(fh), []), names)
        # as DuckDB reads it: only an empty field is NULL ("nan" is NaN), no line is skipped
        conv = pcsv.ConvertOptions(
            include_columns=names, null_values=[""], strings_can_be_null=True,
            column_types={group: pa.string()} if group else None,
        )  # fmt: skip
        parse = pcsv.ParseOptions(ignore_empty_lines=False)
        yield from pcsv.open_csv(path, parse_options=parse, convert_options=conv)
    else:
        raise ValueError(f"{path}: expected a .parquet/.pq/.csv file")


def _group_names(col: Any, name: str, where: str) -> np.ndarray:
    """A group column's names: strings as written, integers as their decimal digits (the
    rule of every engine, docs/design.md section 6c.2); other types are refused."""
    import pyarrow as pa

    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    t = col.type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)):
        raise ValueError(
            f"{name}: expected group names (strings or integers), got {t} in {where} (a "
            f"group's text must not depend on the engine: docs/design.md section 6c.2)"
        )
    return np.asarray(col.cast(pa.string()).to_pylist(), dtype=object)


def _either(masks: list[np.ndarray | None], n: int) -> np.ndarray | None:
    """The rows where any of ``masks`` is set (None when none is given)."""
    given = [m for m in masks if m is not None]
    if not given:
        return None
    out = np.zeros(n, bool)
    for m in given:
        out |= m
    return out


def state_from_files(
    paths: str | Sequence[str],
    *,
    preds: str | Sequence[str],
    label: str,
    group: str | None = None,
    weight: str | None = None,
    n_bins: int = 10,
    chunk_rows: int = 1 << 20,
) -> BinnedState:
    """The binned state of Parquet/CSV files (paths or globs) read in chunks by pyarrow:
    the in-process twin of :func:`~torchcal.engines.duck.state_from_duckdb` (same checks,
    same state)."""
    files = expand_paths(paths, what="source")
    pcols = [preds] if isinstance(preds, str) else list(preds)
    names = list(dict.fromkeys(c for c in (*pcols, label, group, weight) if c))
    parts = []
    for path in files:
        for batch in _batches(path, names, int(chunk_rows), group):
            got = [_column(batch, name, path, "stated") for name in pcols]
            c = got[0][0] if len(got) == 1 else np.stack([v for v, _, _ in got], 1)
            c_null, c_bad = (_either([m[k] for m in got], batch.num_rows) for k in (1, 2))
            y, y_null, y_bad = _column(batch, label, path, "label")
            if y_bad is not None:  # an unparsed label is invalid
                y_null = y_bad if y_null is None else y_null | y_bad
            w = None if weight is None else _column(batch, weight, path)
            g = None
            if group is not None:
                g = _group_names(batch.column(batch.schema.get_field_index(group)), group, path)
            wv = None
            if w is not None:
                wv = w[0].copy()
                if w[1] is not None:
                    wv[w[1]] = np.nan
            parts.append(
                state_from_arrays(
                    c,
                    y,
                    groups=g,
                    weight=wv,
                    n_bins=n_bins,
                    preds_null=c_null,
                    target_null=y_null,
                    unparsed=c_bad,
                    columns={"preds": pcols, "label": label},
                    group_column=group,
                    weight_column=weight,
                )
            )
    if not parts:
        raise ValueError(f"source: no rows in {files}")
    return merge_states(parts)


def state_from_metric(metric: Any, *, group_names: Sequence[str] | None = None) -> BinnedState:
    """The state of a torchcal binned metric's **local** statistics (its ``metric_state``,
    not synchronised): under DDP each rank writes its own part and ``torchcal audit --state
    'part-*.parquet'`` merges them. The metric has no NLL and no decisions: the report's
    ``nll``/``accuracy`` are then null (confidence reading: accuracy is the outcome sum).

    Example:
        >>> import torch
        >>> from torchcal.metrics import CalibrationError
        >>> m = CalibrationError(n_bins=5, reading="binary", input="probs")
        >>> m.update(torch.tensor([0.2, 0.9]), torch.tensor([0, 1]))
        >>> state_from_metric(m).stats.count.sum().item()
        2
    """
    st = metric.metric_state
    need = ("count", "sum_conf", "sum_acc", "sum_conf2", "sum_conf_acc")
    if not all(k in st for k in need):
        raise ValueError(
            f"metric: expected a torchcal binned metric (states {need}), got {type(metric).__name__}"
        )
    stats = BinnedStats(*(st[k].detach().cpu().clone() for k in need))
    G = stats.count.shape[0]
    names = [str(i) for i in range(G)] if group_names is None else [str(x) for x in group_names]
    if len(names) != G:
        raise ValueError(f"group_names: expected {G} names, got {len(names)}")
    order = sorted(range(G), key=lambda i: names[i])
    stats = stats.map(lambda t: t[order])
    grouped = metric.num_groups is not None
    header = StateHeader(
        n_bins=int(metric.n_bins),
        reading=str(metric.reading),
        input=str(metric.input),
        num_classes=int(metric.num_classes or (1 if metric.reading == "binary" else 0)),
        group="group" if grouped else None,
        rows_seen=int(stats.count.sum()),
        producer=f"torchcal {VERSION} ({type(metric).__name__})",
    )
    gnames = tuple(names[i] for i in order) if grouped else (UNGROUPED,)
    return BinnedState(header, gnames, stats)
