"""The reader of lm-evaluation-harness ``samples_*.jsonl`` files (docs/design.md section 6h).

``lm_eval --log_samples --output_path DIR`` writes, per run, ``DIR/<model>/results_<date>.json``
and one ``samples_<task>_<date>.jsonl`` per task: a JSON object per document with
``target`` (the gold: a choice index, or the gold choice's text), ``arguments`` (per choice a
``(context, target_delimiter + choice)`` pair) and ``filtered_resps`` (per choice
``[loglikelihood, is_greedy]``, numbers written as strings). Only these fields are used. The
``target_delimiter`` of each task is read from the run's ``results_<date>.json`` (the
harness's default ``" "`` without one); a choice's length is its character count without it,
as ``acc_norm`` counts it.

Every line is parsed with ``orjson`` when it is installed (several times faster than
``json.loads``), else with ``json``. A bad or truncated line stops the read with a one-line
``ValueError`` naming the file and the line number.
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from operator import methodcaller
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

#: ``samples_<task>_<date_id>.jsonl`` as lm-eval's EvaluationTracker names it
SAMPLES_NAME = re.compile(
    r"samples_(?P<task>.+)_(?P<date>\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?)\.jsonl"
)
#: the harness's default ``target_delimiter`` (lm_eval/config/task.py)
DEFAULT_DELIMITER = " "


@dataclass(frozen=True)
class LoggedSamples:
    """The multiple-choice documents of one harness run, every task a group.

    Attributes:
        tasks: task names, one per group id, in file-name order.
        files: the ``samples_*.jsonl`` read, one per task.
        group: ``(N,)`` int64 task id of each document.
        target: ``(N,)`` int64 gold choice.
        lls: ``(N, C)`` float64 log-likelihood of each choice; ``-inf`` past a document's
            choices (``C`` is the most choices of any document).
        lengths: ``(N, C)`` float64 character length of each choice (1 past the choices).
        blank_lines: empty lines skipped.
    """

    tasks: tuple[str, ...]
    files: tuple[str, ...]
    group: Tensor
    target: Tensor
    lls: Tensor
    lengths: Tensor
    blank_lines: int


def _loads() -> Callable[[bytes], Any]:
    try:
        import orjson
    except ImportError:  # pragma: no cover - the [llm] extra installs it
        return json.loads
    return orjson.loads  # type: ignore[no-any-return]


def sample_files(path: str | os.PathLike[str]) -> dict[str, Path]:
    """``{task: samples file}`` under ``path`` (a directory, searched recursively, or one
    ``samples_*.jsonl`` file); ``ValueError`` when there is none or a task is logged twice
    (two runs in one directory: point at one run's directory).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "samples_arc_easy_2026-01-02T03-04-05.123456.jsonl").write_text("")
        >>> sorted(sample_files(d))
        ['arc_easy']
    """
    p = Path(path)
    if p.is_file():
        found = [p]
    elif p.is_dir():
        found = sorted(q for q in p.rglob("samples_*.jsonl") if q.is_file())
    else:
        raise ValueError(f"{path}: no such file or directory")
    out: dict[str, Path] = {}
    for f in found:
        m = SAMPLES_NAME.fullmatch(f.name)
        if m is None:
            raise ValueError(f"{f}: not a samples_<task>_<date>.jsonl file of lm-eval")
        task = m["task"]
        if task in out:
            raise ValueError(
                f"{path}: task {task!r} is logged in two files ({out[task]} and {f}): "
                f"point at one run's directory"
            )
        out[task] = f
    if not out:
        raise ValueError(f"{path}: no samples_*.jsonl file (run lm_eval with --log_samples)")
    return out


def _delimiter(samples: Path, task: str) -> str:
    """The task's ``target_delimiter`` from the run's ``results_<date>.json``."""
    m = SAMPLES_NAME.fullmatch(samples.name)
    assert m is not None  # checked by sample_files
    results = samples.with_name(f"results_{m['date']}.json")
    if not results.is_file():
        return DEFAULT_DELIMITER
    try:
        config = json.loads(results.read_text(encoding="utf-8"))["configs"][task]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{results}: not an lm-eval results file with task {task!r} ({e})"
        ) from None
    delimiter = config.get("target_delimiter", DEFAULT_DELIMITER)
    if not isinstance(delimiter, str):
        raise ValueError(f"{results}: target_delimiter of {task!r} is not a string")
    return delimiter


def _continuations(arguments: Any) -> list[str]:
    """The continuation of each request: the file's ``{"gen_args_i": {"arg_0": context,
    "arg_1": continuation}}`` or the in-memory ``[[context, continuation], ...]``."""
    if isinstance(arguments, dict):
        return [a["arg_1"] for a in arguments.values()]
    return [a[1] for a in arguments]


def _gold(target: Any, conts: list[str], delimiter: str) -> int:
    if isinstance(target, int) and not isinstance(target, bool):
        return target
    if not isinstance(target, str):
        raise ValueError(f"target: expected a choice index or text, got {target!r}")
    hits = [i for i, c in enumerate(conts) if c == delimiter + target]
    if len(hits) != 1:
        what = "no choice" if not hits else f"{len(hits)} choices"
        raise ValueError(f"target: {target!r} is {what} (multiple targets are not supported)")
    return hits[0]


def _document(
    rec: Any, delimiter: str, starts: Callable[[str], bool]
) -> tuple[int, list[float], list[int]]:
    """(gold, log-likelihoods, choice lengths with the delimiter) of one parsed line;
    ``starts(c)``: whether ``c`` starts with the delimiter."""
    if type(rec) is not dict:
        raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
    try:
        target, arguments, resps = rec["target"], rec["arguments"], rec["filtered_resps"]
    except KeyError as e:
        raise ValueError(f"no {e} field (not a samples line of lm-eval)") from None
    metrics = rec.get("metrics")
    if metrics and "acc_mutual_info" in metrics:
        raise ValueError("acc_mutual_info doubles the requests: not supported")
    conts = _continuations(arguments)
    if type(resps) is not list or len(resps) != len(conts) or len(conts) < 2:
        raise ValueError(
            f"filtered_resps: expected one [loglikelihood, is_greedy] per choice (at least "
            f"2 choices, {len(conts)} arguments), got {str(resps)[:80]}"
        )
    lengths = list(map(len, conts))
    if min(lengths) <= len(delimiter) or not all(map(starts, conts)):
        raise ValueError(
            f"arguments: every choice must be {delimiter!r} followed by at least one "
            f"character (the task's target_delimiter), got {[c[:20] for c in conts]}"
        )
    if type(target) is str and target.isdigit():  # the harness's digit strings are indices
        gold = int(target)
    else:
        gold = _gold(target, conts, delimiter)
    if not 0 <= gold < len(conts):
        raise ValueError(f"target: choice {gold} of {len(conts)}")
    return gold, [float(r[0]) for r in resps], lengths


class _Columns:
    """The documents read so far, flat: one entry per document in ``gold``/``counts``, one
    per choice in ``lls``/``lengths``."""

    def __init__(self) -> None:
        self.gold: list[int] = []
        self.counts: list[int] = []
        self.lls: list[float] = []
        self.lengths: list[int] = []

    def padded(self, values: list[float] | list[int], fill: float) -> Tensor:
        """``(N, C)`` float64, ``fill`` past each document's choices."""
        counts = torch.tensor(self.counts, dtype=torch.int64)
        flat = torch.tensor(values, dtype=torch.float64)
        width = int(counts.max())
        if int(counts.min()) == width:  # every document has C choices: a view
            return flat.view(-1, width)
        out = torch.full((counts.numel(), width), fill, dtype=torch.float64)
        out[torch.arange(width) < counts[:, None]] = flat  # row-major: the file's order
        return out


