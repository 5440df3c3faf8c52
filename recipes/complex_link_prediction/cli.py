"""Command line: train ComplEx, evaluate filtered ranks, run both calibration audits, write
the reports. ``python -m recipes.complex_link_prediction --config configs/complex/family.yaml``;
every option can be overridden (``--trainer.max_epochs 5 --seed 3 --model.rank 100``)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Optional

import torch

__all__ = [
    "AuditConfig",
    "DataConfig",
    "ModelConfig",
    "RecipeConfig",
    "TrainerConfig",
    "audit_line",
    "build_parser",
    "main",
    "run",
]


@dataclass
class DataConfig:
    """Dataset options.

    Args:
        dataset: 'family' (generated), 'nations', 'kinships', 'umls' (from pykeen) or 'tsv'.
        train: TSV training triples (dataset 'tsv').
        valid: TSV validation triples (dataset 'tsv').
        test: TSV test triples (dataset 'tsv').
        hide: fraction of true triples kept out of the data as hidden truth (family: from
            every split; pykeen/tsv: from valid and test).
        num_families: founder couples of the family KG.
        generations: generations of the family KG.
        valid_fraction: share of the family KG's triples in the validation split.
        test_fraction: share of the family KG's triples in the test split (the audits' data).
        batch_size: training batch size (triples incl. reciprocals; distinct queries
            (h, r) with group_queries).
        group_queries: mode one_to_n: train on batches of distinct queries (h, r), each
            with all its training tails, scoring all entities once per query instead of
            once per triple; the loss is the same per-triple mean (log score + N3).
        eval_batch_size: queries per evaluation batch.
    """

    dataset: str = "family"
    train: Optional[str] = None
    valid: Optional[str] = None
    test: Optional[str] = None
    hide: float = 0.0
    num_families: int = 16
    generations: int = 5
    valid_fraction: float = 0.1
    test_fraction: float = 0.1
    batch_size: int = 1000
    group_queries: bool = False
    eval_batch_size: int = 2048


@dataclass
class ModelConfig:
    """ComplEx-N3 options.

    Args:
        rank: complex embedding dimension.
        init_scale: standard deviation of the initial embeddings.
        lr: Adagrad learning rate.
        regularization: N3 weight.
        loss: 'log' (multiclass log score) or 'brier' in mode one_to_n.
        num_negatives: corruptions per positive in mode negatives.
    """

    rank: int = 200
    init_scale: float = 1e-3
    lr: float = 0.1
    regularization: float = 0.01
    loss: Literal["log", "brier"] = "log"
    num_negatives: int = 10


@dataclass
class TrainerConfig:
    """Lightning Trainer options.

    Args:
        max_epochs: training epochs.
        check_val_every_n_epoch: validation (filtered MRR, calibration monitor) frequency.
        enable_progress_bar: show the progress bar.
        logger: write a CSV log (metrics and the per-epoch reliability tables of the
            calibration monitor) under output_dir/logs.
        accelerator: Lightning accelerator.
    """

    max_epochs: int = 50
    check_val_every_n_epoch: int = 1
    enable_progress_bar: bool = True
    logger: bool = True
    accelerator: str = "cpu"


@dataclass
class AuditConfig:
    """Calibration audit options.

    Args:
        k: corruptions per held-out positive in the triple audit (default: model.num_negatives).
        n_bins: equal-width bins of the reliability tables and ECE.
        plots: write PNG reliability diagrams.
    """

    k: Optional[int] = None
    n_bins: int = 15
    plots: bool = True


@dataclass
class RecipeConfig:
    seed: int = 0
    mode: Literal["one_to_n", "negatives"] = "one_to_n"
    output_dir: Optional[str] = None
    threads: int = 1
    monitor: bool = True
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)


def build_parser() -> Any:
    """The jsonargparse parser: ``--config`` plus every field of :class:`RecipeConfig`."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(prog="python -m recipes.complex_link_prediction",
                            description=__doc__, default_env=False)
    parser.add_argument("--config", action=ActionConfigFile, help="YAML config file")
    defaults = RecipeConfig()
    parser.add_argument("--seed", type=int, default=defaults.seed,
                        help="seed of everything random")
    parser.add_argument("--mode", type=Literal["one_to_n", "negatives"], default=defaults.mode,
                        help="training objective")
    parser.add_argument("--output_dir", type=Optional[str], default=defaults.output_dir,
                        help="where the reports go (default runs/complex/<dataset>)")
    parser.add_argument("--threads", type=int, default=defaults.threads,
                        help="torch intra-op threads (1 is fastest for these small matmuls "
                             "on a shared CPU)")
    parser.add_argument("--monitor", type=bool, default=defaults.monitor,
                        help="attach torchcal's CalibrationMonitor to validation")
    parser.add_class_arguments(DataConfig, "data")
    parser.add_class_arguments(ModelConfig, "model")
    parser.add_class_arguments(TrainerConfig, "trainer")
    parser.add_class_arguments(AuditConfig, "audit")
    return parser


