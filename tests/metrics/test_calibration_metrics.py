"""torchcal.metrics: streaming == one shot == functional, state size, groups, errors, plots."""

from __future__ import annotations

import math

import pytest
import torch

from torchcal import GroupedResult, ReliabilityTable
from torchcal.functional import (
    brier_decomposition,
    calibration_error,
    negative_log_likelihood,
    reliability_table,
)
from torchcal.metrics import (
    BrierDecomposition,
    CalibrationError,
    ClasswiseCalibrationError,
    NegativeLogLikelihood,
    ReliabilityDiagram,
)


def data(n: int = 100_000, c: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, generator=g, dtype=torch.float64) * 2
    target = torch.distributions.Categorical(logits=logits * 0.6).sample()
    groups = torch.randint(0, 3, (n,), generator=g)
    return logits, target, groups


STATE_NAMES = ("count", "sum_conf", "sum_acc", "sum_conf2", "sum_conf_acc", "group_count")


def assert_same_states(a, b, names, tol=1e-12):
    for name in names:
        x, y = getattr(a, name), getattr(b, name)
        if x.dtype == torch.int64:
            assert torch.equal(x, y), name
        else:
            assert torch.allclose(x, y, rtol=tol, atol=tol), name


@pytest.mark.parametrize(
    "factory,extra",
    [
        (lambda: CalibrationError(n_bins=15), STATE_NAMES),
        (
            lambda: CalibrationError(n_bins=10, estimator="equal_mass"),
            STATE_NAMES + ("fine_count", "fine_sum_conf", "fine_sum_acc"),
        ),
        (lambda: CalibrationError(reading="top_label", num_classes=5, num_groups=3), STATE_NAMES),
        (lambda: ClasswiseCalibrationError(num_classes=5, num_groups=3), STATE_NAMES),
        (lambda: ReliabilityDiagram(num_groups=3), STATE_NAMES),
        (lambda: BrierDecomposition(reading="classwise", num_classes=5), STATE_NAMES),
        (lambda: NegativeLogLikelihood(num_groups=3), ("nll_sum", "count")),
    ],
)
def test_streaming_100_updates_equal_one_update(factory, extra):
    logits, target, groups = data()
    one, many = factory(), factory()
    grouped = getattr(one, "num_groups", None) is not None
    one.update(logits, target, groups if grouped else None)
    for x, y, g in zip(logits.split(1000), target.split(1000), groups.split(1000)):
        many.update(x, y, g if grouped else None)
    assert_same_states(one, many, extra)
    a, b = one.compute(), many.compute()
    if isinstance(a, GroupedResult):
        a, b = a.pooled, b.pooled
    if isinstance(a, ReliabilityTable):
        assert torch.equal(a.count, b.count)
        assert torch.allclose(a.acc, b.acc, rtol=0, atol=1e-12, equal_nan=True)
    elif isinstance(a, dict):
        for k in a:
            assert abs(float(a[k]) - float(b[k])) <= 1e-12
    else:
        assert abs(float(a) - float(b)) <= 1e-12


