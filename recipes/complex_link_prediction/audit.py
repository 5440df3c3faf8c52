"""Calibration audits of a trained ComplEx model: measure, repair with one temperature, and
prove by exact assertion that the repair moved no decision and no ranking.

Both audits use the held-out test triples, split (seeded, stratified by relation) into a
calibration half (T is fitted there) and an evaluation half (everything reported is measured
there). A test triple's two queries (tail and reciprocal head prediction) and all their
corruptions stay in the same half. Scores are float64 logits throughout (a float32 sigmoid
saturates near 17 and creates ties).

* ``tail`` (multiclass): the top-1 filtered tail prediction over all entities (other known
  answers masked with ``-inf``) against whether it is the true tail (the "confidence"
  reading of Guo et al. 2017, "On Calibration of Modern Neural Networks").
* ``triple`` (binary; the triple-classification protocol of Socher et al. 2013 as audited by
  Tabacof & Costabello 2020, "Probability Calibration for Knowledge Graph Embedding Models"):
  each held-out positive with ``k`` uniform filtered corruptions of its tail, base rate
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
    same_ranking,
)
from recipes.complex_link_prediction.model import ComplEx, sample_corruptions
from torchcal.report import ReliabilityTable
from torchcal.scaling import PlattScaler, TemperatureScaler

__all__ = ["AuditResult", "TripleItems", "auc", "stratified_halves", "tail_audit", "triple_audit",
           "triple_items"]

MIN_RELATION_ITEMS = 50


@dataclass
class AuditResult:
    """Numbers (``summary``, JSON-ready), diagrams and exact invariant checks of one audit."""

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

    Asserted exactly (on every query of both halves): the argmax of ``logits / T`` equals the
    argmax of ``logits`` (hence Hits@1), the filtered optimistic and pessimistic ranks are equal
    tensors, the filtered MRR is the same float, and each row keeps its complete weak order.
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

    pred_before, pred_after = logits.argmax(1), scaled.argmax(1)
    ranks_before, ranks_after = filtered_ranks(logits, target), filtered_ranks(scaled, target)
    mrr_before = ranking_metrics(ranks_before.realistic)["mrr"]
    mrr_after = ranking_metrics(ranks_after.realistic)["mrr"]
    invariants = {
        "argmax_unchanged": torch.equal(pred_before, pred_after),
        "ranks_unchanged": torch.equal(ranks_before.optimistic, ranks_after.optimistic)
        and torch.equal(ranks_before.pessimistic, ranks_after.pessimistic),
        "mrr_unchanged": mrr_before == mrr_after,
        "full_ranking_unchanged": same_ranking(logits, scaled),
    }

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
        "hits1_before": float((pred_before[ev] == t_ev).double().mean()),
        "hits1_after": float((pred_after[ev] == t_ev).double().mean()),
        "mrr_before": mrr_before,
        "mrr_after": mrr_after,
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
        hit_hidden = hidden.contains(queries[:, 0], queries[:, 1], pred_before)
        true_target = torch.where(hit_hidden, pred_before, target)[ev]
        summary.update(_true_label_ece(lg_ev, sc_ev, true_target, "confidence", n_bins))
        summary["hits1_true"] = float((pred_before[ev] == true_target).double().mean())
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
    """Positives (each test triple in both directions) with ``k`` uniform corruptions of the
    tail filtered against every observed triple, and the calibration half (seeded, by test
    triple, stratified by relation)."""
    if k < 1:
        raise ValueError(f"audit.k: expected an int >= 1, got {k}")
    R = data.num_relations
    n = len(data.test)
    queries = with_reciprocals(data.test, R)
    source = torch.arange(n).repeat(2)
    cal = stratified_halves(data.test[:, 1], seed).repeat(2)
    known = TripleFilter(with_reciprocals(data.known(), R), data.num_entities, 2 * R)
    # a query whose every tail is known has no corruption: it can't be an audit item
    possible = known.mask(queries[:, 0], queries[:, 1]).sum(1) < data.num_entities
    queries, source, cal = queries[possible], source[possible], cal[possible]
    h, r, t = queries.unbind(1)
    g = torch.Generator().manual_seed(seed + 1)
    neg = sample_corruptions(h, r, k, data.num_entities, known, g)
    labels = torch.zeros(len(queries), 1 + k, dtype=torch.float64)
    labels[:, 0] = 1.0
    return TripleItems(head=h, relation=r, tails=torch.cat([t[:, None], neg], dim=1),
                       labels=labels, source=source, cal=cal)


def _dropped(n: int) -> str:
    return f"; {n} queries whose every tail is known have no corruption and are left out" if n \
        else ""


@torch.no_grad()
def triple_audit(model: ComplEx, data: KGData, *, k: int = 10, seed: int = 0, n_bins: int = 15,
                 trained_mode: str = "one_to_n", trained_k: int | None = None) -> AuditResult:
    """Binary audit of ``sigmoid(score)`` on held-out positives plus ``k`` filtered corruptions.

    Asserted exactly (both halves): the decision at logit 0 (accuracy), the AUC and the
    complete weak order of every query's ``1 + k`` scores are unchanged by ``T``.
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

    auc_before, auc_after = auc(logits, labels), auc(scaled, labels)
    invariants = {
        "decisions_unchanged": torch.equal(logits > 0, scaled > 0),
        "auc_unchanged": auc_before == auc_after,
        "rankings_unchanged": same_ranking(logits, scaled),
    }
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
        "platt_scale": float(platt.weight),
        "platt_offset": float(platt.bias),
        "platt_converged": platt_fit.converged,
        "invariants_ok": all(invariants.values()),
    }
    for col, x in columns.items():
        for key, v in _binary_metrics(x, y_ev, n_bins).items():
            summary[f"{key}_{col}"] = v
    summary["nll_improved"] = summary["nll_after"] < summary["nll_before"]
    notes = [f"{len(data.test)} test triples -> {len(h)} positives (tail and reciprocal "
             f"head queries{_dropped(2 * len(data.test) - len(h))}), each with k = {k} uniform "
             f"filtered corruptions of its tail: base rate 1/(1+k) = {1 / (1 + k):.4f}."]
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
