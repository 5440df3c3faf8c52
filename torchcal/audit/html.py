"""The audit's one self-contained HTML page: :func:`render_html`.

The page is a single file that opens offline: CSS and JS are inlined from
``torchcal/audit/assets/`` (read with :mod:`importlib.resources`), the data travels as inline
JSON in ``<script type="application/json" id="audit-data">``, and a Content-Security-Policy
meta tag (:data:`CSP`) forbids every fetch. It shows the verdict banner with its reasons, the
warnings, a per-group summary table (from :meth:`AuditReport.to_dict`), the temperature and
cost sections when present, and an interactive reliability diagram of the embedded sample
(``report.sample``) with a group selector (``#group``), a bin-count slider (``#bins``) and a
log-scale temperature slider (``#temperature``) that recompute the bars, the table
(``#table``) and the ECE (``#ece``, full float64 value in ``data-value``) in the page.

The page's arithmetic mirrors :meth:`AuditReport.ece_at` (float64, the bin rule
``min(floor(c * B), B - 1)``, L1 ECE ``sum_b |sum c - sum y| / n``); the browser test checks
them equal to 1e-9. Non-finite numbers travel as the strings ``"NaN"``, ``"Infinity"`` and
``"-Infinity"`` (JSON has no literal for them); ``<``, ``>`` and ``&`` are written as
``\\u003c``-style escapes, so no string (a group named ``</script>``) can end the data block.
"""

from __future__ import annotations

import html
import json
import math
from importlib import resources
from typing import Any

import torch

from torchcal.audit._format import note_lines, rule_text
from torchcal.audit.resolution import resolution_section
from torchcal.audit.segments import segment_html

