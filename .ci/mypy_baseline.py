"""mypy on torchcal/ against a baseline that only shrinks.

Runs mypy (configured in pyproject.toml) and compares the errors per file with
``.ci/mypy-baseline.txt`` (``<count> <file>`` lines). Exit 1 when any file has more errors than
its baseline (a new file: 0), naming it; when files improved, says so and asks to lower the
baseline with ``--update``, which only ever lowers numbers. ``--reset`` rewrites it from the
current count (only when merging branches whose counts moved in both directions).
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path

BASELINE = Path(__file__).with_name("mypy-baseline.txt")
ERROR = re.compile(r"^(?P<file>[^:\s]+\.py):\d+: error: ")


def current() -> tuple[collections.Counter[str], str]:
    run = subprocess.run(
        [sys.executable, "-m", "mypy"], capture_output=True, text=True, check=False
    )
    if run.returncode not in (0, 1):  # 2: mypy itself failed (a config or syntax error)
        sys.exit(f"mypy failed to run (exit {run.returncode}):\n{run.stdout}{run.stderr}")
    counts = collections.Counter(
        m["file"] for line in run.stdout.splitlines() if (m := ERROR.match(line))
    )
    return counts, run.stdout


def read_baseline() -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for line in BASELINE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            n, name = line.split(maxsplit=1)
            counts[name] = int(n)
    return counts


def write_baseline(counts: collections.Counter[str]) -> None:
    lines = ["# mypy errors per file (python .ci/mypy_baseline.py); numbers may only go down"]
    lines += [f"{n} {name}" for name, n in sorted(counts.items()) if n > 0]
    BASELINE.write_text("\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
    now, output = current()
    total = sum(now.values())
    if "--reset" in argv:
        write_baseline(now)
        print(f"mypy: baseline reset to {total} errors")
        return 0
    base = read_baseline()
    worse = {f: (base[f], n) for f, n in now.items() if n > base[f]}
    if worse:
        print(output)
        for f, (b, n) in sorted(worse.items()):
            print(f"mypy: {f}: {n} errors, baseline {b}")
        print(f"mypy: FAIL, {total} errors (baseline {sum(base.values())}): fix the new ones")
        return 1
    if "--update" in argv:
        write_baseline(collections.Counter({f: min(n, base[f]) for f, n in now.items()}))
        print(f"mypy: baseline lowered to {total} errors")
        return 0
    lower = sum(base.values()) - total
    note = f"; {lower} fewer: lower the baseline (--update)" if lower else ""
    print(f"mypy: {total} errors (baseline {sum(base.values())}){note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
