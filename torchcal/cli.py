"""The ``torchcal`` console script: audit a model's probabilities on a file of predictions and
labels, compare two audits, fit a temperature, write example data.

Subcommands (``torchcal SUBCOMMAND --help`` for every option and its default)::

    torchcal audit FILE (--probs COL... | --logits COL...) --label COL [--group COL]
        [--threshold T] [--tolerance 0.05] [--alpha 0.05] [--power 0.8] [--bins N]
        [--inconclusive-exit 3] [--cost-error X --cost-escalation Y] [--fit-temperature]
        [--reference OLD.json] [--out DIR] [--diagrams 20] [--seed 0] ...
    torchcal audit 'GLOB' --probs COL... --label COL [--group COL] [--weight COL]
        [--engine auto|duckdb|memory] [--table NAME] [--write-state STATE.parquet] [...]
    torchcal audit --state STATE_OR_GLOB... [--threshold T] [...]   (docs/engines.md)
    torchcal compare OLD.json NEW.json
    torchcal fit-temperature FILE (--probs COL... | --logits COL...) --label COL [--group COL]
        [-o temperature.pt]
    torchcal example OUT.csv [--kind judging|stated|segments] [--n 3000] [--seed 0]

The verdict is a statistical test (docs/audit.md): **0** PASS (every row's interval inside
the tolerance, and no drift against ``--reference``), **1** FAIL (a row's interval outside
it, or drift flagged), **3** INCONCLUSIVE (the data cannot tell; ``--inconclusive-exit``
chooses 0, 1 or 3), **2** bad input: one line ``torchcal: error: <message>`` on stderr naming
the file, column or flag, never a traceback.

The parser runs before anything heavy is imported: ``--help``, ``--version`` and argument
errors are answered without importing torch (it is imported when a command runs).

Example:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> main(["example", f"{d}/judging.csv", "--n", "300"])
    wrote 600 rows (domains: math, open_qa) to ...judging.csv
    0
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from torchcal._segment_options import add_segment_arguments, segment_settings

#: the most bins the audit accepts (torchcal.audit.state.MAX_BINS; repeated so that argument
#: errors need no torch import; a test keeps the two equal)
MAX_BINS = 10_000
#: exit codes of ``torchcal audit``/``compare``
EXIT_CODES = {"pass": 0, "fail": 1, "error": 2, "inconclusive": 3}

_EPILOG = (
    "exit codes: 0 PASS, 1 FAIL (or drift against --reference), 2 bad input (one line on "
    "stderr naming the file, column or flag), 3 INCONCLUSIVE (change with --inconclusive-exit)"
)


class InputError(Exception):
    """Bad command-line input: reported in one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, no usage block
        raise InputError(message)


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in every option's help, the description as written."""


def _fraction(flag: str, lo_open: float = 0.0, hi_open: float = 1.0, hint: str = "") -> Any:
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected a number") from None
        if not (math.isfinite(v) and lo_open < v < hi_open):
            extra = ""
            if hint and math.isfinite(v) and 1 <= v < 100:
                extra = f" (did you mean {v / 100:g}? {hint})"
            raise argparse.ArgumentTypeError(
                f"expected a value in ({lo_open:g}, {hi_open:g}), got {text}{extra}"
            )
        return v

    parse.__name__ = flag
    return parse


def _bins(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected an integer") from None
    if not 1 <= v <= MAX_BINS:
        per = 40 * v
        mem = f"{per / 1e9:.3g} GB" if per >= 1e9 else f"{per / 1e6:.3g} MB"
        raise argparse.ArgumentTypeError(
            f"expected an integer in [1, {MAX_BINS}], got {v} (the audit keeps 40 bytes per bin "
            f"and group: {mem} per group)"
        )
    return v


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _diagrams(text: str) -> int | None:
    if text == "all":
        return None
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 0 or 'all', got {text!r}"
        ) from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 or 'all', got {v}")
    return v


