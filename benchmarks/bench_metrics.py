"""Benchmark torchcal's streaming calibration metrics against torchmetrics in one process.

Run: ``python benchmarks/bench_metrics.py`` (about a minute on 2 CPU cores; ``--quick`` for a
smoke run). Prints, per case, torchcal's time/memory beside the peer's and the RATIO (the
machine is shared and noisy: read the ratios, not the seconds). Targets from issue 3:

* state bytes independent of N, <= 1 KB for ``CalibrationError`` at 15 bins;
* update + compute throughput >= 1.0x torchmetrics at C=10 and >= 1.5x at C=100
  (N=100k in 100 batches), for logits and for probabilities, with validation on (issue 9);
* ``compute()`` < 1 ms at 15 bins whatever N; classwise at C=100, N=100k < 50 ms;
* ``update`` <= 1.5x a bare ``softmax(logits).max(1)`` over the same batch;
* one ``update`` at B=256, C=10 (a validation loop's batch) costs no more than torchmetrics'
  ``MulticlassCalibrationError.update`` (issue 18), for logits and for probabilities,
  validation on in both (ratio = torchcal / torchmetrics, median of interleaved rounds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# measure the checkout this file lives in, not whichever torchcal the environment installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torchmetrics.classification import MulticlassCalibrationError  # noqa: E402

from torchcal.metrics import CalibrationError, ClasswiseCalibrationError  # noqa: E402


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Best (minimum) wall time of ``repeat`` runs (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def paired(fa: Callable[[], object], fb: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Best times of ``fa`` and ``fb`` measured alternately (a load spike hits both)."""
    fa()
    fb()
    ta, tb = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        fa()
        ta.append(time.perf_counter() - t)
        t = time.perf_counter()
        fb()
        tb.append(time.perf_counter() - t)
    return min(ta), min(tb)


def state_bytes(metric: torch.nn.Module) -> int:
    total = 0
    for name in metric._defaults:
        v = getattr(metric, name)
        vals = v if isinstance(v, list) else [v]
        total += sum(t.numel() * t.element_size() for t in vals)
    return total


def make_batches(
    n: int, batches: int, classes: int, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=g) * 2
    target = torch.randint(0, classes, (n,), generator=g)
    return list(zip(logits.chunk(batches), target.chunk(batches)))