#: The page's Content-Security-Policy: inline script and style only, images from data: URLs.
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by ``"NaN"``, ``"Infinity"`` or
    ``"-Infinity"`` (what JS ``Number()`` reads back), tuples as lists and tensors as lists.

    Example:
        >>> json_safe({"a": [1.0, float("inf")], "b": (float("nan"),)})
        {'a': [1.0, 'Infinity'], 'b': ['NaN']}
    """
    if isinstance(obj, torch.Tensor):
        obj = obj.tolist()
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def script_json(obj: Any) -> str:
    """JSON text of ``obj`` (through :func:`json_safe`) safe inside a ``<script>`` element:
    ``<``, ``>`` and ``&`` become ``\\u003c``, ``\\u003e``, ``\\u0026`` (they occur only in
    strings, where the escapes mean the same characters). Floats keep full precision.

    Example:
        >>> script_json({"name": "</script>", "x": 0.1})
        '{"name":"\\\\u003c/script\\\\u003e","x":0.1}'
    """
    text = json.dumps(json_safe(obj), separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _field(sample: Any, name: str) -> Any:
    return sample.get(name) if isinstance(sample, dict) else getattr(sample, name, None)


def sample_data(
    sample: Any, settings: dict[str, Any], names: list[str] | None = None
) -> dict[str, Any] | None:
    """The embedded sample as the page reads it: ``preds`` flat float64 (row-major for
    multiclass), ``classes`` (1 = binary), ``target``, ``group`` ids, ``names`` (the
    sample's own, else ``names``: the report's group names in id order), ``input``.
    ``sample`` is an object or a ``dict`` with ``preds``, ``target``, ``group``, ``names``;
    ``None`` when it holds no rows.

    Example:
        >>> s = {"preds": torch.tensor([0.25, 0.75], dtype=torch.float64),
        ...      "target": torch.tensor([0, 1]), "group": None, "names": ["all"]}
        >>> d = sample_data(s, {"input": "probs"})
        >>> d["classes"], d["preds"], d["group"]
        (1, [0.25, 0.75], [0, 0])
        >>> sample_data({}, {}) is None  # no kept rows (a report read from JSON)
        True
    """
    if sample is None or _field(sample, "preds") is None or _field(sample, "target") is None:
        return None
    preds = torch.as_tensor(_field(sample, "preds")).detach().cpu().to(torch.float64)
    target = torch.as_tensor(_field(sample, "target")).detach().cpu().reshape(-1)
    n = target.numel()
    if n == 0:
        return None
    binary = preds.dim() == 1 or (preds.dim() == 2 and preds.shape[1] == 1)
    classes = 1 if binary else int(preds.shape[1])
    if preds.numel() != n * classes:
        raise ValueError(
            f"sample: expected preds of shape ({n},) or ({n}, C), got {tuple(preds.shape)}"
        )
    group = _field(sample, "group")
    group = torch.zeros(n, dtype=torch.int64) if group is None else torch.as_tensor(group)
    return {
        "input": settings.get("input", "probs"),
        "classes": classes,
        "preds": json_safe(preds.reshape(-1)),
        "target": target.to(torch.int64).tolist(),
        "group": group.detach().cpu().reshape(-1).to(torch.int64).tolist(),
        "names": [str(x) for x in (_field(sample, "names") or names or [])],
    }


def page_data(report: Any) -> dict[str, Any]:
    """Everything the page's script reads: ``report`` (``report.to_dict()``), ``sample``
    (:func:`sample_data` or ``None``), ``n_bins`` and ``threshold``, JSON-safe. The
    ``audit-data`` block of :func:`render_html` parses back to exactly this.

    Example:
        >>> from torchcal.audit import audit
        >>> r = audit(torch.tensor([0.2, 0.9, 0.7]), torch.tensor([0, 1, 1]))
        >>> d = page_data(r)
        >>> d["n_bins"], d["sample"]["target"]
        (10, [0, 1, 1])
    """
    report_dict = report.to_dict()
    settings = report_dict.get("settings", {})
    return json_safe(
        {
            "report": report_dict,
            "sample": sample_data(
                getattr(report, "sample", None), settings, list(report_dict.get("groups") or {})
            ),
            "n_bins": int(settings.get("n_bins", 10)),
            "threshold": settings.get("threshold"),
        }
    )


def _fmt(x: Any, digits: int = 4) -> str:
    """A number for a table cell (``-`` for missing)."""
    if x is None:
        return "-"
    if isinstance(x, bool) or isinstance(x, int):
        return f"{x:,}" if not isinstance(x, bool) else str(x)
    if isinstance(x, float):
        return f"{x:.{digits}f}" if math.isfinite(x) else str(x)
    if isinstance(x, (list, tuple)) and len(x) == 2:
        return f"[{_fmt(x[0], digits)}, {_fmt(x[1], digits)}]"
    return html.escape(str(x))


def _row(cells: list[str], cls: list[str] | None = None, tag: str = "td") -> str:
    cls = cls or [""] * len(cells)
    parts = (f"<{tag}{f' class={c!r}' if c else ''}>{v}</{tag}>" for v, c in zip(cells, cls))
    return "<tr>" + "".join(parts) + "</tr>"


def _gap_text(gap: dict[str, Any] | None) -> str:
    if not gap or gap.get("gap") is None:
        return "-"
    return f"{_fmt(gap.get('gap'), 3)} {_fmt(gap.get('gap_ci'), 3)} (n={_fmt(gap.get('n'))})"


def _deb_text(g: dict[str, Any]) -> str:
    if g.get("ece_debiased") is None:
        return "-"
    return "0 (clipped)" if g.get("ece_debiased_clipped") else _fmt(g.get("ece_debiased"))


def summary_table(d: dict[str, Any]) -> str:
    """The per-group summary: pooled first, then each group; the verdict is the second
    column (in view on a narrow screen), the table scrolls inside its box."""
    st = d.get("settings") or {}
    level = f"{100 * st.get('interval_level', 0.9):g}%"
    acc = "accuracy@0.5" if st.get("reading") == "binary" else "accuracy"
    head = ["group", "verdict", "n", "gap near threshold [" + level + "]", "debiased ECE"]
    head += [f"ECE {level} CI", "ECE", "MCE", "Brier", "NLL", acc]
    rows = [_row([html.escape(h) for h in head], ["name"] + [""] * (len(head) - 1), "th")]
    entries = [("pooled", d.get("pooled") or {})] + list((d.get("groups") or {}).items())
    for name, g in entries:
        verdict = str(g.get("verdict", "-"))
        nll = "inf" if g.get("nll_infinite") else _fmt(g.get("nll"))
        cells = [html.escape(str(name)), html.escape(verdict.upper()), _fmt(g.get("n"))]
        cells += [_gap_text(g.get("threshold_gap")), _deb_text(g), _fmt(g.get("ece_ci"))]
        cells += [_fmt(g.get(k)) for k in ("ece", "mce", "brier")] + [nll, _fmt(g.get("accuracy"))]
        rows.append(_row(cells, ["name", html.escape(verdict)] + [""] * (len(head) - 2)))
    return '<div class="scroll"><table id="summary">' + "".join(rows) + "</table></div>"


def banner(d: dict[str, Any]) -> str:
    """The verdict banner with every group's reasons, and the warnings."""
    verdict = str(d.get("verdict", "-"))
    reasons = [str(r) for r in d.get("reasons") or []]  # each row's reason, named, once
    items = "".join(f"<li>{html.escape(r)}</li>" for r in dict.fromkeys(reasons))
    cls = verdict if verdict in ("pass", "fail", "inconclusive") else "fail"
    out = f'<div class="banner {cls}" id="verdict">Verdict: {html.escape(verdict.upper())}'
    rule = rule_text(d) if "tolerance" in (d.get("settings") or {}) else ""
    out += f'<p class="rule">{html.escape(rule)}</p>' if rule else ""
    out += f"<ul>{items}</ul></div>" if items else "</div>"
    warnings = d.get("warnings") or []
    if warnings:
        lis = "".join(f"<li>{html.escape(str(w))}</li>" for w in warnings)
        out += f'<div class="warnings" id="warnings">Warnings:<ul>{lis}</ul></div>'
    notes = note_lines(d) if "settings" in d and "tolerance" in d["settings"] else []
    if notes:  # every note the console prints under its tables
        lis = "".join(f"<li>{html.escape(n.strip())}</li>" for n in notes)
        out += f'<div class="notes" id="notes">Notes:<ul>{lis}</ul></div>'
    return out


