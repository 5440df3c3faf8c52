"""Temperature-scaling fit: torchcal against its peers, in one process (ratios, gaps, memory).

Peers on the same float32 logits:
- the reference way: ``LBFGS([T], lr=0.01, max_iter=50)`` on T itself (the widely copied recipe),
- scipy's Brent (``minimize_scalar``) on log T over a float64 copy of the logits,
- scikit-learn's temperature method (``CalibratedClassifierCV(method="temperature")``, whose
  estimator is ``sklearn.calibration._TemperatureScaling``) where the installed version has it,
- netcal's ``TemperatureScaling`` (on float64 softmax probabilities, and on float32 ones, where
  it returns T = 1) and torch-uncertainty's ``TemperatureScaler`` if importable.

torchcal's default in-memory solver is LBFGS (strong-Wolfe, on log T, float64); its
``method="newton"`` (the streaming/DDP solver) is an extra row. One-time import costs are paid before any timing (``warm_up``).

Each row: wall time, CPU time, time ratio to torchcal (default solver), the fitted T, its relative distance to
the float64 optimum (the root of dNLL/dlogT, found by Brent's method in numpy), and the NLL gap
(nats) to that optimum. The large case runs in a subprocess that measures the extra peak RSS
of the fit against the size of the logits.

Run: ``python benchmarks/bench_scaling.py`` (about 1-2 minutes on 2 cores; ``--quick`` for
a smaller smoke run).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import brentq, minimize_scalar

# this checkout's torchcal, not an installed one (``python benchmarks/bench_scaling.py`` puts
# benchmarks/ first on sys.path, and an editable install of another checkout would win)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchcal.scaling import TemperatureScaler  # noqa: E402


def make_data(n: int, c: int, true_t: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits and labels drawn from softmax(z / true_t) by Gumbel-max, chunk by chunk."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g)
    z.mul_(3.0)
    y = torch.empty(n, dtype=torch.long)
    for s in range(0, n, 4096):
        u = torch.rand(min(4096, n - s), c, generator=g).clamp_(min=1e-12)
        y[s : s + 4096] = (z[s : s + 4096] / true_t - torch.log(-torch.log(u))).argmax(1)
    return z, y


def grad_log_t(zn: np.ndarray, yn: np.ndarray, zy: np.ndarray, lt: float) -> float:
    """d mean NLL / d log T in float64 numpy (chunked)."""
    beta = math.exp(-lt)
    total = 0.0
    for s in range(0, zn.shape[0], 2048):
        zc = zn[s : s + 2048].astype(np.float64)
        p = beta * zc
        p -= p.max(1, keepdims=True)
        np.exp(p, out=p)
        p /= p.sum(1, keepdims=True)
        total += float(np.einsum("ij,ij->i", p, zc).sum())
    return -beta * (total - float(zy.sum())) / zn.shape[0]


def nll(z: torch.Tensor, y: torch.Tensor, t: float) -> float:
    """Mean NLL at temperature t, float64, chunked."""
    total = 0.0
    for s in range(0, z.shape[0], 2048):
        zc = z[s : s + 2048].double() / t
        total += float(
            (torch.logsumexp(zc, 1) - zc.gather(1, y[s : s + 2048, None]).squeeze(1)).sum()
        )
    return total / z.shape[0]


def optimum(z: torch.Tensor, y: torch.Tensor, t_hint: float) -> tuple[float, float]:
    zn, yn = z.numpy(), y.numpy()
    zy = zn[np.arange(len(yn)), yn].astype(np.float64)
    lo, hi = math.log(t_hint) - 0.05, math.log(t_hint) + 0.05
    while grad_log_t(zn, yn, zy, lo) > 0:
        lo -= 0.5
    while grad_log_t(zn, yn, zy, hi) < 0:
        hi += 0.5
    lt = brentq(lambda v: grad_log_t(zn, yn, zy, v), lo, hi, xtol=1e-13, rtol=1e-13)
    return math.exp(lt), nll(z, y, math.exp(lt))


def timed(fn, repeat: int = 3):
    """(result, wall s, cpu s); calls under a second are repeated and the fastest kept (the
    machine is shared), for every method alike."""
    best = None
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        wall, cpu = time.perf_counter() - w, time.process_time() - c
        if best is None or wall < best[1]:
            best = (out, wall, cpu)
        if wall >= 1.0:
            break
    return best


# ----------------------------------------------------------------------------- fits
def fit_torchcal(z, y):
    return TemperatureScaler().fit(z, y).temperature


def fit_torchcal_newton(z, y):
    return TemperatureScaler(method="newton").fit(z, y).temperature


def warm_up() -> None:
    """Pay one-time costs outside the timings: the first ``torch.optim`` optimizer built in a
    process costs ~1.5 s of imports, which would land on whichever LBFGS fit runs first."""
    z, y = make_data(256, 4, 1.0)
    fit_torchcal(z, y)
    fit_torchcal_newton(z, y)
    fit_reference_way(z, y)


def fit_reference_way(z, y):
    t = torch.ones(1, requires_grad=True)
    opt = torch.optim.LBFGS([t], lr=0.01, max_iter=50)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(z / t, y)
        loss.backward()
        return loss

    opt.step(closure)
    return float(t.detach())


def fit_scipy_brent(z, y):
    z64 = z.double()
    zy = z64.gather(1, y[:, None]).squeeze(1)

    def f(lt):
        b = math.exp(-lt)
        return float((torch.logsumexp(z64 * b, 1) - zy * b).mean())

    return math.exp(minimize_scalar(f, bracket=(-1.0, 1.0), method="brent").x)


def sklearn_temperature():
    try:
        from sklearn.calibration import CalibratedClassifierCV, _TemperatureScaling
    except ImportError:
        return None
    import inspect

    if "temperature" not in inspect.getsource(CalibratedClassifierCV):
        return None

    def fit(z, y):
        return 1.0 / float(_TemperatureScaling().fit(z.numpy(), y.numpy()).beta_)

    return fit


def netcal_temperature(dtype: torch.dtype):
    try:
        from netcal.scaling import TemperatureScaling
    except ImportError:
        return None

    def fit(z, y):
        ts = TemperatureScaling(method="mle")
        ts.fit(torch.softmax(z.to(dtype), 1).numpy(), y.numpy(), tensorboard=False)
        w = getattr(ts, "weights", None)
        if w is None:
            w = ts._weights
        return 1.0 / float(np.asarray(w).ravel()[0])

    return fit


def torch_uncertainty_temperature():
    try:
        from torch_uncertainty.post_processing import TemperatureScaler as TUScaler
    except ImportError:
        return None

    def fit(z, y):
        ds = torch.utils.data.TensorDataset(z, y)
        dl = torch.utils.data.DataLoader(ds, batch_size=len(ds))
        sc = TUScaler(model=None)
        sc.fit(dl)
        return float(sc.temperature[0])

    return fit


def run_case(name: str, n: int, c: int, true_t: float, quick: bool) -> list[dict]:
    z, y = make_data(n, c, true_t)
    print(f"\n== {name}: {n} x {c} float32 logits, true T = {true_t} ==")
    t_ours, w_ours, c_ours = timed(lambda: fit_torchcal(z, y))
    t_opt, f_opt = optimum(z, y, t_ours)
    peers = [
        ("torchcal TemperatureScaler", fit_torchcal),
        ("torchcal TemperatureScaler(method='newton')", fit_torchcal_newton),
        ("reference way LBFGS(lr=0.01, max_iter=50) on T", fit_reference_way),
        ("scipy Brent on log T (float64)", fit_scipy_brent),
    ]
    sk = sklearn_temperature()
    peers.append(("scikit-learn method='temperature'", sk))
    peers.append(
        (
            "netcal TemperatureScaling (float64 probs)",
            None if quick else netcal_temperature(torch.float64),
        )
    )
    peers.append(
        (
            "netcal TemperatureScaling (float32 probs)",
            None if quick else netcal_temperature(torch.float32),
        )
    )
    peers.append(("torch-uncertainty TemperatureScaler", torch_uncertainty_temperature()))
    rows = []
    print(
        f"{'method':48s} {'wall s':>8s} {'cpu s':>8s} {'ratio':>7s} {'cpu rt':>7s} "
        f"{'T':>10s} {'T/T*-1':>10s} {'NLL gap':>10s}"
    )
    for label, fn in peers:
        if fn is None:
            print(f"{label:48s}  (not available)")
            continue
        if fn is fit_torchcal:
            t, wall, cpu = t_ours, w_ours, c_ours
        else:
            t, wall, cpu = timed(lambda fn=fn: fn(z, y))
        gap = nll(z, y, t) - f_opt
        rows.append(
            {
                "case": name,
                "method": label,
                "wall": wall,
                "cpu": cpu,
                "ratio_ours_to_this": w_ours / wall,
                "T": t,
                "rel": t / t_opt - 1,
                "gap": gap,
            }
        )
        print(
            f"{label:48s} {wall:8.2f} {cpu:8.2f} {w_ours / wall:7.3f} {c_ours / cpu:7.3f} "
            f"{t:10.5f} {t / t_opt - 1:10.2e} {gap:10.2e}"
        )
    print(
        "ratio = torchcal wall time / this method's wall time, cpu rt = the same for process "
        "CPU time (steadier on a shared machine); lower is better for torchcal. T* = float64 "
        "optimum (Brent root of dNLL/dlogT); NLL gap = NLL(T) - NLL(T*) in nats"
    )
    wall = {r["method"]: r["wall"] for r in rows}
    for solver in ("torchcal TemperatureScaler", "torchcal TemperatureScaler(method='newton')"):
        for peer, label in (
            ("scikit-learn method='temperature'", "scikit-learn"),
            ("reference way LBFGS(lr=0.01, max_iter=50) on T", "reference"),
        ):
            if solver in wall and peer in wall:
                print(f"  {solver}: {wall[solver] / wall[peer]:.3f} x {label}")
    return rows


_BIG = r"""
import json, resource, sys, time, torch
sys.path.insert(0, "benchmarks")
from bench_scaling import make_data
from torchcal.scaling import TemperatureScaler
n, c = int(sys.argv[1]), int(sys.argv[2])
z, y = make_data(n, c, 2.0)
def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
before = rss_kb("VmRSS")
try:
    open("/proc/self/clear_refs", "w").write("5")  # reset the peak-RSS counter
    reset = rss_kb("VmHWM") <= before + 1024
