"""Segments in the audit (``--segments COL [COL ...]``; docs/design.md section 6g.1).

The streaming road (a file, a glob through ``--engine memory``) reads each segment column
through the same reader as the groups (:func:`~torchcal.audit.io.read_predictions` with the
column as its group, so the same rows are kept and rejected) in two passes: the first counts
every column's distinct texts (the rule of :func:`~torchcal.engines.segments.column_rule`:
the numeric columns' exact quantile edges), the second bins every row into each of its
segments (:func:`~torchcal.functional.calibration.binning.accumulate` with the segment as the
group: the groups' formula). The SQL engines compute the same
:class:`~torchcal.engines.segments.SegmentStats` with ``GROUPING SETS``
(:func:`~torchcal.engines.segments.segments_from_sql`).

The report judges each segment as a row of the family: with a threshold by the groups' window
gap test; without, FAIL by the segment's signed gap (:func:`attach_gap_tests`; ``|gap| >
tolerance`` implies ``ECE > tolerance``) and PASS by the ECE test. FAIL claims are
Holm-adjusted over the pooled row, the groups and the segments together; a segment can FAIL
the report but never holds back its PASS.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchcal.engines.segments import ColumnRule, SegmentStats, column_rule, crosses, finish
from torchcal.functional.calibration.binning import BinnedStats, accumulate
from torchcal.functional.calibration.readings import prepare_inputs
from torchcal.functional.calibration.weights import accumulate_weighted
from torchcal.functional.histogram_scores import (
    MAX_FINE_GROUPS,
    FineHistogram,
    auroc_from_histogram,
    fine_histogram,
)
from torchcal.functional.multicalibration import ecce_from_stats, ecce_pvalue
from torchcal.functional.verdict import FAIL, INCONCLUSIVE, PASS, mean_gap_test

#: segments listed in the report (the worst first)
WORST = 10
#: a segment whose FAIL p-value is above this leaves the family, the others enter it as
#: ``p / DISCARD`` (Holm on conditional p-values, Zhao, Small & Su 2019; docs/design.md 6g.1):
#: a calibrated segment's p-value is near 1 and stops diluting the ones near or past the
#: tolerance. The pooled row and the groups keep plain Holm (``1``)
DISCARD = 0.5


def family_discard(named: int, rows: int) -> Tensor:
    """The ``discard`` of :func:`~torchcal.functional.verdict.decide` for a family of ``rows``
    rows whose first ``named`` are the pooled row and the groups (``1``: plain Holm), the rest
    segments (:data:`DISCARD`).

    Example:
        >>> family_discard(2, 4).tolist()
        [1.0, 1.0, 0.5, 0.5]
    """
    out = torch.full((rows,), DISCARD, dtype=torch.float64)
    out[:named] = 1.0
    return out


class SegmentAccumulator:
    """Binned sums of every segment of crosses of up to ``depth`` columns, chunk by chunk."""

    def __init__(self, rules: Sequence[ColumnRule], depth: int, n_bins: int, input: str) -> None:
        self.rules, self.depth, self.n_bins, self.input = tuple(rules), depth, n_bins, input
        self.crosses = crosses(len(rules), depth)
        self.slot: dict[tuple[int, int], int] = {}
        self.stats: BinnedStats | None = None
        #: per slot (found segment) while at most MAX_FINE_GROUPS are found (the SQL roads'
        #: rule), then None for good
        self.fine: FineHistogram | None = FineHistogram.zeros(0)

    def update(self, preds: Tensor, target: Tensor, codes: Tensor, weight: Tensor | None) -> None:
        """Add rows: ``codes`` ``(N, F)`` each row's code per column (all known)."""
        reading = "binary" if preds.dim() == 1 or preds.shape[1] == 1 else "confidence"
        if reading == "binary" and preds.dim() == 2:
            preds = preds.reshape(-1)
        sizes = [r.size for r in self.rules]
        for ci, cols in enumerate(self.crosses):
            key = codes[:, cols[0]].clone()
            for j in cols[1:]:
                key = key * sizes[j] + codes[:, j]
            u, inv = torch.unique(key, return_inverse=True)
            slots = [self.slot.setdefault((ci, k), len(self.slot)) for k in u.tolist()]
            ids = torch.tensor(slots, dtype=torch.int64)[inv]
            prep = prepare_inputs(preds, target, reading=reading, input=self.input, groups=ids)
            w = None if weight is None else weight.to(torch.float64)
            s = (
                accumulate(prep, self.n_bins)
                if w is None
                else accumulate_weighted(prep, self.n_bins, w)
            )
            self._add(s)
            self._add_fine(prep, w)

    def _add_fine(self, prep: Any, w: Tensor | None) -> None:
        G = len(self.slot)
        if self.fine is None or G > MAX_FINE_GROUPS:
            self.fine = None
            return
        h = fine_histogram(prep.conf, prep.outcome, groups=prep.lead, num_groups=G, weight=w)
        self.fine = self.fine.grow(G).plus(h)

    def _add(self, s: BinnedStats) -> None:
        G = len(self.slot)

        def pad(x: BinnedStats) -> BinnedStats:
            extra = G - x.count.shape[0]
            return x.map(lambda t: torch.cat([t, t.new_zeros((extra, *t.shape[1:]))]))

        s = pad(s)
        self.stats = s if self.stats is None else pad(self.stats) + s

    def result(self, bins: int, min_rows: int) -> SegmentStats:
        """The :class:`~torchcal.engines.segments.SegmentStats` of the rows seen."""
        F, B = len(self.rules), self.n_bins
        cells = np.full((len(self.slot), F), -1, dtype=np.int64)
        sizes = [r.size for r in self.rules]
        for (ci, key), i in self.slot.items():
            for j in reversed(self.crosses[ci]):
                cells[i, j] = key % sizes[j]
                key //= sizes[j]
        st = self.stats if self.stats is not None else BinnedStats.zeros(0, 1, B)
        sums = np.stack([t[:, 0].numpy() for t in (st.conf, st.acc, st.conf2, st.conf_acc)], -1)
        w = None if st.weight is None else st.weight[:, 0].numpy()
        w2 = getattr(st, "weight2", None)
        return finish(
            self.rules, cells, st.count[:, 0].numpy(), sums, w, depth=self.depth, bins=bins,
            min_rows=min_rows, weight2=None if w2 is None else w2[:, 0].numpy(),
            fine=None if self.fine is None else self.fine.grow(len(self.slot)),
        )  # fmt: skip


