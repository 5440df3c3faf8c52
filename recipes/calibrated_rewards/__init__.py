"""Calibrated rewards: reinforcement learning of a stated confidence with a known truth.

A contextual bandit whose every answer has a known probability of being right; a policy that
answers and states a confidence from a grid; REINFORCE with (a) the proper
:func:`torchcal.rewards.correctness_brier_reward` and (b) the improper control ``q *
1[correct]``. The first learns to state the probability of being right, the second to state
the largest confidence it can.

Run ``python -m recipes.calibrated_rewards`` (or ``--config
configs/rl/calibrated_rewards.yaml``). Modules: :mod:`.bandit` (the truth), :mod:`.policy`
(the policy and REINFORCE), :mod:`.arms` (the two rewards), :mod:`.evaluate` (reliability of
the stated confidence), :mod:`.report` (outputs), :mod:`.cli` (the command).
"""
