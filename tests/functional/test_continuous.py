"""Continuous proper scoring rules: peers, quadrature, brute force, gradients, numerics, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _ensemble_layouts import shared_layouts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck, gradgradcheck

import torchcal.functional as TF
from torchcal.functional import (
    crps_ensemble,
    crps_laplace,
    crps_logistic,
    crps_normal,
    dawid_sebastiani_score,
    energy_score,
    gaussian_nll,
    interval_score,
    quantile_score,
    validation_enabled,
)

D64 = torch.float64
CLOSED = {"normal": crps_normal, "laplace": crps_laplace, "logistic": crps_logistic}


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _t(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a), dtype=D64)


def _close(actual: torch.Tensor, expected, tol: float = 1e-12) -> None:
    expected = np.asarray(expected, dtype=np.float64)
    np.testing.assert_allclose(actual.detach().numpy(), expected, rtol=tol, atol=tol)


def _params(n: int = 200, seed: int = 0):
    rng = _rng(seed)
    loc = rng.normal(0, 3, n)
    scale = np.exp(rng.normal(0, 1, n))
    y = loc + scale * rng.normal(0, 3, n)  # z out to about +-10
    return loc, scale, y


# ------------------------------------------------------------------- peers, float64, 1e-12


def test_closed_forms_match_scoringrules_and_properscoring():
    sr = pytest.importorskip("scoringrules")
    ps = pytest.importorskip("properscoring")
    loc, scale, y = _params()
    args = (_t(loc), _t(scale), _t(y))
    _close(crps_normal(*args, reduction="none"), sr.crps_normal(y, loc, scale, backend="numpy"))
    _close(crps_normal(*args, reduction="none"), ps.crps_gaussian(y, loc, scale))
    _close(crps_laplace(*args, reduction="none"), sr.crps_laplace(y, loc, scale, backend="numpy"))
    _close(crps_logistic(*args, reduction="none"), sr.crps_logistic(y, loc, scale, backend="numpy"))


@pytest.mark.parametrize("m", [2, 3, 10, 51])
def test_crps_ensemble_matches_peers(m):
    sr = pytest.importorskip("scoringrules")
    ps = pytest.importorskip("properscoring")
    rng = _rng(m)
    x = rng.normal(2.0, 1.5, (40, m))
    x[0, 1] = x[0, 0]  # a tie
    y = rng.normal(2.0, 2.0, 40)
    y[1] = x[1, 0]  # target on a member
    for est in ("fair", "nrg"):
        ours = crps_ensemble(_t(x), _t(y), estimator=est, reduction="none")
        _close(ours, sr.crps_ensemble(y, x, estimator=est, backend="numpy"))
        # brute force O(M^2)
        pair = np.abs(x[:, :, None] - x[:, None, :]).sum((1, 2))
        den = 2 * m * (m - 1) if est == "fair" else 2 * m * m
        _close(ours, np.abs(x - y[:, None]).mean(1) - pair / den)
    _close(crps_ensemble(_t(x), _t(y), estimator="nrg", reduction="none"), ps.crps_ensemble(y, x))


def test_crps_ensemble_dim_broadcast_and_reductions():
    rng = _rng(1)
    x = rng.normal(size=(3, 7, 4))  # members on dim 1
    y = rng.normal(size=(3, 4))
    ref = crps_ensemble(_t(np.moveaxis(x, 1, -1)), _t(y), reduction="none")
    ours = crps_ensemble(_t(x), _t(y), ensemble_dim=1, reduction="none")
    assert ours.shape == (3, 4)
    _close(ours, ref.numpy())
    _close(crps_ensemble(_t(x), _t(y), ensemble_dim=-2, reduction="sum"), ref.sum().numpy())
    _close(crps_ensemble(_t(x), _t(y), ensemble_dim=1), ref.mean().numpy())
    # the target is never broadcast (issue 9 item 1): a scalar target for a (3, 4) batch
    # raises; pass the full shape explicitly
    with pytest.raises(ValueError, match=r"^target: expected shape \(\) to match"):
        crps_ensemble(_t(x), torch.tensor(0.5, dtype=D64), ensemble_dim=1)


def test_crps_ensemble_target_with_more_batch_dims_than_samples():
    # one ensemble (5, M) scored against 3 sets of observations (3, 5): samples broadcast
    rng = _rng(11)
    x = rng.normal(size=(5, 6))
    y = rng.normal(size=(3, 5))
    xt = _t(x).requires_grad_()
    ours = crps_ensemble(xt, _t(y), reduction="none")
    assert ours.shape == (3, 5)
    ref = crps_ensemble(_t(np.broadcast_to(x, (3, 5, 6)).copy()), _t(y), reduction="none")
    _close(ours, ref.numpy())
    (grad,) = torch.autograd.grad(ours.sum(), xt)
    assert grad.shape == (5, 6) and bool(torch.isfinite(grad).all())


# one ensemble shared by several targets: (samples shape, ensemble_dim, target shape)
SHARED = shared_layouts(41)


def _crps_brute(x: np.ndarray, y: np.ndarray, estimator: str) -> np.ndarray:
    """Kernel form, all pairs: mean |x_i - y| - sum_ij |x_i - x_j| / (2 M (M - 1) or 2 M^2)."""
    m = x.shape[-1]
    pair = np.abs(x[..., :, None] - x[..., None, :]).sum((-1, -2))
    den = 2 * m * (m - 1) if estimator == "fair" else 2 * m * m
    return np.abs(x - y[..., None]).mean(-1) - pair / den


@pytest.mark.parametrize(("shape", "dim", "target_shape"), SHARED)
@pytest.mark.parametrize("discrete", [False, True])
def test_crps_ensemble_shared_ensemble_equals_the_expanded_one(shape, dim, target_shape, discrete):
    # the sort-once path (prefix sums) against the per-target path on the expanded ensemble,
    # the O(M^2) kernel form and properscoring; ties and targets outside the members' range
    ps = pytest.importorskip("properscoring")
    rng = _rng(30)
    x, y = rng.normal(3.0, 2.0, shape), rng.normal(3.0, 3.0, target_shape)
    if discrete:
        x, y = np.round(x), np.round(y)
    y.reshape(-1)[:4] = [-1e3, 1e3, x.min(), x.max()]
    full = np.broadcast_to(np.moveaxis(x, dim, -1), (*target_shape, shape[dim])).copy()
    for est in ("fair", "nrg"):
        ours = crps_ensemble(_t(x), _t(y), estimator=est, ensemble_dim=dim, reduction="none")
        assert ours.shape == target_shape
        ref = crps_ensemble(_t(full), _t(y), estimator=est, reduction="none")
        scale = float(np.abs(y).max())  # the fair score may cancel to ~0: absolute part
        _close(ours, ref.numpy(), tol=1e-12)
        np.testing.assert_allclose(
            ours.numpy(), _crps_brute(full, y, est), rtol=1e-12, atol=1e-14 * scale
        )
        total = crps_ensemble(_t(x), _t(y), estimator=est, ensemble_dim=dim, reduction="sum")
        _close(total, ref.sum().numpy(), tol=1e-12)
    nrg = crps_ensemble(_t(x), _t(y), estimator="nrg", ensemble_dim=dim, reduction="none")
    _close(nrg, ps.crps_ensemble(y, full), tol=1e-12)


@pytest.mark.parametrize("estimator", ["fair", "nrg"])
def test_crps_ensemble_shared_ensemble_gradients_and_dtypes(estimator):
    g = torch.Generator().manual_seed(31)
    x = torch.randn(1, 7, dtype=D64, generator=g).requires_grad_()
    y = torch.randn(4, 5, dtype=D64, generator=g).requires_grad_()
    f = lambda a, b: crps_ensemble(a, b, estimator=estimator, reduction="none")  # noqa: E731
    assert gradcheck(f, (x, y)) and gradgradcheck(f, (x, y))
    # the same gradients as the expanded ensemble (no ties: the subgradient is unique)
    w = torch.rand(4, 5, dtype=D64, generator=g)
    grads = torch.autograd.grad((f(x, y) * w).sum(), (x, y))
    ref = torch.autograd.grad((f(x.expand(4, 5, 7), y) * w).sum(), (x, y))
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        low = crps_ensemble(x.detach().to(dtype), y.detach().to(dtype), estimator=estimator)
        full = crps_ensemble(
            x.detach().to(dtype).expand(4, 5, 7), y.detach().to(dtype), estimator=estimator
        )
        assert low.dtype == full.dtype == torch.float32
        torch.testing.assert_close(low, full, rtol=1e-6, atol=1e-6)


def test_crps_ensemble_shared_ensemble_is_fast():
    # the regression recipe's climatology: 20k members shared by 20k targets; the expanded
    # path would sort 20k rows of 20k (seconds, 3 GB); sorted once it takes milliseconds
    import time

    g = torch.Generator().manual_seed(32)
    x, y = torch.randn(20_000, generator=g, dtype=D64), torch.randn(20_000, generator=g, dtype=D64)
    crps_ensemble(x[:10], y[:10])  # warm-up
    start = time.perf_counter()
    got = crps_ensemble(x, y, estimator="nrg")
    assert time.perf_counter() - start < 1.0
    # E CRPS(N(0,1) law, y ~ N(0,1)) = 1/sqrt(pi), within sampling error
    assert float(got) == pytest.approx(1 / math.sqrt(math.pi), abs=0.01)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, D64])
def test_crps_ensemble_numpy_sort_path_layouts_and_modes(dtype):
    # CPU path sorts with numpy: non-contiguous members, every float dtype, grad-requiring
    # inputs and inference mode must all give the O(M^2) reference.
    ps = pytest.importorskip("properscoring")
    g = torch.Generator().manual_seed(12)
    base = torch.randn(9, 2 * 7, generator=g).to(dtype)
    x = base[:, ::2]  # non-contiguous, stride 2
    y = torch.randn(9, generator=g).to(dtype)
    ref = ps.crps_ensemble(y.double().numpy(), x.double().numpy())
    tol = 1e-12 if dtype == D64 else (1e-6 if dtype == torch.float32 else 1e-5)
    xg = x.clone().T.requires_grad_()  # members on dim 0, transposed view
    out = crps_ensemble(xg, y, estimator="nrg", ensemble_dim=0, reduction="none")
    np.testing.assert_allclose(out.detach().double().numpy(), ref, rtol=tol, atol=tol)
    out.sum().backward()
    assert xg.grad.dtype == dtype and bool(torch.isfinite(xg.grad).all())
    with torch.inference_mode():
        inf = crps_ensemble(x, y, estimator="nrg", reduction="none")
    np.testing.assert_allclose(inf.double().numpy(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("estimator", ["fair", "nrg"])
def test_energy_score_matches_scoringrules_and_brute_force(estimator):
    sr = pytest.importorskip("scoringrules")
    rng = _rng(2)
    x = rng.normal(1.0, 2.0, (2, 5, 9, 3))
    y = rng.normal(1.0, 2.0, (2, 5, 3))
    ours = energy_score(_t(x), _t(y), estimator=estimator, reduction="none")
    assert ours.shape == (2, 5)
    _close(ours, sr.es_ensemble(y, x, estimator=estimator, backend="numpy"))
    m = x.shape[-2]
    pair = np.linalg.norm(x[..., :, None, :] - x[..., None, :, :], axis=-1).sum((-1, -2))
    den = 2 * m * (m - 1) if estimator == "fair" else 2 * m * m
    _close(ours, np.linalg.norm(x - y[..., None, :], axis=-1).mean(-1) - pair / den)
    # D = 1 is the ensemble CRPS
    _close(
        energy_score(_t(x[..., :1]), _t(y[..., :1]), estimator=estimator, reduction="none"),
        crps_ensemble(_t(x[..., 0]), _t(y[..., 0]), estimator=estimator, reduction="none").numpy(),
    )


def test_interval_score_matches_scoringrules():
    sr = pytest.importorskip("scoringrules")
    rng = _rng(3)
    centre, width = rng.normal(size=(50, 4)), np.exp(rng.normal(size=(50, 4)))
    lo, hi = centre - width, centre + width
    y = rng.normal(0, 2, 50)
    alphas = np.array([0.05, 0.1, 0.5, 0.9])
    # K levels at once as scoringrules: bounds (N, K), alpha (K,), target (N,)
    ours = interval_score(_t(lo), _t(hi), _t(y), alpha=_t(alphas), reduction="none")
    assert ours.shape == (50, 4)
    _close(ours, sr.interval_score(y, lo, hi, alphas, backend="numpy"))
    # the same with the target of the full shape; an (N, 1) target raises
    full = interval_score(
        _t(lo), _t(hi), _t(y)[:, None].expand(50, 4), alpha=_t(alphas), reduction="none"
    )
    _close(full, ours.numpy())
    with pytest.raises(ValueError, match="^target"):
        interval_score(_t(lo), _t(hi), _t(y)[:, None], alpha=_t(alphas))
    ours_f = interval_score(_t(lo[:, 0]), _t(hi[:, 0]), _t(y), alpha=0.2, reduction="none")
    _close(ours_f, sr.interval_score(y, lo[:, 0], hi[:, 0], 0.2, backend="numpy"))


def test_quantile_score_matches_scoringrules_1x_convention():
    sr = pytest.importorskip("scoringrules")
    rng = _rng(4)
    levels = np.array([0.05, 0.25, 0.5, 0.75, 0.95])
    pred = np.sort(rng.normal(size=(30, 5)), axis=-1)
    y = rng.normal(size=30)
    ours = quantile_score(_t(pred), _t(y), _t(levels), reduction="none")
    assert ours.shape == (30, 5)
    _close(ours, sr.quantile_score(y[:, None], pred, levels, backend="numpy"))
    _close(quantile_score(_t(pred), _t(y), levels.tolist()), ours.mean().numpy())
    # the 1x convention: level 0.5 is half the absolute error
    _close(ours[:, 2], 0.5 * np.abs(y - pred[:, 2]))


def test_quantile_score_approximates_half_crps():
    # mean pinball over dense levels of the true quantiles -> CRPS / 2 (Laio & Tamea 2007)
    from scipy.stats import norm

    levels = (np.arange(4000) + 0.5) / 4000
    q = norm.ppf(levels)
    y = np.array([-1.3, 0.2, 2.5])
    qs = quantile_score(_t(np.tile(q, (3, 1))), _t(y), _t(levels), reduction="none").mean(-1)
    crps = crps_normal(torch.zeros(3, dtype=D64), torch.ones(3, dtype=D64), _t(y), reduction="none")
    np.testing.assert_allclose(2 * qs.numpy(), crps.numpy(), atol=2e-4)


def test_gaussian_nll_and_dss_against_references():
    from scipy.stats import norm

    loc, scale, y = _params(50, seed=5)
    _close(gaussian_nll(_t(loc), _t(scale), _t(y), reduction="none"), -norm.logpdf(y, loc, scale))
    _close(
        gaussian_nll(_t(loc), target=_t(y), var=_t(scale**2), reduction="none"),
        -norm.logpdf(y, loc, scale),
    )
    torch_nll = torch.nn.functional.gaussian_nll_loss(
        _t(loc), _t(y), _t(scale**2), full=False, reduction="none"
    )
    _close(
        gaussian_nll(_t(loc), target=_t(y), var=_t(scale**2), full=False, reduction="none"),
        torch_nll.numpy(),
    )
    dss = dawid_sebastiani_score(_t(loc), _t(scale), _t(y), reduction="none")
    _close(dss, ((y - loc) / scale) ** 2 + 2 * np.log(scale))
    assert dawid_sebastiani_score(
        torch.tensor(1.0), torch.tensor(2.0), torch.tensor(5.0)
    ).item() == pytest.approx(4 + 2 * math.log(2))


# ------------------------------------------------------------------------------ quadrature


def _quad_crps(cdf, sf, y: float) -> float:
    """integral of (F(x) - 1{x >= y})^2, split at y; tight tolerances."""
    from scipy.integrate import quad

    kw = dict(epsabs=1e-14, epsrel=1e-14, limit=500)
    lower = quad(lambda x: cdf(x) ** 2, -np.inf, y, **kw)[0]
    upper = quad(lambda x: sf(x) ** 2, y, np.inf, **kw)[0]
    return lower + upper


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
def test_closed_forms_match_quadrature():
    from scipy.special import expit
    from scipy.stats import laplace, norm

    cases = [(0.0, 1.0, 0.0), (0.3, 0.7, 1.9), (-2.0, 3.0, -9.0), (1.0, 0.2, 0.1), (5.0, 2.0, 5.5)]
    families = {
        "normal": lambda m, s: (lambda x: norm.cdf(x, m, s), lambda x: norm.sf(x, m, s)),
        "laplace": lambda m, s: (lambda x: laplace.cdf(x, m, s), lambda x: laplace.sf(x, m, s)),
        "logistic": lambda m, s: (lambda x: expit((x - m) / s), lambda x: expit(-(x - m) / s)),
    }
    for name, fn in CLOSED.items():
        for m, s, y in cases:
            ref = _quad_crps(*families[name](m, s), y)
            ours = fn(
                torch.tensor(m, dtype=D64), torch.tensor(s, dtype=D64), torch.tensor(y, dtype=D64)
            ).item()
            # measured: at most 4.4e-16 apart on these cases (quad warns of roundoff)
            assert abs(ours - ref) <= 1e-12 * max(1.0, abs(ref)), (name, m, s, y, ours, ref)


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("name", list(CLOSED))
def test_closed_form_gradcheck_and_gradgradcheck(name):
    fn = CLOSED[name]
    g = torch.Generator().manual_seed(1)
    loc = torch.randn(4, 1, dtype=D64, generator=g).requires_grad_()
    scale = (torch.rand(1, 3, dtype=D64, generator=g) + 0.3).requires_grad_()  # broadcast
    y = (torch.randn(4, 3, dtype=D64, generator=g) * 2).requires_grad_()

    def f(a, b, c):
        return fn(a, b, c, reduction="none")

    assert gradcheck(f, (loc, scale, y))
    assert gradgradcheck(f, (loc, scale, y))


def _naive_normal(loc, scale, y):
    z = (y - loc) / scale
    phi = torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + torch.erf(z / math.sqrt(2)))
    return scale * (z * (2 * cdf - 1) + 2 * phi - 1 / math.sqrt(math.pi))


def _scale_grad_reference(name: str, z: np.ndarray) -> np.ndarray:
    """float64 references for d CRPS / d scale written independently (scipy)."""
    from scipy.special import expit, log1p
    from scipy.stats import norm

    a = np.abs(z)
    if name == "normal":
        return 2 * norm.pdf(z) - 1 / np.sqrt(np.pi)
    if name == "laplace":
        return np.exp(-a) * (1 + a) - 0.75
    # logistic: g(z) - z g'(z), g = z - 2 log F(z) - 1, g' = 2F(z) - 1
    with np.errstate(over="ignore"):
        return 2 * log1p(np.exp(-a)) + 2 * a * expit(-a) - 1


@pytest.mark.parametrize("name", list(CLOSED))
def test_scale_gradient_float32_relative_accuracy_large_z(name):
    # |z| from about 1.6 (away from the root of d/dscale) to 1e7, both signs
    mag = np.logspace(0.2, 7, 60)
    z = np.concatenate([mag, -mag]).astype(np.float32)
    scale = np.float32(0.37)
    y = (z.astype(np.float64) * np.float64(scale)).astype(np.float32)  # exact float32 inputs
    loc = torch.zeros(z.size, requires_grad=True)
    sc = torch.full((z.size,), float(scale), requires_grad=True)
    tgt = torch.tensor(y, requires_grad=True)
    CLOSED[name](loc, sc, tgt, reduction="sum").backward()
    z64 = y.astype(np.float64) / np.float64(scale)
    ref = _scale_grad_reference(name, z64)
    np.testing.assert_allclose(sc.grad.double().numpy(), ref, rtol=1e-6, atol=0)
    # d/dloc = -d/dtarget, bounded by 1 with the sign of z
    assert torch.equal(loc.grad, -tgt.grad)
    assert torch.all(tgt.grad.abs() <= 1) and torch.all(torch.sign(tgt.grad) == torch.sign(tgt))


@pytest.mark.parametrize("name", list(CLOSED))
def test_gradient_limits_as_scale_goes_to_zero(name):
    # CRPS -> |y - mu| as scale -> 0: d/dtarget -> sign, d/dscale -> g(inf) - z g'(z) limit
    limit = {"normal": -1 / math.sqrt(math.pi), "laplace": -0.75, "logistic": -1.0}[name]
    # 1e-40 and 5e-324 are subnormal: |y| / scale overflows to inf, z = inf must not NaN
    for dtype, tiny in (
        (torch.float32, 1e-30),
        (torch.float64, 1e-300),
        (torch.float32, 1e-40),
        (torch.float64, 5e-324),
    ):
        loc = torch.zeros(2, dtype=dtype, requires_grad=True)
        scale = torch.full((2,), tiny, dtype=dtype, requires_grad=True)
        y = torch.tensor([1.5, -2.0], dtype=dtype, requires_grad=True)
        out = CLOSED[name](loc, scale, y, reduction="none")
        torch.testing.assert_close(out, y.detach().abs())
        out.sum().backward()
        torch.testing.assert_close(scale.grad, torch.full_like(scale, limit))
        torch.testing.assert_close(y.grad, torch.tensor([1.0, -1.0], dtype=dtype))
    # plain autograd through the textbook formula is broken there
    loc = torch.zeros(1, dtype=D64, requires_grad=True)
    scale = torch.full((1,), 1e-300, dtype=D64, requires_grad=True)
    _naive_normal(loc, scale, torch.ones(1, dtype=D64)).sum().backward()
    assert not torch.isfinite(scale.grad).all() or scale.grad.item() != pytest.approx(
        -1 / math.sqrt(math.pi)
    )


def test_sample_scores_gradcheck():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 6, dtype=D64, generator=g).requires_grad_()
    y = torch.randn(3, dtype=D64, generator=g).requires_grad_()
    for est in ("fair", "nrg"):
        assert gradcheck(
            lambda a, b, e=est: crps_ensemble(a, b, estimator=e, reduction="none"), (x, y)
        )
        assert gradgradcheck(lambda a, b, e=est: crps_ensemble(a, b, estimator=e), (x, y))
    xs = torch.randn(2, 5, 3, dtype=D64, generator=g).requires_grad_()
    ys = torch.randn(2, 3, dtype=D64, generator=g).requires_grad_()
    for est in ("fair", "nrg"):
        assert gradcheck(
            lambda a, b, e=est: energy_score(a, b, estimator=e, reduction="none"), (xs, ys)
        )


def test_energy_score_gradient_finite_at_coincident_members():
    x = torch.zeros(1, 3, 2, dtype=D64, requires_grad=True)  # all members equal
    y = torch.zeros(1, 2, dtype=D64, requires_grad=True)  # and equal to the target
    energy_score(x, y).backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(y.grad).all()


def test_remaining_functions_gradcheck():
    g = torch.Generator().manual_seed(4)
    lo = torch.randn(8, dtype=D64, generator=g)
    hi = (lo + torch.rand(8, dtype=D64, generator=g) + 0.2).requires_grad_()
    lo.requires_grad_()
    y = (torch.randn(8, dtype=D64, generator=g) * 2).requires_grad_()
    assert gradcheck(
        lambda a, b, c: interval_score(a, b, c, alpha=0.3, reduction="none"), (lo, hi, y)
    )
    pred = torch.randn(5, 3, dtype=D64, generator=g).requires_grad_()
    t = torch.randn(5, dtype=D64, generator=g).requires_grad_()
    assert gradcheck(
        lambda a, b: quantile_score(a, b, [0.1, 0.5, 0.9], reduction="none"), (pred, t)
    )
    loc = torch.randn(6, dtype=D64, generator=g).requires_grad_()
    sc = (torch.rand(6, dtype=D64, generator=g) + 0.5).requires_grad_()
    tg = torch.randn(6, dtype=D64, generator=g).requires_grad_()
    assert gradcheck(lambda a, b, c: gaussian_nll(a, b, c, reduction="none"), (loc, sc, tg))
    assert gradcheck(
        lambda a, b, c: gaussian_nll(a, target=c, var=b, reduction="none"), (loc, sc, tg)
    )
    assert gradcheck(
        lambda a, b, c: dawid_sebastiani_score(a, b, c, reduction="none"), (loc, sc, tg)
    )


# ------------------------------------------------------------------------------- float32


@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_float32_sample_scores_at_offset(offset):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(500, 50, generator=g) + offset).float()
    y = (torch.randn(500, generator=g) * 1.3 + offset).float()
    for est in ("fair", "nrg"):
        ours = crps_ensemble(x, y, estimator=est, reduction="none")
        ref = crps_ensemble(x.double(), y.double(), estimator=est, reduction="none")
        assert (ours.double() - ref).abs().max().item() <= 2e-6
    xs = (torch.randn(200, 30, 3, generator=g) + offset).float()
    ys = (torch.randn(200, 3, generator=g) + offset).float()
    for est in ("fair", "nrg"):
        ours = energy_score(xs, ys, estimator=est, reduction="none")
        ref = energy_score(xs.double(), ys.double(), estimator=est, reduction="none")
        assert (ours.double() - ref).abs().max().item() <= 2e-6


@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_float32_closed_forms_vs_float64(offset):
    loc, scale, y = _params(300, seed=6)
    f32 = [torch.tensor(a, dtype=torch.float32) for a in (loc + offset, scale, y + offset)]
    for fn in CLOSED.values():
        ours = fn(*f32, reduction="none").double()
        ref = fn(*(a.double() for a in f32), reduction="none")
        torch.testing.assert_close(ours, ref, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_and_autocast_are_finite(dtype):
    g = torch.Generator().manual_seed(7)
    loc, scale, y = torch.randn(16, generator=g), torch.rand(16, generator=g) + 0.1, torch.randn(16)
    x, xs = torch.randn(16, 8, generator=g) + 100, torch.randn(16, 8, 2, generator=g)
    lo, hi = torch.zeros(16), torch.ones(16)
    pred = torch.sort(torch.randn(16, 3, generator=g), dim=-1).values

    def run(cast):
        outs = [fn(cast(loc), cast(scale), cast(y)) for fn in CLOSED.values()]
        outs += [
            crps_ensemble(cast(x), cast(y)),
            energy_score(cast(xs), cast(torch.zeros(16, 2))),
            interval_score(cast(lo), cast(hi), cast(y), alpha=0.1),
            quantile_score(cast(pred), cast(y), [0.1, 0.5, 0.9]),
            gaussian_nll(cast(loc), cast(scale), cast(y)),
            dawid_sebastiani_score(cast(loc), cast(scale), cast(y)),
        ]
        return outs

    low = run(lambda t: t.to(dtype))
    full = run(lambda t: t)
    for a, b in zip(low, full):
        assert a.dtype == torch.float32 and torch.isfinite(a)
        assert abs(a.item() - b.item()) <= 0.05 * max(1.0, abs(b.item()))
    # under autocast, with gradients
    p = torch.randn(16, requires_grad=True)
    with torch.autocast("cpu", dtype=dtype):
        h = torch.mm(p[None, :], torch.eye(16))[0]  # autocast runs mm in low precision
        assert h.dtype == dtype
        out = crps_normal(h, scale, y) + crps_ensemble(x + h[:, None], y)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(p.grad).all()


# -------------------------------------------------------------------------------- training


def _fit_sigma(estimator: str) -> float:
    g = torch.Generator().manual_seed(0)
    log_sigma = torch.zeros((), requires_grad=True)
    opt = torch.optim.Adam([log_sigma], lr=0.05)
    history = []
    for step in range(200):
        eps = torch.randn(4096, 4, generator=g)  # M = 4 members per row, re-drawn per step
        y = torch.randn(4096, generator=g)
        loss = crps_ensemble(log_sigma.exp() * eps, y, estimator=estimator)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= 100:
            history.append(log_sigma.exp().item())
    return float(np.mean(history))


def test_training_fair_learns_true_spread_nrg_underdisperses():
    fair = _fit_sigma("fair")
    assert abs(fair - 1.0) <= 0.03
    nrg = _fit_sigma("nrg")
    # expected nrg score sqrt(2/pi) sqrt(1+s^2) - (M-1)/M s/sqrt(pi) is minimal at
    # s / sqrt(1 + s^2) = 3 / (4 sqrt 2): s = 0.6255 for M = 4
    r = 3 / (4 * math.sqrt(2))
    assert 0.58 <= nrg <= 0.70
    assert abs(nrg - r / math.sqrt(1 - r * r)) <= 0.02


# ------------------------------------------------------------------------------- bad input

_V = torch.ones(3)
_S = torch.ones(3, 4)
_NAN = torch.tensor([1.0, float("nan"), 1.0])
_INF = torch.tensor([1.0, float("inf"), 1.0])
_NEG = torch.tensor([1.0, -1.0, 1.0])
_ZERO = torch.tensor([1.0, 0.0, 1.0])
_E = torch.ones(0)
_Q = [0.1, 0.5, 0.9]

BAD = [
    # (id, call, first word of the message)
    *[(f"{n}-nan-loc", lambda f=f: f(_NAN, _V, _V), "loc") for n, f in CLOSED.items()],
    *[(f"{n}-inf-target", lambda f=f: f(_V, _V, _INF), "target") for n, f in CLOSED.items()],
    *[(f"{n}-neg-scale", lambda f=f: f(_V, _NEG, _V), "scale") for n, f in CLOSED.items()],
    *[(f"{n}-zero-scale", lambda f=f: f(_V, _ZERO, _V), "scale") for n, f in CLOSED.items()],
    *[(f"{n}-shape", lambda f=f: f(_V, _V, torch.ones(4)), "target") for n, f in CLOSED.items()],
    *[(f"{n}-empty", lambda f=f: f(_E, _E, _E), "loc") for n, f in CLOSED.items()],
    *[
        (f"{n}-reduction", lambda f=f: f(_V, _V, _V, reduction="avg"), "reduction")
        for n, f in CLOSED.items()
    ],
    *[
        (f"{n}-int", lambda f=f: f(_V, _V, torch.ones(3, dtype=torch.long)), "target")
        for n, f in CLOSED.items()
    ],
    ("ens-nan", lambda: crps_ensemble(_S.clone().fill_(float("nan")), _V), "samples"),
    ("ens-inf-target", lambda: crps_ensemble(_S, _INF), "target"),
    ("ens-shape", lambda: crps_ensemble(_S, torch.ones(4)), "target"),
    ("ens-m1-fair", lambda: crps_ensemble(torch.ones(3, 1), _V), "samples"),
    ("ens-estimator", lambda: crps_ensemble(_S, _V, estimator="pwm"), "estimator"),
    ("ens-reduction", lambda: crps_ensemble(_S, _V, reduction=None), "reduction"),
    ("ens-dim", lambda: crps_ensemble(_S, _V, ensemble_dim=2), "ensemble_dim"),
    ("ens-empty", lambda: crps_ensemble(torch.ones(0, 4), torch.ones(0)), "samples"),
    ("ens-empty-target", lambda: crps_ensemble(_S, _E), "target"),
    (
        "es-nan",
        lambda: energy_score(torch.full((3, 4, 2), float("nan")), torch.ones(3, 2)),
        "samples",
    ),
    ("es-dim", lambda: energy_score(torch.ones(3, 4, 2), torch.ones(3, 3)), "target"),
    ("es-batch", lambda: energy_score(torch.ones(3, 4, 2), torch.ones(5, 2)), "target"),
    ("es-m1", lambda: energy_score(torch.ones(3, 1, 2), torch.ones(3, 2)), "samples"),
    ("es-1d", lambda: energy_score(torch.ones(4), torch.ones(4)), "samples"),
    (
        "es-estimator",
        lambda: energy_score(torch.ones(3, 4, 2), torch.ones(3, 2), estimator="x"),
        "estimator",
    ),
    ("es-empty", lambda: energy_score(torch.ones(0, 4, 2), torch.ones(0, 2)), "samples"),
    ("is-lower-gt-upper", lambda: interval_score(_V * 2, _V, _V, alpha=0.1), "upper"),
    ("is-alpha-0", lambda: interval_score(_V, _V, _V, alpha=0.0), "alpha"),
    ("is-alpha-1", lambda: interval_score(_V, _V, _V, alpha=1.0), "alpha"),
    (
        "is-alpha-tensor",
        lambda: interval_score(_V, _V, _V, alpha=torch.tensor([0.1, 1.5, 0.2])),
        "alpha",
    ),
    ("is-alpha-nan", lambda: interval_score(_V, _V, _V, alpha=float("nan")), "alpha"),
    ("is-nan", lambda: interval_score(_V, _V, _NAN, alpha=0.1), "target"),
    ("is-shape", lambda: interval_score(_V, torch.ones(2), _V, alpha=0.1), "upper"),
    ("is-empty", lambda: interval_score(_E, _E, _E, alpha=0.1), "lower"),
    ("is-reduction", lambda: interval_score(_V, _V, _V, alpha=0.1, reduction="x"), "reduction"),
    ("qs-level-0", lambda: quantile_score(_S[:, :3], _V, [0.0, 0.5, 0.9]), "quantiles"),
    ("qs-level-1", lambda: quantile_score(_S[:, :3], _V, [0.1, 0.5, 1.0]), "quantiles"),
    ("qs-q-mismatch", lambda: quantile_score(_S, _V, _Q), "pred"),
    ("qs-target-shape", lambda: quantile_score(_S[:, :3], torch.ones(4), _Q), "target"),
    ("qs-levels-2d", lambda: quantile_score(_S[:, :3], _V, torch.full((1, 3), 0.5)), "quantiles"),
    ("qs-nan", lambda: quantile_score(_S[:, :3], _NAN, _Q), "target"),
    ("qs-empty", lambda: quantile_score(torch.ones(0, 3), torch.ones(0), _Q), "pred"),
    ("nll-neg-var", lambda: gaussian_nll(_V, _NEG, _V, var=True), "spread"),
    ("nll-zero-scale", lambda: gaussian_nll(_V, _ZERO, _V), "spread"),
    ("nll-nan", lambda: gaussian_nll(_NAN, _V, _V, var=True), "loc"),
    ("nll-shape", lambda: gaussian_nll(_V, _V, torch.ones(2), var=True), "target"),
    ("nll-empty", lambda: gaussian_nll(_E, _E, _E, var=True), "loc"),
    ("dss-neg", lambda: dawid_sebastiani_score(_V, _NEG, _V), "scale"),
    ("dss-inf", lambda: dawid_sebastiani_score(_V, _V, _INF), "target"),
    ("dss-reduction", lambda: dawid_sebastiani_score(_V, _V, _V, reduction="x"), "reduction"),
]


@pytest.mark.parametrize("call,arg", [(c, a) for _, c, a in BAD], ids=[i for i, _, _ in BAD])
def test_bad_input_raises_value_error_naming_argument(call, arg):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(f"{arg}:"), str(info.value)


def test_value_checks_can_be_disabled():
    with validation_enabled(False):
        out = crps_normal(_V, _NEG, _V, reduction="none")  # garbage in, no raise
    assert out.shape == (3,)
    with pytest.raises(ValueError, match="^samples"):  # size rules still hold
        with validation_enabled(False):
            crps_ensemble(torch.ones(3, 1), _V)


def test_exports():
    for name in CLOSED:
        assert getattr(TF, f"crps_{name}") is CLOSED[name]


# ------------------------------------------------------------------------------ hypothesis

_small = st.floats(-1e3, 1e3, allow_nan=False, width=64)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    m=st.integers(1, 6),
    est=st.sampled_from(["fair", "nrg"]),
    seed=st.integers(0, 2**16),
    scale=st.floats(1e-3, 1e3),
    shift=_small,
)
def test_hypothesis_ensemble_and_closed_forms(batch, m, est, seed, scale, shift):
    rng = _rng(seed)
    x = rng.normal(shift, scale, (*batch, m))
    y = rng.normal(shift, scale, tuple(batch))
    if est == "fair" and m < 2:
        with pytest.raises(ValueError, match="^samples"):
            crps_ensemble(_t(x), _t(y), estimator=est)
        return
    ours = crps_ensemble(_t(x), _t(y), estimator=est, reduction="none")
    assert ours.shape == tuple(batch)
    pair = np.abs(x[..., :, None] - x[..., None, :]).sum((-1, -2))
    den = 2 * m * (m - 1) if est == "fair" else 2 * m * m
    ref = np.abs(x - y[..., None]).mean(-1) - pair / den
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-9, atol=1e-9 * scale)
    # a closed form at the sample mean / std is finite, non-negative, right shape
    sd = np.abs(x.std(-1)) + scale * 1e-3
    for fn in CLOSED.values():
        c = fn(_t(x.mean(-1)), _t(sd), _t(y), reduction="none")
        assert c.shape == tuple(batch) and bool((c >= 0).all()) and bool(torch.isfinite(c).all())
    # a non-broadcastable trailing dim raises naming target
    if batch and batch[-1] > 1:
        bad = list(batch)
        bad[-1] += 1
        with pytest.raises(ValueError, match="^target"):
            crps_ensemble(_t(x), torch.zeros(bad, dtype=D64), estimator=est)


def test_crps_ensemble_torch_sort_path_matches(monkeypatch):
    # small inputs and off-CPU devices sort with torch.sort, large CPU ones with numpy's
    # argsort; check that both paths give the same values and grads
    from torchcal.functional import crps

    g = torch.Generator().manual_seed(8)
    x = torch.randn(7, 9, dtype=D64, generator=g).requires_grad_()
    y = torch.randn(7, dtype=D64, generator=g).requires_grad_()
    monkeypatch.setattr(crps, "_TORCH_SORT_MEMBERS", 0)
    monkeypatch.setattr(crps, "_TORCH_SORT_VALUES", 0)
    out = crps_ensemble(x, y, reduction="none")
    gx, gy = torch.autograd.grad(out.sum(), (x, y))
    monkeypatch.setattr(crps, "_TORCH_SORT_MEMBERS", 10**9)
    monkeypatch.setattr(crps, "_TORCH_SORT_VALUES", 10**9)
    out2 = crps_ensemble(x, y, reduction="none")
    gx2, gy2 = torch.autograd.grad(out2.sum(), (x, y))
    torch.testing.assert_close(out2, out, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(gx2, gx, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(gy2, gy, rtol=1e-14, atol=1e-14)


def test_crps_ensemble_gradient_equals_autograd_of_pairwise_formula():
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(6, 11, dtype=D64, generator=g) * 3).requires_grad_()
    y = torch.randn(6, dtype=D64, generator=g).requires_grad_()
    w = torch.rand(6, dtype=D64, generator=g)  # a non-uniform upstream gradient
    for est, den in (("fair", 2 * 11 * 10), ("nrg", 2 * 11 * 11)):
        ours = torch.autograd.grad(
            (crps_ensemble(x, y, estimator=est, reduction="none") * w).sum(), (x, y)
        )
        brute = (x - y[:, None]).abs().mean(-1) - (x[:, :, None] - x[:, None, :]).abs().sum(
            (-1, -2)
        ) / den
        ref = torch.autograd.grad((brute * w).sum(), (x, y))
        for a, b in zip(ours, ref):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_energy_score_double_backward_is_documented_unsupported():
    x = torch.randn(2, 4, 3, dtype=D64, requires_grad=True)
    (gx,) = torch.autograd.grad(energy_score(x, torch.zeros(2, 3, dtype=D64)), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="cdist"):
        gx.sum().backward()


_THREE_ARG = {**CLOSED, "dss": dawid_sebastiani_score, "nll": gaussian_nll}


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    fn=st.sampled_from(list(_THREE_ARG)),
    which=st.integers(0, 2),
    bad=st.sampled_from(["nan", "inf", "-inf", "neg"]),
    pos=st.integers(0, 10**6),
)
def test_hypothesis_bad_values_name_the_argument(shape, fn, which, bad, pos):
    names = ("loc", "spread" if fn == "nll" else "scale", "target")
    args = [torch.ones(shape) for _ in range(3)]
    flat = args[which].reshape(-1)
    if bad == "neg":
        if which != 1:  # only the scale has a sign constraint
            return
        flat[pos % flat.numel()] = -0.5
    else:
        flat[pos % flat.numel()] = float(bad)
    with pytest.raises(ValueError) as info:
        _THREE_ARG[fn](*args)
    assert str(info.value).startswith(names[which] + ":")
    assert "position" in str(info.value)


# --------------------------------------------- shape contract: the target is never broadcast


def test_n_by_1_target_raises_instead_of_scoring_all_pairs():
    # issue 9 item 1: crps_normal(loc, sc, y[:, None]) silently scored N x N pairs (1.357
    # here, right: 1.506, the mean of the N per-item scores from scipy's closed form)
    from scipy.stats import norm

    rng = _rng(31)
    loc, scale, y = rng.normal(size=64), np.exp(rng.normal(size=64)), rng.normal(size=64) * 3
    z = (y - loc) / scale
    ref = np.mean(scale * (z * (2 * norm.cdf(z) - 1) + 2 * norm.pdf(z) - 1 / np.sqrt(np.pi)))
    _close(crps_normal(_t(loc), _t(scale), _t(y)), np.float64(ref))
    pairs = crps_normal(_t(loc), _t(scale), _t(y)[:, None].expand(64, 64)).item()
    assert abs(pairs - ref) > 0.05  # the plausible wrong number the broadcast used to give
    with pytest.raises(ValueError, match=r"^target: expected shape .* never broadcast"):
        crps_normal(_t(loc), _t(scale), _t(y)[:, None])
    # the predictions in (N, 1) against an (N,) target would broadcast too
    with pytest.raises(ValueError, match="^target: expected shape"):
        crps_normal(_t(loc)[:, None], _t(scale)[:, None], _t(y))


N_BY_1 = {
    "crps_normal": lambda y, v: crps_normal(v, v.abs() + 1, y),
    "crps_laplace": lambda y, v: crps_laplace(v, v.abs() + 1, y),
    "crps_logistic": lambda y, v: crps_logistic(v, v.abs() + 1, y),
    "dss": lambda y, v: dawid_sebastiani_score(v, v.abs() + 1, y),
    "nll": lambda y, v: gaussian_nll(v, v.abs() + 1, y),
    "nll_var": lambda y, v: gaussian_nll(v, target=y, var=v.abs() + 1),
    "interval": lambda y, v: interval_score(v - 1, v + 1, y, alpha=0.1),
    "quantile": lambda y, v: quantile_score(v[:, None] + torch.tensor([-1.0, 1.0]), y, [0.1, 0.9]),
    "ensemble": lambda y, v: crps_ensemble(v[:, None] + torch.tensor([-1.0, 0.0, 1.0]), y),
    "energy": lambda y, v: energy_score(
        torch.stack([v, v + 1], -1)[:, :, None].expand(-1, -1, 2), y[..., None].expand(*y.shape, 2)
    ),
}


@pytest.mark.parametrize("name", list(N_BY_1))
def test_every_continuous_score_rejects_a_broadcasting_target(name):
    v = torch.linspace(-2, 2, 6)
    y = torch.linspace(-1, 3, 6)
    good = N_BY_1[name](y, v)
    assert good.shape == () and torch.isfinite(good)
    with pytest.raises(ValueError, match="^target:"):
        N_BY_1[name](y[:, None], v)


def test_forecast_parameters_may_broadcast_to_the_target():
    # a scalar scale (or one shared ensemble) broadcasts up to the target: same numbers
    loc, y = torch.randn(5, dtype=D64), torch.randn(5, dtype=D64)
    torch.testing.assert_close(
        crps_normal(loc, torch.tensor(2.0, dtype=D64), y, reduction="none"),
        crps_normal(loc, torch.full((5,), 2.0, dtype=D64), y, reduction="none"),
        rtol=0,
        atol=0,
    )


def test_gaussian_nll_argument_order_is_forecast_then_target():
    # (loc, spread, target) like crps_normal; the old (loc, target, var=...) call fails
    # loudly instead of running with swapped arguments
    loc, sd, y = torch.tensor([0.0]), torch.tensor([2.0]), torch.tensor([1.0])
    ref = 0.5 * math.log(2 * math.pi) + math.log(2.0) + 0.5 * (1.0 / 2.0) ** 2
    assert gaussian_nll(loc, sd, y).item() == pytest.approx(ref, rel=1e-6)
    assert gaussian_nll(loc, target=y, var=sd**2).item() == pytest.approx(ref, rel=1e-6)
    with pytest.raises(TypeError, match="spread twice"):  # torch's order: spread given twice
        gaussian_nll(loc, y, var=sd**2)
    with pytest.raises(TypeError):  # no keyword scale
        gaussian_nll(loc, y, scale=sd)
    with pytest.raises(TypeError, match="spread twice"):
        gaussian_nll(loc, sd, y, var=sd**2)
    with pytest.raises(TypeError, match="^var: expected a Tensor"):
        gaussian_nll(loc, target=y, var=4.0)


def test_gaussian_nll_spread_by_name():
    """var=s**2 and sd=s give the same value (float32 rounding); the positional spread is the
    sd. Its errors (both names, none, a missing target, bad values) are checked with the
    loss's and the metric's in tests/losses/test_losses_regression_names.py."""
    g = torch.Generator().manual_seed(3)
    loc, y = torch.randn(50, generator=g), torch.randn(50, generator=g)
    s = torch.rand(50, generator=g) + 0.3
    for full in (True, False):
        by_sd = gaussian_nll(loc, target=y, sd=s, full=full, reduction="none")
        by_var = gaussian_nll(loc, target=y, var=s**2, full=full, reduction="none")
        torch.testing.assert_close(by_sd, by_var, rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(gaussian_nll(loc, s, y, full=full, reduction="none"), by_sd)
    m, sd, t = (x.double() for x in (loc, s, y))
    ref = (0.5 * torch.log(2 * math.pi * sd**2) + 0.5 * ((t - m) / sd) ** 2).mean()
    assert gaussian_nll(m, target=t, var=sd**2).item() == pytest.approx(ref.item(), rel=1e-12)


def test_gaussian_nll_var_flag_is_deprecated_but_works():
    loc, s, y = torch.tensor([0.0]), torch.tensor([2.0]), torch.tensor([1.0])
    with pytest.warns(FutureWarning, match="var="):
        old = gaussian_nll(loc, s**2, y, var=True)
    assert old.item() == gaussian_nll(loc, target=y, var=s**2).item()
    with pytest.warns(FutureWarning):
        assert gaussian_nll(loc, s, y, var=False).item() == gaussian_nll(loc, s, y).item()
