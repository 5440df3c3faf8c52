"""Issue 9 regressions for the calibration metrics: merge/DDP compatibility, probabilities
passed as logits, unnormalised probabilities, float64 states under dtype conversions, NLL of
-inf rows and soft targets, bootstrap for small N, streaming == one shot for float32 logits,
classwise L2 = RMS over classes, (B, 1) binary heads and ignore_index."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchcal.functional import (
    calibration_error,
    calibration_error_bootstrap,
    negative_log_likelihood,
)
from torchcal.functional.calibration.bootstrap import ece_bootstrap_from_stats
from torchcal.metrics import (
    BrierDecomposition,
    CalibrationError,
    ClasswiseCalibrationError,
    NegativeLogLikelihood,
    ReliabilityDiagram,
)


def _data(n=2000, c=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, c, generator=g, dtype=torch.float64) * 2).to(dtype)
    y = torch.randint(0, c, (n,), generator=g)
    return x, y


# ------------------------------------------------------------------ merge_state / config
@pytest.mark.parametrize(
    "a,b",
    [
        (lambda: CalibrationError(n_bins=15), lambda: CalibrationError(n_bins=10)),
        (lambda: CalibrationError(reading="binary"), lambda: CalibrationError()),
        (lambda: CalibrationError(input="probs"), lambda: CalibrationError()),
        (lambda: CalibrationError(norm="l2"), lambda: CalibrationError()),
        (lambda: CalibrationError(estimator="sweep"), lambda: CalibrationError(estimator="smooth")),
        (lambda: CalibrationError(num_groups=2), lambda: CalibrationError(num_groups=3)),
        (
            lambda: CalibrationError(reading="top_label", num_classes=5),
            lambda: CalibrationError(reading="classwise", num_classes=5),
        ),
        (
            lambda: ClasswiseCalibrationError(5, norm="l1"),
            lambda: ClasswiseCalibrationError(5, norm="max"),
        ),
        (
            lambda: ReliabilityDiagram(interval="wilson"),
            lambda: ReliabilityDiagram(interval="clopper_pearson"),
        ),
        (lambda: NegativeLogLikelihood(), lambda: NegativeLogLikelihood(input="probs")),
        (lambda: BrierDecomposition(), lambda: CalibrationError()),
    ],
)
def test_merge_state_rejects_other_configurations(a, b):
    m, o = a(), b()
    with pytest.raises(ValueError, match="^other"):
        m.merge_state(o)


def test_merge_state_same_configuration_equals_one_stream():
    x, y = _data()
    one, a, b = (CalibrationError(n_bins=10) for _ in range(3))
    one.update(x, y)
    a.update(x[:700], y[:700])
    b.update(x[700:], y[700:])
    a.merge_state(b)
    assert torch.equal(a.count, one.count)
    assert abs(float(a.compute()) - float(one.compute())) <= 1e-12


def test_merge_state_dict_checks_shapes_and_dtypes():
    m = CalibrationError(n_bins=15)
    other = CalibrationError(n_bins=10)
    with pytest.raises(ValueError, match="^other: state 'count'"):
        m.merge_state({k: getattr(other, k) for k in other._defaults})
    state = {k: getattr(m, k).clone() for k in m._defaults}
    state["sum_conf"] = state["sum_conf"].float()
    with pytest.raises(ValueError, match="^other: state 'sum_conf'"):
        m.merge_state(state)


# ------------------------------------------------------------------ probabilities as logits
@pytest.mark.parametrize(
    "factory",
    [
        lambda: CalibrationError(),
        lambda: CalibrationError(reading="top_label", num_classes=5),
        lambda: ClasswiseCalibrationError(5),
        lambda: ReliabilityDiagram(),
        lambda: BrierDecomposition(reading="classwise", num_classes=5),
        lambda: NegativeLogLikelihood(),
    ],
)
def test_probs_passed_as_logits_warn_once(factory):
    x, y = _data()
    p = x.softmax(1)
    m = factory()
    with pytest.warns(UserWarning, match="^preds: every row lies in \\[0, 1\\] and sums to 1"):
        m.update(p, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.update(p, y)  # one-time
        factory().update(x, y)  # real logits: silent


def test_probs_passed_as_logits_functional_warns_and_logits_do_not():
    x, y = _data()
    with pytest.warns(UserWarning, match="^preds: every row"):
        calibration_error(x.softmax(1), y)
    with pytest.warns(UserWarning, match="^preds: every row"):
        negative_log_likelihood(x.softmax(1), y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calibration_error(x, y)
        calibration_error(x.softmax(1), y, input="probs")
        # one row below 0 breaks the pattern
        q = x.softmax(1)
        q[0, 0] = -1e-3
        calibration_error(q, y)


def test_issue_numbers_probs_as_logits_differ_from_probs():
    # the issue's case: the wrong reading is far from the right one, hence the warning
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5000, 10, generator=g, dtype=torch.float64) * 3
    y = torch.distributions.Categorical(logits=logits).sample()
    right = float(calibration_error(logits.softmax(1), y, input="probs"))
    with pytest.warns(UserWarning):
        wrong = float(calibration_error(logits.softmax(1), y))
    assert right < 0.05 and wrong > 0.3


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-4), (torch.float32, 1e-4)])
def test_probs_rows_must_sum_to_one(dtype, tol):
    x, y = _data(200, 5)
    p = x.softmax(1).to(dtype)
    p_ok = p.clone()
    p_ok[3] = p_ok[3] * (1 + 0.5 * tol)
    calibration_error(p_ok, y, input="probs")  # inside the stated tolerance
    p_bad = p.clone()
    p_bad[3] = p_bad[3] * (1 + 3 * tol)
    for fn in (
        lambda q: calibration_error(q, y, input="probs"),
        lambda q: CalibrationError(input="probs").update(q, y),
        lambda q: negative_log_likelihood(q, y, input="probs"),
    ):
        with pytest.raises(ValueError, match="^preds: expected probabilities whose sum"):
            fn(p_bad)
    # the issue's case: independent sigmoids per class are not a distribution
    with pytest.raises(ValueError, match="^preds"):
        calibration_error(torch.sigmoid(x), y, input="probs")


# ------------------------------------------------------------------ dtype conversions
def _factories():
    return [
        CalibrationError(),
        CalibrationError(estimator="smooth", exact=True),
        CalibrationError(bootstrap=4),
        ClasswiseCalibrationError(5),
        ReliabilityDiagram(),
        BrierDecomposition(),
        NegativeLogLikelihood(num_groups=2),
    ]


def _dtypes(m):
    out = {}
    for k in m._defaults:
        v = getattr(m, k)
        out[k] = v.dtype if isinstance(v, torch.Tensor) else [t.dtype for t in v]
    return out


@pytest.mark.parametrize(
    "convert",
    [
        lambda m: m.to(torch.bfloat16),
        lambda m: m.to(torch.float16),
        lambda m: m.half(),
        lambda m: m.bfloat16(),
        lambda m: m.type(torch.float16),
        lambda m: m.float(),
        lambda m: m.set_dtype(torch.bfloat16),
        lambda m: torch.nn.ModuleDict({"m": m}).to(torch.bfloat16)["m"],
        lambda m: torch.nn.ModuleDict({"m": m}).half()["m"],
    ],
)
def test_states_stay_float64_under_dtype_conversions(convert):
    x, y = _data(50, 5)
    for m in _factories():
        if m.num_groups if hasattr(m, "num_groups") and m.num_groups else False:
            m.update(x, y, torch.zeros(50, dtype=torch.long))
        elif isinstance(m, BrierDecomposition):
            m.update(x[:, 0], (y == 0).long())
        else:
            m.update(x, y)
        before = _dtypes(m)
        value = m.compute()
        m._computed = None
        m = convert(m)
        assert _dtypes(m) == before, type(m).__name__
        again = m.compute()
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, again)


def test_lightning_bf16_true_keeps_float64_state():
    from lightning.pytorch.plugins.precision import HalfPrecision

    plugin = HalfPrecision("bf16-true")
    with plugin.module_init_context():
        module = torch.nn.Module()
        module.metric = CalibrationError()
        module.nll = NegativeLogLikelihood()
    module = plugin.convert_module(module)
    assert module.metric.sum_conf.dtype == torch.float64
    assert module.metric.count.dtype == torch.int64
    assert module.nll.nll_sum.dtype == torch.float64
    x, y = _data(100, 5, dtype=torch.bfloat16)
    module.metric.update(x, y)
    assert module.metric.sum_conf.dtype == torch.float64


# ------------------------------------------------------------------ NLL
def test_nll_all_neg_inf_row_raises():
    x = torch.tensor([[0.0, -float("inf")], [-float("inf"), -float("inf")]])
    y = torch.tensor([0, 1])
    with pytest.raises(
        ValueError, match="^preds: expected at least one finite score per row, row 1"
    ):
        negative_log_likelihood(x, y)
    with pytest.raises(ValueError, match="^preds"):
        NegativeLogLikelihood().update(x, y)
    # a masked (not true) class stays allowed; a masked true class is inf, not NaN
    assert float(negative_log_likelihood(x[:1], y[:1])) == 0.0
    assert float(negative_log_likelihood(x[:1], torch.tensor([1]))) == float("inf")


def test_nll_float_one_hot_target_is_cross_entropy():
    x, y = _data(300, 4)
    one_hot = F.one_hot(y, 4).double()
    ref = F.cross_entropy(x, one_hot)
    assert abs(float(negative_log_likelihood(x, one_hot)) - float(ref)) <= 1e-12
    assert abs(float(negative_log_likelihood(x, y)) - float(ref)) <= 1e-12
    soft = torch.softmax(torch.randn(300, 4, dtype=torch.float64), 1)
    assert abs(float(negative_log_likelihood(x, soft)) - float(F.cross_entropy(x, soft))) <= 1e-12
    # independent sigmoids only on request
    ml = negative_log_likelihood(x, one_hot, multilabel=True)
    assert abs(float(ml) - float(F.binary_cross_entropy_with_logits(x, one_hot))) <= 1e-12
    with pytest.raises(ValueError, match="^target"):
        negative_log_likelihood(x, F.one_hot(y, 4))  # integer one-hot is ambiguous


def test_nll_ignore_index_and_binary_head():
    x, y = _data(300, 4)
    y2 = y.clone()
    y2[::3] = -100
    ref = F.cross_entropy(x, y2, ignore_index=-100)
    got = negative_log_likelihood(x, y2, ignore_index=-100)
    assert abs(float(got) - float(ref)) <= 1e-12
    m = NegativeLogLikelihood(ignore_index=-100)
    m.update(x[:100], y2[:100])
    m.update(x[100:], y2[100:])
    assert abs(float(m.compute()) - float(ref)) <= 1e-12
    z = x[:, :1]
    t = (y % 2).double()
    ref_b = F.binary_cross_entropy_with_logits(z[:, 0], t)
    assert abs(float(negative_log_likelihood(z, t)) - float(ref_b)) <= 1e-12
    assert abs(float(negative_log_likelihood(z, t[:, None])) - float(ref_b)) <= 1e-12


# ------------------------------------------------------------------ bootstrap
def test_bootstrap_small_n_never_nan_and_too_small_raises():
    for n in (2, 3, 5):
        p = torch.linspace(0.1, 0.9, n, dtype=torch.float64)
        y = torch.arange(n) % 2
        for seed in range(20):
            ece, lo, hi = calibration_error_bootstrap(
                p, y, reading="binary", input="probs", replicates=20, seed=seed
            )
            assert torch.isfinite(lo) and torch.isfinite(hi) and lo <= hi
    with pytest.raises(ValueError, match="^preds: a bootstrap interval needs at least 2"):
        calibration_error_bootstrap(
            torch.tensor([0.3]), torch.tensor([1]), reading="binary", input="probs"
        )
    m = CalibrationError(reading="binary", input="probs", bootstrap=10)
    m.update(torch.tensor([0.3]), torch.tensor([1]))
    with pytest.raises(ValueError, match="^preds: a bootstrap interval"):
        m.compute_interval()


def test_bootstrap_drops_empty_replicates_exactly():
    wn = torch.tensor([[1.0, 0.0], [0.0, 0.0], [2.0, 0.0]], dtype=torch.float64)
    wc = torch.tensor([[0.5, 0.0], [0.0, 0.0], [1.2, 0.0]], dtype=torch.float64)
    wo = torch.tensor([[1.0, 0.0], [0.0, 0.0], [2.0, 0.0]], dtype=torch.float64)
    lo, hi = ece_bootstrap_from_stats(wn, wc, wo, level=0.5)
    # the empty replicate is dropped: ECEs 0.5 and 0.4 remain
    ref = np.quantile([0.5, 0.4], [0.25, 0.75])
    assert abs(float(lo) - ref[0]) <= 1e-12 and abs(float(hi) - ref[1]) <= 1e-12
    with pytest.raises(ValueError, match="^replicates"):
        ece_bootstrap_from_stats(wn[1:2], wc[1:2], wo[1:2])


# ------------------------------------------------------------------ streaming == one shot
def test_binary_float32_logits_streamed_in_odd_chunks_equal_one_shot():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(100_003, generator=g) * 4  # float32
    y = (torch.rand(100_003, generator=g) < torch.sigmoid(z)).long()
    one = CalibrationError(reading="binary", n_bins=15)
    one.update(z, y)
    many = CalibrationError(reading="binary", n_bins=15)
    for zz, yy in zip(z.split(997), y.split(997)):
        many.update(zz, yy)
    assert torch.equal(one.count, many.count)
    for name in ("sum_conf", "sum_conf2", "sum_conf_acc"):
        a, b = getattr(one, name), getattr(many, name)
        assert torch.allclose(a, b, rtol=1e-15, atol=0), name
    assert abs(float(one.compute()) - float(many.compute())) <= 1e-15


def test_multiclass_float32_logits_streamed_equal_one_shot():
    x, y = _data(20_011, 7, dtype=torch.float32)
    for reading in ("confidence", "classwise"):
        kw = {"num_classes": 7} if reading == "classwise" else {}
        one, many = CalibrationError(reading=reading, **kw), CalibrationError(reading=reading, **kw)
        one.update(x, y)
        for xx, yy in zip(x.split(333), y.split(333)):
            many.update(xx, yy)
        assert torch.equal(one.count, many.count)
        assert torch.allclose(one.sum_conf, many.sum_conf, rtol=1e-13, atol=0)


# ------------------------------------------------------------------ classwise L2 (Kumar)
def _np_binary_sq(p, hit, B):
    idx = np.minimum(np.floor(p * B).astype(int), B - 1)
    total = 0.0
    for b in range(B):
        m = idx == b
        if m.any():
            total += m.mean() * (p[m].mean() - hit[m].mean()) ** 2
    return total


def test_classwise_l2_metric_is_root_mean_square_over_classes():
    x, y = _data(3000, 4, seed=3)
    p = x.softmax(1).numpy()
    per = np.array([_np_binary_sq(p[:, k], (y.numpy() == k).astype(float), 15) for k in range(4)])
    ref = np.sqrt(per.mean())  # verified_calibration: mean_k ce_k^2, then the root
    m = ClasswiseCalibrationError(4, norm="l2")
    m.update(x, y)
    assert abs(float(m.compute()) - ref) <= 1e-12
    assert abs(float(np.sqrt(per).mean()) - ref) > 1e-5  # the old definition differs
    deb = ClasswiseCalibrationError(4, norm="l2", estimator="debiased")
    deb.update(x, y)
    per_deb = deb.compute_per_class().numpy()
    assert abs(float(deb.compute()) - np.sqrt(np.mean(per_deb**2))) <= 1e-12


# ------------------------------------------------------------------ (B, 1) and ignore_index
def test_binary_head_b1_is_accepted_as_b():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(500, 1, generator=g, dtype=torch.float64)
    y = (torch.rand(500, generator=g) < 0.5).long()
    ref = calibration_error(z[:, 0], y, reading="binary")
    assert float(calibration_error(z, y, reading="binary")) == float(ref)
    assert float(calibration_error(z, y[:, None], reading="binary")) == float(ref)
    with pytest.raises(ValueError, match="^target"):
        calibration_error(z[:, 0], y[:, None], reading="binary")
    with pytest.raises(ValueError, match="^preds: expected C >= 2"):
        calibration_error(z, y)  # (B, 1) under the multiclass reading


@pytest.mark.parametrize("reading", ["confidence", "top_label", "classwise", "binary"])
def test_ignore_index_equals_dropping_the_rows(reading):
    x, y = _data(1000, 4, seed=5)
    groups = torch.arange(1000) % 3
    if reading == "binary":
        x, y = x[:, 0], (y % 2)
    y_ign = y.clone()
    y_ign[::4] = 255
    keep = y_ign != 255
    kw = {"num_classes": 4} if reading in ("top_label", "classwise") else {}
    got = calibration_error(
        x, y_ign, reading=reading, ignore_index=255, groups=groups, num_groups=3, **kw
    )
    ref = calibration_error(
        x[keep], y[keep], reading=reading, groups=groups[keep], num_groups=3, **kw
    )
    assert float(got.pooled) == float(ref.pooled)
    assert torch.equal(got.counts, ref.counts)
    m = CalibrationError(reading=reading, ignore_index=255, **kw)
    m.update(x[:10], torch.full_like(y[:10], 255))  # an entirely ignored batch is fine
    m.update(x, y_ign)
    assert abs(float(m.compute()) - float(ref.pooled)) <= 1e-12
    with pytest.raises(ValueError, match="^target: every target equals ignore_index"):
        calibration_error(x, torch.full_like(y, 255), reading=reading, ignore_index=255, **kw)
