"""One ensemble shared by many targets: which targets share it, sorted once, ranks by search.

:func:`~torchcal.functional.pit_ensemble` and :func:`~torchcal.functional.crps_ensemble` take
an ensemble whose batch shape broadcasts to the target's (``docs/design.md`` section 3). Along a
target dimension where the ensemble has size 1 (e.g. members ``(M,)`` or ``(1, M)`` against a
target ``(N,)``), every target shares the ensemble: sort its members once and find each
target's rank by binary search, O((G M + N) log M) for ``G`` distinct ensembles and ``N``
targets instead of the O(N M) of the expanded ``(N, M)`` ensemble.

A :class:`SharedLayout` moves the target's *kept* dimensions (where the ensemble has the
target's size) first and its *shared* ones last, flattened: targets ``(*kept, K)`` against
sorted members ``(*kept, M)``, the layout of ``torch.searchsorted``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from torchcal.functional._checks import check_floating, check_int, check_nonempty, check_tensor


@dataclass(frozen=True)
class SharedLayout:
    """How the targets of shape ``target_shape`` share ensembles of batch shape ``kept``."""

    perm: tuple[int, ...]  # the target's dims: kept first, then shared
    kept: tuple[int, ...]  # sizes of the kept dims (the distinct ensembles)
    shared: tuple[int, ...]  # sizes of the shared dims (product K > 1)

    def member_rows(self, members: Tensor) -> Tensor:
        """Members ``(*batch, M)`` (batch broadcastable to the target) as ``(*kept, M)``."""
        return members.reshape(*self.kept, members.shape[-1])

    def target_rows(self, target: Tensor) -> Tensor:
        """The target as ``(*kept, K)``, contiguous."""
        return target.permute(self.perm).reshape(*self.kept, -1).contiguous()

    def to_target(self, rows: Tensor) -> Tensor:
        """Inverse of :meth:`target_rows`: ``(*kept, K)`` back to the target's shape."""
        inverse = [0] * len(self.perm)
        for i, p in enumerate(self.perm):
            inverse[p] = i
        return rows.reshape(*self.kept, *self.shared).permute(inverse)


def shared_layout(batch_shape: torch.Size, target_shape: torch.Size) -> SharedLayout | None:
    """The layout when ensembles of ``batch_shape`` (already checked to broadcast to
    ``target_shape``) are each shared by more than one target, else ``None``.

    Example:
        >>> import torch
        >>> lay = shared_layout(torch.Size([3, 1]), torch.Size([3, 4]))
        >>> lay.kept, lay.shared
        ((3,), (4,))
        >>> shared_layout(torch.Size([3]), torch.Size([3])) is None
        True
    """
    target = tuple(target_shape)
    batch = (1,) * (len(target) - len(batch_shape)) + tuple(batch_shape)
    shared = [i for i, (b, t) in enumerate(zip(batch, target)) if b == 1 and t != 1]
    if math.prod([target[i] for i in shared]) <= 1:  # a list: traceable by torch.compile
        return None
    kept = [i for i in range(len(target)) if i not in shared]
    return SharedLayout(
        perm=tuple(kept + shared),
        kept=tuple(target[i] for i in kept),
        shared=tuple(target[i] for i in shared),
    )


def counts_below_and_at(
    members: Tensor, target: Tensor, layout: SharedLayout
) -> tuple[Tensor, Tensor]:
    """``#{x_m < y}`` and ``#{x_m == y}`` (float64, the target's shape) for members
    ``(*batch, M)`` shared as ``layout`` says, by binary search in the sorted members.

    Example:
        >>> import torch
        >>> x = torch.tensor([2.0, 0.0, 1.0, 1.0])
        >>> y = torch.tensor([-1.0, 1.0, 5.0])
        >>> below, at = counts_below_and_at(x, y, shared_layout(torch.Size([]), y.shape))
        >>> below.tolist(), at.tolist()
        ([0.0, 1.0, 4.0], [0.0, 2.0, 0.0])
    """
    rows = torch.sort(layout.member_rows(members), dim=-1).values.contiguous()
    y = layout.target_rows(target)
    below = torch.searchsorted(rows, y, right=False)
    at_or_below = torch.searchsorted(rows, y, right=True)
    below = layout.to_target(below.to(torch.float64))
    return below, layout.to_target(at_or_below.to(torch.float64)) - below


def members_last(samples: Tensor, ensemble_dim: int) -> Tensor:
    """``samples`` (checked: a non-empty floating tensor with a valid ``ensemble_dim``) with the
    members' dim moved last; the one check of every ensemble entry point."""
    check_tensor("samples", samples)
    check_int("ensemble_dim", ensemble_dim)
    if samples.dim() == 0 or not -samples.dim() <= ensemble_dim < samples.dim():
        raise ValueError(
            f"ensemble_dim: expected a dimension of samples (shape "
            f"{tuple(samples.shape)}), got {ensemble_dim}"
        )
    check_floating("samples", samples)
    check_nonempty("samples", samples)
    return samples.movedim(ensemble_dim, -1)
