"""Command line: train ComplEx, evaluate filtered ranks, run both calibration audits, write
the reports. ``python -m recipes.complex_link_prediction --config configs/complex/family.yaml``;
every option can be overridden (``--trainer.max_epochs 5 --seed 3 --model.rank 100``).

There is no config layer of its own: jsonargparse reads the options of each group from the
signature (and docstring) of the callable that takes them: ``--data.*`` from
:func:`~recipes.complex_link_prediction.datasets.load_dataset` and
:class:`~recipes.complex_link_prediction.data.KGDataModule`, ``--model.*`` from
:class:`~recipes.complex_link_prediction.model.ComplExModule`, ``--trainer.*`` from
:func:`build_trainer`, ``--audit.*`` from
:func:`~recipes.complex_link_prediction.audit.run_audits` and
:func:`~recipes.complex_link_prediction.report.write_reports`. Not ``LightningCLI``: it names the
seed ``--seed_everything``, exposes every ``Trainer`` argument while the recipe pins devices,
checkpointing and determinism, builds the Trainer before the dataset (whose name places the
CSV log) is known, and parses inside its constructor, outside the thread/determinism
environment of a run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any, Literal, Optional

from recipes._common import environment, options, tidy_help

__all__ = ["audit_line", "build_parser", "build_trainer", "main", "run"]


def build_trainer(
    output_dir: str,
    callbacks: list,
    max_epochs: int = 50,
    check_val_every_n_epoch: int = 1,
    enable_progress_bar: bool = True,
    logger: bool = True,
    accelerator: str = "cpu",
) -> Any:
    """The recipe's Lightning Trainer (one device, no checkpoints, deterministic with
    warnings, no sanity validation). The command line's ``--trainer.*`` options are this
    signature's.

    Args:
        output_dir: where the CSV log goes (``output_dir/logs``).
        callbacks: the Trainer's callbacks.
        max_epochs: training epochs.
        check_val_every_n_epoch: validation (filtered MRR, calibration monitor) frequency.
        enable_progress_bar: show the progress bar.
        logger: write a CSV log (metrics and the per-epoch reliability tables of the
            calibration monitor) under output_dir/logs.
        accelerator: Lightning accelerator.
    """
    import lightning as L

    csv_logger: Any = False
    if logger:
        from lightning.pytorch.loggers import CSVLogger

        csv_logger = CSVLogger(output_dir, name="logs")
    return L.Trainer(
        max_epochs=max_epochs,
        accelerator=accelerator,
        devices=1,
        logger=csv_logger,
        enable_checkpointing=False,
        enable_progress_bar=enable_progress_bar,
        enable_model_summary=False,
        check_val_every_n_epoch=check_val_every_n_epoch,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        deterministic="warn",
    )


def build_parser() -> Any:
    """The jsonargparse parser: ``--config``, the recipe's own five options, and each group
    from the signature of the callable that takes it (see the module docstring)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    from recipes.complex_link_prediction.audit import run_audits
    from recipes.complex_link_prediction.data import KGDataModule
    from recipes.complex_link_prediction.datasets import load_dataset
    from recipes.complex_link_prediction.model import ComplExModule
    from recipes.complex_link_prediction.report import write_reports

    parser = ArgumentParser(
        prog="python -m recipes.complex_link_prediction",
        description=__doc__.split("\n\n")[0],
        default_env=False,
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML config file")
    parser.add_argument("--seed", type=int, default=0, help="seed of everything random")
    parser.add_argument(
        "--mode",
        type=Literal["one_to_n", "negatives"],
        default="one_to_n",
        help="training objective",
    )
    parser.add_argument(
        "--output_dir",
        type=Optional[str],
        default=None,
        help="where the reports go (default runs/complex/<dataset>)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1 is fastest for these small matmuls on a shared CPU)",
    )
    parser.add_argument(
        "--monitor",
        type=bool,
        default=True,
        help="attach torchcal's CalibrationMonitor to validation",
    )
    parser.add_function_arguments(load_dataset, "data", skip={"seed"})
    parser.add_class_arguments(KGDataModule, "data", skip={"data", "seed"}, as_group=False)
    parser.add_class_arguments(
        ComplExModule,
        "model",
        skip={"num_entities", "num_relations", "train_triples", "known_triples", "mode", "seed"},
    )
    parser.add_function_arguments(build_trainer, "trainer", skip={"output_dir", "callbacks"})
    parser.add_function_arguments(
        run_audits, "audit", skip={"model", "data", "seed", "trained_mode", "trained_k"}
    )
    parser.add_function_arguments(
        write_reports,
        "audit",
        as_group=False,
        skip={"output_dir", "result", "audits", "data_summary"},
    )
    return tidy_help(
        parser,
        {
            "data": load_dataset,
            "model": ComplExModule,
            "trainer": build_trainer,
            "audit": run_audits,
        },
    )


@contextlib.contextmanager
def _recipe_environment(threads: int) -> Iterator[None]:
    """Threads, determinism, warning filters and log levels for one run, restored after it
    (the recipe also runs inside other processes: tests, the benchmark)."""
    names = ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda")
    levels = [logging.getLogger(n).level for n in names]
    with environment(threads), warnings.catch_warnings():
        # torch 2.13 + lightning 2.6 emit this FutureWarning on every fit (docs/design.md
        # section 5).
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
        # In-process batches of index tensors: worker processes would only add overhead.
        warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=r".*number of training batches.*")
        for n in names:
            logging.getLogger(n).setLevel(logging.WARNING)
        try:
            yield
        finally:
            for n, lvl in zip(names, levels):
                logging.getLogger(n).setLevel(lvl)