def cost_section(d: dict[str, Any]) -> str:
    """The recommended automation threshold per group, when costs were given."""
    entries = [("pooled", d.get("pooled") or {})] + list((d.get("groups") or {}).items())
    entries = [(k, g["cost"]) for k, g in entries if g.get("cost")]
    if not entries:
        return ""
    head = ["group", "threshold", "automated", "error rate", "95% CI", "cost / item", "naive"]
    rows = [_row(head, ["name"] + [""] * 6, "th")]
    keys = ("threshold", "n_automated", "error_rate", "error_rate_ci", "cost_per_item")
    for name, c in entries:
        cells = [html.escape(str(name))] + [_fmt(c.get(k)) for k in keys]
        rows.append(_row(cells + [_fmt(c.get("naive_threshold"))], ["name"] + [""] * 6))
    return '<h2>Automation threshold from costs</h2><table id="cost">' + "".join(rows) + "</table>"


def _eval_table(ev: dict[str, Any]) -> str:
    """A held-out evaluation (``verdict``, ``pooled``, ``groups``) as a compact table."""
    head = ["group", "verdict", "n", "gap near threshold", "debiased ECE [CI]", "ECE"]
    rows = [_row(head, ["name"] + [""] * 5, "th")]
    for name, g in [("pooled", ev.get("pooled") or {})] + list((ev.get("groups") or {}).items()):
        verdict = str(g.get("verdict", "-"))
        cells = [html.escape(str(name)), html.escape(verdict.upper()), _fmt(g.get("n"))]
        cells += [_gap_text(g.get("threshold_gap"))]
        cells += [f"{_deb_text(g)} {_fmt(g.get('ece_ci'))}", _fmt(g.get("ece"))]
        rows.append(_row(cells, ["name", html.escape(verdict), "", "", "", ""]))
    return "<table>" + "".join(rows) + "</table>"


