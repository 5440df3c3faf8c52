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

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["LoggedSamples", "read_samples", "sample_files"]

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
    if target.isdigit():  # the harness turns a digit string into an index
        return int(target)
    hits = [i for i, c in enumerate(conts) if c == delimiter + target]
    if len(hits) != 1:
        what = "no choice" if not hits else f"{len(hits)} choices"
        raise ValueError(f"target: {target!r} is {what} (multiple targets are not supported)")
    return hits[0]


def _document(rec: Any, delimiter: str) -> tuple[int, list[float], list[int]]:
    """(gold, log-likelihoods, choice lengths) of one parsed line."""
    if not isinstance(rec, dict):
        raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
    for key in ("target", "arguments", "filtered_resps"):
        if key not in rec:
            raise ValueError(f"no {key!r} field (not a samples line of lm-eval)")
    if "acc_mutual_info" in (rec.get("metrics") or ()):
        raise ValueError("acc_mutual_info doubles the requests: not supported")
    conts = _continuations(rec["arguments"])
    resps = rec["filtered_resps"]
    if not isinstance(resps, list) or len(resps) != len(conts) or len(conts) < 2:
        raise ValueError(
            f"filtered_resps: expected one [loglikelihood, is_greedy] per choice (at least "
            f"2 choices, {len(conts)} arguments), got {str(resps)[:80]}"
        )
    lls = [float(r[0]) for r in resps]
    d = len(delimiter)
    lengths = [len(c) - d for c in conts]
    if not all(c.startswith(delimiter) for c in conts) or min(lengths) < 1:
        raise ValueError(
            f"arguments: every choice must be {delimiter!r} followed by at least one "
            f"character (the task's target_delimiter), got {[c[:20] for c in conts]}"
        )
    gold = _gold(rec["target"], conts, delimiter)
    if not 0 <= gold < len(conts):
        raise ValueError(f"target: choice {gold} of {len(conts)}")
    return gold, lls, lengths


def _read_file(
    f: Path, delimiter: str, loads: Callable[[bytes], Any], out: tuple[list[Any], ...]
) -> int:
    """Append one task's documents to ``out`` = (gold, lls, lengths); returns blank lines."""
    gold, lls, lengths = out
    blank = 0
    with open(f, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                blank += 1
                continue
            try:
                g, ll, n = _document(loads(line), delimiter)
            except (ValueError, KeyError, IndexError, TypeError) as e:
                cut = "" if line.endswith(b"\n") else " (truncated: the file ends mid-line)"
                raise ValueError(f"{f}:{lineno}: bad samples line{cut}: {e}") from None
            gold.append(g)
            lls.append(ll)
            lengths.append(n)
    return blank


def _pad(rows: list[list[float]] | list[list[int]], width: int, fill: float) -> Tensor:
    counts = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    flat = torch.tensor([x for r in rows for x in r], dtype=torch.float64)
    out = torch.full((len(rows), width), fill, dtype=torch.float64)
    starts = torch.cumsum(counts, 0) - counts
    row = torch.repeat_interleave(torch.arange(len(rows)), counts)
    col = torch.arange(flat.numel()) - starts[row]
    out[row, col] = flat
    return out


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
    gold: list[int] = []
    lls: list[list[float]] = []
    lengths: list[list[int]] = []
    group: list[int] = []
    blank = 0
    for g, (task, f) in enumerate(files.items()):
        before = len(gold)
        blank += _read_file(f, _delimiter(f, task), loads, (gold, lls, lengths))
        if len(gold) == before:
            raise ValueError(f"{f}: no documents")
        group += [g] * (len(gold) - before)
    width = max(len(r) for r in lls)
    return LoggedSamples(
        tasks=tuple(files),
        files=tuple(str(f) for f in files.values()),
        group=torch.tensor(group, dtype=torch.int64),
        target=torch.tensor(gold, dtype=torch.int64),
        lls=_pad(lls, width, float("-inf")),
        lengths=_pad(lengths, width, 1.0),
        blank_lines=blank,
    )
