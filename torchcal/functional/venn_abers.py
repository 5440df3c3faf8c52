"""Inductive Venn-Abers prediction (Vovk & Petej, 2014; Vovk, Petej & Fedorova, 2015): the
``(p0, p1)`` of every possible test score, precomputed once on the calibration set.

For a test score ``s``, ``p_y(s)`` is the value at ``s`` of the isotonic regression of the
calibration labels on their scores with ``(s, y)`` added (ties pooled, as every isotonic fit
here). Both are step functions of ``s`` that change only at the calibration scores, so
:func:`venn_abers_table` computes them for every insertion point of the ``k`` distinct scores
``c_1 < ... < c_k`` at once: ``p1`` for ``s`` in ``(c_{j-1}, c_j]`` and ``p0`` for ``s`` in
``[c_j, c_{j+1})`` (a tie goes to the calibration score's group). On the cumulative sum
diagram ``P_j = (W_j, Y_j)`` of the sorted groups (``W`` counts, ``Y`` labels), ``p1`` at
insertion point ``j`` is the slope of the bridge between ``{P_i - (1, 1) : i <= j}`` and
``{P_i : i >= j}`` in their greatest convex minorant; one sweep over ``j`` with a stack of the
minorant's corners finds all of them (Vovk et al.'s fast IVAP algorithm; each corner is pushed
and popped once). ``p0`` is ``p1`` of the mirrored problem (scores reversed, labels ``1 - y``),
``p0(s) = 1 - p1'(-s)``. Corners are tested in exact integer arithmetic and each value is one
rounding of an exact ratio of counts, so the table is exact to the last bit: it equals the
``venn-abers`` package's ``calc_p0p1`` (tested to 1e-12). O(n log n) for the sort, O(n) after;
a query is a binary search (:func:`venn_abers_interval`). ``docs/design.md`` section 4.

Multiclass, the default reduction is the top label (:func:`top_label_scores`,
:func:`top_label_spread`): one table on the binary problem "is the argmax of the
temperature-scaled probabilities right?", scored by the top label's log-probability; the
merged value goes to the top label and the rest of the mass to the others in proportion to
their temperature-scaled probabilities.
"""

from __future__ import annotations

import math
from itertools import accumulate
from typing import NamedTuple

import torch
from torch import Tensor


class VennAbersTable(NamedTuple):
    """``p0`` and ``p1`` (float64 ``(k + 1,)``) at the insertion points of the sorted distinct
    calibration ``scores`` (float64 ``(k,)``): a test score ``s`` reads ``p0[searchsorted(
    scores, s, right=True)]`` and ``p1[searchsorted(scores, s)]``."""

    scores: Tensor
    p0: Tensor
    p1: Tensor


def _upper_ratios(counts: list[int], ones: list[int]) -> tuple[list[int], list[int]]:
    """``p1`` at the ``k + 1`` insertion points of the ``k`` sorted groups (``counts`` items,
    ``ones`` of them labelled 1), as exact ratios ``(numerators, denominators)``.

    The stack holds the corners of the minorant from the bridge's left end rightwards (the
    top, ``sx[-1], sy[-1]``, is the leftmost); a point ``(x, y)`` pushed on its left pops the
    corners it leaves above the minorant: while ``(x, y) -> top -> next`` is no left turn
    (the cross product of integers, exact). Inlined: this loop is the whole precompute.
    """
    k = len(counts)
    cx, cy = [0, *accumulate(counts)], [0, *accumulate(ones)]  # the CSD P_0..P_k
    sx: list[int] = []
    sy: list[int] = []
    # the minorant of P_0..P_k, built from the right, then P_0 - (1, 1) on its left
    for x, y in zip([*reversed(cx), -1], [*reversed(cy), -1]):
        while len(sx) >= 2 and (sx[-1] - x) * (sy[-2] - y) - (sy[-1] - y) * (sx[-2] - x) <= 0:
            sx.pop()
            sy.pop()
        sx.append(x)
        sy.append(y)
    nums, dens = [1] * (k + 1), [1] * (k + 1)
    for j in range(k + 1):
        if j > 0:  # P_j - (1, 1) joins the left set, P_{j-1} leaves the right one
            x, y = cx[j] - 1, cy[j] - 1
            x0, y0, x1, y1 = sx[-1], sy[-1], sx[-2], sy[-2]
            if (x1 - x0) * (y - y0) - (y1 - y0) * (x - x0) < 0:  # below the bridge:
                sx.pop()  # the new left end (P_{j-1} is no corner here: that takes
                sy.pop()  # slope 1, the exit below)
                while len(sx) >= 2 and (
                    (sx[-1] - x) * (sy[-2] - y) - (sy[-1] - y) * (sx[-2] - x) <= 0
                ):
                    sx.pop()
                    sy.pop()
                sx.append(x)
                sy.append(y)
        nums[j], dens[j] = sy[-2] - sy[-1], sx[-2] - sx[-1]
        if nums[j] == dens[j]:  # slope 1: p1 is non-decreasing in j and at most 1
            break  # (the rest stay 1 / 1)
    return nums, dens


