"""(internal) What ``torchcal audit`` writes never replaces what it reads (docs/design.md
section 6c.2): every output (``--write-state FILE``, the report files of ``--out DIR``) is
compared with every input (``FILE`` or each file of its glob, each ``--state`` file, the
``--reference`` report) by the file they resolve to -- ``./a`` and ``a``, a symlink, a hard
link are one file -- and a collision is an error before anything is read or written. A
merged state is refused where the glob of its inputs would find it again (the next audit of
that glob would count its rows twice); :func:`~torchcal.engines.state.expand_paths` reads
each file once, by what it resolves to.

``--threads`` is bounded here too (:data:`MAX_THREADS`): a thread pool of 10,000 threads
is no faster and can exhaust the machine."""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Sequence

#: the files :meth:`~torchcal.audit.report.AuditReport.save` writes besides the PNG diagrams
REPORT_FILES = ("report.json", "report.md", "report.txt", "report.html")
#: the most torch threads ``--threads`` accepts: 4 per CPU core (at least 64)
MAX_THREADS = max(64, 4 * (os.cpu_count() or 1))


def same_file(a: str, b: str) -> bool:
    """Whether the paths ``a`` and ``b`` name one file (``b`` exists; ``a`` may not yet)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # a does not exist yet
        return False


def _files(pattern: str) -> list[str]:
    """The existing files ``pattern`` names (itself when it is a file, else its glob)."""
    if os.path.isfile(pattern) or not glob.has_magic(pattern):
        return [pattern] if os.path.isfile(pattern) else []
    return [f for f in glob.glob(pattern) if os.path.isfile(f)]


def _matches(path: str, pattern: str) -> bool:
    """Whether a file written at ``path`` would be found by the glob ``pattern``."""
    if not glob.has_magic(pattern) or os.path.isfile(pattern):
        return False
    folder, name = os.path.split(pattern)
    out_folder, out_name = os.path.split(path)
    if not fnmatch.fnmatchcase(out_name, name) or (out_name[:1] == "." != name[:1]):
        return False
    folders = glob.glob(folder) if glob.has_magic(folder) else [folder or "."]
    return any(same_file(out_folder or ".", d) for d in folders if os.path.isdir(d))


def check_outputs(
    file: str | None,
    states: Sequence[str] | None,
    reference: str | None,
    write_state: str | None,
    out: str | None,
    threads: int = 1,
) -> None:
    """``ValueError`` naming the flag and both paths when an output would replace an input,
    or a merged state would be found again by its inputs' glob; ``--out`` must be a directory
    (or not exist) and ``--threads`` at most :data:`MAX_THREADS`.

    Example:
        >>> import os, tempfile
        >>> d = tempfile.mkdtemp(); f = os.path.join(d, "preds.parquet")
        >>> open(f, "w").close()
        >>> check_outputs(f, None, None, os.path.join(d, ".", "preds.parquet"), None)
        Traceback (most recent call last):
        ...
        ValueError: --write-state: .../preds.parquet is the input FILE .../preds.parquet: writing it would replace the data; write it elsewhere
    """
    if threads > MAX_THREADS:
        raise ValueError(
            f"--threads: expected at most {MAX_THREADS} (4 per CPU core, at least 64), got "
            f"{threads}"
        )
    if out is not None and os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out: {out} exists and is not a directory")
    inputs = [("FILE", f) for f in _files(file)] if file else []
    inputs += [("--state", f) for pat in states or () for f in _files(pat)]
    if reference is not None and os.path.isfile(reference):
        inputs.append(("--reference", reference))
    outputs = [("--write-state", write_state)] if write_state else []
    outputs += [("--out", os.path.join(out, n)) for n in REPORT_FILES] if out else []
    for flag, target in outputs:
        for kind, source in inputs:
            if same_file(target, source):
                raise ValueError(
                    f"{flag}: {target} is the input {kind} {source}: writing it would replace "
                    f"the data; write it elsewhere"
                )
    if out is not None and os.path.isdir(out):  # the diagrams: any PNG in the folder
        for kind, source in inputs:
            if source.lower().endswith(".png") and same_file(os.path.dirname(source) or ".", out):
                raise ValueError(f"--out: {out} holds the input {kind} {source}; write elsewhere")
    if write_state:
        for pat in [*(states or ()), *([file] if file else [])]:
            if _matches(write_state, pat):
                raise ValueError(
                    f"--write-state: {write_state} matches {pat!r}, the pattern of its inputs: "
                    f"an audit of that pattern would count these rows twice; write it elsewhere"
                )
