"""Calibration audits of a trained ComplEx model: measure, repair with one temperature, and
check exactly that the repair moved no decision and no ranking, as far as floating point
promises (:func:`torchcal.functional.check_monotone_map`).

Both audits use the held-out test triples, split (seeded, stratified by relation) into a
calibration half (T is fitted there) and an evaluation half (everything reported is measured
there). A test triple's two queries (tail and reciprocal head prediction) and all their
corruptions stay in the same half. Scores are float64 logits throughout (a float32 sigmoid
saturates near 17 and creates ties).

What "the repair moved nothing" means in floating point: ``x / T`` is only *weakly* monotone,
so two scores one ulp apart may become an exact tie (``-3.543827191505563`` and
``-3.5438271915055632`` do at the family default's T). Asserted: no strict inversion and no
broken tie along the stable order of the original scores, every top-1 still a top-1, every
decision at logit 0 unchanged (triple audit), and every tie the map created joins scores at
most :data:`MAX_TIE_GAP_ULPS` apart. The ties created are counted and reported. Ranking
metrics (MRR, Hits@k, AUC) are computed from the model's own scores, which ``T`` does not
touch, so the "after T" column repeats them.

* ``tail`` (multiclass): the top-1 filtered tail prediction over all entities (other known
  answers masked with ``-inf``) against whether it is the true tail (the "confidence"
  reading of Guo et al. 2017, "On Calibration of Modern Neural Networks").
* ``triple`` (binary; the triple-classification protocol of Socher et al. 2013 as audited by
  Tabacof & Costabello 2020, "Probability Calibration for Knowledge Graph Embedding Models"):
  each held-out positive with ``k`` distinct uniform filtered corruptions of its tail (a
  query with fewer possible corruptions is left out and counted), base rate
  ``1 / (1 + k)``; ``sigmoid(score)`` is the probability.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

import torchcal.functional as TF
from recipes.complex_link_prediction._audit_metrics import (
    MIN_RELATION_ITEMS as MIN_RELATION_ITEMS,
)
from recipes.complex_link_prediction._audit_metrics import (
    calibration_metrics,
    per_relation,
    reliability_tables,
    true_label_ece,
)
from recipes.complex_link_prediction.answers import (
    answer_sets,
    query_relation_names,
    relation_temperatures,
    risk_coverage,
)
from recipes.complex_link_prediction.costs import measure
from recipes.complex_link_prediction.datasets import KGData, with_reciprocals
from recipes.complex_link_prediction.evaluation import (
    TripleFilter,
    filtered_ranks,
    mask_known,
    ranking_metrics,
)
from recipes.complex_link_prediction.items import TripleItems, stratified_halves, triple_items
from recipes.complex_link_prediction.model import ComplEx
from torchcal import ReliabilityTable
from torchcal.functional import MonotoneMapCheck, check_monotone_map
from torchcal.scaling import PlattScaler, TemperatureScaler

__all__ = [
    "MAX_TIE_GAP_ULPS",
    "AuditResult",
    "all_tail_logits",
    "auc",
    "guarded_temperature",
    "named_invariants",
    "run_audits",
    "tail_audit",
    "triple_audit",
]

#: The widest original gap (float64 ulps) between two scores that ``x / T`` may merge into a
#: tie. One correctly rounded division (or multiplication by ``1 / T``) merges only
#: neighbours less than 2 ulps apart (the exact quotients then differ by less than one ulp
#: of the result); 4 leaves room for a scaler that rounds twice, and anything wider means the
#: scaler is not the monotone map it claims to be.
MAX_TIE_GAP_ULPS = 4


@dataclass
class AuditResult:
    """Numbers (``summary``, JSON-ready), diagrams and exact invariant checks of one audit
    (``invariants``: name -> holds; the counts behind them are in ``summary``)."""

    name: str
    summary: dict[str, object]
    invariants: dict[str, bool]
    tables: dict[str, ReliabilityTable]
    per_relation: list[dict[str, object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: time and memory of each fit (:func:`~recipes.complex_link_prediction.costs.measure`;
    #: not deterministic, so the report keeps them under a timing key)
    costs: dict[str, dict[str, object]] = field(default_factory=dict)

    @property
    def invariants_ok(self) -> bool:
        return all(self.invariants.values())


def auc(scores: Tensor, labels: Tensor) -> float:
    """ROC AUC by the Mann-Whitney U statistic with mid-ranks for ties (Hanley & McNeil
    1982), vectorised: ``(sum of positive ranks - P (P + 1) / 2) / (P N)``.

    Kept instead of torchmetrics' ``binary_auroc``, which is not exact for the invariance
    check: it applies a sigmoid to scores outside [0, 1] (distinct float64 logits past ~37
    become ties: 0.75 instead of 1.0 on ``[37, 38, 40, 1]`` labelled ``[0, 1, 1, 0]``) and
    returns float32 (a 1e-8 relative difference on tied data).

    Example:
        >>> import torch
        >>> auc(torch.tensor([0.1, 0.4, 0.4, 0.8]), torch.tensor([0, 0, 1, 1]))
        0.875
    """
    s = scores.reshape(-1).double()
    y = labels.reshape(-1).bool()
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    sorted_s, idx = torch.sort(s)
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    mid = ends - (counts.double() - 1) / 2  # 1-based mid-rank of each tie group
    ranks = torch.empty_like(s)
    ranks[idx] = mid[inverse]
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def _binary_metrics(logits: Tensor, labels: Tensor, n_bins: int) -> dict[str, float]:
    """The triple audit's rows for one column of binary logits: :func:`calibration_metrics`
    plus NLL, AUC and the accuracy of the decision at logit 0."""
    out = calibration_metrics(logits, labels, "binary", n_bins)
    out["nll"] = float(TF.log_score(logits, labels))
    out["auc"] = auc(logits, labels)
    out["acc"] = float(((logits > 0).double() == labels).double().mean())
    return out


def guarded_temperature(
    scaler: object,
    logits: Tensor,
    target: Tensor,
    costs: dict[str, dict[str, object]] | None = None,
    name: str = "fit",
) -> dict[str, object]:
    """Fit ``scaler`` (a temperature scaler) on the fit split and keep its ``T`` only if it
    does not raise the NLL of that split above ``T = 1``'s: a correctly fitted temperature
    cannot (``T = 1`` is a candidate), so a higher NLL means the fit failed (KGE Calibrator's
    temperature scaling raises NLL on average, see docs/recipes/complex.md), and the audit
    falls back to ``T = 1`` and says so. Both NLLs are computed here from ``logits / T``, not
    read from the fit's own report.

    The fit's time and memory go to ``costs[name]`` when ``costs`` is given.

    Returns ``fit`` (the scaler's result) and the report keys: ``temperature`` (the one
    used), ``temperature_fitted``, ``temperature_fallback``, ``nll_fit_split_identity``
    (T = 1) and ``nll_fit_split_fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import TemperatureScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 5 * torch.randn(500, 4, generator=g, dtype=torch.float64)
        >>> y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
        >>> import warnings
        >>> with warnings.catch_warnings():  # the boxed fit warns: it stopped on its bound
        ...     warnings.simplefilter("ignore")
        ...     out = guarded_temperature(TemperatureScaler(bounds=(2.0, 3.0)), z, y)
        >>> out["temperature"], out["temperature_fitted"], out["temperature_fallback"]
        (1.0, 2.0, True)
    """
    with measure({} if costs is None else costs, name):
        fit = scaler.fit(logits, target)  # type: ignore[attr-defined]
    t = float(fit.temperature)
    nll_one = float(TF.log_score(logits, target))
    nll_t = float(TF.log_score(logits / t, target))
    fallback = not nll_t <= nll_one
    return {
        "fit": fit,
        "temperature": 1.0 if fallback else t,
        "temperature_fitted": t,
        "temperature_fallback": fallback,
        "nll_fit_split_identity": nll_one,
        "nll_fit_split_fitted": nll_t,
    }


def _guard_keys(guard: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in guard.items() if k != "fit"}


def named_invariants(check: MonotoneMapCheck, decisions: bool) -> dict[str, bool]:
    """The audit's named invariants from one :func:`check_monotone_map` result."""
    out = {
        "no_strict_inversion": check.strict_inversions == 0,
        "ties_kept": check.ties_broken == 0,
        "top1_kept": check.top1_kept,
    }
    if decisions:
        out["decisions_unchanged"] = bool(check.decisions_kept)
    out["created_ties_within_bound"] = check.max_tie_gap_ulps <= MAX_TIE_GAP_ULPS
    return out


