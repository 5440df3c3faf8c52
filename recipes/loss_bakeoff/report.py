"""The bake-off's outputs: per-loss rows (mean and spread over seeds), ``report.json``
(deterministic apart from its ``timing`` key), ``report.txt``, ``report.md`` and
``reliability.png`` (the test reliability curves of every loss, before and after T,
overlaid)."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from recipes._common import TIMING_KEY, md_table, text_table, write_text_reports
from recipes.loss_bakeoff.evaluate import METRICS

__all__ = ["TIMING_KEY", "aggregate", "render", "write_reports"]

LABELS = {
    "true_ce": "true CE",
    "ece": "ECE",
    "ece_debiased": "dECE(L2)",
    "nll": "NLL",
    "brier": "Brier",
    "accuracy": "acc",
    "kl": "KL(p*||p)",
}


def _spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """Mean and sample standard deviation (``None`` for one seed or missing values)."""
    if any(v is None for v in values):
        return {"mean": None, "std": None}
    vals = [float(v) for v in values]  # type: ignore[arg-type]
    return {
        "mean": statistics.fmean(vals),
        "std": statistics.stdev(vals) if len(vals) > 1 else None,
    }


def aggregate(name: str, is_proper: str | None, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One report row from the per-seed runs of a loss: ``loss``, ``is_proper``, for each
    metric ``{"before": {"mean", "std"}, "after": {...}}``, ``temperature`` ``{"mean",
    "std"}`` and the per-seed numbers under ``seeds``.

    Example:
        >>> run = {"seed": 0, "temperature": 1.5, "before": {m: 0.1 for m in METRICS},
        ...        "after": {m: 0.05 for m in METRICS}}
        >>> row = aggregate("log_score", "strict", [run, {**run, "seed": 1}])
        >>> row["ece"]["after"], row["temperature"]
        ({'mean': 0.05, 'std': 0.0}, {'mean': 1.5, 'std': 0.0})
    """
    row: dict[str, Any] = {"loss": name, "is_proper": is_proper}
    for m in METRICS:
        row[m] = {stage: _spread([r[stage][m] for r in runs]) for stage in ("before", "after")}
    row["temperature"] = _spread([r["temperature"] for r in runs])
    for key in ("ece_floor_before", "ece_floor_after"):
        if key in runs[0]:
            row[key] = _spread([r[key]["mean"] for r in runs])
    if "picked" in runs[0]:  # the checkpoint selections: epoch and test metrics after T
        row["picked"] = {
            name: {
                "epoch": _spread([r["picked"][name]["epoch"] for r in runs]),
                **{m: _spread([r["picked"][name]["after"][m] for r in runs]) for m in METRICS},
            }
            for name in runs[0]["picked"]
        }
    row["seeds"] = runs
    return row


def _fmt(cell: dict[str, float | None], digits: int = 4) -> str:
    if cell["mean"] is None:
        return "-"
    s = f"{cell['mean']:.{digits}f}"
    return s if cell["std"] is None else f"{s}±{cell['std']:.{digits}f}"


CALIBRATION = ("true_ce", "ece", "ece_debiased")
SCORES = ("nll", "brier", "accuracy", "kl")


