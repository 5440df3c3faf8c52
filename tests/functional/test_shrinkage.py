"""Empirical-Bayes shrinkage: the DerSimonian-Laird moment estimate against R's metafor and
against its own expectation by simulation, the shrinkage's limits, and the per-group
temperature that uses it (few samples -> the global T, many -> its own)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import torchcal.functional as TF
from torchcal.functional.shrinkage import between_group_variance, empirical_bayes_shrinkage
from torchcal.scaling import GroupTemperatureScaler

# BCG vaccine trials (metafor's dat.bcg): tpos, tneg, cpos, cneg
BCG = [
    [4, 119, 11, 128],
    [6, 300, 29, 274],
    [3, 228, 11, 209],
    [62, 13536, 248, 12619],
    [33, 5036, 47, 5761],
    [180, 1361, 372, 1079],
    [8, 2537, 10, 619],
    [505, 87886, 499, 87892],
    [29, 7470, 45, 7232],
    [17, 1699, 65, 1600],
    [186, 50448, 141, 27197],
    [5, 2493, 3, 2338],
    [27, 16886, 29, 17825],
]


def test_dersimonian_laird_matches_metafor():
    # metafor 4.x: rma(yi, vi, data = escalc("RR", ...dat.bcg), method = "DL") -> tau^2 = 0.3088
    a, b, c, d = torch.tensor(BCG, dtype=torch.float64).unbind(1)
    yi = torch.log(a / (a + b)) - torch.log(c / (c + d))
    vi = 1 / a - 1 / (a + b) + 1 / c - 1 / (c + d)
    assert float(between_group_variance(yi, 1 / vi)) == pytest.approx(0.3088, abs=5e-5)
    # a group without information takes no part, whatever its estimate
    yi2 = torch.cat([yi, torch.tensor([math.inf])])
    w2 = torch.cat([1 / vi, torch.zeros(1, dtype=torch.float64)])
    assert float(between_group_variance(yi2, w2)) == float(between_group_variance(yi, 1 / vi))


def test_moment_estimate_is_unbiased_before_truncation():
    """Under the normal-normal model E[Q] = (G - 1) + c tau^2 exactly, so the mean of the
    estimate over replicates is tau^2 when truncation at 0 never bites (checked)."""
    g = torch.Generator().manual_seed(0)
    G, tau2, reps = 30, 1.0, 2000
    v = 0.1 + 0.4 * torch.rand(G, generator=g, dtype=torch.float64)
    est = []
    for _ in range(reps):
        theta = 2.0 + math.sqrt(tau2) * torch.randn(G, generator=g, dtype=torch.float64)
        x = theta + v.sqrt() * torch.randn(G, generator=g, dtype=torch.float64)
        est.append(float(between_group_variance(x, 1 / v)))
    est_t = torch.tensor(est)
    assert float(est_t.min()) > 0  # no truncation: the mean is the untruncated estimator's
    se = float(est_t.std()) / math.sqrt(reps)
    assert abs(float(est_t.mean()) - tau2) < 4 * se


def test_shrinkage_limits_and_its_risk():
    # no heterogeneity -> everything at the center; one informative group -> tau^2 = 0
    x = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    shrunk, w, tau2 = empirical_bayes_shrinkage(x, torch.full((3,), 5.0, dtype=torch.float64), 0.0)
    assert float(tau2) == 0 and shrunk.tolist() == [0.0, 0.0, 0.0] and w.tolist() == [0, 0, 0]
    one = empirical_bayes_shrinkage(
        torch.tensor([3.0, 7.0], dtype=torch.float64),
        torch.tensor([10.0, 0.0], dtype=torch.float64),
        1.0,
    )
    assert one[0].tolist() == [1.0, 1.0] and float(one[2]) == 0
    # large precision keeps the estimate, small goes to the center
    x = torch.tensor([0.0, 2.0, -1.0, 3.0, 5.0], dtype=torch.float64)
    w = torch.tensor([1e9, 1e9, 1e9, 1e9, 1e-9], dtype=torch.float64)
    shrunk, weights, _ = empirical_bayes_shrinkage(x, w, 1.0)
    assert torch.allclose(shrunk[:4], x[:4], atol=1e-8) and abs(float(shrunk[4]) - 1) < 1e-7
    assert bool(((weights >= 0) & (weights < 1)).all())
    # the posterior mean beats both the raw estimates and the center in squared error
    g = torch.Generator().manual_seed(1)
    G = 400
    v = torch.exp(3 * torch.randn(G, generator=g, dtype=torch.float64))  # very mixed sizes
    theta = 0.5 * torch.randn(G, generator=g, dtype=torch.float64)
    xs = theta + v.sqrt() * torch.randn(G, generator=g, dtype=torch.float64)
    shrunk, _, _ = empirical_bayes_shrinkage(xs, 1 / v, 0.0)
    mse = {k: float(((e - theta) ** 2).mean()) for k, e in (("raw", xs), ("eb", shrunk))}
    mse["center"] = float((theta**2).mean())
    assert mse["eb"] < mse["center"] < mse["raw"]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((torch.zeros(0), torch.zeros(0), 0.0), "estimates: expected a non-empty 1-d"),
        ((torch.zeros(3), torch.ones(2), 0.0), "precisions: expected a tensor of the estimates"),
        ((torch.zeros(2), torch.tensor([1.0, -1.0]), 0.0), "precisions: expected values >= 0"),
        ((torch.tensor([0.0, math.nan]), torch.ones(2), 0.0), "estimates: expected finite"),
        ((torch.zeros(2), torch.ones(2), math.nan), "center"),
    ],
)
def test_bad_input_names_the_argument(args, match):
    with pytest.raises(ValueError, match=match):
        empirical_bayes_shrinkage(*args)


def _groups_data():
    """Eight groups of 2000 rows at true temperatures ``2 exp(0.15 N(0, 1))``, a group of 2
    rows at T = 10, and a perfectly separated group of 3 rows (its own T runs to the bound)."""
    g = torch.Generator().manual_seed(0)
    temps = (2 * torch.exp(0.15 * torch.randn(8, generator=g, dtype=torch.float64))).tolist()
    sizes, temps = [2000] * 8 + [2], temps + [10.0]
    groups = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    z = 3 * torch.randn(len(groups), 5, generator=g, dtype=torch.float64)
    t = torch.tensor(temps, dtype=torch.float64)[groups].unsqueeze(1)
    y = torch.multinomial(torch.softmax(z / t, 1), 1, generator=g).squeeze(1)
    zs = torch.tensor([[9.0, 0, 0, 0, 0], [0, 9.0, 0, 0, 0], [0, 0, 9.0, 0, 0]])
    z = torch.cat([z, zs.double()])
    y = torch.cat([y, torch.tensor([0, 1, 2])])
    groups = torch.cat([groups, torch.full((3,), 9)])
    return z, y, groups


def test_group_temperature_empirical_bayes():
    z, y, groups = _groups_data()
    G = 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the raw fit's separated group is on its bound
        raw = GroupTemperatureScaler(G, shrinkage=0.0)
        raw.fit(z, y, groups)
    eb = GroupTemperatureScaler(G, shrinkage="empirical_bayes")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: every group has a finite T
        res = eb.fit(z, y, groups)
    t_glob = res.temperature
    t_raw, t_eb, w = raw.temperatures, eb.temperatures, eb.shrinkage_weights
    assert eb.raw_temperatures is not None and w is not None
    assert torch.equal(eb.raw_temperatures, t_raw)
    # each group's own T fits its own rows no worse than the global T (before shrinkage)
    for i in range(G):
        m = groups == i
        nll_own = float(TF.log_score(z[m] / float(t_raw[i]), y[m]))
        assert nll_own <= float(TF.log_score(z[m] / t_glob, y[m]))
    # many rows -> about its own T; two rows -> about the global T; separated -> exactly it
    log_raw, log_eb, log_g = torch.log(t_raw), torch.log(t_eb), math.log(t_glob)
    big = slice(0, 8)
    assert bool((w[big] > 0.8).all())
    assert bool(((log_eb[big] - log_raw[big]).abs() <= 0.2 * (log_raw[big] - log_g).abs()).all())
    assert float(w[8]) < 0.1
    assert abs(float(log_eb[8]) - log_g) < 0.1 * abs(float(log_raw[8]) - log_g)
    assert float(w[9]) == 0 and float(t_eb[9]) == pytest.approx(t_glob, rel=1e-12)
    assert float(t_raw[9]) == pytest.approx(raw.bounds[0])
    # the shrinkage is the formula's, on log T
    expect = log_g + w * (log_raw - log_g)
    assert torch.allclose(log_eb[:9], expect[:9], rtol=0, atol=1e-12)
    tau2 = eb.between_group_variance
    assert tau2 is not None and 0.005 < tau2 < 0.06  # the true spread of log T: 0.15^2
    assert bool((eb(z, groups).argmax(1) == z.argmax(1)).all())
    # the fit's report is the NLL at the shrunk temperatures
    t_row = t_eb[groups].unsqueeze(1)
    assert res.nll_after == pytest.approx(float(TF.log_score(z / t_row, y)), rel=1e-10)


def test_group_temperature_shrinkage_option_is_checked():
    with pytest.raises(ValueError, match="shrinkage"):
        GroupTemperatureScaler(2, shrinkage="bayes")  # type: ignore[arg-type]


def test_empirical_bayes_edge_groups():
    """One group: nothing to compare (tau^2 = 0), every T is the global one; a group without
    samples gets the global T; binary logits take the same path."""
    g = torch.Generator().manual_seed(2)
    z = 2 * torch.randn(600, 4, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
    one = GroupTemperatureScaler(1, shrinkage="empirical_bayes")
    res = one.fit(z, y, torch.zeros(600, dtype=torch.long))
    assert one.between_group_variance == 0
    assert float(one.temperatures[0]) == pytest.approx(res.temperature, rel=1e-12)
    groups = torch.arange(600) % 3  # group 3 stays empty
    eb = GroupTemperatureScaler(4, shrinkage="empirical_bayes")
    with pytest.warns(UserWarning, match="no samples in group"):
        res = eb.fit(z, y, groups)
    assert eb.shrinkage_weights is not None and float(eb.shrinkage_weights[3]) == 0
    assert float(eb.temperatures[3]) == pytest.approx(res.temperature, rel=1e-12)
    s = z[:, 0] - z[:, 1]  # binary: P(y = 1) = sigmoid(s / 2)
    yb = (torch.rand(600, generator=g, dtype=torch.float64) < torch.sigmoid(s / 2)).double()
    bin_eb = GroupTemperatureScaler(3, shrinkage="empirical_bayes")
    bin_eb.fit(s, yb, groups)
    raw = GroupTemperatureScaler(3, shrinkage=0.0)
    raw.fit(s, yb, groups)
    assert bin_eb.raw_temperatures is not None
    assert torch.equal(bin_eb.raw_temperatures, raw.temperatures)
    assert bool(((bin_eb.temperatures - 2).abs() < 0.6).all())
