"""Benchmark ``torchcal audit --from lm-eval`` against Python's ``json.loads`` parsing the same
``samples_*.jsonl`` (docs/design.md section 6h; issue 32's goal: read and audit in no more time
than ``json.loads`` alone takes, ratio <= 1).

Run: ``python benchmarks/bench_lm_eval.py`` (100k documents, ~160 MB of JSON lines in four
tasks shaped as lm-eval 0.4 writes them: the document, a ~130-character prompt repeated per
choice in ``arguments``, ``resps``/``filtered_resps`` as strings, hashes, per-document
metrics; ``--docs 20000`` for a quicker run, ``--keep DIR`` to keep the files and reuse them
on the next run). Then, ``--repeat`` times in the same process, alternating:

* ``json``: ``json.loads`` of every line of every file (opened in binary, read line by line:
  what a user's own script pays at least);
* ``read``: :func:`torchcal.integrations._lm_eval_samples.read_samples` (the reader alone);
* ``audit``: :func:`torchcal.integrations.lm_eval.audit_samples` (read, the ``norm`` rule,
  the audit with its verdict per task and the temperature cross-fitted per task: what
  ``torchcal audit --from lm-eval DIR --rule norm`` computes before writing its files, on
  ``--threads`` torch threads, 1 as the CLI's default).

Prints, in wall seconds and in this process's CPU seconds (``time.process_time``: the
steadier on a loaded machine), the median over the repeats, MB/s and the ratios audit / json
and read / json (median, best, worst of the paired runs, and fastest / fastest). The machine
may be shared and noisy: read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

DATE = "2026-01-02T03-04-05.123456"
TASKS = ("hellaswag_like", "arc_like", "mmlu_like", "piqa_like")
WORDS = "the of a model answer question which is most likely to be true when given context".split()


def _text(rng: np.random.Generator, n_words: int) -> str:
    return " ".join(rng.choice(WORDS, size=n_words))


def write_run(d: Path, docs: int, seed: int = 0) -> int:
    """Write ``docs`` documents over :data:`TASKS` and the run's results file; returns bytes."""
    rng = np.random.default_rng(seed)
    size = 0
    per = docs // len(TASKS)
    for t, task in enumerate(TASKS):
        k = 2 if task == "piqa_like" else 4
        lines = []
        for i in range(per if t < len(TASKS) - 1 else docs - per * (len(TASKS) - 1)):
            choices = [_text(rng, int(rng.integers(3, 12))) for _ in range(k)]
            z = rng.normal(size=k)
            gold = int(rng.choice(k, p=np.exp(z) / np.exp(z).sum()))  # softmax(z) is the truth
            ctx = "Question: " + _text(rng, 18) + "\nAnswer:"
            lls = [len(c) * (zj / 8 - 0.2) for zj, c in zip(z, choices, strict=True)]
            resps = [[str(x), str(bool(j == gold))] for j, x in enumerate(lls)]
            rec = {
                "doc_id": i,
                "doc": {"query": ctx, "choices": choices, "gold": gold, "id": f"{task}-{i}"},
                "target": str(gold),
                "arguments": {
                    f"gen_args_{j}": {"arg_0": ctx, "arg_1": " " + c} for j, c in enumerate(choices)
                },
                "resps": [[r] for r in resps],
                "filtered_resps": resps,
                "filter": "none",
                "metrics": ["acc", "acc_norm"],
                "doc_hash": hashlib.sha256(ctx.encode()).hexdigest(),
                "prompt_hash": hashlib.sha256(ctx[::-1].encode()).hexdigest(),
                "target_hash": hashlib.sha256(str(gold).encode()).hexdigest(),
                "acc": float(int(np.argmax(lls)) == gold),
                "acc_norm": float(
                    int(np.argmax(np.array(lls) / [len(c) for c in choices])) == gold
                ),
            }
            lines.append(json.dumps(rec))
        data = ("\n".join(lines) + "\n").encode()
        (d / f"samples_{task}_{DATE}.jsonl").write_bytes(data)
        size += len(data)
    configs = {task: {"task": task, "target_delimiter": " "} for task in TASKS}
    (d / f"results_{DATE}.json").write_text(json.dumps({"configs": configs}))
    return size


def time_json(d: Path) -> None:
    for f in sorted(d.glob("samples_*.jsonl")):
        with open(f, "rb") as fh:
            for line in fh:
                json.loads(line)


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of ``fn()``."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def summary(rows: dict[str, list[float]], size: int, what: str) -> None:
    for name, secs in rows.items():
        med = statistics.median(secs)
        runs = ", ".join(f"{x:.3f}" for x in secs)
        print(f"{what} {name:>5}: {med:.3f} s median ({size / 1e6 / med:.0f} MB/s), runs {runs}")
    for name in ("audit", "read"):
        ratios = [a / j for a, j in zip(rows[name], rows["json"], strict=True)]
        print(
            f"{what} ratio {name} / json.loads: median {statistics.median(ratios):.3f}, best "
            f"{min(ratios):.3f}, worst {max(ratios):.3f}; fastest run / fastest json.loads "
            f"{min(rows[name]) / min(rows['json']):.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", metavar="DIR", help="write (and keep) the files here")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (the CLI's --threads default: 1)"
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from torchcal.integrations._lm_eval_samples import _loads, read_samples
    from torchcal.integrations.lm_eval import audit_samples

    d = Path(args.keep or tempfile.mkdtemp())
    d.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    if args.keep and (d / f"results_{DATE}.json").is_file():  # reuse the kept files
        size = sum(f.stat().st_size for f in d.glob("samples_*.jsonl"))
        print(f"reusing {d}: {size / 1e6:.1f} MB")
    else:
        size = write_run(d, args.docs)
        print(
            f"wrote {args.docs:,} documents, {size / 1e6:.1f} MB in {time.perf_counter() - t:.1f} s"
        )
    print(f"parser: {_loads().__module__}; torch threads {torch.get_num_threads()}")
    audit_samples(d, rule="norm")  # warm-up (first-call imports)
    wall: dict[str, list[float]] = {"json": [], "read": [], "audit": []}
    cpu: dict[str, list[float]] = {"json": [], "read": [], "audit": []}
    out: list[Any] = []
    runs = {
        "json": lambda: time_json(d),
        "read": lambda: read_samples(d),
        "audit": lambda: out.append(audit_samples(d, rule="norm")),
    }
    for _ in range(args.repeat):
        for name, fn in runs.items():
            w, c = timed(fn)
            wall[name].append(w)
            cpu[name].append(c)
    summary(wall, size, "wall")
    summary(cpu, size, "cpu ")
    r = out[-1]
    temps = (r.temperature or {}).get("group_T")
    print(f"verdict {r.verdict}; T per task {temps}")


if __name__ == "__main__":
    main()
