"""Benchmark ``torchcal audit`` on a large CSV against ``numpy.loadtxt`` reading the same file.

Run: ``python benchmarks/bench_audit.py`` (10M rows, ~250 MB, a few minutes on 2 shared
cores; ``--rows 1000000`` for a quicker run, ``--keep`` to keep the file). Writes
``id,domain,p_correct,correct`` (two domains; with ``--quoted-every K`` a fourth column
``note`` whose every K-th value is a quoted two-line text with a comma, the rest plain: the
quote-aware numpy path, as a file of judge rationales is read), then, ``--repeat`` times for each CSV engine
(pyarrow's streaming reader, the numpy fallback), one fresh child process times in a row

* ``torchcal audit FILE --probs p_correct --label correct --group domain --threshold 0.8``
  (``main([...])``, timed around the call: import time excluded), then reads its peak RSS;
* the reader alone (:func:`torchcal.audit.io.read_predictions`);
* ``numpy.loadtxt(path, delimiter=",", usecols=(2, 3), skiprows=1)`` (numeric columns only:
  the peer reads less than the audit, which also maps the domain names);

so each RATIO audit / loadtxt compares two runs of the same process on the same file a few
seconds apart. Prints rows/s (median over the repeats) and the median, best and worst ratios
audit / loadtxt and reader / loadtxt (issue 12's goal: audit >= 0.5; issue 17's: the read
rate with pyarrow >= 0.6), the peak RSS of the audit beside the RSS after the imports (streaming: the
difference is a chunk or two plus the O(groups x bins) state and the bounded sample, whatever
the file's size; loadtxt runs last, so its memory is not in the audit's peak). Threads: the
libraries' defaults (torch's intra-op threads, pyarrow's thread pool) unless ``--threads N``
(torch) or ``--arrow-threads N``; the numbers are printed. ``torchcal audit`` itself runs its
arithmetic on one torch thread (its ``--threads`` default: the per-chunk work is light, and on
a busy machine more threads made it several times slower). The machine may be shared and
noisy: read the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CHILD = r"""
import contextlib, io, resource, sys, time
import numpy as np, torch
path, engine, threads, arrow_threads, ncols = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
if threads:
    torch.set_num_threads(threads)
import torchcal.audit.io as tio
from torchcal.cli import main
tio.CSV_ENGINE = engine
try:
    import pyarrow
    if arrow_threads:
        pyarrow.set_cpu_count(arrow_threads)
    pa_threads = pyarrow.cpu_count()
except ImportError:
    pa_threads = 0
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["audit", path, "--probs", "p_correct", "--label", "correct",
                 "--group", "domain", "--threshold", "0.8", "--no-progress"])
t_audit = time.perf_counter() - t
assert code in (0, 1), code
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
n = sum(b.target.numel() for b in tio.read_predictions(
    path, preds=["p_correct"], label="correct", group="domain"))
t_read = time.perf_counter() - t
t = time.perf_counter()
if ncols == 4:
    np.loadtxt(path, delimiter=",", usecols=(2, 3), skiprows=1)
else:  # loadtxt cannot read quoted fields: time it on the same rows without the note column
    np.loadtxt(path + ".plain.csv", delimiter=",", usecols=(2, 3), skiprows=1)
