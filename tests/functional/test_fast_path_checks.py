"""The regression scores' fast path (CPU eager, one dtype, one shape: ``plain_cpu``) checks the
values from its result and runs the usual scans only when that fails: every bad input still
raises the message of the full path (same argument, same position), and a finite input whose
score overflows passes as before."""

from __future__ import annotations

import pytest
import torch

from torchcal.functional import continuous, crps
from torchcal.functional.continuous import (
    dawid_sebastiani_score,
    gaussian_nll,
    interval_score,
    quantile_score,
)
from torchcal.functional.crps import (
    crps_ensemble,
    crps_laplace,
    crps_logistic,
    crps_normal,
    energy_score,
)
from torchcal.losses import CRPSLoss, GaussianNLLLoss, IntervalScoreLoss, QuantileLoss

N = 6
BAD = {"nan": float("nan"), "inf": float("inf"), "-inf": -float("inf")}


def _ls(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(N, generator=g),
        torch.rand(N, generator=g) + 0.5,
        torch.randn(N, generator=g),
    ]


def _with(tensors, i, value, pos=3):
    out = [t.clone() for t in tensors]
    out[i].view(-1)[pos] = value
    return out


SCORES = {
    "crps_normal": (crps_normal, _ls),
    "crps_laplace": (crps_laplace, _ls),
    "crps_logistic": (crps_logistic, _ls),
    "gaussian_nll": (gaussian_nll, _ls),
    "gaussian_nll_var": (lambda a, b, c, **k: gaussian_nll(a, target=c, var=b, **k), _ls),
    "dawid_sebastiani": (dawid_sebastiani_score, _ls),
    "interval": (
        lambda a, b, c, **k: interval_score(a - b, a + b, c, alpha=0.2, **k),
        _ls,
    ),
    "interval_bounds": (lambda lo, hi, y, **k: interval_score(lo, hi, y, alpha=0.2, **k), None),
    "quantile": (lambda p, y, **k: quantile_score(p, y, [0.2, 0.8], **k), None),
    "crps_ensemble": (crps_ensemble, None),
    "energy": (energy_score, None),
}


def _inputs(name):
    g = torch.Generator().manual_seed(1)
    if name == "interval_bounds":
        c, h = torch.randn(N, generator=g), torch.rand(N, generator=g) + 0.1
        return [c - h, c + h, torch.randn(N, generator=g)]
    if name == "quantile":
        return [torch.sort(torch.randn(N, 2, generator=g), -1).values, torch.randn(N, generator=g)]
    if name == "crps_ensemble":
        return [torch.randn(N, 5, generator=g), torch.randn(N, generator=g)]
    if name == "energy":
        return [torch.randn(N, 4, 3, generator=g), torch.randn(N, 3, generator=g)]
    return _ls()


def _message(fn, args, reduction):
    try:
        fn(*args, reduction=reduction)
    except ValueError as e:
        return str(e)
    return None


def _cases():
    for name in SCORES:
        for i in range(len(_inputs(name))):
            for bad, value in BAD.items():
                yield name, i, bad, value
        if name in (
            "crps_normal",
            "crps_laplace",
            "crps_logistic",
            "gaussian_nll",
            "gaussian_nll_var",
            "dawid_sebastiani",
        ):
            for value in (0.0, -0.0, -1.0):
                yield name, 1, f"scale={value}", value
    yield "interval_bounds", 0, "lower>upper", 10.0


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("name,i,bad,value", list(_cases()))
def test_fast_path_raises_the_full_path_message(monkeypatch, name, i, bad, value, reduction):
    fn = SCORES[name][0]
    args = _with(_inputs(name), i, value)
    fast = _message(fn, args, reduction)
    assert fast is not None, f"{name}: {bad} in argument {i} passed the fast path"
    for module in (continuous, crps):
        monkeypatch.setattr(module, "plain_cpu", lambda *xs: False)
    assert _message(fn, args, reduction) == fast


def test_fast_path_is_taken_and_overflow_passes_as_before(monkeypatch):
    # finite inputs whose score overflows float32: no error on either path, the same inf
    loc, scale, y = torch.full((3,), 3e38), torch.ones(3), torch.full((3,), -3e38)
    fast = [crps_normal(loc, scale, y), dawid_sebastiani_score(loc, scale, y)]
    calls = []
    for module in (continuous, crps):
        monkeypatch.setattr(module, "plain_cpu", lambda *xs: calls.append(1) or False)
    slow = [crps_normal(loc, scale, y), dawid_sebastiani_score(loc, scale, y)]
    assert calls  # the fast path was asked (and is now refused)
    for a, b in zip(fast, slow):
        assert torch.isinf(a) and torch.equal(a, b)


def test_modules_take_the_fast_path_with_the_same_messages():
    loc, scale, y = _ls()
    bad = _with([loc, scale, y], 1, 0.0)
    with pytest.raises(ValueError, match=r"^scale: expected values > 0, got 0.0 at position 3"):
        CRPSLoss("normal")(*bad)
    with pytest.raises(ValueError, match=r"^spread: expected values > 0"):
        GaussianNLLLoss()(*bad)
    with pytest.raises(ValueError, match=r"^upper: "):
        IntervalScoreLoss(0.1)(y + 1.0, y, y)
    with pytest.raises(ValueError, match=r"^target: expected finite values"):
        QuantileLoss([0.5])(loc.unsqueeze(-1), _with([y], 0, float("nan"))[0])
