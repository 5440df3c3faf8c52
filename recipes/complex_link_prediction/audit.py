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
from recipes.complex_link_prediction.data import KGData, with_reciprocals
from recipes.complex_link_prediction.evaluation import (
    TripleFilter,
    filtered_ranks,
    mask_known,
    ranking_metrics,
)
from recipes.complex_link_prediction.model import ComplEx
from torchcal.functional import MonotoneMapCheck, check_monotone_map
from torchcal.report import ReliabilityTable
from torchcal.scaling import PlattScaler, TemperatureScaler

__all__ = ["MAX_TIE_GAP_ULPS", "AuditResult", "TripleItems", "auc", "check_audit_data",
           "stratified_halves", "tail_audit", "triple_audit", "triple_items"]

MIN_RELATION_ITEMS = 50
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

    @property
    def invariants_ok(self) -> bool:
        return all(self.invariants.values())


def stratified_halves(strata: Tensor, seed: int) -> Tensor:
    """Boolean mask of the calibration half: inside every stratum a seeded random half
    (the first ``ceil(n/2)`` of a random order), so both halves hold every relation.

    Example:
        >>> import torch
        >>> cal = stratified_halves(torch.tensor([0, 0, 0, 1, 1]), seed=0)
        >>> int(cal[:3].sum()), int(cal[3:].sum())
        (2, 1)
    """
    n = len(strata)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    order = perm[torch.argsort(strata[perm], stable=True)]
    s = strata[order]
    # position of each item inside its stratum (strata are contiguous after the sort)
    first = torch.ones(n, dtype=torch.bool)
    first[1:] = s[1:] != s[:-1]
    start = torch.cummax(torch.where(first, torch.arange(n), 0), 0).values
    pos = torch.arange(n) - start
    cal = torch.zeros(n, dtype=torch.bool)
    cal[order] = pos % 2 == 0
    return cal


