"""The held-out folds every cross-validated post-hoc map shares (docs/design.md section 4).

One rule, one place: ``kfold_indices(n, k, seed)`` shuffles ``0..n-1`` with a seeded
``torch.Generator`` (CPU, so the folds do not depend on the device or thread count) and deals
the permutation into ``k`` folds whose sizes differ by at most one. The folds are *not*
stratified: a stratified split gives every held-out fold the fit folds' class frequencies and so
flatters a per-class bias (it rated vector scaling better than one temperature where it is
worse on test). Every candidate of :func:`torchcal.scaling.calibrate` is scored on the same
folds, so their cross-validated NLLs are paired.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchcal.functional._checks import check_int


def kfold_indices(n: int, k: int = 5, seed: int = 0) -> tuple[Tensor, ...]:
    """The ``k`` held-out index sets (int64, sorted) of a seeded, shuffled K-fold split of
    ``n`` rows; fold sizes differ by at most one, every row is in exactly one fold.

    ``seed`` is any Python integer (reduced modulo ``2**63``, so seeds that differ by a
    multiple of ``2**63`` share folds).

    Example:
        >>> from torchcal.functional.folds import kfold_indices
        >>> folds = kfold_indices(10, 3, seed=0)
        >>> [len(f) for f in folds], sorted(int(i) for f in folds for i in f) == list(range(10))
        ([4, 3, 3], True)
    """
    n = check_int("n", n, minimum=1)
    k = check_int("k", k, minimum=2)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: expected an int, got {seed!r}")
    if k > n:
        raise ValueError(f"k: expected at most n = {n} folds, got {k}")
    g = torch.Generator().manual_seed(seed % (2**63))
    perm = torch.randperm(n, generator=g)
    return tuple(torch.sort(part).values for part in torch.tensor_split(perm, k))


def fold_complement(n: int, held_out: Tensor) -> Tensor:
    """The fit rows (sorted int64 indices) of a fold: every row of ``0..n-1`` not in
    ``held_out``."""
    keep = torch.ones(n, dtype=torch.bool)
    keep[held_out] = False
    return torch.nonzero(keep).squeeze(1)