def _add_columns(p: argparse.ArgumentParser, required: bool = True) -> None:
    # required=False (audit): --state needs none of them; _audit checks them itself
    p.add_argument(
        "file",
        nargs=None if required else "?",
        help="CSV, NPZ, .pt or Parquet file of predictions and labels (audit: also a glob, "
        "or a DuckDB database with --table)",
    )
    src = p.add_mutually_exclusive_group(required=required)
    src.add_argument(
        "--probs",
        nargs="+",
        metavar="COL",
        help="P(y=1) (or a stated confidence: 0.85 or 85%%), or one column per class",
    )
    src.add_argument("--logits", nargs="+", metavar="COL", help="logit, or one column per class")
    p.add_argument("--label", required=required, metavar="COL", help="0/1 label or class index")
    p.add_argument("--group", metavar="COL", help="domain column: one verdict per group")
    p.add_argument(
        "--chunk-rows", type=positive_int, default=1 << 20, help="rows per chunk (memory)"
    )
    p.add_argument(
        "--max-unparsed",
        type=_fraction("--max-unparsed", -1e-300, 1.0),
        default=0.01,
        metavar="FRACTION",
        help="share of rows whose confidence may fail to parse (excluded and counted) before "
        "the file is rejected",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on large files")


ENGINE_CHOICES = ("auto", "duckdb", "memory")


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    """``--engine``, ``--state``, ``--table``, ``--weight`` and ``--write-state`` (issue 20;
    torchcal/audit/engine_input.py does the work)."""
    p.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        help="compute the binned state in an engine: duckdb (Parquet/CSV paths and globs, "
        "a DuckDB table), memory (pyarrow in process), auto (duckdb when installed)",
    )
    p.add_argument(
        "--state", nargs="+", metavar="FILE_OR_GLOB", help="audit merged state files instead"
    )
    p.add_argument("--table", metavar="NAME", help="table of the DuckDB database FILE")
    p.add_argument("--weight", metavar="COL", help="weight column (--weights: how it is read)")
    p.add_argument("--weights", choices=("importance", "frequency"), default="importance")
    p.add_argument("--write-state", metavar="FILE", help="also write the state (Parquet)")


def _wants_engine(args: argparse.Namespace) -> bool:
    """Whether the engine/state path audits (else the streaming reader does)."""
    import glob

    if not hasattr(args, "state"):  # fit-temperature: a file of rows
        return False
    file = args.file or ""
    return bool(
        args.state
        or args.engine
        or args.table
        or args.weight
        or args.write_state
        or (glob.has_magic(file) and not os.path.exists(file))  # "data[1].csv" is a file
    )


def _require_rows_args(args: argparse.Namespace) -> None:
    """The file and column arguments a file of rows needs."""
    if not args.file:
        raise InputError("the following arguments are required: file (or --state FILE_OR_GLOB)")
    if not (args.probs or args.logits):
        raise InputError("one of the arguments --probs --logits is required")
    if not args.label:
        raise InputError("the following arguments are required: --label")


#: API argument -> the flag that sets it (error messages name what the user typed)
_FLAGS = {
    "n_bins": "--bins",
    "threshold": "--threshold",
    "tolerance": "--tolerance",
    "alpha": "--alpha",
    "power": "--power",
    "cost_error": "--cost-error",
    "cost_escalation": "--cost-escalation",
}