def _invariant_counts(check: MonotoneMapCheck) -> dict[str, object]:
    """The counts behind the invariants, for the report."""
    return {
        "strict_inversions": check.strict_inversions,
        "ties_broken": check.ties_broken,
        "ties_created": check.ties_created,
        "max_tie_gap_ulps": check.max_tie_gap_ulps,
        "max_tie_gap_bound_ulps": MAX_TIE_GAP_ULPS,
    }


@torch.no_grad()
def all_tail_logits(
    model: ComplEx, queries: Tensor, filt: TripleFilter, batch_size: int = 1024
) -> Tensor:
    """float64 scores of every tail of ``queries``, the other known answers masked ``-inf``."""
    parts = []
    for q in queries.split(batch_size):
        h, r, t = q.unbind(1)
        parts.append(mask_known(model.score_all(h, r, dtype=torch.float64), t, filt.mask(h, r)))
    return torch.cat(parts)


def _tail_hidden_truth(
    data: KGData,
    queries: Tensor,
    pred: Tensor,
    ev: Tensor,
    lg_ev: Tensor,
    sc_ev: Tensor,
    n_bins: int,
) -> dict[str, float]:
    """The tail audit against true labels: a top-1 answer that is hidden truth is right, so
    it becomes the target."""
    R = data.num_relations
    hidden = TripleFilter(with_reciprocals(data.hidden, R), data.num_entities, 2 * R)
    hit_hidden = hidden.contains(queries[:, 0], queries[:, 1], pred)
    true_target = torch.where(hit_hidden, pred, queries[:, 2])[ev]
    out = true_label_ece(lg_ev, sc_ev, true_target, "confidence", n_bins)
    out["hits1_true"] = float((pred[ev] == true_target).double().mean())
    return out


