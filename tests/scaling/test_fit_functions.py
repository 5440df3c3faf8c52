"""The fits live in torchcal.functional and the scalers' fit are shells over them: the same
numbers bit for bit, messages returned (never warned) by the functions and warned by the
shells with the same text."""

import math
import warnings

import torch

from torchcal.functional.affine import fit_affine, vector_map
from torchcal.functional.isotonic import fit_isotonic, fit_pit_recalibration
from torchcal.functional.platt import fit_platt
from torchcal.functional.temperature.chunks import tensor_chunks
from torchcal.functional.temperature.fit import fit_temperature, solve_temperature
from torchcal.functional.temperature.group import fit_group_temperatures
from torchcal.functional.variance import fit_scale_factor
from torchcal.scaling import (
    CalibrationWarning,
    GroupTemperatureScaler,
    IsotonicCalibrator,
    PlattScaler,
    QuantileRecalibrator,
    TemperatureScaler,
    VarianceScaler,
    VectorScaler,
)


def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(1500, 5, generator=g)
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
    zb = 2 * torch.randn(1500, generator=g)
    yb = (torch.rand(1500, generator=g) < torch.sigmoid(zb / 2)).long()
    return z, y, zb, yb


def silent(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, failing on any warning (the fit functions never warn)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args, **kwargs)


def test_temperature_scaler_is_a_shell_over_fit_temperature():
    z, y, zb, yb = data()
    for logits, target in ((z, y), (zb, yb)):
        for method in ("lbfgs", "newton"):
            sol = silent(fit_temperature, logits, target, method=method)
            sc = TemperatureScaler(method=method)
            res = sc.fit(logits, target)
            assert float(sc.log_temperature.detach()) == sol.log_temperature
            assert res.temperature == math.exp(sol.log_temperature)
            assert (res.nll_before, res.nll_after, res.passes) == (
                sol.nll_before,
                sol.nll_after,
                sol.passes,
            )
    # streamed: solve_temperature over the same chunks is fit_stream
    chunks = tensor_chunks(z, y.long())
    sol = solve_temperature(
        lambda: chunks,
        False,
        5,
        torch.zeros(1, dtype=torch.float64),
        bounds=(1e-3, 1e3),
        method="newton",
        grad_tol=1e-10,
        step_tol=1e-8,
        max_iter=100,
    )
    res = TemperatureScaler().fit_stream(list(zip(z.split(700), y.split(700))))
    assert (
        math.log(res.temperature) == sol.log_temperature
        or abs(math.log(res.temperature) - sol.log_temperature) < 1e-12
    )  # other chunk boundaries: the same optimum to rounding


def test_degenerate_messages_are_returned_by_the_function_and_warned_by_the_shell():
    z = torch.zeros(30, 3)  # every row uniform: the NLL does not depend on T
    y = torch.arange(30) % 3
    sol = silent(fit_temperature, z, y)
    assert not sol.converged and len(sol.messages) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = TemperatureScaler().fit(z, y)
    assert [str(w.message) for w in caught if w.category is CalibrationWarning] == list(
        sol.messages
    )
    assert res.warnings == sol.messages
    assert caught[0].filename == __file__  # pointing at the caller of fit


def test_the_other_scalers_store_what_their_fit_function_returns():
    z, y, zb, yb = data(1)
    sol = silent(fit_platt, zb, yb)
    platt = PlattScaler()
    res = platt.fit(zb, yb)
    assert (platt.weight.item(), platt.bias.item()) == (sol.a, sol.b)
    assert (res.nll_before, res.nll_after, res.grad_norm) == (
        sol.nll_before,
        sol.nll_after,
        sol.grad_norm,
    )

    vector = vector_map(5, 0.0, 0.0)
    sol = silent(fit_affine, z, y, vector, torch.ones(5).double(), torch.zeros(5).double())
    vs = VectorScaler(5, reg=0.0)
    vs.fit(z, y)
    assert torch.equal(vs.weight.detach(), sol.weight) and torch.equal(vs.bias.detach(), sol.bias)

    iso = IsotonicCalibrator()
    res = iso.fit(zb, yb)
    sol = fit_isotonic(zb.double(), yb.double())
    assert torch.equal(iso.x_thresholds, sol.x) and torch.equal(iso.y_thresholds, sol.y)
    assert res.nll_after == sol.after

    pit = torch.rand(400, generator=torch.Generator().manual_seed(2)) ** 2
    q = QuantileRecalibrator()
    res = q.fit(pit)
    sol = fit_pit_recalibration(pit)
    assert torch.equal(q.x_knots, sol.x) and res.gap_after == sol.after

    loc, scale = torch.zeros(800), torch.rand(800, generator=torch.Generator().manual_seed(3)) + 0.5
    t = 1.7 * scale * torch.randn(800, generator=torch.Generator().manual_seed(4))
    for objective in ("nll", "crps"):
        sol = fit_scale_factor(loc, scale, t, objective=objective)
        v = VarianceScaler(objective=objective)
        res = v.fit(loc, scale, t)
        assert res.scale == sol.scale and float(v.log_scale_factor) == math.log(sol.scale)
        assert (res.before, res.after) == (sol.before, sol.after)

    groups = torch.arange(1500) % 3
    for shrinkage in (0.0, 5.0, "empirical_bayes"):
        sol = fit_group_temperatures(z, y, groups, 3, shrinkage=shrinkage)
        gs = GroupTemperatureScaler(3, shrinkage=shrinkage)
        res = gs.fit(z, y, groups)
        assert torch.equal(gs.log_temperature, sol.log_temperatures)
        assert res.temperature == math.exp(sol.global_solution.log_temperature)
        assert (sol.raw_log_temperatures is None) == (shrinkage != "empirical_bayes")


def test_newton_fit_messages_point_at_the_caller_of_fit():
    """``NLLFit.of`` issues a Newton fit's messages one frame further up: at this file."""
    separated = torch.zeros(30, 3)
    separated[torch.arange(30), torch.arange(30) % 3] = 5.0
    capped = torch.tensor([-1.0, 1.0]).repeat(20), torch.tensor([0.0, 1.0]).repeat(20)
    for fit in (
        lambda: VectorScaler(3, reg=0.0).fit(separated, torch.arange(30) % 3),
        lambda: PlattScaler(max_iter=1).fit(*capped),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = fit()
        mine = [w for w in caught if w.category is CalibrationWarning]
        assert mine and not res.converged
        assert [str(w.message) for w in mine] == list(res.warnings)
        assert {w.filename for w in mine} == {__file__}