def _calibration_monitor(n_bins: int, to_logger: bool) -> Any:
    # Reads validation_step's {"logits": masked tail scores, "target": true tail}: the
    # reliability of the top-1 filtered tail prediction on the validation queries, per epoch.
    from torchcal.callbacks import CalibrationMonitor

    sinks = ("csv", "loggers", "prog_bar") if to_logger else ("prog_bar",)
    return CalibrationMonitor(n_bins=n_bins, reading="confidence", input="logits", sinks=sinks)


def run(cfg: Any) -> tuple[dict, list]:
    """Train, evaluate, audit and write the reports; returns ``(report, audits)``.
    ``cfg`` is the parsed namespace of :func:`build_parser`."""
    with _recipe_environment(cfg.threads):
        return _run(cfg)


def _warn_leaks(data: Any) -> None:
    """Warn about test triples that also occur in train or repeat within test (counted in
    ``data.leaks``; ``--data.drop_leaked true`` drops them)."""
    leaks = data.leaks
    dropped = leaks.get("num_test_dropped", 0) > 0
    n = len(data.test) + leaks.get("num_test_dropped", 0)
    fate = "dropped (--data.drop_leaked)" if dropped else "kept: --data.drop_leaked true drops them"
    in_train, dup = leaks.get("num_test_in_train", 0), leaks.get("num_test_duplicates", 0)
    if in_train:
        warnings.warn(
            f"data.test: {in_train} of {n} test triples also occur in the training "
            f"triples ({2 * in_train} of {2 * n} queries, both directions); their ranks "
            "and audit items measure memory, not generalisation (the report counts them "
            f"as num_test_in_train); {fate}",
            UserWarning,
            stacklevel=4,
        )
    if dup:
        warnings.warn(
            f"data.test: {dup} of {n} test triples repeat an earlier test triple "
            f"({2 * dup} of {2 * n} queries, both directions, counted twice; the report "
            f"counts them as num_test_duplicates); {fate}",
            UserWarning,
            stacklevel=4,
        )


def _prepare(cfg: Any) -> tuple[Any, int, dict[str, Any], Any, Any]:
    """Data, the audit's k, the pre-training checks (every unusable input fails here, before
    training) and the module and datamodule: ``(data, k, counts, module, datamodule)``."""
    from recipes.complex_link_prediction.data import KGDataModule
    from recipes.complex_link_prediction.datasets import load_dataset
    from recipes.complex_link_prediction.items import check_audit_data
    from recipes.complex_link_prediction.model import ComplExModule

    for name, v in (("alpha", cfg.audit.alpha), ("coverage", cfg.audit.coverage)):
        if not (isinstance(v, float) and 0 < v < 1):
            raise ValueError(f"audit.{name}: expected a number in (0, 1), got {v!r}")
    data = load_dataset(**options(load_dataset, cfg.data), seed=cfg.seed)
    k = cfg.audit.k if cfg.audit.k is not None else cfg.model.num_negatives
    counts = check_audit_data(data, k, cfg.seed)
    _warn_leaks(data)
    if cfg.data.group_queries and cfg.mode != "one_to_n":
        raise ValueError(
            f"data.group_queries: only mode 'one_to_n' trains on grouped queries, "
            f"got mode {cfg.mode!r}"
        )
    module = ComplExModule(
        data.num_entities,
        data.num_relations,
        data.train,
        data.known(),
        mode=cfg.mode,
        seed=cfg.seed,
        **options(ComplExModule, cfg.model),
    )
    datamodule = KGDataModule(data, seed=cfg.seed, **options(KGDataModule, cfg.data))
    return data, k, {**counts, **data.leaks}, module, datamodule


