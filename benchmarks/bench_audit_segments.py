"""Benchmark ``torchcal audit --segments`` (issue 31's target: 100k rows x 3 segment columns
at depth 2 in <= 10 s from a file, <= 3 s through DuckDB, in bounded memory).

Run: ``python benchmarks/bench_audit_segments.py`` (``--rows 100000 400000``, ``--repeat 3``).
Writes ``p,y,lang,doc,length`` (5 languages, 4 document types, a numeric length cut into 4
quantile buckets: 1 + 13 + 56 segments), then for each road (the file through the streaming
reader, ``--engine duckdb``), ``--repeat`` times, one fresh child process runs
``main(["audit", FILE, ..., "--segments", "lang", "doc", "length"])`` timed around the call
(imports excluded: wall and CPU seconds) and reads its peak RSS beside the RSS after the
imports. Prints the medians. Two sizes show whether the memory grows with the rows (the
streaming road holds a chunk, the per-segment sums and each numeric column's distinct values
with their counts). The machine may be shared: CPU seconds are the steadier number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

CHILD = r"""
import contextlib, io, json, resource, sys, time
import torch
from torchcal.cli import main
path, engine = sys.argv[1], sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
args = ["audit", path, "--probs", "p", "--label", "y", "--segments", "lang", "doc", "length"]
if engine != "stream":
    args += ["--engine", engine]
w, c = time.perf_counter(), time.process_time()
with contextlib.redirect_stdout(io.StringIO()):
    code = main(args)
w, c = time.perf_counter() - w, time.process_time() - c
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"code": code, "wall": w, "cpu": c, "base_mb": base / 1024, "peak_mb": peak / 1024}))
"""


def write(path: str, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    p = rng.random(n)
    y = (rng.random(n) < p).astype(int)
    lang = np.array(["en", "de", "fr", "es", "it"])[rng.integers(0, 5, n)]
    doc = np.array(["chat", "email", "form", "memo"])[rng.integers(0, 4, n)]
    length = np.round(np.exp(5 + 0.8 * rng.standard_normal(n))).astype(int)
    with open(path, "w") as f:
        f.write("p,y,lang,doc,length\n")
        for row in zip(p.round(6), y, lang, doc, length):
            f.write(f"{row[0]},{row[1]},{row[2]},{row[3]},{row[4]}\n")


def run(path: str, engine: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, path, engine], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000, 400_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--engines", nargs="+", default=["stream", "duckdb"])
    args = ap.parse_args()
    d = tempfile.mkdtemp()
    print(
        f"{'rows':>8} {'road':>7} {'wall s':>7} {'cpu s':>7} {'RSS after imports':>18} {'peak RSS':>9}"
    )
    for n in args.rows:
        path = os.path.join(d, f"seg{n}.csv")
        write(path, n)
        for engine in args.engines:
            runs = [run(path, engine) for _ in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(
                f"{n:>8} {engine:>7} {med['wall']:>7.2f} {med['cpu']:>7.2f} "
                f"{med['base_mb']:>15.0f} MB {med['peak_mb']:>6.0f} MB"
            )
        os.remove(path)


if __name__ == "__main__":
    main()
