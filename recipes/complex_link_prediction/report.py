"""Write the recipe's results: ``report.json`` (deterministic apart from timing keys),
``report.txt``, ``report.md`` and PNG reliability diagrams before/after each audit."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence

from recipes._common import json_ready
from recipes.complex_link_prediction.audit import MIN_RELATION_ITEMS, AuditResult

__all__ = ["TIMING_KEYS", "write_reports"]

TIMING_KEYS = (
    "train_seconds",
    "epoch_seconds",
    "audit_seconds",
    "total_seconds",
    "fit_costs",
)


def _f(x: object, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


_METRIC_ROWS = (
    ("ECE (L1, {n_bins} bins)", "ece"),
    ("debiased ECE (L2)", "ece_debiased"),
    ("Brier", "brier"),
    ("  Brier reliability", "reliability"),
    ("  Brier resolution", "resolution"),
    ("  Brier uncertainty", "uncertainty"),
    ("NLL", "nll"),
)


def _audit_rows(a: AuditResult) -> tuple[list[str], list[list[str]]]:
    s = a.summary
    triple = a.name == "triple"
    # triple: the Platt column (information) and the base-rate column (a constant
    # 1/(1+k) for every item: what each metric reads without any skill)
    cols = ["before", "after"] + (["platt", "base_rate"] if triple else [])
    header = ["metric", "before", "after T"]
    if triple:
        header += ["Platt", f"base rate {s['base_rate']:.4f}"]
    n_bins = a.tables["before"].n_bins
    rows = [
        [label.format(n_bins=n_bins)] + [_f(s.get(f"{key}_{c}")) for c in cols]
        for label, key in _METRIC_ROWS
    ]
    if triple:
        rows.append(["AUC"] + [_f(s[f"auc_{c}"]) for c in cols])
        rows.append(["accuracy at logit 0"] + [_f(s[f"acc_{c}"]) for c in cols])
    else:
        rows.append(["Hits@1", _f(s["hits1_before"]), _f(s["hits1_after"])])
    if "ece_true_before" in s:
        rows.append(
            ["ECE vs true labels", _f(s["ece_true_before"]), _f(s["ece_true_after"])]
            + (["-", "-"] if triple else [])
        )
    return header, rows


def _audit_heading(a: AuditResult) -> str:
    s = a.summary
    if a.name == "tail":
        what = "top-1 filtered tail prediction over all entities (multiclass)"
    else:
        what = (
            f"held-out positives + k = {s['k']} filtered corruptions (binary), "
            f"base rate {s['base_rate']:.4f}"
        )
    extra = ""
    if a.name == "triple":
        extra = f"; Platt: scale {_f(s['platt_scale'])}, offset {_f(s['platt_offset'])}"
    if s.get("temperature_fallback"):
        fitted = (
            f"T = 1 (fallback: the fitted T = {s['temperature_fitted']:.4f} raised the "
            f"calibration half's NLL from {s['nll_fit_split_identity']:.4f} to "
            f"{s['nll_fit_split_fitted']:.4f})"
        )
    else:
        fitted = (
            f"fitted T = {s['temperature']:.4f} (calibration-half NLL "
            f"{s['nll_fit_split_identity']:.4f} at T = 1 -> {s['nll_fit_split_fitted']:.4f})"
        )
    return (
        f"Audit '{a.name}': {what}\n"
        f"{fitted} on {s['n_calibration']} calibration items; "
        f"reported on {s['n_evaluation']} evaluation items{extra}"
    )


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(header, widths))]
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x).strip() for x in row) + " |" for row in rows]
    return "\n".join(lines)


def _ranking_rows(result: dict) -> list[list[str]]:
    """The filtered ranking table's rows: realistic, pessimistic and (when some triples are
    hidden) realistic against the true filter."""
    rows = [("realistic", ""), ("pessimistic", "_pessimistic")]
    if "mrr_true" in result:
        rows.append(("realistic, true filter", "_true"))
    keys = ("mrr", "hits@1", "hits@3", "hits@10")
    return [[label] + [_f(result[f"{key}{suffix}"]) for key in keys] for label, suffix in rows]


def _beyond_t(s: dict, table: Callable[..., str]) -> list[str]:
    """The tail audit's per-relation temperature, answer sets and risk-coverage rows."""
    r = s["relation_temperature"]
    out = [
        f"per-relation temperature ({r['groups_with_calibration_queries']} of {r['groups']} "
        "query relations with calibration queries; each relation and its reciprocal r^-1): "
        "raw = fitted per relation on the calibration half, shrunk = toward the global T "
        "by empirical Bayes (weight w tau^2 / (1 + w tau^2), w = the curvature of the "
        "relation's summed NLL in log T, tau^2 = the DerSimonian-Laird between-relation "
        f"variance of log T = {_f(r['between_relation_variance_log_t'])}); "
        f"{r['groups_raw_at_bound']} raw fits ran to a bound (weight 0).",
        "",
        table(
            ["temperature", "T min", "T median", "T max", "ECE eval", "NLL eval", "NLL cal"],
            [
                [
                    "global",
                    _f(r["global_temperature"]),
                    _f(r["global_temperature"]),
                    _f(r["global_temperature"]),
                    _f(r["ece_global"]),
                    _f(r["nll_global"]),
                    _f(r["nll_calibration_global"]),
                ]
            ]
            + [
                [
                    f"per relation, {key}",
                    _f(r[f"t_{key}_min"]),
                    _f(r[f"t_{key}_median"]),
                    _f(r[f"t_{key}_max"]),
                    _f(r[f"ece_{key}"]),
                    _f(r[f"nll_{key}"]),
                    _f(r[f"nll_calibration_{key}"]),
                ]
                for key in ("raw", "shrunk")
            ],
        ),
        "",
        f"shrinkage weights: min {_f(r['weight_min'])}, median {_f(r['weight_median'])}, "
        f"max {_f(r['weight_max'])}",
        "",
        table(
            ["relation", "n cal", "n eval", "T raw", "weight", "T shrunk"],
            [
                [
                    p["relation"],
                    str(p["n_calibration"]),
                    str(p["n_evaluation"]),
                    _f(p["t_raw"]),
                    _f(p["weight"]),
                    _f(p["t_shrunk"]),
                ]
                for p in r["per_relation"]
            ],
        ),
        "",
    ]
    sets = s["answer_sets"]
    first = next(iter(sets.values()))
    out += [
        f"conformal answer sets (split conformal, LAC: nonconformity 1 - p(true tail), known "
        f"other answers excluded; alpha = {first['alpha']:g}, calibrated on the calibration "
        f"half: n = {first['n']}, rank k = ceil((n + 1)(1 - alpha)) = {first['k']}; "
        "measured on the evaluation half; the global T is fitted on the same calibration "
        "half, so the guarantee is approximate by one fitted scalar):",
        "",
        table(
            [
                "set temperature",
                "threshold",
                "coverage",
                "se",
                "mean size",
                "median",
                "singletons",
                "empty",
            ],
            [
                [
                    key.replace("_", " "),
                    _f(v["threshold"]),
                    _f(v["coverage"]),
                    _f(v["coverage_se"]),
                    _f(v["mean_size"], 3),
                    _f(v["median_size"], 1),
                    _f(v["singletons"]),
                    str(v["empty"]),
                ]
                for key, v in sets.items()
            ],
        ),
        "",
    ]
    rc = s["risk_coverage"]
    cov = next(iter(rc.values()))["coverage"]
    out += [
        "risk-coverage of the top-1 tail (confidence = its probability, loss = wrong; tied "
        "confidences as one block):",
        "",
        table(
            ["temperature", "AURC", "AUGRC", f"risk at {cov:.0%} coverage", "risk at 100%"],
            [
                [
                    key.replace("_", " "),
                    _f(v["aurc"]),
                    _f(v["augrc"]),
                    _f(v["risk_at_coverage"]),
                    _f(v["risk"]),
                ]
                for key, v in rc.items()
            ],
        ),
        "",
    ]
    return out


