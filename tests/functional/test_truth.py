"""``true_calibration_error`` and ``kl_to_truth`` against hand-worked numbers, a numpy float64
brute force (a Python loop over bins and items) and the label-based ECE they generalise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchcal.functional import calibration_error, kl_to_truth, true_calibration_error


def _brute_true_ce(conf: np.ndarray, q: np.ndarray, n_bins: int, norm: str) -> float:
    """Direct definition, one item at a time: bin by floor(c * B) (1.0 in the last bin)."""
    sums = {}
    for c, p in zip(conf.tolist(), q.tolist()):
        b = min(int(math.floor(c * n_bins)), n_bins - 1)
        n, sc, sq = sums.get(b, (0, 0.0, 0.0))
        sums[b] = (n + 1, sc + c, sq + p)
    N = len(conf)
    gaps = {b: (n, abs(sc / n - sq / n)) for b, (n, sc, sq) in sums.items()}
    if norm == "l1":
        return sum(n / N * g for n, g in gaps.values())
    if norm == "l2":
        return math.sqrt(sum(n / N * g * g for n, g in gaps.values()))
    return max(g for _, g in gaps.values())


def test_hand_worked_case():
    # 3 classes, 4 items. p* rows and predicted rows; the prediction is the argmax of p.
    p_star = torch.tensor(
        [[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.5, 0.4, 0.1]], dtype=torch.float64
    )
    p = torch.tensor(
        [[0.9, 0.05, 0.05], [0.3, 0.65, 0.05], [0.1, 0.3, 0.6], [0.35, 0.45, 0.2]],
        dtype=torch.float64,
    )
    conf, pred = p.max(dim=1)  # 0.9, 0.65, 0.6, 0.45 ; preds 0, 1, 2, 1
    q = p_star.gather(1, pred[:, None])[:, 0]  # 0.7, 0.6, 0.6, 0.4
    assert q.tolist() == [0.7, 0.6, 0.6, 0.4]
    # B = 2: bin 0 {0.45}: |0.45 - 0.4| = 0.05; bin 1 {0.9, 0.65, 0.6}: mean conf 2.15/3,
    # mean q 1.9/3, gap 0.25/3. l1 = 1/4 * 0.05 + 3/4 * 0.25/3 = 0.075
    assert float(true_calibration_error(conf, q, n_bins=2)) == pytest.approx(0.075, abs=1e-15)
    # l2 = sqrt(1/4 * 0.05^2 + 3/4 * (0.25/3)^2); max = 0.25/3
    l2 = math.sqrt(0.25 * 0.05**2 + 0.75 * (0.25 / 3) ** 2)
    assert float(true_calibration_error(conf, q, n_bins=2, norm="l2")) == pytest.approx(l2)
    assert float(true_calibration_error(conf, q, n_bins=2, norm="max")) == pytest.approx(0.25 / 3)
    # B = 10: every item alone in its bin -> mean |c - q| = (0.2 + 0.05 + 0 + 0.05) / 4
    assert float(true_calibration_error(conf, q, n_bins=10)) == pytest.approx(0.075)
    # KL(p* || p) by hand, row by row
    kl = (
        sum(
            sum(a * math.log(a / b) for a, b in zip(ps, pp))
            for ps, pp in zip(p_star.tolist(), p.tolist())
        )
        / 4
    )
    assert float(kl_to_truth(p.log(), p_star)) == pytest.approx(kl, rel=1e-12)


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
@pytest.mark.parametrize("n_bins", [1, 7, 15])
def test_brute_force(norm, n_bins):
    rng = np.random.default_rng(n_bins)
    conf = rng.uniform(0.2, 1.0, 500)
    conf[:5] = [1.0, 0.2, 3 / 7, 4 / 15, 0.5]  # edges: 1.0 in the last bin, k / B
    q = rng.uniform(0, 1, 500)
    got = true_calibration_error(
        torch.from_numpy(conf), torch.from_numpy(q), n_bins=n_bins, norm=norm
    )
    assert got.dtype == torch.float64
    assert float(got) == pytest.approx(_brute_true_ce(conf, q, n_bins, norm), rel=1e-12)


def test_equals_the_ece_when_the_truth_is_the_label():
    """With q = 1[correct] the true calibration error is the label-based ECE."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(400, 5, generator=g, dtype=torch.float64) * 2
    target = torch.randint(0, 5, (400,), generator=g)
    conf, pred = logits.softmax(1).max(1)
    q = (pred == target).double()
    ece = calibration_error(logits, target, n_bins=15)
    assert float(true_calibration_error(conf, q)) == pytest.approx(float(ece), rel=1e-12)


def test_zero_for_a_truthful_model_and_positive_ece():
    """Confidence equal to the truth: exactly 0, while the ECE of sampled labels is not."""
    g = torch.Generator().manual_seed(1)
    q = torch.rand(2000, generator=g, dtype=torch.float64) * 0.5 + 0.5
    assert float(true_calibration_error(q, q)) == 0.0
    y = (torch.rand(2000, generator=g, dtype=torch.float64) < q).long()
    assert float(calibration_error(q, y, reading="binary", input="probs")) > 0.005


def test_kl_brute_force_and_zero_mass():
    rng = np.random.default_rng(3)
    ps = rng.dirichlet(np.ones(4), 50)
    ps[0] = [0.0, 0.5, 0.5, 0.0]  # 0 log 0 = 0, also where p = 0 (log p = -inf)
    p = rng.dirichlet(np.ones(4), 50)
    p[0] = [0.0, 0.25, 0.75, 0.0]
    with np.errstate(divide="ignore"):
        logp = np.log(p)
    ref = np.mean([sum(a * math.log(a / b) for a, b in zip(r, s) if a > 0) for r, s in zip(ps, p)])
    got = kl_to_truth(torch.from_numpy(logp), torch.from_numpy(ps))
    assert math.isfinite(float(got))
    assert float(got) == pytest.approx(ref, rel=1e-12)
    assert float(kl_to_truth(torch.from_numpy(ps[1:]).log(), torch.from_numpy(ps[1:]))) == 0.0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: true_calibration_error(torch.tensor([1.2]), torch.tensor([0.5])), "^confidence"),
        (lambda: true_calibration_error(torch.tensor([0.5]), torch.tensor([-0.1])), "^true_prob"),
        (lambda: true_calibration_error(torch.tensor([float("nan")]), torch.tensor([0.5])), "^confidence"),
        (lambda: true_calibration_error(torch.tensor([1]), torch.tensor([0.5])), "^confidence"),
        (lambda: true_calibration_error(torch.tensor([0.5]), torch.tensor([0.5, 0.5])), "^true_prob"),
        (lambda: true_calibration_error(torch.tensor([]), torch.tensor([])), "^confidence"),
        (lambda: true_calibration_error(torch.tensor([0.5]), torch.tensor([0.5]), n_bins=0), "^n_bins"),
        (lambda: true_calibration_error(torch.tensor([0.5]), torch.tensor([0.5]), norm="l3"), "^norm"),
        (lambda: kl_to_truth(torch.zeros(2, 2), torch.full((2, 3), 1 / 3)), "^true_probs"),
        (lambda: kl_to_truth(torch.zeros(2, 2), torch.full((2, 2), 0.4)), "^true_probs"),
        (lambda: kl_to_truth(torch.tensor([[float("nan"), 0.0]]), torch.full((1, 2), 0.5)), "^log_probs"),
        (lambda: kl_to_truth(torch.zeros(2), torch.full((2,), 0.5)), "^log_probs"),
    ],
)  # fmt: skip
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