def _ranking(model: Any, data: Any, batch_size: int) -> dict[str, float]:
    """Filtered ranking metrics of the test triples (both directions): realistic against the
    observed filter, ``_true`` against every true triple (when some are hidden) and
    ``_pessimistic``."""
    from recipes.complex_link_prediction.datasets import with_reciprocals
    from recipes.complex_link_prediction.evaluation import TripleFilter, evaluate, ranking_metrics

    R = data.num_relations
    queries = with_reciprocals(data.test, R)
    known = TripleFilter(with_reciprocals(data.known(), R), data.num_entities, 2 * R)
    ranks = evaluate(model.score_all, queries, known, batch_size=batch_size)
    out = ranking_metrics(ranks.realistic)
    if len(data.hidden):
        # against true labels: hidden true tails are filtered too
        truth = TripleFilter(with_reciprocals(data.truth(), R), data.num_entities, 2 * R)
        ranks_true = evaluate(model.score_all, queries, truth, batch_size=batch_size)
        out.update({f"{key}_true": v for key, v in ranking_metrics(ranks_true.realistic).items()})
    out.update({f"{key}_pessimistic": v for key, v in ranking_metrics(ranks.pessimistic).items()})
    return out


def _fit(cfg: Any, module: Any, datamodule: Any, output_dir: str) -> tuple[Any, Any, float]:
    """Train with the recipe's Trainer (an epoch timer, and the calibration monitor when
    ``--monitor``): ``(trainer, timer, train_seconds)``."""
    from recipes.complex_link_prediction.model import EpochTimer

    timer = EpochTimer()
    callbacks: list = [timer]
    if cfg.monitor:
        callbacks.append(_calibration_monitor(cfg.audit.n_bins, bool(cfg.trainer.logger)))
    trainer = build_trainer(output_dir, callbacks, **options(build_trainer, cfg.trainer))
    t_fit = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    return trainer, timer, time.perf_counter() - t_fit


def _sizes(data: Any) -> dict[str, int]:
    """The dataset's vocabulary and split sizes, for the report."""
    return {
        "num_entities": data.num_entities,
        "num_relations": data.num_relations,
        "num_train": len(data.train),
        "num_valid": len(data.valid),
        "num_test": len(data.test),
        "num_hidden": len(data.hidden),
    }


def _run(cfg: Any) -> tuple[dict, list]:
    import lightning as L

    from recipes.complex_link_prediction.audit import run_audits
    from recipes.complex_link_prediction.report import write_reports

    t_start = time.perf_counter()
    if cfg.trainer.max_epochs < 1:
        raise ValueError(
            f"trainer.max_epochs: expected an int >= 1, got "
            f"{cfg.trainer.max_epochs} (the audits need a trained model)"
        )
    L.seed_everything(cfg.seed, verbose=False)
    data, k, counts, module, datamodule = _prepare(cfg)
    output_dir = cfg.output_dir or os.path.join("runs", "complex", data.name)
    trainer, timer, train_seconds = _fit(cfg, module, datamodule, output_dir)

    module.eval().cpu()
    ranking = _ranking(module.model, data, cfg.data.eval_batch_size)
    t_audit = time.perf_counter()
    audits = run_audits(
        module.model,
        data,
        seed=cfg.seed,
        trained_mode=cfg.mode,
        trained_k=cfg.model.num_negatives,
        k=k,
        n_bins=cfg.audit.n_bins,
        alpha=cfg.audit.alpha,
        coverage=cfg.audit.coverage,
    )
    audit_seconds = time.perf_counter() - t_audit
    report: dict[str, Any] = {
        "dataset": data.name,
        "seed": cfg.seed,
        "mode": cfg.mode,
        **_sizes(data),
        **counts,
        "epochs": trainer.current_epoch,
        "config": {
            key: v for key, v in cfg.as_dict().items() if key not in ("output_dir", "config")
        },
        "train_seconds": train_seconds,
        "epoch_seconds": timer.mean_seconds(),
        "audit_seconds": audit_seconds,
        "fit_costs": {key: v for a in audits for key, v in a.costs.items()},
        **ranking,
        "audits": {
            a.name: {**a.summary, "invariants": a.invariants, "per_relation": a.per_relation}
            for a in audits
        },
        "invariants_ok": all(a.invariants_ok for a in audits),
    }
    report["total_seconds"] = time.perf_counter() - t_start
    write_reports(output_dir, report, audits, data.summary(), plots=cfg.audit.plots)
    report["output_dir"] = output_dir
    return report, audits


