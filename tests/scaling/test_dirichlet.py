"""DirichletScaler against an independent float64 solve of the same objective (dirichletcal
cannot be installed here: its releases need Python 3.12 and jax)."""

import io
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import minimize
from scipy.special import log_softmax, logsumexp

from torchcal.scaling import DirichletScaler, NotFittedError, TemperatureScaler


def _data(n, c, seed):
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(n, c, generator=g, dtype=torch.float64)
    b = torch.linspace(-1, 1, c, dtype=torch.float64)
    t = torch.linspace(0.3, 0.7, c, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z * t + b, 1), 1, generator=g).squeeze(1)
    return z, y


def _objective(params, x, y, variant, od, breg):
    """mean NLL of softmax(x @ W.T + b) (x = log-probabilities) plus the penalty, with its
    gradient; written from the paper's formulas, independently of torchcal."""
    n, c = x.shape
    if variant == "full":
        w, b = params[: c * c].reshape(c, c), params[c * c :]
        a = x @ w.T + b
    else:
        w, b = params[:c], params[c:]
        a = x * w + b
    lse = logsumexp(a, axis=1)
    f = np.mean(lse - a[np.arange(n), y])
    r = np.exp(a - lse[:, None])
    r[np.arange(n), y] -= 1
    r /= n
    gb = r.sum(0) + 2 * breg / c * b
    if variant == "full":
        off = w - np.diag(np.diag(w))
        f += od / (c * (c - 1)) * np.sum(off * off) + breg / c * np.sum(b * b)
        gw = (r.T @ x + 2 * od / (c * (c - 1)) * off).ravel()
    else:
        d = w - w.mean()
        f += od / c * np.sum(d * d) + breg / c * np.sum(b * b)
        gw = (r * x).sum(0) + 2 * od / c * d
    return f, np.concatenate([gw, gb])


def _test_nll(params, x, y, variant):
    c = x.shape[1]
    if variant == "full":
        a = x @ params[: c * c].reshape(c, c).T + params[c * c :]
    else:
        a = x * params[:c] + params[c:]
    return float(np.mean(logsumexp(a, axis=1) - a[np.arange(len(y)), y]))


@pytest.mark.parametrize(
    ("variant", "kwargs", "od", "breg"),
    [
        ("full", {"reg": 0.5}, 0.5, 0.5),
        ("full", {"off_diagonal_reg": 2.0, "bias_reg": 0.1}, 2.0, 0.1),
        ("diagonal", {"reg": 0.2}, 0.2, 0.2),
    ],
)
def test_matches_a_float64_scipy_solve_to_1e6_in_test_nll(variant, kwargs, od, breg):
    c = 4
    z, y = _data(3000, c, seed=0)
    zt, yt = _data(4000, c, seed=1)
    m = DirichletScaler(c, variant=variant, **kwargs)
    res = m.fit(z, y)
    assert res.converged and res.grad_norm <= 1e-8
    x, xt = log_softmax(z.numpy(), axis=1), log_softmax(zt.numpy(), axis=1)
    x0 = np.concatenate([np.eye(c).ravel() if variant == "full" else np.ones(c), np.zeros(c)])
    ref = minimize(
        _objective,
        x0,
        args=(x, y.numpy(), variant, od, breg),
        jac=True,
        method="L-BFGS-B",
        options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 10000},
    )
    ours = np.concatenate([m.weight.detach().numpy().ravel(), m.bias.detach().numpy()])
    assert _objective(ours, x, y.numpy(), variant, od, breg)[0] <= ref.fun + 1e-12
    ref_nll = _test_nll(ref.x, xt, yt.numpy(), variant)
    ours_nll = float(F.cross_entropy(m(zt), yt))
    assert abs(ours_nll - ref_nll) <= 1e-6
    assert abs(ours_nll - _test_nll(ours, xt, yt.numpy(), variant)) <= 1e-12


def test_fixed_diagonal_is_one_temperature():
    c = 5
    z, y = _data(2000, c, seed=2)
    m = DirichletScaler(c, variant="fixed_diagonal")
    res = m.fit(z, y)
    ts = TemperatureScaler()
    ts.fit(z, y)
    assert res.converged and m.weight.shape == (c,)
    assert torch.allclose(m.weight, torch.full((c,), 1 / ts.temperature, dtype=torch.float64))
    assert torch.equal(m.bias, torch.zeros(c, dtype=torch.float64))
    assert torch.allclose(torch.softmax(m(z), 1), torch.softmax(ts(z), 1), atol=1e-12)
    assert torch.equal(m(z).argmax(1), z.argmax(1))


def test_masks_state_and_errors():
    c = 4
    z, y = _data(1500, c, seed=3)
    mask = torch.rand(z.shape, generator=torch.Generator().manual_seed(4)) < 0.2
    mask[torch.arange(1500), y] = False
    zm = z.masked_fill(mask, -math.inf)
    m = DirichletScaler(c, reg=0.1)
    res = m.fit(zm, y)
    assert res.converged and math.isfinite(res.nll_after)
    out = m(zm)
    assert torch.equal(torch.isneginf(out), mask) and not bool(torch.isnan(out).any())
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    fresh = DirichletScaler(c)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(fresh(zm), out)
    assert set(m.state_dict()) == {"weight", "bias", "fitted"}
    with pytest.raises(ValueError, match="^variant: expected one of"):
        DirichletScaler(c, variant="Full")
    with pytest.raises(ValueError, match="^off_diagonal_reg: only the 'full' variant"):
        DirichletScaler(c, variant="diagonal", off_diagonal_reg=1.0)
    with pytest.raises(ValueError, match="^reg: the fixed_diagonal variant"):
        DirichletScaler(c, variant="fixed_diagonal", reg=1.0)
    with pytest.raises(NotFittedError):
        DirichletScaler(c)(z)
    with pytest.raises(ValueError, match=r"^logits: expected a floating-point tensor of shape"):
        m(z[:, :3])
