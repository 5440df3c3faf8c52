"""Hostile inputs for every public post-hoc calibrator entry point (fit, forward,
load_state_dict, fit_stream): each case expects a ValueError naming the argument, a warning,
or the right number (against an independent reference) -- never a plausible wrong number."""

import functools
import math
import warnings

import pytest
import torch

from torchcal.scaling import (
    CalibrationWarning,
    GroupTemperatureScaler,
    IsotonicCalibrator,
    MatrixScaler,
    NotFittedError,
    PlattScaler,
    TemperatureScaler,
    VectorScaler,
)

_G = torch.Generator().manual_seed(0)
Z = 2 * torch.randn(40, 3, generator=_G, dtype=torch.float64)
Y = torch.multinomial(torch.softmax(Z / 2, 1), 1, generator=_G).squeeze(1)
S = Z[:, 0] - Z[:, 1]
B = torch.bernoulli(torch.sigmoid(S / 2), generator=_G)
GRP = torch.arange(40) % 2
NAN, INF = math.nan, math.inf


def _set(x, idx, v):
    x = x.clone()
    x[idx] = v
    return x


MULTI = {  # name -> factory of a multiclass calibrator, extra fit args
    "temperature": (TemperatureScaler, ()),
    "group": (lambda: GroupTemperatureScaler(2), (GRP,)),
    "vector": (lambda: VectorScaler(3), ()),
    "matrix": (lambda: MatrixScaler(3), ()),
}
BINARY = {
    "temperature": (TemperatureScaler, ()),
    "group": (lambda: GroupTemperatureScaler(2), (GRP,)),
    "platt": (PlattScaler, ()),
    "isotonic": (IsotonicCalibrator, ()),
}

# (case id, logits, target, expected: "^regex" for ValueError, or a warning regex prefixed "W")
MULTI_CASES = [
    ("nan", _set(Z, (3, 1), NAN), Y, "^logits: expected finite"),
    ("posinf", _set(Z, (3, 1), INF), Y, "^logits: "),
    ("empty", Z[:0], Y[:0], "^logits: expected a non-empty"),
    ("int-logits", Z.long(), Y, "^logits: expected a floating-point"),
    ("3d-logits", Z.reshape(40, 3, 1), Y, r"^logits: expected"),
    ("target-N1", Z, Y[:, None], r"^target: expected shape \(40,\)"),
    ("one-hot-float", Z, torch.nn.functional.one_hot(Y, 3).double(), r"^target: expected shape"),
    ("float-target", Z, Y.double(), "^target: expected integer class indices"),
    ("target-out-of-range", Z, _set(Y, 4, 3), r"^target: expected class indices in \[0, 2\]"),
    ("target-masked", _set(Z, (5, int(Y[5])), -INF), Y, r"^logits: the target class is masked"),
    (
        "probs-as-logits",
        torch.softmax(Z, 1),
        Y,
        "Wlogits: every row is in \\[0, 1\\] and sums to 1",
    ),
]
BINARY_CASES = [
    ("nan", _set(S, 3, NAN), B, "^logits: expected finite"),
    ("posinf", _set(S, 3, INF), B, "^logits: "),
    ("empty", S[:0], B[:0], "^logits: expected a non-empty"),
    ("int-logits", S.long(), B, "^logits: expected a floating-point"),
    ("target-N1-vs-N", S, B[:, None], r"^target: expected shape \(40,\)"),
    ("target-not-binary", S, _set(B, 2, 0.5), r"^target: expected binary labels"),
    ("target-wrong-length", S, B[:39], r"^target: expected shape \(40,\)"),
]


@pytest.mark.parametrize("kind", sorted(MULTI))
@pytest.mark.parametrize(
    "case, logits, target, expect", MULTI_CASES, ids=[c[0] for c in MULTI_CASES]
)
def test_multiclass_fit_hostile(kind, case, logits, target, expect):
    make, extra = MULTI[kind]
    extra = tuple(e[: logits.shape[0]] for e in extra)
    if expect.startswith("W"):
        with pytest.warns(CalibrationWarning, match=expect[1:]):
            make().fit(logits, target, *extra)
    else:
        with pytest.raises(ValueError, match=expect):
            make().fit(logits, target, *extra)


@pytest.mark.parametrize("kind", sorted(BINARY))
@pytest.mark.parametrize(
    "case, logits, target, expect", BINARY_CASES, ids=[c[0] for c in BINARY_CASES]
)
def test_binary_fit_hostile(kind, case, logits, target, expect):
    make, extra = BINARY[kind]
    extra = tuple(e[: logits.shape[0]] for e in extra)
    if case == "posinf" and kind == "isotonic":
        expect = "^logits: expected finite"
    with pytest.raises(ValueError, match=expect):
        make().fit(logits, target, *extra)


@pytest.mark.parametrize("kind", ["temperature", "group", "platt"])
def test_binary_probabilities_as_logits_warn(kind):
    make, extra = BINARY[kind]
    with pytest.warns(CalibrationWarning, match=r"^logits: every value is in \[0, 1\]"):
        make().fit(torch.sigmoid(S), B, *extra)


