"""Hostile inputs for every public entry point of the calibration metrics (functional and
Metric): each case raises a ValueError naming the argument, warns, or returns the right
number against an independent reference -- never a plausible wrong number."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from torchcal.functional import (
    binned_statistics,
    brier_decomposition,
    calibration_error,
    calibration_error_bootstrap,
    negative_log_likelihood,
    reliability_table,
)
from torchcal.functional.calibration.nll import nll_items
from torchcal.metrics import (
    BrierDecomposition,
    CalibrationError,
    ClasswiseCalibrationError,
    NegativeLogLikelihood,
    ReliabilityDiagram,
)

NAN, INF = float("nan"), float("inf")


def _metric(cls, **kw):
    def run(preds, target, **extra):
        m = cls(**kw, **extra)
        m.update(preds, target)
        return m.compute()

    return run


# multiclass entry points: fn(preds (N, C) logits, target (N,) indices, input=...)
MULTICLASS = {
    "calibration_error": lambda p, t, **k: calibration_error(p, t, **k),
    "calibration_error_top_label": lambda p, t, **k: calibration_error(
        p, t, reading="top_label", **k
    ),
    "calibration_error_classwise_l2": lambda p, t, **k: calibration_error(
        p, t, reading="classwise", norm="l2", **k
    ),
    "reliability_table": lambda p, t, **k: reliability_table(p, t, **k),
    "brier_decomposition": lambda p, t, **k: brier_decomposition(p, t, reading="classwise", **k),
    "calibration_error_bootstrap": lambda p, t, **k: calibration_error_bootstrap(
        p, t, replicates=10, **k
    ),
    "binned_statistics": lambda p, t, **k: binned_statistics(p, t, **k),
    "negative_log_likelihood": lambda p, t, **k: negative_log_likelihood(p, t, **k),
    "nll_items": lambda p, t, **k: nll_items(p, t, **k),
    "CalibrationError": _metric(CalibrationError),
    "CalibrationError_sweep_exact": _metric(CalibrationError, estimator="sweep", exact=True),
    "ClasswiseCalibrationError": lambda p, t, **k: _metric(
        ClasswiseCalibrationError, num_classes=p.shape[1] if p.dim() > 1 else 2
    )(p, t, **k),
    "ReliabilityDiagram": _metric(ReliabilityDiagram),
    "BrierDecomposition": lambda p, t, **k: _metric(
        BrierDecomposition, reading="classwise", num_classes=p.shape[1] if p.dim() > 1 else 2
    )(p, t, **k),
    "NegativeLogLikelihood": _metric(NegativeLogLikelihood),
}
NAMES = sorted(MULTICLASS)


def _is_nll(name: str) -> bool:
    return "likelihood" in name.lower() or name.startswith("nll")


def _ok():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 4, (64,), generator=g)
    return x, y


def _cases():
    x, y = _ok()
    nan = x.clone()
    nan[5, 2] = NAN
    pinf = x.clone()
    pinf[7, 1] = INF
    allneg = x.clone()
    allneg[3] = -INF
    return {
        "nan": (nan, y, {}, "^preds"),
        "+inf": (pinf, y, {}, "^preds"),
        "row of -inf": (allneg, y, {}, "^preds"),
        "empty": (x[:0], y[:0], {}, "^preds"),
        "integer preds": (x.long(), y, {}, "^preds"),
        "(N, 1) target": (x, y[:, None], {}, "^target"),
        "target out of range": (x, torch.where(y == 0, 4, y), {}, "^target"),
        "float one-hot target (calibration)": (x, F.one_hot(y, 4).double(), {}, "^target"),
        "probs nan": (x.softmax(1).masked_fill(x > 3, NAN), y, {"input": "probs"}, "^preds"),
        "probs > 1": (x.softmax(1) * 1.5, y, {"input": "probs"}, "^preds"),
        "unnormalised probs": (torch.sigmoid(x), y, {"input": "probs"}, "^preds"),
        "wrong input option": (x, y, {"input": "logit"}, "^input"),
    }


CASES = _cases()


# NLL reads a float (N, C) target as class probabilities (tested below), so it is no bad input there
_PAIRS = [
    (n, c)
    for n in NAMES
    for c in sorted(CASES)
    if not (c.startswith("float one-hot") and _is_nll(n))
]


@pytest.mark.parametrize(("name", "case"), _PAIRS)
def test_bad_input_raises_naming_the_argument(name, case):
    preds, target, kw, match = CASES[case]
    fn = MULTICLASS[name]
    with pytest.raises((ValueError, TypeError), match=match):
        fn(preds, target, **kw)


@pytest.mark.parametrize("name", NAMES)
def test_probs_as_logits_warn(name):
    x, y = _ok()
    with pytest.warns(UserWarning, match="^preds: every row lies in \\[0, 1\\]"):
        MULTICLASS[name](x.softmax(1), y)


@pytest.mark.parametrize("name", NAMES)
def test_single_sample(name):
    x, y = _ok()
    if "bootstrap" in name:
        with pytest.raises(ValueError, match="^preds: a bootstrap interval needs at least 2"):
            MULTICLASS[name](x[:1], y[:1])
        return
    out = MULTICLASS[name](x[:1], y[:1])
    ref_nll = float(F.cross_entropy(x[:1], y[:1]))
    if _is_nll(name):
        assert abs(float(out.reshape(-1)[0]) - ref_nll) <= 1e-12
    elif name in ("calibration_error", "CalibrationError", "CalibrationError_sweep_exact"):
        p = x[:1].softmax(1)
        hit = float(p.argmax(1) == y[:1])
        assert abs(float(out) - abs(float(p.max()) - hit)) <= 1e-12


@pytest.mark.parametrize(
    "name",
    [
        "calibration_error",
        "CalibrationError",
        "ReliabilityDiagram",
        "negative_log_likelihood",
        "NegativeLogLikelihood",
    ],
)
def test_extreme_logits_give_the_right_number(name):
    # 1e30-scaled logits: softmax is one-hot; confidence 1, NLL 0 or huge, never NaN
    x, y = _ok()
    big = x * 1e30
    out = MULTICLASS[name](big, y)
    acc = float((big.argmax(1) == y).double().mean())
    if _is_nll(name):
        ref = float(F.cross_entropy(big, y))
        assert math.isfinite(float(out)) and abs(float(out) - ref) <= 1e-12 * ref
    elif name == "ReliabilityDiagram":
        assert out.count[-1] == 64 and abs(float(out.acc[-1]) - acc) <= 1e-12
    else:
        assert abs(float(out) - (1 - acc)) <= 1e-12


def test_float_one_hot_target_for_nll_is_cross_entropy():
    x, y = _ok()
    oh = F.one_hot(y, 4).double()
    for fn in (MULTICLASS["negative_log_likelihood"], MULTICLASS["NegativeLogLikelihood"]):
        assert abs(float(fn(x, oh)) - float(F.cross_entropy(x, y))) <= 1e-12


# ------------------------------------------------------------------ binary reading
BINARY = {
    "calibration_error": lambda p, t, **k: calibration_error(p, t, reading="binary", **k),
    "reliability_table": lambda p, t, **k: reliability_table(p, t, reading="binary", **k),
    "brier_decomposition": lambda p, t, **k: brier_decomposition(p, t, **k),
    "CalibrationError": _metric(CalibrationError, reading="binary"),
    "BrierDecomposition": _metric(BrierDecomposition),
    "negative_log_likelihood": lambda p, t, **k: negative_log_likelihood(p, t, **k),
}


def _binary():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(64, generator=g, dtype=torch.float64)
    return z, (torch.rand(64, generator=g) < torch.sigmoid(z)).long()


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize(
    "case", ["nan", "-inf", "(N,) preds, (N, 1) target", "label 2", "probs outside", "empty"]
)
def test_binary_bad_input_raises(name, case):
    z, y = _binary()
    kw: dict = {}
    if case == "nan":
        z = z.clone()
        z[3] = NAN
        match = "^preds"
    elif case == "-inf":
        z = z.clone()
        z[3] = -INF
        match = "^preds"
    elif case == "(N,) preds, (N, 1) target":
        y = y[:, None]
        match = "^target"
    elif case == "label 2":
        y = y.clone()
        y[0] = 2
        match = "^target"
    elif case == "probs outside":
        z, kw, match = torch.sigmoid(z) + 0.5, {"input": "probs"}, "^preds"
    else:
        z, y, match = z[:0], y[:0], "^preds"
    with pytest.raises(ValueError, match=match):
        BINARY[name](z, y, **kw)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_head_b1_equals_b(name):
    z, y = _binary()
    a, b = BINARY[name](z[:, None], y), BINARY[name](z, y)
    if isinstance(a, dict):
        a, b = a["brier"], b["brier"]
    if hasattr(a, "count") and not isinstance(a, torch.Tensor):
        assert torch.equal(a.count, b.count)
        assert torch.allclose(a.conf, b.conf, rtol=0, atol=0, equal_nan=True)
        return
    assert float(a) == float(b)


def test_binary_extreme_logits_right_number():
    z, y = _binary()
    big = z * 1e30  # sigmoid is 0/1: ECE = error rate
    err = float(((big > 0).long() != y).double().mean())
    assert abs(float(BINARY["calibration_error"](big, y)) - err) <= 1e-12
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BINARY["CalibrationError"](big, y)
