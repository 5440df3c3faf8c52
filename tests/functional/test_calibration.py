"""Tests of torchcal.functional.calibration against independent references.

References: float64 numpy re-implementations written here from the papers, netcal's ECE,
relplot's binned ECE and smooth ECE, scipy.stats.binomtest intervals, and closed forms.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from torchcal import GroupedResult
from torchcal.functional import (
    binned_statistics,
    brier_decomposition,
    brier_decomposition_from_stats,
    calibration_error,
    calibration_error_bootstrap,
    calibration_error_from_stats,
    negative_log_likelihood,
    reliability_table,
    validation_enabled,
)
from torchcal.functional.calibration._rows import row_max
from torchcal.functional.calibration.adaptive import (
    equal_mass_calibration_error_from_samples,
    equal_mass_calibration_error_from_stats,
)
from torchcal.functional.calibration.binning import accumulate, bin_index
from torchcal.functional.calibration.intervals import clopper_pearson_interval, wilson_interval
from torchcal.functional.calibration.readings import prepare_inputs, prepare_rows, samples_from

# ----------------------------------------------------------------------------- helpers


def away_from_edges(
    x: np.ndarray, bins: tuple[int, ...] = (10, 15), tol: float = 1e-7
) -> np.ndarray:
    """Mask of values not within ``tol`` of any edge k/B (B in ``bins``).

    netcal bins with ``np.histogramdd`` on ``np.linspace`` edges and relplot with
    ``(f / (1 / B)).astype(int)``; torchcal with ``floor(f * B)`` in float64. They agree
    except within float rounding of an edge, so comparison data avoids the edges.
    """
    ok = np.ones(x.shape, dtype=bool)
    for B in bins:
        ok &= np.abs(x * B - np.round(x * B)) > tol * B
    return ok


def binary_data(n: int, seed: int, shape: str = "wave") -> tuple[np.ndarray, np.ndarray]:
    """Confidences in (0, 1) away from bin edges and Bernoulli outcomes whose true
    probability crosses the diagonal (so gaps change sign between bins)."""
    rng = np.random.default_rng(seed)
    f = rng.uniform(0, 1, 3 * n)
    f = f[away_from_edges(f, (10, 15, 20))][:n]
    q = np.clip(f + 0.15 * np.sin(2 * np.pi * f), 0, 1) if shape == "wave" else f**1.5
    y = (rng.uniform(0, 1, n) < q).astype(np.int64)
    return f, y


def np_binned(conf: np.ndarray, hit: np.ndarray, B: int):
    """Float64 numpy reference of the binned table (bin = min(floor(c B), B - 1))."""
    idx = np.minimum(np.floor(conf.astype(np.float64) * B), B - 1).astype(int)
    n = np.bincount(idx, minlength=B).astype(float)
    sc = np.bincount(idx, weights=conf, minlength=B)
    sy = np.bincount(idx, weights=hit.astype(float), minlength=B)
    return n, sc, sy


def np_ece(conf, hit, B, norm="l1"):
    n, sc, sy = np_binned(conf, hit, B)
    m = n > 0
    N = n.sum()
    gap = np.abs(sc[m] / n[m] - sy[m] / n[m])
    if norm == "l1":
        return float(np.sum(n[m] / N * gap))
    if norm == "l2":
        return float(np.sqrt(np.sum(n[m] / N * gap**2)))
    return float(gap.max())


def multiclass_data(n: int, c: int, seed: int, temp: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, generator=g, dtype=torch.float64) * temp
    # labels drawn from a sharper softmax than the model's: overconfident and not
    target = torch.distributions.Categorical(logits=logits * 0.7).sample()
    return logits, target


# ----------------------------------------------------------------------------- binning


GOLDEN = {  # bin of k/B rounded to the dtype, for k = 0..B (rule: min(floor(c*B), B-1))
    (torch.float16, 10): [0, 0, 1, 3, 3, 5, 6, 7, 7, 8, 9],
    (torch.float16, 15): [0, 0, 1, 2, 3, 4, 5, 6, 7, 9, 9, 11, 11, 13, 13, 14],
    (torch.bfloat16, 10): [0, 1, 2, 3, 4, 5, 6, 6, 8, 8, 9],
    (torch.bfloat16, 15): [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 14],
    (torch.float32, 10): [0, 1, 2, 3, 4, 5, 6, 6, 8, 8, 9],
    (torch.float32, 15): [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 14],
    (torch.float64, 10): [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9],
    (torch.float64, 15): [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 14],
}


@pytest.mark.parametrize("dtype,B", list(GOLDEN))
def test_golden_bin_edges(dtype, B):
    # e.g. fp32(0.7) = 0.69999998... < 7/10 goes to bin 6; fp16(0.1) = 0.09998 to bin 0
    x = torch.tensor([k / B for k in range(B + 1)], dtype=dtype)
    assert bin_index(x, B).tolist() == GOLDEN[(dtype, B)]
    # the same through the full pipeline: one sample per value, counts per bin
    s = binned_statistics(
        x, torch.ones(B + 1, dtype=torch.long), n_bins=B, reading="binary", input="probs"
    )
    assert s.count.reshape(-1).tolist() == np.bincount(GOLDEN[(dtype, B)], minlength=B).tolist()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_zero_first_one_last(dtype):
    for B in (1, 2, 7, 15, 100):
        x = torch.tensor([0.0, 1.0], dtype=dtype)
        assert bin_index(x, B).tolist() == [0, B - 1]


def test_rule_is_float64_floor_not_exact_rational():
    # fl(15/22) * 22 rounds to 14.999999999999998 in float64: the rule (floor of the float64
    # product) puts it in bin 14, documented rather than "fixed" so every peer can reproduce it
    x = torch.tensor([k / 22 for k in range(23)], dtype=torch.float64)
    expected = list(range(22)) + [21]
    expected[15] = 14
    assert bin_index(x, 22).tolist() == expected


# ----------------------------------------------------------------------------- equal-width ECE


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
@pytest.mark.parametrize("B", [1, 10, 15])
def test_binary_ece_matches_numpy(norm, B):
    f, y = binary_data(3000, seed=B)
    got = calibration_error(
        torch.tensor(f), torch.tensor(y), n_bins=B, norm=norm, reading="binary", input="probs"
    )
    assert got.dtype == torch.float64
    assert abs(float(got) - np_ece(f, y, B, norm)) <= 1e-12


def test_confidence_ece_matches_netcal_and_numpy():
    netcal = pytest.importorskip("netcal.metrics")
    logits, target = multiclass_data(4000, 5, seed=1)
    probs = torch.softmax(logits, 1)
    conf, pred = probs.max(1)
    keep = torch.from_numpy(away_from_edges(conf.numpy()))
    probs, logits, target = probs[keep], logits[keep], target[keep]
    conf, pred = probs.max(1)
    hit = (pred == target).numpy()
    ref = np_ece(conf.numpy(), hit, 15)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nc = netcal.ECE(bins=15).measure(probs.numpy(), target.numpy())
    got_p = calibration_error(probs, target, input="probs")
    got_l = calibration_error(logits, target, input="logits")
    assert abs(nc - ref) <= 1e-12
    assert abs(float(got_p) - ref) <= 1e-12
    assert abs(float(got_l) - ref) <= 1e-12


def test_binary_ece_matches_relplot_binned():
    relplot = pytest.importorskip("relplot")
    f, y = binary_data(5000, seed=3)
    # relplot bins with (f / (1 / B)).astype(int) and r = f - y; agrees away from edges
    ref = relplot.metrics.binnedECE(f, y, nbins=10)
    got = calibration_error(
        torch.tensor(f), torch.tensor(y), n_bins=10, reading="binary", input="probs"
    )
    assert abs(float(got) - ref) <= 1e-12


def test_ece_of_a_hand_worked_example():
    # bins of 10: 0.95 (right), 0.95 (wrong) in bin 9; 0.25 (wrong) in bin 2
    p = torch.tensor([0.95, 0.95, 0.25], dtype=torch.float64)
    y = torch.tensor([1, 0, 0])
    ece = calibration_error(p, y, n_bins=10, reading="binary", input="probs")
    assert abs(float(ece) - (2 / 3 * 0.45 + 1 / 3 * 0.25)) <= 1e-15
    mce = calibration_error(p, y, n_bins=10, norm="max", reading="binary", input="probs")
    assert abs(float(mce) - 0.45) <= 1e-15


def test_22_million_samples_exact():
    # 20M at confidence 0.95, all right; 2M at 0.35, all wrong (expanded views: no input
    # memory). ECE = (20e6 * 0.05 + 2e6 * 0.35) / 22e6 = 0.0772727... The 20M arrive in ONE
    # update, so a float32 accumulator (sum per sample, like torchmetrics) would stop counting
    # at 2^24 = 16.8M in the 0.95 bin and give 0.0376; float64 sums are exact.
    from torchcal.metrics import CalibrationError

    m = CalibrationError(n_bins=15, reading="binary", input="probs")
    big = 20_000_000
    m.update(
        torch.tensor(0.95, dtype=torch.float64).expand(big),
        torch.ones(1, dtype=torch.long).expand(big),
    )
    m.update(
        torch.tensor(0.35, dtype=torch.float64).expand(2_000_000),
        torch.zeros(1, dtype=torch.long).expand(2_000_000),
    )
    got = float(m.compute())
    expected = (20e6 * 0.05 + 2e6 * 0.35) / 22e6
    assert round(got, 4) == 0.0773
    assert abs(got - expected) <= 1e-12
    assert int(m.count.sum()) == 22_000_000
    assert float(m.sum_acc.sum()) == 20e6
    # these sums happen to be exact in float32 too (1.9e7 is even): check the state dtypes
    assert m.count.dtype == torch.int64
    assert all(
        getattr(m, k).dtype == torch.float64
        for k in ("sum_conf", "sum_acc", "sum_conf2", "sum_conf_acc")
    )
    # the failure mode this guards against: a float32 per-sample sum saturates at 2^24
    ones32 = torch.ones(1, dtype=torch.float32).expand(big)
    assert float(torch.bincount(torch.zeros(1, dtype=torch.long).expand(big), ones32)) < 17e6


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs_are_upcast(dtype):
    f, y = binary_data(2000, seed=5)
    x = torch.tensor(f).to(dtype)
    got = calibration_error(x, torch.tensor(y), reading="binary", input="probs")
    ref = np_ece(x.double().numpy(), y, 15)
    assert abs(float(got) - ref) <= 1e-12


# ----------------------------------------------------------------------------- readings


def test_top_label_matches_per_class_reference():
    logits, target = multiclass_data(3000, 4, seed=7)
    probs = torch.softmax(logits, 1)
    conf, pred = probs.max(1)
    hit = (pred == target).numpy()
    ref = 0.0
    for k in range(4):  # Gupta & Ramdas: ECE per predicted class, weighted by class counts
        m = (pred == k).numpy()
        if m.any():
            ref += m.mean() * np_ece(conf.numpy()[m], hit[m], 15)
    got = calibration_error(logits, target, reading="top_label")
    assert abs(float(got) - ref) <= 1e-12


def test_classwise_matches_per_class_reference():
    logits, target = multiclass_data(3000, 4, seed=8)
    probs = torch.softmax(logits, 1).numpy()
    ref = np.mean([np_ece(probs[:, k], (target.numpy() == k), 15) for k in range(4)])
    got = calibration_error(logits, target, reading="classwise")
    assert abs(float(got) - ref) <= 1e-12
    # l2: root of the mean over classes of the squared per-class RMSCE (Kumar et al. 2019,
    # verified_calibration's marginal error), not the mean of the per-class RMSCE
    per = np.array([np_ece(probs[:, k], (target.numpy() == k), 15, "l2") for k in range(4)])
    got2 = calibration_error(logits, target, reading="classwise", norm="l2")
    assert abs(float(got2) - np.sqrt(np.mean(per**2))) <= 1e-12
    assert abs(float(got2) - per.mean()) > 1e-6  # the two definitions differ here
    per_max = [np_ece(probs[:, k], (target.numpy() == k), 15, "max") for k in range(4)]
    got3 = calibration_error(logits, target, reading="classwise", norm="max")
    assert abs(float(got3) - max(per_max)) <= 1e-12


def test_spatial_inputs_are_flattened():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3, 5, 6, generator=g)
    target = torch.randint(0, 3, (4, 5, 6), generator=g)
    flat = logits.movedim(1, -1).reshape(-1, 3)
    assert float(calibration_error(logits, target)) == float(
        calibration_error(flat, target.reshape(-1))
    )


def test_argmax_ties_go_to_the_first_class():
    # an untrained model with all-zero logits predicts class 0 (torch.max): right only for 0
    logits = torch.zeros(4, 3)
    target = torch.tensor([0, 1, 2, 0])
    t = reliability_table(logits, target, n_bins=3)
    assert t.count.tolist() == [0, 4, 0]
    assert float(t.acc[1]) == 0.5


def test_correctness_with_tied_maxima_matches_torch_max():
    # the fast path runs torch.max only on rows that hit the maximum with sum exp >= 2
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-2, 3, (4000, 6), generator=g).float()  # many exact ties
    x[::7] = torch.randn(len(x[::7]), 6, generator=g) * 5  # and some untied rows
    t = torch.randint(0, 6, (4000,), generator=g)
    p = prepare_inputs(x, t)
    assert torch.equal(p.outcome, x.max(1).indices == t)
    assert torch.allclose(p.conf, torch.softmax(x, 1).max(1).values, rtol=1e-6, atol=0)
    # probabilities: the fused pass re-checks only rows whose maximum is <= (1 + tol) / 2
    probs = torch.softmax(x.double(), 1)
    q = prepare_inputs(probs, t, input="probs")
    assert torch.equal(q.outcome, probs.max(1).indices == t)
    assert torch.equal(q.conf, probs.max(1).values)


def test_neg_inf_logits_are_masks():
    logits = torch.tensor([[2.0, -math.inf, 0.0], [-math.inf, 1.0, -math.inf]])
    target = torch.tensor([0, 1])
    got = calibration_error(logits, target, n_bins=10)
    p = torch.softmax(logits, 1).max(1).values
    assert abs(float(got) - float((1 - p).mean())) <= 1e-7


# ----------------------------------------------------------------------------- debiased


def np_debiased(conf, hit, B):
    """Kumar, Liang & Ma (2019) `unbiased_l2_ce`: per bin (mean f - mean y)^2 minus
    ybar (1 - ybar) / (n_b - 1), bins with < 2 samples contribute 0, weight n_b / N,
    clip at 0, square root."""
    n, sc, sy = np_binned(conf, hit, B)
    total = 0.0
    for b in range(B):
        if n[b] < 2:
            continue
        ybar = sy[b] / n[b]
        est = (sc[b] / n[b] - ybar) ** 2 - ybar * (1 - ybar) / (n[b] - 1)
        total += n[b] / n.sum() * est
    return math.sqrt(max(total, 0.0))


def test_debiased_matches_reference():
    f, y = binary_data(500, seed=11)
    got = calibration_error(
        torch.tensor(f),
        torch.tensor(y),
        reading="binary",
        input="probs",
        estimator="debiased",
        norm="l2",
    )
    assert abs(float(got) - np_debiased(f, y, 15)) <= 1e-12
    # a perfectly calibrated model: debiased estimate is far below the plug-in RMSCE
    rng = np.random.default_rng(0)
    f = rng.uniform(0, 1, 2000)
    y = (rng.uniform(0, 1, 2000) < f).astype(int)
    plug = calibration_error(
        torch.tensor(f), torch.tensor(y), reading="binary", input="probs", norm="l2"
    )
    deb = calibration_error(
        torch.tensor(f),
        torch.tensor(y),
        reading="binary",
        input="probs",
        estimator="debiased",
        norm="l2",
    )
    assert float(deb) < float(plug)
    assert abs(float(deb) - np_debiased(f, y, 15)) <= 1e-12


# ----------------------------------------------------------------------------- Brier


@pytest.mark.parametrize("reading", ["binary", "confidence", "top_label", "classwise"])
def test_murphy_decomposition_is_exact(reading):
    if reading == "binary":
        f, y = binary_data(3000, seed=2)
        preds, target = torch.tensor(f), torch.tensor(y)
        direct = np.mean((f - y) ** 2)
        kw = {"input": "probs"}
    else:
        logits, target = multiclass_data(3000, 5, seed=4)
        probs = torch.softmax(logits, 1)
        preds = logits
        kw = {"input": "logits"}
        if reading == "classwise":
            direct = float(((probs - F.one_hot(target, 5).double()) ** 2).sum(1).mean())
        else:
            conf, pred = probs.max(1)
            direct = float(((conf - (pred == target).double()) ** 2).mean())
    d = brier_decomposition(preds, target, n_bins=10, reading=reading, **kw)
    total = (
        d["reliability"]
        - d["resolution"]
        + d["uncertainty"]
        + d["within_bin_variance"]
        - 2 * d["within_bin_covariance"]
    )
    assert abs(float(d["brier"]) - direct) <= 1e-12
    assert abs(float(total) - direct) <= 1e-12


def test_murphy_terms_match_direct_computation():
    f, y = binary_data(2000, seed=9)
    B = 10
    idx = np.minimum(np.floor(f * B), B - 1).astype(int)
    N = len(f)
    rel = res = wbv = wbc = 0.0
    ybar = y.mean()
    for b in np.unique(idx):
        m = idx == b
        fb, ob = f[m].mean(), y[m].mean()
        rel += m.sum() * (fb - ob) ** 2 / N
        res += m.sum() * (ob - ybar) ** 2 / N
        wbv += np.sum((f[m] - fb) ** 2) / N
        wbc += np.sum((f[m] - fb) * (y[m] - ob)) / N
    d = brier_decomposition(torch.tensor(f), torch.tensor(y), n_bins=B, input="probs")
    for key, ref in [
        ("reliability", rel),
        ("resolution", res),
        ("uncertainty", ybar * (1 - ybar)),
        ("within_bin_variance", wbv),
        ("within_bin_covariance", wbc),
    ]:
        assert abs(float(d[key]) - ref) <= 1e-12, key


# ----------------------------------------------------------------------------- intervals


@pytest.mark.parametrize("level", [0.8, 0.95, 0.99])
def test_intervals_match_scipy(level):
    stats = pytest.importorskip("scipy.stats")
    cases = [
        (0, 1),
        (1, 1),
        (0, 7),
        (7, 7),
        (3, 7),
        (1, 20),
        (19, 20),
        (500, 1000),
        (12345, 20000),
        (1, 2_000_000),
    ]
    k = torch.tensor([c[0] for c in cases], dtype=torch.float64)
    n = torch.tensor([c[1] for c in cases], dtype=torch.float64)
    wl, wh = wilson_interval(k, n, level)
    cl, ch = clopper_pearson_interval(k, n, level)
    for i, (kk, nn) in enumerate(cases):
        r = stats.binomtest(kk, nn).proportion_ci(confidence_level=level, method="wilson")
        assert abs(float(wl[i]) - r.low) <= 1e-12 and abs(float(wh[i]) - r.high) <= 1e-12
        r = stats.binomtest(kk, nn).proportion_ci(confidence_level=level, method="exact")
        assert abs(float(cl[i]) - r.low) <= 1e-10 and abs(float(ch[i]) - r.high) <= 1e-10


def test_seven_out_of_seven_certifies_about_065():
    t = reliability_table(
        torch.full((7,), 0.97, dtype=torch.float64),
        torch.ones(7).long(),
        n_bins=10,
        reading="binary",
        input="probs",
    )
    assert float(t.acc[9]) == 1.0
    assert round(float(t.ci_low[9]), 2) == 0.65 and float(t.ci_high[9]) == 1.0
    assert "[0.6457, 1.0000]" in t.to_text()


def test_wilson_bounds_contain_the_accuracy_exactly():
    # the closed form is 0 at k = 0 and 1 at k = n; float rounding used to land 1e-16 on the
    # wrong side (hi < 1 = acc at 10/10), a negative whisker that matplotlib rejects
    n = torch.arange(1, 301, dtype=torch.float64)
    k = torch.cat([torch.zeros(300), n, (n / 3).floor()])
    nn = torch.cat([n, n, n])
    lo, hi = wilson_interval(k, nn)
    assert bool((lo <= k / nn).all()) and bool((hi >= k / nn).all())
    assert bool((lo[:300] == 0).all()) and bool((hi[300:600] == 1).all())
    lo, hi = wilson_interval(torch.tensor([0.0]), torch.tensor([0.0]))
    assert math.isnan(float(lo)) and math.isnan(float(hi))


def test_reliability_table_fields_match_numpy():
    f, y = binary_data(1000, seed=12)
    t = reliability_table(
        torch.tensor(f),
        torch.tensor(y),
        n_bins=15,
        reading="binary",
        input="probs",
        interval="clopper_pearson",
        level=0.9,
    )
    n, sc, sy = np_binned(f, y, 15)
    assert t.count.tolist() == n.astype(int).tolist()
    m = n > 0
    np.testing.assert_allclose(t.conf.numpy()[m], sc[m] / n[m], rtol=0, atol=1e-15)
    np.testing.assert_allclose(t.acc.numpy()[m], sy[m] / n[m], rtol=0, atol=1e-15)
    np.testing.assert_allclose(t.lo.numpy(), np.arange(15) / 15, atol=0)
    assert t.interval == "clopper_pearson" and t.level == 0.9
    assert abs(t.ece - np_ece(f, y, 15)) <= 1e-12


def test_per_class_tables():
    logits, target = multiclass_data(500, 3, seed=13)
    t = reliability_table(logits, target, reading="classwise")
    assert t.per_class is not None and len(t.per_class) == 3
    assert t.count.sum() == 1500
    assert sum(int(pc.count.sum()) for pc in t.per_class) == 1500
    probs = torch.softmax(logits, 1)
    for k in range(3):  # each class table is the one-vs-rest binary table of that class
        ref = reliability_table(probs[:, k], (target == k).long(), reading="binary", input="probs")
        got = t.per_class[k]
        assert torch.equal(got.count, ref.count)
        for f in ("conf", "acc", "ci_low", "ci_high"):
            assert torch.allclose(
                getattr(got, f), getattr(ref, f), rtol=0, atol=1e-12, equal_nan=True
            ), f


@pytest.mark.parametrize("reading", ["top_label", "classwise"])
def test_table_ece_is_the_ece_of_its_reading(reading):
    # the table's rows pool the classes, but its ECE (and the text footer) is the reading's
    logits, target = multiclass_data(2000, 4, seed=14)
    t = reliability_table(logits, target, reading=reading)
    ref = float(calibration_error(logits, target, reading=reading))
    pooled_rows = float(calibration_error(logits, target, reading="confidence"))
    assert abs(t.ece - ref) <= 1e-12
    if reading == "top_label":
        assert abs(ref - pooled_rows) > 1e-3  # the check can tell the two apart
    assert t.to_text().splitlines()[-2].endswith(f"= {ref:.4f}")


# ----------------------------------------------------------------------------- fine histogram


def test_equal_mass_fine_histogram_close_to_sort():
    # the fine histogram splits a straddling sub-bin's outcomes in proportion to its count:
    # a sampling error ~ 1 / sqrt(4096 N) per boundary where the gap changes sign
    f, y = binary_data(1_000_000, seed=21)
    p, t = torch.tensor(f), torch.tensor(y)
    prep = prepare_inputs(p, t, reading="binary", input="probs")
    fine = accumulate(prep, 4096).pooled()
    samples = samples_from(prep)
    for B in (5, 10, 15, 20):
        a = equal_mass_calibration_error_from_stats(fine, B)
        b = equal_mass_calibration_error_from_samples(samples, B)
        assert abs(float(a) - float(b)) <= 3e-5, B


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
def test_equal_mass_fine_histogram_splits_straddling_bins_in_proportion(norm):
    # reference: every sample replaced by its fine bin's mean confidence and mean outcome
    # ("spread evenly over the bin"), then an exact sort-based split (N divisible by B);
    # with only 64 fine bins nearly every boundary straddles one, so the rule matters
    f, y = binary_data(3000, seed=24)
    fine = binned_statistics(
        torch.tensor(f), torch.tensor(y), n_bins=64, reading="binary", input="probs"
    ).pooled()
    idx = np.minimum(np.floor(f * 64), 63).astype(int)
    n = np.bincount(idx, minlength=64)
    fv = (np.bincount(idx, weights=f, minlength=64) / np.maximum(n, 1))[idx]
    yv = (np.bincount(idx, weights=y, minlength=64) / np.maximum(n, 1))[idx]
    order = np.argsort(fv, kind="stable")
    for B in (5, 12, 15):
        gaps = np.array([abs(fv[q].mean() - yv[q].mean()) for q in np.array_split(order, B)])
        ref = {"l1": gaps.mean(), "l2": np.sqrt((gaps**2).mean()), "max": gaps.max()}[norm]
        got = equal_mass_calibration_error_from_stats(fine, B, norm=norm)
        assert abs(float(got) - ref) <= 1e-12, B


def test_equal_mass_exact_matches_numpy_sort():
    f, y = binary_data(3000, seed=22)  # 3000 divisible by every B below: integer ranks
    for B in (5, 10, 15):
        order = np.argsort(f, kind="stable")
        parts = np.array_split(order, B)
        ref = sum(len(q) / len(f) * abs(f[q].mean() - y[q].mean()) for q in parts)
        got = calibration_error(
            torch.tensor(f),
            torch.tensor(y),
            n_bins=B,
            reading="binary",
            input="probs",
            estimator="equal_mass",
            exact=True,
        )
        assert abs(float(got) - ref) <= 1e-12


def np_sweep(f, y):
    """Roelofs et al. (2022) ECE_sweep with fractional rank boundaries b N / B: the
    equal-mass ECE at the largest B before the bin accuracies first stop being monotone."""
    order = np.argsort(f, kind="stable")
    f, y = f[order], y[order].astype(float)
    N = len(f)
    ranks = np.arange(N)

    def bins(B):
        edges = np.arange(B + 1) * N / B
        w = np.clip(
            np.minimum(ranks[None, :] + 1, edges[1:, None])
            - np.maximum(ranks[None, :], edges[:-1, None]),
            0,
            1,
        )
        n = w.sum(1)
        return n, w @ f, w @ y

    n, sf, sy = bins(1)
    best = abs(sf - sy).sum() / N
    for B in range(2, N + 1):
        n, sf, sy = bins(B)
        if np.any(np.diff(sy / n) < 0):
            break
        best = abs(sf - sy).sum() / N
    return best


def test_ece_sweep_matches_reference():
    f, y = binary_data(1500, seed=23, shape="power")
    got = calibration_error(
        torch.tensor(f),
        torch.tensor(y),
        reading="binary",
        input="probs",
        estimator="sweep",
        exact=True,
    )
    assert abs(float(got) - np_sweep(f, y)) <= 1e-12
    fine = calibration_error(
        torch.tensor(f), torch.tensor(y), reading="binary", input="probs", estimator="sweep"
    )
    assert abs(float(fine) - float(got)) <= 1e-3
    # the sweep STOPS at the first non-monotone b: on these 40 samples monotonicity comes
    # back at a larger b, and taking that one instead gives 0.1466, not 0.0729
    rng = np.random.default_rng(8)
    f = rng.uniform(0, 1, 40)
    y = (rng.uniform(0, 1, 40) < f**1.5).astype(int)
    got = calibration_error(
        torch.tensor(f),
        torch.tensor(y),
        reading="binary",
        input="probs",
        estimator="sweep",
        exact=True,
    )
    assert abs(float(got) - np_sweep(f, y)) <= 1e-12 and round(float(got), 4) == 0.0729


def test_ece_sweep_is_not_stopped_by_rounding():
    # perfectly separated outcomes: bin accuracies are monotone for EVERY b, so the sweep
    # runs to b = N (one sample per bin) and ECE_sweep = mean |f - y|. Rounding in the bin
    # sums used to fake a decrease (1.0 then 0.9999999999999983) and stop it at b = 15.
    g = torch.Generator().manual_seed(0)
    f = torch.rand(1200, generator=g, dtype=torch.float64)
    y = (f > 0.5).long()
    got = calibration_error(f, y, reading="binary", input="probs", estimator="sweep", exact=True)
    assert abs(float(got) - float((f - y).abs().mean())) <= 1e-12


def test_smooth_ece_matches_relplot():
    relplot = pytest.importorskip("relplot")
    f, y = binary_data(20_000, seed=31)
    ref = relplot.smECE(f, y.astype(float))
    p, t = torch.tensor(f), torch.tensor(y)
    exact = calibration_error(p, t, reading="binary", input="probs", estimator="smooth", exact=True)
    fine = calibration_error(p, t, reading="binary", input="probs", estimator="smooth")
    assert abs(float(exact) - ref) <= 1e-12
    assert abs(float(fine) - ref) <= 1e-6
    # a second set whose fixed point moves with one bisection step more or less (10, as relplot)
    f2, y2 = binary_data(3000, seed=35, shape="power")
    got2 = calibration_error(
        torch.tensor(f2),
        torch.tensor(y2),
        reading="binary",
        input="probs",
        estimator="smooth",
        exact=True,
    )
    assert abs(float(got2) - relplot.smECE(f2, y2.astype(float))) <= 1e-12
    ref_s = relplot.smECE_sigma(f, y.astype(float), 0.05)
    fixed = calibration_error(p, t, reading="binary", input="probs", estimator="smooth", sigma=0.05)
    assert abs(float(fixed) - ref_s) <= 1e-6


def test_coarsen_equals_direct_binning_away_from_edges():
    f, y = binary_data(5000, seed=40)
    prep = prepare_inputs(torch.tensor(f), torch.tensor(y), reading="binary", input="probs")
    a = accumulate(prep, 4096).coarsen(16)
    b = accumulate(prep, 16)
    assert torch.equal(a.count, b.count)
    assert torch.allclose(a.conf, b.conf, rtol=0, atol=1e-11)


# ----------------------------------------------------------------------------- bootstrap


def test_bootstrap_matches_brute_force_and_is_seeded():
    f, y = binary_data(400, seed=50)
    p, t = torch.tensor(f), torch.tensor(y)
    ece, lo, hi = calibration_error_bootstrap(
        p, t, reading="binary", input="probs", n_bins=10, replicates=64, level=0.9, seed=3
    )
    again = calibration_error_bootstrap(
        p, t, reading="binary", input="probs", n_bins=10, replicates=64, level=0.9, seed=3
    )
    other = calibration_error_bootstrap(
        p, t, reading="binary", input="probs", n_bins=10, replicates=64, level=0.9, seed=4
    )
    assert float(lo) == float(again[1]) and float(hi) == float(again[2])
    assert (float(lo), float(hi)) != (float(other[1]), float(other[2]))
    # brute force: the same Poisson(1) weights, replicate by replicate, in numpy
    g = torch.Generator().manual_seed(3)
    w = torch.poisson(torch.ones(400, 64, dtype=torch.float64), generator=g).numpy()
    idx = np.minimum(np.floor(f * 10), 9).astype(int)
    eces = []
    for r in range(64):
        sn = np.bincount(idx, weights=w[:, r], minlength=10)
        sg = np.bincount(idx, weights=w[:, r] * (f - y), minlength=10)
        eces.append(np.abs(sg).sum() / sn.sum())
    ql, qh = np.quantile(eces, [0.05, 0.95])
    assert abs(float(lo) - ql) <= 1e-12 and abs(float(hi) - qh) <= 1e-12
    assert abs(float(ece) - np_ece(f, y, 10)) <= 1e-12
    assert float(lo) < float(ece) < float(hi)


def test_classwise_bootstrap_resamples_samples_not_pairs():
    # one Poisson weight per SAMPLE, shared by its C one-vs-rest elements (brute force)
    logits, target = multiclass_data(300, 3, seed=51)
    probs = torch.softmax(logits, 1).numpy()
    ece, lo, hi = calibration_error_bootstrap(
        logits, target, reading="classwise", n_bins=5, replicates=40, level=0.8, seed=9
    )
    g = torch.Generator().manual_seed(9)
    w = torch.poisson(torch.ones(300, 40, dtype=torch.float64), generator=g).numpy()
    onehot = np.eye(3)[target.numpy()]
    eces = []
    for r in range(40):
        per = []
        for k in range(3):
            idx = np.minimum(np.floor(probs[:, k] * 5), 4).astype(int)
            sg = np.bincount(idx, weights=w[:, r] * (probs[:, k] - onehot[:, k]), minlength=5)
            per.append(np.abs(sg).sum() / w[:, r].sum())
        eces.append(np.mean(per))
    ql, qh = np.quantile(eces, [0.1, 0.9])
    assert abs(float(lo) - ql) <= 1e-12 and abs(float(hi) - qh) <= 1e-12
    assert (
        abs(float(ece) - float(calibration_error(logits, target, reading="classwise", n_bins=5)))
        <= 1e-15
    )


# ----------------------------------------------------------------------------- groups


def test_groups_give_per_group_and_pooled():
    logits, target = multiclass_data(2000, 4, seed=60)
    groups = torch.randint(0, 3, (2000,), generator=torch.Generator().manual_seed(1))
    res = calibration_error(logits, target, groups=groups, num_groups=4)
    assert isinstance(res, GroupedResult)
    assert abs(float(res.pooled) - float(calibration_error(logits, target))) <= 1e-15
    for g in range(3):
        m = groups == g
        assert (
            abs(float(res.per_group[g]) - float(calibration_error(logits[m], target[m]))) <= 1e-15
        )
        assert int(res.counts[g]) == int(m.sum())
    assert math.isnan(float(res.per_group[3])) and int(res.counts[3]) == 0
    tables = reliability_table(logits, target, groups=groups)
    assert len(tables.per_group) == 3 and tables.per_group[0].n == int((groups == 0).sum())
    d = brier_decomposition(logits, target, reading="confidence", groups=groups)
    m = groups == 1
    d1 = brier_decomposition(logits[m], target[m], reading="confidence")
    assert abs(float(d.per_group["brier"][1]) - float(d1["brier"])) <= 1e-15


def test_groups_with_fine_estimators_and_exact():
    f, y = binary_data(4000, seed=61)
    groups = torch.arange(4000) % 2
    p, t = torch.tensor(f), torch.tensor(y)
    for exact in (False, True):
        res = calibration_error(
            p,
            t,
            reading="binary",
            input="probs",
            estimator="equal_mass",
            groups=groups,
            exact=exact,
        )
        m = groups == 1
        one = calibration_error(
            p[m], t[m], reading="binary", input="probs", estimator="equal_mass", exact=exact
        )
        assert abs(float(res.per_group[1]) - float(one)) <= 1e-12


# ----------------------------------------------------------------------------- NLL


def test_nll_matches_references():
    logits, target = multiclass_data(300, 4, seed=70)
    got = negative_log_likelihood(logits, target)
    ref = -np.mean(np.log(torch.softmax(logits, 1).numpy()[np.arange(300), target.numpy()]))
    assert abs(float(got) - ref) <= 1e-12
    got_p = negative_log_likelihood(torch.softmax(logits, 1), target, input="probs")
    assert abs(float(got_p) - ref) <= 1e-12
    z = torch.randn(50, dtype=torch.float64)
    yb = (torch.rand(50) < 0.5).long()
    pb = torch.sigmoid(z).numpy()
    refb = -np.mean(yb.numpy() * np.log(pb) + (1 - yb.numpy()) * np.log(1 - pb))
    assert abs(float(negative_log_likelihood(z, yb)) - refb) <= 1e-12
    assert abs(float(negative_log_likelihood(torch.sigmoid(z), yb, input="probs")) - refb) <= 1e-12
    # -inf masks on wrong classes are a softmax over the remaining classes
    masked = logits.clone()
    masked[:, 3] = -math.inf
    keep = target != 3
    ref_m = F.cross_entropy(logits[keep, :3], target[keep])
    assert abs(float(negative_log_likelihood(masked[keep], target[keep])) - float(ref_m)) <= 1e-12
    assert math.isinf(float(negative_log_likelihood(masked, target)))  # a masked truth


# ----------------------------------------------------------------------------- bad input


P2 = torch.tensor([[0.7, 0.3], [0.2, 0.8]])
T2 = torch.tensor([0, 1])
NAN_LOGITS = torch.tensor([[0.0, float("nan")], [1.0, 0.0]])
INF_LOGITS = torch.tensor([[0.0, float("inf")], [1.0, 0.0]])
ALL_NEG_INF = torch.tensor([[-math.inf, -math.inf], [1.0, 0.0]])

BAD = [
    ("nan logits", lambda: calibration_error(NAN_LOGITS, T2), "preds: expected finite"),
    ("+inf logits", lambda: calibration_error(INF_LOGITS, T2), "preds: expected finite"),
    ("all -inf row", lambda: calibration_error(ALL_NEG_INF, T2), "preds: expected at least one"),
    (
        "nan classwise",
        lambda: calibration_error(NAN_LOGITS, T2, reading="classwise"),
        "preds: expected finite",
    ),
    (
        "nan binary logits",
        lambda: calibration_error(torch.tensor([0.0, float("nan")]), T2, reading="binary"),
        "preds: expected finite",
    ),
    (
        "nan probs",
        lambda: calibration_error(
            torch.tensor([[0.5, float("nan")], [1.0, 0.0]]), T2, input="probs"
        ),
        "preds: expected probabilities",
    ),
    (
        "probs > 1",
        lambda: calibration_error(torch.tensor([[1.2, 0.3], [0.2, 0.8]]), T2, input="probs"),
        "preds: expected probabilities",
    ),
    (
        "probs < 0 binary",
        lambda: calibration_error(torch.tensor([-0.1, 0.5]), T2, reading="binary", input="probs"),
        "preds: expected probabilities",
    ),
    (
        "label out of range",
        lambda: calibration_error(P2, torch.tensor([0, 2])),
        "target: expected class indices in [0, 1], got 2 at position 1",
    ),
    (
        "negative label",
        lambda: calibration_error(P2, torch.tensor([-1, 0])),
        "target: expected class indices",
    ),
    (
        "binary label 2",
        lambda: calibration_error(torch.tensor([0.1, 0.2]), torch.tensor([0, 2]), reading="binary"),
        "target: expected binary",
    ),
    (
        "float class labels",
        lambda: calibration_error(P2, torch.tensor([0.0, 1.0])),
        "target: expected integer",
    ),
    (
        "shape mismatch",
        lambda: calibration_error(P2, torch.tensor([0, 1, 1])),
        "target: expected shape (2,)",
    ),
    (
        "binary shape mismatch",
        lambda: calibration_error(
            torch.tensor([0.1, 0.2]), torch.tensor([0, 1, 1]), reading="binary"
        ),
        "target: expected the shape of preds",
    ),
    (
        "1-D preds multiclass",
        lambda: calibration_error(torch.tensor([0.1, 0.2]), T2),
        "preds: expected scores of shape (N, C, *)",
    ),
    ("n_bins 0", lambda: calibration_error(P2, T2, n_bins=0), "n_bins: expected an int >= 1"),
    ("table n_bins 0", lambda: reliability_table(P2, T2, n_bins=0), "n_bins"),
    (
        "brier n_bins 0",
        lambda: brier_decomposition(P2, T2, n_bins=0, reading="confidence"),
        "n_bins",
    ),
    (
        "empty",
        lambda: calibration_error(torch.zeros(0, 3), torch.zeros(0).long()),
        "preds: expected a non-empty",
    ),
    ("bad reading", lambda: calibration_error(P2, T2, reading="marginal"), "reading: expected"),
    ("bad input", lambda: calibration_error(P2, T2, input="scores"), "input: expected"),
    ("bad norm", lambda: calibration_error(P2, T2, norm="l3"), "norm: expected"),
    ("debiased l1", lambda: calibration_error(P2, T2, estimator="debiased"), "norm: the debiased"),
    (
        "fine + classwise",
        lambda: calibration_error(P2, T2, reading="classwise", estimator="smooth"),
        "estimator:",
    ),
    ("bad level", lambda: reliability_table(P2, T2, level=1.5), "level: expected"),
    ("bad interval", lambda: reliability_table(P2, T2, interval="wald"), "interval: expected"),
    (
        "groups out of range",
        lambda: calibration_error(P2, T2, groups=torch.tensor([0, 3]), num_groups=2),
        "groups: expected group ids",
    ),
    (
        "groups shape",
        lambda: calibration_error(P2, T2, groups=torch.tensor([0])),
        "groups: expected one group id per sample",
    ),
    (
        "num_classes mismatch",
        lambda: calibration_error(P2, T2, num_classes=3),
        "preds: expected 3 classes",
    ),
    ("table nan", lambda: reliability_table(NAN_LOGITS, T2), "preds: expected finite"),
    ("table label", lambda: reliability_table(P2, torch.tensor([0, 5])), "target: expected"),
    (
        "brier probs > 1",
        lambda: brier_decomposition(torch.tensor([1.5, 0.5]), T2, input="probs"),
        "preds: expected prob",
    ),
    (
        "brier shape",
        lambda: brier_decomposition(torch.tensor([0.5, 0.5]), torch.tensor([1]), input="probs"),
        "target: expected the shape",
    ),
    (
        "bootstrap replicates",
        lambda: calibration_error_bootstrap(P2, T2, replicates=1),
        "replicates: expected an int >= 2",
    ),
    (
        "bootstrap nan",
        lambda: calibration_error_bootstrap(NAN_LOGITS, T2),
        "preds: expected finite",
    ),
    ("nll nan", lambda: negative_log_likelihood(NAN_LOGITS, T2), "preds: expected finite"),
    (
        "nll label",
        lambda: negative_log_likelihood(P2, torch.tensor([0, 2])),
        "target: expected class indices",
    ),
    (
        "nll shape",
        lambda: negative_log_likelihood(P2, torch.tensor([0, 1, 1])),
        "target: expected shape",
    ),
    (
        "nll probs",
        lambda: negative_log_likelihood(P2 * 2, T2, input="probs"),
        "preds: expected probabilities",
    ),
]


@pytest.mark.parametrize("name,fn,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises(name, fn, msg):
    with pytest.raises(ValueError) as e:
        fn()
    assert msg in str(e.value)


def test_validation_can_be_switched_off_for_clean_hot_loops():
    with validation_enabled(False):
        got = calibration_error(P2, T2, input="probs", n_bins=10)
    assert abs(float(got) - float(calibration_error(P2, T2, input="probs", n_bins=10))) == 0


# ----------------------------------------------------------------------------- properties


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    c=st.integers(2, 6),
    bins=st.integers(1, 20),
    split=st.integers(1, 59),
    seed=st.integers(0, 2**16),
    reading=st.sampled_from(["confidence", "top_label", "classwise"]),
)
def test_streaming_merge_and_ranges_property(n, c, bins, split, seed, reading):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, generator=g, dtype=torch.float64) * 3
    target = torch.randint(0, c, (n,), generator=g)
    kw = {"n_bins": bins, "reading": reading}
    whole = binned_statistics(logits, target, **kw)
    k = min(split, n - 1)
    if k > 0:
        parts = binned_statistics(logits[:k], target[:k], **kw) + binned_statistics(
            logits[k:], target[k:], **kw
        )
        assert torch.equal(parts.count, whole.count)
        assert torch.allclose(parts.conf, whole.conf, rtol=1e-13, atol=1e-13)
        assert torch.allclose(parts.acc, whole.acc, rtol=0, atol=0)
    per_sample = c if reading == "classwise" else 1
    assert int(whole.count.sum()) == n * per_sample
    for norm in ("l1", "l2", "max"):
        e = float(calibration_error_from_stats(whole.pooled(), norm=norm, reading=reading))
        assert 0.0 <= e <= 1.0
    d = brier_decomposition_from_stats(whole.pooled(), reading=reading)
    total = (
        d["reliability"]
        - d["resolution"]
        + d["uncertainty"]
        + d["within_bin_variance"]
        - 2 * d["within_bin_covariance"]
    )
    assert abs(float(total - d["brier"])) <= 1e-12


@pytest.mark.parametrize("reading", ["confidence", "top_label"])
@pytest.mark.parametrize("input", ["logits", "probs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_prepare_rows_is_the_general_path_bit_for_bit(reading, input, dtype):
    """The validation loop's shortcut (``readings.prepare_rows``) against the general path of
    ``prepare_inputs`` (forced by an ``ignore_index`` no target holds): the same confidences,
    outcomes and slots, bit for bit; ``None`` for every batch it does not handle."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(300, 6, generator=g) * 3
    x[:, 2] = x[:, 4]  # ties: the first maximum wins on both paths
    x = (x.softmax(1) if input == "probs" else x).to(dtype)
    t = torch.randint(0, 6, (300,), generator=g)
    conf, outcome, lead, looks = prepare_rows(x, t, reading=reading, input=input)
    ref = prepare_inputs(x, t, reading=reading, input=input, ignore_index=-100)
    assert torch.equal(conf, ref.conf) and conf.dtype == ref.conf.dtype
    assert torch.equal(outcome, ref.outcome)
    if reading == "top_label":
        assert torch.equal(lead, ref.lead)
    else:
        assert lead is None and ref.lead is None
    assert looks == ref.looks_like_probs is False
    for preds, target in (
        (x.unsqueeze(-1), t.unsqueeze(-1)),  # (N, C, 1)
        (x[:, 0], t),  # 1-D
        (x[:0], t[:0]),  # empty
        (x.tolist(), t),  # not a tensor
    ):
        assert prepare_rows(preds, target, reading=reading, input=input) is None
    assert prepare_rows(x, t, reading="classwise", input=input) is None
    assert prepare_rows(x, t, reading=reading, input=input, num_classes=5) is None


