"""CQR with crossing quantile bands: sorted per row, coverage kept (issue 21, item 4)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchcal.scaling import CalibrationWarning, ConformalQuantileRegression

F64 = torch.float64


def _band(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # noisy independently fitted quantiles: the band crosses on a share of the rows
    y = torch.randn(n, generator=gen, dtype=F64)
    lo = -1.0 + 1.2 * torch.randn(n, generator=gen, dtype=F64)
    hi = 1.0 + 1.2 * torch.randn(n, generator=gen, dtype=F64)
    return lo, hi, y


def test_crossing_band_is_sorted_and_counted() -> None:
    gen = torch.Generator().manual_seed(0)
    lo, hi, y = _band(250, gen)
    crossed = int((lo > hi).sum())
    assert crossed > 0
    m = ConformalQuantileRegression(alpha=0.2)
    with pytest.warns(CalibrationWarning, match=f"^upper: lower > upper on {crossed} of 250"):
        fit = m.fit(lo, hi, y)
    ref = ConformalQuantileRegression(alpha=0.2).fit(
        torch.minimum(lo, hi), torch.maximum(lo, hi), y
    )
    assert fit.quantiles == ref.quantiles
    a, b = m.predict(hi, lo)  # crossing at predict time: the same as the sorted band
    c, d = m.predict(torch.minimum(lo, hi), torch.maximum(lo, hi))
    assert torch.equal(a, c) and torch.equal(b, d) and bool((a <= b).all())


def test_crossing_band_keeps_exact_coverage() -> None:
    # 300 seeded calibration/test draws, n = 250, alpha = 0.2: the mean coverage is
    # k / (n + 1) = 201 / 251 (continuous scores, no ties), within Monte-Carlo error
    gen = torch.Generator().manual_seed(1)
    n, alpha, reps = 250, 0.2, 300
    cover = []
    for _ in range(reps):
        lo, hi, y = _band(n + 400, gen)
        m = ConformalQuantileRegression(alpha=alpha)
        with pytest.warns(CalibrationWarning):
            m.fit(lo[:n], hi[:n], y[:n])
        a, b = m.predict(lo[n:], hi[n:])
        cover.append(float(((a <= y[n:]) & (y[n:] <= b)).double().mean()))
    c = np.asarray(cover)
    k = math.ceil((n + 1) * (1 - 0.2))
    se = c.std(ddof=1) / math.sqrt(reps)
    assert abs(c.mean() - k / (n + 1)) < 4 * se
    assert c.mean() > 1 - alpha - 4 * se
