"""Segment repair side by side with mcgrad: the multicalibration error a global fix leaves,
and what each repair leaves on held-out rows (docs/benchmarks.md, "Segments").

Data shaped like mcgrad's LLM case: a model's P(Yes) over documents with six segment columns
(4, 3, 5, 2, 3, 4 values); the true log-odds carry a column-wise shift, two crossed shifts and
a per-segment slope that the model misses, and its logit is over-confident (1.3x) and shifted.
``--rows`` fitting rows (default 30,000) and as many held-out rows, one seed each.

Rows (each fitted on the fit split, scored on the held-out split):

- ``raw``: the model's probabilities;
- ``temperature``: one temperature (the global fix);
- ``isotonic``: torchcal's ``IsotonicCalibrator`` (the global fix mcgrad's case reports);
- ``SegmentCalibrator``: torchcal's repair on top of the temperature (defaults: depth 2,
  ``min_rows=200``, strength chosen on 5 folds, the guard);
- ``mcgrad MCGrad``: mcgrad's boosting on the same columns (its defaults: LightGBM, early
  stopping on 5 folds), on the raw probabilities.

Columns: MCE sigma (the worst segment's ECCE in sigma units over the crosses of depth 2 with
at least 200 rows: torchcal.functional.multicalibration_error, equal to mcgrad's metric),
global ECCE sigma, held-out NLL, fit time (wall; CPU in brackets).

    python benchmarks/bench_segments.py            # about a minute on 2 cores
    python benchmarks/bench_segments.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from torchcal.functional.multicalibration import multicalibration_error, segment_masks
from torchcal.scaling import IsotonicCalibrator, SegmentCalibrator, TemperatureScaler

SIZES = (4, 3, 5, 2, 3, 4)
COLUMNS = [f"c{j}" for j in range(len(SIZES))]


def make(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(model logits, labels, segment columns (N, 6) int64)."""
    f = torch.stack([torch.randint(0, k, (n,), generator=g) for k in SIZES], 1)
    s = 1.5 * torch.randn(n, generator=g, dtype=torch.float64)
    eff = (
        0.8 * ((f[:, 0] == 1).double() - (f[:, 0] == 2).double())
        + 0.6 * ((f[:, 1] == 0) & (f[:, 2] >= 3)).double()
        - 0.7 * ((f[:, 3] == 1) & (f[:, 4] == 2)).double()
    )
    true = (1 + 0.4 * (f[:, 5] == 3).double()) * s + eff
    y = torch.bernoulli(torch.sigmoid(true), generator=g)
    return 1.3 * s + 0.2, y, f


def score(p: torch.Tensor, y: torch.Tensor, f: torch.Tensor) -> tuple[float, float, float]:
    cols = {c: f[:, j] for j, c in enumerate(COLUMNS)}
    masks, _ = segment_masks(cols, depth=2, min_rows=200)
    r = multicalibration_error(p, y, masks)
    p = p.clamp(1e-15, 1 - 1e-15)
    nll = float(F.binary_cross_entropy(p, y))
    return float(r.mce_sigma), float(r.ecce_sigma[0]), nll


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=30000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="4,000 rows, no mcgrad")
    args = ap.parse_args()
    n = 4000 if args.quick else args.rows
    g = torch.Generator().manual_seed(args.seed)
    z, y, f = make(n, g)
    zt, yt, ft = make(n, g)
    rows: list[tuple[str, tuple[float, float, float], str]] = []
    rows.append(("raw", score(torch.sigmoid(zt), yt, ft), "-"))

    t = TemperatureScaler()
    _, w, c = timed(lambda: t.fit(z, y))
    with torch.no_grad():
        base, base_t = t(z), t(zt)
    rows.append(("temperature", score(torch.sigmoid(base_t), yt, ft), f"{w:.2f} s ({c:.2f})"))

    iso = IsotonicCalibrator()
    _, w, c = timed(lambda: iso.fit(z, y))
    rows.append(("isotonic", score(iso.predict_proba(zt), yt, ft), f"{w:.2f} s ({c:.2f})"))

    seg = SegmentCalibrator(COLUMNS, depth=2, min_rows=200)
    res, w, c = timed(lambda: seg.fit(base, y, f))
    name = f"SegmentCalibrator (reg {res.reg:g}, {res.segments} segments)"
    rows.append((name, score(torch.sigmoid(seg(base_t, ft)), yt, ft), f"{w:.2f} s ({c:.2f})"))

    if not args.quick:
        try:
            import pandas as pd
            from mcgrad.methods import MCGrad
        except ImportError:
            rows.append(("mcgrad MCGrad", (float("nan"),) * 3, "not installed"))
        else:
            df = pd.DataFrame(f.numpy(), columns=COLUMNS)
            df["p"], df["y"] = torch.sigmoid(z).numpy(), y.numpy()
            dt = pd.DataFrame(ft.numpy(), columns=COLUMNS)
            dt["p"] = torch.sigmoid(zt).numpy()
            mc = MCGrad()
            _, w, c = timed(lambda: mc.fit(df, "p", "y", categorical_feature_column_names=COLUMNS))
            pt = torch.as_tensor(
                mc.predict(dt, "p", categorical_feature_column_names=COLUMNS), dtype=torch.float64
            )
            rows.append(("mcgrad MCGrad", score(pt, yt, ft), f"{w:.2f} s ({c:.2f})"))

    print(
        f"segments: {n} fit / {n} held-out rows, seed {args.seed}, {torch.get_num_threads()} threads"
    )
    print("| map | MCE sigma | global ECCE sigma | held-out NLL | fit time (CPU) |")
    print("|---|---|---|---|---|")
    for name, (mce, glob, nll), tm in rows:
        print(f"| {name} | {mce:.2f} | {glob:.2f} | {nll:.4f} | {tm} |")


if __name__ == "__main__":
    main()
