"""Hostile inputs for the calibration functions of predictive distributions (issue 11, Build 1).

Every bad input of the issue's list (non-positive scale, crossing or unsorted quantiles, levels
outside (0, 1), lower > upper, shape mismatch, NaN) gets a ValueError whose message starts with
the argument's name; edge cases that are valid get the right number.
"""

from __future__ import annotations

import math

import pytest
import torch

import torchcal.functional as TF

NAN, INF = float("nan"), float("inf")
Y = torch.tensor([0.0, 1.0, -1.0])
LOC, SCALE = torch.zeros(3), torch.ones(3)
Q = torch.tensor([[-1.0, 0.0, 1.0]]).expand(3, 3)
LEVELS = torch.tensor([0.25, 0.5, 0.75])
CLOSED = [TF.pit_normal, TF.pit_laplace, TF.pit_logistic]
QUANTILE_FNS = [TF.pit_quantiles, TF.observed_frequencies, TF.quantile_calibration_error]


def _with(t: torch.Tensor, pos: int, value: float) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[pos] = value
    return t


# ------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("fn", CLOSED)
@pytest.mark.parametrize("bad", [0.0, -1.0, NAN, INF])
def test_closed_form_non_positive_or_nan_scale(fn, bad):
    with pytest.raises(ValueError, match="^scale"):
        fn(LOC, _with(SCALE, 1, bad), Y)


@pytest.mark.parametrize("fn", CLOSED)
def test_closed_form_nan_and_shapes(fn):
    with pytest.raises(ValueError, match="^loc"):
        fn(_with(LOC, 0, NAN), SCALE, Y)
    with pytest.raises(ValueError, match="^target"):
        fn(LOC, SCALE, _with(Y, 2, NAN))
    with pytest.raises(ValueError, match="^target"):
        fn(LOC, SCALE, Y[:, None])  # (3, 1) against (3,): the target never broadcasts
    with pytest.raises(ValueError, match="^target"):
        fn(torch.zeros(4), SCALE[:1], Y)
    with pytest.raises(ValueError, match="^target"):
        fn(LOC, SCALE, torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="^loc"):
        fn([0.0, 0.0, 0.0], SCALE, Y)


@pytest.mark.parametrize("fn", CLOSED)
def test_closed_form_extremes_are_exact(fn):
    y = torch.tensor([-1e300, -1e10, 0.0, 1e10, 1e300], dtype=torch.float64)
    u = fn(torch.zeros(5, dtype=torch.float64), torch.full((5,), 1e-300, dtype=torch.float64), y)
    assert u.tolist() == [0.0, 0.0, 0.5, 1.0, 1.0]


# --------------------------------------------------------------------------- ensembles


def test_ensemble_bad_inputs():
    x = torch.randn(3, 5)
    with pytest.raises(ValueError, match="^samples"):
        TF.pit_ensemble(_with(x, 4, NAN), Y)
    with pytest.raises(ValueError, match="^target"):
        TF.pit_ensemble(x, _with(Y, 0, INF))
    with pytest.raises(ValueError, match="^target"):
        TF.pit_ensemble(x, Y[:, None])
    with pytest.raises(ValueError, match="^target"):
        TF.pit_ensemble(x, torch.zeros(5))
    with pytest.raises(ValueError, match="^ensemble_dim"):
        TF.pit_ensemble(x, Y, ensemble_dim=2)
    with pytest.raises(ValueError, match="^samples"):
        TF.pit_ensemble(torch.zeros(3, 0), Y)
    with pytest.raises(ValueError, match="^samples"):
        TF.pit_ensemble(torch.zeros(3, 5, dtype=torch.long), Y)
    with pytest.raises(TypeError, match="^randomized"):
        TF.pit_ensemble(x, Y, randomized=1)
    with pytest.raises(TypeError, match="^generator"):
        TF.pit_ensemble(x, Y, generator=0)