def _config_from_namespace(ns: Any) -> RecipeConfig:
    d = ns.as_dict()
    return RecipeConfig(
        seed=d["seed"], mode=d["mode"], output_dir=d["output_dir"], threads=d["threads"],
        monitor=d["monitor"], data=DataConfig(**d["data"]), model=ModelConfig(**d["model"]),
        trainer=TrainerConfig(**d["trainer"]), audit=AuditConfig(**d["audit"]))


@contextlib.contextmanager
def _recipe_environment(threads: int) -> Iterator[None]:
    """Threads, determinism, warning filters and log levels for one run, restored after it
    (the recipe also runs inside other processes: tests, the benchmark)."""
    if threads < 1:
        raise ValueError(f"threads: expected an int >= 1, got {threads}")
    names = ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda")
    levels = [logging.getLogger(n).level for n in names]
    old_threads = torch.get_num_threads()
    old_det = (torch.are_deterministic_algorithms_enabled(),
               torch.is_deterministic_algorithms_warn_only_enabled())
    with warnings.catch_warnings():
        # torch 2.13 + lightning 2.6 emit this FutureWarning on every fit (DESIGN.md sec. 5).
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
        # In-process batches of index tensors: worker processes would only add overhead.
        warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=r".*number of training batches.*")
        for n in names:
            logging.getLogger(n).setLevel(logging.WARNING)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.set_num_threads(old_threads)
            torch.use_deterministic_algorithms(old_det[0], warn_only=old_det[1])
            for n, lvl in zip(names, levels):
                logging.getLogger(n).setLevel(lvl)


def _calibration_monitor(n_bins: int, to_logger: bool) -> Any:
    # Reads validation_step's {"logits": masked tail scores, "target": true tail}: the
    # reliability of the top-1 filtered tail prediction on the validation queries, per epoch.
    from torchcal.callbacks import CalibrationMonitor

    return CalibrationMonitor(n_bins=n_bins, reading="confidence", input="logits",
                              write_csv=to_logger, log_tables=to_logger, log_figures=False,
                              prog_bar=True)


def run(cfg: RecipeConfig) -> tuple[dict, list]:
    """Train, evaluate, audit and write the reports; returns ``(report, audits)``."""
    with _recipe_environment(cfg.threads):
        return _run(cfg)


