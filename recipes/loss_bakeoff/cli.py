"""The loss bake-off: one Lightning fit per (objective, seed), reported in runs/bakeoff/<dataset>.

    python -m recipes.loss_bakeoff --config configs/bakeoff/synthetic.yaml
    python -m recipes.loss_bakeoff --config configs/bakeoff/digits.yaml --seeds 0 --losses [log_score,flsd53] --model.epochs 10 --progress false --report.plots false

Every option below can be set in the YAML or overridden on the command line.

jsonargparse reads each group's options from the signature of the callable that takes them:
``--data.*`` from :func:`~recipes.loss_bakeoff.data.make_data`, ``--model.*`` from
:func:`~recipes.loss_bakeoff.model.train_one`, ``--report.*`` from :func:`evaluate_run` and
:func:`~recipes.loss_bakeoff.report.write_reports`; ``--weights`` overrides the regulariser
weights of :data:`~recipes.loss_bakeoff.losses.PAPER_WEIGHTS`."""

from __future__ import annotations

import os
import time
from typing import Any, Optional, Union

import torch

from recipes._common import TIMING_KEY, environment, options, run_cli, tidy_help, write_timed
from recipes.loss_bakeoff.data import BakeoffData, make_data
from recipes.loss_bakeoff.evaluate import ece_noise_floor, reliability_curve, score
from recipes.loss_bakeoff.losses import LOSS_NAMES, build_loss, properness
from recipes.loss_bakeoff.model import Trained, train_one
from recipes.loss_bakeoff.report import aggregate, write_reports

__all__ = ["build_parser", "evaluate_run", "main", "run"]


def build_parser() -> Any:
    """The jsonargparse parser (see the module docstring)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(
        prog="python -m recipes.loss_bakeoff",
        description="\n\n".join(__doc__.split("\n\n")[:3]),
        default_env=False,
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML config file")
    parser.add_argument(
        "--seeds",
        type=Union[int, list[int]],
        default=[0, 1, 2],
        help="training seeds: one (--seeds 0) or a list (--seeds [0,1,2])",
    )
    parser.add_argument(
        "--losses", type=list[str], default=list(LOSS_NAMES), help="the objectives to compare"
    )
    parser.add_argument(
        "--weights", type=dict[str, float], default={}, help="regulariser weights to override"
    )
    parser.add_argument(
        "--output_dir", type=Optional[str], default=None, help="default runs/bakeoff/<dataset>"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--progress", type=bool, default=True, help="show progress bars")
    parser.add_function_arguments(make_data, "data", skip={"seed"})
    parser.add_function_arguments(
        train_one,
        "model",
        skip={"objective", "train", "val", "num_classes", "seed", "progress", "desc"},
    )
    parser.add_function_arguments(evaluate_run, "report", skip={"data", "trained", "seed"})
    parser.add_function_arguments(
        write_reports, "report", as_group=False, skip={"output_dir", "report"}
    )
    return tidy_help(parser, {"data": make_data, "model": train_one, "report": evaluate_run})


def evaluate_run(
    data: BakeoffData,
    trained: Trained,
    seed: int,
    n_bins: int = 15,
    floor_draws: int = 200,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Test metrics of one trained network before and after its temperature, and its
    reliability curves: ``(numbers, curves)``. Without a known truth (digits) the numbers
    also hold the ECE noise floor of the model's own confidences. ``numbers["picked"]``
    holds, for each checkpoint selection, its epoch, its T and its test metrics after that
    T. The command line's ``--report.*`` options are ``n_bins`` and ``floor_draws``.

    Args:
        data: the splits.
        trained: the network and its fitted temperature.
        seed: seed of the floor's simulated labels.
        n_bins: equal-width bins of every binned metric.
        floor_draws: simulated label sets of the ECE noise floor (digits).
    """
    x, y = data.test
    with torch.no_grad():
        z = trained.net(x).to(torch.float64)
    last = trained.val_history[-1] if trained.val_history else {}
    numbers: dict[str, Any] = {
        "temperature": trained.temperature,
        "converged": trained.converged,
        # CalibrationMonitor's last validation epoch (before T): what training saw
        "val_monitor": {k: last.get(k) for k in ("epoch", "ece", "ece_debiased", "nll")},
    }
    # the checkpoints picked by val/nll and by val/refinement_nll, each after its own T
    numbers["picked"] = {}
    for name, pick in trained.picks.items():
        with torch.no_grad():
            zp = pick.net(x).to(torch.float64) / pick.temperature
        numbers["picked"][name] = {
            "epoch": pick.epoch,
            "temperature": pick.temperature,
            "after": score(zp, y, data.test_truth, n_bins=n_bins),
        }
    curves = {}
    for stage, t in (("before", 1.0), ("after", trained.temperature)):
        zt = z / t
        numbers[stage] = score(zt, y, data.test_truth, n_bins=n_bins)
        curves[stage] = reliability_curve(zt, y, n_bins=n_bins)
        if data.test_truth is None:
            conf = torch.softmax(zt, dim=1).amax(dim=1)
            numbers[f"ece_floor_{stage}"] = ece_noise_floor(
                conf, n_bins=n_bins, draws=floor_draws, seed=seed
            )
    return numbers, curves