def test_unnormalised_probs_give_the_optimum_of_what_was_passed():
    """Rows in [0, 1] that do not sum to 1 are logits like any other (no warning): the T is
    the NLL optimum for them, checked by the sign change of an independent derivative."""
    x = 0.5 * torch.softmax(Z, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        res = TemperatureScaler().fit(x, Y)

    def nll(t):
        return float(torch.nn.functional.cross_entropy(x / t, Y))

    t = res.temperature
    assert res.converged and nll(t) <= min(nll(t * 1.001), nll(t / 1.001))


@pytest.mark.parametrize("kind", ["temperature", "vector", "matrix", "group"])
def test_single_sample_is_flagged(kind):
    """N = 1 is separable: no finite optimum. A warning and converged=False, never a silent
    'converged' map fitted to one sample."""
    make, extra = MULTI[kind]
    extra = tuple(e[:1] for e in extra)
    y1 = Z[:1].argmax(1)
    if kind in ("vector", "matrix"):  # reg="cv" (the default) needs a row per fold
        with pytest.raises(ValueError, match="^folds: expected at most N = 1"):
            make().fit(Z[:1], y1)
        make = {"vector": VectorScaler, "matrix": MatrixScaler}[kind]
        make = functools.partial(make, 3, reg=0.0)
    with pytest.warns(CalibrationWarning):
        res = make().fit(Z[:1], y1, *extra)
    assert not res.converged


def test_single_sample_platt_and_isotonic():
    with pytest.raises(ValueError, match="^target: expected both classes"):
        PlattScaler().fit(S[:1], B[:1])
    iso = IsotonicCalibrator()
    iso.fit(S[:1], torch.ones(1))  # one point: the map is that point's outcome
    assert iso.predict_proba(torch.tensor([-5.0, 5.0])).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("scale", [1e30, 1e300])
def test_extreme_logits(scale):
    """Huge logits: a bounded T with a warning, an error naming logits (affine maps, whose
    Hessian squares them), or the right isotonic map -- never NaN."""
    with pytest.warns(CalibrationWarning, match="^T: the NLL keeps decreasing as T grows"):
        res = TemperatureScaler().fit(Z * scale, Y)
    assert res.temperature == pytest.approx(1e3) and not res.converged
    assert math.isfinite(res.nll_after)
    for make in (lambda: VectorScaler(3), lambda: MatrixScaler(3)):
        with pytest.raises(ValueError, match=r"^logits: expected \|logits\| <= 1e\+100"):
            make().fit(Z * 1e300, Y)
    iso, ref = IsotonicCalibrator(), IsotonicCalibrator()
    iso.fit(S * scale, B)
    ref.fit(S, B)
    assert torch.equal(iso.predict_proba(S * scale), ref.predict_proba(S))  # order only
    with pytest.warns(CalibrationWarning, match="^a: the NLL keeps decreasing beyond"):
        PlattScaler().fit(S * scale, B)


# ----------------------------------------------------------------------------- forward
def _fitted_all():
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        for name, (make, extra) in MULTI.items():
            m = make()
            m.fit(Z, Y, *extra)
            out["multi-" + name] = (m, (Z,), extra)
        for name, (make, extra) in BINARY.items():
            m = make()
            m.fit(S, B, *extra)
            out["binary-" + name] = (m, (S,), extra)
    return out


FITTED = _fitted_all()


@pytest.mark.parametrize("name", sorted(FITTED))
@pytest.mark.parametrize(
    "bad, expect",
    [
        ("nan", "^logits: expected finite"),
        ("posinf", "^logits: expected finite"),
        ("int", "^logits: expected a floating-point"),
        ("list", "^logits: expected a floating"),
    ],
)
def test_forward_hostile(name, bad, expect):
    m, (x,), extra = FITTED[name]
    if bad == "nan":
        x = _set(x, 0, NAN)
    elif bad == "posinf":
        x = _set(x, 0, INF)
    elif bad == "int":
        x = x.long()
    else:
        x = x.tolist()
    with pytest.raises(ValueError, match=expect):
        m(x, *extra)


@pytest.mark.parametrize("name", sorted(FITTED))
def test_forward_neg_inf_masks_never_nan(name):
    m, (x,), extra = FITTED[name]
    x = _set(x, 0, -INF)
    out = m(x, *extra)
    assert not bool(torch.isnan(out).any())


@pytest.mark.parametrize("name", sorted(FITTED))
def test_forward_before_fit_raises(name):
    m, (x,), extra = FITTED[name]
    fresh = type(m)(
        **(
            {"num_classes": 3}
            if isinstance(m, (VectorScaler, MatrixScaler))
            else {"num_groups": 2}
            if isinstance(m, GroupTemperatureScaler)
            else {}
        )
    )
    with pytest.raises(NotFittedError):
        fresh(x, *extra)


# ----------------------------------------------------------------------------- load_state_dict
@pytest.mark.parametrize("name", sorted(FITTED))
def test_load_nan_state_raises_naming_the_key(name):
    m = FITTED[name][0]
    state = m.state_dict()
    key = next(k for k, v in state.items() if v.is_floating_point() and v.numel())
    state[key] = torch.full_like(state[key], NAN)
    with pytest.raises(ValueError, match=f"^{key}: expected finite"):
        type(m)(
            **(
                {"num_classes": 3}
                if isinstance(m, (VectorScaler, MatrixScaler))
                else {"num_groups": 2}
                if isinstance(m, GroupTemperatureScaler)
                else {}
            )
        ).load_state_dict(state)


# ----------------------------------------------------------------------------- fit_stream
@pytest.mark.parametrize(
    "batches, expect",
    [
        ([], "^batches: expected at least one"),
        (iter([(Z, Y)]), "^batches: expected a re-iterable"),
        ([(Z, Y), (S, B)], "^batches: every chunk must have the same kind"),
        ([(Z,)], r"^batches: expected \(logits, target\) pairs"),
        ([(_set(Z, (1, 1), NAN), Y)], "^logits: expected finite values or -inf masks"),
        ([(Z, Y[:, None])], r"^target: expected shape \(40,\)"),
        ([(Z, _set(Y, 0, 7))], r"^target: expected class indices in \[0, 2\]"),
    ],
)
def test_fit_stream_hostile(batches, expect):
    with pytest.raises(ValueError, match=expect):
        TemperatureScaler().fit_stream(batches)