def auc(scores: Tensor, labels: Tensor) -> float:
    """ROC AUC by the Mann-Whitney U statistic with mid-ranks for ties (Hanley & McNeil
    1982), vectorised: ``(sum of positive ranks - P (P + 1) / 2) / (P N)``.

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
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True,
                                                  return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    mid = ends - (counts.double() - 1) / 2  # 1-based mid-rank of each tie group
    ranks = torch.empty_like(s)
    ranks[idx] = mid[inverse]
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def _calibration_metrics(logits: Tensor, target: Tensor, reading: str,
                         n_bins: int) -> dict[str, float]:
    """ECE (L1, binned), debiased ECE (L2) and the Brier decomposition, all from torchcal on
    the logits themselves: ``reading="confidence"`` for ``(N, E)`` tail logits (max softmax
    against argmax == target; ``-inf`` masks allowed), ``"binary"`` for triple logits."""
    kw = {"n_bins": n_bins, "reading": reading, "input": "logits"}
    out = {
        "ece": float(TF.calibration_error(logits, target, **kw)),
        "ece_debiased": float(TF.calibration_error(logits, target, estimator="debiased",
                                                   norm="l2", **kw)),
    }
    dec = TF.brier_decomposition(logits, target, **kw)
    for key in ("brier", "reliability", "resolution", "uncertainty"):
        out[key] = float(dec[key])
    return out


def _binary_metrics(logits: Tensor, labels: Tensor, n_bins: int) -> dict[str, float]:
    """The triple audit's rows for one column of binary logits: :func:`_calibration_metrics`
    plus NLL, AUC and the accuracy of the decision at logit 0."""
    out = _calibration_metrics(logits, labels, "binary", n_bins)
    out["nll"] = float(TF.log_score(logits, labels))
    out["auc"] = auc(logits, labels)
    out["acc"] = float(((logits > 0).double() == labels).double().mean())
    return out


def _per_relation(logits_before: Tensor, logits_after: Tensor, target: Tensor, rel: Tensor,
                  relations: list[str], reading: str, n_bins: int) -> list[dict[str, object]]:
    """ECE before/after per relation (torchcal's ``groups``), for relations with at least
    :data:`MIN_RELATION_ITEMS` items."""
    kw = {"n_bins": n_bins, "reading": reading, "input": "logits", "groups": rel,
          "num_groups": len(relations)}
    before = TF.calibration_error(logits_before, target, **kw)
    after = TF.calibration_error(logits_after, target, **kw)
    return [{"relation": relations[r], "n": int(before.counts[r]),
             "ece_before": float(before.per_group[r]), "ece_after": float(after.per_group[r])}
            for r in torch.nonzero(before.counts >= MIN_RELATION_ITEMS).flatten().tolist()]


def _true_label_ece(logits_before: Tensor, logits_after: Tensor, true_target: Tensor,
                    reading: str, n_bins: int) -> dict[str, float]:
    """ECE before/after against the true labels (hidden true triples count as true)."""
    kw = {"n_bins": n_bins, "reading": reading, "input": "logits"}
    return {"ece_true_before": float(TF.calibration_error(logits_before, true_target, **kw)),
            "ece_true_after": float(TF.calibration_error(logits_after, true_target, **kw))}


def _tables(logits: dict[str, Tensor], target: Tensor, reading: str,
            n_bins: int) -> dict[str, ReliabilityTable]:
    return {key: TF.reliability_table(x, target, n_bins=n_bins, reading=reading, input="logits")
            for key, x in logits.items()}


def _invariants(check: MonotoneMapCheck, decisions: bool) -> dict[str, bool]:
    """The audit's named invariants from one :func:`check_monotone_map` result."""
    out = {"no_strict_inversion": check.strict_inversions == 0,
           "ties_kept": check.ties_broken == 0,
           "top1_kept": check.top1_kept}
    if decisions:
        out["decisions_unchanged"] = bool(check.decisions_kept)
    out["created_ties_within_bound"] = check.max_tie_gap_ulps <= MAX_TIE_GAP_ULPS
    return out


def _invariant_counts(check: MonotoneMapCheck) -> dict[str, object]:
    """The counts behind the invariants, for the report."""
    return {"strict_inversions": check.strict_inversions, "ties_broken": check.ties_broken,
            "ties_created": check.ties_created, "max_tie_gap_ulps": check.max_tie_gap_ulps,
            "max_tie_gap_bound_ulps": MAX_TIE_GAP_ULPS}


@torch.no_grad()
def _all_tail_logits(model: ComplEx, queries: Tensor, filt: TripleFilter,
                     batch_size: int = 1024) -> Tensor:
    parts = []
    for q in queries.split(batch_size):
        h, r, t = q.unbind(1)
        parts.append(mask_known(model.score_all(h, r, dtype=torch.float64), t, filt.mask(h, r)))
    return torch.cat(parts)


@torch.no_grad()
def tail_audit(model: ComplEx, data: KGData, *, seed: int = 0, n_bins: int = 15) -> AuditResult:
    """Multiclass audit of the top-1 filtered tail prediction (see the module docstring).

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
    logits = _all_tail_logits(model, queries, known)
    target = queries[:, 2]

    scaler = TemperatureScaler()
    fit = scaler.fit(logits[cal], target[cal])
    scaled = scaler(logits)

    check = check_monotone_map(logits, scaled, decisions=False,
                               max_tie_gap_ulps=MAX_TIE_GAP_ULPS)
    invariants = _invariants(check, decisions=False)
    pred = logits.argmax(1)
    ranks = filtered_ranks(logits[ev], target[ev])
    mrr = ranking_metrics(ranks.realistic)["mrr"]

    # the "confidence" reading straight from the masked logits: max softmax against
    # whether the argmax is the true tail (torchcal computes both)
    rel = queries[:, 1] % R
    lg_ev, sc_ev, t_ev = logits[ev], scaled[ev], target[ev]
    before = _calibration_metrics(lg_ev, t_ev, "confidence", n_bins)
    after = _calibration_metrics(sc_ev, t_ev, "confidence", n_bins)
    summary: dict[str, object] = {
        "temperature": fit.temperature,
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
    for k, v in before.items():
        summary[f"{k}_before"] = v
    for k, v in after.items():
        summary[f"{k}_after"] = v
    notes = [f"{n} test triples -> {len(queries)} queries (tail and reciprocal head "
             "prediction); confidence = max softmax over all entities, other known answers "
             "masked; outcome = the top-1 entity is the test triple's answer."]
    if len(data.hidden):
        hidden = TripleFilter(with_reciprocals(data.hidden, R), data.num_entities, 2 * R)
        # a top-1 answer that is hidden truth is right against true labels: make it the target
        hit_hidden = hidden.contains(queries[:, 0], queries[:, 1], pred)
        true_target = torch.where(hit_hidden, pred, target)[ev]
        summary.update(_true_label_ece(lg_ev, sc_ev, true_target, "confidence", n_bins))
        summary["hits1_true"] = float((pred[ev] == true_target).double().mean())
        notes.append("hidden truth: a top-1 answer that is a hidden true triple counts as "
                     "wrong against observed labels and right against true labels.")
    per_rel = _per_relation(lg_ev, sc_ev, t_ev, rel[ev], data.relations, "confidence", n_bins)
    tables = _tables({"before": lg_ev, "after": sc_ev}, t_ev, "confidence", n_bins)
    return AuditResult("tail", summary, invariants, tables, per_rel, notes)


@dataclass
class TripleItems:
    """The triple audit's items: row ``i`` is source positive ``(head[i], relation[i],
    tails[i, 0])`` followed by its ``k`` corruptions ``tails[i, 1:]`` (labels 1, 0, ..., 0);
    ``source[i]`` is the test triple it comes from and ``cal[i]`` its half, so a positive and
    its corruptions are never split."""

    head: Tensor
    relation: Tensor
    tails: Tensor
    labels: Tensor
    source: Tensor
    cal: Tensor


def triple_items(data: KGData, k: int, seed: int) -> TripleItems:
    """Positives (each test triple in both directions) with ``k`` distinct uniform corruptions
    of the tail (drawn without replacement among the tails that make no observed triple),
    and the calibration half (seeded, by test triple, stratified by relation). A query with
    fewer than ``k`` possible corruptions is left out (:func:`check_audit_data` says how many
    and raises when a half would be empty).

    Example:
        >>> from recipes.complex_link_prediction.data import load_dataset
        >>> items = triple_items(load_dataset("family", num_families=3, generations=4), 5, 0)
        >>> items.tails.shape[1], bool((items.tails.sort(1).values.diff(dim=1) != 0).all())
        (6, True)
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"audit.k: expected an int >= 1, got {k!r}")
    R = data.num_relations
    n = len(data.test)
    queries = with_reciprocals(data.test, R)
    source = torch.arange(n).repeat(2)
    cal = stratified_halves(data.test[:, 1], seed).repeat(2)
    known = TripleFilter(with_reciprocals(data.known(), R), data.num_entities, 2 * R)
    free = ~known.mask(queries[:, 0], queries[:, 1])
    possible = free.sum(1) >= k
    queries, source, cal, free = queries[possible], source[possible], cal[possible], free[possible]
    h, r, t = queries.unbind(1)
    g = torch.Generator().manual_seed(seed + 1)
    if len(queries):
        neg = torch.multinomial(free.double(), k, replacement=False, generator=g)
    else:
        neg = torch.empty(0, k, dtype=torch.long)
    tails = torch.cat([t[:, None], neg], dim=1)
    sorted_tails = tails.sort(1).values
    dup = (sorted_tails[:, 1:] == sorted_tails[:, :-1]).any(1)
    if bool(dup.any()):  # cannot happen by construction; a silent duplicate skews the audit
        i = int(torch.nonzero(dup)[0, 0])
        raise ValueError(f"audit.k: duplicate sampled candidates for query ({int(h[i])}, "
                         f"{int(r[i])}, ?): {tails[i].tolist()}")
    labels = torch.zeros(len(queries), 1 + k, dtype=torch.float64)
    labels[:, 0] = 1.0
    return TripleItems(head=h, relation=r, tails=tails, labels=labels, source=source, cal=cal)