def test_ensemble_single_member_and_constant_members():
    # one member: PIT is U/2 below it, (1 + U)/2 above, U on a tie (ranks 0..1 of 2 values)
    g = torch.Generator().manual_seed(0)
    u = TF.pit_ensemble(torch.tensor([[0.0], [0.0], [0.0]]), Y, generator=g)
    r = torch.rand(3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(u, torch.stack([r[0], (1 + r[1]) / 2, r[2] / 2]).float())
    # every member tied with the target: uniform over the whole [0, 1]
    same = TF.pit_ensemble(torch.ones(1000, 4), torch.ones(1000))
    assert 0.0 <= same.min().item() < 0.05 and 0.95 < same.max().item() < 1.0


# ---------------------------------------------------------------------------- quantiles


@pytest.mark.parametrize("fn", QUANTILE_FNS)
def test_quantile_sets_bad_levels(fn):
    for bad in ([0.0, 0.5, 0.75], [0.25, 0.5, 1.0], [0.25, 0.5, 1.5], [0.25, NAN, 0.75]):
        with pytest.raises(ValueError, match="^levels"):
            fn(Q, torch.tensor(bad), Y)
    with pytest.raises(ValueError, match="^levels"):  # unsorted
        fn(Q, torch.tensor([0.5, 0.25, 0.75]), Y)
    with pytest.raises(ValueError, match="^levels"):  # repeated
        fn(Q, [0.25, 0.25, 0.75], Y)
    with pytest.raises(ValueError, match="^levels"):
        fn(Q, torch.tensor([[0.25, 0.5, 0.75]]), Y)
    with pytest.raises(ValueError, match="^levels"):
        fn(Q, torch.tensor([], dtype=torch.float32), Y)


@pytest.mark.parametrize("fn", QUANTILE_FNS)
def test_quantile_sets_crossing_nan_and_shapes(fn):
    with pytest.raises(ValueError, match="^quantiles"):  # crossing in row 1
        fn(torch.tensor([[-1.0, 0.0, 1.0], [-1.0, 1.0, 0.5], [0.0, 0.0, 0.0]]), LEVELS, Y)
    with pytest.raises(ValueError, match="^quantiles"):
        fn(_with(Q.contiguous(), 4, NAN), LEVELS, Y)
    with pytest.raises(ValueError, match="^quantiles"):  # K != number of levels
        fn(Q[:, :2], LEVELS, Y)
    with pytest.raises(ValueError, match="^target"):
        fn(Q, LEVELS, Y[:, None])
    with pytest.raises(ValueError, match="^target"):
        fn(Q, LEVELS, torch.zeros(4))
    with pytest.raises(ValueError, match="^target"):
        fn(Q, LEVELS, _with(Y, 1, NAN))
    with pytest.raises(ValueError, match="^target"):
        fn(Q, LEVELS, torch.zeros(0))


def test_pit_quantiles_needs_two_levels_and_extreme_targets():
    with pytest.raises(ValueError, match="^levels"):
        TF.pit_quantiles(torch.zeros(3, 1), [0.5], Y)
    y = torch.tensor([-1e30, 1e30, -1.0, 1.0], dtype=torch.float64)
    u = TF.pit_quantiles(Q[:1].double(), LEVELS.double(), y[:, None].squeeze(-1))
    assert u.tolist() == [0.0, 1.0, 0.25, 0.75]
    with pytest.raises(ValueError, match="^norm"):
        TF.quantile_calibration_error(Q, LEVELS, Y, norm="l3")


# ------------------------------------------------------------------- intervals, readings


def test_interval_coverage_bad_inputs():
    lo, hi = -torch.ones(3), torch.ones(3)
    with pytest.raises(ValueError, match="^upper"):
        TF.interval_coverage(lo, _with(hi, 1, -2.0), Y)
    with pytest.raises(ValueError, match="^lower"):
        TF.interval_coverage(_with(lo, 0, NAN), hi, Y)
    with pytest.raises(ValueError, match="^target"):
        TF.interval_coverage(lo, hi, _with(Y, 0, NAN))
    with pytest.raises(ValueError, match="^target"):
        TF.interval_coverage(lo, hi, Y[:, None])
    with pytest.raises(ValueError, match="^upper"):
        TF.interval_coverage(lo, torch.ones(2), Y)
    with pytest.raises(ValueError, match="^reduction"):
        TF.interval_coverage(lo, hi, Y, reduction="avg")
    # an unbounded side is allowed (conformal intervals from too few points), a wrong-side
    # infinity is not
    lo_inf, hi_inf = torch.full((3,), -INF), torch.full((3,), INF)
    assert TF.interval_coverage(lo_inf, hi_inf, Y).item() == 1.0
    assert TF.interval_coverage(lo_inf, hi, Y, reduction="none").tolist() == [1.0, 1.0, 1.0]
    assert TF.interval_coverage(lo, hi_inf, Y - 1.5, reduction="sum").item() == 1.0
    with pytest.raises(ValueError, match="^lower"):
        TF.interval_coverage(hi_inf, hi_inf, Y)
    with pytest.raises(ValueError, match="^upper"):
        TF.interval_coverage(lo_inf, lo_inf, Y)
    with pytest.raises(ValueError, match="^upper"):
        TF.interval_coverage(lo, _with(hi, 0, NAN), Y)


def test_pit_readings_bad_inputs():
    u = torch.tensor([0.1, 0.5, 0.9])
    for bad in (-0.1, 1.5, NAN):
        with pytest.raises(ValueError, match="^pit"):
            TF.pit_histogram(_with(u, 1, bad))
        with pytest.raises(ValueError, match="^pit"):
            TF.pit_calibration_error(_with(u, 1, bad))
    with pytest.raises(ValueError, match="^pit"):
        TF.pit_calibration_error(torch.zeros(0))
    assert TF.pit_histogram(torch.zeros(0), 4).tolist() == [[0, 0, 0, 0]]
    with pytest.raises(ValueError, match="^n_bins"):
        TF.pit_histogram(u, 0)
    with pytest.raises(ValueError, match="^groups"):
        TF.pit_histogram(u, groups=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="^groups"):
        TF.pit_histogram(u, groups=torch.tensor([0, 1, 2]), num_groups=2)
    with pytest.raises(ValueError, match="^groups"):
        TF.pit_histogram(u, groups=torch.tensor([0.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match="^num_groups"):
        TF.pit_histogram(u, num_groups=2)
    with pytest.raises(ValueError, match="^counts"):
        TF.pit_calibration_error_from_counts(torch.zeros(()))
    with pytest.raises(ValueError, match="^observed"):
        TF.frequency_calibration_error(torch.zeros(2), LEVELS)
    assert math.isnan(TF.pit_calibration_error_from_counts(torch.zeros(5)).item())


@pytest.mark.parametrize("bad", [0.0, -1.0, NAN, INF])
def test_sharpness_bad_scale(bad):
    with pytest.raises(ValueError, match="^scale"):
        TF.sharpness(_with(SCALE, 2, bad))
    with pytest.raises(ValueError, match="^scale"):
        TF.sharpness(torch.zeros(0))


def test_pit_of_distributions_bad_inputs():
    d = torch.distributions.Normal(LOC, SCALE)
    with pytest.raises(ValueError, match="^target"):
        TF.pit(d, _with(Y, 0, NAN))
    with pytest.raises(ValueError, match="^target"):
        TF.pit(d, Y[:2])
    with pytest.raises(ValueError, match="^target"):
        TF.pit(torch.distributions.Normal(0.0, 1.0), Y)  # a scalar law against 3 targets
