"""Command line: ``python -m recipes.calibrated_rewards`` (defaults) or ``--config
configs/rl/calibrated_rewards.yaml``; every option can be overridden (``--seed 3
--train.steps 300 --eval.per_context 2000 --plots false --out runs/rl``).

jsonargparse reads each group's options from the signature of the callable that takes them:
``--bandit.*`` from :func:`~recipes.calibrated_rewards.bandit.make_bandit`, ``--train.*`` from
:func:`~recipes.calibrated_rewards.policy.train_policy`, ``--eval.*`` from
:func:`~recipes.calibrated_rewards.evaluate.evaluate`.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from recipes._common import TIMING_KEY, environment, options, run_cli, tidy_help
from recipes.calibrated_rewards.arms import ARMS
from recipes.calibrated_rewards.bandit import confidence_grid, make_bandit
from recipes.calibrated_rewards.evaluate import evaluate
from recipes.calibrated_rewards.policy import train_policy
from recipes.calibrated_rewards.report import write_reports

__all__ = ["build_parser", "main", "run"]

DEFAULT_OUT = os.path.join("runs", "rl", "calibrated_rewards")


def build_parser() -> Any:
    """The jsonargparse parser (see the module docstring)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(
        prog="python -m recipes.calibrated_rewards",
        description="RL of a stated confidence: a proper reward calibrates, an improper one "
        "does not.",
        default_env=False,
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML config file")
    parser.add_argument("--seed", type=int, default=0, help="seed of everything random")
    parser.add_argument("--out", type=Optional[str], default=None, help=f"default {DEFAULT_OUT}")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--progress", type=bool, default=True, help="show progress bars")
    parser.add_argument("--plots", type=bool, default=True, help="write reliability.png")
    parser.add_argument("--grid_size", type=int, default=20, help="stated confidence values")
    parser.add_function_arguments(make_bandit, "bandit")
    parser.add_function_arguments(
        train_policy, "train", skip={"bandit", "reward", "grid", "seed", "progress", "desc"}
    )
    parser.add_function_arguments(evaluate, "eval", skip={"policy", "bandit", "seed"})
    return tidy_help(parser, {"bandit": make_bandit, "train": train_policy, "eval": evaluate})


def _run(cfg: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    t0 = time.perf_counter()
    bandit = make_bandit(**options(make_bandit, cfg.bandit))
    grid = confidence_grid(cfg.grid_size)
    arms, tables = {}, {}
    for name, (reward, is_proper) in ARMS.items():
        policy, history = train_policy(
            bandit,
            reward,
            grid,
            seed=cfg.seed,
            progress=cfg.progress,
            desc=name,
            **options(train_policy, cfg.train),
        )
        numbers, tables[name] = evaluate(
            policy, bandit, seed=cfg.seed + 1, **options(evaluate, cfg.eval)
        )
        training = {"final_mean_reward": history["mean_reward"][-1], **history}
        arms[name] = {"is_proper": is_proper, **numbers, "training": training}
    report = {
        "seed": cfg.seed,
        "config": {k: v for k, v in cfg.as_dict().items() if k not in ("out", "config")},
        "bandit": {**vars(cfg.bandit), "p": bandit.p.tolist()},
        "grid": grid.tolist(),
        "eval_rounds": bandit.n_contexts * cfg.eval.per_context,
        "arms": arms,
        TIMING_KEY: {"total_seconds": time.perf_counter() - t0},
    }
    return report, tables


def run(cfg: Any) -> dict[str, Any]:
    """Train both arms, evaluate them and write the reports; returns the report (with
    ``output_dir``). ``cfg`` is the parsed namespace of :func:`build_parser`."""
    with environment(cfg.threads):
        report, tables = _run(cfg)
    out = cfg.out or DEFAULT_OUT
    write_reports(out, report, tables, plots=cfg.plots)
    return {**report, "output_dir": out}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status: 0, or 2 on bad options."""
    report = run_cli(build_parser(), run, argv)
    if report is None:
        return 2
    for name, a in report["arms"].items():
        print(
            f"{name:>18} (is_proper={a['is_proper']}): ECE {a['ece']:.4f}, true CE "
            f"{a['true_ce']:.4f}, mean stated q {a['mean_confidence']:.3f} vs accuracy "
            f"{a['accuracy']:.3f}, best answer {a['best_answer_rate']:.3f}"
        )
    print(f"{report[TIMING_KEY]['total_seconds']:.1f} s; reports in {report['output_dir']}")
    return 0