@pytest.mark.parametrize("input", ["logits", "probs"])
@pytest.mark.parametrize("ties", [False, True])
def test_large_cpu_batches_get_torch_max_outcomes_without_the_argmax(input, ties):
    """From 2^16 elements and 64 classes the CPU confidence reading finds ``argmax ==
    target`` from ``amax`` and a count of each row's maxima (``torch.max`` with indices is a
    scalar loop there); a tie anywhere falls back to ``torch.max``. Either way the outcomes
    are ``torch.max``'s first-maximum rule and the confidences those of small chunks (which
    take ``torch.max``), bit for bit."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(1100, 64, generator=g) * 3
    t = torch.randint(0, 64, (1100,), generator=g)
    if ties:  # two maxima: torch.max takes the first, the label is the second
        x[5, 0] = x[5, 40] = 100.0
        t[5] = 40
    x = x.softmax(1) if input == "probs" else x
    conf, outcome, _, _ = prepare_rows(x, t, input=input)
    assert torch.equal(outcome, x.max(1).indices == t)
    assert not ties or not bool(outcome[5])
    chunks = [
        prepare_rows(x[i : i + 100], t[i : i + 100], input=input) for i in range(0, 1100, 100)
    ]
    assert torch.equal(conf, torch.cat([c[0] for c in chunks]))
    taken = row_max(x, t)[1] is None
    assert taken is not ties, "the amax path runs exactly when no row has a tie"