t_np = time.perf_counter() - t
print(t_audit, t_read, t_np, base / 1024, peak / 1024, torch.get_num_threads(), pa_threads, n)
"""


def write_csv(path: str, rows: int, seed: int = 0, quoted_every: int = 0) -> None:
    """The benchmark file, written 1M rows at a time (and, with ``quoted_every``, the same rows
    without the note column beside it, for loadtxt)."""
    rng = np.random.default_rng(seed)
    names = np.array(["math", "open_qa"])
    files = [open(path, "w")] + ([open(path + ".plain.csv", "w")] if quoted_every else [])
    try:
        for k, f in enumerate(files):
            f.write("id,domain,p_correct,correct" + (",note\n" if quoted_every and not k else "\n"))
        for start in range(0, rows, 1_000_000):
            n = min(1_000_000, rows - start)
            p = rng.random(n)
            y = (rng.random(n) < p).astype(np.int64)
            dom = names[rng.integers(0, 2, n)]
            ids = range(start, start + n)
            lines = [f"{i},{d},{q:.6f},{c}" for i, d, q, c in zip(ids, dom, p, y)]
            if quoted_every:
                files[1].write("\n".join(lines) + "\n")
                note = ['"says: yes,\nsure"' if i % quoted_every == 0 else "ok" for i in ids]
                lines = [f"{a},{b}" for a, b in zip(lines, note)]
            files[0].write("\n".join(lines) + "\n")
    finally:
        for f in files:
            f.close()


def child(path: str, engine: str, threads: int, arrow_threads: int, ncols: int) -> list[float]:
    res = subprocess.run(
        [sys.executable, "-c", CHILD, path, engine, str(threads), str(arrow_threads), str(ncols)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [float(v) for v in res.stdout.split()[-8:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="child runs per engine (interleaved)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    ap.add_argument("--arrow-threads", type=int, default=0, help="pyarrow's (0: its default)")
    ap.add_argument("--keep", action="store_true", help="keep the generated CSV")
    ap.add_argument(
        "--quoted-every", type=int, default=0, metavar="K", help="a quoted 2-line note every K rows"
    )
    args = ap.parse_args()
    try:
        import pyarrow  # noqa: F401

        engines = ["pyarrow", "numpy"]
    except ImportError:
        engines = ["numpy"]
    fd, path = tempfile.mkstemp(suffix=".csv")
    os.close(fd)
    try:
        t = time.perf_counter()
        write_csv(path, args.rows, quoted_every=args.quoted_every)
        size = os.path.getsize(path) / 2**20
        print(f"wrote {args.rows:,} rows ({size:.0f} MB) in {time.perf_counter() - t:.1f} s")
        runs: dict[str, list[list[float]]] = {e: [] for e in engines}
        for _ in range(args.repeat):
            for e in engines:
                ncols = 5 if args.quoted_every else 4
                runs[e].append(child(path, e, args.threads, args.arrow_threads, ncols))
        report(runs, args.rows)
    finally:
        if args.keep:
            print(f"kept {path}")
        else:
            os.unlink(path)
            if args.quoted_every:
                os.unlink(path + ".plain.csv")


def report(runs: dict[str, list[list[float]]], rows: int) -> None:
    med = statistics.median
    first = next(iter(runs.values()))[0]
    print(f"threads: torch {first[5]:.0f}, pyarrow {first[6]:.0f}; {rows:,} rows")
    for e, rs in runs.items():
        assert all(int(r[7]) == rows for r in rs), "the reader lost rows"
        ratios = [r[2] / r[0] for r in rs]
        read_ratios = [r[2] / r[1] for r in rs]
        print(f"[{e}] over {len(rs)} runs (median rows/s)")
        print(f"  numpy.loadtxt      {rows / med(r[2] for r in rs):12,.0f} rows/s")
        print(f"  reader alone       {rows / med(r[1] for r in rs):12,.0f} rows/s")
        print(f"  torchcal audit     {rows / med(r[0] for r in rs):12,.0f} rows/s")
        print(
            f"  RATIO audit/loadtxt = {med(ratios):.2f} median, {max(ratios):.2f} best, "
            f"{min(ratios):.2f} worst  (goal >= 0.5)"
        )
        print(
            f"  RATIO reader/loadtxt = {med(read_ratios):.2f} median, {max(read_ratios):.2f} best, "
            f"{min(read_ratios):.2f} worst  (goal with pyarrow >= 0.6)"
        )
        print(
            f"  audit peak RSS {max(r[4] for r in rs):.0f} MB "
            f"(after imports {max(r[3] for r in rs):.0f} MB)"
        )


if __name__ == "__main__":
    main()
