"""Streaming multicalibration error: a torchmetrics shell over
:func:`torchcal.functional.multicalibration_error` (docs/design.md section 6g).

ECCE is a statistic of the rows in score order, so the metric keeps the rows (O(N) states,
concatenated across ranks under DDP); the result does not depend on the batch boundaries, the
row order or the order in which ranks are gathered (tied scores enter as one block).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_tensor
from torchcal.functional.multicalibration import (
    MulticalibrationResult,
    check_segment_options,
    columns_from_features,
    multicalibration_error,
    segment_masks,
)
from torchcal.metrics._base import PooledPlotMetric

__all__ = ["MulticalibrationError"]


class MulticalibrationError(PooledPlotMetric):
    """The worst segment's ECCE in sigma units over every cross of up to ``depth`` segment
    columns (Guy et al. 2025; ``mcgrad``'s MCE), streamed.

    Args:
        columns: the names of the segment columns, in the order of ``update``'s ``features``
            columns.
        numeric: the names among ``columns`` that are numeric (cut into ``bins`` quantile
            buckets at compute time); the others are categorical (integer codes).
        depth: the largest number of columns crossed (0: the whole data set only).
        min_rows: segments with fewer rows are left out.
        bins: quantile buckets of a numeric column.

    ``compute()`` returns a :class:`~torchcal.functional.MulticalibrationResult` (segment 0 is
    the whole data set: ``ecce[0]``/``ecce_sigma[0]`` are the global ECCE and its sigma);
    :meth:`segment_labels` names the segments in the same order.

    Example:
        >>> import torch
        >>> from torchcal.metrics import MulticalibrationError
        >>> g = torch.Generator().manual_seed(0)
        >>> m = MulticalibrationError(columns=["lang"], depth=1)
        >>> for _ in range(4):
        ...     p = torch.rand(1000, generator=g, dtype=torch.float64)
        ...     lang = torch.randint(0, 2, (1000,), generator=g)
        ...     y = torch.bernoulli((p + torch.where(lang == 1, 0.1, -0.1)).clamp(0, 1),
        ...                         generator=g)
        ...     m.update(p, y, lang[:, None])
        >>> res = m.compute()
        >>> bool(res.ecce_sigma[0] < 3), m.segment_labels()[res.worst][0][0], bool(res.mce_sigma > 5)
        (True, 'lang', True)
    """

    higher_is_better = False
    full_state_update = False
    _CONFIG = ("columns", "numeric", "depth", "min_rows", "bins")
    sample_probs: list[Tensor]
    sample_target: list[Tensor]
    sample_weight: list[Tensor]
    sample_features: list[Tensor]

    def __init__(
        self,
        columns: Sequence[str],
        *,
        numeric: Sequence[str] = (),
        depth: int = 2,
        min_rows: int = 200,
        bins: int = 4,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.columns, self.numeric, self.depth, self.min_rows, self.bins = check_segment_options(
            columns, numeric, depth, min_rows, bins
        )
        self.add_state("sample_probs", [], dist_reduce_fx="cat")
        self.add_state("sample_target", [], dist_reduce_fx="cat")
        self.add_state("sample_weight", [], dist_reduce_fx="cat")
        self.add_state("sample_features", [], dist_reduce_fx="cat")

    def _cat_dtypes(self) -> dict[str, torch.dtype]:
        return {
            "sample_probs": torch.float64,
            "sample_target": torch.float64,
            "sample_weight": torch.float64,
            "sample_features": torch.float64,
        }

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        # a rank that never updated sends (0, F) features, not (0,)
        if isinstance(self.sample_features, list) and not self.sample_features:
            f = torch.zeros(0, len(self.columns), dtype=torch.float64, device=self.device)
            self.sample_features = [f]
        super()._sync_dist(dist_sync_fn, process_group)

    def update(
        self, probs: Tensor, target: Tensor, features: Tensor, weight: Tensor | None = None
    ) -> None:
        """Accumulate binary probabilities ``(N,)``, labels in {0, 1}, the segment columns
        ``features`` ``(N, len(columns))`` (integer codes; numeric columns as values) and
        optional row weights ``(N,)``. Checks run at compute (they need the whole data set)
        except the shapes, checked here."""
        for name, x in (("probs", probs), ("target", target), ("features", features)):
            check_tensor(name, x)
        if probs.dim() != 1:
            raise ValueError(f"probs: expected shape (N,), got {tuple(probs.shape)}")
        n = probs.shape[0]
        if target.shape != probs.shape:
            raise ValueError(
                f"target: expected the shape of probs (N,), got {tuple(target.shape)} and "
                f"probs {tuple(probs.shape)}"
            )
        if features.shape != (n, len(self.columns)):
            raise ValueError(
                f"features: expected shape ({n}, {len(self.columns)}) (one column per name "
                f"in columns), got {tuple(features.shape)}"
            )
        if weight is not None and check_tensor("weight", weight).shape != probs.shape:
            raise ValueError(f"weight: expected shape ({n},), got {tuple(weight.shape)}")
        self.sample_probs.append(probs.detach().to(torch.float64))
        self.sample_target.append(target.detach().to(torch.float64))
        w = torch.ones_like(probs, dtype=torch.float64) if weight is None else weight
        self.sample_weight.append(w.detach().to(torch.float64))
        self.sample_features.append(features.detach().to(torch.float64))

    def _rows(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        def cat(x: Any) -> Tensor:
            return x if isinstance(x, Tensor) else torch.cat(x)

        if isinstance(self.sample_probs, list) and not self.sample_probs:
            raise ValueError(f"{type(self).__name__}: compute() called before update() (no rows)")
        rows = (
            cat(self.sample_probs),
            cat(self.sample_target),
            cat(self.sample_weight),
            cat(self.sample_features),
        )
        if rows[0].numel() == 0:
            raise ValueError(f"{type(self).__name__}: compute() found no rows on any rank")
        return rows

    def _segments(self, features: Tensor) -> tuple[Tensor, list[tuple[tuple[str, int], ...]]]:
        cols = columns_from_features(features, self.columns, self.numeric)
        return segment_masks(cols, depth=self.depth, min_rows=self.min_rows, bins=self.bins)

    def compute(self) -> MulticalibrationResult:
        """The :class:`~torchcal.functional.MulticalibrationResult` of every row seen."""
        p, y, w, f = self._rows()
        masks, _ = self._segments(f)
        return multicalibration_error(p, y, masks, weight=w)

    def segment_labels(self) -> list[tuple[tuple[str, int], ...]]:
        """The segments of :meth:`compute`'s result, in order: ``()`` for the whole data set,
        else ``(column, value)`` pairs (the bucket index for a numeric column)."""
        return self._segments(self._rows()[3])[1]
