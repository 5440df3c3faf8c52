"""The audit of a binned state (docs/design.md section 6f): ``torchcal audit --state
'part-*.parquet'``, ``torchcal audit 'logs/*.parquet' --engine duckdb``.

:func:`report_from_state` turns a :class:`~torchcal.engines.BinnedState` into the
:class:`~torchcal.audit.AuditReport` the streaming :class:`~torchcal.audit.Auditor` gives for
the same rows: the state is loaded into an :class:`StateAuditor` (an ``Auditor`` whose
statistics, NLL and decision sums come from the state) and reported by the same code.
What a state cannot carry: the rows themselves, so ``--fit-temperature`` and the HTML sliders
need a sample (the DuckDB path draws one with ``USING SAMPLE reservoir``; a ``--state`` file
has none and refuses ``--fit-temperature``). Costs, thresholds and ``--reference`` drift read
only the statistics and work on every path.
"""

from __future__ import annotations

import argparse
import os
import warnings
from typing import Any

import torch

from torchcal.audit.core import Auditor
from torchcal.audit.report import AuditReport
from torchcal.engines.state import BinnedState, write_state

__all__ = ["StateAuditor", "audit_engine", "report_from_state", "state_of_args"]

#: the bin count of the engine path when ``--bins`` is not given (the grid detection of the
#: streaming reader needs the rows)
DEFAULT_ENGINE_BINS = 10


class StateAuditor(Auditor):
    """An :class:`~torchcal.audit.Auditor` holding a state's sums (see :meth:`from_state`)."""

    _kept: dict[str, torch.Tensor] | None = None

    @classmethod
    def from_state(
        cls,
        state: BinnedState,
        *,
        seed: int = 0,
        sample: dict[str, Any] | None = None,
    ) -> StateAuditor:
        """Load ``state`` (binary or confidence reading, one slot); ``sample`` (``preds``,
        ``target``, ``group`` names) is the kept-rows sample, if any."""
        h = state.header
        if h.reading not in ("binary", "confidence") or state.stats.count.shape[1] != 1:
            raise ValueError(
                f"state: the audit reads the binary or confidence reading (one slot), got "
                f"reading {h.reading!r}"
            )
        n = len(sample["target"]) if sample else 0
        a = cls(input=h.input, n_bins=h.n_bins, sample_size=n, seed=seed)
        a.reading = h.reading
        if h.reading == "confidence":
            a.num_classes = h.num_classes
        a.stats = state.stats
        G = len(state.groups)
        nan = torch.full((G,), float("nan"), dtype=torch.float64)
        a.nll = nan if state.nll is None else state.nll.sum((1, 2))
        a.nll_inf = torch.zeros(G, dtype=torch.int64)
        a.grid = None  # per-value counts need the rows
        a.hits = nan.clone() if state.right is None else state.right.sum((1, 2))
        if state.right is None and h.reading == "confidence":
            a.hits = state.stats.acc.sum((1, 2))  # right = the argmax was the label
        a.grouped = h.group is not None
        a.n_rows = int(state.stats.count.sum())
        if sample:
            pos = {g: i for i, g in enumerate(state.groups)}
            a._kept = {
                "row": torch.arange(n),
                "preds": torch.tensor(sample["preds"], dtype=torch.float64),
                "target": torch.tensor(sample["target"], dtype=torch.int64),
                "group": torch.tensor([pos.get(g, 0) for g in sample["group"]]),
            }
        return a

    def sample(self) -> dict[str, torch.Tensor]:
        return super().sample() if self._kept is None else dict(self._kept)


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
    a = StateAuditor.from_state(state, seed=seed, sample=sample)
    if a.n_rows == 0:
        raise ValueError("state: no rows were kept (every row was rejected, or none was seen)")
    report = a.report(
        group_names=list(state.groups) if a.grouped else None,
        threshold=threshold,
        tolerance=tolerance,
        cost_error=cost_error,
        cost_escalation=cost_escalation,
        fit_temperature=fit_temperature,
        min_group=min_group,
        alpha=alpha,
        power=power,
    )
    bad = {k: v for k, v in state.header.rows_rejected.items() if v}
    if bad:
        parts = ", ".join(f"{k} {v}" for k, v in bad.items())
        report.warnings.append(f"{sum(bad.values())} rows were left out of the state: {parts}")
    report.settings["engine"] = state.header.producer
    if state.header.weight is not None:
        report.settings["weight"] = state.header.weight
        report.settings["weight_total"] = float(state.stats.mass().sum())
    return report


