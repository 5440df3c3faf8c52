"""The recipe's Lightning DataModule: training triples with reciprocals (or grouped by query)
and validation queries, as index-tensor batches; the datasets themselves are :mod:`.datasets`."""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

from recipes.complex_link_prediction.datasets import KGData, with_reciprocals

__all__ = ["KGDataModule"]


class _Rows(Dataset):
    def __init__(self, x: Tensor) -> None:
        self.x = x

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: list[int]) -> Tensor:
        return self.x[index]


class _Queries(Dataset):
    """The distinct queries ``(h, r)`` of ``triples``; item ``index`` (a list of queries) is
    ``(queries (B, 2), query_index (N,), tails (N,))``: every training triple of those
    queries as ``(queries[query_index[n]], tails[n])``, gathered from a CSR of the tails."""

    def __init__(self, triples: Tensor) -> None:
        hr, inverse, counts = torch.unique(
            triples[:, :2], dim=0, return_inverse=True, return_counts=True
        )
        self.queries = hr
        self.counts = counts
        self.starts = counts.cumsum(0) - counts
        self.tails = triples[torch.argsort(inverse, stable=True), 2]

    def __len__(self) -> int:
        return len(self.queries)

    def __getitem__(self, index: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        idx = torch.as_tensor(index, dtype=torch.long)
        counts = self.counts[idx]
        query_index = torch.repeat_interleave(torch.arange(len(idx)), counts)
        first = (counts.cumsum(0) - counts)[query_index]
        pos = self.starts[idx][query_index] + torch.arange(len(query_index)) - first
        return self.queries[idx], query_index, self.tails[pos]


def _batch_loader(x: Tensor | Dataset, batch_size: int, shuffle: bool, seed: int) -> DataLoader:
    # One fancy-index per batch (BatchSampler + batch_size=None): no per-item collation.
    ds = x if isinstance(x, Dataset) else _Rows(x)
    if shuffle:
        sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(seed))
    else:
        sampler = SequentialSampler(ds)
    return DataLoader(
        ds, sampler=BatchSampler(sampler, batch_size, drop_last=False), batch_size=None
    )


class KGDataModule(L.LightningDataModule):
    """Training triples with reciprocals (shuffled, seeded) and validation queries in both
    directions, as ``(B, 3)`` long batches of ``(head, relation, tail)``.

    ``group_queries=True`` batches the training data by distinct query ``(h, r)`` instead:
    ``batch_size`` queries per batch, each with all its training tails, as a tuple
    ``(queries (B, 2), query_index (N,), tails (N,))`` (see
    :meth:`ComplEx.grouped_scores_and_n3`); every triple is still seen once per epoch.

    Args:
        data: the dataset (:func:`~recipes.complex_link_prediction.datasets.load_dataset`).
        batch_size: training batch size (triples incl. reciprocals; distinct queries
            (h, r) with group_queries).
        eval_batch_size: queries per evaluation batch.
        seed: seed of the shuffling.
        group_queries: mode one_to_n: train on batches of distinct queries (h, r), each
            with all its training tails, scoring all entities once per query instead of
            once per triple; the loss is the same per-triple mean (log score + N3).
    """

    def __init__(
        self,
        data: KGData,
        batch_size: int = 1000,
        eval_batch_size: int = 2048,
        seed: int = 0,
        group_queries: bool = False,
    ) -> None:
        super().__init__()
        if batch_size < 1 or eval_batch_size < 1:
            raise ValueError(f"data.batch_size: expected a positive int, got {batch_size}")
        self.data = data
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.seed = seed
        self.group_queries = group_queries
        self.train_triples = with_reciprocals(data.train, data.num_relations)
        self.valid_queries = with_reciprocals(data.valid, data.num_relations)
        self._train: Tensor | Dataset = (
            _Queries(self.train_triples) if group_queries else self.train_triples
        )

    def train_dataloader(self) -> DataLoader:
        return _batch_loader(self._train, self.batch_size, True, self.seed)

    def val_dataloader(self) -> DataLoader:
        return _batch_loader(self.valid_queries, self.eval_batch_size, False, self.seed)
