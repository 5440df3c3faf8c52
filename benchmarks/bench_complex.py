"""ComplEx link prediction: this recipe against PyKEEN's ComplEx on the same split files.

For UMLS, Kinships and Nations (read from the installed pykeen package):

* ours: the recipe's config (``configs/complex/<name>.yaml``, mode ``one_to_n``) for each
  seed: filtered MRR / Hits@10 on test (both directions, realistic ties), mean +- std, and the
  training time per epoch; the tail audit's ECE before/after T on the evaluation half.
* epoch time at the same embedding size: our ComplEx at rank 100 (= PyKEEN's
  ``embedding_dim=100``) for a few epochs beside PyKEEN's epoch time, and the RATIO.
* PyKEEN (when installed): ``pipeline(model="ComplEx", embedding_dim=100, training_loop="lcwa",
  loss="crossentropy", create_inverse_triples=True)`` (1-N cross-entropy with reciprocal
  relations; its defaults otherwise: Adam lr 1e-3 unless ``--pykeen_lr``, batch 256 on CPU),
  100 epochs, filtered realistic MRR on the same test file.

Both sides run in this process with the same ``torch.set_num_threads``. ``--quick``: one seed,
PyKEEN for 10 epochs (its epoch time from those; its MRR is then NOT the 100-epoch number).

    python benchmarks/bench_complex.py [--quick] [--datasets umls nations] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from recipes.complex_link_prediction.cli import build_parser, run  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOALS = {"umls": 0.95, "kinships": 0.88, "nations": 0.75}


def _ours(name: str, seed: int, out: str, extra: list[str], threads: int) -> dict:
    cfg = os.path.join(HERE, "configs", "complex", f"{name}.yaml")
    ns = build_parser().parse_args(
        [
            "--config",
            cfg,
            "--seed",
            str(seed),
            "--output_dir",
            out,
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.logger",
            "false",
            "--monitor",
            "false",
            "--audit.plots",
            "false",
            "--threads",
            str(threads),
            *extra,
        ]
    )
    report, _ = run(ns)
    return report


def _pykeen(name: str, epochs: int, seed: int, lr: float | None) -> dict:
    from pykeen.pipeline import pipeline
    from pykeen.triples import TriplesFactory

    logging.disable(logging.WARNING)  # pykeen's INFO/WARNING chatter about CPU batch sizes
    d = os.path.join(os.path.dirname(importlib.util.find_spec("pykeen").origin), "datasets", name)
    train = TriplesFactory.from_path(os.path.join(d, "train.txt"), create_inverse_triples=True)
    # the training vocabularies, NOT re-compacted (compact_id=True would renumber the
    # entities of each evaluation file on its own and misalign them with the model)
    kw = dict(
        entity_to_id=train.entity_to_id,
        relation_to_id=train.relation_to_id,
        create_inverse_triples=True,
        compact_id=False,
    )
    valid = TriplesFactory.from_path(os.path.join(d, "valid.txt"), **kw)
    test = TriplesFactory.from_path(os.path.join(d, "test.txt"), **kw)
    res = pipeline(
        training=train,
        validation=valid,
        testing=test,
        model="ComplEx",
        model_kwargs=dict(embedding_dim=100),
        training_loop="lcwa",
        loss="crossentropy",
        training_kwargs=dict(num_epochs=epochs, use_tqdm=False),
        optimizer_kwargs=None if lr is None else dict(lr=lr),
        evaluator_kwargs=dict(filtered=True),
        evaluation_kwargs=dict(use_tqdm=False),
        random_seed=seed,
        device="cpu",
    )
    m = res.metric_results
    logging.disable(logging.NOTSET)
    return {
        "mrr": float(m.get_metric("both.realistic.inverse_harmonic_mean_rank")),
        "hits@10": float(m.get_metric("both.realistic.hits_at_10")),
        "epoch_seconds": res.train_seconds / epochs,
    }


def _fmt(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.4f}"
    return f"{statistics.mean(xs):.4f} +- {statistics.stdev(xs):.4f}"


def bench(
    datasets: list[str], seeds: list[int], quick: bool, threads: int, pykeen_lr: float | None
) -> None:
    torch.set_num_threads(threads)
    have_pykeen = importlib.util.find_spec("pykeen") is not None
    pk_epochs = 10 if quick else 100
    logging.getLogger("pykeen").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in datasets:
            reps = [_ours(name, s, os.path.join(tmp, f"{name}{s}"), [], threads) for s in seeds]
            same_size = _ours(
                name,
                seeds[0],
                os.path.join(tmp, f"{name}_r100"),
                [
                    "--model.rank",
                    "100",
                    "--trainer.max_epochs",
                    "20",
                    "--trainer.check_val_every_n_epoch",
                    "1000",
                ],
                threads,
            )
            pk = _pykeen(name, pk_epochs, seeds[0], pykeen_lr) if have_pykeen else None
            row = {
                "dataset": name,
                "mrr": [r["mrr"] for r in reps],
                "hits@10": [r["hits@10"] for r in reps],
                "epoch_s": statistics.mean(r["epoch_seconds"] for r in reps),
                "epochs": reps[0]["epochs"],
                "rank": reps[0]["config"]["model"]["rank"],
                "epoch_s_r100": same_size["epoch_seconds"],
                "ece_tail": [
                    (
                        r["audits"]["tail"]["ece_before"],
                        r["audits"]["tail"]["ece_after"],
                        r["audits"]["tail"]["temperature"],
                    )
                    for r in reps
                ],
                "pykeen": pk,
            }
            rows.append(row)
            _print_row(row, pk_epochs)
    print(
        "\nsummary (filtered MRR, both directions, realistic ties; epoch-time ratio = ours / "
        "PyKEEN at embedding size 100, lower is better):"
    )
    for row in rows:
        pk = row["pykeen"]
        goal = GOALS.get(row["dataset"])
        ok = (
            ""
            if goal is None
            else (" goal ok" if statistics.mean(row["mrr"]) >= goal else " GOAL MISSED")
        )
        line = f"  {row['dataset']:9s} ours {_fmt(row['mrr'])} (goal {goal}){ok}"
        if pk is not None:
            line += (
                f" | PyKEEN {pk['mrr']:.4f} ({pk_epochs} ep) | epoch time ratio "
                f"{row['epoch_s_r100'] / pk['epoch_seconds']:.3f}"
            )
        print(line)


def _print_row(row: dict, pk_epochs: int) -> None:
    print(f"\n== {row['dataset']} ==")
    print(
        f"ours   (rank {row['rank']}, {row['epochs']} epochs): MRR {_fmt(row['mrr'])}, "
        f"Hits@10 {_fmt(row['hits@10'])}, {row['epoch_s']:.3f} s/epoch"
    )
    for i, (b, a, t) in enumerate(row["ece_tail"]):
        print(f"         seed {i}: tail ECE {b:.4f} -> {a:.4f} (T = {t:.3f})")
    print(f"ours   (rank 100 = PyKEEN's embedding size): {row['epoch_s_r100']:.4f} s/epoch")
    pk = row["pykeen"]
    if pk is None:
        print("PyKEEN not installed: no comparison")
        return
    print(
        f"PyKEEN (ComplEx dim 100, LCWA + cross-entropy, inverse triples, {pk_epochs} epochs): "
        f"MRR {pk['mrr']:.4f}, Hits@10 {pk['hits@10']:.4f}, {pk['epoch_seconds']:.4f} s/epoch"
    )
    print(
        f"ratio  MRR ours/PyKEEN {statistics.mean(row['mrr']) / pk['mrr']:.2f}; epoch time "
        f"ours/PyKEEN at dim 100: {row['epoch_s_r100'] / pk['epoch_seconds']:.3f}"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, PyKEEN 10 epochs")
    ap.add_argument("--datasets", nargs="+", default=["umls", "kinships", "nations"])
    ap.add_argument("--seeds", nargs="+", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--pykeen_lr",
        type=float,
        default=None,
        help="PyKEEN's Adam learning rate (default: its own default, 1e-3)",
    )
    args = ap.parse_args()
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    t0 = time.perf_counter()
    bench(args.datasets, seeds, args.quick, args.threads, args.pykeen_lr)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
