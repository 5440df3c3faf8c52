"""Every road into the audit (docs/design.md sections 6c.2 and 6f): a file through the
streaming reader, a glob or a table through an engine (DuckDB, the in-process reader), state
files; each fills one :class:`~torchcal.audit.state.AuditState` and the same
:func:`~torchcal.audit._evaluate.build_report` reports it under one
:class:`~torchcal.audit.state.AuditSettings`.

* :class:`AuditRequest` is what to read (the command line parses into it; no ``Namespace``
  below ``torchcal/cli.py``); :func:`run_audit` runs it.
* ``memory`` (and ``auto`` without DuckDB) streams each file of the glob through the same
  reader and :class:`~torchcal.audit.Auditor` as a single file: the same values, rejections,
  grid rule, sample and notes.
* ``duckdb`` computes the state, the value grid and a seeded sample in DuckDB
  (:func:`torchcal.engines.duck.audit_duckdb`); text columns (every CSV column) are parsed by
  the readers' rule in SQL. :func:`state_of_engine` turns the result into an ``AuditState``.
* :func:`report_from_state` reports a :class:`~torchcal.engines.BinnedState` (a ``--state``
  file: no rows, so no sample, no value grid, no ``--fit-temperature``).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from torchcal.audit._evaluate import build_report
from torchcal.audit.core import rows_state
from torchcal.audit.report import AuditReport
from torchcal.audit.state import AuditSettings, AuditState, GridCounts
from torchcal.engines.collect import EngineAudit
from torchcal.engines.state import REJECT_REASONS, BinnedState, expand_paths, write_state

#: files above this size get a progress bar on stderr (with tqdm installed)
PROGRESS_BYTES = 50 * 2**20
#: rows per chunk of the segment columns' readers (``--segments``: one reader per column)
SEGMENT_CHUNK = 1 << 17
#: rejection reasons that are the readers' exclusions (listed under ``read``, not warned)
_READ_REASONS = ("preds_unparsed", "preds_null")


@dataclass(frozen=True)
class AuditRequest:
    """What ``torchcal audit`` reads: ``file`` (a path or glob) or ``states`` (state files);
    ``preds`` columns with ``input`` ``"probs"``/``"logits"``, ``label``, ``group``,
    ``weight``; ``engine`` ``None`` (a file through the streaming reader), ``"auto"``,
    ``"duckdb"`` or ``"memory"``; ``table`` of a DuckDB database; ``write_state`` a path;
    ``chunk_rows``; ``progress`` (a bar for large files)."""

    file: str | None = None
    states: tuple[str, ...] = ()
    preds: tuple[str, ...] = ()
    input: str = "probs"
    label: str | None = None
    group: str | None = None
    weight: str | None = None
    engine: str | None = None
    table: str | None = None
    write_state: str | None = None
    chunk_rows: int = 1 << 20
    progress: bool = True


def _engine_of(request: AuditRequest) -> str:
    """``stream``, ``memory`` or ``duckdb``: the road ``request`` takes."""
    from torchcal.engines.duck import available

    if request.table:
        if request.engine == "memory":
            raise ValueError("--table: a DuckDB table is read by DuckDB (not --engine memory)")
        if not available():
            raise ValueError("--table: needs duckdb (pip install 'torchcal[engines]')")
        return "duckdb"
    engine = request.engine
    if engine is None:
        return "stream"
    if engine == "auto":
        return "duckdb" if available() else "memory"
    if engine == "duckdb" and not available():
        raise ValueError("--engine: duckdb is not installed (pip install 'torchcal[engines]')")
    return engine


def _check(request: AuditRequest, settings: AuditSettings) -> None:
    from torchcal.audit.paths import check_outputs  # the Python API's road too (W9)

    check_outputs(request.file, request.states, None, request.write_state, None)
    if request.states:
        given = [
            ("FILE", request.file), ("--probs", request.preds), ("--label", request.label),
            ("--group", request.group), ("--weight", request.weight),
        ]  # fmt: skip
        for flag, v in given:
            if v:
                raise ValueError(f"--state: audits state files; {flag} belongs to a file of rows")
        if settings.n_bins is not None:
            raise ValueError("--bins: a state keeps the bins it was written with (its n_bins)")
        if settings.segments:
            raise ValueError("--segments: a state holds binned sums, not the segment columns")
        if settings.fit_temperature:
            raise ValueError(
                "--fit-temperature: a state holds binned sums, not rows; audit the rows "
                "(FILE with --engine duckdb draws a sample) or use `torchcal fit-temperature`"
            )
        return
    if not request.file:
        raise ValueError("the following arguments are required: file (or --state FILE_OR_GLOB)")
    if not request.preds:
        raise ValueError("one of the arguments --probs --logits is required")
    if not request.label:
        raise ValueError("the following arguments are required: --label")
    if settings.fit_temperature and request.weight:
        raise ValueError("--fit-temperature: the temperature fit reads rows without weights")
    if request.table:
        if not os.path.isfile(request.file):
            raise ValueError(f"{request.file}: no such DuckDB database")
        if os.path.splitext(request.file)[1].lower() in (".csv", ".parquet", ".pq"):
            raise ValueError(
                f"--table: {request.file} is a data file, not a DuckDB database; drop --table"
            )


def run_audit(
    request: AuditRequest, settings: AuditSettings
) -> tuple[AuditReport, list[warnings.WarningMessage]]:
    """The report of ``request`` under ``settings``, and the warnings raised. Rows an engine
    rejected stop the audit once they are more than ``settings.max_unparsed`` of the rows
    seen, as the reader's excluded rows do: a gate must not PASS half a file."""
    _check(request, settings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if request.states:
            from torchcal.engines.state import read_states

            binned = read_states(list(request.states))
            check_rejected(binned, " ".join(request.states), settings.max_unparsed)
            if request.write_state:  # the merged state (_check: it is no input)
                write_state(binned, request.write_state)
            state = state_of_binned(binned)
        else:
            engine = _engine_of(request)
            if engine == "duckdb":
                state = _duckdb_state(request, settings)
            else:
                if request.write_state:
                    raise ValueError("--write-state: states are written by --engine duckdb")
                if request.input != "probs" and request.weight:
                    raise ValueError("--weight: weights are read with --probs")
                files = expand_paths(request.file or "", what="source")
                state = _stream_state(request, settings, files, engine)
        report = build_report(state, settings, rows_state)
    return report, list(caught)


def _duckdb_state(request: AuditRequest, settings: AuditSettings) -> AuditState:
    from torchcal.engines.duck import audit_duckdb

    if request.input != "probs":
        raise ValueError("--logits: the engines read probabilities (--probs COL)")
    preds = request.preds[0] if len(request.preds) == 1 else list(request.preds)
    result = audit_duckdb(
        request.file or "", preds=preds, label=request.label or "", group=request.group,
        weight=request.weight, n_bins=settings.n_bins, table=request.table,
        sample_size=settings.sample_size, seed=settings.seed, segments=segment_options(settings),
    )  # fmt: skip
    check_rejected(result.state, request.file or "", settings.max_unparsed)
    if int(result.state.header.rows_seen) == 0:  # as the in-process roads say it
        raise ValueError(f"{request.file}: no data rows")
    if request.write_state:
        write_state(result.state, request.write_state)
    return state_of_engine(result)


def _batches(
    request: AuditRequest,
    path: str,
    log: Any,
    max_unparsed: float | None,
    group_null: str = "drop",
) -> Iterator[Any]:
    """Checked batches of one file, with a progress bar on large files (stderr); a blank group
    is a row left out (``group_null``), an error or a kept id -1 (see ``read_predictions``)."""
    from torchcal.audit.io import progress_total, read_predictions

    batches = read_predictions(
        path, preds=list(request.preds), label=request.label or "", group=request.group,
        weight=request.weight, input=request.input, chunk_rows=request.chunk_rows, log=log,
        max_unparsed=max_unparsed, group_null=group_null,
    )  # fmt: skip
    total, unit = progress_total(path)
    big = request.progress and unit == "B" and total > PROGRESS_BYTES
    try:
        from tqdm import tqdm  # an extra (torchcal[audit]): no bar without it
    except ImportError:
        big = False
    if not big:
        yield from batches
        return
    with tqdm(total=total, unit=unit, unit_scale=True, file=sys.stderr, leave=False) as bar:
        for b in batches:
            bar.update(b.done - bar.n)
            yield b


def _stream_state(
    request: AuditRequest, settings: AuditSettings, files: list[str], engine: str
) -> AuditState:
    """Every file through the streaming reader into one Auditor (group names global). The
    share of invalid rows is refused over all the files, as an engine counts a glob (the first
    bad row named with its file)."""
    from torchcal.audit._columns import ReadLog
    from torchcal.audit.core import Auditor
    from torchcal.audit.io import check_share, first_bad, invalid_rows, refuse_invalid

    auditor = Auditor(
        input=request.input, n_bins=settings.n_bins, sample_size=settings.sample_size,
        seed=settings.seed,
    )  # fmt: skip
    names: dict[str, int] = {}
    log = ReadLog()
    one = files == [request.file]  # a file, not a glob (its refusal names the file)
    check_share(settings.max_unparsed)
    first = None
    for path in files:
        for b in _batches(request, path, log, settings.max_unparsed if one else None):
            groups = None
            if request.group:
                lut = torch.tensor(
                    [names.setdefault(n, len(names)) for n in b.group_names], dtype=torch.int64
                )
                groups = lut[b.groups] if b.groups.numel() else b.groups
            auditor.update(b.preds, b.target, groups, b.weight)
        if first is None and invalid_rows(log)[0]:
            first = f"{path}: {first_bad(log)}"
    if not one:
        refuse_invalid(log, settings.max_unparsed, request.file or "", first)
        if log.kept == 0:  # an empty file in a glob is no error, as to an engine
            raise ValueError(f"{request.file}: no data rows")
    state = auditor.state(list(names) if request.group else None, read_log=log.to_dict(),
                          weight=request.weight)  # fmt: skip
    if log.rejected:  # the rows the engines' rules left out, reported as the engines do
        state = replace(state, rejected={r: log.rejected.get(r, 0) for r in REJECT_REASONS})
    if settings.segments:  # the rows without a group left out of the segments too, as in SQL
        blank = bool(log.rejected.get("group_null"))
        state = replace(state, segments=_stream_segments(request, settings, files, blank))
    return state if engine == "stream" else replace(state, engine=engine)


def segment_options(settings: AuditSettings) -> dict[str, Any] | None:
    """The engines' segment options of ``settings`` (None without segments)."""
    if not settings.segments:
        return None
    return {"columns": list(settings.segments), "bins": settings.segment_bins,
            "depth": settings.depth, "min_rows": settings.min_segment}  # fmt: skip


def _stream_segments(
    request: AuditRequest, settings: AuditSettings, files: list[str], blank_groups: bool
) -> Any:
    """The segments through the streaming reader (each column read as the group; with
    ``blank_groups`` a reader of ``--group`` too, whose blank rows the segments leave out)."""
    from torchcal.audit._columns import ReadLog
    from torchcal.audit.segments import stream_segments
    from torchcal.audit.state import DEFAULT_BINS

    def batches(path: str, column: str, group_null: str = "error") -> Iterator[Any]:
        # a column per reader, several readers at once: smaller chunks bound the memory
        req = replace(
            request, group=column, progress=False, chunk_rows=min(request.chunk_rows, SEGMENT_CHUNK)
        )
        return _batches(req, path, ReadLog(), settings.max_unparsed, group_null=group_null)

    def mask(path: str) -> Iterator[Any]:
        assert request.group is not None
        return batches(path, request.group, "keep")

    return stream_segments(
        batches, files, settings.segments, mask=mask if blank_groups else None,
        input=request.input,
        n_bins=settings.n_bins or DEFAULT_BINS, bins=settings.segment_bins,
        depth=settings.depth, min_rows=settings.min_segment,
    )  # fmt: skip


def read_rows(
    request: AuditRequest, max_unparsed: float = 0.01
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[str] | None]:
    """Every row of ``request.file`` through the streaming reader (``torchcal
    fit-temperature``): ``preds``, ``target``, group ids and names (``None`` ungrouped)."""
    from torchcal.audit._columns import ReadLog

    parts = list(_batches(request, request.file or "", ReadLog(), max_unparsed))
    preds = torch.cat([b.preds for b in parts])
    target = torch.cat([b.target for b in parts])
    if not request.group:
        return preds, target, None, None
    return preds, target, torch.cat([b.groups for b in parts]), parts[-1].group_names


def check_rejected(state: BinnedState, source: str, max_share: float) -> None:
    """``ValueError`` naming ``source`` when the state's rejected rows exceed ``max_share``
    of the rows seen (reasons and counts in the message)."""
    from torchcal.audit.io import refuse_share

    bad = dict(state.header.rows_rejected)
    refuse_share(source, bad, max(int(state.header.rows_seen), sum(bad.values())), max_share)


def state_of_binned(
    state: BinnedState,
    *,
    grid: GridCounts | None = None,
    sample: dict[str, Any] | None = None,
    read_log: dict[str, Any] | None = None,
    rejected: dict[str, int] | None = None,
) -> AuditState:
    """The :class:`~torchcal.audit.state.AuditState` of a binned state (binary or confidence
    reading, one slot); ``sample`` (``preds``, ``target``, ``group`` names) the kept rows an
    engine sampled, ``rejected`` the reasons to warn about (default: all of the header's)."""
    h = state.header
    if read_log is None and rejected is None:
        read_log, rejected = _read_log(state, {})
    if h.reading not in ("binary", "confidence") or state.stats.count.shape[1] != 1:
        raise ValueError(
            f"state: the audit reads the binary or confidence reading (one slot), got "
            f"reading {h.reading!r}"
        )
    G = len(state.groups)
    nan = torch.full((G,), float("nan"), dtype=torch.float64)
    nll = nan if state.nll is None else state.nll.sum((1, 2))
    inf = torch.zeros(G, dtype=torch.int64)
    if state.nll_inf is not None and state.nll is not None:  # counted apart, as in-process
        inf = state.nll_inf.sum((1, 2)).round().to(torch.int64)
    if state.right is not None:
        hits = state.right.sum((1, 2))
    elif h.reading == "confidence":
        hits = state.stats.acc.sum((1, 2))  # right = the argmax was the label
    else:
        hits = nan.clone()
    smp: dict[str, torch.Tensor] = {}
    if sample and sample["target"]:
        pos = {g: i for i, g in enumerate(state.groups)}
        n = len(sample["target"])
        smp = {
            "row": torch.arange(n),
            "preds": torch.tensor(sample["preds"], dtype=torch.float64),
            "target": torch.tensor(sample["target"], dtype=torch.int64),
            "group": torch.tensor([pos.get(g, 0) for g in sample["group"]], dtype=torch.int64),
        }
    return AuditState(
        stats=state.stats,
        nll=nll,
        nll_inf=inf,
        hits=hits,
        names=tuple(state.groups),
        grouped=h.group is not None,
        input=h.input,
        reading=h.reading,
        num_classes=h.num_classes if h.reading == "confidence" else None,
        n_rows=int(state.stats.count.sum()),
        saturated=h.rows_saturated,
        engine=h.producer,
        grid=grid,
        fine=state.fine,
        sample=smp,
        read_log=dict(read_log or {}),
        rejected=dict(h.rows_rejected if rejected is None else rejected),
        weight=h.weight,
    )


def _read_log(
    st: BinnedState, text: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, int]]:
    """The read log of a state's rows the readers exclude (unparsed and missing confidences,
    as the streaming road lists them; ``text``: what an engine saw in its text columns), and
    the other rejections, to be warned about."""
    rej = dict(st.header.rows_rejected)
    excluded = []
    for col, t in text.items():
        count = t["unparsed"] + t["missing"]
        if count:
            excluded.append({"column": col, "reason": "not a number nor a percent",
                             "count": count, "where": None,
                             "text": "" if t["missing"] else str(t["example"])})  # fmt: skip
    first = (st.header.columns.get("preds") or ["preds"])[0]
    if not text:  # numeric columns (or a state file): the counts of the reasons
        if rej.get("preds_unparsed"):
            excluded.append({"column": first, "reason": "not a number nor a percent",
                             "count": rej["preds_unparsed"], "where": None, "text": ""})  # fmt: skip
        if rej.get("preds_null"):
            excluded.append({"column": first, "reason": "missing value",
                             "count": rej["preds_null"], "where": None, "text": ""})  # fmt: skip
    for r in _READ_REASONS:
        rej[r] = 0
    if not excluded and not text:
        return {}, rej
    n_kept = int(st.stats.count.sum())
    read = {
        "rows": n_kept + sum(int(e["count"]) for e in excluded),
        "kept": n_kept,
        "excluded": excluded,
        "blank_lines": 0,
        "percent": {c: t["percent"] for c, t in text.items() if t["percent"]},
    }
    return read, rej


