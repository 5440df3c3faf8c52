"""auroc_interval against scikit-learn's AUROC and a brute-force DeLong (pairs), with ties;
its interval's coverage by simulation; clear errors."""

from __future__ import annotations

import math

import pytest
import torch

from torchcal.functional import auroc_interval


def brute(conf: list[float], correct: list[int]) -> tuple[float, float]:
    x = [c for c, k in zip(conf, correct) if k]
    y = [c for c, k in zip(conf, correct) if not k]

    def psi(a: float, b: float) -> float:
        return 1.0 if a > b else 0.5 if a == b else 0.0

    v10 = [sum(psi(a, b) for b in y) / len(y) for a in x]
    v01 = [sum(psi(a, b) for a in x) / len(x) for b in y]
    auc = sum(v10) / len(v10)

    def var(v: list[float]) -> float:
        mu = sum(v) / len(v)
        return sum((t - mu) ** 2 for t in v) / (len(v) - 1)

    return auc, math.sqrt(var(v10) / len(x) + var(v01) / len(y))


def test_equals_brute_force_delong_and_sklearn_with_ties() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    g = torch.Generator().manual_seed(0)
    conf = (torch.rand(300, generator=g, dtype=torch.float64) * 10).round() / 10  # ties
    correct = torch.bernoulli(0.3 + 0.5 * conf, generator=g).long()
    res = auroc_interval(conf, correct)
    auc, se = brute(conf.tolist(), correct.tolist())
    assert res.auroc == pytest.approx(auc, abs=1e-12)
    assert res.auroc == pytest.approx(metrics.roc_auc_score(correct, conf), abs=1e-12)
    assert res.se == pytest.approx(se, rel=1e-10)
    assert res.lower <= res.auroc <= res.upper


def test_interval_covers_at_its_level() -> None:
    """Binormal data with a known AUROC of Phi(1 / sqrt 2) = 0.7602: the 90% interval covers
    it in 90% of 400 data sets of 200 rows, within 3 SE."""
    g = torch.Generator().manual_seed(1)
    truth = 0.5 * (1 + math.erf(1 / math.sqrt(2) / math.sqrt(2)))
    hits = 0
    for _ in range(400):
        correct = torch.bernoulli(torch.full((200,), 0.5), generator=g).long()
        conf = torch.randn(200, generator=g, dtype=torch.float64) + correct
        res = auroc_interval(conf, correct)
        hits += res.lower <= truth <= res.upper
    assert abs(hits / 400 - 0.9) <= 3 * math.sqrt(0.09 / 400), hits


def test_a_judge_that_says_the_same_to_everyone_has_no_resolution() -> None:
    g = torch.Generator().manual_seed(2)
    conf = 0.85 + 0.1 * torch.rand(2000, generator=g, dtype=torch.float64)
    correct = torch.bernoulli(torch.full((2000,), 0.9), generator=g).long()  # unrelated
    res = auroc_interval(conf, correct)
    assert res.lower < 0.5 < res.upper


def test_one_class_gives_nan_and_bad_inputs_are_named() -> None:
    res = auroc_interval(torch.tensor([0.2, 0.4]), torch.tensor([1, 1]))
    assert math.isnan(res.auroc) and res.negatives == 0
    with pytest.raises(ValueError, match="^correct: expected binary labels"):
        auroc_interval(torch.tensor([0.2, 0.4]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="^confidence: expected finite"):
        auroc_interval(torch.tensor([0.2, float("nan")]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="^level: expected a number in"):
        auroc_interval(torch.tensor([0.2, 0.4]), torch.tensor([1, 0]), level=1.5)
    with pytest.raises(ValueError, match="^confidence: expected a floating-point"):
        auroc_interval(torch.tensor([2, 4]), torch.tensor([1, 0]))


def test_one_right_answer_has_a_finite_se_from_the_wrong_ones() -> None:
    """A class of one row has no variance term (not NaN): the SE comes from the other class,
    here in exact numbers (psi of the right answer 0.5 against 0.1, 0.3, 0.9, 0.5)."""
    conf = torch.tensor([0.1, 0.5, 0.3, 0.9, 0.5], dtype=torch.float64)
    res = auroc_interval(conf, torch.tensor([0, 1, 0, 0, 0]))
    assert res.auroc == pytest.approx(2.5 / 4, abs=1e-15)
    # v01 = [1, 1, 0, 0.5]: sample variance 0.6875 / 3, over n = 4
    assert res.se == pytest.approx(math.sqrt(0.6875 / 3 / 4), rel=1e-12)
    flipped = auroc_interval(conf, torch.tensor([1, 0, 1, 1, 1]))
    assert flipped.auroc == pytest.approx(1 - res.auroc, abs=1e-15)
    assert flipped.se == pytest.approx(res.se, rel=1e-12)


def test_interval_is_intersected_with_zero_one() -> None:
    """Few rows and an AUROC near 1 (or 0): the Wald interval would leave [0, 1]."""
    conf = torch.tensor([0.9, 0.8, 0.7, 0.85, 0.2, 0.1], dtype=torch.float64)
    correct = torch.tensor([1, 1, 1, 0, 0, 0])  # AUROC 7/9
    res = auroc_interval(conf, correct, level=0.99)
    assert res.auroc == pytest.approx(7 / 9, abs=1e-15)
    assert res.auroc + 2.5 * res.se > 1 and res.upper == 1.0
    low = auroc_interval(conf, 1 - correct, level=0.99)
    assert low.auroc - 2.5 * low.se < 0 and low.lower == 0.0
    assert low.upper == pytest.approx(1 - res.lower, abs=1e-15)


def test_confidence_must_be_one_dimensional() -> None:
    with pytest.raises(ValueError, match=r"^confidence: expected shape \(N,\)"):
        auroc_interval(torch.rand(4, 2, dtype=torch.float64), torch.ones(4, 2).long())