def audit_line(a: Any, mode: str) -> str:
    """The stdout line of one audit: T, ECE and NLL before -> after, the invariants and the
    ties ``x / T`` created; for the triple audit of a 1-N model, why T cannot fix it."""
    s = a.summary
    ties = s["ties_created"]
    gap = s["max_tie_gap_ulps"]
    fallback = (
        f" (fallback: the fitted T = {s['temperature_fitted']:.4f} raised the fit split's NLL)"
        if s.get("temperature_fallback")
        else ""
    )
    line = (
        f"audit {a.name}: T = {s['temperature']:.4f}{fallback}, ECE {s['ece_before']:.4f} -> "
        f"{s['ece_after']:.4f}, NLL {s['nll_before']:.4f} -> {s['nll_after']:.4f}, "
        f"invariants {'ok' if a.invariants_ok else 'FAILED'} ({ties} tie"
        f"{'' if ties == 1 else 's'} created by / T"
        + (f", largest original gap {gap} ulp{'' if gap == 1 else 's'})" if ties else ")")
    )
    if a.name == "triple" and mode == "one_to_n":
        line += (
            "; T cannot fix a 1-N model here: its softmax loss leaves each query's "
            "score level arbitrary and a temperature cannot move an offset (see the Platt "
            f"row and base rate {s['base_rate']:.4f} in the report)"
        )
    return line


def tail_lines(a: Any) -> list[str]:
    """The tail audit's two extra stdout lines: the per-relation temperature (global, raw and
    shrunk on the evaluation half) and the answer sets with the risk-coverage row."""
    s = a.summary
    r = s["relation_temperature"]
    sets, rc = s["answer_sets"]["global_T"], s["risk_coverage"]["global_T"]
    return [
        f"relation T: {r['groups_with_calibration_queries']} query relations, T "
        f"{r['t_shrunk_min']:.3f}..{r['t_shrunk_max']:.3f} shrunk (raw "
        f"{r['t_raw_min']:.3f}..{r['t_raw_max']:.3f}, median weight {r['weight_median']:.2f}); "
        f"ECE global/raw/shrunk {r['ece_global']:.4f}/{r['ece_raw']:.4f}/"
        f"{r['ece_shrunk']:.4f}, NLL {r['nll_global']:.4f}/{r['nll_raw']:.4f}/"
        f"{r['nll_shrunk']:.4f}",
        f"answer sets (alpha {sets['alpha']:g}, global T): coverage {sets['coverage']:.4f} "
        f"+- {sets['coverage_se']:.4f}, mean size {sets['mean_size']:.2f} (median "
        f"{sets['median_size']:g}, {sets['empty']} empty); top-1 AURC {rc['aurc']:.4f}, AUGRC {rc['augrc']:.4f}, "
        f"risk {rc['risk_at_coverage']:.4f} at {rc['coverage']:.0%} coverage",
    ]


def cost_line(costs: dict[str, dict[str, Any]]) -> str:
    """The stdout line of each fit's time and added peak memory."""
    parts = [f"{k} {v['seconds']:.3f} s / {v['peak_mb']:.1f} MB" for k, v in costs.items()]
    return "fits (time / added peak memory): " + ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status: 0, 1 when an invariant failed, 2 on bad input."""
    cfg = build_parser().parse_args(argv)
    try:
        report, audits = run(cfg)
    except (ValueError, FileNotFoundError, ModuleNotFoundError) as e:
        # bad data or options: the message names the file and line / the option
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"\n{report['dataset']}: filtered MRR {report['mrr']:.4f} (realistic), "
        f"Hits@1/3/10 {report['hits@1']:.4f}/{report['hits@3']:.4f}/{report['hits@10']:.4f}; "
        f"{report['epoch_seconds']:.3f} s/epoch, {report['train_seconds']:.1f} s training"
    )
    for a in audits:
        print(audit_line(a, report["mode"]))
        if a.name == "tail":
            for line in tail_lines(a):
                print(line)
    print(cost_line(report["fit_costs"]))
    print(f"reports written to {report['output_dir']}")
    if not report["invariants_ok"]:
        failed = [f"{a.name}.{k}" for a in audits for k, v in a.invariants.items() if not v]
        print(f"error: invariant(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