def _run(cfg: RecipeConfig) -> tuple[dict, list]:
    import lightning as L

    from recipes.complex_link_prediction.audit import check_audit_data, tail_audit, triple_audit
    from recipes.complex_link_prediction.data import KGDataModule, load_dataset, with_reciprocals
    from recipes.complex_link_prediction.evaluation import TripleFilter, evaluate, ranking_metrics
    from recipes.complex_link_prediction.model import ComplExModule, EpochTimer
    from recipes.complex_link_prediction.report import write_reports

    t_start = time.perf_counter()
    if cfg.trainer.max_epochs < 1:
        raise ValueError(f"trainer.max_epochs: expected an int >= 1, got "
                         f"{cfg.trainer.max_epochs} (the audits need a trained model)")
    L.seed_everything(cfg.seed, verbose=False)

    d = cfg.data
    data = load_dataset(d.dataset, train=d.train, valid=d.valid, test=d.test, hide=d.hide,
                        num_families=d.num_families, generations=d.generations,
                        valid_fraction=d.valid_fraction, test_fraction=d.test_fraction,
                        seed=cfg.seed)
    output_dir = cfg.output_dir or os.path.join("runs", "complex", data.name)
    m = cfg.model
    k = cfg.audit.k if cfg.audit.k is not None else m.num_negatives
    # fail before training when the audits cannot run on this data
    audit_counts = check_audit_data(data, k, cfg.seed)
    R = data.num_relations
    in_train = int(TripleFilter(data.train, data.num_entities, R).contains(
        data.test[:, 0], data.test[:, 1], data.test[:, 2]).sum())
    if in_train:
        warnings.warn(f"data.test: {in_train} of {len(data.test)} test triples also occur in "
                      "the training triples; their ranks and audit items measure memory, not "
                      "generalisation (the report counts them as num_test_in_train)",
                      UserWarning, stacklevel=2)
    if d.group_queries and cfg.mode != "one_to_n":
        raise ValueError(f"data.group_queries: only mode 'one_to_n' trains on grouped queries, "
                         f"got mode {cfg.mode!r}")
    module = ComplExModule(data.num_entities, data.num_relations, data.train, data.known(),
                           rank=m.rank, init_scale=m.init_scale, lr=m.lr,
                           regularization=m.regularization, mode=cfg.mode, loss=m.loss,
                           num_negatives=m.num_negatives, seed=cfg.seed)
    datamodule = KGDataModule(data, batch_size=d.batch_size, eval_batch_size=d.eval_batch_size,
                              seed=cfg.seed, group_queries=d.group_queries)
    t = cfg.trainer
    logger: Any = False
    if t.logger:
        from lightning.pytorch.loggers import CSVLogger

        logger = CSVLogger(output_dir, name="logs")
    timer = EpochTimer()
    callbacks: list = [timer]
    if cfg.monitor:
        callbacks.append(_calibration_monitor(cfg.audit.n_bins, bool(t.logger)))
    trainer = L.Trainer(max_epochs=t.max_epochs, accelerator=t.accelerator, devices=1,
                        logger=logger, enable_checkpointing=False,
                        enable_progress_bar=t.enable_progress_bar, enable_model_summary=False,
                        check_val_every_n_epoch=t.check_val_every_n_epoch,
                        num_sanity_val_steps=0, callbacks=callbacks, deterministic="warn")
    t_fit = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    train_seconds = time.perf_counter() - t_fit

    module.eval().cpu()
    model = module.model
    known = TripleFilter(with_reciprocals(data.known(), R), data.num_entities, 2 * R)
    ranks = evaluate(model.score_all, with_reciprocals(data.test, R), known,
                     batch_size=d.eval_batch_size)
    t_audit = time.perf_counter()
    audits = [
        tail_audit(model, data, seed=cfg.seed, n_bins=cfg.audit.n_bins),
        triple_audit(model, data, k=k, seed=cfg.seed, n_bins=cfg.audit.n_bins,
                     trained_mode=cfg.mode, trained_k=m.num_negatives),
    ]
    audit_seconds = time.perf_counter() - t_audit

    report: dict[str, Any] = {
        "dataset": data.name,
        "seed": cfg.seed,
        "mode": cfg.mode,
        "num_entities": data.num_entities,
        "num_relations": data.num_relations,
        "num_train": len(data.train),
        "num_valid": len(data.valid),
        "num_test": len(data.test),
        "num_hidden": len(data.hidden),
        "num_test_in_train": in_train,
        **audit_counts,
        "epochs": trainer.current_epoch,
        "config": {k: v for k, v in asdict(cfg).items() if k != "output_dir"},
        "train_seconds": train_seconds,
        "epoch_seconds": timer.mean_seconds(),
        "audit_seconds": audit_seconds,
    }
    report.update(ranking_metrics(ranks.realistic))
    if len(data.hidden):
        # against true labels: hidden true tails are filtered too
        truth = TripleFilter(with_reciprocals(data.truth(), R), data.num_entities, 2 * R)
        ranks_true = evaluate(model.score_all, with_reciprocals(data.test, R), truth,
                              batch_size=d.eval_batch_size)
        for key, v in ranking_metrics(ranks_true.realistic).items():
            report[f"{key}_true"] = v
    for key, v in ranking_metrics(ranks.pessimistic).items():
        report[f"{key}_pessimistic"] = v
    report["audits"] = {a.name: {**a.summary, "invariants": a.invariants,
                                 "per_relation": a.per_relation} for a in audits}
    report["invariants_ok"] = all(a.invariants_ok for a in audits)
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
    line = (f"audit {a.name}: T = {s['temperature']:.4f}, ECE {s['ece_before']:.4f} -> "
            f"{s['ece_after']:.4f}, NLL {s['nll_before']:.4f} -> {s['nll_after']:.4f}, "
            f"invariants {'ok' if a.invariants_ok else 'FAILED'} ({ties} tie"
            f"{'' if ties == 1 else 's'} created by / T"
            + (f", largest original gap {gap} ulp{'' if gap == 1 else 's'})" if ties else ")"))
    if a.name == "triple" and mode == "one_to_n":
        line += ("; T cannot fix a 1-N model here: its softmax loss leaves each query's "
                 "score level arbitrary and a temperature cannot move an offset (see the Platt "
                 f"row and base rate {s['base_rate']:.4f} in the report)")
    return line


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status: 0, 1 when an invariant failed, 2 on bad input."""
    parser = build_parser()
    cfg = _config_from_namespace(parser.parse_args(argv))
    try:
        report, audits = run(cfg)
    except (ValueError, FileNotFoundError, ModuleNotFoundError) as e:
        # bad data or options: the message names the file and line / the option
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"\n{report['dataset']}: filtered MRR {report['mrr']:.4f} (realistic), "
          f"Hits@1/3/10 {report['hits@1']:.4f}/{report['hits@3']:.4f}/{report['hits@10']:.4f}; "
          f"{report['epoch_seconds']:.3f} s/epoch, {report['train_seconds']:.1f} s training")
    for a in audits:
        print(audit_line(a, report["mode"]))
    print(f"reports written to {report['output_dir']}")
    if not report["invariants_ok"]:
        failed = [f"{a.name}.{k}" for a in audits for k, v in a.invariants.items() if not v]
        print(f"error: invariant(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
