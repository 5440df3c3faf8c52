"""The audit's bin-free numbers from the fine histogram of the state (docs/design.md 6c, 6g):
per row (pooled, then each group) the global ECCE and its sigma, the resolution (distinct
values, the share at the most common one, the AUROC of the confidence against the outcome with
its interval) and the finding for a judge whose confidence does not separate right from wrong
answers; the hint of how many rows would decide an INCONCLUSIVE row. Every number comes from
:mod:`torchcal.functional.histogram_scores`; this module shapes them for ``report.json``, the
console and the HTML page.
"""

from __future__ import annotations

import html
import math
from typing import Any

import torch

from torchcal.audit._format import display_name
from torchcal.audit.state import AuditState
from torchcal.functional.histogram_scores import (
    MAX_FINE_GROUPS,
    FineHistogram,
    auroc_from_histogram,
    ecce_from_histogram,
    rows_to_decide,
)
from torchcal.functional.multicalibration import ecce_pvalue

#: the finding of a row whose AUROC interval holds 0.5
NO_SEPARATION = "confidence does not separate right from wrong answers"
#: the finding of a row whose AUROC interval lies below 0.5
REVERSED = "confidence is higher on wrong answers than on right ones"
#: the note of a state without a fine histogram
NO_FINE = (
    "no fine histogram in this state (a state file written before torchcal kept one, a "
    "metric's state, or more than {cap} groups): no ECCE and no resolution (AUROC) reported"
)


def _f(x: float) -> float | None:
    return x if math.isfinite(x) else None


def resolution_rows(
    state: AuditState, level: float, weights: str = "importance"
) -> list[dict[str, Any] | None]:
    """One ``resolution`` dict per row (the pooled row, then the groups in ``state``'s order),
    or ``None`` for every row when the state has no fine histogram. ``weights``: how sample
    weights are read (``"importance"``: by their effective size, ``"frequency"``: as
    repetitions; docs/design.md 6f)."""
    if state.fine is None:
        return [None] * (1 + len(state.names))
    return histogram_rows(state.fine.with_pooled(), level, weights, state.grid is not None)


def histogram_rows(
    h: FineHistogram, level: float, weights: str = "importance", exact: bool = False
) -> list[dict[str, Any] | None]:
    """One ``resolution`` dict per row of the fine histogram ``h`` (``None`` for a row
    without rows or mass): the rows of :func:`resolution_rows`, and the segments' (issue 31
    item 5). ``exact``: the values lie on the 0.01 grid (one fine bin per value)."""
    ecce, scale, bound = ecce_from_histogram(h, weights)
    ratio = torch.where(scale > 0, ecce / scale.clamp_min(1e-300), torch.zeros_like(ecce))
    ratio = torch.where(torch.isfinite(ecce), ratio, torch.zeros_like(ecce))
    pval = ecce_pvalue(ratio)
    squares = {}
    if weights == "importance":  # DeLong on the effective numbers of right and wrong answers
        squares = {"pos2": h.pos2, "neg2": h.mass2 - h.pos2}
    auc = auroc_from_histogram(h.pos, h.mass - h.pos, level=level, **squares)
    mass = h.mass.sum(1)
    top = h.mass.argmax(1)
    top_mass = h.mass.gather(1, top[:, None])[:, 0]
    top_conf = (h.pos - h.gap).gather(1, top[:, None])[:, 0]  # sum w c of the top bin
    cols = {
        "ecce": ecce, "ecce_sigma": ratio, "ecce_scale": scale, "ecce_pvalue": pval,
        "ecce_bound": bound, "top_value": top_conf / top_mass, "top_share": top_mass / mass,
        "auroc": auc.auroc, "lo": auc.lower, "hi": auc.upper, "se": auc.se,
    }  # fmt: skip
    v = {k: t.tolist() for k, t in cols.items()}
    distinct = (h.mass > 0).sum(1).tolist()  # values with weight (a weight-0 row is none)
    n = h.count.sum(1).tolist()
    out: list[dict[str, Any] | None] = []
    for i in range(len(n)):
        if not n[i] or not mass[i] > 0:
            out.append(None)
            continue
        lo, hi = _f(v["lo"][i]), _f(v["hi"][i])
        separates = None if lo is None or hi is None else bool(lo > 0.5)
        out.append({
            "ecce": _f(v["ecce"][i]), "ecce_sigma": _f(v["ecce_sigma"][i]),
            "ecce_scale": _f(v["ecce_scale"][i]), "ecce_pvalue": _f(v["ecce_pvalue"][i]),
            "ecce_bound": _f(v["ecce_bound"][i]), "distinct": int(distinct[i]),
            "distinct_exact": exact, "top_value": _f(v["top_value"][i]),
            "top_share": _f(v["top_share"][i]), "auroc": _f(v["auroc"][i]),
            "auroc_ci": [lo, hi], "auroc_se": _f(v["se"][i]), "separates": separates,
        })  # fmt: skip
    return out