class _Codes:
    """A column's codes for a reader's growing list of group names (computed once each)."""

    def __init__(self, rule: ColumnRule) -> None:
        self.rule, self.lut = rule, np.zeros(0, dtype=np.int64)

    def of(self, groups: Tensor, names: list[str]) -> Tensor:
        if len(names) > self.lut.size:
            self.lut = np.concatenate([self.lut, self.rule.codes(names[self.lut.size :])])
        out = torch.from_numpy(self.lut)[groups.long()] if groups.numel() else groups.long()
        if bool((out < 0).any()):  # pragma: no cover - the first pass saw every value
            raise ValueError(f"--segments: column {self.rule.name!r} changed between passes")
        return out


Batches = Callable[[str, str], Any]  # (path, column) -> the reader's batches, column as group
Mask = Callable[[str], Any]  # path -> the batches of the main group, blank names id -1


def _rows(b: Any, keep: Tensor) -> Any:
    """The batch ``b`` (a :class:`~torchcal.audit.io.Batch`) at the rows ``keep``."""
    if b.preds.shape[0] != keep.shape[0]:
        raise RuntimeError("stream_segments: the mask and a segment reader read other rows")
    w = None if b.weight is None else b.weight[keep]
    g = None if b.groups is None else b.groups[keep]
    return dataclasses.replace(b, preds=b.preds[keep], target=b.target[keep], groups=g, weight=w)


