"""The multiclass gradcheck input shared by the scoring-rule and focal-loss tests."""

from __future__ import annotations

import torch
from torch import Tensor


def weighted_multiclass(
    seed: int, n: int, ignored: tuple[int, int]
) -> tuple[torch.Generator, Tensor, Tensor, Tensor]:
    """float64 logits ``(n, 4, 2)`` that require grad, class indices ``(n, 2)`` with the item
    at ``ignored`` set to -100, and class weights in [0.1, 1.1); with the generator (seeded
    with ``seed``) for the test's further draws."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 4, (n, 2), generator=g)
    t[ignored] = -100
    w = torch.rand(4, generator=g, dtype=torch.float64) + 0.1
    return g, z, t, w
