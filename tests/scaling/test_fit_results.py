"""One result type per kind of calibrator, with honest field names; the single FitResult's old
attribute names keep reading (with a FutureWarning) where the kind has no field of that name."""

import dataclasses
import math
import warnings

import pytest
import torch

from torchcal.scaling import (
    FitResult,
    GroupTemperatureFit,
    GroupTemperatureScaler,
    IsotonicCalibrator,
    NLLFit,
    PlattScaler,
    QuantileFit,
    QuantileRecalibrator,
    TemperatureFit,
    TemperatureScaler,
    VarianceFit,
    VarianceScaler,
    VectorScaler,
)


def multiclass(n=600, c=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(n, c, generator=g)
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
    return z, y


def binary(n=600, seed=1):
    g = torch.Generator().manual_seed(seed)
    z = 2 * torch.randn(n, generator=g)
    y = (torch.rand(n, generator=g) < torch.sigmoid(z / 2)).long()
    return z, y


def regression(n=800, seed=2):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(n, generator=g)
    scale = torch.rand(n, generator=g) + 0.5
    y = loc + 2 * scale * torch.randn(n, generator=g)
    return loc, scale, y


def no_warning(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn()


def test_each_scaler_returns_its_kind_and_reads_without_warnings():
    z, y = multiclass()
    zb, yb = binary()
    loc, scale, target = regression()
    t = TemperatureScaler()
    res = t.fit(z, y)
    assert type(res) is TemperatureFit and isinstance(res, FitResult)
    assert no_warning(lambda: res.temperature) == t.temperature
    assert no_warning(lambda: res.nll_after) <= res.nll_before
    grp = GroupTemperatureScaler(3).fit(z, y, torch.arange(600) % 3)
    assert type(grp) is GroupTemperatureFit and isinstance(grp, TemperatureFit)
    assert len(no_warning(lambda: grp.temperatures)) == 3
    for scaler, args in (
        (PlattScaler(), (zb, yb)),
        (VectorScaler(4, reg=0.0), (z, y)),
        (IsotonicCalibrator(), (zb, yb)),
    ):
        r = scaler.fit(*args)
        assert type(r) is NLLFit, type(scaler)
        assert no_warning(lambda r=r: r.nll_after) <= r.nll_before + 1e-12
    vs = VarianceScaler(objective="crps")
    v = vs.fit(loc, scale, target)
    assert type(v) is VarianceFit and v.objective == "crps"
    assert no_warning(lambda: v.scale) == pytest.approx(vs.scale_factor, rel=1e-15)
    assert v.after <= v.before
    q = QuantileRecalibrator().fit(torch.rand(500, generator=torch.Generator().manual_seed(3)))
    assert type(q) is QuantileFit and q.gap_after <= q.gap_before and q.converged


@pytest.mark.parametrize(
    ("make", "old", "new"),
    [
        ("variance", "temperature", "scale"),
        ("variance", "nll_before", "before"),
        ("variance", "nll_after", "after"),
        ("quantile", "nll_before", "gap_before"),
        ("quantile", "nll_after", "gap_after"),
    ],
)
def test_old_names_are_deprecated_aliases_of_the_honest_fields(make, old, new):
    if make == "variance":
        res = VarianceScaler(objective="nll").fit(*regression())
    else:
        res = QuantileRecalibrator().fit(torch.linspace(0.01, 0.99, 99) ** 2)
    with pytest.warns(FutureWarning, match=rf"{type(res).__name__}\.{old} is deprecated.*\.{new}"):
        value = getattr(res, old)
    assert value == getattr(res, new)


@pytest.mark.parametrize(
    ("make", "old", "value"),
    [
        ("platt", "temperature", None),
        ("platt", "temperatures", None),
        ("temperature", "temperatures", None),
        ("variance", "temperatures", None),
        ("quantile", "temperature", None),
        ("quantile", "grad_norm", 0.0),
    ],
)
def test_old_names_without_a_field_keep_their_old_constant(make, old, value):
    if make == "platt":
        res = PlattScaler().fit(*binary())
    elif make == "temperature":
        res = TemperatureScaler().fit(*multiclass())
    elif make == "variance":
        res = VarianceScaler().fit(*regression())
    else:
        res = QuantileRecalibrator().fit(torch.linspace(0.01, 0.99, 99))
    with pytest.warns(FutureWarning, match=rf"{old} is deprecated"):
        assert getattr(res, old) == value


def test_unknown_attributes_still_raise_and_results_stay_frozen():
    res = TemperatureScaler().fit(*multiclass())
    with pytest.raises(AttributeError, match="no attribute 'scale'"):
        _ = res.scale
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.temperature = 2.0  # type: ignore[misc]
    v = VarianceScaler().fit(*regression())
    with pytest.raises(AttributeError, match="nope"):
        _ = v.nope
    # the honest fields are the only dataclass fields: no old name hides among them
    assert "temperature" not in {f.name for f in dataclasses.fields(v)}
    assert {"scale", "objective", "before", "after"} <= {f.name for f in dataclasses.fields(v)}


def test_variance_fit_fields_hold_the_objective_it_names():
    loc, scale, y = regression()
    nll = VarianceScaler(objective="nll").fit(loc, scale, y)
    crps = VarianceScaler(objective="crps").fit(loc, scale, y)
    assert nll.objective == "nll" and crps.objective == "crps"
    # before = the mean Gaussian NLL at s = 1, by the closed form
    r = (y.double() - loc.double()) / scale.double()
    want = float((torch.log(scale.double()) + 0.5 * r**2).mean()) + 0.5 * math.log(2 * math.pi)
    assert nll.before == pytest.approx(want, rel=1e-12)
    assert crps.before != pytest.approx(nll.before, rel=1e-3)  # a CRPS, not an NLL
