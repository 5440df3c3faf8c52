"""Write the recipe's results: ``report.json`` (deterministic apart from its ``timing`` key),
``report.txt``, ``report.md`` and three PNGs: the PIT histograms, coverage of the 90 % interval
by ``x``, and the reliability curve of the quantiles."""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from recipes._common import TIMING_KEY, cell, md_table, text_table, write_text_reports

__all__ = ["TIMING_KEY", "render", "table_rows", "write_reports"]

PLOTS = ("pit", "coverage_by_x", "quantile_reliability")

COLUMNS = (
    ("coverage90", "cov90"),
    ("coverage90_low_x", "x<1/3"),
    ("coverage90_mid_x", "mid x"),
    ("coverage90_high_x", "x>2/3"),
    ("width90", "width90"),
    ("pit_shares", "PIT shares (5 bins)"),
    ("pit_ece", "PIT ECE"),
    ("nll", "NLL"),
    ("crps", "CRPS"),
)


def table_rows(forecasts: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """The comparison table: a header and one row per forecast (``-`` where undefined).

    Example:
        >>> header, rows = table_rows({"f": {k: None for k, _ in COLUMNS}})
        >>> header[:3], rows[0][:2]
        (['forecast', 'cov90', 'x<1/3'], ['f', '-'])
    """
    header = ["forecast"] + [label for _, label in COLUMNS]
    rows = [[name] + [cell(f[key]) for key, _ in COLUMNS] for name, f in forecasts.items()]
    return header, rows


def render(report: dict, markdown: bool = False, plots: bool = False) -> str:
    """The report as text or markdown (with links to the PNGs when ``plots``): setting,
    table, recalibration and timing lines."""
    table: Callable = md_table if markdown else text_table
    h1, h2 = ("# ", "## ") if markdown else ("", "")
    sizes = report["sizes"]
    out = [
        f"{h1}Heteroscedastic regression: calibrated predictive distributions "
        f"(seed {report['seed']})",
        "",
        "x ~ U(0, 1), y = 2x + eps, eps ~ N(0, (0.1 + 0.5x)^2); "
        + ", ".join(f"{k} {v}" for k, v in sizes.items()),
        "",
        f"{h2}Forecasts on the evaluation points (90 % central intervals)",
        "",
        table(*table_rows(report["forecasts"])),
        "",
        "coverage standard errors sqrt(p(1-p)/n): "
        + ", ".join(
            f"{k} {v['coverage90_se']:.4f}" for k, v in list(report["forecasts"].items())[:1]
        )
        + " (every row's are in report.json)",
        "",
        f"{h2}Recalibration on the held-out split",
        "",
    ]
    for name, r in report["recalibration"].items():
        out.append(
            f"{name}: variance scale s = {r['variance_scale']:.4f} ({r['objective']}), "
            f"conformal normalised-score quantile {r['conformal_quantile']:.4f} "
            f"(a Gaussian 90 % interval is +-1.6449)"
        )
    t = report[TIMING_KEY]
    out += ["", f"time: {t['total_seconds']:.1f} s ({t['train_seconds']:.1f} s training)"]
    if markdown and plots:
        out += [""] + [f"![{name}]({name}.png)" for name in PLOTS]
    return "\n".join(out) + "\n"


def _plot_pit(report: dict, plt: object, path: str) -> None:
    names = [n for n, f in report["forecasts"].items() if f["pit_shares"] is not None]
    cols = 4
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 2.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        shares = report["forecasts"][name]["pit_shares"]
        b = len(shares)
        ax.bar([(i + 0.5) / b for i in range(b)], shares, width=1 / b, edgecolor="k")
        ax.axhline(1 / b, color="r", lw=1)
        ax.set_title(name, fontsize=9)
        ax.set_xlim(0, 1)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.suptitle("PIT histograms (flat = calibrated)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_curves(report: dict, plt: object, paths: dict[str, str]) -> None:
    curves = report["curves"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, c in curves["forecasts"].items():
        k = len(c["coverage_by_x"])
        ax.plot([(i + 0.5) / k for i in range(k)], c["coverage_by_x"], marker=".", label=name)
    ax.axhline(0.9, color="k", ls="--", lw=1)
    ax.set(xlabel="x", ylabel="coverage of the 90 % interval", title="Coverage by x")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths["coverage_by_x"], dpi=90)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 5))
    levels = curves["levels"]
    ax.plot([0, 1], [0, 1], color="k", ls="--", lw=1)
    for name, c in curves["forecasts"].items():
        if c["observed_frequencies"] is not None:
            ax.plot(levels, c["observed_frequencies"], marker=".", label=name)
    ax.set(xlabel="quantile level", ylabel="observed frequency of y <= q", title="Quantiles")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths["quantile_reliability"], dpi=90)
    plt.close(fig)


def write_reports(output_dir: str, report: dict, plots: bool = True) -> dict[str, str]:
    """Write ``report.json`` / ``.txt`` / ``.md`` and (with ``plots``) the three PNGs to
    ``output_dir``; returns their paths. The command line's ``--report.plots`` is this
    signature's.

    Args:
        output_dir: where the reports go.
        report: the run's numbers.
        plots: draw the PNGs (PIT histograms, coverage by x, quantile reliability).
    """
    paths = write_text_reports(
        output_dir, report, lambda markdown: render(report, markdown=markdown, plots=plots)
    )
    if plots:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figs = {k: os.path.join(output_dir, f"{k}.png") for k in PLOTS}
        _plot_pit(report, plt, figs["pit"])
        _plot_curves(report, plt, figs)
        paths.update(figs)
    return paths
