"""Score a trained policy: play ``per_context`` rounds in every context (sampling answers and
confidences from the policy, as in training) and measure the calibration of the stated
confidence against the outcomes (reliability table and ECE, ``reading="binary"`` on
``(q, 1[correct])``) and against the known truth (:func:`true_calibration_error` with the
true probability that each chosen answer is right: no label noise), plus the exact mean
stated confidence per context beside the probability of being right."""

from __future__ import annotations

from typing import Any

import torch

from recipes.calibrated_rewards.bandit import Bandit
from recipes.calibrated_rewards.policy import Policy
from torchcal import ReliabilityTable
from torchcal.functional import reliability_table, true_calibration_error

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(
    policy: Policy, bandit: Bandit, *, seed: int, per_context: int = 5000, n_bins: int = 20
) -> tuple[dict[str, Any], ReliabilityTable]:
    """The policy's numbers (a JSON-ready dict) and its reliability table. The command
    line's ``--eval.*`` options are ``per_context`` and ``n_bins``.

    Args:
        policy: the trained policy.
        bandit: the truth it was trained on.
        seed: seed of the evaluation rounds.
        per_context: rounds played in each context.
        n_bins: equal-width bins of the reliability table (the grid size puts each stated
            value in a bin of its own).

    Example:
        >>> from recipes.calibrated_rewards.bandit import confidence_grid, make_bandit
        >>> b = make_bandit(4, 1)
        >>> numbers, table = evaluate(Policy(4, 1, confidence_grid(4)), b, seed=0,
        ...                           per_context=50, n_bins=4)
        >>> table.n, len(numbers["contexts"])
        (200, 4)
    """
    if isinstance(per_context, bool) or not isinstance(per_context, int) or per_context < 1:
        raise ValueError(f"eval.per_context: expected an int >= 1, got {per_context!r}")
    g = torch.Generator().manual_seed(seed)
    context = torch.arange(bandit.n_contexts).repeat_interleave(per_context)
    r = policy.play(bandit, context, g)
    table = reliability_table(
        r.confidence, r.correct, n_bins=n_bins, reading="binary", input="probs"
    )
    true_ce = true_calibration_error(r.confidence, bandit.p[r.context, r.answer], n_bins=n_bins)
    mean_q, p_correct = policy.mean_confidence(), policy.probability_correct(bandit)
    gap = mean_q - p_correct
    numbers = {
        "ece": table.ece,
        "true_ce": float(true_ce),
        "mean_confidence": float(r.confidence.mean()),
        "accuracy": float(r.correct.mean()),
        "best_answer_rate": float(policy.answer_probs()[:, 0].mean()),
        "max_abs_context_gap": float(gap.abs().max()),
        "mean_abs_context_gap": float(gap.abs().mean()),
        "contexts": [
            {"p_best": pb, "p_correct": pc, "mean_confidence": mq, "gap": d}
            for pb, pc, mq, d in zip(
                bandit.p[:, 0].tolist(), p_correct.tolist(), mean_q.tolist(), gap.tolist()
            )
        ],
        "reliability": table.to_dict(),
    }
    return numbers, table
