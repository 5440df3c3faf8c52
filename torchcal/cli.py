"""The ``torchcal`` console script: audit a model's probabilities on a file of predictions and
labels, compare two audits, fit a temperature, write example data.

Subcommands (``torchcal SUBCOMMAND --help`` for every option)::

    torchcal audit FILE (--probs COL... | --logits COL...) --label COL [--group COL]
        [--threshold T] [--tolerance 0.05] [--bins 10] [--cost-error X --cost-escalation Y]
        [--fit-temperature] [--reference OLD.json] [--out DIR] [--seed 0] [--chunk-rows N]
        [--no-progress] [--threads 1]
    torchcal audit 'GLOB' --probs COL... --label COL [--group COL] [--weight COL]
        [--engine auto|duckdb|memory] [--table NAME] [--write-state STATE.parquet] [...]
    torchcal audit --state STATE_OR_GLOB... [--threshold T] [...]   (docs/engines.md)
    torchcal compare OLD.json NEW.json
    torchcal fit-temperature FILE (--probs COL... | --logits COL...) --label COL [--group COL]
        [-o temperature.pt]
    torchcal example OUT.csv [--n 3000] [--seed 0]

Files: CSV (streamed), NPZ, ``.pt``, Parquet (with pyarrow); see :mod:`torchcal.audit.io`.
Exit codes: **0** every verdict passed (and no drift against ``--reference``), **1** a verdict
failed or drift was flagged, **2** bad input: one line ``torchcal: error: <message>`` on
stderr naming the column or value, never a traceback.

Example:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> main(["example", f"{d}/judging.csv", "--n", "300"])
    wrote 600 rows (domains: math, open_qa) to ...judging.csv
    0
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from torchcal.audit.engine_input import add_engine_options

__all__ = ["main", "build_parser"]

PROGRESS_BYTES = 50 * 2**20  # files above this size get a progress bar


class InputError(Exception):
    """Bad command-line input: reported in one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, no usage block
        raise InputError(message)


def _add_columns(p: argparse.ArgumentParser, required: bool = True) -> None:
    # required=False (audit): --state needs none of them; audit checks them itself
    p.add_argument(
        "file",
        nargs=None if required else "?",
        help="CSV, NPZ, .pt or Parquet file of predictions and labels",
    )
    src = p.add_mutually_exclusive_group(required=required)
    src.add_argument("--probs", nargs="+", metavar="COL", help="P(y=1), or one column per class")
    src.add_argument("--logits", nargs="+", metavar="COL", help="logit, or one column per class")
    p.add_argument("--label", required=required, metavar="COL", help="0/1 label or class index")
    p.add_argument("--group", metavar="COL", help="domain column: one verdict per group")
    p.add_argument("--chunk-rows", type=int, default=1 << 20, help="rows per chunk (memory)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on large files")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"expected an integer >= 1, got {value}")
    return value


