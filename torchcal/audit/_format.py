"""Text and markdown renderings of a report dict (the JSON schema of
:mod:`torchcal.audit.report`), and the one escaping of a group name for a console line."""

from __future__ import annotations

from typing import Any

from torchcal.audit.segments import DISCARD, segment_section

#: longest group name shown in full on a line (longer ones are cut with "...")
NAME_LIMIT = 60
#: groups whose reliability table the text and markdown show (the worst first)
TABLE_GROUPS = 20
#: groups (and reasons, warnings) the console shows, the worst first; the files show all
CONSOLE_GROUPS = 20

_SEVERITY = {"fail": 0, "inconclusive": 1, "pass": 2}


def worst_groups(groups: dict[str, dict[str, Any]], limit: int | None) -> set[str]:
    """The names of at most ``limit`` groups with items, worst first: FAIL, then
    INCONCLUSIVE, then PASS; within each the largest |gap| near the threshold (or debiased
    ECE) first; ``None``: all of them."""

    def badness(kv: tuple[str, dict[str, Any]]) -> tuple[int, float]:
        s = kv[1]
        w = s.get("threshold_gap")
        size = abs(w["gap"]) if w and w.get("gap") is not None else (s.get("ece_debiased") or 0.0)
        return (_SEVERITY.get(s.get("verdict", "pass"), 2), -size)

    items = sorted(((k, v) for k, v in groups.items() if v.get("n")), key=badness)
    return {k for k, _ in items[:limit]}