def _read_file(f: Path, delimiter: str, loads: Callable[[bytes], Any], out: _Columns) -> int:
    """Append one task's documents to ``out``; returns the blank lines skipped."""
    gc_was_on = gc.isenabled()
    gc.disable()  # millions of new objects, none cyclic: the collector's passes only cost
    try:
        return _parse_lines(f, delimiter, loads, out)
    finally:
        if gc_was_on:
            gc.enable()


def _parse_lines(f: Path, delimiter: str, loads: Callable[[bytes], Any], out: _Columns) -> int:
    blank = 0
    gold, counts, lls, lengths = out.gold, out.counts, out.lls, out.lengths
    starts = methodcaller("startswith", delimiter)
    with open(f, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            try:
                g, ll, n = _document(loads(line), delimiter, starts)
            except (ValueError, KeyError, IndexError, TypeError) as e:
                if not line.strip():
                    blank += 1
                    continue
                cut = "" if line.endswith(b"\n") else " (truncated: the file ends mid-line)"
                raise ValueError(f"{f}:{lineno}: bad samples line{cut}: {e}") from None
            gold.append(g)
            counts.append(len(ll))
            lls += ll
            lengths += n
    return blank


def read_samples(path: str | os.PathLike[str]) -> LoggedSamples:
    """Read every ``samples_*.jsonl`` under ``path`` (see :func:`sample_files`).

    Example:
        >>> import json, tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> line = {"target": "1", "arguments": {"gen_args_0": {"arg_0": "Q", "arg_1": " no"},
        ...         "gen_args_1": {"arg_0": "Q", "arg_1": " yes"}},
        ...         "filtered_resps": [["-2.5", "False"], ["-0.5", "True"]]}
        >>> f = d / "samples_yn_2026-01-02T03-04-05.1.jsonl"
        >>> _ = f.write_text(json.dumps(line) + "\\n")
        >>> s = read_samples(d)
        >>> s.tasks, s.target.tolist(), s.lls.tolist(), s.lengths.tolist()
        (('yn',), [1], [[-2.5, -0.5]], [[2.0, 3.0]])
    """
    files = sample_files(path)
    loads = _loads()
    cols = _Columns()
    group: list[int] = []
    cut: list[int] = []  # the delimiter's length, per task
    blank = 0
    for g, (task, f) in enumerate(files.items()):
        before = len(cols.gold)
        delimiter = _delimiter(f, task)
        blank += _read_file(f, delimiter, loads, cols)
        if len(cols.gold) == before:
            raise ValueError(f"{f}: no documents")
        group += [g] * (len(cols.gold) - before)
        cut.append(len(delimiter))
    groups = torch.tensor(group, dtype=torch.int64)
    lengths = (
        cols.padded(cols.lengths, math.nan) - torch.tensor(cut, dtype=torch.float64)[groups, None]
    )
    return LoggedSamples(
        tasks=tuple(files),
        files=tuple(str(f) for f in files.values()),
        group=groups,
        target=torch.tensor(cols.gold, dtype=torch.int64),
        lls=cols.padded(cols.lls, -math.inf),
        lengths=torch.where(torch.isnan(lengths), 1.0, lengths),
        blank_lines=blank,
    )