@torch.no_grad()
def tail_audit(
    model: ComplEx,
    data: KGData,
    *,
    seed: int = 0,
    n_bins: int = 15,
    alpha: float = 0.1,
    coverage: float = 0.8,
) -> AuditResult:
    """Multiclass audit of the top-1 filtered tail prediction (see the module docstring),
    with the per-relation temperature, the answer sets at ``alpha`` and the risk-coverage
    row at ``coverage`` of :mod:`.answers`.

    Checked exactly on every query of both halves (:func:`check_monotone_map`, one row per
    query over all entities, masks ``-inf``): no strict inversion, no broken tie, every top-1
    still a top-1, created ties at most :data:`MAX_TIE_GAP_ULPS` apart. Hits@1 and MRR come
    from the model's scores (filtered ranks, realistic ties).
    """
    R = data.num_relations
    n = len(data.test)
    queries = with_reciprocals(data.test, R)
    known = TripleFilter(with_reciprocals(data.known(), R), data.num_entities, 2 * R)
    cal = stratified_halves(data.test[:, 1], seed).repeat(2)
    ev = ~cal
    logits = all_tail_logits(model, queries, known)
    target = queries[:, 2]

    costs: dict[str, dict[str, object]] = {}
    scaler = TemperatureScaler()
    guard = guarded_temperature(scaler, logits[cal], target[cal], costs, "tail.temperature")
    fit = guard["fit"]
    scaled = logits.clone() if guard["temperature_fallback"] else scaler(logits)

    check = check_monotone_map(logits, scaled, decisions=False, max_tie_gap_ulps=MAX_TIE_GAP_ULPS)
    invariants = named_invariants(check, decisions=False)
    names = query_relation_names(data.relations)
    rel_t = relation_temperatures(logits, target, queries[:, 1], cal, names, scaled, n_bins, costs)
    for key, sc in (("raw", rel_t.scaled_raw), ("shrunk", rel_t.scaled_shrunk)):
        # each row divided by its relation's T > 0: the same per-row guarantees
        c = check_monotone_map(logits, sc, decisions=False, max_tie_gap_ulps=MAX_TIE_GAP_ULPS)
        invariants[f"relation_T_{key}_monotone"] = all(named_invariants(c, False).values())
        rel_t.summary[f"ties_created_{key}"] = c.ties_created
    pred = logits.argmax(1)
    ranks = filtered_ranks(logits[ev], target[ev])
    mrr = ranking_metrics(ranks.realistic)["mrr"]

    # the "confidence" reading straight from the masked logits: max softmax against
    # whether the argmax is the true tail (torchcal computes both)
    rel = queries[:, 1] % R
    lg_ev, sc_ev, t_ev = logits[ev], scaled[ev], target[ev]
    before = calibration_metrics(lg_ev, t_ev, "confidence", n_bins)
    after = calibration_metrics(sc_ev, t_ev, "confidence", n_bins)
    summary: dict[str, object] = {
        **_guard_keys(guard),
        "fit_converged": fit.converged,
        "n_calibration": int(cal.sum()),
        "n_evaluation": int(ev.sum()),
        "nll_before": float(TF.log_score(lg_ev, t_ev)),
        "nll_after": float(TF.log_score(sc_ev, t_ev)),
        # ranking metrics from the model's scores (T does not touch them): the same number
        # before and after
        "hits1_before": float((pred[ev] == t_ev).double().mean()),
        "hits1_after": float((pred[ev] == t_ev).double().mean()),
        "mrr_before": mrr,
        "mrr_after": mrr,
        **_invariant_counts(check),
        "invariants_ok": all(invariants.values()),
    }
    summary["nll_improved"] = summary["nll_after"] < summary["nll_before"]
    summary.update({f"{k}_before": v for k, v in before.items()})
    summary.update({f"{k}_after": v for k, v in after.items()})
    notes = [
        f"{n} test triples -> {len(queries)} queries (tail and reciprocal head "
        "prediction); confidence = max softmax over all entities, other known answers "
        "masked; outcome = the top-1 entity is the test triple's answer."
    ]
    if len(data.hidden):
        summary.update(_tail_hidden_truth(data, queries, pred, ev, lg_ev, sc_ev, n_bins))
        notes.append(
            "hidden truth: a top-1 answer that is a hidden true triple counts as "
            "wrong against observed labels and right against true labels."
        )
    summary["relation_temperature"] = {**rel_t.summary, "per_relation": rel_t.per_relation}
    summary["answer_sets"] = {
        "global_T": answer_sets(scaled, target, cal, alpha),
        "relation_T_shrunk": answer_sets(rel_t.scaled_shrunk, target, cal, alpha),
    }
    summary["risk_coverage"] = {
        "global_T": risk_coverage(sc_ev, pred[ev], t_ev, coverage),
        "relation_T_shrunk": risk_coverage(rel_t.scaled_shrunk[ev], pred[ev], t_ev, coverage),
    }
    per_rel = per_relation(lg_ev, sc_ev, t_ev, rel[ev], data.relations, "confidence", n_bins)
    tables = reliability_tables({"before": lg_ev, "after": sc_ev}, t_ev, "confidence", n_bins)
    return AuditResult("tail", summary, invariants, tables, per_rel, notes, costs)


