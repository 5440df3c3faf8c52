"""Hostile inputs for the recalibrators of predictive distributions (issue 11, Build 3-4):
VarianceScaler, QuantileRecalibrator, SplitConformal, ConformalQuantileRegression.

Every entry point (constructor, fit, forward/predict/maps, load_state_dict) against bad shapes,
NaN, non-positive scales, unsorted or crossing quantiles, levels and alpha outside (0, 1), too
few calibration points, group ids out of range, a target that would broadcast, an unfitted
predictor: each case expects a ValueError whose message starts with the argument's name (a
TypeError for a wrong Python type, NotFittedError before a fit), or the right number against
an independent reference (numpy float64, exact fractions, a hand-worked example)."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch

from torchcal.scaling import (
    CalibrationWarning,
    ConformalQuantileRegression,
    NotFittedError,
    QuantileRecalibrator,
    SplitConformal,
    VarianceScaler,
)

NAN, INF = math.nan, math.inf
F64 = torch.float64
_G = torch.Generator().manual_seed(0)
LOC = torch.randn(9, generator=_G, dtype=F64)
SCALE = 0.5 + torch.rand(9, generator=_G, dtype=F64)
Y = LOC + 2 * SCALE * torch.randn(9, generator=_G, dtype=F64)
PIT = torch.rand(50, generator=_G, dtype=F64)
GRP = torch.arange(9) % 2
LO, HI = LOC - SCALE, LOC + SCALE
NORMAL = torch.distributions.Normal(torch.zeros(()), torch.ones(()))


def _set(x: torch.Tensor, idx: Any, v: float) -> torch.Tensor:
    x = x.clone()
    x[idx] = v
    return x


def fitted(make: Callable[[], Any], *args: Any) -> Any:
    m = make()
    m.fit(*args)
    return m


def vs() -> VarianceScaler:
    return fitted(VarianceScaler, LOC, SCALE, Y)


def qr() -> QuantileRecalibrator:
    return fitted(QuantileRecalibrator, PIT)


def sc(**kw: Any) -> SplitConformal:
    m = SplitConformal(**kw)
    m.fit(LOC, Y, SCALE if kw.get("score") == "normalized" else None)
    return m


def cqr() -> ConformalQuantileRegression:
    return fitted(ConformalQuantileRegression, LO, HI, Y)


def sc_grouped() -> SplitConformal:
    m = SplitConformal(alpha=0.4)
    m.fit(LOC, Y, groups=GRP)
    return m


def load(make: Callable[[], Any], **entries: Any) -> Any:
    """``make()``'s own state with ``entries`` replaced, loaded into a fresh instance."""
    source = make()
    state = source.state_dict()
    state.update(entries)
    m = type(source)()
    m.load_state_dict(state)
    return m


