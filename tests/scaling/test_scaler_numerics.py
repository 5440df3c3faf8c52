"""Numerics of the calibrators (issue 18): half-precision forwards do not overflow (computed in
float64, returned in the input dtype), bad options and a missing process group name their
argument, and the CRPS variance fit does not depend on the thread count."""

from __future__ import annotations

import pytest
import torch

from torchcal.scaling import (
    GroupTemperatureScaler,
    IsotonicCalibrator,
    MatrixScaler,
    PlattScaler,
    TemperatureScaler,
    VarianceScaler,
    VectorScaler,
)

HALF = (torch.float16, torch.bfloat16)


def _data(n: int = 400, c: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return z, y


def _sharpened(kind: str):
    """A fitted multiclass map that multiplies logits by 2 (the overflow case)."""
    z, y = _data()
    if kind == "temperature":
        m = TemperatureScaler()
        m.temperature = 0.5
        return m, lambda x: x.to(torch.float64) / 0.5
    if kind == "group":
        m = GroupTemperatureScaler(num_groups=2)
        m.fit(z, y, torch.arange(400) % 2)
        with torch.no_grad():
            m.log_temperature.fill_(-torch.log(torch.tensor(2.0, dtype=torch.float64)))
        return m, lambda x: x.to(torch.float64) * 2
    m = VectorScaler(num_classes=3) if kind == "vector" else MatrixScaler(num_classes=3)
    m.fit(z, y)
    with torch.no_grad():
        m.weight.copy_(2 * torch.ones_like(m.weight) if kind == "vector" else 2 * torch.eye(3))
        m.bias.zero_()
    return m, lambda x: x.to(torch.float64) * 2


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kind", ["temperature", "group", "vector", "matrix"])
def test_half_precision_forward_does_not_overflow(kind, dtype):
    m, ref = _sharpened(kind)
    big = torch.finfo(dtype).max / 1.5
    x = torch.tensor([[big, big, 0.0], [1.0, 2.0, -3.0]], dtype=dtype)
    args = (x, torch.tensor([0, 1])) if kind == "group" else (x,)
    out = m(*args).detach()
    assert out.dtype == dtype
    assert not torch.isnan(out).any()
    p = torch.softmax(out.to(torch.float64), 1)
    want = torch.softmax(ref(x), 1)
    torch.testing.assert_close(p, want, atol=1e-2, rtol=0)  # float16 was [[inf, inf, 0]]: NaN
    # a row that fits is the plain map rounded once to the input dtype
    assert torch.equal(out[1], ref(x)[1].to(dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_binary_maps_saturate(dtype):
    t = TemperatureScaler()
    t.temperature = 0.5
    platt = PlattScaler()
    g = torch.Generator().manual_seed(1)
    s = torch.randn(300, generator=g, dtype=torch.float64) * 3
    platt.fit(s, (torch.rand(300, generator=g, dtype=torch.float64) < torch.sigmoid(2 * s)).long())
    big = torch.finfo(dtype).max / 1.5
    x = torch.tensor([big, -big, 1.0], dtype=dtype)
    for m in (t, platt):
        out = m(x).detach()
        assert out.dtype == dtype and torch.isfinite(out).all(), type(m).__name__
        assert torch.sigmoid(out[:2].float()).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("dtype", HALF)
def test_isotonic_and_variance_in_half_precision(dtype):
    z, y = _data()
    iso = IsotonicCalibrator(reading="confidence")
    iso.fit(z, y)
    big = torch.finfo(dtype).max / 1.5
    out = iso(torch.tensor([[big, big, 0.0]], dtype=dtype))
    assert out.dtype == dtype and torch.isfinite(out).all()
    g = torch.Generator().manual_seed(2)
    v = VarianceScaler()
    v.fit(torch.zeros(200), torch.ones(200), 2 * torch.randn(200, generator=g))
    loc, scale = v(torch.zeros(2, dtype=dtype), torch.tensor([1.0, 2.0], dtype=dtype))
    assert scale.dtype == dtype
    want = (torch.tensor([1.0, 2.0], dtype=dtype).double() * v.scale_factor).to(dtype)
    assert torch.equal(scale, want)
    with pytest.raises(ValueError, match=r"^scale: the scaled scale exceeds the largest"):
        v(torch.zeros(1, dtype=dtype), torch.tensor([big], dtype=dtype))


@pytest.mark.parametrize(
    ("make", "arg"),
    [
        (lambda: TemperatureScaler(max_iter=-5), "max_iter"),
        (lambda: TemperatureScaler(max_iter=0), "max_iter"),
        (lambda: TemperatureScaler(grad_tol=float("nan")), "grad_tol"),
        (lambda: TemperatureScaler(step_tol=-1.0), "step_tol"),
        (lambda: GroupTemperatureScaler(num_groups=2, max_iter=-5), "max_iter"),
        (lambda: PlattScaler(max_iter=-5), "max_iter"),
        (lambda: PlattScaler(grad_tol=-1.0), "grad_tol"),
    ],
)
def test_bad_solver_options_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=rf"^{arg}: expected"):
        make()


def test_max_iter_must_be_an_int():
    with pytest.raises((TypeError, ValueError), match=r"^max_iter"):
        TemperatureScaler(max_iter=2.5)


def test_distributed_without_a_process_group_is_a_clear_error():
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    z, y = _data()
    with pytest.raises(ValueError, match=r"^distributed: True needs an initialised"):
        TemperatureScaler().fit(z, y, distributed=True)
    with pytest.raises(ValueError, match=r"^distributed: True needs an initialised"):
        TemperatureScaler().fit_stream([(z, y)], distributed=True)
    with pytest.raises(ValueError, match=r"^distributed: expected a bool"):
        TemperatureScaler().fit(z, y, distributed="yes")
    TemperatureScaler().fit_stream([(z, y)])  # None: all-reduce only under a process group


def _crps_fit(threads: int) -> str:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(5)
        n = 200_000
        loc = torch.randn(n, generator=g)
        scale = torch.rand(n, generator=g) + 0.5
        y = loc + 1.7 * scale * torch.randn(n, generator=g)
        v = VarianceScaler(objective="crps")
        v.fit(loc, scale, y)
        return float(v.log_scale_factor).hex()
    finally:
        torch.set_num_threads(before)


def test_variance_crps_fit_does_not_depend_on_the_thread_count():
    assert _crps_fit(1) == _crps_fit(2)


def test_numpy_alpha_is_a_float_alpha():
    np = pytest.importorskip("numpy")
    from torchcal.metrics import IntervalScore
    from torchcal.scaling import SplitConformal

    assert IntervalScore(alpha=np.float32(0.1)).alpha == float(np.float32(0.1))
    # the conformal alpha is read as the simplest fraction in its own precision (float32 0.1
    # is 1/10: docs/design.md section 6e), so the rank is exact
    assert float(SplitConformal(alpha=np.float32(0.1)).alpha) == 0.1
