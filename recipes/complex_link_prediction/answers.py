"""The tail audit beyond one temperature: a per-relation temperature shrunk toward the global
one, conformal answer sets for the tail queries, and the risk-coverage row of the top-1 tail
prediction. Every formula is torchcal's (:class:`~torchcal.scaling.GroupTemperatureScaler`
with ``shrinkage="empirical_bayes"``, :func:`torchcal.functional.conformal_scores` /
``conformal_sets`` with :func:`torchcal.scaling.conformal_quantile`, and the selective
metrics); this module only arranges the audit's halves and names the numbers.

* **Per-relation temperature.** One ``T_r`` per query relation (each relation and its
  reciprocal, ``r^-1``: tail and head prediction are different problems), fitted on the
  calibration half by Newton on ``log T_r`` (the raw ``T_r``: each minimises its relation's
  NLL, so none fits its own queries worse than the global ``T``), then shrunk toward the
  global ``log T`` with weight ``w_r tau^2 / (1 + w_r tau^2)`` (``w_r`` the curvature of the
  relation's summed NLL at its own ``log T_r``, ``tau^2`` the DerSimonian-Laird
  between-relation variance; ``n_r / (n_r + k_r)`` in sample units): a relation with few
  calibration queries, or whose own fit runs to a bound (all its queries right and sure),
  gets about the global ``T``. The evaluation half compares global, raw and shrunk.
* **Answer sets** (split conformal, LAC): the nonconformity of a calibration query is ``1 -
  p(true tail)`` under the set temperature, with the other known true tails excluded from the
  candidates (filtered, as in the ranks: masked ``-inf``, probability 0); the threshold is
  the ``ceil((n + 1)(1 - alpha))``-th smallest score; a query's set holds every candidate
  tail whose score is at most the threshold. The set temperature is a stated choice: the
  calibration ``T`` (global, fitted on the same calibration half; strictly, the guarantee
  ``P(covered) >= 1 - alpha`` is exact for a score fixed before calibration: one fitted
  scalar makes it approximate) and, beside it, the shrunk per-relation ``T``. A test
  triple's two queries sit in the same half, so the binomial standard error of the coverage
  treats correlated pairs as independent (a slight understatement).
* **Risk-coverage** of the top-1 tail: confidence = its probability under the temperature,
  loss = wrong. AURC, AUGRC (Traub et al. 2024) and the risk at a stated coverage, tied
  confidences as one block. One global ``T`` keeps the order of the confidences (so the row
  is the model's own); a per-relation ``T`` reorders queries across relations and can change
  it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

import torchcal.functional as TF
from recipes.complex_link_prediction._audit_metrics import calibration_metrics
from recipes.complex_link_prediction.costs import measure
from torchcal.scaling import GroupTemperatureScaler, conformal_quantile

__all__ = [
    "RelationTemperatures",
    "answer_sets",
    "query_relation_names",
    "relation_temperatures",
    "risk_coverage",
]


def query_relation_names(relations: list[str]) -> list[str]:
    """Names of the ``2 R`` query relations: each relation, then its reciprocal ``r^-1``.

    Example:
        >>> query_relation_names(["father", "spouse"])
        ['father', 'spouse', 'father^-1', 'spouse^-1']
    """
    return list(relations) + [f"{r}^-1" for r in relations]


@dataclass
class RelationTemperatures:
    """The per-relation temperature's numbers (``summary``, ``per_relation``: JSON-ready)
    and the scaled logits of all queries under the raw and the shrunk temperatures."""

    summary: dict[str, object]
    per_relation: list[dict[str, object]]
    scaled_raw: Tensor
    scaled_shrunk: Tensor


def _spread(x: Tensor, prefix: str) -> dict[str, float]:
    if x.numel() == 0:
        return {f"{prefix}_{k}": math.nan for k in ("min", "median", "max")}
    return {
        f"{prefix}_min": float(x.min()),
        f"{prefix}_median": float(torch.quantile(x, 0.5)),
        f"{prefix}_max": float(x.max()),
    }


def relation_temperatures(
    logits: Tensor,
    target: Tensor,
    relation: Tensor,
    cal: Tensor,
    names: list[str],
    scaled_global: Tensor,
    n_bins: int,
    costs: dict[str, dict[str, object]],
) -> RelationTemperatures:
    """Fit the raw and the shrunk per-relation temperatures on the calibration half
    (``cal``) and compare them with the global one (``scaled_global``) on the evaluation
    half: ECE and NLL (see the module docstring). The fits' time and memory go to
    ``costs`` (``tail.relation_T_raw``, ``tail.relation_T_shrunk``); their warnings (a
    relation whose own T runs to a bound, relations without calibration queries) are
    counted, not repeated: the shrunk fit handles both."""
    G = len(names)
    ev = ~cal
    lg_cal, t_cal, r_cal = logits[cal], target[cal], relation[cal]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        raw = GroupTemperatureScaler(G, shrinkage=0.0)
        with measure(costs, "tail.relation_T_raw"):
            raw.fit(lg_cal, t_cal, r_cal)
        eb = GroupTemperatureScaler(G, shrinkage="empirical_bayes")
        with measure(costs, "tail.relation_T_shrunk"):
            res = eb.fit(lg_cal, t_cal, r_cal)
    assert eb.shrinkage_weights is not None and eb.raw_temperatures is not None
    with torch.no_grad():  # the scalers' log T are parameters
        scaled_raw, scaled_shrunk = raw(logits, relation), eb(logits, relation)
    n_cal = torch.bincount(r_cal, minlength=G)
    n_ev = torch.bincount(relation[ev], minlength=G)
    seen = n_cal > 0
    t_raw, t_eb, w = raw.temperatures, eb.temperatures, eb.shrinkage_weights
    lo, hi = raw.bounds
    at_bound = seen & ((t_raw <= lo * (1 + 1e-9)) | (t_raw >= hi * (1 - 1e-9)))
    t_ev = target[ev]
    summary: dict[str, object] = {
        "groups": G,
        "groups_with_calibration_queries": int(seen.sum()),
        "groups_raw_at_bound": int(at_bound.sum()),
        "global_temperature": res.temperature,
        "between_relation_variance_log_t": eb.between_group_variance,
        **_spread(t_raw[seen], "t_raw"),
        **_spread(t_eb[seen], "t_shrunk"),
        **_spread(w[seen], "weight"),
        "fit_warnings": len(caught),
    }
    for key, sc in (("global", scaled_global), ("raw", scaled_raw), ("shrunk", scaled_shrunk)):
        summary[f"ece_{key}"] = calibration_metrics(sc[ev], t_ev, "confidence", n_bins)["ece"]
        summary[f"nll_{key}"] = float(TF.log_score(sc[ev], t_ev))
        summary[f"nll_calibration_{key}"] = float(TF.log_score(sc[cal], t_cal))
    per_rel = [
        {
            "relation": names[r],
            "n_calibration": int(n_cal[r]),
            "n_evaluation": int(n_ev[r]),
            "t_raw": float(t_raw[r]),
            "weight": float(w[r]),
            "t_shrunk": float(t_eb[r]),
        }
        for r in torch.nonzero(seen).flatten().tolist()
    ]
    return RelationTemperatures(summary, per_rel, scaled_raw, scaled_shrunk)


def answer_sets(scaled: Tensor, target: Tensor, cal: Tensor, alpha: float) -> dict[str, object]:
    """Split-conformal LAC answer sets of the tail queries under the given (already scaled)
    logits: calibrated on ``cal``, measured on the rest (see the module docstring). Known
    other answers (``-inf``) are never in a set.

    Returns ``alpha``, the calibration count ``n`` and rank ``k``, the ``threshold`` (on
    ``1 - p``; ``inf`` when ``k > n``: every candidate), and on the evaluation half the
    ``coverage`` with its binomial ``coverage_se``, ``mean_size``, ``median_size``, the share of
    ``singletons`` and the count of ``empty`` sets.

    Example:
        >>> import torch
        >>> z = torch.tensor([[2.0, 0.0, -float("inf")]] * 8, dtype=torch.float64)
        >>> y = torch.tensor([0, 1] * 4)  # scores 1 - p(y): 0.119, 0.881, ...
        >>> cal = torch.tensor([True] * 4 + [False] * 4)
        >>> s = answer_sets(z, y, cal, 0.5)  # k = ceil(5 * 0.5) = 3: threshold 0.881
        >>> s["k"], round(s["threshold"], 3), s["coverage"], s["mean_size"]  # never the -inf
        (3, 0.881, 1.0, 2.0)
    """
    ev = ~cal
    probs = torch.softmax(scaled.to(torch.float64), dim=1)  # masked -inf -> probability 0
    scores = TF.conformal_scores(probs[cal], target[cal], "lac", input="probs")
    q, n, k = conformal_quantile(scores, alpha)
    threshold = float(q[0])
    sets = TF.conformal_sets(probs[ev], threshold, "lac", input="probs")
    sets &= torch.isfinite(scaled[ev])  # a known other answer is no candidate
    covered = sets.gather(1, target[ev][:, None])[:, 0].double()
    size = sets.sum(1).double()
    c = float(covered.mean())
    m = int(ev.sum())
    return {
        "method": "lac",
        "alpha": float(alpha),
        "n": int(n[0]),
        "k": int(k[0]),
        "threshold": threshold,
        "coverage": c,
        "coverage_se": math.sqrt(c * (1 - c) / m),
        "mean_size": float(size.mean()),
        "median_size": float(torch.quantile(size, 0.5)),
        "singletons": float((size == 1).double().mean()),
        "empty": int((size == 0).sum()),
    }


def risk_coverage(scaled: Tensor, pred: Tensor, target: Tensor, coverage: float) -> dict:
    """The risk-coverage row of the top-1 tail ``pred`` (the model's own argmax): confidence
    = its probability under ``scaled``, loss = wrong. ``aurc``, ``augrc`` and
    ``risk_at_coverage`` (at ``coverage``), tied confidences as one block; plus the plain
    ``risk`` (error rate at full coverage)."""
    conf = torch.softmax(scaled.to(torch.float64), dim=1).gather(1, pred[:, None])[:, 0]
    loss = (pred != target).double()
    return {
        "coverage": float(coverage),
        "aurc": float(TF.aurc(conf, loss)),
        "augrc": float(TF.augrc(conf, loss)),
        "risk_at_coverage": float(TF.risk_at_coverage(conf, loss, coverage)),
        "risk": float(loss.mean()),
    }