def test_metrics_equal_functional_twins():
    logits, target, groups = data(20_000)
    for kw in (
        {},
        {"norm": "l2"},
        {"norm": "max"},
        {"estimator": "debiased", "norm": "l2"},
        {"estimator": "equal_mass"},
        {"estimator": "sweep"},
        {"estimator": "smooth"},
        {"estimator": "smooth", "exact": True},
        {"estimator": "equal_mass", "exact": True},
    ):
        m = CalibrationError(**kw)
        for x, y in zip(logits.split(7000), target.split(7000)):
            m.update(x, y)
        assert abs(float(m.compute()) - float(calibration_error(logits, target, **kw))) <= 1e-12
    m = CalibrationError(reading="classwise", num_classes=5, num_groups=3)
    m.update(logits, target, groups)
    res = m.compute()
    ref = calibration_error(logits, target, reading="classwise", groups=groups, num_groups=3)
    assert torch.allclose(res.per_group, ref.per_group, rtol=0, atol=1e-15)
    assert torch.equal(res.counts, ref.counts)
    cw = ClasswiseCalibrationError(num_classes=5)
    cw.update(logits, target)
    assert abs(float(cw.compute()) - float(res.pooled)) <= 1e-15
    per = cw.compute_per_class()
    assert abs(float(per.mean()) - float(res.pooled)) <= 1e-15
    rd = ReliabilityDiagram(interval="clopper_pearson", level=0.9)
    rd.update(logits, target)
    t = reliability_table(logits, target, interval="clopper_pearson", level=0.9)
    assert torch.allclose(rd.compute().ci_low, t.ci_low, rtol=0, atol=0, equal_nan=True)
    bd = BrierDecomposition(reading="top_label", num_classes=5)
    bd.update(logits, target)
    d = brier_decomposition(logits, target, reading="top_label")
    assert all(abs(float(bd.compute()[k]) - float(d[k])) <= 1e-15 for k in d)
    nll = NegativeLogLikelihood()
    nll.update(logits, target)
    assert abs(float(nll.compute()) - float(negative_log_likelihood(logits, target))) <= 1e-12


def test_state_is_small_and_independent_of_n():
    def nbytes(m):
        return sum(getattr(m, k).numel() * getattr(m, k).element_size() for k in m._defaults)

    sizes = []
    for n in (100, 10_000):
        logits, target, _ = data(n)
        m = CalibrationError(n_bins=15)
        m.update(logits, target)
        sizes.append(nbytes(m))
    assert sizes[0] == sizes[1] <= 1024
    cw = ClasswiseCalibrationError(num_classes=100, n_bins=15)
    assert nbytes(cw) == 100 * 15 * 8 * 5 + 8


def test_exact_keeps_samples_only_for_the_estimators_that_need_them():
    logits, target, _ = data(500)
    binned = CalibrationError(exact=True)  # binned needs no samples: none are kept
    binned.update(logits, target)
    assert not any(k.startswith("sample_") for k in binned._defaults)
    assert abs(float(binned.compute()) - float(calibration_error(logits, target))) <= 1e-15
    top = CalibrationError(reading="top_label", num_classes=5, exact=True)
    top.update(logits, target)  # used to raise: samples are kept for one slot only
    assert (
        abs(float(top.compute()) - float(calibration_error(logits, target, reading="top_label")))
        <= 1e-15
    )
    smooth = CalibrationError(estimator="smooth", exact=True)
    smooth.update(logits, target)
    assert sum(t.numel() for t in smooth.sample_conf) == 500


def test_merge_state_is_addition():
    logits, target, _ = data(5000)
    a, b, both = CalibrationError(), CalibrationError(), CalibrationError()
    a.update(logits[:2000], target[:2000])
    b.update(logits[2000:], target[2000:])
    both.update(logits, target)
    a.merge_state(b)
    assert_same_states(a, both, STATE_NAMES)


def test_grouped_compute_results():
    logits, target, groups = data(9000)
    m = CalibrationError(num_groups=4)
    m.update(logits, target, groups)
    res = m.compute()
    assert isinstance(res, GroupedResult)
    assert res.per_group.shape == (4,) and math.isnan(float(res.per_group[3]))
    for g in range(3):
        sel = groups == g
        assert (
            abs(float(res.per_group[g]) - float(calibration_error(logits[sel], target[sel])))
            <= 1e-15
        )
    assert res.worst_group() in (0, 1, 2)
    rd = ReliabilityDiagram(num_groups=4)
    rd.update(logits, target, groups)
    tables = rd.compute()
    assert tables.per_group[3] is None and tables.per_group[1].n == int((groups == 1).sum())
    bd = BrierDecomposition(reading="confidence", num_groups=4)
    bd.update(logits, target, groups)
    assert bd.compute().per_group["brier"].shape == (4,)
    nll = NegativeLogLikelihood(num_groups=4)
    nll.update(logits, target, groups)
    r = nll.compute()
    sel = groups == 2
    assert (
        abs(float(r.per_group[2]) - float(negative_log_likelihood(logits[sel], target[sel])))
        <= 1e-12
    )