def finding(res: dict[str, Any] | None, level: float) -> str | None:
    """The finding of a row's resolution: its AUROC interval holds 0.5 (or lies below it)."""
    if not res or res["separates"] is not False:
        return None
    lo, hi = res["auroc_ci"]
    if lo is None or hi is None:
        return None
    what = NO_SEPARATION if hi >= 0.5 else REVERSED
    return (
        f"finding: {what}: AUROC {res['auroc']:.3f}, {100 * level:g}% interval [{lo:.3f}, "
        f"{hi:.3f}] holds 0.5, whatever its ECE ({res['distinct']} distinct values, "
        f"{100 * res['top_share']:.0f}% at {res['top_value']:.3g})"
        if hi >= 0.5
        else f"finding: {what}: AUROC {res['auroc']:.3f}, {100 * level:g}% interval [{lo:.3f}, "
        f"{hi:.3f}] lies below 0.5"
    )


def add_resolution(
    state: AuditState,
    pooled: dict[str, Any],
    groups: dict[str, dict[str, Any]],
    reasons: list[str],
    warn: list[str],
    level: float,
    weights: str = "importance",
) -> None:
    """Set ``resolution`` on every summary (``pooled``, then ``groups`` in ``state``'s name
    order; ungrouped, the one group is the pooled row) and add each row's finding to its
    reasons and to the report's ``reasons``; a note in ``warn`` when the state has none."""
    rows = resolution_rows(state, level, weights)
    if state.fine is None:
        warn.append(NO_FINE.format(cap=MAX_FINE_GROUPS))
    family = [("pooled", pooled)]
    if state.grouped:
        family += list(zip(state.names, (groups[n] for n in state.names), strict=True))
    for s in groups.values():
        s["resolution"] = None
    for (name, s), res in zip(family, rows, strict=False):
        s["resolution"] = res
        text = finding(res, level)
        if text is not None:
            s["reasons"] = [*s.get("reasons", []), text]
            reasons.append(f"{display_name(name)}: {text}")
    if not state.grouped:
        for s in groups.values():
            s["resolution"] = pooled["resolution"]
            s["reasons"] = list(pooled.get("reasons", []))


def decide_hint(s: dict[str, Any], threshold: float | None, tolerance: float) -> str:
    """``"; about N rows at this spread would decide (or a tolerance of X)"`` for an
    INCONCLUSIVE row (empty when no ``n`` decides at this estimate)."""
    if threshold is None:
        lo, hi = s["ece_ci"]
        est, n = s["ece_debiased"], s["n"]
        need = rows_to_decide(est, lo, hi, tolerance, n, two_sided=False)
        room = hi
        where = "rows"
    else:
        w = s["threshold_gap"]
        lo, hi = w["gap_ci"]
        est, n = w["gap"], w["n"]
        need = rows_to_decide(est, lo, hi, tolerance, n, two_sided=True)
        room = None if lo is None or hi is None else max(abs(lo), abs(hi))
        where = "rows in the window"
    out = f"; about {need:,} {where} at this spread would decide" if need else ""
    if room is not None and math.isfinite(room) and room < 1:
        out += f" (or a tolerance above {room:.3f} at this n)"
    return out


def _num(x: Any, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def resolution_section(d: dict[str, Any]) -> str:
    """The HTML table: one row per summary with a resolution (pooled first)."""
    entries = [("pooled", d.get("pooled") or {})] + list((d.get("groups") or {}).items())
    level = f"{100 * (d.get('settings') or {}).get('interval_level', 0.9):g}%"
    head = ["group", "ECCE", "ECCE / sigma", "p", f"AUROC [{level}]", "distinct", "top share"]
    rows = ["<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for name, s in entries:
        r = s.get("resolution")
        if not r:
            continue
        lo, hi = r["auroc_ci"]
        cells = [
            html.escape(str(name)), _num(r["ecce"], ".4f"), _num(r["ecce_sigma"], ".2f"),
            _num(r["ecce_pvalue"], ".2g"),
            f"{_num(r['auroc'], '.3f')} [{_num(lo, '.3f')}, {_num(hi, '.3f')}]",
            f"{r['distinct']:,}", f"{_num(100 * r['top_share'], '.1f')}%",
        ]  # fmt: skip
        cls = ' class="no-separation"' if r.get("separates") is False else ""
        rows.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if len(rows) == 1:
        return ""
    return (
        '<h2>Resolution and ECCE</h2><div class="scroll"><table id="resolution">'
        + "".join(rows)
        + "</table></div>"
    )
