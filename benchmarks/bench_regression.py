"""Issue 11 "Speed": the regression metrics' update and the VarianceScaler fit on 1M points.

1. ``PITHistogram.update`` + ``IntervalCoverage.update`` on 1M Normal forecasts (float32;
   the PIT values and the ``(N, L)`` interval bounds computed beforehand, as a validation loop
   has them) against one ``torch.distributions.Normal(loc, scale).cdf(y)`` pass on the same
   tensors (target: the updates within 2x of it). Rows for one level and for the default four
   levels, with and without the value checks (``validate_args``), for bounds given as
   ``(N, L)`` tensors and for ``IntervalCoverage(family="normal")``, which reads ``(loc,
   scale)`` and scores every level's central interval in one pass.
2. ``VarianceScaler`` fit (``objective="nll"``, the closed form, and ``"crps"``) on 1M points
   on one thread (target < 50 ms), if torchcal.scaling has it.

Timings are the minimum of ``--repeats`` runs after a warm-up (the least disturbed by other
load on a shared machine), all on ``--threads`` threads (default 1); the ratios take the update
and the reference in turns (one of each per round), so that load hits both alike. Run: ``python benchmarks/bench_regression.py`` (about 20 s).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from scipy import stats

import torchcal.scaling
from torchcal.functional import pit_normal
from torchcal.metrics import IntervalCoverage, PITHistogram


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Minimum wall time in ms of ``fn()`` over ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def timed_against(fn: Callable[[], object], ref: Callable[[], object], repeats: int) -> float:
    """``fn``'s time over ``ref``'s, both the minimum of ``repeats`` calls taken in turns (one
    of each per round), so that load on a shared machine hits both alike."""
    fn(), ref()
    t_fn, t_ref = [], []
    for _ in range(repeats):
        for f, out in ((fn, t_fn), (ref, t_ref)):
            t0 = time.perf_counter()
            f()
            out.append(time.perf_counter() - t0)
    return min(t_fn) / min(t_ref)


def forecasts(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 ``(loc, scale, target)`` with the truth 1.5x wider than the forecast."""
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(n, generator=g)
    scale = 0.5 + torch.rand(n, generator=g)
    return loc, scale, loc + 1.5 * scale * torch.randn(n, generator=g)


def bench_updates(n: int, repeats: int) -> None:
    loc, scale, y = forecasts(n)

    def normal_cdf() -> None:
        torch.distributions.Normal(loc, scale).cdf(y)

    cdf = timed(normal_cdf, repeats)
    raw = timed(lambda: torch.distributions.Normal(loc, scale, validate_args=False).cdf(y), repeats)
    u = pit_normal(loc, scale, y)
    print(f"N = {n:,} Normal forecasts (float32), {torch.get_num_threads()} thread(s)")
    print(f"  Normal(loc, scale).cdf(y)                        {cdf:8.2f} ms  (reference)")
    print(f"  Normal(loc, scale, validate_args=False).cdf(y)   {raw:8.2f} ms")
    for levels in ((0.9,), (0.5, 0.8, 0.9, 0.95)):
        z = torch.tensor([stats.norm.ppf(0.5 + c / 2) for c in levels], dtype=torch.float32)
        lo, hi = loc[:, None] - scale[:, None] * z, loc[:, None] + scale[:, None] * z
        for validate in (True, False):
            pit_m = PITHistogram(10, validate_args=validate)
            cov_m = IntervalCoverage(levels, validate_args=validate)

            def both(pit_m=pit_m, cov_m=cov_m, lo=lo, hi=hi) -> None:
                pit_m.update(u)
                cov_m.update(lo, hi, y)

            t_pit = timed(lambda pit_m=pit_m: pit_m.update(u), repeats)
            t_both = timed(both, repeats)
            ratio = timed_against(both, normal_cdf, repeats)
            print(
                f"  PITHistogram + IntervalCoverage(L={len(levels)}) "
                f"validate_args={validate!s:5}  {t_both:8.2f} ms  "
                f"ratio {ratio:5.2f}x  (PITHistogram alone {t_pit:.2f} ms)"
            )
            # the forecast itself (loc, scale): every level's interval in one pass
            fast = IntervalCoverage(levels, family="normal", validate_args=validate)

            def both_fast(pit_m=pit_m, fast=fast) -> None:
                pit_m.update(u)
                fast.update(loc, scale, y)

            t_fast = timed(both_fast, repeats)
            ratio = timed_against(both_fast, normal_cdf, repeats)
            print(
                f"  PITHistogram + IntervalCoverage(L={len(levels)}, family='normal') "
                f"validate_args={validate!s:5}  {t_fast:8.2f} ms  ratio {ratio:5.2f}x"
            )


def bench_variance_scaler(n: int, repeats: int) -> None:
    scaler_cls = getattr(torchcal.scaling, "VarianceScaler", None)
    if scaler_cls is None:
        print("VarianceScaler: not available")
        return
    loc, scale, y = forecasts(n, seed=1)
    print(f"VarianceScaler fit on {n:,} points, {torch.get_num_threads()} thread(s)")
    for objective in ("nll", "crps"):
        scaler = scaler_cls(objective=objective)
        ms = timed(lambda scaler=scaler: scaler.fit(loc, scale, y), repeats)
        print(
            f"  objective={objective!r:7} {ms:8.2f} ms  s = {scaler.scale_factor:.4f} "
            f"(target < 50 ms; true s = 1.5)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bench_updates(args.n, args.repeats)
    bench_variance_scaler(args.n, args.repeats)


if __name__ == "__main__":
    main()