def _audit_section(
    a: AuditResult, table: Callable[..., str], markdown: bool, plots: bool
) -> list[str]:
    """One audit's lines: heading, metric table, invariants and ties, per-relation ECE,
    notes, diagrams (markdown) and reliability tables."""
    out = [
        ("## " if markdown else "") + _audit_heading(a).replace("\n", "\n\n" if markdown else "\n"),
        "",
    ]
    header, rows = _audit_rows(a)
    out += [table(header, rows), ""]
    checks = ", ".join(f"{k}: {'ok' if v else 'FAILED'}" for k, v in a.invariants.items())
    s = a.summary
    out += [
        f"exact invariants under T: {checks}",
        "",
        f"ties created by / T: {s['ties_created']} (largest original gap "
        f"{s['max_tie_gap_ulps']} ulps, bound {s['max_tie_gap_bound_ulps']}; x / T is "
        "only weakly monotone in floating point); strict inversions "
        f"{s['strict_inversions']}, broken ties {s['ties_broken']}. Ranking metrics "
        "(MRR, Hits@k, AUC) come from the model's own scores.",
        "",
    ]
    if a.name == "tail" and "relation_temperature" in s:
        out += _beyond_t(s, table)
    if a.per_relation:
        out += [
            f"per-relation ECE (relations with >= {MIN_RELATION_ITEMS} evaluation items):",
            "",
        ]
        out.append(
            table(
                ["relation", "n", "ECE before", "ECE after"],
                [
                    [p["relation"], str(p["n"]), _f(p["ece_before"]), _f(p["ece_after"])]
                    for p in a.per_relation
                ],
            )
        )
        out.append("")
    out += [("- " if markdown else "") + note for note in a.notes]
    out.append("")
    if markdown and plots:
        out += [
            f"![{a.name} before](reliability_{a.name}_before.png) "
            f"![{a.name} after](reliability_{a.name}_after.png)",
            "",
        ]
    for key, tab in a.tables.items():
        out += [f"reliability ({a.name}, {key}):", ""]
        out += [tab.to_markdown() if markdown else tab.to_text(), ""]
    return out


