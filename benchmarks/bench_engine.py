"""Benchmark the audit of Parquet files through DuckDB against the in-process pyarrow reader.

Run: ``python benchmarks/bench_engine.py`` (10^8 rows; ``--rows 10000000`` for a quicker run).
Writes ``--rows`` rows of ``p`` (float64 P(y = 1)), ``y`` (int8 label) and ``g`` (four
groups, dictionary-encoded) as Parquet files of ``--file-rows`` rows each, generated chunk by
chunk (memory stays one chunk), into a temporary folder deleted at the end (``--keep`` keeps
it). Then, ``--repeat`` times in turn (interleaved), one fresh child process per measurement:

* **duckdb**: ``torchcal audit 'DIR/part-*.parquet' --probs p --label y --group g
  --threshold 0.8 --engine duckdb`` (``main([...])``): one query bins and sums in DuckDB;
* **pyarrow**: the streaming audit of the same files in process, as ``torchcal audit FILE``
  runs it: :func:`torchcal.audit.io.read_predictions` (pyarrow's Parquet reader, by row
  groups) into one :class:`torchcal.audit.Auditor`, then the same report;
* **memory** (``--memory``): ``--engine memory`` (pyarrow batches into the state in process).

Each child times the call (imports excluded) and reads its peak RSS; printed: rows/s (median
and spread over the repeats), the ratio duckdb / pyarrow (median of the per-repeat ratios) and
the peak RSS above the RSS after the imports. Threads: DuckDB's default (all cores); the
Auditor's torch arithmetic on one thread (``torchcal audit``'s default), pyarrow's pool as is.
The machine may be shared and loaded: read the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CHILD = r"""
import contextlib, io, resource, sys, time
import torch
kind, glob = sys.argv[1], sys.argv[2]
from torchcal.cli import main
import torchcal.engines, torchcal.audit.engine_input, duckdb  # imports outside the timing
from torchcal.audit import Auditor
from torchcal.audit.io import read_predictions
import glob as g_
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cols = ["--probs", "p", "--label", "y", "--group", "g", "--threshold", "0.8"]
t = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    if kind == "pyarrow":
        torch.set_num_threads(1)
        a, names = Auditor(input="probs", n_bins=10), []
        for path in sorted(g_.glob(glob)):
            for b in read_predictions(path, preds=["p"], label="y", group="g"):
                a.update(b.preds, b.target, b.groups)
                names = b.group_names
        r = a.report(group_names=names, threshold=0.8)
        code = 0 if r.verdict == "pass" else 1
    else:
        code = main(["audit", glob, *cols, "--engine", kind])
dt = time.perf_counter() - t
assert code in (0, 1), code
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(dt, base, peak)
"""


def write_files(directory: str, rows: int, file_rows: int, seed: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    names = pa.array(["math", "open_qa", "code", "chat"])
    done, i = 0, 0
    while done < rows:
        n = min(file_rows, rows - done)
        p = rng.random(n)
        y = (rng.random(n) < p**1.1).astype(np.int8)
        g = pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 4, n).astype(np.int8)), names)
        t = pa.table({"p": p, "y": y, "g": g})
        pq.write_table(t, os.path.join(directory, f"part-{i:05d}.parquet"), row_group_size=1 << 20)
        done += n
        i += 1
    return i


def run_child(kind: str, glob: str) -> tuple[float, float]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind, glob], capture_output=True, text=True, env=env
    )
    if out.returncode:
        raise SystemExit(f"{kind} child failed:\n{out.stderr}")
    dt, base, peak = map(float, out.stdout.split()[-3:])
    return dt, (peak - base) / 1024  # MiB above the imports (ru_maxrss is KiB on Linux)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10**8)
    ap.add_argument("--file-rows", type=int, default=5 * 10**6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory", action="store_true", help="also time --engine memory")
    ap.add_argument("--keep", action="store_true", help="keep the Parquet files")
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="torchcal-bench-engine-")
    try:
        t = time.perf_counter()
        files = write_files(d, args.rows, args.file_rows, args.seed)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(
            f"wrote {args.rows:,} rows in {files} Parquet files ({size / 2**20:.0f} MiB) "
            f"in {time.perf_counter() - t:.1f} s; cores: {os.cpu_count()}, "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        glob = os.path.join(d, "part-*.parquet")
        kinds = ["duckdb", "pyarrow"] + (["memory"] if args.memory else [])
        res: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
        for _ in range(args.repeat):
            for k in kinds:
                res[k].append(run_child(k, glob))
        for k in kinds:
            rates = [args.rows / dt for dt, _ in res[k]]
            mem = max(m for _, m in res[k])
            print(
                f"{k:8s} {statistics.median(rates) / 1e6:8.1f} M rows/s "
                f"(min {min(rates) / 1e6:.1f}, max {max(rates) / 1e6:.1f}; "
                f"{statistics.median(dt for dt, _ in res[k]):.1f} s)  peak RSS +{mem:.0f} MiB"
            )
        ratios = [b[0] / a[0] for a, b in zip(res["duckdb"], res["pyarrow"], strict=True)]
        print(
            f"RATIO duckdb / pyarrow: median {statistics.median(ratios):.1f}x "
            f"(min {min(ratios):.1f}x, max {max(ratios):.1f}x) over {args.repeat} repeats"
        )
    finally:
        if args.keep:
            print(f"kept {d}")
        else:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
