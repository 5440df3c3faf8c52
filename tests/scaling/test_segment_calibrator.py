"""SegmentCalibrator: repairs planted segment miscalibration that one temperature leaves (MCE
sigma measured on held-out rows), never worse than the base held out, an exact optimum of its
stated objective, state round-trips, clear errors."""

from __future__ import annotations

import io
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from torchcal.functional.multicalibration import multicalibration_error, segment_masks
from torchcal.scaling import NotFittedError, SegmentCalibrator, TemperatureScaler
from torchcal.scaling._base import CalibrationWarning

SIZES = (4, 3, 5, 2, 3, 4)  # values of the six segment columns


def make(n: int, g: torch.Generator, effect: float = 1.0):
    """Base logits that one temperature fixes globally, and segment effects it cannot see:
    a column-wise shift, two crossed shifts and a per-segment slope."""
    f = torch.stack([torch.randint(0, k, (n,), generator=g) for k in SIZES], 1)
    s = 1.5 * torch.randn(n, generator=g, dtype=torch.float64)
    eff = (
        0.8 * ((f[:, 0] == 1).double() - (f[:, 0] == 2).double())
        + 0.6 * ((f[:, 1] == 0) & (f[:, 2] >= 3)).double()
        - 0.7 * ((f[:, 3] == 1) & (f[:, 4] == 2)).double()
    )
    true = (1 + 0.4 * (f[:, 5] == 3).double()) * s + effect * eff
    y = torch.bernoulli(torch.sigmoid(true), generator=g)
    return 1.3 * s + 0.2, y, f


def base_map(z: torch.Tensor, y: torch.Tensor):
    """The fitted temperature as a function of binary logits (no autograd graph)."""
    t = TemperatureScaler()
    t.fit(z, y)
    return lambda v: t(v).detach()


def mce_sigma(z: torch.Tensor, y: torch.Tensor, f: torch.Tensor) -> tuple[float, float]:
    cols = {f"c{j}": f[:, j] for j in range(f.shape[1])}
    masks, _ = segment_masks(cols, depth=2, min_rows=200)
    r = multicalibration_error(torch.sigmoid(z), y, masks)
    return float(r.mce_sigma), float(r.ecce_sigma[0])


COLUMNS = [f"c{j}" for j in range(len(SIZES))]


def test_repairs_the_segments_a_temperature_leaves() -> None:
    g = torch.Generator().manual_seed(0)
    z, y, f = make(20000, g)
    zt, yt, ft = make(20000, g)
    t = base_map(z, y)
    base, base_t = t(z), t(zt)
    raw = mce_sigma(base_t, yt, ft)
    assert raw[0] >= 20  # the planted segments are far outside noise after the temperature
    cal = SegmentCalibrator(COLUMNS, depth=2, min_rows=200)
    res = cal.fit(base, y, f)
    assert not res.fallback and math.isfinite(res.reg) and res.segments > 100
    fixed = cal(base_t, ft)
    after = mce_sigma(fixed, yt, ft)
    assert after[0] <= 5 and after[1] <= 5, (raw, after)
    nll_base = float(F.binary_cross_entropy_with_logits(base_t, yt))
    nll_fixed = float(F.binary_cross_entropy_with_logits(fixed, yt))
    assert nll_fixed < nll_base - 0.01


def test_guard_keeps_the_base_where_segments_carry_nothing() -> None:
    """No segment effect: held-out NLL no worse than the base by more than noise in every
    seed, and the fit says when it fell back."""
    for seed in range(3):
        g = torch.Generator().manual_seed(100 + seed)
        z, y, f = make(4000, g, effect=0.0)
        zt, yt, ft = make(20000, g, effect=0.0)
        t = base_map(z, y)
        cal = SegmentCalibrator(COLUMNS, depth=2, min_rows=200, seed=seed)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            res = cal.fit(t(z), y, f)
        kept = [w for w in rec if issubclass(w.category, CalibrationWarning)]
        assert res.fallback == any("base map is kept" in str(w.message) for w in kept)
        nll_base = float(F.binary_cross_entropy_with_logits(t(zt), yt))
        nll_cal = float(F.binary_cross_entropy_with_logits(cal(t(zt), ft), yt))
        assert nll_cal <= nll_base + 2e-3, (seed, nll_cal, nll_base, res.reg)
        if res.fallback:
            assert torch.equal(cal(t(zt), ft), t(zt))