def _leak_line(result: dict) -> str:
    """Test triples that also occur in train or repeat within test: counts (triples and
    queries, both directions) and whether they were dropped."""
    in_train = result.get("num_test_in_train", 0)
    dup = result.get("num_test_duplicates", 0)
    dropped = result.get("num_test_dropped", 0)
    n = result.get("num_test", 0) + dropped
    line = (
        f"test leakage: {in_train} of {n} test triples also occur in train, {dup} repeat an "
        f"earlier test triple ({2 * in_train} and {2 * dup} of {2 * n} queries, both "
        "directions)"
    )
    if dropped:
        return line + f"; {dropped} dropped (--data.drop_leaked), {n - dropped} kept"
    if in_train or dup:
        return line + "; kept (--data.drop_leaked true drops them)"
    return line


def _render(
    result: dict,
    audits: Sequence[AuditResult],
    data_summary: str,
    markdown: bool,
    plots: bool = False,
) -> str:
    table = _md_table if markdown else _text_table
    h1, h2 = ("# ", "## ") if markdown else ("", "")
    out = [
        f"{h1}ComplEx link prediction: {result['dataset']} "
        f"(seed {result['seed']}, mode {result['mode']})",
        "",
        data_summary,
        "",
        _leak_line(result),
        "",
    ]
    out += [f"{h2}Filtered ranking (test, both directions)", ""]
    out.append(table(["ties", "MRR", "Hits@1", "Hits@3", "Hits@10"], _ranking_rows(result)))
    out += [
        "",
        f"training: {result['epochs']} epochs, {result['train_seconds']:.2f} s "
        f"({result['epoch_seconds']:.3f} s/epoch)",
        "",
    ]
    if result.get("fit_costs"):
        costs = ", ".join(
            f"{k} {v['seconds']:.3f} s / {v['peak_mb']:.1f} MB"
            + (
                f" (process {v['process_peak_mb']:.0f} MB)"
                if v.get("process_peak_mb") is not None
                else ""
            )
            for k, v in result["fit_costs"].items()
        )
        out += [f"fit costs (time / added peak memory): {costs}", ""]
    for a in audits:
        out += _audit_section(a, table, markdown, plots)
    status = "all invariants hold" if result["invariants_ok"] else "AN INVARIANT FAILED"
    out.append(f"{'**' if markdown else ''}{status}{'**' if markdown else ''}")
    return "\n".join(out) + "\n"


def _plot(audit: AuditResult, output_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from torchcal.plotting import reliability_diagram

    paths = []
    for key in ("before", "after"):
        fig, ax = plt.subplots(figsize=(4.5, 4.5))
        reliability_diagram(audit.tables[key], ax=ax)
        t = audit.summary["temperature"]
        label = "before scaling" if key == "before" else f"after T = {t:.3f}"
        ece = audit.summary[f"ece_{key}"]
        ax.set_title(f"{audit.name} audit, {label}\nECE {ece:.4f}")
        path = os.path.join(output_dir, f"reliability_{audit.name}_{key}.png")
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths


def write_reports(
    output_dir: str,
    result: dict,
    audits: Sequence[AuditResult],
    data_summary: str,
    plots: bool = True,
) -> dict[str, str]:
    """Write ``report.json`` / ``report.txt`` / ``report.md`` (and the PNGs) to ``output_dir``.
    The command line's ``--audit.plots`` is this signature's (jsonargparse reads it).

    Args:
        output_dir: where the reports go.
        result: the run's numbers (``report.json``).
        audits: the audits' results.
        data_summary: one line about the dataset.
        plots: write PNG reliability diagrams.
    """
    os.makedirs(output_dir, exist_ok=True)
    paths = {
        "json": os.path.join(output_dir, "report.json"),
        "txt": os.path.join(output_dir, "report.txt"),
        "md": os.path.join(output_dir, "report.md"),
    }
    with open(paths["json"], "w", encoding="utf-8") as fh:
        json.dump(json_ready(result), fh, indent=2, sort_keys=True)
        fh.write("\n")
    with open(paths["txt"], "w", encoding="utf-8") as fh:
        fh.write(_render(result, audits, data_summary, markdown=False))
    with open(paths["md"], "w", encoding="utf-8") as fh:
        fh.write(_render(result, audits, data_summary, markdown=True, plots=plots))
    if plots:
        for a in audits:
            for i, p in enumerate(_plot(a, output_dir)):
                paths[f"png_{a.name}_{'before' if i == 0 else 'after'}"] = p
    return paths
