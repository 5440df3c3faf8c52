"""Per-call cost of every torchcal loss beside the torch call or plain torch formula it replaces.

For each loss in ``torchcal.losses.__all__`` (the script fails if one has no case here) and
each size ``(B, C)`` in 256 x 10, 128 x 1000, 4096 x 100: the time of one forward + backward
call of the loss Module, with the default validation and with
``torchcal.functional.validation_enabled(False)``, divided by the time of the named reference
(``F.cross_entropy``, ``F.gaussian_nll_loss`` or a plain torch formula written below, what a
user would type). One thread, the same tensors; each round times a block of calls of every
variant back to back (blocks sized to about ``--block-ms`` for the reference, the order
rotated from round to round) and the ratio is the median over ``--rounds`` (>= 7) rounds of
that round's ratio, which a machine whose speed drifts does not bias; each row is measured
``--runs`` times (default 3), printed as the median and the range of those runs. The first
row, the reference against itself, shows the harness's own error (it should read 1.00x); the
second, ``nn.CrossEntropyLoss`` against ``F.cross_entropy``, what torch's own Module shell costs
(every torchcal loss is a Module timed against a function).

Shapes: classification losses get logits ``(B, C)`` and class indices ``(B,)``. The
real-valued losses read ``(B, C)`` as the batch shape of the forecast (``B * C`` scores),
except the ensemble CRPS (``B`` items of ``C`` members), the energy score (``B`` items of 8
members in ``min(C, 100)`` dimensions) and the quantile loss (``(B, C)`` items at 3 levels).

Targets (issue 18, default validation, 256 x 10 and 128 x 1000): LogScoreLoss <= 1.15x
F.cross_entropy, every other loss <= 1.1x its plain formula. A row reads ``ok`` when every
run is within its target, ``MISS`` when the median of the runs is over it, and ``line`` when
the runs straddle it (see :func:`verdict`); the last lines list the rows on the line and
the misses.

    python benchmarks/bench_hotpath.py                  # all losses, all sizes
    python benchmarks/bench_hotpath.py --only Brier     # losses whose name contains "Brier"
    python benchmarks/bench_hotpath.py --rounds 91 --sizes 256x10
    python benchmarks/bench_hotpath.py --clock cpu       # thread CPU time (a loaded machine)

torchcal is imported from the current directory (run it from a checkout's root to measure
that checkout).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchcal.losses as L  # noqa: E402
from torchcal.functional import validation_enabled  # noqa: E402

SIZES = ((256, 10), (128, 1000), (4096, 100))
TARGETS = {"LogScoreLoss": 1.15}  # every other loss: DEFAULT_TARGET
DEFAULT_TARGET = 1.1
TARGET_SIZES = ((256, 10), (128, 1000))


@dataclass
class Case:
    loss: str  # the torchcal.losses name
    reference: str  # what the ratio is against
    make: Callable[[int, int, torch.Generator], tuple[list[torch.Tensor], list[torch.Tensor]]]
    ours: Callable[..., torch.Tensor]  # (inputs..., targets...) -> scalar
    theirs: Callable[..., torch.Tensor]


# ------------------------------------------------------------------ inputs


def _class_inputs(b: int, c: int, g: torch.Generator):
    logits = torch.randn(b, c, generator=g) * 2.0
    target = torch.randint(0, c, (b,), generator=g)
    return [logits], [target]


def _loc_scale_inputs(b: int, c: int, g: torch.Generator):
    loc = torch.randn(b, c, generator=g)
    scale = torch.rand(b, c, generator=g) + 0.5
    target = torch.randn(b, c, generator=g)
    return [loc, scale], [target]


def _ensemble_inputs(b: int, c: int, g: torch.Generator):
    return [torch.randn(b, c, generator=g)], [torch.randn(b, generator=g)]


def _energy_inputs(b: int, c: int, g: torch.Generator):
    d = min(c, 100)
    return [torch.randn(b, 8, d, generator=g)], [torch.randn(b, d, generator=g)]


def _interval_inputs(b: int, c: int, g: torch.Generator):
    centre = torch.randn(b, c, generator=g)
    half = torch.rand(b, c, generator=g) + 0.1
    return [centre - half, centre + half], [torch.randn(b, c, generator=g)]


LEVELS = (0.1, 0.5, 0.9)


def _quantile_inputs(b: int, c: int, g: torch.Generator):
    pred = torch.sort(torch.randn(b, c, len(LEVELS), generator=g), dim=-1).values
    return [pred], [torch.randn(b, c, generator=g)]


# ------------------------------------------------------------------ plain torch formulas


def plain_brier(z, y):
    p = torch.softmax(z, dim=1)
    onehot = F.one_hot(y, z.shape[1]).to(p.dtype)
    return (p - onehot).square().sum(dim=1).mean()


def plain_spherical(z, y):
    p = torch.softmax(z, dim=1)
    p_y = p.gather(1, y.unsqueeze(1)).squeeze(1)
    return (1.0 - p_y / torch.linalg.vector_norm(p, dim=1)).mean()


def plain_rps(z, y):
    p = torch.softmax(z, dim=1)
    onehot = F.one_hot(y, z.shape[1]).to(p.dtype)
    diff = (p.cumsum(dim=1) - onehot.cumsum(dim=1))[:, :-1]
    return diff.square().sum(dim=1).mean()


def plain_focal(z, y, gamma=2.0):
    log_p = F.log_softmax(z, dim=1).gather(1, y.unsqueeze(1)).squeeze(1)
    return (-((1.0 - log_p.exp()) ** gamma) * log_p).mean()


def _plain_confidence(z, y):
    p = torch.softmax(z, dim=1)
    conf, pred = p.max(dim=1)
    return conf, (pred == y).to(p.dtype)


def plain_mmce(z, y, width=0.4):
    r, o = _plain_confidence(z, y)
    a = o - r
    kernel = torch.exp(-(r.unsqueeze(0) - r.unsqueeze(1)).abs() / width)
    return (a.unsqueeze(0) * a.unsqueeze(1) * kernel).sum() / r.numel() ** 2


def plain_soft_binned_ece(z, y, bins=15, temperature=0.01):
    r, o = _plain_confidence(z, y)
    centres = (torch.arange(bins, dtype=r.dtype) + 0.5) / bins
    u = torch.softmax(-(r.unsqueeze(1) - centres).square() / temperature, dim=1)
    counts = u.sum(dim=0)
    gaps = ((o - r).unsqueeze(1) * u).sum(dim=0)
    return (gaps.square() / counts.clamp_min(1e-30)).sum() / r.numel()


def plain_confidence_penalty(z, beta=1.0):
    log_p = F.log_softmax(z, dim=1)
    return beta * (log_p.exp() * log_p).sum(dim=1).mean()


def plain_dca(z, y):
    r, o = _plain_confidence(z, y)
    return (r.mean() - o.mean()).abs()


def plain_mdca(z, y):
    p = torch.softmax(z, dim=1)
    freq = F.one_hot(y, z.shape[1]).to(p.dtype).mean(dim=0)
    return (p.mean(dim=0) - freq).abs().mean()


_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)


def plain_crps_normal(mu, sigma, y):
    z = (y - mu) / sigma
    pdf = torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))
    return (sigma * (z * (2.0 * cdf - 1.0) + 2.0 * pdf - _INV_SQRT_PI)).mean()


def plain_crps_ensemble(x, y):
    m = x.shape[-1]
    xs = torch.sort(x, dim=-1).values
    w = torch.arange(1 - m, m, 2, dtype=x.dtype)
    spread = (xs * w).sum(dim=-1) / (m * (m - 1))
    return ((x - y.unsqueeze(-1)).abs().mean(dim=-1) - spread).mean()


def plain_energy(x, y):
    m = x.shape[-2]
    err = torch.linalg.vector_norm(x - y.unsqueeze(-2), dim=-1).mean(dim=-1)
    pairs = torch.cdist(x, x).sum(dim=(-2, -1)) / (2 * m * (m - 1))
    return (err - pairs).mean()


def plain_interval(lo, hi, y, alpha=0.1):
    below = (lo - y).clamp_min(0.0)
    above = (y - hi).clamp_min(0.0)
    return ((hi - lo) + (2.0 / alpha) * (below + above)).mean()


def plain_quantile(pred, y, levels=LEVELS):
    q = torch.tensor(levels, dtype=pred.dtype)
    diff = y.unsqueeze(-1) - pred
    return torch.maximum(q * diff, (q - 1.0) * diff).sum(dim=-1).mean()


def plain_dawid_sebastiani(mu, sigma, y):
    return (((y - mu) / sigma).square() + 2.0 * torch.log(sigma)).mean()


# ------------------------------------------------------------------ the cases


def _cases() -> list[Case]:
    interval = L.IntervalScoreLoss(alpha=0.1)
    penalty = L.ConfidencePenaltyLoss()  # built once, as a training loop does
    quantile = L.QuantileLoss(list(LEVELS))
    return [
        Case("LogScoreLoss", "F.cross_entropy", _class_inputs, L.LogScoreLoss(), F.cross_entropy),
        Case(
            "BrierLoss", "plain Brier (softmax, one_hot)", _class_inputs, L.BrierLoss(), plain_brier
        ),
        Case("SphericalLoss", "plain spherical", _class_inputs, L.SphericalLoss(), plain_spherical),
        Case("RPSLoss", "plain RPS (cumsum)", _class_inputs, L.RPSLoss(), plain_rps),
        Case(
            "FocalLoss", "plain focal gamma=2", _class_inputs, L.FocalLoss(gamma=2.0), plain_focal
        ),
        Case("MMCELoss", "plain MMCE (N^2 kernel)", _class_inputs, L.MMCELoss(), plain_mmce),
        Case(
            "SoftBinnedECELoss",
            "plain soft-binned ECE^2",
            _class_inputs,
            L.SoftBinnedECELoss(),
            plain_soft_binned_ece,
        ),
        Case(
            "ConfidencePenaltyLoss",
            "plain -H(p)",
            _class_inputs,
            lambda z, y: penalty(z),
            lambda z, y: plain_confidence_penalty(z),
        ),
        Case("DCALoss", "plain DCA", _class_inputs, L.DCALoss(), plain_dca),
        Case("MDCALoss", "plain MDCA", _class_inputs, L.MDCALoss(), plain_mdca),
        Case(
            "CRPSLoss",
            "plain closed-form CRPS-normal",
            _loc_scale_inputs,
            L.CRPSLoss("normal"),
            plain_crps_normal,
        ),
        Case(
            "CRPSLoss[ensemble]",
            "plain sorted fair CRPS",
            _ensemble_inputs,
            L.CRPSLoss("ensemble"),
            plain_crps_ensemble,
        ),
        Case(
            "EnergyScoreLoss",
            "plain energy (cdist)",
            _energy_inputs,
            L.EnergyScoreLoss(),
            plain_energy,
        ),
        Case(
            "IntervalScoreLoss", "plain interval score", _interval_inputs, interval, plain_interval
        ),
        Case("QuantileLoss", "plain pinball", _quantile_inputs, quantile, plain_quantile),
        Case(
            "GaussianNLLLoss",
            "F.gaussian_nll_loss(full=True)",
            _loc_scale_inputs,
            L.GaussianNLLLoss(),
            lambda mu, var, y: F.gaussian_nll_loss(mu, y, var, full=True),
        ),
        Case(
            "DawidSebastianiLoss",
            "plain (z^2 + 2 log s)",
            _loc_scale_inputs,
            L.DawidSebastianiLoss(),
            plain_dawid_sebastiani,
        ),
    ]


# ------------------------------------------------------------------ timing


def _runner(fn: Callable[..., torch.Tensor], inputs, targets, checks: bool) -> Callable[[], None]:
    def run() -> None:
        for x in inputs:
            x.grad = None
        with validation_enabled(checks):
            fn(*inputs, *targets).backward()

    return run


#: the clock of the timed blocks: wall time, or (``--clock cpu``) this thread's CPU time,
#: which leaves out the time the thread waits for a core on a loaded machine
_CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
_clock = time.perf_counter


def _block(run: Callable[[], None], calls: int) -> float:
    t0 = _clock()
    for _ in range(calls):
        run()
    return (_clock() - t0) / calls


def measure(case: Case, b: int, c: int, rounds: int, block_ms: float) -> tuple[float, float, float]:
    """(torchcal default / reference, torchcal checks off / reference, reference seconds per
    call): the medians over ``rounds`` rounds of the per-round ratios. Each round times one
    block of every variant back to back, in an order rotated from round to round, so a
    machine whose speed drifts, or a variant that runs after another, biases no ratio (the
    control row, the reference against itself, shows what is left)."""
    g = torch.Generator().manual_seed(b * 7919 + c)
    inputs, targets = case.make(b, c, g)
    inputs = [x.requires_grad_() for x in inputs]
    runs = [
        _runner(case.ours, inputs, targets, True),
        _runner(case.ours, inputs, targets, False),
        _runner(case.theirs, inputs, targets, True),
    ]
    for run in runs:  # warm-up (and a first time for the block size)
        run()
    calls = max(1, int(block_ms / 1e3 / max(_block(runs[2], 3), 1e-7)))
    ours: list[float] = []
    off: list[float] = []
    ref: list[float] = []
    for r in range(rounds):
        t = [0.0, 0.0, 0.0]
        for k in (r % 3, (r + 1) % 3, (r + 2) % 3):
            t[k] = _block(runs[k], calls)
        ours.append(t[0] / t[2])
        off.append(t[1] / t[2])
        ref.append(t[2])
    return statistics.median(ours), statistics.median(off), statistics.median(ref)


def verdict(ratios: list[float], target: float) -> str:
    """A row's verdict from its runs' ratios: ``"ok"`` when every run is within ``target``,
    ``"MISS"`` when their median is over it, else ``"line"``: the runs straddle the target,
    so another invocation's median may read either way (the run-to-run spread here is a few
    per cent at 256 x 10)."""
    if max(ratios) <= target:
        return "ok"
    return "MISS" if statistics.median(ratios) > target else "line"


#: the harness's own bias: the reference against itself (its ratio should read 1.00)
CONTROL = Case(
    "control",
    "F.cross_entropy (itself)",
    _class_inputs,
    lambda z, y: F.cross_entropy(z, y),
    lambda z, y: F.cross_entropy(z, y),
)


#: torch's own Module shell beside its functional: what ``nn.Module.__call__`` costs at these
#: sizes (every loss here is a Module timed against a function; no target)
SHELL = Case(
    "nn.CrossEntropyLoss",
    "F.cross_entropy",
    _class_inputs,
    torch.nn.CrossEntropyLoss(),
    lambda z, y: F.cross_entropy(z, y),
)


def _pin_allocator() -> str:
    """glibc's malloc returns a freed buffer above its (moving) mmap threshold to the system,
    so the next call of a variant may pay page faults for its gradients or not, depending on
    what ran before it: a 128 x 1000 row read 0.6x in one run and 1.4x in the next. Pinning
    the threshold (64 MiB) and the trim threshold (128 MiB), as ``MALLOC_MMAP_THRESHOLD_`` /
    ``MALLOC_TRIM_THRESHOLD_`` would, keeps every buffer of these sizes on the heap for
    every variant alike. Returns what was done, for the header."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(-3, 64 << 20) == 1 and libc.mallopt(-1, 128 << 20) == 1
    except (OSError, AttributeError):
        return "allocator as is (no glibc)"
    return "glibc mmap threshold pinned at 64 MiB" if ok else "allocator as is (mallopt failed)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=45)
    parser.add_argument("--block-ms", type=float, default=3.0)
    parser.add_argument(
        "--runs", type=int, default=3, help="measure each row this often: the median, and the range"
    )
    parser.add_argument(
        "--default-allocator",
        action="store_true",
        help="leave glibc's mmap threshold moving (see _pin_allocator)",
    )
    parser.add_argument("--only", default="", help="run the losses whose name contains this")
    parser.add_argument("--sizes", default="", help="e.g. 256x10,128x1000 (default: all three)")
    parser.add_argument(
        "--clock",
        choices=sorted(_CLOCKS),
        default="wall",
        help="wall (default) or cpu: the thread's CPU time, for a machine shared with other jobs",
    )
    args = parser.parse_args(argv)
    global _clock
    _clock = _CLOCKS[args.clock]
    if args.rounds < 7:
        parser.error("--rounds: expected at least 7 (the median of >= 7 rounds)")
    sizes = SIZES
    if args.sizes:
        sizes = tuple(tuple(int(v) for v in s.split("x")) for s in args.sizes.split(","))  # type: ignore[assignment]
    allocator = "allocator as is" if args.default_allocator else _pin_allocator()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cases = _cases()
    covered = {case.loss.split("[")[0] for case in cases}
    missing = sorted(set(L.__all__) - covered)
    if missing:
        raise SystemExit(f"bench_hotpath: no case for {missing}; add one to _cases()")
    cases = [CONTROL, SHELL] + [case for case in cases if args.only in case.loss]

    import torchcal

    print(f"torchcal from {os.path.dirname(torchcal.__file__)}; torch {torch.__version__}")
    print(
        f"one thread, fwd+bwd per call; ratio = torchcal / reference, the median of "
        f"{args.rounds} per-round ratios (rounds of ~{args.block_ms:g} ms blocks of each "
        f"variant, order rotated; {args.clock} clock); the median of {args.runs} such runs "
        f"per row, and their range; {allocator}"
    )
    head = (
        f"{'loss':<22} {'reference':<32} {'B x C':>10} {'ref us':>9} {'ratio':>7} "
        f"{'runs':>11} {'chk off':>8}  target"
    )
    print(head)
    print("-" * len(head))
    misses: list[str] = []
    on_line: list[str] = []
    for case in cases:
        for b, c in sizes:
            runs = [measure(case, b, c, args.rounds, args.block_ms) for _ in range(args.runs)]
            ratio, off, ref = (statistics.median(r[k] for r in runs) for k in range(3))
            spread = f"{min(r[0] for r in runs):.2f}-{max(r[0] for r in runs):.2f}"
            target = TARGETS.get(case.loss, DEFAULT_TARGET)
            mark = ""
            if (b, c) in TARGET_SIZES and case is not CONTROL and case is not SHELL:
                word = verdict([r[0] for r in runs], target)
                mark = f"<= {target:g}x {word}"
                if word != "ok":
                    (misses if word == "MISS" else on_line).append(
                        f"{case.loss} {b}x{c}: {ratio:.2f}x ({spread})"
                    )
            print(
                f"{case.loss:<22} {case.reference:<32} {f'{b}x{c}':>10} {ref * 1e6:9.1f} "
                f"{ratio:6.2f}x {spread:>11} {off:7.2f}x  {mark}",
                flush=True,
            )
    print("on the line: " + (", ".join(on_line) if on_line else "none"))
    print("misses: " + (", ".join(misses) if misses else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
