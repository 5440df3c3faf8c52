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
``json.loads``), else with ``json``. Two parsers share that ``loads``. The fast one
(:func:`_parse_bulk`) takes only the fields of each parsed line and runs the checks and the
conversions per chunk of :data:`CHUNK` lines as C-level ``map``s (the numbers by one parse of
the chunk's texts as a JSON array, :func:`_floats`); it takes a file only if it can take
every line exactly as the strict one would. On anything else (a bad or truncated line, a
value of another type, a blank line that is not empty, a mutual-information log, ...) it
stops, and the strict per-line parser (:func:`_parse_lines`) re-reads the file from its first
line: the documents read are the strict parser's, bit for bit, and every error is its
one-line ``ValueError`` naming the file and the line number (tested against each other on
random runs and on a table of hostile lines).
"""

from __future__ import annotations

import gc
import json
import math
import operator
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import accumulate, islice, repeat
from operator import itemgetter, methodcaller
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch import Tensor

#: ``samples_<task>_<date_id>.jsonl`` as lm-eval's EvaluationTracker names it
SAMPLES_NAME = re.compile(
    r"samples_(?P<task>.+)_(?P<date>\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?)\.jsonl"
)
#: the harness's default ``target_delimiter`` (lm_eval/config/task.py)
DEFAULT_DELIMITER = " "
#: lines per chunk of the fast parser's checks (small: the chunk's fields stay in cache)
CHUNK = 64


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
    if not all(type(c) is str for c in conts):
        raise ValueError(f"arguments: every choice must be a string, got {str(conts)[:80]}")
    lengths = list(map(len, conts))
    if min(lengths) <= len(delimiter) or not all(map(starts, conts)):
        raise ValueError(
            f"arguments: every choice must be {delimiter!r} followed by at least one "
            f"character (the task's target_delimiter), got {[c[:20] for c in conts]}"
        )
    gold = _target(target, conts, delimiter)
    if not 0 <= gold < len(conts):
        raise ValueError(f"target: choice {gold} of {len(conts)}")
    return gold, [float(r[0]) for r in resps], lengths


def _target(target: Any, conts: list[str], delimiter: str) -> int:
    """The gold choice: a digit string is an index (the harness's rule), else :func:`_gold`."""
    if type(target) is str and target.isdigit():
        return int(target)
    return _gold(target, conts, delimiter)


class _Columns:
    """The documents read so far, flat: one entry per document in ``gold``/``counts``, one
    per choice in ``lls``/``lengths``."""

    def __init__(self) -> None:
        self.gold: list[int] = []
        self.counts: list[int] = []
        self.lls: list[float] = []
        self.lengths: list[int] = []

    def sizes(self) -> tuple[int, int]:
        """(documents, choices) read so far."""
        return len(self.gold), len(self.lls)

    def truncate(self, sizes: tuple[int, int]) -> None:
        """Drop what was read after :meth:`sizes` gave ``sizes``."""
        docs, choices = sizes
        del self.gold[docs:], self.counts[docs:], self.lls[choices:], self.lengths[choices:]

    def padded(self, flat: np.ndarray, fill: float) -> Tensor:
        """``(N, C)`` float64 of the per-choice ``flat``, ``fill`` past each document's
        choices (a view when every document has ``C``)."""
        counts = np.asarray(self.counts, dtype=np.int64)
        width = int(counts.max())
        if int(counts.min()) == width:
            return torch.from_numpy(flat.reshape(-1, width))
        out = np.full((counts.size, width), fill, dtype=np.float64)
        out[np.arange(width) < counts[:, None]] = flat  # row-major: the file's order
        return torch.from_numpy(out)


def _read_file(f: Path, delimiter: str, loads: Callable[[bytes], Any], out: _Columns) -> int:
    """Append one task's documents to ``out``; returns the blank lines skipped."""
    gc_was_on = gc.isenabled()
    gc.disable()  # millions of new objects, none cyclic: the collector's passes only cost
    try:
        kept = out.sizes()
        try:
            with open(f, "rb") as fh:
                return _parse_bulk(fh, delimiter, loads, out)
        except Exception:  # anything the fast parser cannot take exactly: the strict re-read
            out.truncate(kept)
            with open(f, "rb") as fh:
                return _parse_lines(f, fh, delimiter, loads, out)
    finally:
        if gc_was_on:
            gc.enable()


def _parse_lines(
    f: Path, lines: Iterable[bytes], delimiter: str, loads: Callable[[bytes], Any], out: _Columns
) -> int:
    """The strict parser: one line at a time, the first bad one a ``ValueError`` with its
    line number (``lines``: the file's lines as binary iteration yields them)."""
    blank = 0
    gold, counts, lls, lengths = out.gold, out.counts, out.lls, out.lengths
    starts = methodcaller("startswith", delimiter)
    for lineno, line in enumerate(lines, 1):
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


class _NotExact(Exception):
    """A line the fast parser cannot take exactly (the strict parser re-reads the file)."""


_FIELDS = itemgetter("target", "arguments", "filtered_resps")
_ARG1 = itemgetter("arg_1")
_FIRST = itemgetter(0)


def _parse_bulk(fh: BinaryIO, delimiter: str, loads: Callable[[bytes], Any], out: _Columns) -> int:
    """The fast parser: the file's documents into ``out`` (the blank lines returned), or an
    exception wherever it cannot take a line exactly as :func:`_parse_lines` would (the caller
    then re-reads with it). Per line only the fields are taken (the same expressions as
    :func:`_document`: ``r[0]``, ``a["arg_1"]``); the checks run per chunk of :data:`CHUNK`
    lines as C-level ``map``s (:func:`_check_chunk`), the numbers by :func:`_floats`. Only
    ``b"\\n"`` lines are skipped as blank here (other whitespace fails to parse: the strict
    parser decides)."""
    blank = 0
    while True:
        targets: list[Any] = []
        counts: list[int] = []
        conts: list[Any] = []
        texts: list[Any] = []
        n = 0
        for line in islice(fh, CHUNK):
            n += 1
            try:
                rec = loads(line)
            except ValueError:
                if line == b"\n":
                    blank += 1
                    continue
                raise
            t, a, r = _FIELDS(rec)  # not an object, or a field missing: raises
            if type(a) is not dict or type(r) is not list or len(a) != len(r):
                raise _NotExact("arguments or filtered_resps")
            if (m := rec.get("metrics")) and "acc_mutual_info" in m:
                raise _NotExact("metrics")
            targets.append(t)
            counts.append(len(a))
            conts += map(_ARG1, a.values())
            texts += map(_FIRST, r)
        if not n:
            return blank
        if targets:
            gold, lengths = _check_chunk(targets, counts, conts, delimiter)
            out.lls += _floats(texts, loads)
            out.gold += gold
            out.counts += counts
            out.lengths += lengths


def _check_chunk(
    targets: list[Any],
    counts: list[int],
    conts: list[Any],
    delimiter: str,
) -> tuple[list[int], list[int]]:
    """(gold, choice lengths) of a chunk's documents, the rest of :func:`_document`'s checks
    (``str.startswith`` succeeding on every continuation: each is a ``str``)."""
    if min(counts) < 2:
        raise _NotExact("choices")
    lengths = list(map(len, conts))
    if min(lengths) <= len(delimiter) or not all(map(str.startswith, conts, repeat(delimiter))):
        raise _NotExact("delimiter")
    kinds = set(map(type, targets))
    if kinds == {str} and all(map(str.isdigit, targets)):
        gold = list(map(int, targets))
    elif kinds == {int}:
        gold = targets
    else:  # text targets (or a mix): the strict rule per document
        ends = accumulate(counts)
        gold = [_target(t, conts[e - c : e], delimiter) for t, e, c in zip(targets, ends, counts)]
    if min(gold) < 0 or (max(gold) >= min(counts) and not all(map(operator.lt, gold, counts))):
        raise _NotExact("target")
    return gold, lengths


def _floats(texts: list[Any], loads: Callable[[bytes], Any]) -> list[float]:
    """``list(map(float, texts))``, by one ``orjson`` parse of the texts as one JSON array
    when that gives one ``float`` per text. Then no text held a comma or a bracket (the array's
    only commas are the joins), so each is JSON whitespace around one JSON number with a
    fraction or an exponent, which both parsers round correctly to the same double (tested
    bit for bit, the hard halfway cases included); anything else (``"nan"``, ``"-inf"``,
    ``"1e999"``, an integer, a non-string) goes to ``float`` one by one."""
    if loads is not json.loads:
        try:
            values = loads(("[" + ",".join(texts) + "]").encode())
        except Exception:  # not all strings, or not all JSON numbers
            values = None
        if type(values) is list and len(values) == len(texts):
            if set(map(type, values)) == {float}:
                return values
    return list(map(float, texts))


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
    docs: list[int] = []  # per task: documents, choices, the delimiter's length
    choices: list[int] = []
    cut: list[int] = []
    blank = 0
    for task, f in files.items():
        before, before_c = len(cols.gold), len(cols.lls)
        delimiter = _delimiter(f, task)
        blank += _read_file(f, delimiter, loads, cols)
        if len(cols.gold) == before:
            raise ValueError(f"{f}: no documents")
        docs.append(len(cols.gold) - before)
        choices.append(len(cols.lls) - before_c)
        cut.append(len(delimiter))
    lengths = np.asarray(cols.lengths, dtype=np.float64) - np.repeat(cut, choices)
    return LoggedSamples(
        tasks=tuple(files),
        files=tuple(str(f) for f in files.values()),
        group=torch.from_numpy(np.repeat(np.arange(len(files), dtype=np.int64), docs)),
        target=torch.from_numpy(np.asarray(cols.gold, dtype=np.int64)),
        lls=cols.padded(np.asarray(cols.lls, dtype=np.float64), -math.inf),
        lengths=cols.padded(lengths, 1.0),
        blank_lines=blank,
    )