def stream_segments(
    batches: Batches, files: Sequence[str], columns: Sequence[str], *, input: str,
    n_bins: int, bins: int, depth: int, min_rows: int, mask: Mask | None = None,
) -> SegmentStats:  # fmt: skip
    """The segments of ``columns`` over ``files``, two passes of the reader per column;
    ``mask(path)``, the batches of the same rows whose group id -1 marks a row to leave out
    (the main group's blank names, ``group_null``), read beside them."""

    def read(path: str, cols: Sequence[str]) -> Iterator[tuple[Any, ...]]:
        readers = [batches(path, c) for c in cols]
        if mask is None:
            yield from zip(*readers, strict=True)
            return
        for m, *parts in zip(mask(path), *readers, strict=True):
            keep = m.groups >= 0
            if not bool(keep.all()):
                parts = [_rows(p, keep) for p in parts]
            yield tuple(parts)

    seen: list[dict[str, int]] = [{} for _ in columns]
    for j, col in enumerate(columns):
        for path in files:
            names: list[str] = []
            cnt = np.zeros(0, dtype=np.int64)
            for (b,) in read(path, [col]):
                names = b.group_names
                add = np.bincount(b.groups.numpy(), minlength=len(names))
                cnt = np.concatenate([cnt, np.zeros(len(names) - cnt.size, np.int64)]) + add
            for i in np.flatnonzero(cnt).tolist():
                seen[j][names[i]] = seen[j].get(names[i], 0) + int(cnt[i])
    rules = [
        column_rule(c, list(s), list(s.values()), bins) for c, s in zip(columns, seen, strict=True)
    ]
    acc = SegmentAccumulator(rules, depth, n_bins, input)
    for path in files:
        codes = [_Codes(r) for r in rules]
        for parts in read(path, columns):
            b = parts[0]
            cols = [cd.of(p.groups, p.group_names) for cd, p in zip(codes, parts, strict=True)]
            acc.update(b.preds, b.target, torch.stack(cols, 1), b.weight)
    return acc.result(bins, min_rows)


def overall_with_segments(rows: Tensor, named: int) -> Tensor:
    """The report's verdict code from the rows' codes ``(..., family)`` (:data:`~torchcal
    .functional.verdict.PASS`, ...), the first ``named`` rows the pooled row and the groups,
    the rest segments: FAIL when any row FAILs (Holm over all of them), PASS when the named
    rows all PASS (a segment's INCONCLUSIVE does not hold it back), else INCONCLUSIVE.

    Example:
        >>> overall_with_segments(torch.tensor([[PASS, INCONCLUSIVE], [PASS, FAIL]]), 1).tolist()
        [0, 1]
    """
    fail = (rows == FAIL).any(-1)
    ok = (rows[..., :named] == PASS).all(-1)
    return torch.where(fail, FAIL, torch.where(ok, PASS, INCONCLUSIVE))


def attach_gap_tests(
    stats: BinnedStats, rows: Sequence[dict[str, Any]], tolerance: float, *, alpha: float,
    power: float, family: int, weights: str,
) -> None:  # fmt: skip
    """Give each segment summary (ECE audits) its ``gap_test``: FAIL by the signed gap over the
    segment (:func:`~torchcal.functional.verdict.mean_gap_test`: ``|gap| > tolerance`` implies
    ``ECE > tolerance``, without the ECE's bias), PASS by the ECE test (``p_pass``) as the
    groups; the verdict's family reads it (docs/design.md section 6g.1)."""
    t = mean_gap_test(stats, tolerance, alpha=alpha, family=family, power=power, weights=weights)
    gap, ci, pf, det = (t[k].tolist() for k in ("gap", "gap_ci", "p_fail", "detectable"))
    for i, s in enumerate(rows):
        s["gap_test"] = {
            "n": s["n"], "gap": _v(gap[i]), "gap_ci": [_v(x) for x in ci[i]],
            "p_pass": s["ece_test"]["p_pass"], "p_fail": _v(pf[i]), "p_fail_holm": None,
            "detectable": _v(det[i]),
        }  # fmt: skip


def gap_reason(s: dict[str, Any], tolerance: float, alpha: float) -> str:
    """The reason of a segment that FAILs by its signed gap (:func:`attach_gap_tests`)."""
    g = s["gap_test"]
    lo, hi = g["gap_ci"]
    kind = "over" if g["gap"] > 0 else "under"
    p = g["p_fail_holm"]
    return (
        f"{kind}-confident by {abs(g['gap']) * 100:.1f} points (mean confidence - accuracy "
        f"{g['gap']:+.3f}, {100 * (1 - 2 * alpha):g}% interval [{lo:+.3f}, {hi:+.3f}], "
        f"n={s['n']}); outside +-{tolerance:g}, so its ECE is too (Holm-adjusted p "
        f"{'< 1e-16' if p < 1e-16 else f'= {p:.2g}'})"
    )