def _run(cfg: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    if isinstance(cfg.seeds, int):  # `--seeds 0`: one seed
        cfg.seeds = [cfg.seeds]
    if not cfg.seeds:
        raise ValueError("seeds: expected at least one seed")
    for name in cfg.losses:
        build_loss(name, cfg.weights)  # check names and weights before training
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in cfg.losses}
    curves: dict[str, Any] = {}
    t_train = 0.0
    for seed in cfg.seeds:
        data = make_data(seed, **options(make_data, cfg.data))
        for i, name in enumerate(cfg.losses):
            t = time.perf_counter()
            trained = train_one(
                build_loss(name, cfg.weights),
                data.train,
                data.val,
                data.num_classes,
                seed=seed * 1000 + i,
                progress=cfg.progress,
                desc=f"[seed {seed}] {name}",
                **options(train_one, cfg.model),
            )
            t_train += time.perf_counter() - t
            numbers, c = evaluate_run(data, trained, seed, **options(evaluate_run, cfg.report))
            runs[name].append({"seed": seed, **numbers})
            curves.setdefault(name, c)  # the first seed's curves go into the plot
    rows = [aggregate(n, properness(build_loss(n, cfg.weights)), runs[n]) for n in cfg.losses]
    report = {
        "dataset": data.name,
        "seeds": list(cfg.seeds),
        "sizes": data.sizes(),
        "bayes_accuracy": data.bayes_accuracy,
        "n_bins": cfg.report.n_bins,
        "floor_draws": cfg.report.floor_draws,
        "config": {k: v for k, v in cfg.as_dict().items() if k not in ("output_dir", "config")},
        "rows": rows,
        "curves": curves,
    }
    report[TIMING_KEY] = {"train_seconds": t_train, "total_seconds": time.perf_counter() - t0}
    return report


def run(cfg: Any) -> dict[str, Any]:
    """Train every loss for every seed, score, write the reports; returns the report (with
    ``output_dir``). ``cfg`` is the parsed namespace of :func:`build_parser`."""
    with environment(cfg.threads):
        report = _run(cfg)
        output_dir = cfg.output_dir or os.path.join("runs", "bakeoff", report["dataset"])
        write_timed(write_reports, output_dir, report, **options(write_reports, cfg.report))
    return {**report, "output_dir": output_dir}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status: 0, or 2 on bad options."""
    report = run_cli(build_parser(), run, argv)
    if report is None:
        return 2
    from recipes.loss_bakeoff.report import render

    print(render(report), end="")
    print(f"reports written to {report['output_dir']}")
    return 0