def venn_abers_table(scores: Tensor, target: Tensor) -> VennAbersTable:
    """The :class:`VennAbersTable` of calibration ``scores`` ``(n,)`` (finite; only their order
    and ties matter) and 0/1 ``target`` ``(n,)`` (checked by
    :class:`~torchcal.scaling.VennAbersCalibrator`, its shell).

    Example:
        >>> import torch
        >>> from torchcal.functional.venn_abers import venn_abers_table
        >>> s = torch.tensor([0.1, 0.2, 0.2, 0.7], dtype=torch.float64)
        >>> t = venn_abers_table(s, torch.tensor([0, 1, 0, 1]))
        >>> t.scores.tolist(), [round(v, 4) for v in t.p0.tolist()], [round(v, 4) for v in t.p1.tolist()]
        ([0.1, 0.2, 0.7], [0.0, 0.0, 0.3333, 0.5], [0.5, 0.6667, 1.0, 1.0])
    """
    s = scores.detach().to(torch.float64).cpu()
    y = target.detach().to(torch.float64).cpu()
    uniq, inverse, counts = torch.unique(s, sorted=True, return_inverse=True, return_counts=True)
    ones = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inverse, y)
    w = counts.tolist()
    o = ones.round().to(torch.int64).tolist()
    n1, d1 = _upper_ratios(w, o)
    # p0: p1 of the mirrored groups (reversed, labels flipped), p0_j = 1 - p1'_{k - j}
    n0, d0 = _upper_ratios(w[::-1], [c - v for c, v in zip(w[::-1], o[::-1])])
    num1 = torch.tensor(n1, dtype=torch.float64)
    den1 = torch.tensor(d1, dtype=torch.float64)
    num0 = torch.tensor([d - v for v, d in zip(n0[::-1], d0[::-1])], dtype=torch.float64)
    den0 = torch.tensor(d0[::-1], dtype=torch.float64)
    dev = scores.device
    return VennAbersTable(uniq.to(dev), (num0 / den0).to(dev), (num1 / den1).to(dev))


def venn_abers_interval(table: VennAbersTable, scores: Tensor) -> tuple[Tensor, Tensor]:
    """``(p0, p1)`` (float64, the shape of ``scores``) of test ``scores`` (comparable with the
    table's: the same transform of the model's output)."""
    s = scores.to(device=table.scores.device, dtype=torch.float64)
    lo = torch.searchsorted(table.scores, s, right=True)
    hi = torch.searchsorted(table.scores, s)
    return table.p0[lo], table.p1[hi]


def venn_abers_merge(p0: Tensor, p1: Tensor) -> Tensor:
    """The merged probability ``p1 / (1 - p0 + p1)`` (Vovk & Petej's minimax choice for the
    log loss; the ``venn-abers`` package's ``p_prime``). ``0 <= p0 <= p1 <= 1`` and ``p1 > 0``,
    so it lies in ``(0, 1]`` and is never NaN."""
    return p1 / (1.0 - p0 + p1)


def top_label_scores(logits: Tensor, temperature: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(log_q, top, score)`` of the top-label reduction: ``log_q = log_softmax(logits / T)``
    (float64 ``(N, C)``, ``-inf`` masks allowed), ``top`` its argmax (the first of a tie;
    ``T`` never changes it) and ``score = log_q[top]``, the top label's log-probability: the
    binary score the table is fitted on (its order is that of the top probability, without
    the ties rounding creates near 1)."""
    log_q = torch.log_softmax(logits.to(torch.float64) / temperature, dim=1)
    top = log_q.argmax(dim=1, keepdim=True)
    return log_q, top.squeeze(1), log_q.gather(1, top).squeeze(1)


def top_label_spread(log_q: Tensor, top: Tensor, top_value: Tensor) -> Tensor:
    """The ``(N, C)`` rows giving ``top_value`` (``(N,)``, in ``[0, 1]``) to the top label and
    ``1 - top_value`` to the others in proportion to ``exp(log_q)`` (their temperature-scaled
    probabilities, renormalised without the top label: ``q_j / sum_{k != top} q_k``, computed
    in log space so a top probability that rounds to 1 leaves the others finite). A row whose
    other labels are all masked (``q = 0``) gives the top label 1.

    Example:
        >>> import torch
        >>> from torchcal.functional.venn_abers import top_label_spread
        >>> log_q = torch.tensor([[0.6, 0.3, 0.1]], dtype=torch.float64).log()
        >>> top_label_spread(log_q, torch.tensor([0]), torch.tensor([0.5], dtype=torch.float64))
        tensor([[0.5000, 0.3750, 0.1250]], dtype=torch.float64)
    """
    col = top.unsqueeze(1)
    others = log_q.scatter(1, col, -math.inf)
    log_rest = others.logsumexp(dim=1, keepdim=True)
    alone = torch.isneginf(log_rest)
    share = torch.exp(others - log_rest.masked_fill(alone, 0.0))
    out = share * (1.0 - top_value).unsqueeze(1)
    value = torch.where(alone.squeeze(1), torch.ones_like(top_value), top_value)
    return out.scatter(1, col, value.unsqueeze(1).to(out.dtype))
