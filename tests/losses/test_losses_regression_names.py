"""The forecast family is ``family=`` everywhere (old spellings deprecated for one release) and
the Gaussian spread is named ``var=`` or ``sd=`` in the losses and metrics alike."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import torchcal.functional as TF
from torchcal.losses import CRPSLoss, GaussianNLLLoss
from torchcal.metrics import GaussianNLL, IntervalCoverage

D64 = torch.float64


def _forecast(n=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(n, dtype=D64, generator=g)
    scale = torch.rand(n, dtype=D64, generator=g) + 0.3
    y = torch.randn(n, dtype=D64, generator=g)
    samples = torch.randn(n, 5, dtype=D64, generator=g)
    return loc, scale, y, samples


@pytest.mark.parametrize("family", ["normal", "laplace", "logistic", "ensemble"])
def test_crps_loss_family_and_deprecated_distribution(family):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling does not warn
        new = CRPSLoss(family=family)
        assert new.family == family and f"family='{family}'" in repr(new)
    with pytest.warns(FutureWarning, match="family="):
        old = CRPSLoss(distribution=family)
    assert old.family == family
    with pytest.warns(FutureWarning, match="family"):
        assert old.distribution == family
    with pytest.raises(ValueError, match="family=.*distribution="):
        CRPSLoss(family=family, distribution=family)
    with pytest.raises(ValueError, match="family=.*distribution="):
        CRPSLoss(family, distribution=family)
    assert CRPSLoss().family == "normal"


@pytest.mark.parametrize("family", ["normal", "laplace", "logistic"])
def test_crps_loss_named_arguments_closed_form(family):
    loc, scale, y, _ = _forecast()
    loss = CRPSLoss(family, reduction="none")
    ref = {"normal": TF.crps_normal, "laplace": TF.crps_laplace, "logistic": TF.crps_logistic}[
        family
    ](loc, scale, y, reduction="none")
    for out in (
        loss(loc, scale, y),
        loss(loc=loc, scale=scale, target=y),
        loss(loc, scale, target=y),
        loss(loc, scale=scale, target=y),
        loss(target=y, scale=scale, loc=loc),
    ):
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    with pytest.raises(TypeError, match="samples="):
        loss(loc, scale, y, samples=loc)
    with pytest.raises(TypeError, match="missing target"):
        loss(loc, scale)
    with pytest.raises(TypeError, match="loc twice"):
        loss(loc, scale, target=y, loc=loc)
    with pytest.raises(TypeError, match="4 positional"):
        loss(loc, scale, y, y)


def test_crps_loss_named_arguments_ensemble():
    _, _, y, samples = _forecast()
    loss = CRPSLoss("ensemble", reduction="none")
    ref = TF.crps_ensemble(samples, y, reduction="none")
    for out in (loss(samples, y), loss(samples=samples, target=y), loss(samples, target=y)):
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    with pytest.raises(TypeError, match="scale="):
        loss(samples, y, scale=y)
    with pytest.raises(TypeError, match="missing target"):
        loss(samples=samples)


def test_gaussian_spread_one_meaning_by_name():
    """Loss and metric agree on var=s**2 and sd=s; the positional spread keeps its documented
    meaning (loss: the variance, as torch; metric: the sd), so the two positional calls differ
    (the issue's 2.2694 vs 2.1121)."""
    loc, y, s = torch.zeros(1), torch.full((1,), 2.0), torch.full((1,), 2.0)
    want = 0.5 * math.log(2 * math.pi * 4.0) + 0.5 * (2.0 / 2.0) ** 2  # 2.1121
    loss = GaussianNLLLoss()
    for value in (
        loss(loc, target=y, var=s**2),
        loss(loc, target=y, sd=s),
        GaussianNLLLoss(spread="scale")(loc, target=y, var=s**2),  # the name wins
        loss(loc, s**2, y),
    ):
        assert value.item() == pytest.approx(want, rel=1e-6)
    assert loss(loc, s, y).item() == pytest.approx(0.5 * math.log(2 * math.pi * 2) + 1, rel=1e-6)
    for kw in ({"var": s**2}, {"sd": s}, {}):
        m = GaussianNLL()
        if kw:
            m.update(loc, target=y, **kw)
        else:
            m.update(loc, s, y)  # positional: the sd
        assert float(m.compute()) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("call", ["functional", "loss", "metric"])
def test_gaussian_spread_errors(call):
    """The functional and its two shells name the same errors of the spread arguments."""
    loc, y, s = torch.zeros(2), torch.ones(2), torch.ones(2)
    shells = {"loss": GaussianNLLLoss(), "metric": GaussianNLL().update}
    fn = TF.gaussian_nll if call == "functional" else shells[call]
    with pytest.raises(ValueError, match="var=.*sd="):
        fn(loc, target=y, var=s, sd=s)
    with pytest.raises(TypeError, match="missing the spread"):
        fn(loc, target=y)
    with pytest.raises(TypeError, match="spread twice"):
        fn(loc, y, var=s)  # torch's (input, target, var) order
    with pytest.raises(TypeError, match="missing target"):
        fn(loc, sd=s)
    with pytest.raises(ValueError, match="^sd: expected values > 0"):
        fn(loc, target=y, sd=-s)
    with pytest.raises(ValueError, match="^var: expected values > 0"):
        fn(loc, target=y, var=-s)


def test_interval_coverage_family_and_deprecated_forecast():
    loc, scale, y, _ = _forecast()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = IntervalCoverage((0.5, 0.9), family="normal")
    with pytest.warns(FutureWarning, match="family="):
        old = IntervalCoverage((0.5, 0.9), forecast="normal")
    assert old.family == "normal" and IntervalCoverage().family == "bounds"
    with pytest.warns(FutureWarning):
        assert old.forecast == "normal"
    for m in (new, old):
        m.update(loc, scale, y)
    for key, value in new.compute().items():
        torch.testing.assert_close(old.compute()[key], value, rtol=0, atol=0)
    with pytest.raises(ValueError, match="family=.*forecast="):
        IntervalCoverage((0.5,), family="normal", forecast="normal")