def segment_resolution(
    stats: BinnedStats, level: float = 0.9, weights: str = "importance"
) -> list[dict[str, Any]]:
    """Per segment the resolution at the segments' bins (issue 31 item 5; no fine histogram
    per segment): ``bins`` with rows (of ``n_bins``), the share and mean confidence of the
    heaviest bin, and the AUROC of the binned confidence against the outcome with DeLong's
    interval at ``level`` (:func:`~torchcal.functional.histogram_scores.auroc_from_histogram`,
    a bin's rows tied: at most the rows' AUROC resolution), ``separates``: whether the interval
    lies above 0.5 (``None`` when one outcome is absent). Importance weights: the right
    answers' ``sum w^2`` of a bin is taken as its weight share of the bin's ``sum w^2`` (the
    state holds ``sum w^2`` per bin, not per outcome; exact when the weights do not depend on
    the outcome within a bin).

    Example:
        >>> from torchcal.functional import binned_statistics
        >>> c = torch.tensor([0.15, 0.15, 0.85, 0.85, 0.85], dtype=torch.float64)
        >>> s = binned_statistics(c, torch.tensor([0, 0, 1, 1, 0]), n_bins=10,
        ...                       reading="binary", input="probs").pooled()
        >>> r = segment_resolution(s.map(lambda t: t[None]))[0]
        >>> r["bins"], r["top_share"], round(r["auroc"], 4)
        (2, 0.6, 0.8333)
    """
    m = stats.mass()[:, 0].to(torch.float64)
    pos = stats.acc[:, 0].to(torch.float64)
    neg = (m - pos).clamp_min(0)
    sq: dict[str, Tensor] = {}
    if weights == "importance" and stats.weight2 is not None:
        w2 = stats.weight2[:, 0].to(torch.float64)
        share = torch.where(m > 0, pos / torch.where(m > 0, m, 1.0), 0.0)
        sq = {"pos2": w2 * share, "neg2": w2 * (1 - share)}
    auc = auroc_from_histogram(pos, neg, level=level, **sq)
    top = m.argmax(1, keepdim=True)
    tm = m.gather(1, top)[:, 0]
    total = m.sum(1)
    tv = stats.conf[:, 0].to(torch.float64).gather(1, top)[:, 0] / torch.where(tm > 0, tm, 1.0)
    share_l = (tm / torch.where(total > 0, total, 1.0)).tolist()
    cols = [t.tolist() for t in (auc.auroc, auc.lower, auc.upper)]
    bins, tv_l = (m > 0).sum(1).tolist(), tv.tolist()
    out = []
    for i in range(m.shape[0]):
        lo, hi = _v(cols[1][i]), _v(cols[2][i])
        out.append({
            "bins": bins[i], "n_bins": int(m.shape[1]), "top_share": _v(share_l[i]),
            "top_value": _v(tv_l[i]), "auroc": _v(cols[0][i]), "auroc_ci": [lo, hi],
            "separates": None if lo is None or hi is None else bool(lo > 0.5),
        })  # fmt: skip
    return out


