"""Issue 9 regressions for the post-hoc calibrators: float64 state under dtype casts, validated
loaded state, separation detected, (B, 1) binary logits, floating-point invariants."""

import io
import math
import warnings

import pytest
import torch

from torchcal.functional.invariants import check_monotone_map
from torchcal.scaling import (
    CalibrationWarning,
    GroupTemperatureScaler,
    IsotonicCalibrator,
    MatrixScaler,
    PlattScaler,
    TemperatureScaler,
    VectorScaler,
)


def _data(seed=0, n=600, c=3):
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / 2.4776, 1), 1, generator=g).squeeze(1)
    s = z[:, 0] - z[:, 1]
    b = torch.bernoulli(torch.sigmoid(0.7 * s - 0.3), generator=g)
    return z, y, s, b


def _fitted():
    """One fitted instance of every calibrator, with the inputs its forward takes."""
    z, y, s, b = _data()
    groups = torch.arange(z.shape[0]) % 2
    out = []
    for make, fit_args, fwd_args in [
        (TemperatureScaler, (z, y), (z,)),
        (lambda: GroupTemperatureScaler(2), (z, y, groups), (z, groups)),
        (PlattScaler, (s, b), (s,)),
        (lambda: VectorScaler(3), (z, y), (z,)),
        (lambda: MatrixScaler(3), (z, y), (z,)),
        (IsotonicCalibrator, (s, b), (s,)),
    ]:
        m = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            m.fit(*fit_args)
        out.append((make, m, fwd_args))
    return out


FITTED = _fitted()
IDS = [type(m).__name__ for _, m, _ in FITTED]


def _save_load(state, fresh):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    return fresh


# ----------------------------------------------------------------------------- dtype casts
@pytest.mark.parametrize("cast", ["to_bf16", "half", "bfloat16", "float", "to_device_dtype"])
@pytest.mark.parametrize("idx", range(len(FITTED)), ids=IDS)
def test_state_stays_float64_under_dtype_casts(idx, cast):
    make, fitted, fwd = FITTED[idx]
    ref = {k: v.clone() for k, v in fitted.state_dict().items()}
    m = make()
    m.load_state_dict(fitted.state_dict())
    outer = torch.nn.Sequential(torch.nn.Linear(2, 2), m)  # a module holding the calibrator
    {
        "to_bf16": lambda: outer.to(torch.bfloat16),
        "half": outer.half,
        "bfloat16": outer.bfloat16,
        "float": outer.float,
        "to_device_dtype": lambda: outer.to("cpu", torch.float16),
    }[cast]()
    assert outer[0].weight.dtype != torch.float64  # the rest of the model was cast
    assert m.is_fitted
    for k, v in m.state_dict().items():
        assert v.dtype == ref[k].dtype and torch.equal(v, ref[k]), k  # bit-exact
    # the forward output follows the input dtype (documented); values as in float64
    out = m(*(a.to(torch.float32) if a.is_floating_point() else a for a in fwd))
    assert out.dtype == torch.float32


