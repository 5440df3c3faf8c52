"""From an :class:`~torchcal.audit.Auditor`'s state to the report: argument checks, the
per-group summaries (every number from :mod:`torchcal.functional`), the verdicts and the
optional temperature fit on the kept sample."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from torchcal.audit._format import display_name
from torchcal.audit.report import AuditReport
from torchcal.audit.resolution import add_resolution, decide_hint, histogram_rows
from torchcal.audit.segments import (
    attach_gap_tests,
    family_discard,
    gap_reason,
    overall_with_segments,
    segment_report,
    separation_finding,
)
from torchcal.audit.state import AuditSettings, AuditState, generator_seed, grid_stats
from torchcal.functional.calibration.binning import BinnedStats
from torchcal.functional.calibration.estimators import (
    brier_decomposition_from_stats,
    calibration_error_from_stats,
)
from torchcal.functional.calibration.intervals import wilson_interval
from torchcal.functional.decision import (
    cost_threshold_from_stats,
    probs_to_logits,
    threshold_window,
)
from torchcal.functional.verdict import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    decide,
    design_factor,
    ece_test_from_stats,
    holm_adjust,
    kish_n,
    window_gap_test,
)


def _num(x: Any) -> float | None:
    """A float, ``None`` for NaN/inf (the JSON is strict)."""
    v = float(x)
    return v if math.isfinite(v) else None


def _tables(S: BinnedStats, weights: str = "importance") -> list[list[dict[str, Any]]]:
    """The reliability table (non-empty bins) of every row of ``S`` ``(R, 1, B)``, computed in
    one pass (the columns of :func:`~torchcal.functional.calibration
    .reliability_table_from_stats`: mean confidence, mean outcome, 95 % Wilson interval)."""
    B = S.n_bins
    count = S.count.sum(-2)
    n = S.mass().sum(-2)  # the weight total when weighted (frequency weights)
    hits = S.acc.sum(-2)
    conf, acc = S.conf.sum(-2) / n, hits / n
    n_ci, h_ci = n, hits
    if design_factor(S, weights) is not None:  # importance weights: on n_eff (scale-free)
        n_ci = kish_n(n, S.weight2.sum(-2))  # type: ignore[union-attr]
        h_ci = acc * n_ci
    lo, hi = wilson_interval(h_ci, n_ci)
    edges = (torch.arange(B + 1, dtype=torch.float64) / B).tolist()
    out: list[list[dict[str, Any]]] = [[] for _ in range(count.shape[0])]
    nz = torch.nonzero(count).tolist()
    cols = [t[count > 0].tolist() for t in (count, conf, acc, lo, hi)]
    for (r, b), c, cf, a, l_, h in zip(nz, *cols, strict=True):
        out[r].append({"bin": b, "lo": edges[b], "hi": edges[b + 1], "n": int(c),
                       "confidence": cf, "accuracy": a, "gap": cf - a, "ci_lo": l_, "ci_hi": h})  # fmt: skip
    return out


def _lists(d: dict[str, Tensor]) -> dict[str, list[Any]]:
    """Every tensor of ``d`` as a Python list (one conversion, not one per row)."""
    return {k: v.tolist() for k, v in d.items()}


def _n(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _gap_row(gap: dict[str, Any], i: int) -> dict[str, Any]:
    """Row ``i`` of the threshold window's test (the JSON schema's ``threshold_gap``)."""
    return {
        "n": gap["n"][i],
        "confidence": _n(gap["confidence"][i]),
        "accuracy": _n(gap["accuracy"][i]),
        "gap": _n(gap["gap"][i]),
        "accuracy_ci": [_n(x) for x in gap["accuracy_ci"][i]],
        "gap_ci": [_n(x) for x in gap["gap_ci"][i]],
        "p_pass": _n(gap["p_pass"][i]),
        "p_fail": _n(gap["p_fail"][i]),
        "p_fail_holm": None,
        "detectable": _n(gap["detectable"][i]),
    }


def summaries(
    S: BinnedStats,
    nll: Tensor,
    nll_inf: Tensor,
    hits: Tensor,
    *,
    threshold: float | None,
    tolerance: float,
    alpha: float,
    power: float,
    family: int,
    costs: tuple[float, float] | None,
    weights: str = "importance",
) -> list[dict[str, Any]]:
    """One summary dict per leading row of statistics ``S`` ``(R, 1, B)`` (the JSON schema
    of :mod:`torchcal.audit.report`, without verdicts). ``family``: the number of rows the
    FAIL claims are adjusted over (for the detectable gap). Every number is computed for all
    rows at once (linear in rows x bins; 100k groups take seconds)."""
    n = S.count.sum((-2, -1))
    nf = S.mass().sum((-2, -1))  # the weight total when weighted (docs/design.md 6f)
    kw: dict[str, Any] = {"alpha": alpha, "family": family, "power": power, "weights": weights}
    et = _lists(ece_test_from_stats(S, tolerance, **kw))
    mce = calibration_error_from_stats(S, norm="max", reading="binary").tolist()
    brier = _lists(brier_decomposition_from_stats(S, reading="binary"))
    win = gap = cost = None
    if threshold is not None:
        win = list(threshold_window(threshold, S.n_bins))
        gap = _lists(window_gap_test(S, *win, tolerance, **kw))
    if costs is not None:
        cost = _lists(cost_threshold_from_stats(S, *costs))
    finite_n = (nf - nll_inf.to(torch.float64)).tolist()
    mean_nll = (nll / nf).tolist()
    nll_rest = (nll / (nf - nll_inf.to(torch.float64))).tolist()
    acc = (hits / nf).tolist()
    tables = _tables(S, weights)
    n_l, inf_l = n.tolist(), nll_inf.tolist()
    decomp = [k for k in brier if k != "brier"]
    out = []
    for i in range(len(n_l)):
        ni = n_l[i]
        row: dict[str, Any] = {
            "n": ni,
            "ece": _n(et["ece"][i]),
            "ece_debiased": _n(et["debiased"][i]),
            "ece_debiased_clipped": bool(et["clipped"][i]),
            "ece_ci": [_n(x) for x in et["ci"][i]],
            "ece_test": {
                "p_pass": _n(et["p_pass"][i]),
                "p_fail": _n(et["p_fail"][i]),
                "p_fail_holm": None,
                "detectable": _n(et["detectable"][i]),
            },
            "mce": _n(mce[i]),
            "brier": _n(brier["brier"][i]),
            "brier_decomposition": {k: _n(brier[k][i]) for k in decomp},
            "nll": _n(mean_nll[i]) if ni and not inf_l[i] else None,
            "nll_infinite": bool(inf_l[i]),
            "nll_infinite_rows": inf_l[i],
            "nll_finite_rows": _n(nll_rest[i]) if inf_l[i] and finite_n[i] else None,
            "accuracy": _n(acc[i]) if ni else None,
            "threshold_window": win,
            "threshold_gap": None,
            "table": tables[i],
        }
        if gap is not None:
            row["threshold_gap"] = _gap_row(gap, i)
        if cost is not None:
            row["cost"] = {
                k: ([_n(x) for x in v[i]] if isinstance(v[i], list) else _n(v[i]))
                for k, v in cost.items()
            }
            row["cost"]["n_automated"] = int(cost["n_automated"][i])
        out.append(row)
    return out


_VERDICTS = {PASS: "pass", FAIL: "fail", INCONCLUSIVE: "inconclusive"}


def _test_of(s: dict[str, Any], threshold: float | None) -> dict[str, Any]:
    if threshold is None:  # a segment's FAIL is by its signed gap (audit/segments.py)
        return s.get("gap_test") or s["ece_test"]
    return s["threshold_gap"]


def _p(x: float | None) -> str:
    return "n/a" if x is None else ("< 1e-16" if x < 1e-16 else f"= {x:.2g}")


def _pct(x: float | None, sign: bool = True) -> str:
    return "n/a" if x is None else (f"{x:+.3f}" if sign else f"{x:.3f}")


def reason_of(s: dict[str, Any], threshold: float | None, tolerance: float, alpha: float,
              power: float) -> str:  # fmt: skip
    """The one-line reason of a row's verdict (why it passed, failed or cannot tell)."""
    level = f"{100 * (1 - 2 * alpha):g}%"
    v = s["verdict"]
    if s["n"] == 0:
        return "no items in this group: nothing to judge"
    if s["ece"] is None:  # rows, but every one of weight 0
        return f"the {s['n']} rows here have weight 0: nothing to judge"
    if v == "fail" and s.get("gap_test") and threshold is None:
        return gap_reason(s, tolerance, alpha)
    if threshold is None:
        lo, hi = s["ece_ci"]
        t = s["ece_test"]
        est = f"debiased ECE {_pct(s['ece_debiased'], False)}" + (
            " (clipped at 0)" if s["ece_debiased_clipped"] else ""
        )
        where = f"{est}, {level} interval [{_pct(lo, False)}, {_pct(hi, False)}], n={s['n']}"
        if v == "fail":
            return (f"ECE above the tolerance {tolerance:g}: {where} (Holm-adjusted "
                    f"p {_p(t['p_fail_holm'])})")  # fmt: skip
        if v == "pass":
            return f"ECE within the tolerance {tolerance:g}: {where} (p {_p(t['p_pass'])})"
        if lo is not None and lo > tolerance:  # outside on its own, not after Holm
            return (f"cannot tell: {where} lies above the tolerance {tolerance:g}, but the "
                    f"Holm-adjusted p {_p(t['p_fail_holm'])} over the rows is above "
                    f"{alpha:g}")  # fmt: skip
        return (f"cannot tell: {where} is not on one side of the tolerance {tolerance:g}; this n "
                f"detects an ECE of {_pct(t['detectable'], False)} or more with "
                f"{100 * power:g}% power{decide_hint(s, None, tolerance)}")  # fmt: skip
    w = s["threshold_gap"]
    lo, hi = s["threshold_window"]
    where = f"near {threshold:g}"
    if w["n"] == 0:
        return f"no items with confidence in [{lo:g}, {hi:g}) {where}: nothing to judge"
    if w["confidence"] is None:
        return f"the {w['n']} rows in [{lo:g}, {hi:g}) {where} have weight 0: nothing to judge"
    g_lo, g_hi = w["gap_ci"]
    body = (f"gap {_pct(w['gap'])} (confidence {w['confidence']:.3f} - observed "
            f"{w['accuracy']:.3f}), {level} interval [{_pct(g_lo)}, {_pct(g_hi)}], n={w['n']} in "
            f"[{lo:g}, {hi:g})")  # fmt: skip
    if v == "fail":
        kind = "over" if w["gap"] > 0 else "under"
        return (f"{kind}-confident by {abs(w['gap']) * 100:.1f} points {where}: {body}; outside "
                f"+-{tolerance:g} (Holm-adjusted p {_p(w['p_fail_holm'])})")  # fmt: skip
    if v == "pass":
        return f"calibrated {where} within +-{tolerance:g}: {body} (p {_p(w['p_pass'])})"
    if g_lo is not None and g_hi is not None and (g_lo > tolerance or g_hi < -tolerance):
        return (f"cannot tell {where}: {body} lies outside +-{tolerance:g}, but the "
                f"Holm-adjusted p {_p(w['p_fail_holm'])} over the rows is above "
                f"{alpha:g}")  # fmt: skip
    return (f"cannot tell {where}: {body} is neither inside nor outside +-{tolerance:g}; this n "
            f"detects a gap of {_pct(w['detectable'], False)} or more with {100 * power:g}% "
            f"power{decide_hint(s, threshold, tolerance)}")  # fmt: skip


