"""From an :class:`~torchcal.audit.Auditor`'s state to the report: argument checks, the
per-group summaries (every number from :mod:`torchcal.functional`), the verdicts and the
optional temperature fit on the kept sample."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor

from torchcal.audit.report import AuditReport
from torchcal.functional._validation import check_bool, check_int, check_number
from torchcal.functional.calibration import (
    BinnedStats,
    brier_decomposition_from_stats,
    calibration_error_from_stats,
    debiased_calibration_error_from_stats,
    reliability_table_from_stats,
)
from torchcal.functional.decision import (
    cost_threshold_from_stats,
    ece_interval_from_stats,
    probs_to_logits,
    threshold_window,
    window_gap_from_stats,
)

__all__ = ["build_report", "check_report_args", "summaries", "verdict_of"]


def check_report_args(
    threshold: float | None,
    tolerance: float,
    cost_error: float | None,
    cost_escalation: float | None,
    min_group: int,
) -> None:
    """``ValueError`` naming the argument for each bad report option."""
    if threshold is not None:
        t = check_number("threshold", threshold)
        if t > 1:
            raise ValueError(f"threshold: expected a value in [0, 1], got {threshold!r}")
    check_number("tolerance", tolerance, strict=True)
    if (cost_error is None) != (cost_escalation is None):
        missing = "cost_escalation" if cost_escalation is None else "cost_error"
        raise ValueError(f"{missing}: expected both cost_error and cost_escalation, or neither")
    if cost_error is not None:
        check_number("cost_error", cost_error, strict=True)
        check_number("cost_escalation", cost_escalation, strict=True)
    check_int("min_group", min_group, minimum=0)


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


def _table(stats: BinnedStats) -> list[dict[str, Any]]:
    rows = reliability_table_from_stats(stats, reading="binary").rows()
    keys = (("bin", "bin"), ("lo", "lo"), ("hi", "hi"), ("n", "count"), ("confidence", "conf"))
    keys += (("accuracy", "acc"), ("gap", "gap"), ("ci_lo", "ci_low"), ("ci_hi", "ci_high"))
    return [{k: r[src] for k, src in keys} for r in rows]


def summaries(
    S: BinnedStats,
    nll: Tensor,
    hits: Tensor,
    *,
    threshold: float | None,
    bootstrap: int,
    seed: int,
    costs: tuple[float, float] | None,
) -> list[dict[str, Any]]:
    """One summary dict per leading row of statistics ``S`` ``(R, 1, B)`` (the JSON schema
    of :mod:`torchcal.audit.report`, without verdicts)."""
    n = S.count.sum((-2, -1))
    nf = S.mass().sum((-2, -1))  # the weight total when weighted (docs/design.md 6e)
    ece = calibration_error_from_stats(S, reading="binary")
    deb = debiased_calibration_error_from_stats(S, reading="binary")
    mce = calibration_error_from_stats(S, norm="max", reading="binary")
    brier = brier_decomposition_from_stats(S, reading="binary")
    ci = ece_interval_from_stats(S, replicates=bootstrap, seed=seed) if bootstrap else None
    win = gap = cost = None
    if threshold is not None:
        win = threshold_window(threshold, S.n_bins)
        gap = window_gap_from_stats(S, *win)
    if costs is not None:
        cost = cost_threshold_from_stats(S, *costs)
    out = []
    for i in range(S.count.shape[0]):
        row: dict[str, Any] = {
            "n": int(n[i]),
            "ece": _num(ece[i]),
            "ece_ci": None if ci is None else [_num(ci[0][i]), _num(ci[1][i])],
            "ece_debiased": _num(deb[i]),
            "mce": _num(mce[i]),
            "brier": _num(brier["brier"][i]),
            "brier_decomposition": {k: _num(v[i]) for k, v in brier.items() if k != "brier"},
            "nll": _num(nll[i] / nf[i]) if n[i] else None,
            "nll_infinite": bool(torch.isinf(nll[i])),
            "accuracy": _num(hits[i] / nf[i]) if n[i] else None,
            "threshold_window": None if win is None else list(win),
            "threshold_gap": None,
            "table": _table(S.map(lambda t, i=i: t[i])) if n[i] else [],
        }
        if gap is not None:
            row["threshold_gap"] = {
                "n": int(gap["n"][i]),
                "confidence": _num(gap["confidence"][i]),
                "accuracy": _num(gap["accuracy"][i]),
                "gap": _num(gap["gap"][i]),
                "accuracy_ci": [_num(v) for v in gap["accuracy_ci"][i]],
            }
        if cost is not None:
            row["cost"] = {
                k: ([_num(x) for x in v[i]] if v.dim() > 1 else _num(v[i])) for k, v in cost.items()
            }
            row["cost"]["n_automated"] = int(cost["n_automated"][i])
        out.append(row)
    return out


def verdict_of(s: dict[str, Any], threshold: float | None, tolerance: float) -> list[str]:
    """The reasons a summary fails (empty: it passes)."""
    if s["n"] == 0:
        return ["no items in this group"]
    if threshold is None:
        if s["ece"] > tolerance:
            return [f"ECE {s['ece']:.4f} exceeds the tolerance {tolerance:g}"]
        return []
    w, lo, hi = s["threshold_gap"], *s["threshold_window"]
    where = f"near {threshold:g}"
    if w["n"] == 0:
        return [f"no items with confidence in [{lo:g}, {hi:g}) {where}: nothing to judge"]
    if abs(w["gap"]) <= tolerance:
        return []
    kind = "over" if w["gap"] > 0 else "under"
    a_lo, a_hi = w["accuracy_ci"]
    return [
        f"{kind}-confident by {abs(w['gap']) * 100:.1f} points {where}: accuracy "
        f"{w['accuracy']:.3f} [{a_lo:.3f}, {a_hi:.3f}] at confidence {w['confidence']:.3f} "
        f"in [{lo:g}, {hi:g}), n={w['n']} (tolerance {tolerance * 100:g} points)"
    ]


def judge(
    pooled: dict[str, Any],
    groups: dict[str, dict[str, Any]],
    threshold: float | None,
    tolerance: float,
) -> str:
    """Set ``verdict``/``reasons`` on every summary; the pooled verdict fails when any
    group fails (naming it). Returns the overall verdict."""
    failed = []
    for name, s in groups.items():
        s["reasons"] = verdict_of(s, threshold, tolerance)
        s["verdict"] = "fail" if s["reasons"] else "pass"
        if s["reasons"]:
            failed.append(name)
    pooled["reasons"] = [f"group {name!r}: {groups[name]['reasons'][0]}" for name in failed]
    pooled["verdict"] = "fail" if failed else "pass"
    return pooled["verdict"]


def _evaluate(
    auditor: Any, **report_kw: Any
) -> dict[str, Any]:  # one place that shapes an eval summary
    r = auditor.report(**report_kw)
    keep = ("n", "ece", "threshold_gap", "verdict", "reasons")
    return {
        "verdict": r.verdict,
        "pooled": {k: r.pooled[k] for k in keep},
        "groups": {g: {k: v[k] for k in keep} for g, v in r.groups.items()},
    }


def fit_temperatures(
    auditor: Any, names: list[str], report_kw: dict[str, Any], warn: list[str]
) -> dict[str, Any]:
    """Fit T pooled and per group on a seeded half of the kept sample; the other half before
    and after (per-group T where there are groups, else the pooled T)."""
    from torchcal.scaling import GroupTemperatureScaler, TemperatureScaler

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
                f"logits; clamped to +-36.74 (the float64 logit limit) for the fit"
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
        a = type(auditor)(input=input, n_bins=auditor.n_bins, bootstrap=0, sample_size=0)
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
        if grouped and 0 < s["n"] < min_group:
            out.append(
                f"group {name!r}: only {s['n']} items: with {n_bins} bins a bin needs tens "
                f"of items (at least {min_group} per group recommended)"
            )
        if s["nll_infinite"]:
            out.append(
                f"group {name!r}: NLL is infinite: a probability of exactly 0 or 1 was "
                f"given to the wrong label"
            )
    return out


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
) -> AuditReport:
    """The report of an :class:`~torchcal.audit.Auditor` (see :meth:`Auditor.report`)."""
    check_report_args(threshold, tolerance, cost_error, cost_escalation, min_group)
    check_bool("fit_temperature", fit_temperature)
    names = check_names(group_names, auditor.num_groups, auditor.grouped)
    auditor.grow(len(names))
    st = auditor.stats
    S = st.map(lambda t: torch.cat([t.sum(0, keepdim=True), t]))  # keeps weight sums
    nll = torch.cat([auditor.nll.sum(0, keepdim=True), auditor.nll])
    hits = torch.cat([auditor.hits.sum(0, keepdim=True), auditor.hits])
    costs = None if cost_error is None else (float(cost_error), float(cost_escalation))  # type: ignore[arg-type]
    rows = summaries(
        S,
        nll,
        hits,
        threshold=threshold,
        bootstrap=auditor.bootstrap,
        seed=auditor.seed,
        costs=costs,
    )
    pooled, groups = rows[0], dict(zip(names, rows[1:], strict=True))
    if not auditor.grouped:
        groups = {"all": rows[1]}
    verdict = judge(pooled, groups, threshold, tolerance)
    warn = _warnings(groups, auditor.n_bins, min_group, auditor.grouped)
    settings = {
        "input": auditor.input,
        "reading": auditor.reading,
        "n_bins": auditor.n_bins,
        "threshold": threshold,
        "tolerance": float(tolerance),
        "cost_error": costs and costs[0],
        "cost_escalation": costs and costs[1],
        "seed": auditor.seed,
        "n_rows": auditor.n_rows,
        "sample_size": auditor.sample_size,
        "bootstrap": auditor.bootstrap,
        "min_group": min_group,
        "grouped": auditor.grouped,
    }
    temperature = None
    if fit_temperature:
        kw = {"threshold": threshold, "tolerance": tolerance, "min_group": 0}
        kw["group_names"] = names if auditor.grouped else None
        temperature = fit_temperatures(auditor, names, kw, warn)
    smp = auditor.sample()
    sample = {"preds": smp["preds"], "target": smp["target"], "group": smp["group"], "names": names}
    return AuditReport(verdict, pooled, groups, settings, warn, temperature, sample)
