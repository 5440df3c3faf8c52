"""Text and markdown renderings of a report dict (the JSON schema of
:mod:`torchcal.audit.report`)."""

from __future__ import annotations

from typing import Any

__all__ = ["report_markdown", "report_text"]


def _f(x: Any, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _ci(pair: Any, digits: int = 4) -> str:
    return (
        "n/a" if pair is None or None in pair else f"[{pair[0]:.{digits}f}, {pair[1]:.{digits}f}]"
    )


def _metric_cells(s: dict[str, Any]) -> list[str]:
    gap = s.get("threshold_gap")
    g = "n/a" if gap is None or gap["gap"] is None else f"{gap['gap']:+.4f} (n={gap['n']})"
    return [
        str(s["n"]),
        _f(s["ece"]),
        _ci(s["ece_ci"]),
        _f(s["ece_debiased"]),
        _f(s["mce"]),
        _f(s["brier"]),
        _f(s["nll"]),
        _f(s["accuracy"]),
        g,
        s["verdict"].upper(),
    ]


HEAD = ["group", "n", "ECE", "ECE 95% CI", "debiased", "MCE", "Brier", "NLL", "accuracy"]
HEAD += ["gap near t", "verdict"]


def _rows(d: dict[str, Any]) -> list[list[str]]:
    rows = [["pooled"] + _metric_cells(d["pooled"])]
    if d["settings"].get("grouped"):
        rows += [[name] + _metric_cells(s) for name, s in d["groups"].items()]
    return rows


def _grid(head: list[str], rows: list[list[str]]) -> str:
    w = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    line = lambda r: "  ".join(c.rjust(w[i]) if i else c.ljust(w[i]) for i, c in enumerate(r))  # noqa: E731
    return "\n".join([line(head)] + [line(r) for r in rows])


def _bins(name: str, s: dict[str, Any]) -> list[list[str]]:
    return [
        [
            name,
            f"[{r['lo']:.2f}, {r['hi']:.2f})",
            str(r["n"]),
            _f(r["confidence"]),
            _f(r["accuracy"]),
            _ci([r["ci_lo"], r["ci_hi"]], 3),
        ]
        for r in s["table"]
    ]


BIN_HEAD = ["group", "bin", "n", "confidence", "accuracy", "95% Wilson"]


def _sections(d: dict[str, Any]) -> list[tuple[str, str, list[str], list[list[str]]]]:
    st = d["settings"]
    t = st["threshold"]
    judged = f"|gap| near {t:g}" if t is not None else "ECE"
    title = (
        f"torchcal audit: {d['verdict'].upper()} ({st['n_rows']} rows, reading={st['reading']}, "
        f"{st['n_bins']} bins; fails when {judged} > {st['tolerance']:g})"
    )
    out = [("summary", title, HEAD, _rows(d))]
    bins = _bins("pooled", d["pooled"])
    if st.get("grouped"):
        bins += [r for name, s in d["groups"].items() for r in _bins(name, s)]
    out.append(("reliability", "reliability tables (non-empty bins)", BIN_HEAD, bins))
    costs = [(n, s.get("cost")) for n, s in [("pooled", d["pooled"]), *d["groups"].items()]]
    costs = [(n, c) for n, c in costs if c is not None and "threshold" in (c or {})]
    if costs:
        head = ["group", "threshold", "automated", "error rate", "95% Wilson", "cost/item", "naive"]
        rows = [
            [n, _f(c["threshold"], 2), str(c["n_automated"]), _f(c["error_rate"]),
             _ci(c["error_rate_ci"], 3), _f(c["cost_per_item"]), _f(c["naive_threshold"], 3)]
            for n, c in costs
        ]  # fmt: skip
        out.append(("costs", "automation threshold from the costs", head, rows))
    return out


def _temperature_lines(d: dict[str, Any]) -> list[str]:
    tp = d.get("temperature")
    if not tp:
        return []
    lines = [f"temperature: pooled T = {tp['pooled_T']:.4f}; per group: "
             + ", ".join(f"{k} {v:.4f}" for k, v in tp["group_T"].items())
             + f" (fit on {tp['n_fit']} rows, evaluated on {tp['n_eval']} held-out rows)"]  # fmt: skip
    for key in ("eval_before", "eval_after"):
        ev = tp[key]
        parts = [f"{n} ECE {_f(s['ece'])} {s['verdict'].upper()}" for n, s in ev["groups"].items()]
        lines.append(f"  {key}: {ev['verdict'].upper()}: " + "; ".join(parts))
    return lines


def _reason_lines(d: dict[str, Any]) -> list[str]:
    lines = [f"verdict: {d['verdict'].upper()}"]
    lines += [f"  - {r}" for r in d["pooled"]["reasons"]]
    lines += [f"warning: {w}" for w in d["warnings"]]
    return lines


def report_text(d: dict[str, Any]) -> str:
    """Console text of a report dict."""
    parts = []
    for _, title, head, rows in _sections(d):
        parts.append(title + "\n" + _grid(head, rows))
    parts.append("\n".join(_temperature_lines(d) + _reason_lines(d)))
    return "\n\n".join(p for p in parts if p) + "\n"


def report_markdown(d: dict[str, Any]) -> str:
    """Markdown of a report dict."""
    parts = []
    for i, (_, title, head, rows) in enumerate(_sections(d)):
        md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        md += ["| " + " | ".join(r) + " |" for r in rows]
        parts.append(("# " if i == 0 else "## ") + title + "\n\n" + "\n".join(md))
    extra = _temperature_lines(d) + _reason_lines(d)
    parts.append("\n".join(f"- {x.strip()}" if not x.startswith("verdict") else x for x in extra))
    return "\n\n".join(parts) + "\n"
