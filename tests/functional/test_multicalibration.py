"""The multicalibration error (torchcal.functional.multicalibration) against exact rationals,
against ``mcgrad.metrics.MulticalibrationError`` on the same data and segments, and as a test
(its p-value's rate on calibrated data)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from torchcal.functional.multicalibration import (
    apply_segments,
    ecce,
    ecce_pvalue,
    multicalibration_error,
    segment_masks,
    segment_spec,
)


def exact_ecce(p: list[float], y: list[int], w: list[float]) -> tuple[Fraction, Fraction]:
    """ECCE and sigma^2 in rationals: rows sorted by p, ties as one block."""
    rows = sorted(zip(map(Fraction, p), y, map(Fraction, w)))
    total = sum(r[2] for r in rows)
    cum, path, i = Fraction(0), [Fraction(0)], 0
    while i < len(rows):
        j = i
        while j < len(rows) and rows[j][0] == rows[i][0]:
            cum += rows[j][2] * (rows[j][1] - rows[j][0]) / total
            j += 1
        path.append(cum)
        i = j
    var = sum(wi * wi * pi * (1 - pi) for pi, _, wi in rows) / (total * total)
    return max(path) - min(path), var


def test_ecce_equals_exact_rationals_with_ties_and_weights() -> None:
    g = torch.Generator().manual_seed(3)
    p = torch.randint(0, 8, (60,), generator=g).double() / 8  # many ties
    y = torch.randint(0, 2, (60,), generator=g)
    w = torch.rand(60, generator=g, dtype=torch.float64)
    value, sigma = ecce(p, y, weight=w)
    ref, var = exact_ecce(p.tolist(), y.tolist(), w.tolist())
    assert float(value) == pytest.approx(float(ref), rel=1e-12, abs=1e-15)
    assert float(sigma) ** 2 == pytest.approx(float(var), rel=1e-12)


def test_ties_make_the_statistic_independent_of_row_order() -> None:
    g = torch.Generator().manual_seed(1)
    p = torch.randint(0, 5, (500,), generator=g).double() / 4
    y = torch.bernoulli(p.clamp(0.1, 0.9), generator=g)
    lang = torch.randint(0, 3, (500,), generator=g)
    masks, _ = segment_masks({"lang": lang}, depth=1)
    a = multicalibration_error(p, y, masks)
    perm = torch.randperm(500, generator=g)
    b = multicalibration_error(p[perm], y[perm], masks[:, perm])
    torch.testing.assert_close(a.ecce, b.ecce, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(a.sigma, b.sigma, rtol=1e-12, atol=1e-15)


def test_scaling_every_weight_changes_nothing() -> None:
    g = torch.Generator().manual_seed(2)
    p = torch.rand(800, generator=g, dtype=torch.float64)
    y = torch.bernoulli(p, generator=g)
    w = torch.rand(800, generator=g, dtype=torch.float64)
    masks, _ = segment_masks({"k": torch.randint(0, 4, (800,), generator=g)}, depth=1)
    a = multicalibration_error(p, y, masks, weight=w)
    b = multicalibration_error(p, y, masks, weight=w * 1e-200)
    torch.testing.assert_close(a.ecce_sigma, b.ecce_sigma, rtol=1e-9, atol=0.0)
    assert a.worst == b.worst


def test_segment_masks_follow_the_stated_order_and_minimum() -> None:
    a = torch.tensor([0, 0, 1, 1, 1, 2])
    b = torch.tensor([5, 6, 5, 6, 5, 5])
    masks, labels = segment_masks({"a": a, "b": b}, depth=2, min_rows=2)
    assert labels[0] == () and bool(masks[0].all())
    assert labels[1:4] == [(("a", 0),), (("a", 1),), (("b", 5),)]  # a=2 has 1 row: left out
    assert (("a", 1), ("b", 5)) in labels and (("a", 0), ("b", 5)) not in labels
    for m, lab in zip(masks, labels):
        want = torch.ones(6, dtype=torch.bool)
        for col, v in lab:
            want &= {"a": a, "b": b}[col] == v
        assert torch.equal(m, want)


def test_numeric_columns_are_quantile_buckets() -> None:
    v = torch.arange(1.0, 101.0, dtype=torch.float64)
    masks, labels = segment_masks({"x": v}, depth=1, bins=4)
    assert [int(m.sum()) for m in masks[1:]] == [25, 25, 25, 25]
    assert [lab[0][1] for lab in labels[1:]] == [0, 1, 2, 3]


def test_bad_inputs_name_the_argument() -> None:
    p = torch.rand(10, dtype=torch.float64)
    y = torch.randint(0, 2, (10,))
    with pytest.raises(ValueError, match="^probs: expected probabilities"):
        ecce(p + 1, y)
    with pytest.raises(ValueError, match="^target: expected binary labels"):
        ecce(p, y + 1)
    with pytest.raises(ValueError, match="^weight: expected values >= 0"):
        ecce(p, y, weight=-torch.ones(10))
    with pytest.raises(ValueError, match="^weight: expected a positive total"):
        ecce(p, y, weight=torch.zeros(10))
    with pytest.raises(ValueError, match=r"^segments: expected a bool tensor of shape \(S, 10\)"):
        multicalibration_error(p, y, torch.ones(2, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^columns\['x'\]: expected a 1-D tensor of 10"):
        segment_masks({"a": torch.zeros(10, dtype=torch.long), "x": torch.zeros(9)})
    with pytest.raises(ValueError, match=r"^columns\['x'\]: expected finite"):
        segment_masks({"x": torch.tensor([0.0, float("nan")])})
    with pytest.raises(ValueError, match="^ecce_sigma: expected values >= 0"):
        ecce_pvalue(torch.tensor([-1.0]))


def test_pvalue_is_uniform_enough_on_calibrated_data() -> None:
    """The global ECCE's p-value on calibrated data: P(p < 0.05) within 3 SE of 0.05
    (400 seeded data sets of 2,000 rows)."""
    g = torch.Generator().manual_seed(0)
    p = torch.rand(400, 2000, generator=g, dtype=torch.float64)
    y = torch.bernoulli(p, generator=g)
    pv = torch.stack(
        [
            multicalibration_error(p[i], y[i], torch.ones(1, 2000, dtype=torch.bool)).pvalue[0]
            for i in range(400)
        ]
    )
    rate = float((pv < 0.05).double().mean())
    assert abs(rate - 0.05) <= 3 * (0.05 * 0.95 / 400) ** 0.5, rate


def test_equals_mcgrad_on_the_same_data_and_segments() -> None:
    pd = pytest.importorskip("pandas")
    mm = pytest.importorskip("mcgrad.metrics")
    rng = np.random.default_rng(0)
    n = 6000
    df = pd.DataFrame(
        {
            "p": rng.random(n),
            "a": rng.integers(0, 3, n),
            "b": rng.integers(0, 3, n),
            "c": rng.normal(size=n),
            "w": rng.random(n) + 0.1,
        }
    )
    df["y"] = (rng.random(n) < np.clip(df.p + 0.06 * (df.a - 1) * (df.b - 1), 0, 1)).astype(float)
    ref = mm.MulticalibrationError(
        df,
        "y",
        "p",
        weight_column="w",
        categorical_segment_columns=["a", "b"],
        numerical_segment_columns=["c"],
        max_depth=2,
        max_values_per_segment_feature=3,
        min_samples_per_segment=50,
        max_n_segments=None,
        precision_dtype="float64",
    )
    cols = {k: torch.tensor(df[k].values) for k in ("a", "b", "c")}
    masks, _ = segment_masks(cols, depth=2, min_rows=50, bins=3)
    ours = multicalibration_error(
        torch.tensor(df.p.values),
        torch.tensor(df.y.values),
        masks,
        weight=torch.tensor(df.w.values),
    )
    assert float(ours.mce_sigma) == pytest.approx(float(ref.mce_sigma), rel=1e-9, abs=1e-9)
    assert masks.shape[0] == ref.total_number_segments
    assert float(ours.mce) == pytest.approx(float(ref.mce), rel=1e-9, abs=1e-12)
    assert float(ours.ecce[0]) == pytest.approx(float(ref.global_ecce), rel=1e-9, abs=1e-12)
    assert float(ours.ecce_sigma[0]) == pytest.approx(float(ref.global_ecce_sigma), rel=1e-9)
    # segment order differs (mcgrad: first appearance in score order); the sets agree
    np.testing.assert_allclose(np.sort(ours.ecce.numpy()), np.sort(ref.segments_ecce), atol=1e-12)
    np.testing.assert_allclose(
        np.sort(ours.ecce_sigma.numpy()), np.sort(ref.segments_ecce_sigma), rtol=1e-9, atol=1e-9
    )
    np.testing.assert_allclose(
        np.sort(ours.pvalue.numpy()), np.sort(ref.segments_ecce_pvalue), rtol=1e-9, atol=1e-12
    )


def test_worst_is_the_first_segment_on_a_tie() -> None:
    """Exact 0/1 predictions that are all right: every segment has ECCE 0 and ratio 0 (an
    exact tie); the first segment (the whole data set) is reported. (Two equal masks need not
    give bit-equal ratios: the batched sums round per row.)"""
    p = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    k = torch.tensor([0, 0, 1, 1, 2, 2])
    masks, _ = segment_masks({"k": k}, depth=1)
    res = multicalibration_error(p, p.long(), masks)
    assert res.ecce_sigma.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert res.worst == 0 and float(res.mce_sigma) == 0.0


def test_pvalue_equals_mcgrads_series_into_the_far_tail() -> None:
    mm = pytest.importorskip("mcgrad.metrics")
    x = torch.tensor([0.0, 0.5, 1.0, 2.0, 3.0, 4.5, 5.5, 6.5, 7.5, 8.0, 8.2, 9.0, 50.0])
    ours = ecce_pvalue(x.double())
    ref = np.array([mm.ecce_pvalue_from_sigma(float(v)) for v in x])
    np.testing.assert_allclose(ours.numpy(), ref, rtol=0, atol=5e-16)
    # 1 - CDF near 1: the tail is resolved to an absolute 1e-16, not relatively
    assert float(ours[6]) == pytest.approx(1.519164998e-7, rel=1e-8)


def test_quantile_buckets_hold_their_upper_edge() -> None:
    """Edges that are data values: bucket k holds (e_{k-1}, e_k], the first also its lower
    edge (9 values, bins=4: edges 3, 5, 7)."""
    v = torch.arange(1.0, 10.0, dtype=torch.float64)
    masks, labels = segment_masks({"x": v}, depth=1, bins=4)
    members = [v[m].tolist() for m in masks[1:]]
    assert members == [[1.0, 2.0, 3.0], [4.0, 5.0], [6.0, 7.0], [8.0, 9.0]]


def test_a_numeric_column_with_bins_values_keeps_them() -> None:
    v = torch.tensor([0.5, 1.5, 2.5, 3.5] * 5, dtype=torch.float64)  # 4 distinct, bins=4
    spec = segment_spec({"x": v}, depth=1, bins=4)
    assert spec.kinds == ("values",)
    torch.testing.assert_close(spec.cuts[0], torch.tensor([0.5, 1.5, 2.5, 3.5]).double())
    # a value not among them is in no segment of that column (only the whole data set)
    new = apply_segments(spec, {"x": torch.tensor([1.5, 2.0, 9.0], dtype=torch.float64)})
    assert new.tolist() == [
        [True, True, True],
        [False, False, False],
        [True, False, False],
        [False, False, False],
        [False, False, False],
    ]


def test_a_segment_without_variance_but_with_error_is_infinitely_far() -> None:
    """Rows predicted 0 that are positives: sigma 0 (p(1 - p) = 0), ECCE > 0: inf sigmas,
    the smallest p-value, the worst segment; a segment of exact 0/1 predictions that are
    right has ECCE 0 and ratio 0."""
    p = torch.tensor([0.0, 0.0, 0.3, 0.6, 1.0, 1.0], dtype=torch.float64)
    y = torch.tensor([1, 1, 0, 1, 1, 1])
    k = torch.tensor([0, 0, 1, 1, 2, 2])
    masks, labels = segment_masks({"k": k}, depth=1)
    res = multicalibration_error(p, y, masks)
    assert labels[1] == (("k", 0),) and float(res.sigma[1]) == 0.0
    assert math.isinf(float(res.ecce_sigma[1])) and res.worst == 1
    assert float(res.pvalue[1]) == torch.finfo(torch.float64).eps
    assert float(res.ecce[3]) == 0.0 and float(res.ecce_sigma[3]) == 0.0


def test_a_negative_code_is_an_error() -> None:
    """-1 marks a column a segment leaves free: a negative code is refused, never dropped."""
    code = torch.tensor([-1, 0, 1, -1, 0, 1])
    with pytest.raises(ValueError, match=r"^columns\['x'\]: expected integer codes >= 0"):
        segment_masks({"x": code}, depth=1)