def judge(
    pooled: dict[str, Any],
    groups: dict[str, dict[str, Any]],
    threshold: float | None,
    tolerance: float,
    alpha: float = 0.05,
    power: float = 0.8,
    grouped: bool = True,
    segments: list[tuple[str, dict[str, Any]]] | None = None,
) -> tuple[str, list[str]]:
    """Set ``verdict``/``reasons`` on every summary by :func:`~torchcal.functional.verdict
    .decide` over the family (the pooled row and, with groups, every group; Holm on the FAIL
    claims) and return the overall verdict and its reasons (each non-passing row's, named)."""
    family = [("pooled", pooled)] + (list(groups.items()) if grouped else [])
    named_rows = len(family)
    family += list(segments or [])  # Holm over them too; they never hold back a PASS
    tests = [_test_of(s, threshold) for _, s in family]

    def col(key: str) -> Tensor:
        return torch.tensor(
            [math.nan if t is None or t[key] is None else t[key] for t in tests],
            dtype=torch.float64,
        )

    p_fail = col("p_fail")
    discard = family_discard(named_rows, len(family)) if segments else None
    rows, overall = decide(col("p_pass"), p_fail, alpha, discard)
    holm = holm_adjust(p_fail, discard)
    for (_, s), t, code, h in zip(family, tests, rows.tolist(), holm.tolist(), strict=True):
        if t is not None:
            t["p_fail_holm"] = _num(h)
        s["verdict"] = _VERDICTS[code]
        s["reasons"] = [reason_of(s, threshold, tolerance, alpha, power)]
    if not grouped:
        for s in groups.values():
            s.update({k: pooled[k] for k in ("verdict", "reasons")})
            if threshold is None:
                s["ece_test"] = pooled["ece_test"]
            else:
                s["threshold_gap"] = pooled["threshold_gap"]
    if segments:
        overall = overall_with_segments(rows, named_rows)
    verdict = _VERDICTS[int(overall)]
    named = [(display_name(name), s) for name, s in family[:named_rows]] + [
        (f"segment {display_name(n)}", s) for n, s in family[named_rows:] if s["verdict"] == "fail"
    ]
    reasons = [f"{name}: {s['reasons'][0]}" for name, s in named if s["verdict"] != "pass"]
    if verdict == "pass":
        reasons = [f"{name}: {s['reasons'][0]}" for name, s in named]
    return verdict, reasons


