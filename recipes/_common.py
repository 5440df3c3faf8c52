"""Plumbing the recipes share: the run's threads/determinism context, the options of a parsed
jsonargparse group that a callable takes, JSON-ready numbers, table cells and text/markdown
tables, and writing ``report.json`` / ``report.txt`` / ``report.md``.

Recipe-specific content (what the tables hold, the plots) stays in each recipe's
``report.py``; this module holds only what is the same in all of them.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

__all__ = [
    "SIGNIFICANT_DIGITS",
    "TIMING_KEY",
    "cell",
    "environment",
    "json_ready",
    "md_table",
    "options",
    "run_cli",
    "text_table",
    "tidy_help",
    "write_text_reports",
    "write_timed",
]

SIGNIFICANT_DIGITS = 10
TIMING_KEY = "timing"  # the report's only non-deterministic entry: wall times in seconds


def options(fn: Callable, group: Any) -> dict[str, Any]:
    """The options of a parsed group that ``fn`` takes (a group may feed two callables).

    Example:
        >>> from types import SimpleNamespace
        >>> def f(a, b=2): ...
        >>> options(f, SimpleNamespace(a=1, c=3))
        {'a': 1}
    """
    names = inspect.signature(fn).parameters
    return {k: v for k, v in vars(group).items() if k in names}


@contextlib.contextmanager
def environment(threads: int) -> Iterator[None]:
    """Threads and deterministic algorithms for one run, restored after it.

    Example:
        >>> before = torch.get_num_threads()
        >>> with environment(1):
        ...     torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
        (1, True)
        >>> torch.get_num_threads() == before
        True
        >>> with environment(0):
        ...     pass
        Traceback (most recent call last):
        ...
        ValueError: threads: expected an int >= 1, got 0
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads: expected an int >= 1, got {threads!r}")
    old = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(old[0])
        torch.use_deterministic_algorithms(old[1], warn_only=old[2])


ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|obj):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """Docstring text as a terminal shows it: reST roles and literals without their markup.

    Example:
        >>> plain("Train :class:`~a.b.Net` with ``objective``; see :func:`make_data`.")
        'Train Net with objective; see make_data.'
    """
    text = ROLE.sub(lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], text)
    return text.replace("``", "")


def summary(fn: Callable) -> str:
    """The first sentence of ``fn``'s docstring, whole (jsonargparse's group headings take its
    first line, which can stop mid-sentence), in plain text (a first paragraph ending in a
    colon ends with a full stop instead).

    Example:
        >>> def f():
        ...     \"\"\"Train a :class:`Net` with ``objective`` and fit
        ...     its temperature. More words.\"\"\"
        >>> summary(f)
        'Train a Net with objective and fit its temperature.'
    """
    paragraph = inspect.cleandoc(fn.__doc__ or fn.__name__).split("\n\n")[0]
    text = " ".join(paragraph.split())
    end = re.search(r"\.(\s|$)", text)
    sentence = text[: end.start()] if end else text.rstrip(":")
    return plain(sentence) + "."


class _KeepLines:
    """Help formatter mix-in: the description and epilog keep their lines as written (so a
    command in them is never broken across lines)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(keepends=True))


def tidy_help(parser: Any, groups: dict[str, Callable]) -> Any:
    """Make a recipe's ``--help`` read as plain text: each option group headed by the whole
    first sentence of the function that takes its options (``groups``: group key ->
    function), reST markup removed from the description, the headings and every option's
    help, and the description's lines kept. Returns ``parser``."""
    for key, fn in groups.items():
        parser.groups[key].title = f"{summary(fn)[:-1]} (--{key}.*)"
    parser.description = plain(parser.description or "")
    for action in parser._actions:
        if action.help:
            action.help = plain(action.help)
    parser.formatter_class = type("KeepLines", (_KeepLines, parser.formatter_class), {})
    return parser