# (id, call, "^regex" for a ValueError | NotFittedError | (TypeError, "^regex"))
CASES: list[tuple[str, Callable[[], Any], Any]] = [
    # ---------------------------------------------------------------- VarianceScaler
    ("vs-objective", lambda: VarianceScaler(objective="mse"), "^objective"),
    ("vs-family", lambda: VarianceScaler(family="gamma"), "^family"),
    ("vs-nll-logistic", lambda: VarianceScaler(family="logistic"), "^family: the NLL fit"),
    ("vs-bounds-zero", lambda: VarianceScaler(bounds=(0.0, 1.0)), "^bounds"),
    ("vs-bounds-reversed", lambda: VarianceScaler(bounds=(2.0, 1.0)), "^bounds"),
    ("vs-grad-tol", lambda: VarianceScaler(grad_tol=0.0), "^grad_tol"),
    ("vs-max-iter-0", lambda: VarianceScaler(max_iter=0), "^max_iter: expected an int >= 1"),
    ("vs-max-iter-float", lambda: VarianceScaler(max_iter=2.5), (TypeError, "^max_iter")),
    ("vs-fit-nan-loc", lambda: VarianceScaler().fit(_set(LOC, 3, NAN), SCALE, Y), "^loc"),
    ("vs-fit-nan-target", lambda: VarianceScaler().fit(LOC, SCALE, _set(Y, 2, NAN)), "^target"),
    ("vs-fit-inf-scale", lambda: VarianceScaler().fit(LOC, _set(SCALE, 0, INF), Y), "^scale"),
    ("vs-fit-zero-scale", lambda: VarianceScaler().fit(LOC, _set(SCALE, 1, 0.0), Y), "^scale"),
    ("vs-fit-neg-scale", lambda: VarianceScaler().fit(LOC, -SCALE, Y), "^scale: expected values > 0"),
    ("vs-fit-target-N1", lambda: VarianceScaler().fit(LOC, SCALE, Y[:, None]), r"^target: expected shape \(9, 1\)"),
    ("vs-fit-loc-N1", lambda: VarianceScaler().fit(LOC[:, None], SCALE, Y), "^target"),
    ("vs-fit-short-loc", lambda: VarianceScaler().fit(LOC[:4], SCALE, Y), "^scale"),
    ("vs-fit-empty", lambda: VarianceScaler().fit(LOC[:0], SCALE[:0], Y[:0]), "^loc: expected a non-empty"),
    ("vs-fit-int-target", lambda: VarianceScaler().fit(LOC, SCALE, Y.long()), "^target: expected a floating"),
    ("vs-fit-list", lambda: VarianceScaler().fit(LOC.tolist(), SCALE, Y), (TypeError, "^loc")),
    ("vs-forward-unfitted", lambda: VarianceScaler()(LOC, SCALE), NotFittedError),
    ("vs-forward-nan-loc", lambda: vs()(_set(LOC, 0, NAN), SCALE), "^loc"),
    ("vs-forward-zero-scale", lambda: vs()(LOC, _set(SCALE, 2, 0.0)), "^scale"),
    ("vs-forward-int-scale", lambda: vs()(LOC, SCALE.long()), "^scale: expected a floating"),
    ("vs-forward-short-scale", lambda: vs()(LOC, SCALE[:4]), r"^scale: expected loc's shape \(9,\)"),
    ("vs-forward-N1-scale", lambda: vs()(LOC, SCALE[:, None]), "^scale"),  # would be (9, 9)
    ("vs-setter-zero", lambda: setattr(VarianceScaler(), "scale_factor", 0.0), "^scale_factor"),
    ("vs-setter-nan", lambda: setattr(VarianceScaler(), "scale_factor", NAN), "^scale_factor"),
    ("vs-setter-subnormal", lambda: setattr(VarianceScaler(), "scale_factor", 1e-320), "^scale_factor"),
    ("vs-load-nan", lambda: load(VarianceScaler, log_scale_factor=torch.tensor(NAN, dtype=F64)), "^log_scale_factor"),
    ("vs-load-huge", lambda: load(VarianceScaler, log_scale_factor=torch.tensor(800.0, dtype=F64)), "^log_scale_factor"),
    ("vs-load-two", lambda: load(VarianceScaler, log_scale_factor=torch.zeros(2, dtype=F64)), "^log_scale_factor"),
    # ---------------------------------------------------------------- QuantileRecalibrator
    ("qr-fit-nan", lambda: QuantileRecalibrator().fit(_set(PIT, 4, NAN)), "^pit"),
    ("qr-fit-above-1", lambda: QuantileRecalibrator().fit(_set(PIT, 4, 1.2)), r"^pit: expected probabilities in \[0, 1\]"),
    ("qr-fit-negative", lambda: QuantileRecalibrator().fit(_set(PIT, 0, -0.1)), "^pit"),
    ("qr-fit-empty", lambda: QuantileRecalibrator().fit(PIT[:0]), "^pit: expected a non-empty"),
    ("qr-fit-int", lambda: QuantileRecalibrator().fit(PIT.long()), "^pit: expected a floating"),
    ("qr-recalibrate-unfitted", lambda: QuantileRecalibrator().recalibrate(PIT), NotFittedError),
    ("qr-levels-unfitted", lambda: QuantileRecalibrator().levels_for(0.5), NotFittedError),
    ("qr-quantile-unfitted", lambda: QuantileRecalibrator().quantile(NORMAL, 0.5), NotFittedError),
    ("qr-recalibrate-out", lambda: qr().recalibrate(torch.tensor([1.5], dtype=F64)), "^p"),
    ("qr-recalibrate-nan", lambda: qr().recalibrate(torch.tensor([NAN], dtype=F64)), "^p"),
    ("qr-levels-0", lambda: qr().levels_for(0.0), r"^tau: expected values in the open interval \(0, 1\)"),
    ("qr-levels-1", lambda: qr().levels_for(torch.tensor([0.5, 1.0], dtype=F64)), "^tau"),
    ("qr-levels-nan", lambda: qr().levels_for(NAN), "^tau"),
    ("qr-levels-bool", lambda: qr().levels_for(True), (TypeError, "^tau")),
    ("qr-levels-2d", lambda: qr().quantile(NORMAL, torch.full((2, 2), 0.5, dtype=F64)), "^tau"),
    ("qr-interval-1", lambda: qr().interval(NORMAL, 1.0), "^coverage"),
    ("qr-interval-neg", lambda: qr().interval(NORMAL, -0.5), "^coverage"),
    ("qr-no-icdf", lambda: qr().quantile(object(), 0.5), "^distribution"),
    ("qr-load-unsorted", lambda: load(qr, x_knots=torch.tensor([0.0, 0.5, 0.3, 1.0], dtype=F64), y_knots=torch.tensor([0.0, 0.2, 0.5, 1.0], dtype=F64)), "^x_knots"),
    ("qr-load-crossing-y", lambda: load(qr, x_knots=torch.tensor([0.0, 0.3, 0.5, 1.0], dtype=F64), y_knots=torch.tensor([0.0, 0.5, 0.2, 1.0], dtype=F64)), "^y_knots"),
    ("qr-load-nan", lambda: load(qr, x_knots=torch.tensor([0.0, NAN, 1.0], dtype=F64), y_knots=torch.tensor([0.0, 0.5, 1.0], dtype=F64)), "^x_knots"),
    ("qr-load-no-ends", lambda: load(qr, x_knots=torch.tensor([0.2, 0.8], dtype=F64), y_knots=torch.tensor([0.0, 1.0], dtype=F64)), "^x_knots: expected knots from 0 to 1"),
    ("qr-load-one-knot", lambda: load(qr, x_knots=torch.tensor([0.5], dtype=F64), y_knots=torch.tensor([0.5], dtype=F64)), "^x_knots"),
    ("qr-load-shapes", lambda: load(qr, x_knots=torch.tensor([0.0, 1.0], dtype=F64), y_knots=torch.tensor([0.0, 0.5, 1.0], dtype=F64)), "^y_knots"),
    ("qr-load-2d", lambda: load(qr, x_knots=torch.tensor([[0.0, 1.0]], dtype=F64), y_knots=torch.tensor([[0.0, 1.0]], dtype=F64)), "^x_knots: expected a 1-D"),
    ("qr-load-fitted-empty", lambda: load(QuantileRecalibrator, fitted=torch.tensor(True)), "^x_knots"),
    # ---------------------------------------------------------------- SplitConformal
    ("sc-alpha-0", lambda: SplitConformal(alpha=0.0), r"^alpha: expected a value in the open interval \(0, 1\)"),
    ("sc-alpha-1", lambda: SplitConformal(alpha=1.0), "^alpha"),
    ("sc-alpha-nan", lambda: SplitConformal(alpha=NAN), "^alpha"),
    ("sc-alpha-str", lambda: SplitConformal(alpha="0.1"), (TypeError, "^alpha")),
    ("sc-score", lambda: SplitConformal(score="squared"), "^score"),
    ("sc-fit-nan-pred", lambda: SplitConformal().fit(_set(LOC, 1, NAN), Y), "^pred"),
    ("sc-fit-inf-target", lambda: SplitConformal().fit(LOC, _set(Y, 1, INF)), "^target"),
    ("sc-fit-target-N1", lambda: SplitConformal().fit(LOC, Y[:, None]), r"^target: expected the shape of pred \(9,\)"),
    ("sc-fit-short-target", lambda: SplitConformal().fit(LOC, Y[:8]), "^target"),
    ("sc-fit-int-target", lambda: SplitConformal().fit(LOC, Y.long()), "^target"),
    ("sc-fit-empty", lambda: SplitConformal().fit(LOC[:0], Y[:0]), "^pred: expected a non-empty"),
    ("sc-fit-scale-absolute", lambda: SplitConformal().fit(LOC, Y, SCALE), "^scale: given with score='absolute'"),
    ("sc-fit-no-scale", lambda: SplitConformal(score="normalized").fit(LOC, Y), "^scale"),
    ("sc-fit-zero-scale", lambda: SplitConformal(score="normalized").fit(LOC, Y, _set(SCALE, 3, 0.0)), "^scale: expected values > 0"),
    ("sc-fit-scalar-scale", lambda: SplitConformal(score="normalized").fit(LOC, Y, SCALE[0]), "^scale: expected the shape"),
    ("sc-fit-groups-range", lambda: SplitConformal().fit(LOC, Y, groups=GRP, num_groups=1), r"^groups: expected group ids in \[0, 0\]"),
    ("sc-fit-groups-negative", lambda: SplitConformal().fit(LOC, Y, groups=GRP - 1), "^groups"),
    ("sc-fit-groups-float", lambda: SplitConformal().fit(LOC, Y, groups=GRP.double()), "^groups: expected integer"),
    ("sc-fit-groups-N1", lambda: SplitConformal().fit(LOC, Y, groups=GRP[:, None]), "^groups: expected one group id per sample"),
    ("sc-fit-num-groups-alone", lambda: SplitConformal().fit(LOC, Y, num_groups=2), "^num_groups"),
    ("sc-predict-unfitted", lambda: SplitConformal().predict(LOC), NotFittedError),
    ("sc-predict-nan", lambda: sc().predict(_set(LOC, 0, NAN)), "^pred"),
    ("sc-predict-scale-shape", lambda: sc(score="normalized").predict(LOC, SCALE[:3]), "^scale"),
    ("sc-predict-groups-missing", lambda: sc_grouped().predict(LOC), "^groups: this predictor was calibrated per group"),
    ("sc-predict-groups-range", lambda: sc_grouped().predict(LOC, groups=GRP + 1), r"^groups: expected group ids in \[0, 1\]"),
    ("sc-predict-groups-ungrouped", lambda: sc().predict(LOC, groups=GRP), r"^groups: expected group ids in \[0, 0\]"),
    ("sc-load-alpha", lambda: load(sc, alpha=torch.tensor(1.5, dtype=F64)), "^alpha"),
    ("sc-load-negative-q", lambda: load(sc, score_quantiles=torch.tensor([-1.0], dtype=F64)), "^score_quantiles"),
    ("sc-load-nan-q", lambda: load(sc, score_quantiles=torch.tensor([NAN], dtype=F64)), "^score_quantiles"),
    ("sc-load-2d-q", lambda: load(sc, score_quantiles=torch.ones(1, 1, dtype=F64), counts=torch.ones(1, 1, dtype=torch.long)), "^score_quantiles"),
    ("sc-load-counts-shape", lambda: load(sc, counts=torch.tensor([3, 4])), "^counts"),
    ("sc-load-counts-negative", lambda: load(sc, counts=torch.tensor([-3])), "^counts"),
    ("sc-load-counts-float", lambda: load(sc, counts=torch.tensor([3.5])), "^counts: expected .* integer"),
    ("sc-load-fitted-empty", lambda: load(SplitConformal, fitted=torch.tensor(True)), "^score_quantiles: a fitted state"),
    # ---------------------------------------------------------------- CQR
    ("cqr-alpha", lambda: ConformalQuantileRegression(alpha=1.2), "^alpha"),
    ("cqr-fit-nan-lower", lambda: ConformalQuantileRegression().fit(_set(LO, 2, NAN), HI, Y), "^lower"),
    ("cqr-fit-upper-N1", lambda: ConformalQuantileRegression().fit(LO, HI[:, None], Y), "^upper: expected the shape of lower"),
    ("cqr-fit-target-N1", lambda: ConformalQuantileRegression().fit(LO, HI, Y[:, None]), "^target: expected the shape of lower"),
    ("cqr-fit-nan-target", lambda: ConformalQuantileRegression().fit(LO, HI, _set(Y, 0, NAN)), "^target"),
    ("cqr-fit-groups", lambda: ConformalQuantileRegression().fit(LO, HI, Y, groups=GRP + 5, num_groups=2), r"^groups: expected group ids in \[0, 1\], got 5"),
    ("cqr-predict-unfitted", lambda: ConformalQuantileRegression().predict(LO, HI), NotFittedError),
    ("cqr-predict-shapes", lambda: cqr().predict(LO, HI[:4]), "^upper"),
    ("cqr-load-neg-inf", lambda: load(cqr, score_quantiles=torch.tensor([-INF], dtype=F64)), "^score_quantiles"),
]  # fmt: skip


