"""Time torchcal's scoring rules against peers in one process; print a table with ratios.

Cases (float32, forward + backward unless marked "fwd"; median of --reps runs after a warm-up):

* ``crps_ensemble`` (fair, O(M log M) sort) against a pairwise |x_i - x_j| torch version
  (written here, chunked over rows to bound memory; timed on at most 1e8 pairs and scaled
  by the row count, it is linear in rows) at B=10k, M=100 and B=1k, M=1000;
  against scoringrules' torch backend (``backend="torch"``; its "fair" is pairwise, its
  "pwm" sorts) and against properscoring (numba if installed, else its numpy fallback;
  forward only, float64, on max(10, 1e9/M^3) rows).
* Classification at N=65,536, C=1000: ``log_score`` and ``brier_score`` against
  ``F.cross_entropy``, and a plain autograd Brier score for reference.

ratio = torchcal time / peer time (< 1: torchcal is faster). torchcal runs with its default
input validation (NaN/Inf checks, one host sync each); a "(checks off)" row shows the cost.

    python benchmarks/bench_scoring.py           # full run (~1-2 min)
    python benchmarks/bench_scoring.py --quick   # smaller sizes, fewer reps
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

import torchcal.functional as TF

SLOW_S = 2.0  # a peer call slower than this is timed once (warm-up included)


def compare(
    ours: Callable[[], object], peer: Callable[[], object], reps: int
) -> tuple[float, float]:
    """Median times of ``ours`` and ``peer``, interleaved call by call after a warm-up.

    Interleaving keeps both sides under the same background load (the machine is shared).
    A peer whose warm-up call takes longer than ``SLOW_S`` (the O(M^2) and numpy peers at
    full size) is not repeated: its single time includes warm-up, which flatters it a bit.
    """
    ours()
    t0 = time.perf_counter()
    peer()
    first_peer = time.perf_counter() - t0
    t_ours, t_peer = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        ours()
        t_ours.append(time.perf_counter() - t0)
        if first_peer <= SLOW_S:
            t0 = time.perf_counter()
            peer()
            t_peer.append(time.perf_counter() - t0)
    return statistics.median(t_ours), statistics.median(t_peer) if t_peer else first_peer


def fwd_bwd(loss_fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> Callable[[], None]:
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]

    def run() -> None:
        for x in leaves:
            x.grad = None
        loss_fn(*leaves).backward()

    return run


def row(
    case: str,
    ours: Callable[[], object],
    peer_name: str,
    peer: Callable[[], object],
    reps: int,
    peer_scale: float = 1.0,
) -> None:
    """Print one line; ``peer_scale`` scales a peer timed on a fraction of the rows."""
    t_ours, t_peer = compare(ours, peer, reps)
    t_peer *= peer_scale
    print(
        f"{case:<40} {t_ours * 1e3:10.2f} {peer_name:<28} {t_peer * 1e3:10.2f} "
        f"{t_ours / t_peer:8.3f}",
        flush=True,
    )


def pairwise_crps_fair(
    samples: torch.Tensor, target: torch.Tensor, max_elems: int = 2**25
) -> torch.Tensor:
    """Reference fair CRPS with the O(M^2) pair sum, in row chunks of <= max_elems pairs."""
    b, m = samples.shape
    chunk = max(1, max_elems // (m * m))
    total = samples.new_zeros(())
    for s in range(0, b, chunk):
        x, y = samples[s : s + chunk], target[s : s + chunk]
        e1 = (x - y[:, None]).abs().mean(-1)
        e2 = (x[:, :, None] - x[:, None, :]).abs().sum((-1, -2)) / (2 * m * (m - 1))
        total = total + (e1 - e2).sum()
    return total / b


def bench_crps_ensemble(quick: bool, reps: int) -> None:
    g = torch.Generator().manual_seed(0)
    sizes = [(2_000, 100), (200, 1000)] if quick else [(10_000, 100), (1_000, 1000)]
    try:
        import scoringrules as sr
    except ImportError:  # optional peer
        sr = None
    try:
        import properscoring as ps
    except ImportError:
        ps = None
    for b, m in sizes:
        x = torch.randn(b, m, generator=g) + 3.0
        y = torch.randn(b, generator=g) + 3.0
        tag = f"crps_ensemble B={b} M={m}"
        ours = fwd_bwd(lambda s, t: TF.crps_ensemble(s, t), x, y)

        def ours_unchecked(run=ours) -> None:
            with TF.validation_enabled(False):
                run()

        # the chunked pairwise peer is linear in rows: time it on <= 1e8 pairs and scale
        k = min(b, max(1, 10**8 // (m * m)))
        pairwise = fwd_bwd(pairwise_crps_fair, x[:k], y[:k])
        name = "pairwise torch (fair)" + ("" if k == b else f" x{b // k}")
        row(tag, ours, name, pairwise, reps, peer_scale=b / k)
        if sr is not None:
            if b * m * m <= 10**8:  # scoringrules' fair is unchunked M x M per row
                srf = fwd_bwd(
                    lambda s, t: sr.crps_ensemble(t, s, estimator="fair", backend="torch").mean(),
                    x,
                    y,
                )
                row(tag, ours, "scoringrules torch fair", srf, reps)
            srp = fwd_bwd(
                lambda s, t: sr.crps_ensemble(t, s, estimator="pwm", backend="torch").mean(), x, y
            )
            row(tag, ours, "scoringrules torch pwm", srp, reps)
            row(tag + " (checks off)", ours_unchecked, "scoringrules torch pwm", srp, reps)
        if ps is not None:
            # properscoring without numba falls back to a slow numpy loop: use fewer rows
            k = min(b, max(10, 10**9 // m**3))
            xs, ys = x[:k].contiguous(), y[:k].contiguous()
            xn, yn = xs.double().numpy(), ys.double().numpy()
            row(
                f"crps_ensemble B={k} M={m} nrg fwd",
                lambda a=xs, t=ys: TF.crps_ensemble(a, t, estimator="nrg"),
                "properscoring (fwd, f64)",
                lambda a=xn, t=yn: np.mean(ps.crps_ensemble(t, a)),
                reps,
            )


def bench_classification(quick: bool, reps: int) -> None:
    g = torch.Generator().manual_seed(1)
    n, c = (8_192, 1000) if quick else (65_536, 1000)
    logits = torch.randn(n, c, generator=g)
    target = torch.randint(0, c, (n,), generator=g)
    tag = f"N={n} C={c}"

    def plain_brier(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(z, dim=1)
        return (p - F.one_hot(t, c).to(p.dtype)).square().sum(1).mean()

    ce = fwd_bwd(lambda z, t: F.cross_entropy(z, t), logits, target)
    brier = fwd_bwd(lambda z, t: TF.brier_score(z, t), logits, target)
    row(
        f"log_score {tag}",
        fwd_bwd(lambda z, t: TF.log_score(z, t), logits, target),
        "F.cross_entropy",
        ce,
        reps,
    )
    row(f"brier_score {tag}", brier, "F.cross_entropy", ce, reps)
    row(
        f"brier_score {tag}",
        brier,
        "plain autograd Brier",
        fwd_bwd(plain_brier, logits, target),
        reps,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 reps")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    reps = args.reps or (3 if args.quick else 5)
    print(
        f"torch {torch.__version__}, threads={torch.get_num_threads()}, reps={reps} "
        f"(median), float32; times in ms; ratio = torchcal / peer"
    )
    print(f"{'case':<40} {'torchcal':>10} {'peer':<28} {'peer':>10} {'ratio':>8}")
    bench_crps_ensemble(args.quick, reps)
    bench_classification(args.quick, reps)


if __name__ == "__main__":
    main()