def _dropped(n: int, k: int) -> str:
    return f"; {n} queries with fewer than k = {k} possible corruptions are left out" if n else ""


def _triple_notes(
    n_test: int,
    n_pos: int,
    k: int,
    trained_mode: str,
    trained_k: int | None,
    summary: dict[str, object],
) -> list[str]:
    """The triple audit's notes: its items, and whether one temperature can calibrate this
    model (trained in mode negatives at the audit's k) or why not."""
    notes = [
        f"{n_test} test triples -> {n_pos} positives (tail and reciprocal "
        f"head queries{_dropped(2 * n_test - n_pos, k)}), each with k = {k} "
        "distinct uniform filtered corruptions of its tail: base rate 1/(1+k) = "
        f"{1 / (1 + k):.4f}."
    ]
    if trained_mode == "negatives" and trained_k == k:
        notes.append(
            "This model was trained with the binary log score against k = "
            f"{k} corruptions per positive, the audit's base rate: sigmoid(score) is "
            "its own probability, so one temperature is a legitimate repair."
        )
    elif trained_mode == "negatives":
        notes.append(
            f"This model was trained against {trained_k} corruptions per positive "
            f"(base rate {1 / (1 + (trained_k or 0)):.4f}) but is audited at k = {k}: "
            "the base rates differ, which a temperature cannot fix (it cannot move an "
            "offset); compare the Platt row."
        )
    else:
        notes.append(
            "Why one temperature cannot calibrate these triples: this model was trained 1-N "
            "(a proper score of the softmax over all entities), and that loss does not change "
            "when a constant is added to all scores of a query, so training never fixes the "
            "score level and sigmoid(score) is not the probability that a triple is true. A "
            "temperature only divides the scores by T, so logit 0 stays the decision threshold "
            f"(accuracy at logit 0: {summary['acc_before']:.4f}, against "
            f"{summary['acc_base_rate']:.4f} for always answering 'false' at base rate "
            f"{1 / (1 + k):.4f}); fixing it needs an offset, as the Platt row (scale and "
            "offset, shown for information) does. A model trained with mode 'negatives' "
            "at the audit's k learns the level at this base rate, and one temperature can "
            "calibrate it."
        )
    return notes


