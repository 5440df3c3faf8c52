"""Streaming coverage and size of prediction sets (a thin shell over
:mod:`torchcal.functional.sets`): summed int64 histograms, merged by addition and summed across
DDP ranks, so the result equals one :func:`~torchcal.functional.set_coverage` call on all rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_bool, check_int, validation_enabled
from torchcal.functional._validation import check_optional_int
from torchcal.functional.calibration.intervals import z_of_level
from torchcal.functional.sets import (
    SetCoverageCounts,
    SetCoverageResult,
    set_coverage_counts,
    set_coverage_from_counts,
)
from torchcal.metrics._base import PooledPlotMetric, StateRules

__all__ = ["SetCoverage"]

_STATES = ("class_sizes", "class_hits", "group_sizes", "group_hits")


class SetCoverage(PooledPlotMetric):
    """Coverage of prediction sets with a Wilson interval, mean and median set size and the
    share of empty sets, pooled, per true class and per group, streamed.

    ``update(sets, target, groups=None)``: an ``(N, C)`` boolean set mask (e.g.
    :meth:`~torchcal.scaling.ConformalClassifier.predict`), class ids ``(N,)`` and, with
    ``num_groups``, group ids ``(N,)``. ``compute()`` returns a
    :class:`~torchcal.functional.SetCoverageResult`. The states are the per-class and
    per-group histograms of set sizes over ``0 .. C`` and covered counts (int64, summed:
    merging, batching and DDP give the same result as one call; the median comes from the
    histogram).

    Args:
        num_classes: ``C``, the columns of every set mask.
        num_groups: per-group summaries (``update`` then needs ``groups``).
        level: the Wilson interval's level.
        validate_args: run the value checks in ``update``.

    Example:
        >>> import torch
        >>> from torchcal.metrics import SetCoverage
        >>> m = SetCoverage(num_classes=3)
        >>> m.update(torch.tensor([[True, True, False], [False, True, False]]), torch.tensor([0, 2]))
        >>> m.update(torch.tensor([[True, False, True]]), torch.tensor([2]))
        >>> r = m.compute()
        >>> float(r.pooled.coverage), float(r.pooled.median_size), r.per_class.rows.tolist()
        (0.6666666666666666, 2.0, [1, 0, 2])
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0
    _CONFIG = ("num_classes", "num_groups", "level")
    _RULES = StateRules(counts=_STATES)

    def __init__(
        self,
        num_classes: int,
        *,
        num_groups: int | None = None,
        level: float = 0.95,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.num_classes = check_int("num_classes", num_classes, minimum=1)
        check_optional_int("num_groups", num_groups)
        self.num_groups = (
            None if num_groups is None else check_int("num_groups", num_groups, minimum=1)
        )
        z_of_level(level)
        self.level = float(level)
        self.validate_args = check_bool("validate_args", validate_args)
        C, G = self.num_classes, self.num_groups or 0
        zeros = {
            "class_sizes": (C, C + 1),
            "class_hits": (C,),
            "group_sizes": (G, C + 1),
            "group_hits": (G,),
        }
        for name, shape in zeros.items():
            self.add_state(name, torch.zeros(shape, dtype=torch.int64), dist_reduce_fx="sum")

    def _check_states(self, states: Mapping[str, Any], where: str) -> None:
        """The counts rules, and a covered count at most the rows whose set is non-empty."""
        super()._check_states(states, where)
        for sizes, hits in (("class_sizes", "class_hits"), ("group_sizes", "group_hits")):
            h, s = states.get(hits), states.get(sizes)
            if not (isinstance(h, Tensor) and isinstance(s, Tensor)) or not h.numel():
                continue
            if s.dim() != 2 or h.shape != s.shape[:1]:
                raise ValueError(
                    f"{where}: state {hits!r} must have one count per row of {sizes!r}"
                )
            bad = h > s[:, 1:].sum(-1)
            if bool(bad.any()):
                i = int(torch.nonzero(bad)[0, 0])
                raise ValueError(
                    f"{where}: state {hits!r} must be at most the rows with a non-empty set, "
                    f"got {int(h[i])} against {int(s[i, 1:].sum())} at {i}"
                )

    def update(self, sets: Tensor, target: Tensor, groups: Tensor | None = None) -> None:
        """Accumulate a batch of set masks ``(N, C)`` and class ids ``(N,)``."""
        if sets.dim() != 2 or sets.shape[1] != self.num_classes:
            raise ValueError(
                f"sets: expected (N, {self.num_classes}) masks (num_classes={self.num_classes}), "
                f"got shape {tuple(sets.shape)}"
            )
        if self.num_groups is None and groups is not None:
            raise ValueError("groups: pass num_groups= to the metric's constructor")
        if self.num_groups is not None and groups is None:
            raise ValueError(
                f"groups: expected a group id per row (num_groups={self.num_groups}), got None"
            )
        with validation_enabled(self.validate_args):
            c = set_coverage_counts(sets, target, groups, self.num_groups)
        for name, value in zip(_STATES, c):
            state = getattr(self, name)
            state.add_(value.to(state.device))

    def counts(self) -> SetCoverageCounts:
        """The summed (synced) counts."""
        states: list[Tensor] = [getattr(self, name) for name in _STATES]
        return SetCoverageCounts(*states)

    def compute(self) -> SetCoverageResult:
        """The :class:`~torchcal.functional.SetCoverageResult` of every row seen."""
        if int(self.counts().class_sizes.sum()) == 0:
            raise RuntimeError("SetCoverage.compute(): no rows seen; call update() first")
        return set_coverage_from_counts(self.counts(), self.level)

    def plot(self, val: Any = None, ax: Any = None) -> Any:
        """Plot the pooled coverage (torchmetrics' plot); returns ``(figure, axis)``."""
        val = self.compute() if val is None else val
        return self._plot(val.pooled.coverage if isinstance(val, SetCoverageResult) else val, ax)
