"""The policy and its training. In context ``k`` the policy picks an answer
``a ~ softmax(answer_logits[k])`` (a table of logits) and states a confidence ``q = grid[g]``
with ``g ~ softmax(logits_g)``, ``logits_g = -precision[k, a] * (grid[g] - mean[k, a])^2 / 2``:
a discretised Gaussian over the grid whose centre ``mean = sigmoid(loc)`` and ``precision =
exp(log_precision)`` are learned per (context, answer). It is trained by REINFORCE (Williams
1992) with a per-context baseline, a batch of rounds per step, no Python loop over rounds.

Why not a free table of ``G`` logits per (context, answer)? Neighbouring grid values differ in
expected reward by about ``0.05^2``, far below the reward's noise, so a free table collapses
early onto whichever value got lucky (on the default bandit it stated 0.875 for p = 0.95 and
0.425 for p = 0.52 after a million rounds). Two parameters per head pool the evidence of every
round: each round moves the centre towards ``p`` and the Brier term's variance penalty
sharpens it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from recipes.calibrated_rewards.bandit import Bandit

__all__ = ["INIT_LOG_PRECISION", "Policy", "Rounds", "train_policy"]

Reward = Callable[[Tensor, Tensor], Tensor]
INIT_LOG_PRECISION = 3.0  # precision e^3 ~ 20: standard deviation ~ 0.22, a broad start


@dataclass
class Rounds:
    """One batch of rounds: ``context``, ``answer``, ``level`` (index into the grid) as int64,
    the stated ``confidence`` and ``correct`` (float64), and the policy's ``log_prob`` of the
    answer and level (with gradient)."""

    context: Tensor
    answer: Tensor
    level: Tensor
    confidence: Tensor
    correct: Tensor
    log_prob: Tensor = field(repr=False)


class Policy(nn.Module):
    """Answer logits ``(K, A)`` (zero: uniform) and a discretised Gaussian confidence head per
    (context, answer) (centre 0.5, broad), float64 parameters.

    Example:
        >>> from recipes.calibrated_rewards.bandit import confidence_grid, make_bandit
        >>> policy = Policy(3, 2, confidence_grid(4))
        >>> g = torch.Generator().manual_seed(0)
        >>> r = policy.play(make_bandit(3, 2), torch.tensor([0, 2]), g)
        >>> r.confidence.shape, r.log_prob.shape
        (torch.Size([2]), torch.Size([2]))
        >>> [round(v, 12) for v in policy.mean_confidence().tolist()]  # symmetric start
        [0.5, 0.5, 0.5]
    """

    def __init__(self, n_contexts: int, n_answers: int, grid: Tensor) -> None:
        super().__init__()
        shape = (n_contexts, n_answers)
        self.register_buffer("grid", grid.to(torch.float64))
        self.answer_logits = nn.Parameter(torch.zeros(shape, dtype=torch.float64))
        self.loc = nn.Parameter(torch.zeros(shape, dtype=torch.float64))
        self.log_precision = nn.Parameter(
            torch.full(shape, INIT_LOG_PRECISION, dtype=torch.float64)
        )

    def answer_probs(self) -> Tensor:
        """``pi(a | k)``, ``(K, A)``."""
        return torch.softmax(self.answer_logits, -1)

    def level_logits(self) -> Tensor:
        """Logits of ``pi(g | k, a)``, ``(K, A, G)``."""
        centre = torch.sigmoid(self.loc)[..., None]
        return -0.5 * self.log_precision.exp()[..., None] * (self.grid - centre) ** 2

    def level_probs(self) -> Tensor:
        """``pi(g | k, a)``, ``(K, A, G)``."""
        return torch.softmax(self.level_logits(), -1)

    def play(self, bandit: Bandit, context: Tensor, generator: torch.Generator) -> Rounds:
        """Answer and state a confidence in each ``context`` (int64 ``(N,)``), then draw the
        outcomes from ``bandit``: one vectorised call for the whole batch."""
        log_pa = torch.log_softmax(self.answer_logits[context], -1)
        answer = torch.multinomial(log_pa.detach().exp(), 1, generator=generator)[:, 0]
        log_pg = torch.log_softmax(self.level_logits()[context, answer], -1)
        level = torch.multinomial(log_pg.detach().exp(), 1, generator=generator)[:, 0]
        log_prob = log_pa.gather(1, answer[:, None])[:, 0] + log_pg.gather(1, level[:, None])[:, 0]
        correct = bandit.outcomes(context, answer, generator)
        return Rounds(context, answer, level, self.grid[level], correct, log_prob)

    @torch.no_grad()
    def mean_confidence(self) -> Tensor:
        """Exact mean stated confidence per context, ``sum_a pi(a|k) sum_g pi(g|k,a)
        grid[g]`` (float64 ``(K,)``; no sampling)."""
        per_answer = self.level_probs() @ self.grid
        return (self.answer_probs() * per_answer).sum(-1)

    @torch.no_grad()
    def probability_correct(self, bandit: Bandit) -> Tensor:
        """Exact probability that the policy's answer is right, per context,
        ``sum_a pi(a|k) p[k, a]`` (float64 ``(K,)``)."""
        return (self.answer_probs() * bandit.p).sum(-1)


def _check(name: str, value: object, integer: bool, low: float, high: float) -> None:
    kinds = int if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value < high:  # type: ignore[operator]
        kind = "an int" if integer else "a float"
        raise ValueError(f"{name}: expected {kind} in [{low}, {high}), got {value!r}")


def train_policy(
    bandit: Bandit,
    reward: Reward,
    grid: Tensor,
    *,
    seed: int,
    steps: int = 1000,
    batch_size: int = 2000,
    lr: float = 0.05,
    baseline_momentum: float = 0.9,
    progress: bool = True,
    desc: str = "policy",
) -> tuple[Policy, dict[str, list[float]]]:
    """REINFORCE with a baseline: each step plays ``batch_size`` rounds in uniformly drawn
    contexts, scores them with ``reward(confidence, correct)`` and takes one Adam step
    (learning rate ``lr``, cosine-decayed to zero) on ``-mean((r - b[k]) * log pi(a, g | k))``,
    where ``b[k]`` is an exponential moving average of context ``k``'s mean reward, updated
    after the step. Seeded; returns the policy and the per-step ``mean_reward`` and
    ``mean_confidence`` of the rounds played. The command line's ``--train.*`` options are
    the keyword arguments from ``steps`` to ``baseline_momentum``.

    Example:
        >>> from recipes.calibrated_rewards.bandit import confidence_grid, make_bandit
        >>> b = make_bandit(2, 1)
        >>> pol, hist = train_policy(b, lambda q, y: q * y, confidence_grid(4), seed=0,
        ...                          steps=3, batch_size=8, progress=False)
        >>> len(hist["mean_reward"])
        3
    """
    _check("train.steps", steps, True, 1, math.inf)
    _check("train.batch_size", batch_size, True, 1, math.inf)
    _check("train.lr", lr, False, 1e-12, math.inf)
    _check("train.baseline_momentum", baseline_momentum, False, 0, 1)
    from tqdm.auto import tqdm

    g = torch.Generator().manual_seed(seed)
    k = bandit.n_contexts
    policy = Policy(k, bandit.n_answers, grid)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    baseline = torch.zeros(k, dtype=torch.float64)
    rewards = torch.empty(steps, dtype=torch.float64)
    confidences = torch.empty(steps, dtype=torch.float64)
    for step in tqdm(range(steps), desc=desc, disable=not progress, leave=False):
        context = torch.randint(k, (batch_size,), generator=g)
        rounds = policy.play(bandit, context, g)
        r = reward(rounds.confidence, rounds.correct).detach().double()
        loss = -((r - baseline[context]) * rounds.log_prob).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        n = torch.bincount(context, minlength=k)
        batch_mean = torch.bincount(context, weights=r, minlength=k) / n.clamp(min=1)
        update = baseline_momentum * baseline + (1 - baseline_momentum) * batch_mean
        baseline = torch.where(n > 0, update, baseline)
        rewards[step], confidences[step] = r.mean(), rounds.confidence.mean()
    history = {"mean_reward": rewards.tolist(), "mean_confidence": confidences.tolist()}
    return policy, history