def check_audit_data(data: KGData, k: int, seed: int) -> dict[str, int]:
    """Raise a clear ``ValueError`` (before any training) when the audits cannot run on
    ``data``: fewer than 2 test triples, an empty calibration or evaluation half (every
    relation has a single test triple), or no query with ``k`` distinct filtered corruptions
    in one of the halves. Returns the counts the report shows."""
    n = len(data.test)
    if n < 2:
        raise ValueError(f"data.test: expected at least 2 test triples (the audits split them "
                         f"into a calibration half and an evaluation half), got {n}")
    cal = stratified_halves(data.test[:, 1], seed)
    if not bool((~cal).any()):
        raise ValueError(f"data.test: the evaluation half is empty: each of the {n} test "
                         "triples has a relation of its own, and the audits split test "
                         "triples by relation; add test triples")
    items = triple_items(data, k, seed)
    n_queries = 2 * n
    for half, mask in (("calibration", items.cal), ("evaluation", ~items.cal)):
        if not bool(mask.any()):
            raise ValueError(f"audit.k: no test query of the {half} half has k = {k} distinct "
                             f"filtered corruptions ({len(items.head)} of {n_queries} queries "
                             f"have); lower --audit.k")
    return {"triple_queries_left_out": n_queries - len(items.head)}