except OSError:
    reset = False
w, c0 = time.perf_counter(), time.process_time()
res = TemperatureScaler().fit(z, y)
wall, cpu = time.perf_counter() - w, time.process_time() - c0
peak = rss_kb("VmHWM")
print(json.dumps({"wall": wall, "cpu": cpu, "extra_mb": (peak - before) / 1024,
                  "logits_mb": z.numel() * 4 / 2**20, "reset": reset, "T": res.temperature,
                  "passes": res.passes, "converged": res.converged}))
"""


def run_big(n: int, c: int) -> dict:
    print(f"\n== large: {n} x {c} float32 logits ({n * c * 4 / 2**20:.0f} MiB), subprocess ==")
    out = subprocess.run(
        [sys.executable, "-c", _BIG, str(n), str(c)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,  # "" (the child's sys.path[0]) is this checkout
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"fit wall {r['wall']:.2f} s (cpu {r['cpu']:.2f} s), passes {r['passes']}, "
        f"converged {r['converged']}, T {r['T']:.6f}"
    )
    print(
        f"extra peak RSS {r['extra_mb']:.1f} MiB = {r['extra_mb'] / r['logits_mb']:.4f} x the "
        f"logits ({r['logits_mb']:.0f} MiB); peak counter reset: {r['reset']}"
    )
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    warm_up()
    if args.quick:
        run_case("small", 5_000, 100, 2.5, quick=True)
        run_big(20_000, 1000)
        return
    run_case("20k x 1000", 20_000, 1000, 2.5, quick=False)
    run_case("50k x 100", 50_000, 100, 0.5, quick=False)
    run_big(200_000, 1000)


if __name__ == "__main__":
    main()
