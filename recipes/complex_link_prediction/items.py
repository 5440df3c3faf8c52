"""The audits' data: the seeded, relation-stratified calibration/evaluation halves of the
test triples, the triple audit's items (each held-out positive with ``k`` distinct filtered
corruptions), and the checks that fail before training when the audits cannot run."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from recipes.complex_link_prediction.datasets import KGData, with_reciprocals
from recipes.complex_link_prediction.evaluation import TripleFilter

__all__ = ["TripleItems", "check_audit_data", "stratified_halves", "triple_items"]


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
        >>> from recipes.complex_link_prediction.datasets import load_dataset
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
        raise ValueError(
            f"audit.k: duplicate sampled candidates for query ({int(h[i])}, "
            f"{int(r[i])}, ?): {tails[i].tolist()}"
        )
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
        raise ValueError(
            f"data.test: expected at least 2 test triples (the audits split them "
            f"into a calibration half and an evaluation half), got {n}"
        )
    cal = stratified_halves(data.test[:, 1], seed)
    if not bool((~cal).any()):
        raise ValueError(
            f"data.test: the evaluation half is empty: each of the {n} test "
            "triples has a relation of its own, and the audits split test "
            "triples by relation; add test triples"
        )
    items = triple_items(data, k, seed)
    n_queries = 2 * n
    for half, mask in (("calibration", items.cal), ("evaluation", ~items.cal)):
        if not bool(mask.any()):
            raise ValueError(
                f"audit.k: no test query of the {half} half has k = {k} distinct "
                f"filtered corruptions ({len(items.head)} of {n_queries} queries "
                f"have); lower --audit.k"
            )
    return {"triple_queries_left_out": n_queries - len(items.head)}