def _dropped(n: int, k: int) -> str:
    return (f"; {n} queries with fewer than k = {k} possible corruptions are left out"
            if n else "")


@torch.no_grad()
def triple_audit(model: ComplEx, data: KGData, *, k: int = 10, seed: int = 0, n_bins: int = 15,
                 trained_mode: str = "one_to_n", trained_k: int | None = None) -> AuditResult:
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

    scaler = TemperatureScaler()
    fit = scaler.fit(logits[cal].reshape(-1), labels[cal].reshape(-1))
    scaled = scaler(logits)
    platt = PlattScaler()
    platt_fit = platt.fit(logits[cal].reshape(-1), labels[cal].reshape(-1))

    # the complete order (AUC, decisions) and, per query, the top-1; the per-query order is
    # part of the complete one
    check = check_monotone_map(logits.reshape(-1), scaled.reshape(-1),
                               max_tie_gap_ulps=MAX_TIE_GAP_ULPS)
    per_query = check_monotone_map(logits, scaled, max_tie_gap_ulps=MAX_TIE_GAP_ULPS)
    invariants = _invariants(check, decisions=True)
    invariants["top1_kept"] = per_query.top1_kept
    invariants["created_ties_within_bound"] = (
        max(check.max_tie_gap_ulps, per_query.max_tie_gap_ulps) <= MAX_TIE_GAP_ULPS)
    # every metric on the evaluation half, for four score columns: as trained, after T, after
    # Platt (information) and the base rate (a constant 1/(1+k), the no-skill reference)
    y_ev = labels[ev].reshape(-1)
    lg_ev = logits[ev].reshape(-1)
    columns = {"before": lg_ev, "after": scaled[ev].reshape(-1), "platt": platt(lg_ev),
               "base_rate": torch.full_like(lg_ev, -math.log(k))}
    summary: dict[str, object] = {
        "k": k,
        "base_rate": 1.0 / (1 + k),
        "temperature": fit.temperature,
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
    for col, x in columns.items():
        for key, v in _binary_metrics(x, y_ev, n_bins).items():
            summary[f"{key}_{col}"] = v
    # AUC is a ranking metric: from the model's scores, which T (and Platt, slope > 0) do
    # not reorder beyond the ties checked above
    summary["auc_after"] = summary["auc_before"]
    if summary["platt_scale"] > 0:
        summary["auc_platt"] = summary["auc_before"]
    summary["nll_improved"] = summary["nll_after"] < summary["nll_before"]
    notes = [f"{len(data.test)} test triples -> {len(h)} positives (tail and reciprocal "
             f"head queries{_dropped(2 * len(data.test) - len(h), k)}), each with k = {k} "
             "distinct uniform filtered corruptions of its tail: base rate 1/(1+k) = "
             f"{1 / (1 + k):.4f}."]
    if trained_mode == "negatives" and trained_k == k:
        notes.append("This model was trained with the binary log score against k = "
                     f"{k} corruptions per positive, the audit's base rate: sigmoid(score) is "
                     "its own probability, so one temperature is a legitimate repair.")
    elif trained_mode == "negatives":
        notes.append(f"This model was trained against {trained_k} corruptions per positive "
                     f"(base rate {1 / (1 + (trained_k or 0)):.4f}) but is audited at k = {k}: "
                     "the base rates differ, which a temperature cannot fix (it cannot move an "
                     "offset); compare the Platt row.")
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
            "calibrate it.")
    if len(data.hidden):
        hidden = TripleFilter(with_reciprocals(data.hidden, R), data.num_entities, 2 * R)
        true_labels = labels.bool() | hidden.contains(h[:, None], r[:, None], cand)
        summary.update(_true_label_ece(columns["before"], columns["after"],
                                       true_labels[ev].reshape(-1).double(), "binary", n_bins))
        summary["hidden_true_corruptions"] = int((true_labels & ~labels.bool()).sum())
        notes.append("hidden truth: a corruption that is a hidden true triple is labelled 0 "
                     "against observed labels and 1 against true labels.")
    rel = (r[:, None] % R).expand_as(logits)[ev].reshape(-1)
    per_rel = _per_relation(columns["before"], columns["after"], y_ev, rel, data.relations,
                            "binary", n_bins)
    tables = _tables({k: columns[k] for k in ("before", "after", "platt")}, y_ev, "binary",
                     n_bins)
    return AuditResult("triple", summary, invariants, tables, per_rel, notes)
