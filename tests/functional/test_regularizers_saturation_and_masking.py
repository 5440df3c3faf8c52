"""Issue 13 "Must hold" for the regularisers, the cases tests/functional/test_regularizers.py
does not already cover: float32 saturation over a sweep of margins (values and gradients
against float64), gradcheck at the remaining focal gammas and of the set-level
penalties with ignored items, and ``weight`` / ``ignore_index`` against
``F.cross_entropy`` itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _gradcheck_cases import weighted_multiclass
from torch.autograd import gradcheck

from torchcal.functional import (
    confidence_penalty,
    dca,
    focal_loss,
    mdca,
    mmce,
    soft_binned_ece,
)

GAMMAS = [0.0, 0.5, 1.0, 2.0, 3.0, 5.0]
MARGINS = [1.0, 10.0, 20.0, 50.0, 100.0, 1e3]


def _saturated(margin: float, correct: bool, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Multiclass (6, 3) and binary (6,) batches whose winning logit leads by ``margin``."""
    t = torch.tensor([0, 1, 2, 1, 0, 2])
    z = torch.zeros(6, 3, dtype=dtype)
    z[torch.arange(6), t if correct else (t + 1) % 3] = margin
    zb = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0], dtype=dtype) * margin
    yb = ((zb > 0) == correct).to(dtype)
    return z, t, zb, yb


@pytest.mark.parametrize("gamma", GAMMAS + ["adaptive"])
@pytest.mark.parametrize("correct", [True, False], ids=["all-correct", "all-wrong"])
def test_focal_float32_saturation_sweep_matches_float64(gamma, correct):
    for margin in MARGINS:
        z, t, zb, yb = _saturated(margin, correct, torch.float32)
        for logits, target in ((z, t), (zb, yb)):
            x32 = logits.clone().requires_grad_(True)
            v32 = focal_loss(x32, target, gamma=gamma)
            (g32,) = torch.autograd.grad(v32, x32)
            x64 = logits.double().requires_grad_(True)
            v64 = focal_loss(
                x64, target.double() if target.is_floating_point() else target, gamma=gamma
            )
            (g64,) = torch.autograd.grad(v64, x64)
            assert torch.isfinite(v32) and torch.isfinite(g32).all(), (margin, gamma)
            # float32 gets float64's value to its precision: log p_y = z_y - logsumexp(z)
            # is exact only to a few eps * |z| (cancellation), p_y - 1 in the gradient to eps
            eps = torch.finfo(torch.float32).eps
            torch.testing.assert_close(v32.double(), v64, rtol=1e-5, atol=16 * eps * margin)
            torch.testing.assert_close(g32.double(), g64, rtol=1e-3, atol=8 * eps)


@pytest.mark.parametrize("correct", [True, False], ids=["all-correct", "all-wrong"])
def test_set_level_float32_saturation_sweep(correct):
    fns = {
        "mmce": lambda z, t: mmce(z, t),
        "mmce_squared": lambda z, t: mmce(z, t, squared=True),
        "sb_ece": lambda z, t: soft_binned_ece(z, t),
        "sb_ece_smooth": lambda z, t: soft_binned_ece(z, t, root=False),
        "dca": dca,
        "mdca": mdca,
        "confidence_penalty": lambda z, t: confidence_penalty(z, t),
    }
    for margin in MARGINS:
        z, t, zb, yb = _saturated(margin, correct, torch.float32)
        for name, fn in fns.items():
            for logits, target in ((z, t), (zb, yb)):
                x = logits.clone().requires_grad_(True)
                value = fn(x, target)
                (grad,) = torch.autograd.grad(value, x)
                assert torch.isfinite(value) and torch.isfinite(grad).all(), (name, margin)


@pytest.mark.parametrize("gamma", [0.0, 1.0, 3.0, 5.0])
def test_focal_gradcheck_remaining_gammas(gamma):
    g, z, t, w = weighted_multiclass(130, 5, ignored=(1, 0))
    assert gradcheck(lambda x: focal_loss(x, t, gamma=gamma, weight=w), (z,))
    zb = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    yb = torch.randint(0, 2, (6,), generator=g).double()
    assert gradcheck(lambda x: focal_loss(x, yb, gamma=gamma, reduction="sum"), (zb,))
    zm = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    ym = torch.randint(0, 2, (3, 4), generator=g).double()
    assert gradcheck(lambda x: focal_loss(x, ym, gamma=gamma, multilabel=True), (zm,))


@pytest.mark.parametrize("gamma", GAMMAS + ["adaptive"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_focal_weight_and_ignore_index_as_cross_entropy(gamma, reduction):
    g = torch.Generator().manual_seed(131)
    z = torch.randn(7, 4, 3, generator=g, dtype=torch.float64)
    t = torch.randint(0, 4, (7, 3), generator=g)
    t[0, 1] = t[4, 2] = 9
    w = torch.rand(4, generator=g, dtype=torch.float64) + 0.2
    kw = {"weight": w, "ignore_index": 9}
    ce_items = F.cross_entropy(z, t, reduction="none", **kw)  # w_y (-log p_y), 0 if ignored
    p_y = torch.exp(-F.cross_entropy(z, t.clamp(max=3), reduction="none"))
    g_y = torch.where(p_y < 0.2, 5.0, 3.0) if gamma == "adaptive" else gamma
    items = (1 - p_y) ** g_y * ce_items  # the focal items, weighted as cross_entropy weighs
    ref = {
        "none": items,
        "sum": items.sum(),
        # cross_entropy's own normaliser: sum of w_y over the used items
        "mean": items.sum()
        * (F.cross_entropy(z, t, **kw) / F.cross_entropy(z, t, reduction="sum", **kw)),
    }[reduction]
    out = focal_loss(z, t, gamma=gamma, reduction=reduction, **kw)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
    if gamma == 0.0:
        torch.testing.assert_close(out, F.cross_entropy(z, t, reduction=reduction, **kw))
    # every item ignored: NaN for 'mean', as cross_entropy
    all_ignored = torch.full_like(t, 9)
    if reduction == "mean":
        assert torch.isnan(F.cross_entropy(z, all_ignored, **kw))
        assert torch.isnan(focal_loss(z, all_ignored, gamma=gamma, **kw))


@pytest.mark.parametrize(
    "fn",
    [
        lambda z, t, **k: mmce(z, t, **k),
        lambda z, t, **k: soft_binned_ece(z, t, temperature=0.05, **k),
        dca,
        mdca,
        lambda z, t, **k: confidence_penalty(z, t, **k),
    ],
    ids=["mmce", "soft_binned_ece", "dca", "mdca", "confidence_penalty"],
)
def test_set_level_ignore_index_drops_the_items_and_their_gradient(fn):
    # as cross_entropy: an ignored item is as if it were not in the batch (these
    # penalties take no per-class weight)
    g = torch.Generator().manual_seed(132)
    z = torch.randn(3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 4, (3, 5), generator=g)
    t[0, :2] = -7
    t[2, 4] = -7
    keep = t != -7
    flat_z = z.movedim(1, -1)[keep]  # the used items as (m, C)
    out = fn(z, t, ignore_index=-7)
    torch.testing.assert_close(out, fn(flat_z, t[keep]), rtol=1e-12, atol=1e-15)
    (grad,) = torch.autograd.grad(out, z)
    assert torch.equal(grad.movedim(1, -1)[~keep], torch.zeros(3, 4, dtype=torch.float64))
    assert gradcheck(lambda x: fn(x, t, ignore_index=-7), (z,))