def display_name(name: Any, limit: int = NAME_LIMIT) -> str:
    """``name`` safe on one console line: every non-printable character (escape sequences,
    newlines, tabs, NUL, bidi controls) written as a Python escape (``\\x1b``, ``\\n``,
    ``\\u202e``), a backslash doubled, and names longer than ``limit`` cut with ``...``, so no
    group name can draw a fake line (``verdict: PASS``) or move the cursor.

    Example:
        >>> display_name("ok\\n\\x1b[32mverdict: PASS")
        'ok\\\\n\\\\x1b[32mverdict: PASS'
    """
    text = str(name)
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    s = "".join(out)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _f(x: Any, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _ci(pair: Any, digits: int = 4, sign: bool = False) -> str:
    if pair is None or None in pair:
        return "n/a"
    fmt = f"{{:+.{digits}f}}" if sign else f"{{:.{digits}f}}"
    return f"[{fmt.format(pair[0])}, {fmt.format(pair[1])}]"


def _nll(s: dict[str, Any]) -> str:
    if s.get("nll_infinite"):
        return f"inf ({s.get('nll_infinite_rows', '?')} rows)"
    return _f(s["nll"])


def _deb(s: dict[str, Any]) -> str:
    if s.get("ece_debiased") is None:
        return "n/a"
    return "0 (clipped)" if s.get("ece_debiased_clipped") else _f(s["ece_debiased"])


def _metric_cells(s: dict[str, Any], level: str) -> list[str]:
    gap = s.get("threshold_gap")
    g = "n/a"
    if gap is not None and gap.get("gap") is not None:
        g = f"{gap['gap']:+.4f} {_ci(gap.get('gap_ci'), 3, sign=True)} (n={gap['n']})"
    return [
        str(s["n"]),
        _f(s["ece"]),
        _deb(s),
        _ci(s["ece_ci"]),
        _f(s["mce"]),
        _f(s["brier"]),
        _nll(s),
        _f(s["accuracy"]),
        g,
        str(s.get("verdict", "-")).upper(),
    ]


def _head(d: dict[str, Any]) -> list[str]:
    level = _level(d)
    binary = d["settings"].get("reading") == "binary"
    head = ["group", "n", "ECE", "debiased", f"{level} CI", "MCE", "Brier", "NLL"]
    return head + ["acc@0.5" if binary else "accuracy", f"gap near t [{level}]", "verdict"]


def _level(d: dict[str, Any]) -> str:
    return f"{100 * d['settings'].get('interval_level', 0.9):g}%"


def _rows(
    d: dict[str, Any], name: Any = display_name, keep: set[str] | None = None
) -> list[list[str]]:
    level = _level(d)
    rows = [["pooled"] + _metric_cells(d["pooled"], level)]
    if d["settings"].get("grouped"):
        rows += [[name(n)] + _metric_cells(s, level) for n, s in d["groups"].items()
                 if keep is None or n in keep]  # fmt: skip
    return rows


def _kept(d: dict[str, Any], limit: int | None) -> set[str] | None:
    """The groups a console of ``limit`` rows shows (the worst), None for all."""
    groups = d["groups"] if d["settings"].get("grouped") else {}
    return None if limit is None or len(groups) <= limit else worst_groups(groups, limit)


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


def rule_text(d: dict[str, Any]) -> str:
    """The rule, its level and its power in one sentence (printed under the title)."""
    st = d["settings"]
    t, tol = st.get("threshold"), st["tolerance"]
    alpha, power = st.get("alpha", 0.05), st.get("power", 0.8)
    what = f"the gap (confidence - observed rate) near {t:g}" if t is not None else "the ECE"
    lv = f"{100 * (1 - 2 * alpha):g}%"
    fam = st.get("family", 1)
    cond = (
        f"; a segment by its conditional p-value, p / {DISCARD:g} where p <= {DISCARD:g}"
        if d.get("segments")
        else ""
    )
    return (
        f"rule: each row is judged on {what} against the tolerance {tol:g}: PASS when its "
        f"{lv} interval lies inside, FAIL when it lies outside (Holm over {fam} "
        f"row{'s' if fam != 1 else ''}{cond}), else INCONCLUSIVE; each wrong PASS or FAIL has "
        f"probability <= {alpha:g}; 'detects' = a FAIL with {100 * power:g}% power"
    )


def _sections(
    d: dict[str, Any], limit: int | None = None
) -> list[tuple[str, str, list[str], list[list[str]]]]:
    st = d["settings"]
    title = (
        f"torchcal audit: {d['verdict'].upper()} ({st['n_rows']} rows, reading={st['reading']}, "
        f"{st['n_bins']} bins, tolerance {st['tolerance']:g}, alpha {st.get('alpha', 0.05):g})"
    )
    keep = _kept(d, limit)
    out = [("summary", title, _head(d), _rows(d, keep=keep))]
    bins = _bins("pooled", d["pooled"])
    title = "reliability tables (non-empty bins)"
    if st.get("grouped"):
        shown = worst_groups(d["groups"], TABLE_GROUPS)
        bins += [r for name, s in d["groups"].items() if name in shown
                 for r in _bins(display_name(name), s)]  # fmt: skip
        if len(shown) < len(d["groups"]):
            title += (f" of the {len(shown)} worst of {len(d['groups'])} groups (every group's "
                      f"table is in report.json)")  # fmt: skip
    rate = "positive rate" if st.get("reading") == "binary" else "accuracy"
    bin_head = ["group", "bin", "n", "confidence", rate, "95% Wilson"]
    out.append(("reliability", title, bin_head, bins))
    costs = [(n, s.get("cost")) for n, s in [("pooled", d["pooled"]), *d["groups"].items()]]
    costs = [(n, c) for n, c in costs if c is not None and "threshold" in (c or {})
             and (keep is None or n == "pooled" or n in keep)]  # fmt: skip
    if costs:
        head = ["group", "threshold", "automated", "error rate", "95% Wilson", "cost/item", "naive"]
        rows = [
            [display_name(n), _f(c["threshold"], 2), str(c["n_automated"]), _f(c["error_rate"]),
             _ci(c["error_rate_ci"], 3), _f(c["cost_per_item"]), _f(c["naive_threshold"], 3)]
            for n, c in costs
        ]  # fmt: skip
        out.append(("costs", "automation threshold from the costs", head, rows))
    return out + segment_section(d, display_name)


def _judged(s: dict[str, Any], threshold: Any) -> str:
    """The quantity a row's verdict is judged on (for the temperature lines)."""
    w = s.get("threshold_gap")
    if threshold is not None and w:
        return f"gap {_f(w.get('gap'))} {_ci(w.get('gap_ci'), 3, sign=True)}"
    return f"debiased ECE {_deb(s)} {_ci(s.get('ece_ci'), 3)}"


def _temperature_lines(d: dict[str, Any], limit: int | None = None) -> list[str]:
    tp = d.get("temperature")
    if not tp:
        return []
    t = d["settings"].get("threshold")
    keep = _kept(d, limit)  # the console: the groups its table shows
    shown = [(k, v) for k, v in tp["group_T"].items() if keep is None or k in keep]
    more = (
        f", and {len(tp['group_T']) - len(shown)} more" if len(shown) < len(tp["group_T"]) else ""
    )
    groups = ", ".join(f"{display_name(k)} {v:.4f}" for k, v in shown) + more
    lines = [f"temperature: pooled T = {tp['pooled_T']:.4f}; per group: {groups} (fit on "
             f"{tp['n_fit']} rows, evaluated on {tp['n_eval']} held-out rows)"]  # fmt: skip
    for key in ("eval_before", "eval_after"):
        ev = tp[key]
        rows = [("pooled", ev["pooled"])]
        if d["settings"].get("grouped"):
            rows += [(k, v) for k, v in ev["groups"].items() if keep is None or k in keep]
        parts = [f"{display_name(n)} {_judged(s, t)} {s['verdict'].upper()}" for n, s in rows]
        lines.append(f"  {key}: {ev['verdict'].upper()}: " + "; ".join(parts))
    return lines


def _concentration_lines(d: dict[str, Any]) -> list[str]:
    c = d["settings"].get("confidences")
    if not c:
        return []
    line = (
        f"confidences: {c['distinct']} distinct values{' (in the sample)' if c.get('sampled') else ''}; "
        f"most common {c['top_value']:.4g} ({100 * c['top_share']:.1f}% of rows); min "
        f"{c['min']:.4g}, max {c['max']:.4g}, interquartile range {c['iqr']:.4g}"
    )
    out = [line]
    if c.get("grid"):
        out.append(
            f"  the confidences sit on a {c['grid']:g} grid: {d['settings']['n_bins']} bins "
            f"put each grid value in its own bin"
        )
    if c.get("top_share", 0) >= 0.5:
        out.append(
            f"  finding: {100 * c['top_share']:.0f}% of the rows state the same confidence "
            f"{c['top_value']:.4g}: the model barely ranks its answers"
        )
    return out


def _resolution_lines(d: dict[str, Any], limit: int = 20) -> list[str]:
    """The ECCE and resolution of the pooled row, then of each group whose confidence does not
    separate right from wrong answers (at most ``limit``; all of them in report.json)."""
    level = d["settings"].get("interval_level", 0.9)
    rows = [("pooled", d.get("pooled") or {})]
    if d["settings"].get("grouped"):
        bad = [(k, s) for k, s in (d.get("groups") or {}).items()
               if (s.get("resolution") or {}).get("separates") is False]  # fmt: skip
        rows += bad[:limit]
    out = []
    for name, s in rows:
        r = s.get("resolution")
        if r:
            lo, hi = r["auroc_ci"]
            grid = "" if r["distinct_exact"] else " (fine bins)"
            out.append(
                f"resolution {display_name(name)}: ECCE {_f(r['ecce'])} ({_f(r['ecce_sigma'], 2)} "
                f"sigma); AUROC {_f(r['auroc'], 3)} [{_f(lo, 3)}, {_f(hi, 3)}] ({100 * level:g}%); "
                f"{r['distinct']} distinct values{grid}, {100 * (r['top_share'] or 0):.1f}% at "
                f"{_f(r['top_value'], 3)}"
            )
    return out


def _read_lines(d: dict[str, Any]) -> list[str]:
    log = d.get("read") or {}
    out = []
    excluded = log.get("excluded") or []
    if excluded:
        total = sum(int(e.get("count", 0)) for e in excluded)
        parts = [
            f"{display_name(e.get('column'))}: {e.get('reason')}: {e.get('count')} ("
            + (f"first {display_name(e.get('text'), 40)!s} at {e['where']})" if e.get("where")
               else f"e.g. {display_name(e.get('text'), 40)!s})")
            for e in excluded
        ]  # fmt: skip
        out.append(
            f"excluded rows: {total} of {log.get('rows', '?')} left out; " + "; ".join(parts)
        )
    pct = {k: v for k, v in (log.get("percent") or {}).items() if v}
    if pct:
        out.append(
            "percents read: "
            + ", ".join(
                f"{display_name(k)} {v} values such as '85%' as 0.85" for k, v in pct.items()
            )
        )
    return out


def _engine_lines(d: dict[str, Any]) -> list[str]:
    engine = d["settings"].get("engine")
    return [f"engine: {engine}"] if engine else []


def _reason_lines(d: dict[str, Any]) -> list[str]:
    lines = [f"verdict: {d['verdict'].upper()}"]
    lines += [f"  - {r}" for r in d.get("reasons") or []]
    lines += [f"warning: {w}" for w in d["warnings"]]
    return lines


def _tail(d: dict[str, Any], limit: int | None = None) -> list[str]:
    return (
        _concentration_lines(d)
        + _resolution_lines(d)
        + _read_lines(d)
        + _engine_lines(d)
        + _temperature_lines(d, limit)
        + [rule_text(d)]
        + _reason_lines(d)
    )


def note_lines(d: dict[str, Any]) -> list[str]:
    """The notes the console prints under the tables (the confidences' concentration and
    grid, rows excluded, percents read, the engine), for the HTML page."""
    return _concentration_lines(d) + _read_lines(d) + _engine_lines(d)


def report_text(d: dict[str, Any], limit: int | None = None) -> str:
    """Console text of a report dict; with ``limit`` (the console: :data:`CONSOLE_GROUPS`)
    the ``limit`` worst groups, reasons and warnings, and how many more the files hold."""
    parts = []
    for i, (_, title, head, rows) in enumerate(_sections(d, limit)):
        more = len(d["groups"]) - len(rows) + 1 if i == 0 and d["settings"].get("grouped") else 0
        note = (f"\n... and {more} more groups (the {len(rows) - 1} worst are shown; "
                f"report.json, report.md and report.txt of --out DIR hold every group)")  # fmt: skip
        parts.append(title + "\n" + _grid(head, rows) + (note if more > 0 else ""))
    tail = _tail(d, limit)
    if limit is not None:
        tail = _capped(tail, "  - ", limit, "reasons")
        tail = _capped(tail, "warning: ", limit, "warnings")
    parts.append("\n".join(tail))
    return "\n\n".join(p for p in parts if p) + "\n"


def _capped(lines: list[str], prefix: str, limit: int, what: str) -> list[str]:
    """``lines`` with at most ``limit`` of those starting with ``prefix``, then a count."""
    hits = [i for i, x in enumerate(lines) if x.startswith(prefix)]
    if len(hits) <= limit:
        return lines
    drop = set(hits[limit:])
    out = [x for i, x in enumerate(lines) if i not in drop]
    at = hits[limit - 1] + 1 if limit else hits[0]
    more = f"{prefix}... and {len(drop)} more {what} (every one is in report.json)"
    return out[:at] + [more] + out[at:]


def _md_cell(text: str) -> str:
    """A markdown table cell: ``|`` escaped, ``&``, ``<``, ``>`` as HTML entities (no tag)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("|", "\\|")


def md_text(text: str) -> str:
    """``text`` (a group name) safe in markdown: ``&``, ``<``, ``>`` as HTML entities, as the
    HTML page escapes them (no tag, no ``onerror``), and the characters that make links,
    emphasis, code or a cell boundary (``\\ ` * _ [ ] | ~``) backslash-escaped; an ``_``
    between two letters or digits is left as it is (it cannot emphasise).

    Example:
        >>> print(md_text("<img src=x onerror=alert(1)>"), md_text("[a](b) *c* open_qa _x"))
        &lt;img src=x onerror=alert(1)&gt; \\[a\\](b) \\*c\\* open_qa \\_x
    """
    out = []
    for i, ch in enumerate(text):
        if ch in "&<>":
            out.append({"&": "&amp;", "<": "&lt;", ">": "&gt;"}[ch])
        elif ch == "_":
            inner = 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()
            out.append("_" if inner else "\\_")
        elif ch in "\\`*[]|~":
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def report_markdown(d: dict[str, Any]) -> str:
    """Markdown of a report dict."""
    parts = []
    for i, (_, title, head, rows) in enumerate(_sections(d)):
        md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        md += ["| " + " | ".join([md_text(r[0]), *map(_md_cell, r[1:])]) + " |" for r in rows]
        parts.append(("# " if i == 0 else "## ") + title + "\n\n" + "\n".join(md))
    extra = _tail(d)
    parts.append(
        "\n".join(f"- {md_text(x.strip())}" if not x.startswith("verdict") else x for x in extra)
    )
    return "\n\n".join(parts) + "\n"