def table_rows(report: dict, metrics: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Header and one row per loss: ``is_proper``, T, then each of ``metrics`` (those with
    numbers) as ``before → after``, and the ECE floor after T where there is one.

    Example:
        >>> cell = {"before": {"mean": 0.1, "std": None}, "after": {"mean": 0.05, "std": None}}
        >>> row = {"loss": "x", "is_proper": "no", "temperature": {"mean": 1.2, "std": None},
        ...        "ece": cell}
        >>> table_rows({"rows": [row]}, ["ece"])[1]
        [['x', 'no', '1.200', '0.1000 → 0.0500']]
    """
    first = report["rows"][0]
    cols = [m for m in metrics if m in first and first[m]["before"]["mean"] is not None]
    floor = "ece_floor_after" in first and "ece" in cols
    header = ["loss", "proper", "T"] + [f"{LABELS[m]} before → after" for m in cols]
    header += ["ECE floor after T"] if floor else []
    rows = []
    for r in report["rows"]:
        cells = [r["loss"], str(r["is_proper"] or "?"), _fmt(r["temperature"], 3)]
        cells += [f"{_fmt(r[m]['before'])} → {_fmt(r[m]['after'])}" for m in cols]
        cells += [_fmt(r["ece_floor_after"])] if floor else []
        rows.append(cells)
    return header, rows


def selection_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    """Refine, then calibrate: per loss, the test NLL after T of the last epoch, of the
    checkpoint of lowest ``val/nll`` and of the checkpoint of lowest ``val/refinement_nll``
    (its epoch beside it), and on how many seeds the two picks differ and the refinement
    pick has the lower test NLL."""
    header = ["loss", "last epoch", "epoch (val/nll)", "picked by val/nll"]
    header += ["epoch (val/refinement_nll)", "picked by val/refinement_nll"]
    header += ["picks differ", "refinement better"]
    rows = []
    for r in report["rows"]:
        p = r["picked"]
        seeds = [(s["picked"]["val_nll"], s["picked"]["refinement_nll"]) for s in r["seeds"]]
        differ = sum(a["epoch"] != b["epoch"] for a, b in seeds)
        better = sum(b["after"]["nll"] < a["after"]["nll"] for a, b in seeds)
        rows.append(
            [r["loss"], _fmt(r["nll"]["after"]), _fmt(p["val_nll"]["epoch"], 1)]
            + [_fmt(p["val_nll"]["nll"]), _fmt(p["refinement_nll"]["epoch"], 1)]
            + [_fmt(p["refinement_nll"]["nll"]), f"{differ}/{len(seeds)}", f"{better}/{differ}"]
        )
    return header, rows


def render(report: dict, markdown: bool = False, plots: bool = False) -> str:
    """The report as text or markdown: setting, the table (mean ± sample std over seeds),
    notes and timing."""
    table: Callable = md_table if markdown else text_table
    h1, h2 = ("# ", "## ") if markdown else ("", "")
    seeds = report["seeds"]
    out = [
        f"{h1}Loss bake-off: {report['dataset']} ({len(seeds)} seeds: {seeds})",
        "",
        ", ".join(f"{k} {v}" for k, v in report["sizes"].items())
        + (
            f"; Bayes accuracy {report['bayes_accuracy']:.4f}"
            if report.get("bayes_accuracy") is not None
            else ""
        ),
        "",
        f"{h2}Calibration",
        "",
        table(*table_rows(report, CALIBRATION)),
        "",
        f"{h2}Scores",
        "",
        table(*table_rows(report, SCORES)),
        "",
        "mean ± sample std over seeds; before → after the temperature T fitted on the "
        "validation split. "
        + (
            "true CE: binned |confidence - p*(predicted class | x)| (no label noise); "
            if report["rows"][0]["true_ce"]["before"]["mean"] is not None
            else ""
        )
        + "ECE: binned |confidence - accuracy| against the labels; dECE: debiased L2 ECE "
        f"(Kumar et al. 2019). {report['n_bins']} equal-width bins.",
    ]
    if "picked" in report["rows"][0]:
        out += [
            "",
            f"{h2}Checkpoint selection: refine, then calibrate",
            "",
            table(*selection_rows(report)),
            "",
            "test NLL after each checkpoint's own T (fitted on the validation split at that "
            "epoch): the last epoch, the validated epoch of lowest val/nll, and that of lowest "
            "val/refinement_nll (the validation NLL after T; Berta et al. 2025); epochs "
            "counted from 0.",
        ]
    if "ece_floor_after" in report["rows"][0]:
        out += [
            "",
            "ECE floor: mean ECE of a perfectly calibrated model with the same confidences at "
            f"this test size (labels drawn from the confidences, {report['floor_draws']} "
            "draws): an ECE at the floor is indistinguishable from perfect calibration.",
        ]
    t = report.get(TIMING_KEY)
    if t:
        out += ["", f"time: {t['total_seconds']:.1f} s ({t['train_seconds']:.1f} s training)"]
    if markdown and plots:
        out += ["", "![reliability](reliability.png)"]
    return "\n".join(out) + "\n"


def _plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5), sharey=True)
    cmap = plt.get_cmap("tab20")
    for ax, stage in zip(axes, ("before", "after")):
        ax.plot([0, 1], [0, 1], "--", color="gray", lw=1)
        for i, r in enumerate(report["rows"]):
            c = report["curves"][r["loss"]][stage]
            ax.plot(c["conf"], c["acc"], marker=".", lw=1.2, color=cmap(i), label=r["loss"])
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="mean confidence (bin)",
               title=f"{report['dataset']}: {stage} temperature scaling")  # fmt: skip
    axes[0].set_ylabel("accuracy (bin)")
    axes[1].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Reliability on the test split (seed {report['seeds'][0]})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_reports(output_dir: str, report: dict, plots: bool = True) -> dict[str, str]:
    """Write ``report.json`` / ``.txt`` / ``.md`` and (with ``plots``) ``reliability.png``
    to ``output_dir``; returns their paths. The command line's ``--report.plots`` is this
    signature's.

    Args:
        output_dir: where the reports go.
        report: the run's numbers.
        plots: draw the overlay of the reliability curves.
    """
    paths = write_text_reports(
        output_dir, report, lambda markdown: render(report, markdown=markdown, plots=plots)
    )
    if plots:
        paths["png"] = os.path.join(output_dir, "reliability.png")
        _plot(report, paths["png"])
    return paths
