"""Conformal risk control: split conformal as a special case, realised risk <= alpha by seeded
simulation, and the finite-sample term shown to matter."""

from __future__ import annotations

import math

import pytest
import torch

from torchcal.functional import (
    conformal_risk_control,
    multilabel_fnr_losses,
    set_size_losses,
)
from torchcal.scaling import conformal_quantile

F64 = torch.float64


def test_miscoverage_loss_is_split_conformal() -> None:
    # loss 1{score > lambda} on the grid of every pool score: lambda_hat is the
    # ceil((n + 1)(1 - alpha))-th smallest calibration score, split by split
    g = torch.Generator().manual_seed(0)
    P, n, S = 400, 100, 100
    pool = torch.rand(P, generator=g, dtype=F64)
    lam = pool.sort().values
    perm = torch.argsort(torch.rand(S, P, generator=g), 1)[:, :n]
    cal = pool[perm]  # (S, n)
    losses = (cal[:, :, None] > lam).double()  # (S, n, P)
    for alpha in (0.1, 0.7, 1 / 3):
        got, idx = conformal_risk_control(losses, alpha, lam)
        q, _, _ = conformal_quantile(
            cal.reshape(-1), alpha, torch.arange(S).repeat_interleave(n), S
        )
        assert torch.equal(got, q) and torch.equal(lam[idx], q)
        # without the finite-sample term (the smallest lambda with R_hat <= alpha) the
        # threshold is one order statistic lower (or less)
        naive = lam[(losses.mean(1) <= alpha).double().argmax(-1)]
        assert bool((naive < q).all())


def _multilabel_pool(P: int, C: int, g: torch.Generator):
    z = torch.randn(P, C, generator=g, dtype=F64) * 2 - 1
    labels = (torch.rand(P, C, generator=g, dtype=F64) < torch.sigmoid(z)).long()
    return torch.sigmoid(1.5 * z), labels  # an over-confident model


def test_fnr_risk_control_realised_risk() -> None:
    # realised false-negative rate over S random splits: <= alpha (and >= alpha - 2 / (n + 1))
    # with the finite-sample term; the naive rule (R_hat <= alpha) takes more risk (the sharp
    # check of the rank itself is the miscoverage case above with the coverage tests of sets)
    g = torch.Generator().manual_seed(1)
    P, C, n, S, alpha = 1500, 20, 100, 300, 0.1
    probs, labels = _multilabel_pool(P, C, g)
    lam = torch.linspace(0, 1, 201, dtype=F64)
    L = multilabel_fnr_losses(probs, labels, lam)  # (P, 201)
    assert bool((L.diff(dim=1) <= 0).all())
    perm = torch.argsort(torch.rand(S, P, generator=g), 1)
    cal, test = perm[:, :n], perm[:, n:]
    _, idx = conformal_risk_control(L[cal], alpha, lam)
    naive = (L[cal].mean(1) <= alpha).double().argmax(-1)

    def realised(i: torch.Tensor) -> tuple[float, float]:
        r = L[test].gather(2, i[:, None, None].expand(S, P - n, 1))[..., 0].mean(1)
        return float(r.mean()), float(r.std()) / math.sqrt(S)

    mean, se = realised(idx)
    assert alpha - 2 / (n + 1) - 3 * se <= mean <= alpha + 3 * se
    naive_mean, naive_se = realised(naive)
    assert bool((naive <= idx).all()) and naive_mean > mean + 3 * math.hypot(se, naive_se)


def test_set_size_control_and_bad_input() -> None:
    g = torch.Generator().manual_seed(2)
    probs = torch.softmax(torch.randn(300, 10, generator=g, dtype=F64) * 2, 1)
    lam = torch.linspace(0, 1, 101, dtype=F64)
    L = set_size_losses(probs, lam)
    got, idx = conformal_risk_control(L[:200], 0.2, lam)
    R = L[:200, int(idx)].mean()
    assert float(200 / 201 * R + 1 / 201) <= 0.2
    if int(idx) > 0:
        assert float(200 / 201 * L[:200, int(idx) - 1].mean() + 1 / 201) > 0.2
    with pytest.raises(ValueError, match="^losses: expected every row non-increasing"):
        conformal_risk_control(1 - L, 0.2, lam)
    with pytest.raises(ValueError, match="^lambdas"):
        conformal_risk_control(L, 0.2, lam.flip(0))
    with pytest.raises(ValueError, match="^losses: expected values in"):
        conformal_risk_control(L * 2, 0.2, lam)
    none, i = conformal_risk_control(torch.ones(5, 3, dtype=F64), 0.2, lam[:3])
    assert math.isinf(float(none)) and int(i) == 3