# --- command-line glue (torchcal/cli.py calls these) ---


def _engine_of(args: argparse.Namespace) -> str:
    from torchcal.engines.duck import available

    engine = args.engine or "auto"
    if engine == "auto":
        return "duckdb" if available() else "memory"
    if engine == "duckdb" and not available():
        raise ValueError("--engine: duckdb is not installed (pip install 'torchcal[engines]')")
    return engine


def _check(args: argparse.Namespace) -> None:
    if args.state:
        given = [
            f for f in ("file", "probs", "logits", "label", "group", "weight") if getattr(args, f)
        ]
        if given:
            flag = given[0] if given[0] == "file" else "--" + given[0]
            raise ValueError(f"--state: audits state files; {flag} belongs to a file of rows")
        if args.bins is not None:
            raise ValueError("--bins: a state keeps the bins it was written with (its n_bins)")
        if args.fit_temperature:
            raise ValueError(
                "--fit-temperature: a state holds binned sums, not rows; audit the rows "
                "(FILE with --engine duckdb draws a sample) or use `torchcal fit-temperature`"
            )
        return
    if not args.file:
        raise ValueError("the following arguments are required: file (or --state FILE_OR_GLOB)")
    if not (args.probs or args.logits):
        raise ValueError("one of the arguments --probs --logits is required")
    if not args.label:
        raise ValueError("the following arguments are required: --label")
    if args.logits:
        raise ValueError("--logits: the engines read probabilities (--probs COL)")
    if args.fit_temperature and args.weight:
        raise ValueError("--fit-temperature: the temperature fit reads rows without weights")
    if args.table and not os.path.isfile(args.file):
        raise ValueError(f"{args.file}: no such DuckDB database")


def state_of_args(args: argparse.Namespace) -> tuple[BinnedState, dict[str, Any] | None]:
    """The state (and, on the DuckDB path with ``--fit-temperature``, a sample) the command
    line asks for."""
    from torchcal.engines import duck, memory
    from torchcal.engines.state import read_states

    _check(args)
    if args.state:
        return read_states(args.state), None
    preds = args.probs[0] if len(args.probs) == 1 else list(args.probs)  # binary | confidence
    kw = {"preds": preds, "label": args.label, "group": args.group, "weight": args.weight}
    n_bins = DEFAULT_ENGINE_BINS if args.bins is None else args.bins
    engine = "duckdb" if args.table else _engine_of(args)
    sample = None
    if engine == "duckdb":
        state = duck.state_from_duckdb(args.file, n_bins=n_bins, table=args.table, **kw)
        if args.fit_temperature:
            sample = duck.sample_rows(
                args.file,
                preds=preds,
                label=args.label,
                group=args.group,
                seed=args.seed,
                table=args.table,
            )
    else:
        state = memory.state_from_files(args.file, n_bins=n_bins, chunk_rows=args.chunk_rows, **kw)
    return state, sample


def check_rejected(state: BinnedState, source: str, max_share: float) -> None:
    """``ValueError`` naming ``source`` when the state's rejected rows exceed ``max_share``
    of the rows seen (reasons and counts in the message)."""
    bad = {k: v for k, v in state.header.rows_rejected.items() if v}
    rejected = sum(bad.values())
    seen = max(int(state.header.rows_seen), rejected)
    if rejected and rejected > max_share * seen:
        parts = ", ".join(f"{k} {v}" for k, v in bad.items())
        raise ValueError(
            f"{source}: {rejected} of {seen} rows are invalid ({parts}), more than "
            f"--max-unparsed {max_share:g} of them"
        )


def audit_engine(args: argparse.Namespace) -> tuple[AuditReport, list[Any]]:
    """The report of ``torchcal audit`` on the engine/state path, and the warnings raised.

    Rows the engine rejected (NaN, out of range, an invalid label, ...) stop the audit once
    they are more than ``--max-unparsed`` of the rows seen, as the row reader's excluded rows
    do: a gate must not PASS half a file."""
    state, sample = state_of_args(args)
    check_rejected(state, args.state or args.file, args.max_unparsed)
    if args.write_state:
        write_state(state, args.write_state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = report_from_state(
            state,
            threshold=args.threshold,
            tolerance=args.tolerance,
            cost_error=args.cost_error,
            cost_escalation=args.cost_escalation,
            fit_temperature=args.fit_temperature,
            seed=args.seed,
            alpha=args.alpha,
            power=args.power,
            sample=sample,
        )
    return report, list(caught)
