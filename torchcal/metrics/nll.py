"""Streaming negative log-likelihood (the log score) with float64 sum states."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_bool,
    check_int,
    check_option,
    fixed_sum,
    validation_enabled,
)
from torchcal.functional._validation import check_group_ids, check_optional_int
from torchcal.functional.calibration.nll import logits_look_like_probs, nll_terms
from torchcal.functional.calibration.readings import INPUTS
from torchcal.functional.calibration.results import GroupedResult
from torchcal.metrics._base import PooledPlotMetric, StateRules

__all__ = ["NegativeLogLikelihood"]


class NegativeLogLikelihood(PooledPlotMetric):
    """Streaming mean negative log-likelihood (log score) with float64 sum states.

    Layouts as :func:`~torchcal.functional.calibration.nll.nll_items`: binary when ``target``
    has the shape of 1-d ``preds`` (or a ``(N, 1)`` head), class indices ``(N, *)`` for
    ``(N, C, *)`` scores, float class probabilities of the shape of ``preds`` (as
    ``F.cross_entropy``), independent sigmoids only with ``multilabel=True``. The link runs
    in float64, so streaming equals one call to float64 rounding.

    Args:
        input: ``"logits"`` or ``"probs"``.
        num_groups: per-group means (``update`` then needs one group id per item: ``groups``
            of ``target``'s shape, or ``(N, *)`` for class-probability targets ``(N, C, *)``).
        validate_args: run the value checks in ``update``.
        ignore_index: a target value whose items are not counted.
        multilabel: score a target of the shape of ``(N, C)`` logits as independent 0/1
            labels.

    Example:
        >>> import torch
        >>> from torchcal.metrics import NegativeLogLikelihood
        >>> m = NegativeLogLikelihood()
        >>> m.update(torch.zeros(3, 4), torch.tensor([0, 1, 3]))
        >>> round(float(m.compute()), 4)
        1.3863
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False
    plot_lower_bound = 0.0
    _CONFIG = ("input", "num_groups", "multilabel")
    _RULES = StateRules(counts=("count",), nonnegative=("nll_sum",))

    def __init__(
        self,
        *,
        input: str = "logits",
        num_groups: int | None = None,
        validate_args: bool = True,
        ignore_index: int | None = None,
        multilabel: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_option("input", input, INPUTS)
        check_optional_int("ignore_index", ignore_index)
        check_bool("multilabel", multilabel)
        self.input = input
        self.ignore_index = ignore_index
        self.multilabel = multilabel
        self.num_groups = (
            None if num_groups is None else check_int("num_groups", num_groups, minimum=1)
        )
        self.validate_args = check_bool("validate_args", validate_args)
        G = num_groups or 1
        self.add_state("nll_sum", torch.zeros(G, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros(G, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, groups: Tensor | None = None) -> None:
        """Accumulate a batch."""
        if self.num_groups is None and groups is not None:
            raise ValueError(
                "groups: pass num_groups= to the metric's constructor to get per-group results"
            )
        if self.num_groups is not None and groups is None:
            raise ValueError(
                f"groups: expected a group id per sample (the metric was "
                f"built with num_groups={self.num_groups}), got None"
            )
        with validation_enabled(self.validate_args):
            items, keep = nll_terms(
                preds,
                target,
                input=self.input,
                ignore_index=self.ignore_index,
                multilabel=self.multilabel,
            )
            if self.num_groups is not None:  # one id per item (a soft target's row: one item)
                G = check_group_ids(groups, items.shape, self.num_groups)
            if self.input == "logits" and not self.multilabel:
                self._warn_probs_once(logits_look_like_probs(preds), stacklevel=4)
        if self.num_groups is None:
            # a fixed-order float64 sum: the last bit does not depend on the thread count
            self.nll_sum.add_(fixed_sum(items.to(torch.float64)).to(self.nll_sum.device))
            self.count.add_(items.numel() if keep is None else keep.sum().to(self.count.device))
            return
        g = groups.reshape(-1).to(torch.int64)
        flat = items.reshape(-1).to(torch.float64)
        used = (
            torch.ones_like(g) if keep is None else keep.reshape(-1).to(torch.int64)
        )  # a scatter, not bincount (which would read its output size on the host)
        nll = torch.zeros(G, dtype=torch.float64, device=g.device).index_add_(0, g, flat)
        n = torch.zeros(G, dtype=torch.int64, device=g.device).index_add_(0, g, used)
        self.nll_sum.add_(nll.to(self.nll_sum.device))
        self.count.add_(n.to(self.count.device))

    def compute(self) -> Tensor | GroupedResult:
        """Mean NLL (float64), or a GroupedResult (``NaN`` for empty groups)."""
        total = int(self.count.sum())
        if total == 0:
            raise RuntimeError(
                "NegativeLogLikelihood.compute(): no samples seen; call "
                "update() with at least one sample first"
            )
        pooled = self.nll_sum.sum() / total
        if self.num_groups is None:
            return pooled
        per = self.nll_sum / self.count.to(torch.float64)
        return GroupedResult(pooled, per, self.count.cpu())
