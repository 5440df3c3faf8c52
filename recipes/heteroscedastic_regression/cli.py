"""Five forecasts of a heteroscedastic regression, scored and recalibrated against the truth.

    python -m recipes.heteroscedastic_regression --config configs/regression/heteroscedastic.yaml
    python -m recipes.heteroscedastic_regression --seed 3 --data.n_eval 5000 --model.epochs 10 --report.plots false

Every option below can be set in the YAML or overridden on the command line.

As in the ComplEx recipe, jsonargparse reads each group's options from the signature of the
callable that takes them: ``--data.*`` from
:func:`~recipes.heteroscedastic_regression.data.make_data`, ``--model.*`` from
:func:`~recipes.heteroscedastic_regression.model.train_mlp`, ``--report.*`` from
:func:`run_forecasts` and :func:`~recipes.heteroscedastic_regression.report.write_reports`.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Optional

import torch

from recipes._common import TIMING_KEY, environment, options, run_cli, tidy_help, write_timed
from recipes.heteroscedastic_regression.data import (
    RegressionData,
    make_data,
    mean_true_variance,
    true_loc,
    true_scale,
)
from recipes.heteroscedastic_regression.forecasts import (
    LEVEL,
    EmpiricalForecast,
    Forecast,
    GaussianForecast,
    IntervalForecast,
    evaluate,
)
from recipes.heteroscedastic_regression.model import train_mlp
from recipes.heteroscedastic_regression.report import write_reports

__all__ = ["build_parser", "main", "reference_forecasts", "run", "run_forecasts"]

OBJECTIVES = ("nll", "crps")


def build_parser() -> Any:
    """The jsonargparse parser (see the module docstring)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(
        prog="python -m recipes.heteroscedastic_regression",
        description="\n\n".join(__doc__.split("\n\n")[:3]),
        default_env=False,
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML config file")
    parser.add_argument("--seed", type=int, default=0, help="seed of everything random")
    parser.add_argument(
        "--output_dir",
        type=Optional[str],
        default=None,
        help="where the reports go (default runs/regression/heteroscedastic)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--progress", type=bool, default=True, help="show progress bars")
    parser.add_function_arguments(make_data, "data", skip={"seed"})
    parser.add_function_arguments(
        train_mlp, "model", skip={"x", "y", "objective", "seed", "progress"}
    )
    parser.add_function_arguments(run_forecasts, "report", skip={"data", "networks", "seed"})
    parser.add_function_arguments(
        write_reports, "report", as_group=False, skip={"output_dir", "report"}
    )
    return tidy_help(parser, {"data": make_data, "model": train_mlp, "report": run_forecasts})


def reference_forecasts(data: RegressionData) -> dict[str, Forecast]:
    """Climatology (the empirical law of the past observations), homoscedastic
    ``N(2x, s_pool^2)`` with ``s_pool^2`` the exact mean true variance, and the truth.

    Example:
        >>> d = make_data(0, n_train=2, n_calibration=2, n_eval=3, n_past=4)
        >>> list(reference_forecasts(d))
        ['climatology', 'homoscedastic', 'heteroscedastic']
    """
    x, _ = data.eval
    pooled = torch.full_like(x, math.sqrt(mean_true_variance()))
    return {
        "climatology": EmpiricalForecast(data.past[1], len(x)),
        "homoscedastic": GaussianForecast(true_loc(x), pooled),
        "heteroscedastic": GaussianForecast(true_loc(x), true_scale(x)),
    }


@torch.no_grad()
def _predict(model: torch.nn.Module, x: torch.Tensor) -> GaussianForecast:
    loc, scale = model(x.float())
    return GaussianForecast(loc.double(), scale.double())


def _recalibrated(
    model: torch.nn.Module, objective: str, data: RegressionData
) -> tuple[dict[str, Forecast], dict[str, Any]]:
    """The network's forecast, after ``VarianceScaler`` (fitted with the network's own
    objective on the held-out split) and the normalised split-conformal 90 % interval."""
    from torchcal.scaling import SplitConformal, VarianceScaler

    cal, ev = _predict(model, data.calibration[0]), _predict(model, data.eval[0])
    y_cal = data.calibration[1]
    scaler = VarianceScaler(objective=objective)
    fit = scaler.fit(cal.loc, cal.scale, y_cal)
    with torch.no_grad():
        loc, scale = scaler(ev.loc, ev.scale)
    conformal = SplitConformal(alpha=1 - LEVEL, score="normalized")
    cfit = conformal.fit(cal.loc, y_cal, scale=cal.scale)
    lower, upper = conformal.predict(ev.loc, scale=ev.scale)
    name = f"mlp_{objective}"
    forecasts = {
        name: ev,
        f"{name}_scaled": GaussianForecast(loc.double(), scale.double()),
        f"{name}_conformal": IntervalForecast(lower.double(), upper.double()),
    }
    info = {
        "objective": objective,
        "variance_scale": scaler.scale_factor,
        "variance_fit_converged": bool(fit.converged),
        "conformal_quantile": cfit.quantiles[0],
        "conformal_rank": cfit.ranks[0],
    }
    return forecasts, info


def run_forecasts(
    data: RegressionData,
    networks: dict[str, torch.nn.Module],
    seed: int,
    pit_bins: int = 5,
    n_levels: int = 19,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Build and score every forecast on the evaluation points: ``(forecasts, curves,
    recalibration)``. The command line's ``--report.*`` options are ``pit_bins`` and
    ``n_levels``.

    Args:
        data: the recipe's data.
        networks: trained networks by objective (``'nll'``, ``'crps'``).
        seed: seed of the randomised ensemble PIT.
        pit_bins: equal bins of the PIT histogram (``pit_shares``, ``pit_ece``).
        n_levels: quantile levels ``k / (n_levels + 1)`` of the reliability curve.
    """
    if not isinstance(pit_bins, int) or pit_bins < 2:
        raise ValueError(f"report.pit_bins: expected an int >= 2, got {pit_bins!r}")
    if not isinstance(n_levels, int) or n_levels < 1:
        raise ValueError(f"report.n_levels: expected an int >= 1, got {n_levels!r}")
    forecasts = reference_forecasts(data)
    recal: dict[str, Any] = {}
    for objective, model in networks.items():
        more, recal[f"mlp_{objective}"] = _recalibrated(model, objective, data)
        forecasts.update(more)
    levels = torch.arange(1, n_levels + 1, dtype=torch.float64) / (n_levels + 1)
    g = torch.Generator().manual_seed(seed)
    x, y = data.eval
    numbers, curves = {}, {}
    for name, f in forecasts.items():
        numbers[name], curves[name] = evaluate(
            f, x, y, pit_bins=pit_bins, levels=levels, generator=g
        )
    return numbers, {"levels": levels.tolist(), "forecasts": curves}, recal


def _run(cfg: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    data = make_data(cfg.seed, **options(make_data, cfg.data))
    networks, training = {}, {}
    for i, objective in enumerate(OBJECTIVES):
        model, losses = train_mlp(
            *data.train,
            objective,
            seed=cfg.seed + 100 * i,
            progress=cfg.progress,
            **options(train_mlp, cfg.model),
        )
        networks[objective] = model
        training[f"mlp_{objective}"] = {"final_loss": losses[-1], "epochs": len(losses)}
    t_train = time.perf_counter() - t0
    numbers, curves, recal = run_forecasts(
        data, networks, cfg.seed, **options(run_forecasts, cfg.report)
    )
    report = {
        "seed": cfg.seed,
        "sizes": data.sizes(),
        "level": LEVEL,
        "config": {k: v for k, v in cfg.as_dict().items() if k not in ("output_dir", "config")},
        "training": training,
        "recalibration": recal,
        "forecasts": numbers,
        "curves": curves,
    }
    report[TIMING_KEY] = {
        "train_seconds": t_train,
        "total_seconds": time.perf_counter() - t0,
    }
    return report


def run(cfg: Any) -> dict[str, Any]:
    """Simulate, train, recalibrate, score and write the reports; returns the report (with
    ``output_dir``). ``cfg`` is the parsed namespace of :func:`build_parser`."""
    with environment(cfg.threads):
        report = _run(cfg)
        output_dir = cfg.output_dir or os.path.join("runs", "regression", "heteroscedastic")
        write_timed(write_reports, output_dir, report, **options(write_reports, cfg.report))
    return {**report, "output_dir": output_dir}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status: 0, or 2 on bad options."""
    report = run_cli(build_parser(), run, argv)
    if report is None:
        return 2
    f = report["forecasts"]
    for name, r in f.items():
        print(
            f"{name:>24}: coverage90 {r['coverage90']:.3f} (x<1/3 {r['coverage90_low_x']:.3f}, "
            f"x>2/3 {r['coverage90_high_x']:.3f}), width90 {r['width90']:.3f}"
            + (f", CRPS {r['crps']:.4f}" if r["crps"] is not None else "")
        )
    t = report[TIMING_KEY]
    print(f"{t['total_seconds']:.1f} s; reports written to {report['output_dir']}")
    return 0