def run_cli(
    parser: Any, run: Callable[[Any], dict[str, Any]], argv: list[str] | None
) -> dict[str, Any] | None:
    """Parse ``argv`` with the recipe's jsonargparse ``parser`` and ``run`` the parsed
    namespace; returns the report, or ``None`` after printing ``error: <message>`` to stderr
    when the run rejects an option (a ``ValueError``: the recipe's ``main`` then exits 2).

    Example:
        >>> import argparse, contextlib, io
        >>> parser = argparse.ArgumentParser()
        >>> _ = parser.add_argument("--threads", type=int, default=1)
        >>> def run(cfg):
        ...     with environment(cfg.threads):
        ...         return {"threads": cfg.threads}
        >>> run_cli(parser, run, ["--threads", "2"])
        {'threads': 2}
        >>> with contextlib.redirect_stderr(io.StringIO()) as err:
        ...     run_cli(parser, run, ["--threads", "0"])
        >>> print(err.getvalue(), end="")
        error: threads: expected an int >= 1, got 0
    """
    cfg = parser.parse_args(argv)
    try:
        return run(cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def json_ready(obj: object) -> object:
    """Floats rounded to 10 significant digits (NaN/inf -> None), tuples -> lists.

    Example:
        >>> json_ready({"a": (1.0 / 3, float("nan"))})
        {'a': [0.3333333333, None]}
    """
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return float(f"{obj:.{SIGNIFICANT_DIGITS}g}") if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    raise TypeError(f"not JSON-ready: {type(obj).__name__}")


def cell(value: object) -> str:
    """A table cell: ``-`` for ``None``, floats to 4 decimals, a list's floats to 3.

    Example:
        >>> [cell(None), cell(0.123456), cell([0.5, 0.25]), cell("strict"), cell(3)]
        ['-', '0.1235', '0.500 0.250', 'strict', '3']
    """
    if value is None:
        return "-"
    if isinstance(value, list):
        return " ".join(f"{v:.3f}" for v in value)
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table.

    Example:
        >>> print(md_table(["a", "b"], [["x", "1"]]))
        | a | b |
        |---|---|
        | x | 1 |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: the first column left-aligned, the others right-aligned.

    Example:
        >>> print(text_table(["name", "value"], [["a", "1.5"], ["bb", "10.25"]]))
        name  value
        ----  -----
        a       1.5
        bb    10.25
    """
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
        )

    return "\n".join([fmt(header), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows])


def write_text_reports(
    output_dir: str, report: dict, render: Callable[[bool], str]
) -> dict[str, str]:
    """Write ``report.json`` (:func:`json_ready`, indented) and ``report.txt`` / ``report.md``
    (``render(markdown)``) to ``output_dir``, created if missing; returns their paths by
    extension.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     paths = write_text_reports(d, {"x": 1 / 3}, lambda md: "# x\\n" if md else "x\\n")
        ...     sorted(paths), open(paths["json"]).read(), open(paths["md"]).read()
        (['json', 'md', 'txt'], '{\\n  "x": 0.3333333333\\n}\\n', '# x\\n')
    """
    os.makedirs(output_dir, exist_ok=True)
    paths = {ext: os.path.join(output_dir, f"report.{ext}") for ext in ("json", "txt", "md")}
    with open(paths["json"], "w", encoding="utf-8") as fh:
        json.dump(json_ready(report), fh, indent=2)
        fh.write("\n")
    for ext in ("txt", "md"):
        with open(paths[ext], "w", encoding="utf-8") as fh:
            fh.write(render(ext == "md"))
    return paths


def write_timed(
    write_reports: Callable[..., Any], output_dir: str, report: dict, **kwargs: Any
) -> None:
    """``write_reports(output_dir, report, **kwargs)``, its wall time then recorded as
    ``report[TIMING_KEY]["report_seconds"]`` (after the files are written: the files do not
    hold it).

    Example:
        >>> report = {TIMING_KEY: {}}
        >>> write_timed(lambda out, rep: None, "unused", report)
        >>> list(report[TIMING_KEY])
        ['report_seconds']
    """
    t = time.perf_counter()
    write_reports(output_dir, report, **kwargs)
    report[TIMING_KEY]["report_seconds"] = time.perf_counter() - t