def run(quick: bool) -> None:
    torch.set_num_threads(1)  # the CI box is shared: oversubscribed intra-op threads stall
    repeat = 3 if quick else 7
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; best of {repeat}")
    print()

    # 1. state size -----------------------------------------------------------------------
    print("== state size after N samples (bytes) ==")
    print(f"{'N':>9} {'torchcal':>10} {'torchmetrics':>13} {'ratio':>8}")
    for n in (10_000, 100_000):
        data = make_batches(n, 10, 10)
        ours = CalibrationError(n_bins=15)
        peer = MulticlassCalibrationError(num_classes=10, n_bins=15)
        for x, y in data:
            ours.update(x, y)
            peer.update(x, y)
        a, b = state_bytes(ours), state_bytes(peer)
        print(f"{n:>9} {a:>10} {b:>13} {a / b:>8.4f}   (target: torchcal <= 1024, constant)")
    print()

    # 2. throughput ------------------------------------------------------------------------
    print("== update + compute, N=100k in 100 batches (float32; validation on in both) ==")
    print(
        f"{'C':>5} {'input':>7} {'torchcal ms':>12} {'torchmetrics ms':>16} {'speed-up':>9}  target"
    )
    for classes, target, inp in (
        (10, 1.0, "logits"),
        (10, 1.0, "probs"),
        (100, 1.5, "logits"),
        (100, 1.5, "probs"),
    ):
        data = make_batches(100_000, 100, classes)
        if inp == "probs":  # torchmetrics takes values in [0, 1] as probabilities as they are
            data = [(x.softmax(1), y) for x, y in data]

        def ours_run(data=data, inp=inp) -> None:
            m = CalibrationError(n_bins=15, input=inp)
            for x, y in data:
                m.update(x, y)
            m.compute()

        def peer_run(data=data, classes=classes) -> None:
            m = MulticlassCalibrationError(num_classes=classes, n_bins=15)
            for x, y in data:
                m.update(x, y)
            m.compute()

        a, b = paired(ours_run, peer_run, repeat)
        print(
            f"{classes:>5} {inp:>7} {a * 1e3:>12.2f} {b * 1e3:>16.2f} {b / a:>8.2f}x  >= {target}x"
        )
    print()

    # 3. compute() time --------------------------------------------------------------------
    print("== compute() time (ms), 15 bins ==")
    for n in (10_000, 1_000_000):
        m = CalibrationError(n_bins=15)
        for x, y in make_batches(n, 10, 10):
            m.update(x, y)

        def comp(m=m) -> None:
            m._computed = None
            m.compute()

        print(f"  CalibrationError N={n:>9}: {best_of(comp, 20) * 1e3:7.3f} ms  (target < 1 ms)")
    m = ClasswiseCalibrationError(num_classes=100, n_bins=15)
    for x, y in make_batches(100_000, 100, 100):
        m.update(x, y)

    def comp_cw(m=m) -> None:
        m._computed = None
        m.compute()

    print(
        f"  ClasswiseCalibrationError C=100 N=100k: {best_of(comp_cw, 10) * 1e3:7.3f} ms "
        f"(target < 50 ms)"
    )
    print()

    # 4. update vs the memory-traffic floor ------------------------------------------------
    print("== update() vs bare softmax(logits).max(1) on the same batch ==")
    print(f"{'batch':>12} {'update ms':>10} {'floor ms':>9} {'ratio':>7}  (validate_args=False)")
    for n, classes in ((10_000, 10), (10_000, 100), (100_000, 100)):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(n, classes, generator=g)
        y = torch.randint(0, classes, (n,), generator=g)
        m = CalibrationError(n_bins=15, validate_args=False)
        upd, floor = paired(
            lambda m=m, x=x, y=y: m.update(x, y), lambda x=x: torch.softmax(x, 1).max(1), repeat * 3
        )
        print(
            f"{n:>7}x{classes:<4} {upd * 1e3:>10.3f} {floor * 1e3:>9.3f} {upd / floor:>6.2f}x"
            f"  (target <= 1.5x)"
        )
    for n, classes in ((10_000, 100),):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(n, classes, generator=g)
        y = torch.randint(0, classes, (n,), generator=g)
        m = CalibrationError(n_bins=15)
        upd, floor = paired(
            lambda m=m, x=x, y=y: m.update(x, y), lambda x=x: torch.softmax(x, 1).max(1), repeat * 3
        )
        print(
            f"{n:>7}x{classes:<4} {upd * 1e3:>10.3f} {floor * 1e3:>9.3f} {upd / floor:>6.2f}x"
            f"  (validate_args=True: NaN + label-range checks)"
        )


def per_update(
    fa: Callable[[], object], fb: Callable[[], object], rounds: int
) -> tuple[float, float]:
    """Median seconds per call of ``fa`` and ``fb`` over interleaved rounds of 200 calls."""
    fa()
    fb()
    ta, tb = [], []
    for _ in range(rounds):
        for f, out in ((fa, ta), (fb, tb)):
            t = time.perf_counter()
            for _ in range(200):
                f()
            out.append((time.perf_counter() - t) / 200)
    return statistics.median(ta), statistics.median(tb)


def run_small(quick: bool) -> None:
    torch.set_num_threads(1)
    rounds = 5 if quick else 15
    print("== one update at B=256 (validation on in both; ratio: torchcal / torchmetrics) ==")
    print(f"{'case':>22} {'torchcal us':>12} {'torchmetrics us':>16} {'ratio':>7}  target")
    g = torch.Generator().manual_seed(2)
    for classes in (10, 100):
        x = torch.randn(256, classes, generator=g) * 2
        y = torch.randint(0, classes, (256,), generator=g)
        for inp in ("logits", "probs"):
            xi = x if inp == "logits" else x.softmax(1)
            ours = CalibrationError(n_bins=15, input=inp)
            peer = MulticlassCalibrationError(num_classes=classes, n_bins=15)

            def peer_update(peer=peer, xi=xi, y=y) -> None:
                peer.update(xi, y)
                if len(peer.confidences) > 1000:  # its cat states grow: keep memory flat
                    peer.reset()

            a, b = per_update(lambda o=ours, xi=xi, y=y: o.update(xi, y), peer_update, rounds)
            goal = "<= 1.0x" if classes == 10 else ""
            print(
                f"{f'C={classes} {inp}':>22} {a * 1e6:>12.1f} {b * 1e6:>16.1f} "
                f"{a / b:>6.2f}x  {goal}"
            )
    print()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    run_small(args.quick)
    run(args.quick)
