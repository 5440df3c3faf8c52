"""From an :class:`~torchcal.audit.Auditor`'s state to the report: argument checks, the
per-group summaries (every number from :mod:`torchcal.functional`), the verdicts and the
optional temperature fit on the kept sample."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor

from torchcal.audit._format import display_name
from torchcal.audit.report import AuditReport
from torchcal.functional._checks import check_bool, check_int, check_number
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
    check_alpha,
    decide,
    ece_test_from_stats,
    holm_adjust,
    window_gap_test,
)

__all__ = ["build_report", "check_report_args", "judge", "reason_of", "summaries"]


def check_report_args(
    threshold: float | None,
    tolerance: float,
    cost_error: float | None,
    cost_escalation: float | None,
    min_group: int,
    alpha: float = 0.05,
    power: float = 0.8,
) -> None:
    """``ValueError`` naming the argument for each bad report option."""
    if threshold is not None:
        t = check_number("threshold", threshold, strict=True)
        if not t < 1:
            raise ValueError(f"threshold: expected a value in (0, 1), got {threshold!r}")
    tol = check_number("tolerance", tolerance, strict=True)
    if not tol < 1:
        hint = f" (did you mean {tol / 100:g}, i.e. {tol:g} points?)" if tol < 100 else ""
        raise ValueError(
            f"tolerance: expected a fraction in (0, 1), e.g. 0.05 for 5 points, got "
            f"{tolerance!r}{hint}"
        )
    if (cost_error is None) != (cost_escalation is None):
        missing = "cost_escalation" if cost_escalation is None else "cost_error"
        raise ValueError(f"{missing}: expected both cost_error and cost_escalation, or neither")
    if cost_error is not None:
        check_number("cost_error", cost_error, strict=True)
        check_number("cost_escalation", cost_escalation, strict=True)
    check_int("min_group", min_group, minimum=0)
    check_alpha(alpha)
    pw = check_number("power", power, strict=True)
    if not pw < 1:
        raise ValueError(f"power: expected a value in (0, 1), e.g. 0.8, got {power!r}")


def check_names(group_names: list[str] | None, G: int, grouped: bool) -> list[str]:
    if group_names is None:
        return [str(g) for g in range(G)] if grouped else ["all"]
    names = list(group_names)
    if len(names) < G or not all(isinstance(n, str) and n for n in names):
        raise ValueError(
            f"group_names: expected at least {G} non-empty strings (one per group id), "
            f"got {names[: G + 2]!r}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"group_names: expected unique names, got {names!r}")
    return names


def _num(x: Any) -> float | None:
    """A float, ``None`` for NaN/inf (the JSON is strict)."""
    v = float(x)
    return v if math.isfinite(v) else None


def _tables(S: BinnedStats) -> list[list[dict[str, Any]]]:
    """The reliability table (non-empty bins) of every row of ``S`` ``(R, 1, B)``, computed in
    one pass (the columns of :func:`~torchcal.functional.calibration
    .reliability_table_from_stats`: mean confidence, mean outcome, 95 % Wilson interval)."""
    B = S.n_bins
    count = S.count.sum(-2)
    n = S.mass().sum(-2)  # the weight total when weighted (frequency weights)
    hits = S.acc.sum(-2)
    conf, acc = S.conf.sum(-2) / n, hits / n
    lo, hi = wilson_interval(hits, n)
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
) -> list[dict[str, Any]]:
    """One summary dict per leading row of statistics ``S`` ``(R, 1, B)`` (the JSON schema
    of :mod:`torchcal.audit.report`, without verdicts). ``family``: the number of rows the
    FAIL claims are adjusted over (for the detectable gap). Every number is computed for all
    rows at once (linear in rows x bins; 100k groups take seconds)."""
    n = S.count.sum((-2, -1))
    nf = S.mass().sum((-2, -1))  # the weight total when weighted (docs/design.md 6f)
    et = _lists(ece_test_from_stats(S, tolerance, alpha=alpha, family=family, power=power))
    mce = calibration_error_from_stats(S, norm="max", reading="binary").tolist()
    brier = _lists(brier_decomposition_from_stats(S, reading="binary"))
    win = gap = cost = None
    if threshold is not None:
        win = list(threshold_window(threshold, S.n_bins))
        gap = _lists(window_gap_test(S, *win, tolerance, alpha=alpha, family=family, power=power))
    if costs is not None:
        cost = _lists(cost_threshold_from_stats(S, *costs))
    finite_n = (nf - nll_inf.to(torch.float64)).tolist()
    mean_nll = (nll / nf).tolist()
    nll_rest = (nll / (nf - nll_inf.to(torch.float64))).tolist()
    acc = (hits / nf).tolist()
    tables = _tables(S)
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
            row["threshold_gap"] = {
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
    return s["ece_test"] if threshold is None else s["threshold_gap"]


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
                f"{100 * power:g}% power")  # fmt: skip
    w = s["threshold_gap"]
    lo, hi = s["threshold_window"]
    where = f"near {threshold:g}"
    if w["n"] == 0:
        return f"no items with confidence in [{lo:g}, {hi:g}) {where}: nothing to judge"
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
            f"power")  # fmt: skip


def judge(
    pooled: dict[str, Any],
    groups: dict[str, dict[str, Any]],
    threshold: float | None,
    tolerance: float,
    alpha: float = 0.05,
    power: float = 0.8,
    grouped: bool = True,
) -> tuple[str, list[str]]:
    """Set ``verdict``/``reasons`` on every summary by :func:`~torchcal.functional.verdict
    .decide` over the family (the pooled row and, with groups, every group; Holm on the FAIL
    claims) and return the overall verdict and its reasons (each non-passing row's, named)."""
    family = [("pooled", pooled)] + (list(groups.items()) if grouped else [])
    tests = [_test_of(s, threshold) for _, s in family]

    def col(key: str) -> Tensor:
        return torch.tensor(
            [math.nan if t is None or t[key] is None else t[key] for t in tests],
            dtype=torch.float64,
        )

    p_fail = col("p_fail")
    rows, overall = decide(col("p_pass"), p_fail, alpha)
    holm = holm_adjust(p_fail)
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
    verdict = _VERDICTS[int(overall)]
    named = [(display_name(name), s) for name, s in family]
    reasons = [f"{name}: {s['reasons'][0]}" for name, s in named if s["verdict"] != "pass"]
    if verdict == "pass":
        reasons = [f"{name}: {s['reasons'][0]}" for name, s in named]
    return verdict, reasons


def _evaluate(
    auditor: Any, **report_kw: Any
) -> dict[str, Any]:  # one place that shapes an eval summary
    r = auditor.report(**report_kw)
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
    c = c[torch.isfinite(c)]
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


def fit_temperatures(
    auditor: Any, names: list[str], report_kw: dict[str, Any], warn: list[str], n_bins: int
) -> dict[str, Any]:
    """Fit T pooled and per group on a seeded half of the kept sample; the other half before
    and after (per-group T where there are groups, else the pooled T)."""
    from torchcal.scaling.group import GroupTemperatureScaler
    from torchcal.scaling.temperature import TemperatureScaler

    smp = auditor.sample()
    n = smp["target"].numel()
    if n < 4:
        raise ValueError(f"fit_temperature: needs at least 4 kept rows, got {n}")
    gen = torch.Generator().manual_seed(auditor.seed + 1)
    perm = torch.randperm(n, generator=gen)
    fit, ev = perm[: n // 2], perm[n // 2 :]
    binary = auditor.reading == "binary"
    z, clamped = smp["preds"], 0
    if auditor.input == "probs":
        z, clamped = probs_to_logits(z, binary=binary)
        if clamped:
            msg = (
                f"fit_temperature: {clamped} probabilities of exactly 0 or 1 have infinite "
                f"logits; clamped to +-36.74 (the float64 logit limit) for the fit, which "
                f"biases the fitted T: give the model's logits (--logits) if you have them"
            )
            warnings.warn(msg, UserWarning, stacklevel=4)
            warn.append(msg)
    y, g = smp["target"], smp["group"]
    pooled = TemperatureScaler(method="newton")  # no torch.optim import (seconds)
    pooled.fit(z[fit], y[fit])
    group_t = {"all": pooled.temperature}
    if auditor.grouped:
        per = GroupTemperatureScaler(len(names))
        per.fit(z[fit], y[fit], g[fit])
        group_t = dict(zip(names, per.temperatures.tolist(), strict=True))

    def run(preds: Tensor, input: str) -> dict[str, Any]:
        a = type(auditor)(input=input, n_bins=n_bins, sample_size=0)
        a.update(preds, y[ev], g[ev] if auditor.grouped else None)
        return _evaluate(a, **report_kw)

    grouped_after = per(z[ev], g[ev]) if auditor.grouped else pooled(z[ev])
    return {
        "pooled_T": pooled.temperature,
        "group_T": group_t,
        "n_fit": int(fit.numel()),
        "n_eval": int(ev.numel()),
        "rows": "all" if n == auditor.n_rows else "sample",
        "clamped": clamped,
        "eval_before": run(smp["preds"][ev], auditor.input),
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


def build_report(
    auditor: Any,
    *,
    group_names: list[str] | None,
    threshold: float | None,
    tolerance: float,
    cost_error: float | None,
    cost_escalation: float | None,
    fit_temperature: bool,
    min_group: int,
    alpha: float = 0.05,
    power: float = 0.8,
    read_log: dict[str, Any] | None = None,
) -> AuditReport:
    """The report of an :class:`~torchcal.audit.Auditor` (see :meth:`Auditor.report`)."""
    check_report_args(threshold, tolerance, cost_error, cost_escalation, min_group, alpha, power)
    check_bool("fit_temperature", fit_temperature)
    names = check_names(group_names, auditor.num_groups, auditor.grouped)
    auditor.grow(len(names))
    st, n_bins, grid = auditor.stats, auditor.n_bins, None
    if auditor.auto_bins:
        grid = auditor.grid_of_values()
        if grid is not None:
            st = auditor.grid_stats(grid)
            n_bins = st.n_bins
    S = st.map(lambda t: torch.cat([t.sum(0, keepdim=True), t]))  # keeps weight sums
    nll = torch.cat([auditor.nll.sum(0, keepdim=True), auditor.nll])
    nll_inf = torch.cat([auditor.nll_inf.sum(0, keepdim=True), auditor.nll_inf])
    hits = torch.cat([auditor.hits.sum(0, keepdim=True), auditor.hits])
    costs = None if cost_error is None else (float(cost_error), float(cost_escalation))  # type: ignore[arg-type]
    family = 1 + (len(names) if auditor.grouped else 0)
    rows = summaries(
        S,
        nll,
        nll_inf,
        hits,
        threshold=threshold,
        tolerance=float(tolerance),
        alpha=float(alpha),
        power=float(power),
        family=family,
        costs=costs,
    )
    pooled, groups = rows[0], dict(zip(names, rows[1:], strict=True))
    if not auditor.grouped:
        groups = {"all": rows[1]}
    verdict, reasons = judge(
        pooled, groups, threshold, float(tolerance), float(alpha), float(power), auditor.grouped
    )
    warn = _warnings(groups, n_bins, min_group, auditor.grouped)
    if auditor.saturated:
        warn.append(
            f"{auditor.saturated} rows have a probability of exactly 0 or 1 (infinite logits"
            f"{'; the temperature fit clamps them: pass --logits if you have them' if fit_temperature else ''})"
        )
    settings = {
        "input": auditor.input,
        "reading": auditor.reading,
        "n_bins": n_bins,
        "bins_from_grid": grid,
        "threshold": threshold,
        "tolerance": float(tolerance),
        "rule": "threshold_gap" if threshold is not None else "ece",
        "alpha": float(alpha),
        "interval_level": 1 - 2 * float(alpha),
        "power": float(power),
        "family": family,
        "cost_error": costs and costs[0],
        "cost_escalation": costs and costs[1],
        "seed": auditor.seed,
        "n_rows": auditor.n_rows,
        "saturated": auditor.saturated,
        "sample_size": auditor.sample_size,
        "min_group": min_group,
        "grouped": auditor.grouped,
        "confidences": concentration(auditor.sample()["preds"], auditor.reading, auditor.input,
                                     grid, auditor.n_rows),
    }  # fmt: skip
    temperature = None
    if fit_temperature:
        kw = {"threshold": threshold, "tolerance": tolerance, "min_group": 0}
        kw.update(alpha=alpha, power=power)
        kw["group_names"] = names if auditor.grouped else None
        temperature = fit_temperatures(auditor, names, kw, warn, n_bins)
    smp = auditor.sample()
    sample = {"preds": smp["preds"], "target": smp["target"], "group": smp["group"], "names": names}
    return AuditReport(
        verdict, pooled, groups, settings, warn, temperature, sample, reasons, dict(read_log or {})
    )
