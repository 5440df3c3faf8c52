"""The RL demo (issue 13, Build 4): the bandit's truth, the two arms' expected rewards by brute
force, the policy's probabilities against an independent numpy computation, determinism per
seed, argument errors, and a test-sized run in which the proper reward calibrates (ECE <= 0.05)
and the improper one does not (ECE >= 0.2, mean stated confidence near 1)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from recipes.calibrated_rewards.arms import ARMS, improper_reward
from recipes.calibrated_rewards.bandit import confidence_grid, make_bandit
from recipes.calibrated_rewards.cli import main
from recipes.calibrated_rewards.evaluate import evaluate
from recipes.calibrated_rewards.policy import Policy, train_policy

TEST_SIZE = [
    "--train.steps", "300", "--train.batch_size", "1000", "--eval.per_context", "2000",
    "--progress", "false",
]  # fmt: skip


def test_bandit_truth_and_outcome_frequencies():
    b = make_bandit(n_contexts=5, n_answers=3, p_low=0.1, p_high=0.9, answer_decay=0.5)
    want = np.linspace(0.1, 0.9, 5)[:, None] * 0.5 ** np.arange(3)
    np.testing.assert_allclose(b.p.numpy(), want, rtol=0, atol=1e-15)
    n = 40_000
    ctx = torch.arange(5).repeat_interleave(n)
    ans = torch.full_like(ctx, 1)
    y = b.outcomes(ctx, ans, torch.Generator().manual_seed(0)).reshape(5, n).mean(1).numpy()
    p = want[:, 1]
    assert np.all(np.abs(y - p) < 5 * np.sqrt(p * (1 - p) / n))


def test_grid_values_sit_in_their_own_bins():
    grid = confidence_grid(20)
    np.testing.assert_allclose(grid.numpy(), (np.arange(20) + 0.5) / 20, rtol=0, atol=0)
    assert torch.equal(torch.floor(grid * 20).long(), torch.arange(20))


@pytest.mark.parametrize("p", [0.06, 0.21, 0.37, 0.49, 0.74, 0.96])  # no ties on the grid
def test_arms_expected_reward_maximisers_by_brute_force(p):
    """Expected reward over the grid, summed by hand from the two outcomes in float64: the
    proper arm's best statement is the grid value nearest p, the improper arm's the largest."""
    q = confidence_grid(20)
    one, zero = torch.ones_like(q), torch.zeros_like(q)
    for name, (fn, tag) in ARMS.items():
        expected = (p * fn(q, one) + (1 - p) * fn(q, zero)).numpy()
        qn = q.numpy()
        closed = p**2 - (qn - p) ** 2 if tag == "strict" else qn * p
        np.testing.assert_allclose(expected, closed, rtol=0, atol=1e-12)
        best = qn[np.argmax(expected)]
        if tag == "strict":
            assert best == qn[np.argmin(np.abs(qn - p))]
        else:
            assert name == "improper" and best == qn[-1]


def test_improper_reward_values_and_shape_check():
    q = torch.tensor([0.3, 0.8], dtype=torch.float64)
    assert improper_reward(q, torch.tensor([1, 0])).tolist() == [0.3, 0.0]
    with pytest.raises(ValueError, match="^confidence"):
        improper_reward(q, torch.tensor([[1.0, 0.0]]))


def _numpy_policy(policy: Policy) -> tuple[np.ndarray, np.ndarray]:
    grid = policy.grid.numpy()
    a = policy.answer_logits.detach().numpy()
    pa = np.exp(a - a.max(-1, keepdims=True))
    pa /= pa.sum(-1, keepdims=True)
    mu = 1 / (1 + np.exp(-policy.loc.detach().numpy()))
    lg = (
        -0.5
        * np.exp(policy.log_precision.detach().numpy())[..., None]
        * (grid - mu[..., None]) ** 2
    )
    pg = np.exp(lg - lg.max(-1, keepdims=True))
    pg /= pg.sum(-1, keepdims=True)
    return pa, pg


def test_policy_probabilities_against_numpy():
    b = make_bandit(4, 2)
    policy = Policy(4, 2, confidence_grid(10))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for prm in policy.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g, dtype=torch.float64))
    pa, pg = _numpy_policy(policy)
    grid = policy.grid.numpy()
    np.testing.assert_allclose(policy.mean_confidence().numpy(), (pa * (pg @ grid)).sum(-1))
    np.testing.assert_allclose(policy.probability_correct(b).numpy(), (pa * b.p.numpy()).sum(-1))
    r = policy.play(b, torch.tensor([0, 1, 2, 3, 3]), g)
    c, a, lv = r.context.numpy(), r.answer.numpy(), r.level.numpy()
    want = np.log(pa[c, a]) + np.log(pg[c, a, lv])
    np.testing.assert_allclose(r.log_prob.detach().numpy(), want, rtol=1e-12)
    assert torch.equal(r.confidence, policy.grid[r.level])


def test_training_is_deterministic_per_seed():
    b, grid = make_bandit(3, 2), confidence_grid(8)
    runs = [
        train_policy(
            b, ARMS["correctness_brier"][0], grid, seed=s, steps=15, batch_size=64, progress=False
        )  # fmt: skip
        for s in (5, 5, 6)
    ]
    (p1, h1), (p2, h2), (p3, _) = runs
    for x, y in zip(p1.parameters(), p2.parameters()):
        assert torch.equal(x, y)
    assert h1 == h2
    assert not all(torch.equal(x, z) for x, z in zip(p1.parameters(), p3.parameters()))
    n1, _ = evaluate(p1, b, seed=0, per_context=100, n_bins=8)
    n2, _ = evaluate(p2, b, seed=0, per_context=100, n_bins=8)
    assert n1 == n2


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: make_bandit(n_contexts=0), "n_contexts"),
        (lambda: make_bandit(p_low=-0.1), "p_low"),
        (lambda: make_bandit(p_low=0.6, p_high=0.5), "p_high"),
        (lambda: make_bandit(answer_decay=1.0), "answer_decay"),
        (lambda: confidence_grid(1), "grid_size"),
        (
            lambda: train_policy(
                make_bandit(2, 1), improper_reward, confidence_grid(4), seed=0, steps=0
            ),
            "train.steps",
        ),  # fmt: skip
        (
            lambda: train_policy(
                make_bandit(2, 1),
                improper_reward,
                confidence_grid(4),
                seed=0,
                baseline_momentum=1.0,
            ),
            "train.baseline_momentum",
        ),  # fmt: skip
        (
            lambda: evaluate(
                Policy(2, 1, confidence_grid(4)), make_bandit(2, 1), seed=0, per_context=0
            ),
            "eval.per_context",
        ),  # fmt: skip
    ],
)
def test_bad_arguments_name_themselves(call, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        call()


def test_cli_bad_option_exits_2(capsys):
    assert main(["--threads", "0", "--plots", "false", "--out", "unused"]) == 2
    assert capsys.readouterr().err.startswith("error: threads")


@pytest.fixture(scope="module")
def test_sized_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rl")
    assert main(["--out", str(out), *TEST_SIZE]) == 0
    return out, json.loads((out / "report.json").read_text())


def test_proper_reward_calibrates_improper_does_not(test_sized_run):
    _, rep = test_sized_run
    proper, improper = rep["arms"]["correctness_brier"], rep["arms"]["improper"]
    assert proper["is_proper"] == "strict" and improper["is_proper"] == "no"
    assert proper["ece"] <= 0.05 and proper["true_ce"] <= 0.05
    assert improper["ece"] >= 0.2 and improper["true_ce"] >= 0.2
    # the reason: q * 1[correct] pays most for the largest confidence, whatever the truth
    assert improper["mean_confidence"] >= 0.9 > improper["accuracy"] + 0.3
    assert abs(proper["mean_confidence"] - proper["accuracy"]) < 0.02
    # the correctness term still teaches both to pick the better answer
    assert proper["best_answer_rate"] > 0.95 and improper["best_answer_rate"] > 0.95
    assert rep["eval_rounds"] == 20 * 2000 == proper["reliability"]["n"]


def test_reports_are_written(test_sized_run):
    out, rep = test_sized_run
    md = (out / "report.md").read_text()
    assert "correctness_brier (is_proper=strict)" in md and "| bin | lo |" in md
    assert "improper (is_proper=no)" in (out / "report.txt").read_text()
    assert (out / "reliability.png").stat().st_size > 10_000
    for arm in rep["arms"].values():
        assert len(arm["contexts"]) == 20 and len(arm["training"]["mean_reward"]) == 300
        assert math.isclose(arm["ece"], arm["reliability"]["ece"], rel_tol=1e-9)


def test_evaluate_scores_the_chosen_answer_against_its_own_truth():
    # an untrained policy picks either answer half the time: the truth of each round is the
    # probability that the answer it chose is right (not that of the best answer)
    bandit = make_bandit(4, 2)
    policy = Policy(4, 2, confidence_grid(5))
    numbers, table = evaluate(policy, bandit, seed=3, per_context=300, n_bins=5)
    context = torch.arange(4).repeat_interleave(300)
    r = policy.play(bandit, context, torch.Generator().manual_seed(3))  # the same rounds
    assert 0.3 < float((r.answer == 1).double().mean()) < 0.7
    truth = bandit.p[r.context, r.answer]
    # brute force: 5 equal-width bins, sum_b |sum conf - sum truth| / N
    b = torch.clamp((r.confidence * 5).floor().long(), max=4)
    gap = sum(abs(float(r.confidence[b == k].sum() - truth[b == k].sum())) for k in range(5))
    assert numbers["true_ce"] == pytest.approx(gap / len(truth), rel=1e-9, abs=1e-12)
    assert table.n == 1200 and numbers["accuracy"] == pytest.approx(float(r.correct.mean()))