def _triple_hidden_truth(
    data: KGData, items: TripleItems, columns: dict[str, Tensor], n_bins: int
) -> dict[str, object]:
    """The triple audit against true labels: a corruption that is hidden truth is true."""
    R = data.num_relations
    hidden = TripleFilter(with_reciprocals(data.hidden, R), data.num_entities, 2 * R)
    labels = items.labels
    true_labels = labels.bool() | hidden.contains(
        items.head[:, None], items.relation[:, None], items.tails
    )
    out: dict[str, object] = dict(
        true_label_ece(
            columns["before"],
            columns["after"],
            true_labels[~items.cal].reshape(-1).double(),
            "binary",
            n_bins,
        )
    )
    out["hidden_true_corruptions"] = int((true_labels & ~labels.bool()).sum())
    return out


def _triple_checks(
    logits: Tensor, scaled: Tensor
) -> tuple[MonotoneMapCheck, MonotoneMapCheck, dict[str, bool]]:
    """The triple audit's checks: the complete order (AUC, decisions) and, per query, the
    top-1 (the per-query order is part of the complete one); ``(check, per_query,
    invariants)``."""
    check = check_monotone_map(
        logits.reshape(-1), scaled.reshape(-1), max_tie_gap_ulps=MAX_TIE_GAP_ULPS
    )
    per_query = check_monotone_map(logits, scaled, max_tie_gap_ulps=MAX_TIE_GAP_ULPS)
    invariants = named_invariants(check, decisions=True)
    invariants["top1_kept"] = per_query.top1_kept
    invariants["created_ties_within_bound"] = (
        max(check.max_tie_gap_ulps, per_query.max_tie_gap_ulps) <= MAX_TIE_GAP_ULPS
    )
    return check, per_query, invariants


def _score_columns(
    logits: Tensor, scaled: Tensor, platt: PlattScaler, ev: Tensor, k: int
) -> dict[str, Tensor]:
    """The triple audit's four score columns on the evaluation half, flattened: as trained,
    after T, after Platt (information) and the base rate (a constant 1/(1+k), the no-skill
    reference)."""
    lg_ev = logits[ev].reshape(-1)
    return {
        "before": lg_ev,
        "after": scaled[ev].reshape(-1),
        "platt": platt(lg_ev),
        "base_rate": torch.full_like(lg_ev, -math.log(k)),
    }


def _column_metrics(
    columns: dict[str, Tensor], labels: Tensor, n_bins: int, platt_scale: float
) -> dict[str, object]:
    """Every metric of every score column (``<metric>_<column>``) and ``nll_improved``."""
    out: dict[str, object] = {}
    for col, x in columns.items():
        for key, v in _binary_metrics(x, labels, n_bins).items():
            out[f"{key}_{col}"] = v
    # AUC is a ranking metric: from the model's scores, which T (and Platt, slope > 0) do
    # not reorder beyond the ties the invariants check
    out["auc_after"] = out["auc_before"]
    if platt_scale > 0:
        out["auc_platt"] = out["auc_before"]
    out["nll_improved"] = out["nll_after"] < out["nll_before"]
    return out


