"""torchcal on a GPU in one prepared run (issue 18, item 6): no host synchronisation, compiled
vs eager, and the fraction of the memory bandwidth the big passes reach.

Sections (each prints a table; nothing is written unless ``--json PATH``):

1. **Losses**: every loss of ``torchcal.losses.__all__``, forward + backward at B x C =
   4096 x 1000 (classification; ``B * C`` scores for the real-valued losses), eager and
   ``torch.compile`` (``--backend``, default inductor), each run under
   ``torch.cuda.set_sync_debug_mode("error")`` (a host synchronisation raises); the
   column ``sync`` says "none" or names the error.
2. **Metric updates**: ``CalibrationError`` / ``NegativeLogLikelihood`` /
   ``BrierDecomposition`` ``update`` with ``validate_args=False`` under the same mode.
3. **ECE on 10^6 x 1000 float32 logits** (4 GB): ``CalibrationError.update`` + ``compute``
   against torchmetrics' ``MulticlassCalibrationError`` on the same tensor; bytes read /
   time / the device's peak bandwidth.
4. **Temperature fit** (``torchcal.scaling.TemperatureScaler``) on the same logits: time, the
   passes over the data, and bytes (passes x logits) / time / peak.

Peak bandwidth from the device name (H200 4.8 TB/s, H100 SXM 3.35, H100 PCIe 2.0, A100 80GB
2.04, A100 40GB 1.555, L40S 0.864, L4 0.3, A10 0.6, T4 0.32, V100 0.9) or ``--peak-tbps``.

    python benchmarks/bench_gpu.py                         # on the GPU, full size (< 8 min on an H200)
    python benchmarks/bench_gpu.py --device cpu --small    # the same logic on CPU, small sizes

torchcal is imported from the current directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchcal.losses as L  # noqa: E402

PEAK_TBPS = (  # substrings of torch.cuda.get_device_name(), most specific first
    ("H200", 4.8),
    ("H100 PCIe", 2.0),
    ("H100", 3.35),
    ("A100 80GB", 2.039),
    ("A100-SXM4-80GB", 2.039),
    ("A100", 1.555),
    ("L40S", 0.864),
    ("L4", 0.3),
    ("A10", 0.6),
    ("T4", 0.32),
    ("V100", 0.9),
)


def peak_bandwidth(device: torch.device, override: float | None) -> float | None:
    """Bytes per second of the device's memory (``override`` in TB/s wins); ``None`` unknown."""
    if override is not None:
        return override * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, tbps in PEAK_TBPS:
        if key in name:
            return tbps * 1e12
    return None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def no_sync_allowed(device: torch.device) -> Iterator[None]:
    """``set_sync_debug_mode("error")`` on CUDA (a host synchronisation raises)."""
    if device.type != "cuda":
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def timed(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` runs after a warm-up (device synchronised
    around each run, outside the sync-debug mode)."""
    fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def checked_call(fn: Callable[[], object], device: torch.device) -> str:
    """Run ``fn`` once under the sync-debug mode; "none" or the error's first line."""
    try:
        with no_sync_allowed(device):
            fn()
        sync(device)
        return "none"
    except RuntimeError as err:
        return str(err).splitlines()[0][:70]


# ------------------------------------------------------------------ 1. losses


def loss_cases(b: int, c: int, device: torch.device):
    g = torch.Generator(device="cpu").manual_seed(0)

    def t(*shape, low=None):
        x = torch.randn(*shape, generator=g)
        if low is not None:
            x = x.abs() + low
        return x.to(device)

    logits = t(b, c)
    labels = torch.randint(0, c, (b,), generator=g).to(device)
    n = b * c
    loc, scale, target = t(n), t(n, low=0.5), t(n)
    centre, half = t(n), t(n, low=0.1)
    cases = {
        "LogScoreLoss": (L.LogScoreLoss(), (logits, labels), lambda z, y: F.cross_entropy(z, y)),
        "BrierLoss": (L.BrierLoss(), (logits, labels), None),
        "SphericalLoss": (L.SphericalLoss(), (logits, labels), None),
        "RPSLoss": (L.RPSLoss(), (logits, labels), None),
        "FocalLoss": (L.FocalLoss(), (logits, labels), None),
        "MMCELoss": (L.MMCELoss(), (logits, labels), None),
        "SoftBinnedECELoss": (L.SoftBinnedECELoss(), (logits, labels), None),
        "ConfidencePenaltyLoss": (L.ConfidencePenaltyLoss(), (logits,), None),
        "DCALoss": (L.DCALoss(), (logits, labels), None),
        "MDCALoss": (L.MDCALoss(), (logits, labels), None),
        "CRPSLoss": (L.CRPSLoss(), (loc, scale, target), None),
        "EnergyScoreLoss": (L.EnergyScoreLoss(), (t(b, 8, 16), t(b, 16)), None),
        "IntervalScoreLoss": (
            L.IntervalScoreLoss(alpha=0.1),
            (centre - half, centre + half, target),
            None,
        ),
        "QuantileLoss": (
            L.QuantileLoss([0.1, 0.5, 0.9]).to(device),
            (torch.sort(t(n, 3), dim=-1).values, target),
            None,
        ),
        "GaussianNLLLoss": (
            L.GaussianNLLLoss(),
            (loc, scale, target),
            lambda m, v, y: F.gaussian_nll_loss(m, y, v, full=True),
        ),
        "DawidSebastianiLoss": (L.DawidSebastianiLoss(), (loc, scale, target), None),
    }
    missing = sorted(set(L.__all__) - set(cases))
    if missing:
        raise SystemExit(f"bench_gpu: no case for {missing}")
    return cases


def fwd_bwd(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...]):
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]

    def run() -> None:
        for x in leaves:
            x.grad = None
        fn(*leaves).backward()

    return run


def section_losses(args, device, out: dict) -> None:
    b, c = (256, 100) if args.small else (4096, 1000)
    print(f"\n1. losses, fwd+bwd at {b} x {c}, eager vs torch.compile(backend={args.backend!r})")
    print(
        f"{'loss':<22} {'eager ms':>9} {'compiled ms':>12} {'speed-up':>9}  sync (eager / compiled)"
    )
    rows = []
    for name, (module, inputs, peer) in loss_cases(b, c, device).items():
        eager = fwd_bwd(module, inputs)
        torch._dynamo.reset()
        compiled_module = torch.compile(module, backend=args.backend)
        compiled = fwd_bwd(compiled_module, inputs)
        compiled()  # compile outside the sync check (compilation may synchronise)
        sync_eager = checked_call(eager, device)
        sync_compiled = checked_call(compiled, device)
        te = timed(eager, device, args.reps)
        tc = timed(compiled, device, args.reps)
        row = {"loss": name, "eager_s": te, "compiled_s": tc, "sync_eager": sync_eager}
        row["sync_compiled"] = sync_compiled
        line = f"{name:<22} {te * 1e3:9.3f} {tc * 1e3:12.3f} {te / tc:8.2f}x  {sync_eager} / {sync_compiled}"
        if peer is not None:
            tp = timed(fwd_bwd(peer, inputs), device, args.reps)
            row["peer_s"] = tp
            line += f"   (torch peer {tp * 1e3:.3f} ms, eager ratio {te / tp:.2f}x)"
        rows.append(row)
        print(line, flush=True)
    out["losses"] = rows


# ------------------------------------------------------------------ 2. metric updates


def section_metrics(args, device, out: dict) -> None:
    from torchcal.metrics import BrierDecomposition, CalibrationError, NegativeLogLikelihood

    b, c = (256, 10) if args.small else (4096, 1000)
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(b, c, generator=g).to(device)
    labels = torch.randint(0, c, (b,), generator=g).to(device)
    print(f"\n2. metric updates at {b} x {c}, validate_args=False, under sync-debug 'error'")
    print(f"{'metric':<24} {'update ms':>10}  sync")
    rows = []
    for name, make in (
        ("CalibrationError", lambda: CalibrationError(validate_args=False)),
        ("NegativeLogLikelihood", lambda: NegativeLogLikelihood(validate_args=False)),
        (
            "BrierDecomposition",
            lambda: BrierDecomposition(reading="confidence", validate_args=False),
        ),
    ):
        try:
            metric = make().to(device)
        except TypeError as err:  # an option this metric does not take
            print(f"{name:<24} skipped: {err}")
            continue
        update = lambda m=metric: m.update(logits, labels)  # noqa: E731
        status = checked_call(update, device)
        tu = timed(update, device, args.reps)
        rows.append({"metric": name, "update_s": tu, "sync": status})
        print(f"{name:<24} {tu * 1e3:10.3f}  {status}", flush=True)
    out["metric_updates"] = rows


# ------------------------------------------------------------------ 3-4. the big logits


def section_big(args, device, peak: float | None, out: dict) -> None:
    from torchmetrics.classification import MulticlassCalibrationError

    from torchcal.metrics import CalibrationError
    from torchcal.scaling import TemperatureScaler

    n, c = (20_000, 100) if args.small else (1_000_000, 1000)
    g = torch.Generator(device=device.type if device.type != "cuda" else "cuda")
    g.manual_seed(2)
    logits = torch.randn(n, c, device=device, generator=g) * 3.0
    # labels drawn from softmax(logits) (the Gumbel-max trick): a calibrated model, T near 1
    u = torch.rand(n, c, device=device, generator=g).clamp_(min=1e-12)
    labels = (logits - torch.log(-torch.log(u))).argmax(dim=1)
    del u
    logit_bytes = logits.numel() * logits.element_size() + labels.numel() * 8
    frac = (lambda s, nbytes: f"{nbytes / s / peak:6.1%}") if peak else (lambda s, nbytes: "   n/a")
    print(f"\n3. ECE update + compute on {n} x {c} float32 logits ({logit_bytes / 1e9:.2f} GB)")
    print(f"{'case':<40} {'ms':>10} {'GB/s':>8} {'of peak':>8}")

    def ours() -> None:
        metric = CalibrationError(n_bins=15, validate_args=False).to(device)
        metric.update(logits, labels)
        metric.compute()

    def theirs() -> None:
        metric = MulticlassCalibrationError(
            num_classes=c, n_bins=15, norm="l1", validate_args=False
        ).to(device)
        metric.update(logits, labels)
        metric.compute()

    rows = []
    reps = max(3, args.reps // 3)
    for name, fn in (
        ("torchcal CalibrationError", ours),
        ("torchmetrics MulticlassCalibrationError", theirs),
    ):
        sec = timed(fn, device, reps)
        rows.append({"case": name, "seconds": sec, "bytes": logit_bytes})
        print(
            f"{name:<40} {sec * 1e3:10.2f} {logit_bytes / sec / 1e9:8.1f} {frac(sec, logit_bytes)}"
        )
    print(f"ratio torchmetrics / torchcal: {rows[1]['seconds'] / rows[0]['seconds']:.2f}x")
    out["ece_big"] = rows

    print("\n4. TemperatureScaler.fit on the same logits")
    scaler = TemperatureScaler()
    sync(device)
    t0 = time.perf_counter()
    result = scaler.fit(logits, labels)
    sync(device)
    sec = time.perf_counter() - t0
    passes = getattr(result, "passes", None) or 1
    nbytes = passes * logit_bytes
    print(
        f"T = {float(result.temperature):.4f}, {passes} passes, {sec * 1e3:.1f} ms, "
        f"{nbytes / sec / 1e9:.1f} GB/s, {frac(sec, nbytes)} of peak"
    )
    out["temperature_fit"] = {"seconds": sec, "passes": passes, "bytes": nbytes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="small sizes (CPU smoke run)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--peak-tbps", type=float, default=None, help="peak bandwidth, TB/s")
    parser.add_argument("--sections", default="1234", help="which sections to run")
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device; run with --device cpu --small for the CPU smoke run")
        return 2
    peak = peak_bandwidth(device, args.peak_tbps)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"device {name}; peak {peak / 1e12 if peak else float('nan'):.2f} TB/s; torch {torch.__version__}"
    )
    out: dict = {"device": name, "peak_bytes_per_s": peak}
    if "1" in args.sections:
        section_losses(args, device, out)
    if "2" in args.sections:
        section_metrics(args, device, out)
    if "3" in args.sections or "4" in args.sections:
        section_big(args, device, peak, out)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