def test_fitted_temperature_is_checkpointed_exactly_under_bf16_true():
    """Issue 9: T = 2.4776 was checkpointed as 2.4750 after Lightning's bf16-true plugin
    (``module.to(torch.bfloat16)``) converted the LightningModule holding the scaler."""
    lp = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.plugins.precision import HalfPrecision

    class Model(lp.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(3, 3)
            self.temperature_scaler = TemperatureScaler()

    model = Model()
    model.temperature_scaler.temperature = 2.4776
    model = HalfPrecision("bf16-true").convert_module(model)
    assert model.net.weight.dtype == torch.bfloat16
    state = model.state_dict()
    assert state["temperature_scaler.log_temperature"].dtype == torch.float64
    assert model.temperature_scaler.temperature == pytest.approx(2.4776, rel=1e-15)
    old = math.exp(float(torch.tensor(math.log(2.4776)).bfloat16()))  # log T cast to bf16
    assert abs(old - 2.4776) > 1e-3  # what the old code stored (2.4750)
    restored = Model()
    restored.load_state_dict(state)
    assert restored.temperature_scaler.is_fitted
    assert restored.temperature_scaler.temperature == pytest.approx(2.4776, rel=1e-15)


# ----------------------------------------------------------------------------- loaded state
@pytest.mark.parametrize("idx", range(len(FITTED)), ids=IDS)
def test_unfitted_and_fitted_state_round_trip(idx):
    make, fitted, fwd = FITTED[idx]
    unfitted = _save_load(make().state_dict(), make())  # the Lightning helper relies on it
    assert not unfitted.is_fitted
    loaded = _save_load(fitted.state_dict(), make())
    assert loaded.is_fitted and torch.equal(loaded(*fwd), fitted(*fwd))


_BAD_STATES = [
    (
        TemperatureScaler,
        "log_temperature",
        torch.tensor(math.inf, dtype=torch.float64),
        "^log_temperature: expected finite",
    ),
    (
        TemperatureScaler,
        "log_temperature",
        torch.tensor(math.nan, dtype=torch.float64),
        "^log_temperature: expected finite",
    ),
    (
        TemperatureScaler,
        "log_temperature",
        torch.tensor(800.0, dtype=torch.float64),
        "^log_temperature: expected a temperature 0 < exp",
    ),
    (
        TemperatureScaler,
        "log_temperature",
        torch.tensor(-800.0, dtype=torch.float64),
        "^log_temperature: expected a temperature 0 < exp",
    ),
    (
        PlattScaler,
        "weight",
        torch.tensor(-1.0, dtype=torch.float64),
        "^weight: expected a slope a > 0",
    ),
    (
        PlattScaler,
        "weight",
        torch.tensor(0.0, dtype=torch.float64),
        "^weight: expected a slope a > 0",
    ),
    (PlattScaler, "bias", torch.tensor(math.nan, dtype=torch.float64), "^bias: expected finite"),
    (
        lambda: VectorScaler(3),
        "weight",
        torch.tensor([1.0, math.inf, 1.0], dtype=torch.float64),
        "^weight: expected finite",
    ),
    (
        lambda: MatrixScaler(3),
        "bias",
        torch.tensor([0.0, math.nan, 0.0], dtype=torch.float64),
        "^bias: expected finite",
    ),
    (
        lambda: GroupTemperatureScaler(2),
        "log_temperature",
        torch.tensor([0.0, math.inf], dtype=torch.float64),
        "^log_temperature: expected finite",
    ),
    (
        lambda: GroupTemperatureScaler(2),
        "log_temperature_global",
        torch.tensor(900.0, dtype=torch.float64),
        "^log_temperature_global: expected temperatures",
    ),
]


@pytest.mark.parametrize("make, key, value, match", _BAD_STATES)
def test_loaded_state_is_validated(make, key, value, match):
    src = make()
    state = src.state_dict()
    state[key] = value
    state["fitted"] = torch.tensor(True)
    dst = make()
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(ValueError, match=match):
        dst.load_state_dict(state)
    for k, v in dst.state_dict().items():  # nothing was half-loaded
        assert torch.equal(v, before[k])
    # nested: the message names the full key
    outer = torch.nn.ModuleDict({"cal": make()})
    with pytest.raises(ValueError, match="^cal." + match[1:]):
        outer.load_state_dict({f"cal.{k}": v for k, v in state.items()})


@pytest.mark.parametrize(
    "x, y, fitted, match",
    [
        (
            [0.0, 1.0],
            [0.2, 2.0],
            True,
            r"^y_thresholds: expected a non-decreasing map into \[0, 1\]",
        ),
        ([0.0, 1.0], [0.8, 0.2], True, "^y_thresholds: expected a non-decreasing"),
        ([0.0, 1.0], [-0.1, 0.5], True, "^y_thresholds: expected a non-decreasing"),
        ([1.0, 0.0], [0.2, 0.8], True, "^x_thresholds: expected finite, strictly increasing"),
        ([0.0, math.nan], [0.2, 0.8], True, "^x_thresholds: expected finite"),
        ([], [], True, "^x_thresholds: a fitted state needs at least one threshold"),
        ([0.0, 1.0], [0.5], True, "^y_thresholds: expected the 1-D shape"),
    ],
)
def test_isotonic_loaded_state_is_validated(x, y, fitted, match):
    state = {
        "x_thresholds": torch.tensor(x, dtype=torch.float64),
        "y_thresholds": torch.tensor(y, dtype=torch.float64),
        "fitted": torch.tensor(fitted),
    }
    with pytest.raises(ValueError, match=match):
        IsotonicCalibrator().load_state_dict(state)


# ----------------------------------------------------------------------------- separation
def _separated(n=400, c=4, margin=2.0, seed=0):
    """Every target is the row maximum by at least ``margin``: the old solver stopped at a
    finite T (its gradient underflowed below grad_tol) and called it converged."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (n,), generator=g)
    z[torch.arange(n), y] = z.amax(1) + margin
    return z, y


@pytest.mark.parametrize("method", [None, "newton", "lbfgs"])
def test_separated_set_detected_warned_and_bounded(method):
    z, y = _separated()
    for logits, target in ((z, y), (z[:, 0] - z[:, 1], (z[:, 0] > z[:, 1]).double())):
        with pytest.warns(CalibrationWarning, match="perfectly separated"):
            res = TemperatureScaler(method=method).fit(logits, target)
        assert not res.converged and res.temperature == pytest.approx(1e-3, rel=1e-12)
        assert res.nll_after < res.nll_before and res.passes <= 3  # detected, not searched
    # a single sample on the wrong side: a finite optimum, converged, no warning
    z2, y2 = z.clone(), y.clone()
    y2[0] = (y2[0] + 1) % 4
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        res = TemperatureScaler(method=method).fit(z2, y2)
    assert res.converged and 1e-3 < res.temperature < 1.0


def test_separated_set_streamed_and_per_group():
    z, y = _separated()
    with pytest.warns(CalibrationWarning, match="perfectly separated"):
        res = TemperatureScaler().fit_stream(list(zip(z.split(100), y.split(100))))
    assert not res.converged and res.temperature == pytest.approx(1e-3, rel=1e-12)
    groups = torch.arange(400) % 2
    with pytest.warns(CalibrationWarning, match="perfectly separated"):
        res = GroupTemperatureScaler(2, shrinkage=0.0).fit(z, y, groups)
    assert not res.converged and all(t == pytest.approx(1e-3) for t in res.temperatures)


# ----------------------------------------------------------------------------- (B, 1) logits
def test_b1_binary_logits_accepted_everywhere():
    _, _, s, b = _data(seed=3)
    s1 = s.unsqueeze(1)
    groups = torch.arange(s.shape[0]) % 2
    for make, extra in (
        (TemperatureScaler, ()),
        (PlattScaler, ()),
        (IsotonicCalibrator, ()),
        (lambda: GroupTemperatureScaler(2), (groups,)),
    ):
        ref, col = make(), make()
        r_ref = ref.fit(s, b, *extra)
        for target in (b, b.unsqueeze(1)):
            r_col = col.fit(s1, target, *extra)
            assert r_col.nll_after == r_ref.nll_after
        out = col(s1, *extra)
        assert out.shape == s1.shape and torch.equal(out.squeeze(1), ref(s, *extra))
    stream = TemperatureScaler().fit_stream([(s1[:300], b[:300]), (s1[300:], b[300:])])
    assert stream.temperature == TemperatureScaler().fit_stream([(s, b)]).temperature
    with pytest.raises(ValueError, match=r"^target: expected shape \(600,\)"):
        TemperatureScaler().fit(s, b.unsqueeze(1))  # (N,) logits: an (N, 1) target never broadcasts


# ----------------------------------------------------------------------------- invariants
def test_one_ulp_near_ties_pass_the_floating_point_invariants():
    """Scores one ulp apart may become a tie after ``/ T`` (weak monotonicity), never an
    inversion; the invariants check accepts that and rejects a swapped pair."""
    base = torch.tensor([-3.543827191505563, 0.7, 2.0, -1e-3], dtype=torch.float64)
    nxt = torch.nextafter(base, torch.full_like(base, math.inf))
    scores = torch.stack([base, nxt], 1).reshape(-1)  # pairs one ulp apart
    rows = torch.stack([base, nxt, base - 1.0], 1)  # top-1 near-ties in each row
    created = 0
    for t in (2.4776, 0.3, 3.0, 1.1, 7.0):
        scaler = TemperatureScaler()
        scaler.temperature = t
        for x in (scores, rows):
            c = check_monotone_map(x, scaler(x).detach())
            assert c.ok and c.strict_inversions == 0 and c.top1_kept and c.decisions_kept
            assert c.max_tie_gap_ulps <= 1
            created += c.ties_created
    assert created > 0  # the test does build ties that the division creates
    swapped = scores.clone()
    swapped[[0, 1]] = swapped[[1, 0]]  # a "scaler" that swaps two near-tied scores
    assert not check_monotone_map(scores, swapped).ok
    assert check_monotone_map(scores, swapped).strict_inversions == 1
