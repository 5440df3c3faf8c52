"""Write the demo's results: ``report.json`` (deterministic apart from its ``timing`` key),
``report.txt``, ``report.md`` and ``reliability.png`` (both arms' reliability diagrams)."""

from __future__ import annotations

import os
from collections.abc import Callable

from recipes._common import TIMING_KEY, cell, md_table, text_table, write_text_reports
from torchcal import ReliabilityTable

__all__ = ["TIMING_KEY", "render", "write_reports"]

SUMMARY = (
    ("is_proper", "is_proper"),
    ("ece", "ECE"),
    ("true_ce", "true CE"),
    ("mean_confidence", "mean q"),
    ("accuracy", "accuracy"),
    ("best_answer_rate", "best answer"),
    ("max_abs_context_gap", "max context gap"),
)


def _context_rows(arm: dict) -> list[list[str]]:
    return [
        [str(k)] + [f"{c[key]:.3f}" for key in ("p_best", "p_correct", "mean_confidence", "gap")]
        for k, c in enumerate(arm["contexts"])
    ]


def render(report: dict, tables: dict[str, ReliabilityTable], markdown: bool = False) -> str:
    """The report as text or markdown: the setting, a summary row per arm, then per arm the
    reliability table of the stated confidence and the mean stated confidence per context."""
    table: Callable = md_table if markdown else text_table
    h1, h2 = ("# ", "## ") if markdown else ("", "")
    b, t = report["bandit"], report["config"]["train"]
    arms = report["arms"]
    out = [
        f"{h1}Calibrated rewards: RL of a stated confidence (seed {report['seed']})",
        "",
        f"contextual bandit: {b['n_contexts']} contexts, {b['n_answers']} answers each, best "
        f"answer right with p_k in [{b['p_low']}, {b['p_high']}]; confidence grid of "
        f"{len(report['grid'])} values; REINFORCE, {t['steps']} steps x {t['batch_size']} "
        f"rounds; evaluation {report['eval_rounds']} rounds",
        "",
        table(
            ["arm"] + [label for _, label in SUMMARY],
            [[name] + [cell(a[key]) for key, _ in SUMMARY] for name, a in arms.items()],
        ),
        "",
        "ECE: binned gap between stated q and the outcomes; true CE: the same against the "
        "true probability of being right (no label noise); improper = q * 1[correct]",
    ]
    for name, a in arms.items():
        rel = tables[name].to_markdown() if markdown else tables[name].to_text()
        ctx = table(["k", "p_k", "P(correct)", "mean q", "gap"], _context_rows(a))
        out += ["", f"{h2}{name} (is_proper={a['is_proper']})", "", rel, "", ctx]
    out += ["", f"time: {report[TIMING_KEY]['total_seconds']:.1f} s"]
    return "\n".join(out) + "\n"


def _plot(report: dict, tables: dict[str, ReliabilityTable], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from torchcal.plotting import reliability_diagram

    fig, axes = plt.subplots(1, len(tables), figsize=(5 * len(tables), 4.6), squeeze=False)
    for ax, (name, tab) in zip(axes.flat, tables.items()):
        reliability_diagram(tab, ax=ax)
        ax.set_xlabel("stated confidence q")
        ax.set_title(f"{name} (is_proper={report['arms'][name]['is_proper']}): ECE {tab.ece:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_reports(
    output_dir: str, report: dict, tables: dict[str, ReliabilityTable], plots: bool = True
) -> dict[str, str]:
    """Write ``report.json`` / ``.txt`` / ``.md`` and (with ``plots``) ``reliability.png`` to
    ``output_dir``; returns their paths.

    Args:
        output_dir: where the reports go.
        report: the run's numbers.
        tables: each arm's reliability table.
        plots: draw ``reliability.png``.
    """
    link = "\n![reliability diagrams](reliability.png)\n"

    def text(markdown: bool) -> str:
        return render(report, tables, markdown=markdown) + (link if markdown and plots else "")

    paths = write_text_reports(output_dir, report, text)
    if plots:
        paths["png"] = os.path.join(output_dir, "reliability.png")
        _plot(report, tables, paths["png"])
    return paths