@pytest.mark.parametrize("case_id, call, expected", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_raises(case_id: str, call: Callable[[], Any], expected: Any) -> None:
    if expected is NotFittedError:
        with pytest.raises(NotFittedError):
            call()
        return
    exc, pattern = expected if isinstance(expected, tuple) else (ValueError, expected)
    with pytest.raises(exc, match=pattern):
        call()


# ---------------------------------------------------------------- valid edge cases: numbers
def test_variance_scaler_edge_numbers() -> None:
    r = ((Y - LOC) / SCALE).numpy()
    assert vs().scale_factor == pytest.approx(math.sqrt(np.mean(r**2)), rel=1e-12)
    lap = VarianceScaler(family="laplace")
    lap.fit(LOC, SCALE, Y)
    assert lap.scale_factor == pytest.approx(np.mean(np.abs(r)), rel=1e-12)
    one = VarianceScaler()  # a single calibration point: s = |r|
    one.fit(LOC[:1], SCALE[:1], Y[:1])
    assert one.scale_factor == pytest.approx(abs(r[0]), rel=1e-12)
    # the forecast broadcasts to the target (a scalar loc), the target never does
    scalar = VarianceScaler()
    scalar.fit(torch.tensor(0.5, dtype=F64), SCALE, Y)
    ref = (Y.numpy() - 0.5) / SCALE.numpy()
    assert scalar.scale_factor == pytest.approx(math.sqrt(np.mean(ref**2)), rel=1e-12)
    # forward: loc is the same tensor, a scalar scale broadcasts to nothing bigger
    m = vs()
    out_loc, out_scale = m(LOC, torch.tensor(2.0, dtype=F64))
    assert out_loc is LOC and float(out_scale) == pytest.approx(2 * m.scale_factor, rel=1e-15)
    # every residual 0: the optimum s = 0 lies outside the bounds -> the bound, warned
    zero = VarianceScaler(bounds=(1e-3, 1e3))
    with pytest.warns(CalibrationWarning, match="^scale_factor"):
        res = zero.fit(LOC, SCALE, LOC)
    assert res.scale == pytest.approx(1e-3, rel=1e-12) and not res.converged


def test_quantile_recalibrator_edge_numbers() -> None:
    one = QuantileRecalibrator()  # one PIT value 0.3: knots (0, 0), (0.3, 1/2), (1, 1)
    one.fit(torch.tensor([0.3], dtype=F64))
    assert one.x_knots.tolist() == [0.0, 0.3, 1.0] and one.y_knots.tolist() == [0.0, 0.5, 1.0]
    assert float(one.recalibrate(torch.tensor(0.15, dtype=F64))) == pytest.approx(0.25, abs=1e-15)
    assert float(one.levels_for(0.75)) == pytest.approx(0.65, abs=1e-15)
    ties = QuantileRecalibrator()  # PIT all 0: ranked, but no knot; the anchors stay
    ties.fit(torch.zeros(3, dtype=F64))
    assert ties.x_knots.tolist() == [0.0, 1.0] and ties.y_knots.tolist() == [0.0, 1.0]
    zeros = QuantileRecalibrator()  # two of four exactly 0: the first knot keeps rank 3/5
    zeros.fit(torch.tensor([0.0, 0.0, 0.4, 0.8], dtype=F64))
    assert zeros.x_knots.tolist() == [0.0, 0.4, 0.8, 1.0]
    assert zeros.y_knots.tolist() == pytest.approx([0.0, 0.6, 0.8, 1.0], abs=1e-15)
    m = qr()  # a loaded state equals the fitted one
    back = load(qr)
    p = torch.linspace(0, 1, 11, dtype=F64)
    assert torch.equal(back.recalibrate(p), m.recalibrate(p))


def _kth(scores: np.ndarray, alpha: float) -> float:
    """The ceil((n + 1)(1 - alpha))-th smallest score, in exact rational arithmetic."""
    n = scores.size
    k = math.ceil((n + 1) * (1 - Fraction(alpha).limit_denominator(10**9)))
    return math.inf if k > n else float(np.sort(scores)[k - 1])


@pytest.mark.parametrize("alpha", [0.1, 0.2, 0.3, 0.7])
def test_split_conformal_quantile_against_exact_rank(alpha: float) -> None:
    # alpha = 0.7: (n + 1)(1 - 0.7) = 3.0000000000000004 in floating point, ceil = 4, exact 3
    scores = np.abs(Y.numpy() - LOC.numpy())
    m = SplitConformal(alpha=alpha)
    if math.isinf(_kth(scores, alpha)):
        with pytest.warns(CalibrationWarning, match="^alpha"):
            fit = m.fit(LOC, Y)
    else:
        fit = m.fit(LOC, Y)
    assert fit.quantiles[0] == _kth(scores, alpha)
    lo, hi = m.predict(LOC)
    q = torch.tensor(fit.quantiles[0], dtype=F64)
    assert torch.equal(lo, LOC - q) and torch.equal(hi, LOC + q)


def test_too_few_points_and_empty_group_give_infinite_intervals() -> None:
    m = SplitConformal(alpha=0.05)  # n = 9 < 1 / alpha - 1 = 19: k = 10 > n
    with pytest.warns(CalibrationWarning, match=r"^alpha: ceil\(\(n \+ 1\)\(1 - alpha\)\) > n"):
        fit = m.fit(LOC, Y)
    assert fit.ranks == (10,) and fit.quantiles == (math.inf,)
    lo, hi = m.predict(LOC[:2])
    assert bool(torch.isneginf(lo).all() & torch.isposinf(hi).all())
    g = SplitConformal(alpha=0.4)  # Mondrian, group 2 empty
    with pytest.warns(CalibrationWarning, match=r"group\(s\) \[2\]"):
        fit = g.fit(LOC, Y, groups=GRP, num_groups=3)
    scores = np.abs(Y.numpy() - LOC.numpy())
    for k in (0, 1):
        assert fit.quantiles[k] == _kth(scores[GRP.numpy() == k], 0.4)
    assert fit.counts == (5, 4, 0) and fit.quantiles[2] == math.inf


def test_cqr_negative_quantile_and_crossing_band() -> None:
    lo, hi = -torch.ones(9, dtype=F64), torch.ones(9, dtype=F64)
    y = torch.tensor([0.0, 0.1, -0.1, 0.2, -0.2, 0.3, -0.3, 0.4, -0.4], dtype=F64)
    m = ConformalQuantileRegression(alpha=0.2)  # scores max(lo - y, y - hi) = |y| - 1
    fit = m.fit(lo, hi, y)
    ref = _kth(np.abs(y.numpy()) - 1, 0.2)
    assert fit.quantiles[0] == ref == pytest.approx(-0.6, abs=1e-15)  # k = 8 of 9
    new_lo, new_hi = m.predict(
        torch.tensor([-1.0, 0.0], dtype=F64), torch.tensor([1.0, 1.0], dtype=F64)
    )
    # [-1, 1] narrows to [-0.4, 0.4]; [0, 1] would cross (width 1 < 1.2): its midpoint
    assert new_lo.tolist() == pytest.approx([-1 - ref, 0.5], abs=1e-15)
    assert new_hi.tolist() == pytest.approx([1 + ref, 0.5], abs=1e-15)