#: API argument -> the flag that sets it (error messages name what the user typed)
_FLAGS = {
    "n_bins": "--bins",
    "threshold": "--threshold",
    "tolerance": "--tolerance",
    "cost_error": "--cost-error",
    "cost_escalation": "--cost-escalation",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``torchcal`` argument parser (errors raise instead of exiting)."""
    parser = _Parser(prog="torchcal", description="Calibration audits from the command line.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    a = sub.add_parser("audit", help="audit probabilities against labels; exit 1 on FAIL")
    _add_columns(a, required=False)
    add_engine_options(a)  # issue 20: --engine, --state, --table, --weight, --write-state
    a.add_argument("--threshold", type=float, help="decision threshold (p >= T automates)")
    a.add_argument("--tolerance", type=float, default=0.05, help="largest allowed |gap|")
    a.add_argument("--bins", type=int, default=10, help="equal-width bins")
    a.add_argument("--cost-error", type=float, help="cost of an automated error")
    a.add_argument("--cost-escalation", type=float, help="cost of sending an item to a person")
    a.add_argument("--fit-temperature", action="store_true", help="fit T on a seeded half")
    a.add_argument("--reference", metavar="OLD.json", help="earlier report.json: flag drift")
    a.add_argument("--out", metavar="DIR", help="write report.json/md/txt/html and PNGs here")
    a.add_argument("--seed", type=int, default=0, help="seed of the sample, bootstrap, split")
    a.add_argument(
        "--threads", type=positive_int, default=1, help="torch threads for the audit (default 1)"
    )
    c = sub.add_parser("compare", help="drift between two report.json files; exit 1 if flagged")
    c.add_argument("old")
    c.add_argument("new")
    f = sub.add_parser("fit-temperature", help="fit a temperature (per group with --group)")
    _add_columns(f)
    f.add_argument("-o", "--output", metavar="PATH", help="save the scaler's state_dict here")
    e = sub.add_parser("example", help="write the two-domain judging example CSV")
    e.add_argument("out")
    e.add_argument("--n", type=int, default=3000, help="rows per domain")
    e.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the console script; returns the exit code (0 pass, 1 fail or drift, 2 bad input)."""
    try:
        args = build_parser().parse_args(argv)
        return _COMMANDS[args.command](args)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except (InputError, ValueError, OSError) as e:
        msg = " ".join(str(e).split()) or type(e).__name__
        name = msg.split(":", 1)[0]
        if name in _FLAGS:  # an API argument's message names the command-line flag
            msg = _FLAGS[name] + msg[len(name) :]
        print(f"torchcal: error: {msg}", file=sys.stderr)
        return 2


def _batches(args: argparse.Namespace) -> Iterator[Any]:
    """Checked batches of the file, with a progress bar on large files (stderr)."""
    from torchcal.audit.io import progress_total, read_predictions

    total, unit = progress_total(args.file)
    batches = read_predictions(
        args.file,
        preds=args.probs or args.logits,
        label=args.label,
        group=args.group,
        input="probs" if args.probs else "logits",
        chunk_rows=args.chunk_rows,
    )
    big = unit == "B" and total > PROGRESS_BYTES
    if args.no_progress or not big:
        yield from batches
        return
    from tqdm import tqdm

    with tqdm(total=total, unit=unit, unit_scale=True, file=sys.stderr, leave=False) as bar:
        for b in batches:
            bar.update(b.done - bar.n)
            yield b


def _check_audit_args(args: argparse.Namespace) -> None:
    if (args.cost_error is None) != (args.cost_escalation is None):
        given = "--cost-error" if args.cost_error is not None else "--cost-escalation"
        other = "--cost-escalation" if given == "--cost-error" else "--cost-error"
        raise InputError(f"{given}: needs {other} too (the threshold weighs one against the other)")
    if args.chunk_rows < 1:
        raise InputError(f"--chunk-rows: expected a positive integer, got {args.chunk_rows}")
    if args.reference is not None and not os.path.isfile(args.reference):
        raise InputError(f"--reference: no such file {args.reference}")


def _audit(args: argparse.Namespace) -> int:
    from torchcal.audit import compare
    from torchcal.audit.engine_input import audit_engine, require_rows_args, wants_engine

    _check_audit_args(args)
    if wants_engine(args):  # issue 20: engines and state files (torchcal/audit/engine_input.py)
        report, caught = audit_engine(args)
    else:
        require_rows_args(args)
        report, caught = _stream_report(args)
    for w in dict.fromkeys(str(w.message) for w in caught):
        if w not in report.warnings:
            print(f"torchcal: warning: {w}", file=sys.stderr)
    print(report.to_text(), end="")
    code = 0 if report.verdict == "pass" else 1
    if args.reference is not None:
        comparison = compare(args.reference, report)
        print(f"\ncompared with {args.reference}:")
        print(comparison.to_text(), end="")
        if comparison.flagged:
            print(f"DRIFT: calibration got worse in {', '.join(comparison.flagged)}")
            code = 1
    if args.out is not None:
        paths = report.save(args.out)
        print(f"wrote {len(paths)} files to {args.out}")
    return code


def _stream_report(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    import torch

    from torchcal.audit import Auditor

    auditor = Auditor(input="probs" if args.probs else "logits", n_bins=args.bins, seed=args.seed)
    names: list[str] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(
        args.threads
    )  # light per-chunk arithmetic: threads cost more than they save
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for b in _batches(args):
                auditor.update(b.preds, b.target, b.groups)
                names = b.group_names
            report = auditor.report(
                group_names=names if args.group else None,
                threshold=args.threshold,
                tolerance=args.tolerance,
                cost_error=args.cost_error,
                cost_escalation=args.cost_escalation,
                fit_temperature=args.fit_temperature,
            )
    finally:
        torch.set_num_threads(threads)
    return report, caught


def _compare(args: argparse.Namespace) -> int:
    from torchcal.audit import compare

    comparison = compare(args.old, args.new)
    print(comparison.to_text(), end="")
    return 1 if comparison.flagged else 0


def _fit_temperature(args: argparse.Namespace) -> int:
    import torch

    from torchcal.functional.decision import probs_to_logits
    from torchcal.scaling import GroupTemperatureScaler, TemperatureScaler

    parts = list(_batches(args))
    preds = torch.cat([b.preds for b in parts])
    target = torch.cat([b.target for b in parts])
    z, clamped = (preds, 0)
    if args.probs:
        z, clamped = probs_to_logits(preds, binary=preds.dim() == 1)
    if clamped:
        print(f"note: {clamped} probabilities of exactly 0 or 1 were clamped to finite logits")
    if args.group:
        groups = torch.cat([b.groups for b in parts])
        names = parts[-1].group_names
        scaler: Any = GroupTemperatureScaler(len(names))
        result = scaler.fit(z, target, groups)
        print(result)
        for name, t in zip(names, scaler.temperatures.tolist(), strict=True):
            print(f"T[{name}] = {t:.6g}")
    else:
        scaler = TemperatureScaler()
        print(scaler.fit(z, target))
    if args.output:
        torch.save(scaler.state_dict(), args.output)
        print(f"saved the state_dict to {args.output}")
    return 0


def _example(args: argparse.Namespace) -> int:
    from torchcal.audit.example import DOMAINS, write_judging_csv

    n = write_judging_csv(args.out, args.n, args.seed)
    print(f"wrote {n} rows (domains: {', '.join(DOMAINS)}) to {args.out}")
    return 0


_COMMANDS = {
    "audit": _audit,
    "compare": _compare,
    "fit-temperature": _fit_temperature,
    "example": _example,
}

if __name__ == "__main__":
    raise SystemExit(main())
