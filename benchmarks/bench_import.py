"""Start-up cost of ``import torchcal`` against ``import torch``, in fresh interpreters.

Run: ``python benchmarks/bench_import.py`` (about a minute; ``--rounds 3`` for a smoke run).
Each round starts one fresh ``python -c "import ..."`` per statement, in an interleaved order
(a load spike hits every statement of its round), and the script prints, per statement, the
median wall time over the rounds, its spread (min-max) and the ratio of medians against
``import torch``. Target (issue 18): ``import torchcal`` within 1.3x ``import torch``.

The imports run from the repository root (``--repo`` for another checkout), so the
checkout's ``torchcal`` is the one imported.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

STATEMENTS = (
    ("import torch", None),
    ("import torchcal", 1.3),
    ("import torchcal.functional", 1.3),
    ("import torchcal.losses", None),
    ("import torchcal.metrics", None),
    ("import torchcal.scaling", None),
)


def wall_time(statement: str, repo: Path) -> float:
    """Seconds for a fresh interpreter to run ``statement`` and exit."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], cwd=repo, check=True)
    return time.perf_counter() - start


def run(rounds: int, repo: Path) -> None:
    times: dict[str, list[float]] = {s: [] for s, _ in STATEMENTS}
    for statement, _ in STATEMENTS:  # warm the file-system cache once
        wall_time(statement, repo)
    for r in range(rounds):
        order = STATEMENTS[r % len(STATEMENTS) :] + STATEMENTS[: r % len(STATEMENTS)]
        for statement, _ in order:
            times[statement].append(wall_time(statement, repo))
    base = statistics.median(times["import torch"])
    print(f"python {sys.version.split()[0]}, repo {repo}, {rounds} interleaved rounds")
    print(f"{'statement':<30} {'median s':>9} {'min-max s':>13} {'/ torch':>8}  target")
    for statement, target in STATEMENTS:
        ts = times[statement]
        med = statistics.median(ts)
        goal = f"<= {target}x" if target else ""
        print(
            f"{statement:<30} {med:>9.3f} {min(ts):>6.3f}-{max(ts):<6.3f} "
            f"{med / base:>7.2f}x  {goal}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median)")
    parser.add_argument(
        "--repo",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the checkout whose torchcal is imported (default: this one)",
    )
    args = parser.parse_args()
    run(args.rounds, args.repo.resolve())