@torch.no_grad()
def triple_audit(
    model: ComplEx,
    data: KGData,
    *,
    k: int = 10,
    seed: int = 0,
    n_bins: int = 15,
    trained_mode: str = "one_to_n",
    trained_k: int | None = None,
) -> AuditResult:
    """Binary audit of ``sigmoid(score)`` on held-out positives plus ``k`` filtered corruptions.

    Checked exactly on both halves (:func:`check_monotone_map`): along the stable order of
    all scores no strict inversion and no broken tie (so the order behind the AUC and every
    query's ranking of its ``1 + k`` candidates hold), every query's top-1 still a top-1,
    every decision at logit 0 unchanged, created ties at most :data:`MAX_TIE_GAP_ULPS`
    apart. AUC comes from the model's scores (the "after T" and Platt columns repeat it).
    """
    R = data.num_relations
    items = triple_items(data, k, seed)
    h, r, cand, labels, cal = items.head, items.relation, items.tails, items.labels, items.cal
    logits = model.score(h, r, cand, dtype=torch.float64)
    ev = ~cal

    costs: dict[str, dict[str, object]] = {}
    scaler = TemperatureScaler()
    guard = guarded_temperature(
        scaler, logits[cal].reshape(-1), labels[cal].reshape(-1), costs, "triple.temperature"
    )
    fit = guard["fit"]
    scaled = logits.clone() if guard["temperature_fallback"] else scaler(logits)
    platt = PlattScaler()
    with measure(costs, "triple.platt"):
        platt_fit = platt.fit(logits[cal].reshape(-1), labels[cal].reshape(-1))

    check, per_query, invariants = _triple_checks(logits, scaled)
    y_ev = labels[ev].reshape(-1)
    columns = _score_columns(logits, scaled, platt, ev, k)
    summary: dict[str, object] = {
        "k": k,
        "base_rate": 1.0 / (1 + k),
        **_guard_keys(guard),
        "fit_converged": fit.converged,
        "n_calibration": int(cal.sum()) * (1 + k),
        "n_evaluation": int(ev.sum()) * (1 + k),
        "queries_left_out": 2 * len(data.test) - len(h),
        "platt_scale": float(platt.weight),
        "platt_offset": float(platt.bias),
        "platt_converged": platt_fit.converged,
        **_invariant_counts(check),
        "max_tie_gap_ulps": max(check.max_tie_gap_ulps, per_query.max_tie_gap_ulps),
        "ties_created_within_queries": per_query.ties_created,
        "invariants_ok": all(invariants.values()),
    }
    summary.update(_column_metrics(columns, y_ev, n_bins, summary["platt_scale"]))
    notes = _triple_notes(len(data.test), len(h), k, trained_mode, trained_k, summary)
    if len(data.hidden):
        summary.update(_triple_hidden_truth(data, items, columns, n_bins))
        notes.append(
            "hidden truth: a corruption that is a hidden true triple is labelled 0 "
            "against observed labels and 1 against true labels."
        )
    rel = (r[:, None] % R).expand_as(logits)[ev].reshape(-1)
    per_rel = per_relation(
        columns["before"], columns["after"], y_ev, rel, data.relations, "binary", n_bins
    )
    tables = reliability_tables(
        {k: columns[k] for k in ("before", "after", "platt")}, y_ev, "binary", n_bins
    )
    return AuditResult("triple", summary, invariants, tables, per_rel, notes, costs)


def run_audits(
    model: ComplEx,
    data: KGData,
    *,
    seed: int = 0,
    trained_mode: str = "one_to_n",
    trained_k: int | None = None,
    k: int | None = None,
    n_bins: int = 15,
    alpha: float = 0.1,
    coverage: float = 0.8,
) -> list[AuditResult]:
    """Both audits, ``tail`` then ``triple``. The command line's ``--audit.k`` and
    ``--audit.n_bins`` are this signature's (jsonargparse reads it).

    Args:
        model: the trained model.
        data: its dataset (the audits use the test triples).
        seed: seed of the halves and of the corruptions.
        trained_mode: the model's training mode (what the triple audit's notes say).
        trained_k: the model's corruptions per positive in training.
        k: corruptions per held-out positive in the triple audit (default: model.num_negatives).
        n_bins: equal-width bins of the reliability tables and ECE.
        alpha: miscoverage of the tail audit's conformal answer sets (coverage >= 1 - alpha).
        coverage: the coverage at which the risk-coverage row reads the risk of the top-1
            tail (the most confident share of the queries).
    """
    k = trained_k if k is None else k
    return [
        tail_audit(model, data, seed=seed, n_bins=n_bins, alpha=alpha, coverage=coverage),
        triple_audit(
            model,
            data,
            k=k,
            seed=seed,
            n_bins=n_bins,
            trained_mode=trained_mode,
            trained_k=trained_k,
        ),
    ]