def _version() -> str:
    """The installed package's version (pyproject.toml's, read from its metadata) without
    importing torchcal, hence torch."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchcal")
    except PackageNotFoundError:  # pragma: no cover - a checkout never installed
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:  # long: one add_argument per option, no logic
    """The ``torchcal`` argument parser (errors raise instead of exiting)."""
    parser = _Parser(
        prog="torchcal",
        description="Calibration audits from the command line.",
        epilog=_EPILOG,
        formatter_class=_Help,
    )
    parser.add_argument("--version", action="version", version=f"torchcal {_version()}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")
    a = sub.add_parser(
        "audit",
        help="audit probabilities against labels (a test: PASS 0, FAIL 1, INCONCLUSIVE 3)",
        description="Audit a model's probabilities against labels. The verdict is a test at "
        "level --alpha: PASS when every row's (pooled and per group) 1 - 2 alpha interval of "
        "the gap near --threshold (or of the ECE without one) lies inside +-tolerance, FAIL "
        "when one lies outside (Holm-adjusted over the rows), else INCONCLUSIVE.",
        epilog=_EPILOG,
        formatter_class=_Help,
    )
    _add_columns(a, required=False)
    _add_engine_options(a)
    add_segment_arguments(a, positive_int)
    a.add_argument(
        "--threshold",
        type=_fraction("--threshold"),
        help="decision threshold (p >= T automates): judge the gap in the bins around it "
        "(default: judge the ECE)",
    )
    a.add_argument(
        "--tolerance",
        type=_fraction("--tolerance", hint="the tolerance is a fraction: 0.05 is 5 points"),
        default=0.05,
        help="largest allowed |gap| (or ECE), a fraction",
    )
    a.add_argument(
        "--alpha",
        type=_fraction("--alpha", 0.0, 0.5),
        default=0.05,
        help="level: each wrong PASS or FAIL has probability <= alpha",
    )
    a.add_argument(
        "--power",
        type=_fraction("--power"),
        default=0.8,
        help="power at which the smallest detectable gap is reported",
    )
    a.add_argument(
        "--inconclusive-exit",
        type=int,
        choices=(0, 1, 3),
        default=3,
        help="exit code of an INCONCLUSIVE verdict (0 lets it through, 1 blocks like a FAIL)",
    )
    a.add_argument(
        "--bins",
        type=_bins,
        default=None,
        help=f"equal-width bins, at most {MAX_BINS} (default: 10, or one bin per value when "
        "the confidences sit on a 0.05 or 0.1 grid)",
    )
    a.add_argument("--cost-error", type=float, help="cost of an automated error")
    a.add_argument("--cost-escalation", type=float, help="cost of sending an item to a person")
    a.add_argument("--fit-temperature", action="store_true", help="fit T on a seeded half")
    a.add_argument("--reference", metavar="OLD.json", help="earlier report.json: flag drift")
    a.add_argument(
        "--allow-mismatch", action="store_true",
        help="compare with --reference even when it was made with another threshold, bin "
        "count or reading",
    )  # fmt: skip
    a.add_argument("--out", metavar="DIR", help="write report.json/md/txt/html and PNGs here")
    a.add_argument(
        "--diagrams",
        type=_diagrams,
        default=20,
        metavar="N|all",
        help="PNG diagrams written with --out: the pooled one and the worst groups, N in all",
    )
    a.add_argument("--seed", type=int, default=0, help="seed of the sample and the fit split")
    a.add_argument("--threads", type=positive_int, default=1, help="torch threads for the audit")
    a.add_argument(
        "--from", dest="source", choices=("lm-eval",),
        help="FILE is an lm-evaluation-harness --output_path: audit its samples_*.jsonl, every "
        "task a group, with a temperature cross-fitted per task (docs/llm.md)",
    )  # fmt: skip
    a.add_argument(
        "--rule", choices=("raw", "norm"), default="raw",
        help="--from lm-eval: softmax of the choices' log-likelihoods (raw, the harness's "
        "brier_score) or of the length-normalised ones (norm, acc_norm's answer)",
    )  # fmt: skip
    c = sub.add_parser(
        "compare",
        help="drift between two report.json files (exit 1 if flagged)",
        description="Drift between two audits' report.json, per group (exit 1 if a group got "
        "significantly worse; 3 if a group of the old report is missing or cannot be judged).",
        epilog=_EPILOG,
        formatter_class=_Help,
    )
    c.add_argument("old", help="the earlier report.json")
    c.add_argument("new", help="the later report.json")
    c.add_argument(
        "--inconclusive-exit", type=int, choices=(0, 1, 3), default=3,
        help="exit code when a group is missing or cannot be judged",
    )  # fmt: skip
    f = sub.add_parser(
        "fit-temperature",
        help="fit a temperature (per group with --group)",
        description="Fit a temperature on all rows (per group with --group) and save it.",
        formatter_class=_Help,
    )
    _add_columns(f)
    f.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="save the temperatures (by group name) here: a .pt file, read back with "
        "torchcal.audit.load_temperatures",
    )
    e = sub.add_parser(
        "example",
        help="write an example CSV",
        description="Write example data: 'judging' (a probability per answer, two domains) or "
        "'stated' (an LLM judge's stated confidences such as '85%%', on a 0.05 grid).",
        formatter_class=_Help,
    )
    e.add_argument("out", help="the CSV file to write")
    e.add_argument("--kind", choices=("judging", "stated", "segments"), default="judging",
                   help="which data")  # fmt: skip
    e.add_argument("--n", type=positive_int, default=3000, help="rows per domain")
    e.add_argument("--seed", type=int, default=0, help="seed")
    return parser


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the console script; returns the exit code (:data:`EXIT_CODES`)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:  # bare `torchcal`: the commands
            parser.print_help()
            return 2
        return _COMMANDS[args.command](args)
    except SystemExit as e:  # --help, --version
        return int(e.code or 0)
    except KeyboardInterrupt:
        print("torchcal: interrupted", file=sys.stderr)
        return 2
    except (InputError, ValueError, OSError) as e:
        msg = _one_line(e).removeprefix("argument ")
        name = msg.split(":", 1)[0]
        if name in _FLAGS:  # an API argument's message names the command-line flag
            msg = _FLAGS[name] + msg[len(name) :]
        print(f"torchcal: error: {msg}", file=sys.stderr)
        return 2
    except Exception as e:  # never a traceback: one line, exit 2
        if os.environ.get("TORCHCAL_TRACEBACK"):
            raise
        print(
            f"torchcal: error: {type(e).__name__}: {_one_line(e)[:300]} (an internal error: "
            f"set TORCHCAL_TRACEBACK=1 for the traceback and please report it)",
            file=sys.stderr,
        )
        return 2


def _check_audit_args(args: argparse.Namespace) -> Any:
    """Every option checked before the work starts; returns the reference dict (or None)."""
    if (args.cost_error is None) != (args.cost_escalation is None):
        given = "--cost-error" if args.cost_error is not None else "--cost-escalation"
        other = "--cost-escalation" if given == "--cost-error" else "--cost-error"
        raise InputError(f"{given}: needs {other} too (the threshold weighs one against the other)")
    for flag, v in (("--cost-error", args.cost_error), ("--cost-escalation", args.cost_escalation)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise InputError(f"{flag}: expected a positive number, got {v}")
    if not _wants_engine(args) and args.source is None:
        _require_rows_args(args)
        if not os.path.isfile(args.file):
            raise InputError(f"{args.file}: no such file")
    from torchcal.audit.paths import check_outputs  # an output never replaces an input

    check_outputs(args.file, args.state, args.reference, args.write_state, args.out, args.threads)
    ref = None
    if args.reference is not None:
        from torchcal.audit.report import load_report_dict

        if not os.path.isfile(args.reference):
            raise InputError(f"--reference: no such file {args.reference}")
        try:
            ref = load_report_dict(args.reference)
        except ValueError as e:
            raise InputError(f"--reference: {args.reference}: {e}") from None
    return ref


def _audit(args: argparse.Namespace) -> int:
    ref = _check_audit_args(args)
    from torchcal.audit.compare import compare

    if args.source is None:  # every road of torchcal/audit/engine_input.py
        report, caught = _rows_report(args)
    elif args.source == "lm-eval":  # torchcal/integrations/lm_eval.py
        import torch

        from torchcal.integrations.lm_eval import audit_samples

        if not args.file:
            raise InputError("the following arguments are required: file (the RESULTS_DIR)")
        threads = torch.get_num_threads()
        torch.set_num_threads(args.threads)  # as _rows_report: threads cost more than they give
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                report = audit_samples(
                    args.file, rule=args.rule, threshold=args.threshold,
                    tolerance=args.tolerance, n_bins=args.bins, alpha=args.alpha,
                    power=args.power, cost_error=args.cost_error,
                    cost_escalation=args.cost_escalation, seed=args.seed,
                )  # fmt: skip
        finally:
            torch.set_num_threads(threads)
    for w in dict.fromkeys(str(w.message) for w in caught):
        if w not in report.warnings:
            print(f"torchcal: warning: {w}", file=sys.stderr)
    if ref is not None and not args.allow_mismatch:
        from torchcal.audit.compare import check_comparable

        check_comparable(ref, report.to_dict(), args.reference, "this audit")
    codes = {**EXIT_CODES, "inconclusive": args.inconclusive_exit}
    code = codes[report.verdict]
    if args.out is not None:  # before the text: report.json names the diagrams
        paths = report.save(args.out, max_diagrams=args.diagrams)
    print(report.to_text(console=True), end="")
    if ref is not None:
        comparison = compare(ref, report)
        print(f"\ncompared with {args.reference}:")
        print(comparison.to_text(), end="")
        if comparison.flagged:
            print(f"DRIFT: calibration got worse in {', '.join(comparison.flagged_names)}")
            code = EXIT_CODES["fail"]
        elif comparison.unjudged and code == EXIT_CODES["pass"]:
            code = args.inconclusive_exit
    if args.out is not None:
        print(f"wrote {len(paths)} files to {args.out}")
    return code


def _settings(args: argparse.Namespace) -> Any:
    """The audit's settings from the parsed arguments (the only place that reads them)."""
    from torchcal.audit.state import AuditSettings

    names = ("threshold", "tolerance", "alpha", "power", "seed", "cost_error",
             "cost_escalation", "fit_temperature", "max_unparsed", "weights")  # fmt: skip
    return AuditSettings(n_bins=args.bins, **{k: getattr(args, k) for k in names},
                         **segment_settings(args))  # fmt: skip


