"""(internal) The fused softmax kernels of the multiclass Brier, spherical and ranked
probability scores: ``torch.autograd.Function`` s whose forward reads ``softmax(z)`` once and
whose backward is the closed form (double backward recomputes it with differentiable ops).
:mod:`torchcal.functional.scoring` holds the rules and their checks; these are its kernels.
"""

from __future__ import annotations

import torch
from torch import Tensor


class SoftmaxBrier(torch.autograd.Function):
    """Per-item multiclass Brier score ``||softmax(z) - e_y||^2`` with a fused backward.

    Gradient: ``dS/dz_j = 2 p_j (p_j - [j = y] - d)`` with ``d = ||p||^2 - p_y``. The first
    backward uses the saved softmax (two passes over the logits); when a graph of the
    backward is requested (double backward) it recomputes the same closed form with
    differentiable ops from the saved logits.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, index: Tensor) -> Tensor:  # type: ignore[override]
        p = torch.softmax(logits, dim=1)
        p_y = p.gather(1, index)
        # ||p - e_y||^2 exactly as written (never negative): shift the true class in place,
        # take the norm, restore the saved value bit for bit.
        p.scatter_add_(1, index, torch.full_like(p_y, -1.0))
        score = torch.linalg.vector_norm(p, dim=1, keepdim=True).square_()
        p.scatter_(1, index, p_y)
        d = score + p_y - 1.0  # = ||p||^2 - p_y
        ctx.save_for_backward(logits, index, p, p_y, d)
        return score.squeeze(1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        logits, index, p, p_y, d = ctx.saved_tensors
        g2 = (2.0 * grad).unsqueeze(1)
        if torch.is_grad_enabled():  # create_graph=True: differentiable recomputation
            p = torch.softmax(logits, dim=1)
            p_y = p.gather(1, index)
            d = (p * p).sum(dim=1, keepdim=True) - p_y
            out = g2 * p * (p - d)
            return out.scatter_add(1, index, -g2 * p_y), None
        out = torch.addcmul(-g2 * d, p, g2).mul_(p)
        out.scatter_add_(1, index, -g2 * p_y)
        return out, None


class SoftmaxSpherical(torch.autograd.Function):
    """Per-item ``1 - p_y / ||p||_2`` of ``p = softmax(z)`` with a fused backward.

    With ``a = p_y / ||p||`` and ``q = p^2 / ||p||^2`` (``= softmax(2 z)``):
    ``dS/dz_j = a (q_j - [j = y])``. ``||p|| >= p_y`` holds in floating point too (a sum
    of non-negative squares never rounds below one of its terms), so ``S >= 0``.
    Double backward recomputes the closed form with differentiable ops.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, index: Tensor) -> Tensor:  # type: ignore[override]
        p = torch.softmax(logits, dim=1)
        norm = torch.linalg.vector_norm(p, dim=1, keepdim=True)
        ratio = p.gather(1, index) / norm
        ctx.save_for_backward(logits, index, p, norm, ratio)
        return (1.0 - ratio).squeeze(1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        logits, index, p, norm, ratio = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiable recomputation
            p = torch.softmax(logits, dim=1)
            norm2 = (p * p).sum(dim=1, keepdim=True)
            ratio = p.gather(1, index) / norm2.sqrt()
            ga = grad.unsqueeze(1) * ratio
            return (ga * p * p / norm2).scatter_add(1, index, -ga), None
        ga = grad.unsqueeze(1) * ratio
        out = torch.mul(p, ga / norm.square()).mul_(p)
        return out.scatter_add_(1, index, -ga), None


class SoftmaxRPS(torch.autograd.Function):
    """Per-item RPS ``sum_{k<C-1} (P_k - [y <= k])^2`` of ``p = softmax(z)``, fused backward.

    With ``d_k = P_k - [y <= k]`` (``d_{C-1} = 0``) and suffix sums ``h_j = sum_{k>=j} d_k``:
    ``dS/dp_j = 2 h_j`` and ``dS/dz = 2 p (h - <p, h>)``, where ``<p, h> = S + h_y``
    (``sum_k d_k P_k = sum_k d_k^2 + sum_{k>=y} d_k``). One cumulative sum in each pass;
    double backward recomputes the same closed form with differentiable ops.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, index: Tensor) -> Tensor:  # type: ignore[override]
        num_classes = logits.shape[1]
        p = torch.softmax(logits, dim=1)
        p_y = p.gather(1, index)
        p.scatter_add_(1, index, torch.full_like(p_y, -1.0))
        diff = torch.cumsum(p, dim=1)  # P_k - [y <= k] = cumsum(p - e_y)
        p.scatter_(1, index, p_y)  # restore p bit for bit
        diff.narrow(1, num_classes - 1, 1).zero_()  # P_{C-1} - 1 is 0 up to rounding
        score = torch.linalg.vector_norm(diff, dim=1, keepdim=True).square_()
        ctx.save_for_backward(logits, index, p, diff, score)
        return score.squeeze(1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        logits, index, p, diff, score = ctx.saved_tensors
        num_classes = logits.shape[1]
        g2 = (2.0 * grad).unsqueeze(1)
        if torch.is_grad_enabled():  # create_graph=True: differentiable recomputation
            p = torch.softmax(logits, dim=1)
            head = p.scatter_add(1, index, -torch.ones_like(index, dtype=p.dtype))
            head = head.cumsum(dim=1).narrow(1, 0, num_classes - 1)
            h = torch.cat(
                [head.flip(1).cumsum(dim=1).flip(1), torch.zeros_like(p.narrow(1, 0, 1))], dim=1
            )
            centre = head.square().sum(dim=1, keepdim=True) + h.gather(1, index)
            return g2 * p * (h - centre), None
        h = torch.cumsum(diff, dim=1)
        total = h.narrow(1, num_classes - 1, 1).clone()
        h.sub_(diff).neg_().add_(total)  # suffix sums: h_j = total - sum_{k<j} d_k
        centre = score + h.gather(1, index)  # <p, h>
        return h.sub_(centre).mul_(p).mul_(g2), None