def _evaluate(state: AuditState, settings: AuditSettings) -> dict[str, Any]:
    """The summary of a held-out evaluation (one place that shapes it)."""
    r = build_report(state, settings)
    keep = ("n", "ece", "ece_debiased", "ece_ci", "threshold_gap", "verdict", "reasons")
    return {
        "verdict": r.verdict,
        "pooled": {k: r.pooled[k] for k in keep},
        "groups": {g: {k: v[k] for k in keep} for g, v in r.groups.items()},
    }


def concentration(
    preds: Tensor, reading: str | None, input: str, grid: float | None, n_rows: int
) -> dict[str, Any] | None:
    """How concentrated the stated confidences are, from the kept sample (all rows when
    ``n_rows`` fits): distinct values, the most common one and its share, min, max and the
    interquartile range; ``grid`` the 0.05/0.1 grid they sit on (or None). ``None`` for
    logits (no stated confidence)."""
    if input != "probs" or preds.numel() == 0:
        return None
    c = preds.to(torch.float64)
    if reading == "confidence" and c.dim() == 2:
        c = c.max(1).values
    c = c.reshape(-1)
    c = c[torch.isfinite(c)] + 0.0  # -0.0 is 0 (an engine's MIN may return either)
    if c.numel() == 0:
        return None
    values, counts = torch.unique(c, return_counts=True)
    top = int(counts.argmax())
    q = (
        torch.quantile(c, torch.tensor([0.25, 0.75], dtype=torch.float64))
        if c.numel() > 1
        else c.repeat(2)
    )
    return {
        "distinct": int(values.numel()),
        "top_value": float(values[top]),
        "top_share": float(counts[top]) / c.numel(),
        "min": float(c.min()),
        "max": float(c.max()),
        "iqr": float(q[1] - q[0]),
        "grid": grid,
        "sampled": c.numel() < n_rows,
    }