def test_fixed_strength_is_the_exact_optimum_of_the_stated_objective() -> None:
    """The dense objective (no grouping of rows) through autograd: zero gradient at the fit,
    and no lower value at random nearby points."""
    g = torch.Generator().manual_seed(4)
    z, y, f = make(3000, g)
    reg = 1e-3
    cal = SegmentCalibrator(COLUMNS[:3], depth=2, min_rows=50, reg=reg)
    cal.fit(z, y, f[:, :3])
    cols = {c: f[:, j] for j, c in enumerate(COLUMNS[:3])}
    masks, _ = segment_masks(cols, depth=2, min_rows=50)
    x = masks[1:].T.double()
    theta = torch.cat([cal.slope[None], cal.intercept[None], cal.slopes, cal.offsets])
    theta = theta.clone().requires_grad_(True)

    def objective(th: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        a, b, v, u = th[0], th[1], th[2 : 2 + s], th[2 + s :]
        t = (a + x @ v) * z + b + x @ u
        return F.binary_cross_entropy_with_logits(t, y) + 0.5 * reg * (v @ v + u @ u)

    f0 = objective(theta)
    (grad,) = torch.autograd.grad(f0, theta)
    assert float(grad.abs().max()) <= 1e-8
    with torch.no_grad():
        for _ in range(20):
            assert float(
                objective(theta + 1e-3 * torch.randn(theta.shape, generator=g, dtype=torch.float64))
            ) >= float(f0)


def test_state_round_trips_and_numeric_buckets_are_fixed_at_fit(tmp_path) -> None:
    g = torch.Generator().manual_seed(5)
    z, y, f = make(5000, g)
    feats = torch.cat(
        [f[:, :2].double(), torch.randn(5000, 1, generator=g, dtype=torch.float64)], 1
    )
    cal = SegmentCalibrator(["a", "b", "x"], numeric=["x"], depth=2, min_rows=100, reg=1e-2)
    cal.fit(z, y, feats)
    buf = io.BytesIO()
    torch.save(cal.state_dict(), buf)
    buf.seek(0)
    other = SegmentCalibrator(["a", "b", "x"], numeric=["x"], depth=2, min_rows=100)
    other.load_state_dict(torch.load(buf, weights_only=True))
    new = torch.cat(
        [f[:50, :2].double(), 10 * torch.randn(50, 1, generator=g, dtype=torch.float64)], 1
    )
    assert torch.equal(other(z[:50], new), cal(z[:50], new))
    # a numeric value far outside the fitting range falls in the outer bucket fixed at fit
    assert torch.isfinite(cal(z[:50], new)).all()


def test_bad_inputs_name_the_argument() -> None:
    g = torch.Generator().manual_seed(6)
    z, y, f = make(500, g)
    with pytest.raises(ValueError, match="^reg: expected 'cv' or a strength"):
        SegmentCalibrator(["a"], reg=-1.0)
    with pytest.raises(ValueError, match="^numeric: expected names among columns"):
        SegmentCalibrator(["a"], numeric=["b"])
    cal = SegmentCalibrator(COLUMNS, min_rows=10)
    with pytest.raises(NotFittedError):
        cal(z, f)
    with pytest.raises(ValueError, match=r"^features: expected shape \(N, 6\)"):
        cal.fit(z, y, f[:, :2])
    with pytest.raises(ValueError, match="^features: categorical column 'c0' holds non-integer"):
        cal.fit(z, y, f.double() + 0.5)
    with pytest.raises(ValueError, match="^features: expected 500 rows"):
        cal.fit(z, y, f[:400])
    with pytest.raises(ValueError, match="^target: expected binary labels"):
        cal.fit(z, y + 2, f)
    with pytest.raises(ValueError, match=r"^logits: expected .*\(N,\)"):
        cal.fit(torch.randn(500, 3, dtype=torch.float64), y, f)


def test_deterministic_for_a_seed() -> None:
    g = torch.Generator().manual_seed(7)
    z, y, f = make(3000, g)
    a = SegmentCalibrator(COLUMNS[:3], min_rows=100, seed=3)
    b = SegmentCalibrator(COLUMNS[:3], min_rows=100, seed=3)
    ra, rb = a.fit(z, y, f[:, :3]), b.fit(z, y, f[:, :3])
    assert ra.cv_nll == rb.cv_nll and torch.equal(a.offsets, b.offsets)


def _calibrated(seed: int, n: int = 2000):
    """Base logits that are the true ones and two segment columns that carry nothing."""
    g = torch.Generator().manual_seed(seed)
    z = 1.5 * torch.randn(n, generator=g, dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(z), generator=g)
    return z, y, torch.randint(0, 3, (n, 2), generator=g)


def test_guard_falls_back_when_no_strength_beats_the_base_held_out() -> None:
    z, y, f = _calibrated(0)  # seed 0: every strength's CV NLL is above the base's
    cal = SegmentCalibrator(["a", "b"], depth=2, min_rows=50)
    with pytest.warns(CalibrationWarning, match="the base map is kept"):
        res = cal.fit(z, y, f)
    assert res.fallback and math.isnan(res.reg) and min(res.cv_nll) >= res.cv_nll_base
    assert res.nll_after == res.nll_before
    assert torch.equal(cal(z, f), z)


def test_infinite_strength_is_platt_on_the_base_logits() -> None:
    scipy_optimize = pytest.importorskip("scipy.optimize")
    g = torch.Generator().manual_seed(11)
    z, y, f = make(3000, g)
    cal = SegmentCalibrator(COLUMNS[:2], depth=1, min_rows=50, reg=math.inf)
    res = cal.fit(z, y, f[:, :2])
    zn, yn = z.numpy(), y.numpy()

    def nll(w):
        t = w[0] * zn + w[1]
        return float((F.softplus(torch.tensor(t)) - torch.tensor(yn * t)).mean())

    ref = scipy_optimize.minimize(
        nll,
        [1.0, 0.0],
        method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-14, "maxiter": 5000},
    )
    assert float(cal.slope) == pytest.approx(ref.x[0], abs=1e-6)
    assert float(cal.intercept) == pytest.approx(ref.x[1], abs=1e-6)
    assert not bool(cal.slopes.any()) and not bool(cal.offsets.any())
    assert res.reg == math.inf and res.nll_after == pytest.approx(ref.fun, abs=1e-12)


