"""Filtered link-prediction evaluation, vectorised over all entities.

For a query ``(h, r, ?)`` (head prediction is the reciprocal query ``(t, r^-1, ?)``), every
other known true tail is masked with ``-inf`` and the target's rank is

* optimistic  ``1 + #(score > s_target)``,
* pessimistic ``#(score >= s_target)`` (the target counts itself),
* realistic   the mean of the two (Berrendorf et al. 2020, "Interpretable and fair
  comparison of link prediction or entity alignment methods").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["TripleFilter", "filtered_ranks", "ranking_metrics", "evaluate", "Ranks"]


class TripleFilter:
    """Known triples indexed for vectorised look-ups.

    ``triples`` are ``(n, 3)`` ``(head, relation, tail)`` rows over ``num_relations``
    relation ids (pass reciprocal-augmented triples with ``2 R`` ids to filter both
    directions).

    Example:
        >>> import torch
        >>> f = TripleFilter(torch.tensor([[0, 0, 1], [0, 0, 2], [1, 0, 0]]), 3, 1)
        >>> f.mask(torch.tensor([0, 1]), torch.tensor([0, 0])).int().tolist()
        [[0, 1, 1], [1, 0, 0]]
        >>> f.contains(torch.tensor([0, 0]), torch.tensor([0, 0]), torch.tensor([2, 0])).tolist()
        [True, False]
    """

    def __init__(self, triples: Tensor, num_entities: int, num_relations: int) -> None:
        self.num_entities = num_entities
        self.num_relations = num_relations
        triples = triples.long()
        hr = triples[:, 0] * num_relations + triples[:, 1]
        key = hr * num_entities + triples[:, 2]
        key = torch.unique(key)  # sorted, duplicates removed
        self.keys = key
        self.hr = key // num_entities
        self.tails = key % num_entities

    def __len__(self) -> int:
        return len(self.keys)

    def contains(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        """Boolean tensor (broadcast shape of the inputs): is ``(h, r, t)`` known?"""
        device = h.device
        key = (h.cpu() * self.num_relations + r.cpu()) * self.num_entities + t.cpu()
        if len(self.keys) == 0:
            return torch.zeros_like(key, dtype=torch.bool).to(device)
        pos = torch.searchsorted(self.keys, key.reshape(-1)).clamp_max(len(self.keys) - 1)
        return (self.keys[pos] == key.reshape(-1)).reshape(key.shape).to(device)

    def mask(self, h: Tensor, r: Tensor) -> Tensor:
        """``(B, num_entities)`` boolean: the known tails of each query ``(h, r, ?)``."""
        device = h.device
        q = h.cpu() * self.num_relations + r.cpu()
        start = torch.searchsorted(self.hr, q)
        stop = torch.searchsorted(self.hr, q, right=True)
        counts = stop - start
        rows = torch.repeat_interleave(torch.arange(len(q)), counts)
        offsets = torch.arange(int(counts.sum())) - torch.repeat_interleave(
            torch.cumsum(counts, 0) - counts, counts
        )
        cols = self.tails[torch.repeat_interleave(start, counts) + offsets]
        out = torch.zeros(len(q), self.num_entities, dtype=torch.bool)
        out[rows, cols] = True
        return out.to(device)


def mask_known(scores: Tensor, target: Tensor, known: Tensor) -> Tensor:
    """Set every known answer except the target to ``-inf`` (out of place)."""
    other = known.clone()
    other[torch.arange(len(target)), target] = False
    return scores.masked_fill(other, float("-inf"))


@dataclass
class Ranks:
    """Filtered ranks of the targets: optimistic and pessimistic (int64) and realistic."""

    optimistic: Tensor
    pessimistic: Tensor

    @property
    def realistic(self) -> Tensor:
        return (self.optimistic + self.pessimistic).double() / 2

    @staticmethod
    def cat(parts: list[Ranks]) -> Ranks:
        return Ranks(
            torch.cat([p.optimistic for p in parts]), torch.cat([p.pessimistic for p in parts])
        )


def filtered_ranks(masked_scores: Tensor, target: Tensor) -> Ranks:
    """Ranks of ``target`` in rows of scores whose other known answers are already ``-inf``.

    Example:
        >>> import torch
        >>> r = filtered_ranks(torch.tensor([[3.0, 1.0, 3.0, float("-inf")]]), torch.tensor([0]))
        >>> r.optimistic.item(), r.pessimistic.item(), r.realistic.item()
        (1, 2, 1.5)
    """
    s_t = masked_scores.gather(1, target[:, None])
    optimistic = 1 + (masked_scores > s_t).sum(1)
    pessimistic = (masked_scores >= s_t).sum(1)
    return Ranks(optimistic, pessimistic)


def ranking_metrics(ranks: Tensor, prefix: str = "") -> dict[str, float]:
    """MRR and Hits@1/3/10 of a rank tensor.

    Example:
        >>> import torch
        >>> ranking_metrics(torch.tensor([1.0, 2.0, 4.0]))["mrr"] == (1 + 1 / 2 + 1 / 4) / 3
        True
    """
    r = ranks.double()
    out = {f"{prefix}mrr": float((1.0 / r).mean())}
    for k in (1, 3, 10):
        out[f"{prefix}hits@{k}"] = float((r <= k).double().mean())
    return out


@torch.no_grad()
def evaluate(score_fn, queries: Tensor, filt: TripleFilter, batch_size: int = 1024) -> Ranks:
    """Filtered ranks of ``queries`` (``(n, 3)`` rows, tail prediction) under ``score_fn(h, r)``
    returning ``(B, num_entities)`` scores; known answers from ``filt``."""
    parts = []
    for q in queries.split(batch_size):
        h, r, t = q.unbind(1)
        scores = mask_known(score_fn(h, r), t, filt.mask(h, r))
        parts.append(filtered_ranks(scores, t))
    return Ranks.cat(parts)