def temperature_section(d: dict[str, Any]) -> str:
    """The fitted temperatures and each held-out evaluation (``eval_*``) as a table; other
    entries as key: value lines."""
    t = d.get("temperature")
    if not t:
        return ""
    temps = {"pooled": t.get("pooled_T"), **(t.get("group_T") or {})}
    out = '<h2>Temperature scaling</h2><table id="temperature-fit">'
    out += _row(["", "T"], ["name", ""], "th")
    out += "".join(_row([html.escape(str(k)), _fmt(v)], ["name", ""]) for k, v in temps.items())
    out += "</table>"
    rest = {k: v for k, v in t.items() if k not in ("pooled_T", "group_T")}
    for key, ev in rest.items():
        if isinstance(ev, dict) and "pooled" in ev:
            out += f"<h3>{html.escape(key.replace('_', ' '))} (held-out half)</h3>{_eval_table(ev)}"
    lines = [f"{k}: {json.dumps(json_safe(v))}" for k, v in rest.items()]
    lines = [x for x, v in zip(lines, rest.values()) if not (isinstance(v, dict) and "pooled" in v)]
    return out + (f'<p class="note">{html.escape("; ".join(lines))}</p>' if lines else "")


def _sample_note(data: dict[str, Any]) -> str:
    sample = data["sample"]
    if sample is None:
        return "No sample is embedded in this report: the interactive diagram is off."
    k = len(sample["target"])
    n_rows = data["report"].get("settings", {}).get("n_rows")
    if isinstance(n_rows, int) and n_rows > k:
        return f"Computed on a seeded uniform sample of {k:,} of {n_rows:,} rows."
    return f"Computed on all {k:,} rows."


def _controls(data: dict[str, Any]) -> str:
    names = data["sample"]["names"] if data["sample"] else []
    opts = '<option value="-1">pooled</option>' + "".join(
        f'<option value="{i}">{html.escape(n)}</option>' for i, n in enumerate(names)
    )
    return (
        f'<label>group <select id="group">{opts}</select></label>'
        f'<label>bins <input id="bins" type="range" min="2" max="50" step="1" '
        f'value="{data["n_bins"]}"> <span id="bins-value"></span></label>'
        '<label>temperature <input id="temperature" type="range" min="-1" max="1" '
        'step="any" value="0"> T = <span id="temperature-value"></span></label>'
        '<button id="reset" type="button">reset</button>'
        '<p>ECE <span id="ece" data-value=""></span> on <span id="n"></span> rows</p>'
    )


def _asset(name: str) -> str:
    return (
        resources.files("torchcal.audit")
        .joinpath("assets")
        .joinpath(name)
        .read_text(encoding="utf-8")
    )


def render_html(report: Any) -> str:
    """One self-contained HTML page for an :class:`~torchcal.audit.AuditReport` (module
    docstring): no network access, opens from a file.

    Example:
        >>> from torchcal.audit import audit
        >>> page = render_html(audit(torch.tensor([0.2, 0.9, 0.7]), torch.tensor([0, 1, 1])))
        >>> page.startswith("<!DOCTYPE html>"), 'id="audit-data"' in page
        (True, True)
    """
    data = page_data(report)
    d = data["report"]
    interactive = ""
    binary = (d.get("settings") or {}).get("reading") == "binary"
    rate = "positive rate" if binary else "accuracy"  # binary: the observed rate of y = 1
    if data["sample"] is not None:
        interactive = (
            '<div class="interactive"><svg id="diagram" width="420" height="420" '
            'role="img" aria-label="reliability diagram"></svg>'
            f'<div class="controls">{_controls(data)}'
            '<table id="table"><thead><tr><th>bin</th><th>range</th><th>n</th>'
            f"<th>confidence</th><th>{rate}</th></tr></thead><tbody></tbody></table>"
            "</div></div>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>torchcal audit: {html.escape(str(d.get('verdict', '')).upper())}</title>"
        f"<style>{_asset('report.css')}</style></head><body>"
        "<h1>torchcal audit</h1>"
        f"{banner(d)}<h2>Summary</h2>{summary_table(d)}{resolution_section(d)}{cost_section(d)}"
        f"{segment_html(d)}"
        f"{temperature_section(d)}<h2>Reliability diagram</h2>"
        f'<p class="note" id="sample-note">{html.escape(_sample_note(data))} '
        "Bars: accuracy per bin; shading: the gap to the mean confidence (red: over-confident, "
        "green: under-confident); grey: counts; dashed: the diagonal and the threshold.</p>"
        f"{interactive}"
        f'<script type="application/json" id="audit-data">{script_json(data)}</script>'
        f"<script>{_asset('report.js')}</script></body></html>\n"
    )
