"""Two small networks predicting ``(loc, scale)`` from ``x``, trained with a proper score:
the Gaussian negative log-likelihood (:class:`torchcal.losses.GaussianNLLLoss`) or the CRPS
(:class:`torchcal.losses.CRPSLoss`). A plain seeded PyTorch loop (Adam, shuffled minibatches,
a tqdm progress bar): the whole training is a few seconds on one CPU thread.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from torchcal.losses import CRPSLoss, GaussianNLLLoss

__all__ = ["LocScaleMLP", "train_mlp"]

MIN_SCALE = 1e-3


class LocScaleMLP(nn.Module):
    """``x (N,) -> (loc (N,), scale (N,))``: an MLP with two hidden layers and a softplus
    scale head (``scale >= 1e-3``).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> loc, scale = LocScaleMLP(hidden=8)(torch.rand(5))
        >>> loc.shape, bool((scale > 0).all())
        (torch.Size([5]), True)
    """

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(1, hidden),
            nn.SiLU(),
            nn.Linear(hidden, hidden),
            nn.SiLU(),
            nn.Linear(hidden, 2),
        )

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        out = self.net(x.unsqueeze(-1))
        return out[..., 0], nn.functional.softplus(out[..., 1]) + MIN_SCALE


def _loss(objective: str) -> nn.Module:
    if objective == "nll":
        return GaussianNLLLoss(spread="scale")
    if objective == "crps":
        return CRPSLoss("normal")
    raise ValueError(f"objective: expected 'nll' or 'crps', got {objective!r}")


def train_mlp(
    x: Tensor,
    y: Tensor,
    objective: Literal["nll", "crps"],
    *,
    seed: int,
    hidden: int = 32,
    epochs: int = 40,
    batch_size: int = 1000,
    lr: float = 1e-2,
    progress: bool = True,
) -> tuple[LocScaleMLP, list[float]]:
    """Train a :class:`LocScaleMLP` on ``(x, y)`` with ``objective``; returns the model (in
    eval mode) and the mean training loss of each epoch. Seeded: the initial weights and the
    shuffling come from ``seed``, so two runs on the same thread count are identical. The
    command line's ``--model.*`` options are the keyword arguments after ``seed``.

    Args:
        x: inputs ``(N,)``.
        y: targets ``(N,)``.
        objective: ``'nll'`` (Gaussian NLL) or ``'crps'`` (closed-form Gaussian CRPS).
        seed: seed of the weights and of the minibatch order.
        hidden: width of the two hidden layers.
        epochs: passes over the training data.
        batch_size: minibatch size.
        lr: Adam's learning rate (cosine-decayed to zero over the run).
        progress: show a tqdm progress bar (on stderr).

    Example:
        >>> import torch
        >>> x = torch.rand(64, dtype=torch.float64)
        >>> model, losses = train_mlp(x, 2 * x, "crps", seed=0, epochs=2, progress=False)
        >>> len(losses)
        2
    """
    loss_fn = _loss(objective)
    for name, v in (("hidden", hidden), ("epochs", epochs), ("batch_size", batch_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"model.{name}: expected an int >= 1, got {v!r}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"model.lr: expected a finite float > 0, got {lr!r}")
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    model = LocScaleMLP(hidden)
    g = torch.Generator().manual_seed(seed + 1)
    xf, yf = x.float(), y.float()
    steps = epochs * math.ceil(len(xf) / batch_size)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    history: list[float] = []
    bar = tqdm(range(epochs), desc=f"mlp_{objective}", disable=not progress, leave=False)
    for _ in bar:
        total = torch.zeros((), dtype=torch.float64)
        for idx in torch.randperm(len(xf), generator=g).split(batch_size):
            loc, scale = model(xf[idx])
            loss = loss_fn(loc, scale, yf[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.detach().double() * len(idx)
        history.append(float(total) / len(xf))
        bar.set_postfix(loss=f"{history[-1]:.4f}")
    return model.eval(), history
