"""ComplEx with reciprocal relations, N3 regularisation and a proper scoring rule.

ComplEx (Trouillon et al. 2016, "Complex Embeddings for Simple Link Prediction") scores a
triple as ``Re(<e_h, w_r, conj(e_t)>)`` with complex embeddings of dimension ``rank``.
Following Lacroix, Usunier & Obozinski 2018 ("Canonical Tensor Decomposition for Knowledge
Base Completion"), every relation ``r`` gets a reciprocal ``r^-1`` so head prediction is tail
prediction of ``(t, r^-1, ?)``; the query ``q = e_h * w_r`` (complex product) scores all
tails with one matmul ``[Re q, Im q] @ [Re E, Im E]^T``; and the batch factors are
regularised by the weighted nuclear 3-norm surrogate ``lambda * sum |x|^3 / B`` over the
moduli of the complex coordinates of head, relation and tail (the 1/3 of their eq. 6 is
absorbed into ``lambda``). Training uses Adagrad.

Two training modes, each with a torchcal proper scoring rule:

* ``one_to_n``: the multiclass log score (or Brier score) of the true tail over all entities.
  With grouped queries (``KGDataModule(group_queries=True)``) the entities are scored once per
  distinct query ``(h, r)`` and every training tail of it reads its row: the same per-triple
  mean of score and N3, with one matmul row per query instead of one per triple.
* ``negatives``: the binary log score of each positive against ``k`` uniform corruptions of
  its tail that are not known training triples; the mean over the ``1 + k`` items makes
  ``sigmoid(score)`` the model's probability at base rate ``1 / (1 + k)``.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor, nn

import torchcal.functional as TF
from recipes.complex_link_prediction.datasets import with_reciprocals
from recipes.complex_link_prediction.evaluation import (
    TripleFilter,
    filtered_ranks,
    mask_known,
)

__all__ = ["ComplEx", "ComplExModule", "EpochTimer", "Pow15", "sample_corruptions"]

MODES = ("one_to_n", "negatives")
LOSSES = ("log", "brier")


class ComplEx(nn.Module):
    """ComplEx embeddings of ``num_entities`` entities and ``2 * num_relations`` relations
    (each with its reciprocal), ``rank`` complex dimensions stored as ``[real, imag]`` halves
    (real ops on the halves measured faster on CPU than ``torch.complex`` views).

    Example:
        >>> import torch
        >>> m = ComplEx(num_entities=5, num_relations=2, rank=4)
        >>> h, r = torch.tensor([0, 3]), torch.tensor([1, 2])  # relation 2 = reciprocal of 0
        >>> m.score_all(h, r).shape, torch.allclose(m.score_all(h, r)[:, 4],
        ...                                         m.score(h, r, torch.tensor([4, 4])))
        (torch.Size([2, 5]), True)
    """

    def __init__(
        self, num_entities: int, num_relations: int, rank: int = 200, init_scale: float = 1e-3
    ) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"model.rank: expected a positive int, got {rank}")
        if not init_scale > 0:
            raise ValueError(f"model.init_scale: expected a value > 0, got {init_scale}")
        self.rank = rank
        self.num_relations = num_relations
        self.entity = nn.Embedding(num_entities, 2 * rank)
        self.relation = nn.Embedding(2 * num_relations, 2 * rank)
        with torch.no_grad():
            self.entity.weight.normal_().mul_(init_scale)
            self.relation.weight.normal_().mul_(init_scale)

    def query(self, h: Tensor, r: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """``[Re q, Im q]`` of the complex product ``e_h * w_r``, shape ``(B, 2 rank)``."""
        eh, wr = self.entity(h), self.relation(r)
        if dtype is not None:
            eh, wr = eh.to(dtype), wr.to(dtype)
        return _complex_product(eh, wr)

    def scores_and_n3(self, h: Tensor, r: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        """Training pass: scores of all tails ``(B, num_entities)`` and :meth:`n3`, from one
        lookup of each factor."""
        eh, wr, et = self.entity(h), self.relation(r), self.entity(t)
        return _complex_product(eh, wr) @ self.entity.weight.T, _n3(eh, wr, et)

    def grouped_scores_and_n3(
        self, queries: Tensor, query_index: Tensor, t: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Training pass over QUERIES: scores of all tails of each query ``(h, r)`` of
        ``queries`` ``(B, 2)``, one row per query (``(B, num_entities)``), and the N3 term of
        the triples ``(queries[query_index[n]], t[n])`` exactly as :meth:`n3` computes it on
        those triples (each query's factors weighted by its number of tails, each tail
        entity by its count), from one lookup of each distinct factor.

        Example:
            >>> import torch
            >>> m = ComplEx(num_entities=5, num_relations=2, rank=4)
            >>> q = torch.tensor([[0, 1], [3, 2]])  # queries (h, r)
            >>> qi, t = torch.tensor([0, 0, 1]), torch.tensor([4, 2, 4])  # 3 triples
            >>> s, n3 = m.grouped_scores_and_n3(q, qi, t)
            >>> s.shape, torch.allclose(n3, m.n3(q[qi, 0], q[qi, 1], t))
            (torch.Size([2, 5]), True)
        """
        h, r = queries.unbind(1)
        eh, wr = self.entity(h), self.relation(r)
        per_query = torch.bincount(query_index, minlength=len(h))
        per_entity = torch.bincount(t, minlength=self.entity.num_embeddings)
        tails = per_entity.nonzero().squeeze(1)
        factors = torch.cat([eh, wr, self.entity(tails)])
        weights = torch.cat([per_query, per_query, per_entity[tails]]).to(factors.dtype)
        n3 = (weights @ _cubed_moduli(factors).sum(-1)) / len(t)
        return _complex_product(eh, wr) @ self.entity.weight.T, n3

    def score_all(self, h: Tensor, r: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """Scores of every entity as the tail of ``(h, r, ?)``: ``(B, num_entities)``."""
        w = self.entity.weight if dtype is None else self.entity.weight.to(dtype)
        return self.query(h, r, dtype) @ w.T

    def score(self, h: Tensor, r: Tensor, t: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """Scores of the tails ``t`` (``(B,)`` or ``(B, K)``) of ``(h, r, ?)``."""
        q = self.query(h, r, dtype)
        et = self.entity(t)
        if dtype is not None:
            et = et.to(dtype)
        if t.dim() == 1:
            return (q * et).sum(-1)
        return torch.einsum("bd,bkd->bk", q, et)

    def n3(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        """``sum |x|^3 / B`` over the complex moduli of the head, relation and tail factors."""
        return _n3(self.entity(h), self.relation(r), self.entity(t))


def _complex_product(x: Tensor, y: Tensor) -> Tensor:
    """``[Re, Im]`` halves of the elementwise complex product of ``[Re, Im]`` tensors."""
    a, b = x.chunk(2, dim=-1)
    c, d = y.chunk(2, dim=-1)
    return torch.cat([a * c - b * d, a * d + b * c], dim=-1)


class Pow15(torch.autograd.Function):
    """``x ** 1.5`` for ``x >= 0`` as ``x * sqrt(x)`` with the backward ``1.5 * sqrt(x)``
    (0 at 0): measured faster than ``Tensor.pow(1.5)`` and its backward on CPU.

    Kept on purpose rather than plain autograd: ``x * x.sqrt()`` has a NaN gradient at 0, and
    ``x.pow(1.5)`` (finite at 0) rounds differently (about a quarter of float64 values differ
    by an ulp forward, a third backward), so it would change every trained number and the
    recipe's report.json.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        root = x.sqrt()
        ctx.save_for_backward(root)
        return x * root

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (root,) = ctx.saved_tensors
        return grad * 1.5 * root


def _cubed_moduli(x: Tensor) -> Tensor:
    """``|z|^3`` of the complex coordinates of ``[Re, Im]`` rows: ``(n, rank)``."""
    re, im = x.chunk(2, dim=-1)
    return Pow15.apply(re * re + im * im)


def _n3(eh: Tensor, wr: Tensor, et: Tensor) -> Tensor:
    return _cubed_moduli(torch.cat([eh, wr, et])).sum() / len(eh)


def sample_corruptions(
    h: Tensor, r: Tensor, k: int, num_entities: int, filt: TripleFilter, generator: torch.Generator
) -> Tensor:
    """``(B, k)`` tails drawn uniformly with replacement among those that make ``(h, r, t')``
    a triple not in ``filt`` (exact: one multinomial over each query's unknown tails).

    Example:
        >>> import torch
        >>> filt = TripleFilter(torch.tensor([[0, 0, 0], [0, 0, 1]]), 3, 1)
        >>> sample_corruptions(torch.tensor([0]), torch.tensor([0]), 4, 3, filt,
        ...                    torch.Generator().manual_seed(0)).tolist()
        [[2, 2, 2, 2]]
    """
    free = ~filt.mask(h, r)
    none = ~free.any(1)
    if bool(none.any()):
        i = int(torch.nonzero(none)[0, 0])
        raise ValueError(
            f"k: query ({int(h[i])}, {int(r[i])}, ?) has no corruption: "
            "every tail is a known triple"
        )
    return torch.multinomial(free.float(), k, replacement=True, generator=generator)


class ComplExModule(L.LightningModule):
    """Trains :class:`ComplEx` with a torchcal proper scoring rule plus N3.

    ``validation_step`` returns ``{"logits": (B, E) tail scores with the other known answers
    masked by -inf, "target": (B,) true tails}`` (what ``CalibrationMonitor`` reads) and logs
    the filtered realistic MRR as ``val_mrr``. The command line's ``--model.*`` options are
    this signature's (jsonargparse reads it).

    Args:
        num_entities: entities of the graph.
        num_relations: relations of the graph (their reciprocals are added).
        train_triples: ``(n, 3)`` training triples (the corruption filter of mode negatives).
        known_triples: ``(n, 3)`` observed triples (the validation filter).
        rank: complex embedding dimension.
        init_scale: standard deviation of the initial embeddings.
        lr: Adagrad learning rate.
        regularization: N3 weight.
        mode: 'one_to_n' or 'negatives' (the recipe's top-level ``--mode``).
        loss: 'log' (multiclass log score) or 'brier' in mode one_to_n.
        num_negatives: corruptions per positive in mode negatives.
        seed: seed of the corruption sampler.
    """

    def __init__(
        self,
        num_entities: int,
        num_relations: int,
        train_triples: Tensor,
        known_triples: Tensor,
        rank: int = 200,
        init_scale: float = 1e-3,
        lr: float = 0.1,
        regularization: float = 0.01,
        mode: str = "one_to_n",
        loss: Literal["log", "brier"] = "log",
        num_negatives: int = 10,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        if loss not in LOSSES:
            raise ValueError(f"model.loss: expected one of {LOSSES}, got {loss!r}")
        if mode == "negatives" and loss != "log":
            raise ValueError(
                f"model.loss: mode 'negatives' trains with the binary log score, got loss={loss!r}"
            )
        if num_negatives < 1:
            raise ValueError(f"model.num_negatives: expected an int >= 1, got {num_negatives}")
        if not lr > 0 or regularization < 0:
            raise ValueError(
                f"model.lr/regularization: expected lr > 0 and regularization >= 0, "
                f"got {lr}, {regularization}"
            )
        self.model = ComplEx(num_entities, num_relations, rank, init_scale)
        self.num_entities = num_entities
        self.num_relations = num_relations
        self.lr = lr
        self.regularization = regularization
        self.mode = mode
        self.loss_name = loss
        self.num_negatives = num_negatives
        self.seed = seed
        self.train_filter = TripleFilter(
            with_reciprocals(train_triples, num_relations), num_entities, 2 * num_relations
        )
        self.known_filter = TripleFilter(
            with_reciprocals(known_triples, num_relations), num_entities, 2 * num_relations
        )
        self._generator = torch.Generator().manual_seed(seed)

    def forward(self, h: Tensor, r: Tensor) -> Tensor:
        return self.model.score_all(h, r)

    def training_step(
        self, batch: Tensor | tuple[Tensor, Tensor, Tensor], batch_idx: int
    ) -> Tensor:
        if isinstance(batch, (tuple, list)):
            # grouped queries (KGDataModule(group_queries=True)): one score row per query
            # (h, r), the per-triple score of each of its training tails read from that row
            if self.mode != "one_to_n":
                raise ValueError(
                    "data.group_queries: only mode 'one_to_n' trains on grouped "
                    f"queries, got mode {self.mode!r}"
                )
            queries, query_index, t = batch
            scores, n3 = self.model.grouped_scores_and_n3(queries, query_index, t)
            fit = self._one_to_n_score(scores.index_select(0, query_index), t)
            return self._record(fit, len(t)) + self.regularization * n3
        h, r, t = batch.unbind(1)
        if self.mode == "one_to_n":
            scores, n3 = self.model.scores_and_n3(h, r, t)
            fit = self._one_to_n_score(scores, t)
        else:
            # a query whose every tail is a training triple has no corruption: leave it out
            possible = self.train_filter.mask(h, r).sum(1) < self.num_entities
            if not bool(possible.all()):
                h, r, t = h[possible], r[possible], t[possible]
            neg = sample_corruptions(
                h, r, self.num_negatives, self.num_entities, self.train_filter, self._generator
            )
            # all tails in one matmul, then gather: cheaper than gathering (1 + k) embeddings
            # per query while the entity table is small
            cand = torch.cat([t[:, None], neg], dim=1)
            scores, n3 = self.model.scores_and_n3(h, r, t)
            logits = scores.gather(1, cand)
            target = torch.zeros_like(logits)
            target[:, 0] = 1.0
            # binary log score of every (query, candidate) item: flat 1-D logits and 0/1
            # labels (a float (B, 1 + k) target would read as class probabilities)
            fit = TF.log_score(logits.reshape(-1), target.reshape(-1))
        return self._record(fit, len(h)) + self.regularization * n3

    def _one_to_n_score(self, scores: Tensor, t: Tensor) -> Tensor:
        if self.loss_name == "log":
            return TF.log_score(scores, t)
        return TF.brier_score(scores, t)

    def _record(self, fit: Tensor, n: int) -> Tensor:
        # the epoch's mean score, logged once per epoch (per-step logging costs more than
        # the step itself on these small graphs)
        self._score_sum += fit.detach() * n
        self._score_count += n
        return fit

    def on_train_epoch_start(self) -> None:
        self._score_sum = torch.zeros((), device=self.device)
        self._score_count = 0

    def on_train_epoch_end(self) -> None:
        self.log("train_score", self._score_sum / max(self._score_count, 1), prog_bar=True)

    def validation_step(self, batch: Tensor, batch_idx: int) -> dict[str, Tensor]:
        h, r, t = batch.unbind(1)
        logits = mask_known(self.model.score_all(h, r), t, self.known_filter.mask(h, r))
        ranks = filtered_ranks(logits, t)
        self.log(
            "val_mrr",
            (1.0 / ranks.realistic).mean(),
            prog_bar=True,
            on_epoch=True,
            batch_size=len(h),
        )
        return {"logits": logits, "target": t}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adagrad(self.model.parameters(), lr=self.lr)


class EpochTimer(L.Callback):
    """Wall time of each training epoch (validation excluded)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._t0 = 0.0

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._t0 = time.perf_counter()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.seconds.append(time.perf_counter() - self._t0)

    def mean_seconds(self) -> float:
        return sum(self.seconds) / max(len(self.seconds), 1)