def _request(args: argparse.Namespace) -> Any:
    """What to read, from the parsed arguments."""
    from torchcal.audit.engine_input import AuditRequest

    engine = args.engine
    if engine is None and _wants_engine(args) and not args.state:
        engine = "auto"  # a glob, --table, --weight or --write-state
    return AuditRequest(
        file=args.file, states=tuple(args.state or ()),
        preds=tuple(args.probs or args.logits or ()),
        input="probs" if args.probs or not args.logits else "logits", label=args.label,
        group=args.group, weight=args.weight, engine=engine, table=args.table,
        write_state=args.write_state, chunk_rows=args.chunk_rows, progress=not args.no_progress,
    )  # fmt: skip


def _rows_report(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """The report of a file, glob, table or state files, and the warnings raised."""
    import torch

    from torchcal.audit.engine_input import run_audit

    settings, request = _settings(args), _request(args)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)  # light per-chunk arithmetic: threads cost more
    try:
        return run_audit(request, settings)
    finally:
        torch.set_num_threads(threads)


def _compare(args: argparse.Namespace) -> int:
    from torchcal.audit.compare import compare

    comparison = compare(args.old, args.new)
    print(comparison.to_text(), end="")
    if comparison.flagged:
        return EXIT_CODES["fail"]
    return args.inconclusive_exit if comparison.unjudged else EXIT_CODES["pass"]