def _v(x: Any) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def segment_report(
    seg: SegmentStats, rows: Sequence[tuple[str, dict[str, Any]]], threshold: float | None,
    limit: int = WORST, *, level: float = 0.9, weights: str = "importance",
    fine_rows: Sequence[dict[str, Any] | None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``report.json["segments"]``: the rules, counts and the worst ``limit`` segments (the
    smallest Holm-adjusted p of a FAIL claim first, then the largest ECCE sigma) with their
    definition, n, signed gap (over the segment, or in the threshold window), interval, ECCE
    sigma (z), verdict and resolution: ``fine_rows`` (the segments' fine histograms read as
    the groups' resolution: distinct values, top share, AUROC) where given, else
    :func:`segment_resolution` at ``level`` (at the segments' bins)."""
    value, sigma = ecce_from_stats(seg.stats)
    z = torch.where(sigma > 0, value / torch.where(sigma > 0, sigma, 1.0), torch.zeros_like(sigma))
    z_l, e_l, p_l = z.tolist(), value.tolist(), ecce_pvalue(z).tolist() if z.numel() else []
    res: Sequence[dict[str, Any] | None] = (
        fine_rows
        if fine_rows is not None
        else (segment_resolution(seg.stats, level, weights) if len(rows) else [])
    )
    listed = []
    for i, (name, s) in enumerate(rows):
        t = s["gap_test"] if threshold is None else s["threshold_gap"]
        est, ci, n = t["gap"], t["gap_ci"], t["n"]
        cells = seg.cells[i].tolist()
        listed.append({
            "segment": name,
            "columns": {seg.rules[j].name: seg.rules[j].label(v) for j, v in enumerate(cells) if v >= 0},
            "n": s["n"], "n_judged": n, "statistic": "gap" if threshold is None else "threshold_gap",
            "value": _v(est), "ci": [_v(x) for x in ci], "p_fail_holm": t["p_fail_holm"],
            "ecce": _v(e_l[i]), "sigma": _v(z_l[i]), "ecce_p": _v(p_l[i]),
            "verdict": s["verdict"], "reason": s["reasons"][0], "resolution": res[i],
        })  # fmt: skip
    order = sorted(
        range(len(listed)),
        key=lambda i: (_none_last(listed[i]["p_fail_holm"]), -(listed[i]["sigma"] or 0.0), i),
    )
    flat = [
        i for i in range(len(listed)) if (listed[i]["resolution"] or {}).get("separates") is False
    ]
    flat.sort(key=lambda i: (listed[i]["resolution"]["auroc"], i))
    return {
        "columns": [r.to_dict() for r in seg.rules],
        "depth": seg.depth, "bins": seg.bins, "min_segment": seg.min_rows,
        "tested": len(rows), "skipped": seg.skipped,
        "failed": sum(s["verdict"] == "fail" for _, s in rows),
        "method": "holm over the pooled row, the groups and the segments (a segment by its "
        f"conditional p-value: p / {DISCARD:g} where p <= {DISCARD:g}, else out)"
        + ("; a segment FAILs by its signed gap" if threshold is None else ""),
        "worst": [listed[i] for i in order[:limit]],
        "not_separating": len(flat),
        "not_separating_lowest": [
            {k: listed[i][k] for k in ("segment", "n", "resolution")} for i in flat[:3]
        ],
    }  # fmt: skip


def separation_finding(sg: dict[str, Any], level: float) -> str | None:
    """The report-level finding of the segments whose confidence does not separate right from
    wrong answers (AUROC interval at the segments' bins holding 0.5, or below it; issue 31
    item 5), with the lowest ones; ``None`` when every tested segment separates or cannot
    tell (one outcome absent)."""
    k = sg.get("not_separating", 0)
    if not k:
        return None
    low = "; ".join(
        f"{w['segment']} (n={w['n']}) AUROC {w['resolution']['auroc']:.3f} "
        f"[{w['resolution']['auroc_ci'][0]:.3f}, {w['resolution']['auroc_ci'][1]:.3f}]"
        for w in sg["not_separating_lowest"]
    )
    return (
        f"finding: confidence does not separate right from wrong answers in {k} of "
        f"{sg['tested']} segments ({100 * level:g}% AUROC interval at the segments' bins holds "
        f"0.5 or lies below it), whatever their gaps; lowest: {low}"
    )


def _none_last(p: Any) -> float:
    return 2.0 if p is None else float(p)


def segment_section(
    d: dict[str, Any], name: Callable[[Any], str]
) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """The console/markdown table of the worst segments (none without segments)."""
    sg = d.get("segments")
    if not sg:
        return []
    head = [
        "segment", "n", "gap", "interval", "sigma", "Holm p", "AUROC", "values", "top share",
        "verdict",
    ]  # fmt: skip

    def f(x: Any, spec: str) -> str:
        return "n/a" if x is None else format(x, spec)

    rows = [
        [name(w["segment"]), str(w["n"]), f(w["value"], "+.4f"),
         f"[{f(w['ci'][0], '.4f')}, {f(w['ci'][1], '.4f')}]", f(w["sigma"], ".2f"),
         _holm(w["p_fail_holm"]), _auroc(w.get("resolution")), _values(w.get("resolution")),
         f((w.get("resolution") or {}).get("top_share"), ".1%"), w["verdict"].upper()]
        for w in sg["worst"]
    ]  # fmt: skip
    title = (
        f"worst segments ({len(sg['worst'])} of {sg['tested']} tested, {sg['failed']} FAIL, "
        f"{sg['skipped']} skipped under {sg['min_segment']} rows; depth {sg['depth']})"
    )
    return [("segments", title, head, rows)]


def _values(r: dict[str, Any] | None) -> str:
    """Distinct values (fine bins with rows), or ``k bins`` when read at the segments' bins."""
    if not r:
        return "n/a"
    return str(r["distinct"]) if "distinct" in r else f"{r['bins']} bins"


def _holm(p: float | None) -> str:
    return "n/a" if p is None else ("<1e-16" if p < 1e-16 else format(p, ".2g"))


def _auroc(r: dict[str, Any] | None) -> str:
    """``0.712 [0.690, 0.734]``, ``!`` after one whose interval holds 0.5 (no separation)."""
    if not r or r["auroc"] is None:
        return "n/a"
    lo, hi = r["auroc_ci"]
    flag = "" if r["separates"] is not False else " !"
    return f"{r['auroc']:.3f} [{lo:.3f}, {hi:.3f}]{flag}"


def segment_html(d: dict[str, Any]) -> str:
    """The HTML table of the worst segments (``id="segments"``; empty without segments);
    every string through :func:`html.escape`."""
    import html

    sg = d.get("segments")
    if not sg:
        return ""
    _, title, head, rows = segment_section(d, str)[0]
    out = [_tr(head, "th")]
    for r in rows:
        out.append(_tr(r, "td", verdict=r[-1].lower()))
    body = "".join(out)
    return (
        f'<h2>Segments</h2><p class="note">{html.escape(title)}</p>'
        f'<div class="scroll"><table id="segments">{body}</table></div>'
    )


def _tr(cells: Sequence[str], tag: str, verdict: str = "") -> str:
    import html

    cls = [' class="name"'] + [""] * (len(cells) - 2) + [f' class="{verdict}"' if verdict else ""]
    return (
        "<tr>"
        + "".join(f"<{tag}{c}>{html.escape(v)}</{tag}>" for v, c in zip(cells, cls))
        + "</tr>"
    )


def segments_of_rows(
    preds: Tensor, target: Tensor, columns: Any, *, input: str, n_bins: int, bins: int,
    depth: int, min_rows: int,
) -> SegmentStats:  # fmt: skip
    """The segments of rows given at once (:func:`torchcal.audit.audit`'s ``segments``):
    ``columns`` maps a name to ``N`` values (a list of texts, or a tensor: integers by their
    digits, floats by ``repr``), read by the files' rule (:func:`~torchcal.engines.segments
    .column_rule`)."""
    if not hasattr(columns, "items") or not columns:
        raise ValueError("segments: expected a non-empty mapping of column name -> N values")
    n = int(target.shape[0])
    rules, codes = [], []
    for name, values in columns.items():
        if isinstance(values, Tensor):
            fp = values.is_floating_point()
            texts = [repr(float(v)) if fp else str(int(v)) for v in values.reshape(-1).tolist()]
        else:
            texts = [str(v) for v in values]
        if len(texts) != n:
            raise ValueError(
                f"segments[{name!r}]: expected {n} values (one per row), got {len(texts)}"
            )
        u, inv, cnt = np.unique(
            np.asarray(texts, dtype=object), return_inverse=True, return_counts=True
        )
        rule = column_rule(str(name), [str(t) for t in u], cnt.tolist(), bins)
        rules.append(rule)
        codes.append(torch.from_numpy(rule.codes([str(t) for t in u])[inv]))
    acc = SegmentAccumulator(rules, depth, n_bins, input)
    acc.update(preds, target, torch.stack(codes, 1), None)
    return acc.result(bins, min_rows)