#: rows -> their AuditState: ``(preds, target, groups, group names, input, n_bins)`` (the
#: streaming Auditor's :func:`torchcal.audit.core.rows_state`, given by the caller: no cycle)
RowsState = Callable[[Tensor, Tensor, "Tensor | None", "list[str] | None", str, int], AuditState]


def fit_temperatures(
    state: AuditState, settings: AuditSettings, warn: list[str], n_bins: int, rows: RowsState
) -> dict[str, Any]:
    """Fit T pooled and per group on a seeded half of the kept sample; the other half before
    and after (per-group T where there are groups, else the pooled T)."""
    from torchcal.scaling.group import GroupTemperatureScaler
    from torchcal.scaling.temperature import TemperatureScaler

    smp = state.sample_rows()
    n = smp["target"].numel()
    if n < 4:
        raise ValueError(f"fit_temperature: needs at least 4 kept rows, got {n}")
    gen = torch.Generator().manual_seed(generator_seed(settings.seed) + 1)
    perm = torch.randperm(n, generator=gen)
    fit, ev = perm[: n // 2], perm[n // 2 :]
    z, clamped = smp["preds"], 0
    if state.input == "probs":
        z, clamped = probs_to_logits(z, binary=state.reading == "binary")
        if clamped:
            msg = (
                f"fit_temperature: {clamped} probabilities of exactly 0 or 1 have infinite "
                f"logits; clamped to +-36.74 (the float64 logit limit) for the fit, which "
                f"biases the fitted T: give the model's logits (--logits) if you have them"
            )
            warnings.warn(msg, UserWarning, stacklevel=4)
            warn.append(msg)
    y, g = smp["target"], smp["group"]
    names = list(state.names)
    pooled = TemperatureScaler(method="newton")  # no torch.optim import (seconds)
    pooled.fit(z[fit], y[fit])
    group_t = {"all": pooled.temperature}
    if state.grouped:
        per = GroupTemperatureScaler(len(names))
        per.fit(z[fit], y[fit], g[fit])
        group_t = dict(zip(names, per.temperatures.tolist(), strict=True))
    ev_settings = replace(
        settings, n_bins=n_bins, cost_error=None, cost_escalation=None, fit_temperature=False,
        min_group=0,
    )  # fmt: skip

    def run(preds: Tensor, input: str) -> dict[str, Any]:
        grouped = state.grouped
        st = rows(
            preds, y[ev], g[ev] if grouped else None, names if grouped else None, input, n_bins
        )
        return _evaluate(st, ev_settings)

    grouped_after = per(z[ev], g[ev]) if state.grouped else pooled(z[ev])
    return {
        "pooled_T": pooled.temperature,
        "group_T": group_t,
        "n_fit": int(fit.numel()),
        "n_eval": int(ev.numel()),
        "rows": "all" if n == state.n_rows else "sample",
        "clamped": clamped,
        "eval_before": run(smp["preds"][ev], state.input),
        "eval_after": run(grouped_after.detach(), "logits"),
        "eval_after_pooled": run(pooled(z[ev]).detach(), "logits"),
    }


def _warnings(
    groups: dict[str, dict[str, Any]], n_bins: int, min_group: int, grouped: bool
) -> list[str]:
    out = []
    for name, s in groups.items():
        label = f"group '{display_name(name)}'" if grouped else "pooled"
        if grouped and 0 < s["n"] < min_group:
            out.append(
                f"{label}: only {s['n']} items: with {n_bins} bins a bin needs tens "
                f"of items (at least {min_group} per group recommended)"
            )
        if s["nll_infinite"]:
            out.append(
                f"{label}: NLL is infinite: {s['nll_infinite_rows']} rows gave probability "
                f"exactly 0 to their label (NLL over the other rows: "
                f"{_fmt_or_na(s['nll_finite_rows'])})"
            )
    return out


def _fmt_or_na(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _settings_dict(
    state: AuditState,
    settings: AuditSettings,
    n_bins: int,
    grid: float | None,
    family: int,
    smp: dict[str, Any],
) -> dict[str, Any]:
    """The report's ``settings``: what was asked, what was read, the bins used."""
    costs = settings.costs
    settings_d: dict[str, Any] = {
        "input": state.input,
        "reading": state.reading,
        "n_bins": n_bins,
        "bins_from_grid": grid,
        "threshold": settings.threshold,
        "tolerance": float(settings.tolerance),
        "rule": settings.rule,
        "alpha": float(settings.alpha),
        "interval_level": 1 - 2 * float(settings.alpha),
        "power": float(settings.power),
        "family": family,
        "cost_error": costs and costs[0],
        "cost_escalation": costs and costs[1],
        "seed": settings.seed,
        "n_rows": state.n_rows,
        "saturated": state.saturated,
        "sample_size": settings.sample_size,
        "min_group": settings.min_group,
        "grouped": state.grouped,
        "confidences": concentration(smp["preds"], state.reading, state.input, grid,
                                     state.n_rows),
        "engine": state.engine,
    }  # fmt: skip
    if state.weight is not None:
        settings_d["weight"] = state.weight
        settings_d["weight_total"] = float(state.stats.mass().sum())
        settings_d["weights"] = settings.weights
    return settings_d


def build_report(
    state: AuditState, settings: AuditSettings, rows_state: RowsState | None = None
) -> AuditReport:
    """The report of a filled :class:`~torchcal.audit.state.AuditState` under
    :class:`~torchcal.audit.state.AuditSettings` (see :meth:`Auditor.report`): every road
    (the streaming reader, a state file, DuckDB, Spark) reports through this function;
    ``rows_state`` turns held-out rows into a state (needed by ``fit_temperature``)."""
    if state.n_rows == 0:
        raise ValueError("preds: no rows were given to the audit (empty input)")
    state = state.by_name()
    if state.weight is not None and not float(state.stats.mass().sum()) > 0:
        raise ValueError(f"{state.weight}: the kept rows' weights sum to 0: nothing to judge")
    names, grouped = list(state.names), state.grouped
    st, n_bins, grid = state.stats, state.stats.n_bins, None
    if settings.n_bins is None and state.grid is not None:
        grid = state.grid.step()
        if grid is not None:
            st = grid_stats(state.grid, grid)
            n_bins = st.n_bins
    S = st.map(lambda t: torch.cat([t.sum(0, keepdim=True), t]))  # keeps weight sums
    nll = torch.cat([state.nll.sum(0, keepdim=True), state.nll])
    nll_inf = torch.cat([state.nll_inf.sum(0, keepdim=True), state.nll_inf])
    hits = torch.cat([state.hits.sum(0, keepdim=True), state.hits])
    costs = settings.costs
    seg = state.segments  # judged with the family (docs/design.md 6g.1)
    family = 1 + (len(names) if grouped else 0) + (0 if seg is None else seg.stats.count.shape[0])
    tolerance, alpha, power = (
        float(settings.tolerance),
        float(settings.alpha),
        float(settings.power),
    )
    threshold = settings.threshold
    rows = summaries(
        S, nll, nll_inf, hits, threshold=threshold, tolerance=tolerance, alpha=alpha,
        power=power, family=family, costs=costs, weights=settings.weights,
    )  # fmt: skip
    pooled, groups = rows[0], dict(zip(names, rows[1:], strict=True))
    if not grouped:
        groups = {"all": rows[1]}
    seg_rows: list[tuple[str, dict[str, Any]]] = []
    if seg is not None:
        z = torch.zeros(seg.stats.count.shape[0], dtype=torch.float64)
        seg_rows = list(zip(seg.names(), summaries(
            seg.stats, z, z.long(), z, threshold=threshold, tolerance=tolerance, alpha=alpha,
            power=power, family=family, costs=None, weights=settings.weights,
        ), strict=True))  # fmt: skip
        if threshold is None:
            attach_gap_tests(seg.stats, [s for _, s in seg_rows], tolerance, alpha=alpha,
                             power=power, family=family, weights=settings.weights)  # fmt: skip
    verdict, reasons = judge(
        pooled, groups, threshold, tolerance, alpha, power, grouped, segments=seg_rows
    )
    warn = _warnings(groups, n_bins, settings.min_group, grouped)
    weights = getattr(settings, "weights", "frequency")  # HEAD before --weights: frequency
    add_resolution(state, pooled, groups, reasons, warn, 1 - 2 * alpha, weights)  # ECCE, AUROC
    if state.saturated:
        warn.append(
            f"{state.saturated} rows have a probability of exactly 0 or 1 (infinite logits"
            f"{'; the temperature fit clamps them: pass --logits if you have them' if settings.fit_temperature else ''})"
        )
    bad = {k: v for k, v in state.rejected.items() if v}
    if bad:
        parts = ", ".join(f"{k} {v}" for k, v in bad.items())
        warn.append(f"{sum(bad.values())} rows were left out of the state: {parts}")
    smp = state.sample_rows()
    settings_d = _settings_dict(state, settings, n_bins, grid, family, smp)
    temperature = None
    if settings.fit_temperature:
        if rows_state is None:
            raise ValueError("fit_temperature: needs rows (give build_report its rows_state)")
        temperature = fit_temperatures(state, settings, warn, n_bins, rows_state)
    sample = {"preds": smp["preds"], "target": smp["target"], "group": smp["group"], "names": names}
    seg_d = None
    if seg is not None:
        seg_d = _segments_entry(state, seg_rows, settings, reasons)
    return AuditReport(
        verdict, pooled, groups, settings_d, warn, temperature, sample, reasons,
        dict(state.read_log), segments=seg_d,
    )  # fmt: skip


def _segments_entry(
    state: AuditState,
    seg_rows: list[tuple[str, dict[str, Any]]],
    settings: AuditSettings,
    reasons: list[str],
) -> dict[str, Any]:
    """``report.json["segments"]`` (:func:`~torchcal.audit.segments.segment_report`) with each
    segment's resolution read from its fine histogram as a group's where the state has one
    (issue 31 item 5), and the report-level finding of the segments whose confidence does not
    separate added to ``reasons``."""
    seg = state.segments
    assert seg is not None
    level = 1 - 2 * float(settings.alpha)
    fine_rows = None
    if seg.fine is not None:
        fine_rows = histogram_rows(seg.fine, level, settings.weights, state.grid is not None)
    seg_d = segment_report(
        seg, seg_rows, settings.threshold, level=level, weights=settings.weights,
        fine_rows=fine_rows,
    )  # fmt: skip
    text = separation_finding(seg_d, level)
    if text is not None:
        reasons.append(f"segments: {text}")
    return seg_d