def test_reported_nll_is_that_of_the_map() -> None:
    g = torch.Generator().manual_seed(12)
    z, y, f = make(2000, g)
    cal = SegmentCalibrator(COLUMNS[:3], depth=1, min_rows=50, reg=1e-3)
    res = cal.fit(z, y, f[:, :3])
    after = float(F.binary_cross_entropy_with_logits(cal(z, f[:, :3]), y))
    assert res.nll_after == pytest.approx(after, rel=1e-12)
    assert res.nll_before == pytest.approx(float(F.binary_cross_entropy_with_logits(z, y)))
    assert res.nll_after < res.nll_before


def test_the_seed_chooses_the_folds() -> None:
    z, y, f = _calibrated(1, n=1500)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        a = SegmentCalibrator(["a", "b"], depth=1, min_rows=50, seed=3).fit(z, y, f)
        b = SegmentCalibrator(["a", "b"], depth=1, min_rows=50, seed=4).fit(z, y, f)
    assert a.cv_nll != b.cv_nll


def test_forward_and_load_check_their_inputs() -> None:
    z, y, f = _calibrated(2, n=600)
    cal = SegmentCalibrator(["a", "b"], numeric=["b"], depth=1, min_rows=50, reg=1e-2)
    cal.fit(z, y, f.double())
    with pytest.raises(ValueError, match="^features: expected 10 rows"):
        cal(z[:10], f)
    state = cal.state_dict()
    with pytest.raises(ValueError, match="^offsets: expected finite"):
        SegmentCalibrator(["a", "b"], numeric=["b"]).load_state_dict(
            dict(state, offsets=state["offsets"] * float("nan"))
        )
    sizes = state["cut_sizes"].clone()
    sizes[1] = state["cuts"].shape[1] + 1
    with pytest.raises(ValueError, match="^cut_sizes: larger than cuts"):
        SegmentCalibrator(["a", "b"], numeric=["b"]).load_state_dict(dict(state, cut_sizes=sizes))


def test_stopping_at_max_iter_is_reported() -> None:
    from torchcal.functional.segment_fit import fit_segment_map

    g = torch.Generator().manual_seed(13)
    z, y, f = make(2000, g)
    sol = fit_segment_map(z, y, (f[:, 0] == 1)[None, :], reg=1e-3, max_iter=1)
    assert sol.messages and "raise max_iter" in sol.messages[0] and sol.grad_norm > 1e-9
    done = fit_segment_map(z, y, (f[:, 0] == 1)[None, :], reg=1e-3)
    assert done.messages == () and done.grad_norm <= 1e-9