def test_bootstrap_interval_metric():
    logits, target, _ = data(3000)
    m = CalibrationError(n_bins=10, bootstrap=50, seed=7)
    for x, y in zip(logits.split(1000), target.split(1000)):
        m.update(x, y)
    lo, hi = m.compute_interval()
    ece = m.compute()
    assert float(lo) < float(ece) < float(hi)
    again = CalibrationError(n_bins=10, bootstrap=50, seed=7)
    for x, y in zip(logits.split(1000), target.split(1000)):
        again.update(x, y)
    assert again.compute_interval() == (lo, hi)  # same seed: identical rerun
    m.reset()
    for x, y in zip(logits.split(1000), target.split(1000)):
        m.update(x, y)
    assert m.compute_interval() != (lo, hi)  # the generator moves on (forward() resets)
    # forward() = per-batch reset + update: every batch must still get fresh weights
    f = CalibrationError(n_bins=10, bootstrap=50, seed=7)
    for x, y in zip(logits.split(1000), target.split(1000)):
        f(x, y)
    assert torch.allclose(f.boot_n, again.boot_n) and f.compute_interval() == (lo, hi)
    with pytest.raises(ValueError, match="bootstrap"):
        CalibrationError().compute_interval()


@pytest.mark.filterwarnings("ignore:The ``compute`` method")
def test_metric_errors():
    logits, target, groups = data(10)
    with pytest.raises(RuntimeError, match="no samples"):
        CalibrationError().compute()
    with pytest.raises(RuntimeError, match="no samples"):
        NegativeLogLikelihood().compute()
    with pytest.raises(RuntimeError, match="no samples"):
        ReliabilityDiagram().compute()
    with pytest.raises(ValueError, match="n_bins"):
        CalibrationError(n_bins=0)
    with pytest.raises(ValueError, match="num_classes"):
        CalibrationError(reading="classwise")
    with pytest.raises(ValueError, match="groups: pass num_groups"):
        CalibrationError().update(logits, target, groups)
    with pytest.raises(ValueError, match="groups: expected a group id"):
        CalibrationError(num_groups=3).update(logits, target)
    with pytest.raises(ValueError, match="estimator"):
        CalibrationError(reading="top_label", num_classes=5, estimator="smooth")
    with pytest.raises(ValueError, match="norm"):
        CalibrationError(estimator="debiased")
    m = CalibrationError()
    bad = logits.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(
        ValueError,
        match=r"preds: expected finite values, found NaN or \+Inf at "
        r"position \(3, 1\)",
    ):
        m.update(bad, target)
    with pytest.raises(ValueError, match="target: expected class indices"):
        m.update(logits, target + 5)
    with pytest.raises(ValueError, match="preds: expected probabilities"):
        CalibrationError(input="probs").update(logits, target)
    with pytest.raises(ValueError, match="target"):
        NegativeLogLikelihood().update(logits, target[:5])


def test_plots():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logits, target, _ = data(2000)
    rd = ReliabilityDiagram()
    rd.update(logits, target)
    fig, ax = rd.plot()
    assert ax.get_ylabel() == "accuracy" and ax.figure is fig
    m = CalibrationError()
    m.update(logits, target)
    fig, _ = m.plot()
    bd = BrierDecomposition(reading="confidence")
    bd.update(logits, target)
    bd.plot()
    for m in (
        NegativeLogLikelihood(num_groups=3),
        ClasswiseCalibrationError(num_classes=5, num_groups=3),
    ):
        m.update(logits, target, torch.arange(2000) % 3)
        fig, ax = m.plot()  # the pooled value of the GroupedResult
        assert ax.figure is fig
    plt.close("all")
