"""Tests for torchcal.functional.regularizers and their Modules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

from torchcal.functional import focal_loss, log_score, mmce, soft_binned_ece
from torchcal.losses import FocalLoss, MMCELoss, SoftBinnedECELoss

TOL = {"rtol": 1e-12, "atol": 1e-12}


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: intra-op threads only add contention on the shared CI cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _focal_reference(z: torch.Tensor, t: torch.Tensor, gamma) -> np.ndarray:
    p = torch.softmax(z, 1).numpy()
    p_y = np.take_along_axis(p, t.numpy()[:, None], 1)[:, 0]
    g = np.where(p_y < 0.2, 5.0, 3.0) if gamma == "adaptive" else gamma
    return -((1 - p_y) ** g) * np.log(p_y)


def _confidence(z: torch.Tensor, t: torch.Tensor):
    p = torch.softmax(z.double(), 1)
    conf, pred = p.max(1)
    return conf, (pred == t).double()


# ------------------------------------------------------------------------------ focal


@pytest.mark.parametrize("gamma", [0.5, 1.0, 2.0, 3.5, "adaptive"])
def test_focal_matches_brute_force(gamma):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(40, 6, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, 6, (40,), generator=g)
    np.testing.assert_allclose(focal_loss(z, t, gamma=gamma, reduction="none").numpy(),
                               _focal_reference(z, t, gamma), rtol=1e-12, atol=1e-12)
    # binary = 2-class multiclass with logits (0, z)
    zb = torch.randn(30, generator=g, dtype=torch.float64) * 3
    yb = torch.randint(0, 2, (30,), generator=g)
    two = torch.stack([torch.zeros_like(zb), zb], 1)
    torch.testing.assert_close(focal_loss(zb, yb.double(), gamma=gamma, reduction="none"),
                               focal_loss(two, yb, gamma=gamma, reduction="none"), **TOL)


def test_focal_gamma_zero_is_the_log_score_with_all_options():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(5, 4, 3, generator=g, dtype=torch.float64)
    t = torch.randint(0, 4, (5, 3), generator=g)
    t[0, 0] = -100
    w = torch.rand(4, generator=g, dtype=torch.float64)
    for reduction in ["mean", "sum", "none"]:
        torch.testing.assert_close(focal_loss(z, t, gamma=0, weight=w, reduction=reduction),
                                   log_score(z, t, weight=w, reduction=reduction), **TOL)


@pytest.mark.parametrize("gamma", [0.5, 2.0, "adaptive"])
def test_focal_gradcheck(gamma):
    g = torch.Generator().manual_seed(2)
    z = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 4, (5,), generator=g)
    t[1] = -100
    w = torch.rand(4, generator=g, dtype=torch.float64) + 0.1
    assert gradcheck(lambda x: focal_loss(x, t, gamma=gamma, weight=w), (z,))
    zb = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    yb = torch.randint(0, 2, (6,), generator=g).double()
    assert gradcheck(lambda x: focal_loss(x, yb, gamma=gamma), (zb,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gamma", [0.1, 0.5, 2.0, "adaptive"])
def test_focal_gradient_is_nan_free_at_saturation(dtype, gamma):
    z = torch.tensor([[60.0, 0.0, -5.0], [200.0, -200.0, 0.0], [0.0, 1e4, 0.0]], dtype=dtype,
                     requires_grad=True)
    t = torch.tensor([0, 0, 1])
    out = focal_loss(z, t, gamma=gamma, reduction="sum")
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(z.grad).all()
    zb = torch.tensor([60.0, -200.0, 1e4], dtype=dtype, requires_grad=True)
    focal_loss(zb, torch.tensor([1.0, 0.0, 1.0], dtype=dtype), gamma=gamma).backward()
    assert torch.isfinite(zb.grad).all()
    # the textbook formula -(1 - softmax_y)^gamma * log_softmax_y does produce NaN here
    if gamma in (0.1, 0.5):
        z2 = z.detach().clone().requires_grad_()
        p_y = torch.softmax(z2, 1).gather(1, t[:, None])
        naive = (-(1 - p_y) ** gamma * torch.log_softmax(z2, 1).gather(1, t[:, None])).sum()
        naive.backward()
        assert not torch.isfinite(z2.grad).all()


def test_focal_all_other_classes_masked():
    z = torch.tensor([[0.0, float("-inf"), float("-inf")], [1.0, 0.0, float("-inf")]],
                     dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 1])
    out = focal_loss(z, t, gamma=2.0, reduction="none")
    assert out[0].item() == 0.0
    out.sum().backward()
    assert torch.isfinite(z.grad).all() and torch.all(z.grad[0] == 0)


def test_focal_is_not_proper():
    q = torch.tensor([0.7, 0.3], dtype=torch.float64)
    z = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([z], max_iter=200, tolerance_grad=1e-12, tolerance_change=1e-20,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = focal_loss(z.expand(2, 2), torch.arange(2), gamma=2.0, weight=q, reduction="sum")
        loss.backward()
        return loss

    opt.step(closure)
    p = torch.softmax(z.detach(), 0)
    assert 0.5 < p[0] < 0.7 - 1e-2  # under-confident minimiser, not q


# ------------------------------------------------------------------------------- MMCE


def _mmce_brute(conf: torch.Tensor, correct: torch.Tensor, width: float) -> torch.Tensor:
    a = correct - conf
    k = torch.exp(-(conf[:, None] - conf[None, :]).abs() / width)
    return (a[:, None] * a[None, :] * k).sum() / conf.numel() ** 2


@pytest.mark.parametrize("width", [0.4, 0.1, 0.01, 0.002])
def test_mmce_matches_n_squared_brute_force(width):
    g = torch.Generator().manual_seed(3)
    z = torch.randn(300, 5, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, 5, (300,), generator=g)
    conf, correct = _confidence(z, t)
    brute = _mmce_brute(conf, correct, width)
    torch.testing.assert_close(mmce(z, t, width=width, squared=True), brute, **TOL)
    torch.testing.assert_close(mmce(z, t, width=width), brute.sqrt(), **TOL)


def test_mmce_ignore_index_binary_and_gradients_match_brute_force():
    g = torch.Generator().manual_seed(4)
    z = torch.randn(50, 3, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 3, (50,), generator=g)
    t[::7] = -1
    used = t != -1
    conf, correct = _confidence(z[used], t[used])
    brute = _mmce_brute(conf, correct, 0.4)
    ours = mmce(z, t, ignore_index=-1, squared=True)
    torch.testing.assert_close(ours, brute, **TOL)
    (g_ours,) = torch.autograd.grad(ours, z)
    (g_brute,) = torch.autograd.grad(brute, z)
    torch.testing.assert_close(g_ours, g_brute, **TOL)
    assert gradcheck(lambda x: mmce(x, t, ignore_index=-1), (z,))
    # binary: confidence max(p, 1 - p), correct when (p >= 0.5) == y
    zb = torch.randn(40, generator=g, dtype=torch.float64)
    yb = torch.randint(0, 2, (40,), generator=g).double()
    pb = torch.sigmoid(zb)
    brute_b = _mmce_brute(torch.maximum(pb, 1 - pb), ((zb >= 0).double() == yb).double(), 0.4)
    torch.testing.assert_close(mmce(zb, yb, squared=True), brute_b, **TOL)


# ------------------------------------------------------------------- soft-binned ECE


def _soft_ece_brute(conf, correct, bins, temperature, p):
    conf, correct = conf.numpy(), correct.numpy()
    centres = (np.arange(bins) + 0.5) / bins
    total = 0.0
    logits = -((conf[:, None] - centres[None, :]) ** 2) / temperature
    u = np.exp(logits - logits.max(1, keepdims=True))
    u /= u.sum(1, keepdims=True)
    for b in range(bins):
        s_b = u[:, b].sum()
        acc = (u[:, b] * correct).sum() / s_b
        cnf = (u[:, b] * conf).sum() / s_b
        total += s_b / len(conf) * abs(acc - cnf) ** p
    return total ** (1 / p)


@pytest.mark.parametrize(("bins", "temperature", "p"), [(15, 0.01, 2.0), (10, 0.05, 1.0),
                                                         (5, 0.001, 3.0)])
def test_soft_binned_ece_matches_brute_force(bins, temperature, p):
    g = torch.Generator().manual_seed(5)
    z = torch.randn(200, 4, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, 4, (200,), generator=g)
    conf, correct = _confidence(z, t)
    ours = soft_binned_ece(z, t, bins=bins, temperature=temperature, p=p)
    assert ours.item() == pytest.approx(_soft_ece_brute(conf, correct, bins, temperature, p),
                                        rel=1e-10, abs=1e-12)


def test_soft_binned_ece_tends_to_hard_binned_ece():
    g = torch.Generator().manual_seed(6)
    z = torch.randn(400, 3, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, 3, (400,), generator=g)
    conf, correct = _confidence(z, t)
    bins = 10
    idx = torch.clamp((conf * bins).floor().long(), max=bins - 1)
    hard = sum((correct[idx == b] - conf[idx == b]).sum().abs() for b in range(bins)) / 400
    soft = soft_binned_ece(z, t, bins=bins, temperature=1e-5, p=1.0)
    assert soft.item() == pytest.approx(hard.item(), abs=2e-3)


def test_soft_binned_ece_gradcheck_and_float32():
    g = torch.Generator().manual_seed(7)
    z = torch.randn(20, 3, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 3, (20,), generator=g)
    assert gradcheck(lambda x: soft_binned_ece(x, t, temperature=0.05), (z,))
    z32 = z.detach().float().requires_grad_()
    out = soft_binned_ece(z32, t)
    out.backward()
    assert out.dtype == torch.float32 and torch.isfinite(z32.grad).all()


# ----------------------------------------------------------------------- Modules, inputs


def test_modules_equal_functional_and_keep_weight():
    g = torch.Generator().manual_seed(8)
    z = torch.randn(12, 4, generator=g, dtype=torch.float64)
    t = torch.randint(0, 4, (12,), generator=g)
    w = torch.rand(4, generator=g, dtype=torch.float64)
    focal = FocalLoss(gamma="adaptive", weight=w, reduction="sum")
    assert torch.equal(focal(z, t), focal_loss(z, t, gamma="adaptive", weight=w,
                                               reduction="sum"))
    assert "weight" in focal.state_dict() and "gamma='adaptive'" in repr(focal)
    assert torch.equal(MMCELoss(width=0.2, squared=True)(z, t),
                       mmce(z, t, width=0.2, squared=True))
    assert torch.equal(SoftBinnedECELoss(bins=7, p=1.0)(z, t),
                       soft_binned_ece(z, t, bins=7, p=1.0))


BAD = [
    (lambda: focal_loss(torch.zeros(2, 3), torch.tensor([0, 1]), gamma=-1.0), ValueError,
     r"gamma: expected a finite number >= 0"),
    (lambda: focal_loss(torch.zeros(2, 3), torch.tensor([0, 1]), gamma="auto"), ValueError,
     r"gamma: expected a number >= 0 or 'adaptive'"),
    (lambda: focal_loss(torch.zeros(2, 1), torch.tensor([0, 0])), ValueError,
     r"logits: expected at least 2 classes along dim 1"),
    (lambda: focal_loss(torch.tensor([[float("nan"), 0.0]]), torch.tensor([0])), ValueError,
     r"logits: expected finite values"),
    (lambda: mmce(torch.zeros(2, 3), torch.tensor([0, 3])), ValueError,
     r"target: expected class indices in \[0, 2\], got 3 at position 1"),
    (lambda: mmce(torch.zeros(2, 3), torch.tensor([0, 1]), width=0.0), ValueError,
     r"width: expected a finite number > 0"),
    (lambda: mmce(torch.zeros(2, 3), torch.tensor([0, 1]), width=1e-4), ValueError,
     r"width: expected a kernel width >= 1e-3"),
    (lambda: mmce(torch.tensor([[0.0, float("inf")]]), torch.tensor([0])), ValueError,
     r"logits: expected finite values"),
    (lambda: soft_binned_ece(torch.zeros(2, 3), torch.tensor([0.0, 1.0])), ValueError,
     r"target: expected integer class indices"),
    (lambda: soft_binned_ece(torch.zeros(2, 3), torch.tensor([0, 1]), bins=0), ValueError,
     r"bins: expected an int >= 1"),
    (lambda: soft_binned_ece(torch.zeros(2, 3), torch.tensor([0, 1]), p=0.5), ValueError,
     r"p: expected a number >= 1"),
    (lambda: FocalLoss(gamma="x"), ValueError, r"gamma: expected"),
    (lambda: FocalLoss(reduction="avg"), ValueError, r"reduction: expected one of"),
    (lambda: MMCELoss(width=-1.0), ValueError, r"width: expected a finite number > 0"),
    (lambda: MMCELoss(width=1e-4), ValueError, r"width: expected a kernel width >= 1e-3"),
    (lambda: SoftBinnedECELoss(p=0.5), ValueError, r"p: expected a number >= 1"),
    (lambda: SoftBinnedECELoss(temperature=0.0), ValueError, r"temperature: expected"),
]


@pytest.mark.parametrize("case", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input(case):
    call, exc, match = case
    with pytest.raises(exc, match=match):
        call()