def _check_output(path: str | None) -> None:
    if path is not None and os.path.isdir(path):
        raise InputError(
            f"-o: {path} is a directory; give a file path such as {path}/temperature.pt"
        )
    if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise InputError(f"-o: the directory {os.path.dirname(path) or '.'} does not exist")


def _fit_temperature(args: argparse.Namespace) -> int:
    _check_output(args.output)
    _require_rows_args(args)  # a file of rows (fit-temperature has no engine options)
    if not os.path.isfile(args.file):
        raise InputError(f"{args.file}: no such file")
    import torch

    from torchcal.audit._format import display_name
    from torchcal.audit.engine_input import AuditRequest, read_rows
    from torchcal.audit.temperatures import fit_temperature_file

    request = AuditRequest(
        file=args.file, preds=tuple(args.probs or args.logits), label=args.label,
        input="probs" if args.probs else "logits", group=args.group,
        chunk_rows=args.chunk_rows, progress=not args.no_progress,
    )  # fmt: skip
    preds, target, groups, names = read_rows(request, args.max_unparsed)
    fit = fit_temperature_file(
        preds, target, groups, names, input="probs" if args.probs else "logits"
    )
    if fit["clamped"]:
        print(
            f"warning: {fit['clamped']} probabilities of exactly 0 or 1 were clamped to finite "
            f"logits (+-36.74), which biases T: pass --logits if you have them",
            file=sys.stderr,
        )
    print(f"fitted on {fit['n']} rows: pooled T = {fit['pooled']:.6g}")
    for name, t in fit["temperatures"].items():
        if args.group:
            print(f"T[{display_name(name)}] = {t:.6g}")
    if args.output:
        torch.save(fit, args.output)
        print(f"saved the temperatures to {args.output} (torchcal.audit.load_temperatures)")
    return 0


def _example(args: argparse.Namespace) -> int:
    from torchcal.audit.example_segments import write_example

    if not args.out.lower().endswith(".csv"):  # CSV text under a .parquet name misleads
        raise InputError(
            f"OUT: example writes CSV; expected a name ending in .csv, got {args.out!r}"
        )
    print(write_example(args.kind, args.out, args.n, args.seed))
    return 0


_COMMANDS = {
    "audit": _audit,
    "compare": _compare,
    "fit-temperature": _fit_temperature,
    "example": _example,
}

if __name__ == "__main__":
    raise SystemExit(main())