def state_of_engine(result: EngineAudit) -> AuditState:
    """The :class:`~torchcal.audit.state.AuditState` of an engine's :class:`~torchcal
    .engines.collect.EngineAudit`: its value grid and sample, and the rows the readers would
    have excluded (unparsed and missing confidences) as the read log, as the streaming road
    reports them."""
    st = result.state
    grid = None
    if result.grid is not None:
        names, count, pos, w, w2 = result.grid
        order = [names.index(g) for g in st.groups if g in names]
        if len(order) == len(st.groups):
            idx = torch.tensor(order, dtype=torch.int64)
            grid = GridCounts(
                torch.from_numpy(count)[idx],
                torch.from_numpy(pos)[idx],
                None if w is None else torch.from_numpy(w)[idx],
                None if w2 is None else torch.from_numpy(w2)[idx],
            )
    read, rej = _read_log(st, result.text)
    out = state_of_binned(st, grid=grid, sample=result.sample, read_log=read, rejected=rej)
    return out if result.segments is None else replace(out, segments=result.segments)


def report_from_state(
    state: BinnedState,
    *,
    threshold: float | None = None,
    tolerance: float = 0.05,
    cost_error: float | None = None,
    cost_escalation: float | None = None,
    fit_temperature: bool = False,
    seed: int = 0,
    min_group: int = 200,
    alpha: float = 0.05,
    power: float = 0.8,
    sample: dict[str, Any] | None = None,
    weights: str = "importance",
) -> AuditReport:
    """The audit report of a state; rows the producer rejected are named in the warnings.

    Example:
        >>> from torchcal.engines.memory import state_from_arrays
        >>> st = state_from_arrays([0.1, 0.8, 0.9, float("nan")], [0, 1, 1, 0], n_bins=10)
        >>> r = report_from_state(st)
        >>> r.pooled["n"], r.warnings
        (3, ['1 rows were left out of the state: preds_nan 1'])
    """
    if fit_temperature and not sample:
        raise ValueError(
            "fit_temperature: a state holds binned sums, not rows; fit on the rows "
            "(FILE with --engine duckdb draws a sample) or with `torchcal fit-temperature`"
        )
    settings = AuditSettings(
        threshold=threshold, tolerance=tolerance, alpha=alpha, power=power, seed=seed,
        cost_error=cost_error, cost_escalation=cost_escalation,
        fit_temperature=fit_temperature, min_group=min_group, weights=weights,
    )  # fmt: skip
    st = state_of_binned(state, sample=sample)
    if st.n_rows == 0:
        raise ValueError("state: no rows were kept (every row was rejected, or none was seen)")
    return build_report(st, settings, rows_state)
