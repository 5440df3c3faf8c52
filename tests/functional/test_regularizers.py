"""Tests for torchcal.functional.regularizers and their Modules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _properness import Q, argmin_forecast, entropy, expected
from torch.autograd import gradcheck

from torchcal.functional import (
    confidence_penalty,
    dca,
    focal_loss,
    log_score,
    mdca,
    mmce,
    soft_binned_ece,
)
from torchcal.losses import (
    ConfidencePenaltyLoss,
    DCALoss,
    FocalLoss,
    MDCALoss,
    MMCELoss,
    SoftBinnedECELoss,
)

TOL = {"rtol": 1e-12, "atol": 1e-12}


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
    np.testing.assert_allclose(
        focal_loss(z, t, gamma=gamma, reduction="none").numpy(),
        _focal_reference(z, t, gamma),
        rtol=1e-12,
        atol=1e-12,
    )
    # binary = 2-class multiclass with logits (0, z)
    zb = torch.randn(30, generator=g, dtype=torch.float64) * 3
    yb = torch.randint(0, 2, (30,), generator=g)
    two = torch.stack([torch.zeros_like(zb), zb], 1)
    torch.testing.assert_close(
        focal_loss(zb, yb.double(), gamma=gamma, reduction="none"),
        focal_loss(two, yb, gamma=gamma, reduction="none"),
        **TOL,
    )


def test_focal_gamma_zero_is_the_log_score_with_all_options():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(5, 4, 3, generator=g, dtype=torch.float64)
    t = torch.randint(0, 4, (5, 3), generator=g)
    t[0, 0] = -100
    w = torch.rand(4, generator=g, dtype=torch.float64)
    for reduction in ["mean", "sum", "none"]:
        torch.testing.assert_close(
            focal_loss(z, t, gamma=0, weight=w, reduction=reduction),
            log_score(z, t, weight=w, reduction=reduction),
            **TOL,
        )


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
    z = torch.tensor(
        [[60.0, 0.0, -5.0], [200.0, -200.0, 0.0], [0.0, 1e4, 0.0]], dtype=dtype, requires_grad=True
    )
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
        naive = (-((1 - p_y) ** gamma) * torch.log_softmax(z2, 1).gather(1, t[:, None])).sum()
        naive.backward()
        assert not torch.isfinite(z2.grad).all()


def test_focal_all_other_classes_masked():
    z = torch.tensor(
        [[0.0, float("-inf"), float("-inf")], [1.0, 0.0, float("-inf")]],
        dtype=torch.float64,
        requires_grad=True,
    )
    t = torch.tensor([0, 1])
    out = focal_loss(z, t, gamma=2.0, reduction="none")
    assert out[0].item() == 0.0
    out.sum().backward()
    assert torch.isfinite(z.grad).all() and torch.all(z.grad[0] == 0)


def test_focal_is_not_proper():
    q = torch.tensor([0.7, 0.3], dtype=torch.float64)
    z = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [z],
        max_iter=200,
        tolerance_grad=1e-12,
        tolerance_change=1e-20,
        line_search_fn="strong_wolfe",
    )

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


@pytest.mark.parametrize(
    ("bins", "temperature", "p"), [(15, 0.01, 2.0), (10, 0.05, 1.0), (5, 0.001, 3.0)]
)
def test_soft_binned_ece_matches_brute_force(bins, temperature, p):
    g = torch.Generator().manual_seed(5)
    z = torch.randn(200, 4, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, 4, (200,), generator=g)
    conf, correct = _confidence(z, t)
    ours = soft_binned_ece(z, t, bins=bins, temperature=temperature, p=p)
    assert ours.item() == pytest.approx(
        _soft_ece_brute(conf, correct, bins, temperature, p), rel=1e-10, abs=1e-12
    )


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


# ---------------------------------------------------------------- confidence penalty


def _entropy_reference(z: torch.Tensor) -> np.ndarray:
    """Per-item entropy of softmax(z) along dim 1 by explicit loops over items and classes."""
    zn = z.detach().double().movedim(1, -1).reshape(-1, z.shape[1]).numpy()
    out = np.zeros(len(zn))
    for i, row in enumerate(zn):
        e = np.exp(row - row.max())
        p = e / e.sum()
        out[i] = -sum(pc * math.log(pc) for pc in p if pc > 0)
    return out.reshape(z.shape[:1] + z.shape[2:])


def test_confidence_penalty_matches_brute_force_for_every_reduction():
    g = torch.Generator().manual_seed(10)
    z = torch.randn(6, 5, 3, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, 5, (6, 3), generator=g)
    t[0, 1] = t[4, 2] = 7
    used = (t != 7).numpy()
    ref = -0.3 * _entropy_reference(z) * used
    none = confidence_penalty(z, t, beta=0.3, ignore_index=7, reduction="none")
    np.testing.assert_allclose(none.numpy(), ref, rtol=1e-12, atol=1e-14)
    assert confidence_penalty(
        z, t, beta=0.3, ignore_index=7, reduction="sum"
    ).item() == pytest.approx(ref.sum(), rel=1e-12)
    assert confidence_penalty(z, t, beta=0.3, ignore_index=7).item() == pytest.approx(
        ref.sum() / used.sum(), rel=1e-12
    )
    # without a target every item is used
    np.testing.assert_allclose(
        confidence_penalty(z, beta=0.3, reduction="none").numpy(),
        -0.3 * _entropy_reference(z),
        rtol=1e-12,
        atol=1e-14,
    )
    # binary: entropy of Bernoulli(sigmoid(z)) = 2-class multiclass with logits (0, z)
    zb = torch.randn(20, generator=g, dtype=torch.float64) * 4
    yb = torch.randint(0, 2, (20,), generator=g).double()
    pb = torch.sigmoid(zb).numpy()
    ref_b = 2.0 * (pb * np.log(pb) + (1 - pb) * np.log1p(-pb))
    np.testing.assert_allclose(
        confidence_penalty(zb, yb, beta=2.0, reduction="none").numpy(),
        ref_b,
        rtol=1e-12,
        atol=1e-14,
    )


@pytest.mark.parametrize("num_classes", [2, 5, 100])
def test_confidence_penalty_sign_and_extremes(num_classes):
    g = torch.Generator().manual_seed(11)
    z = torch.randn(50, num_classes, generator=g) * 5
    out = confidence_penalty(z, beta=0.7, reduction="none")
    assert (out <= 0).all() and (out >= -0.7 * math.log(num_classes) - 1e-6).all()
    uniform = confidence_penalty(
        torch.zeros(3, num_classes, dtype=torch.float64), beta=0.7, reduction="none"
    )
    torch.testing.assert_close(
        uniform, torch.full((3,), -0.7 * math.log(num_classes), dtype=torch.float64), **TOL
    )
    one_hot = torch.full((1, num_classes), -60.0, dtype=torch.float64)
    one_hot[0, 0] = 60.0
    assert -1e-40 < confidence_penalty(one_hot).item() <= 0.0
    assert confidence_penalty(torch.zeros(4), torch.ones(4), beta=0.7).item() == pytest.approx(
        -0.7 * math.log(2), rel=1e-7
    )


def test_confidence_penalty_makes_training_flatter():
    """log_score + penalty trains to a flatter softmax than log_score alone."""
    torch.manual_seed(0)
    x = torch.randn(200, 4)
    t = (x[:, 0] + 0.7 * torch.randn(200) > 0).long() + (x[:, 1] > 0).long()

    def train(beta):
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(150):
            opt.zero_grad()
            z = model(x)
            loss = log_score(z, t) + confidence_penalty(z, beta=beta)
            loss.backward()
            opt.step()
        return -confidence_penalty(model(x).detach()).item()  # mean entropy

    plain, penalised = train(0.0), train(1.0)
    assert penalised > plain + 0.1


def test_confidence_penalty_gradcheck_and_masks():
    g = torch.Generator().manual_seed(12)
    z = torch.randn(4, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 3, (4, 2), generator=g)
    t[1, 0] = -100
    assert gradcheck(lambda x: confidence_penalty(x, t, beta=0.4), (z,))
    assert gradcheck(lambda x: confidence_penalty(x, beta=0.4, reduction="sum"), (z,))
    zb = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    yb = torch.randint(0, 2, (6,), generator=g).double()
    assert gradcheck(lambda x: confidence_penalty(x, yb), (zb,))
    # ignored items: zero gradient
    (grad,) = torch.autograd.grad(confidence_penalty(z, t, reduction="sum"), z)
    assert torch.all(grad[1, :, 0] == 0) and torch.any(grad[1, :, 1] != 0)
    # -inf masks: same value and gradient as dropping the class, no NaN
    zm = torch.randn(5, 4, generator=g, dtype=torch.float64)
    zm[:, 2] = float("-inf")
    zm.requires_grad_()
    kept = zm.detach()[:, [0, 1, 3]].clone().requires_grad_()
    a = confidence_penalty(zm, reduction="sum")
    b = confidence_penalty(kept, reduction="sum")
    torch.testing.assert_close(a, b, **TOL)
    (ga,) = torch.autograd.grad(a, zm)
    (gb,) = torch.autograd.grad(b, kept)
    assert torch.all(ga[:, 2] == 0)
    torch.testing.assert_close(ga[:, [0, 1, 3]], gb, **TOL)


def test_confidence_penalty_half_precision_and_saturation():
    z = torch.tensor([[30.0, -30.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float16)
    out = confidence_penalty(z, reduction="none")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, confidence_penalty(z.double(), reduction="none").float())
    zb = torch.tensor([80.0, -80.0, 0.0], requires_grad=True)
    out = confidence_penalty(zb, torch.ones(3), reduction="none")
    out.sum().backward()
    assert torch.isfinite(out).all() and (out <= 0).all() and torch.isfinite(zb.grad).all()


# ------------------------------------------------------------------------- DCA / MDCA


def _dca_loops(z: torch.Tensor, t: torch.Tensor, ignore_index: int = -100) -> float:
    conf_sum, acc_sum, m = 0.0, 0.0, 0
    zn, tn = z.detach().double().numpy(), t.numpy()
    for row, y in zip(zn, tn):
        if y == ignore_index:
            continue
        if zn.ndim == 1:  # binary: one logit, label in {0, 1}
            p1 = 1.0 / (1.0 + math.exp(-row))
            conf, pred = max(p1, 1.0 - p1), int(row >= 0)
        else:
            e = np.exp(row - row.max())
            p = e / e.sum()
            conf, pred = p.max(), int(p.argmax())
        conf_sum += conf
        acc_sum += float(pred == y)
        m += 1
    return abs(conf_sum / m - acc_sum / m)


def _mdca_loops(z: torch.Tensor, t: torch.Tensor, ignore_index: int = -100) -> float:
    zn = z.detach().double().movedim(1, -1).reshape(-1, z.shape[1]).numpy()
    tn = t.reshape(-1).numpy()
    num_classes = zn.shape[1]
    total = 0.0
    for c in range(num_classes):
        p_sum, y_sum, m = 0.0, 0.0, 0
        for row, y in zip(zn, tn):
            if y == ignore_index:
                continue
            e = np.exp(row - row.max())
            p_sum += e[c] / e.sum()
            y_sum += float(y == c)
            m += 1
        total += abs(p_sum / m - y_sum / m)
    return total / num_classes


def test_dca_matches_loops_multiclass_binary_and_ignore_index():
    g = torch.Generator().manual_seed(20)
    z = torch.randn(60, 4, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, 4, (60,), generator=g)
    t[::5] = -1
    assert dca(z, t, ignore_index=-1).item() == pytest.approx(_dca_loops(z, t, -1), rel=1e-12)
    zb = torch.randn(40, generator=g, dtype=torch.float64) * 2
    yb = torch.randint(0, 2, (40,), generator=g).double()
    assert dca(zb, yb).item() == pytest.approx(_dca_loops(zb, yb.long()), rel=1e-12)
    # spatial layout: every position is an item
    zs = torch.randn(5, 3, 4, generator=g, dtype=torch.float64)
    ts = torch.randint(0, 3, (5, 4), generator=g)
    flat_z, flat_t = zs.movedim(1, -1).reshape(-1, 3), ts.reshape(-1)
    assert dca(zs, ts).item() == pytest.approx(_dca_loops(flat_z, flat_t), rel=1e-12)
    assert torch.isnan(dca(z, torch.full((60,), -1), ignore_index=-1))


def test_mdca_matches_loops_multiclass_binary_and_ignore_index():
    g = torch.Generator().manual_seed(21)
    z = torch.randn(30, 5, 2, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, 5, (30, 2), generator=g)
    t[::4, 1] = 9
    assert mdca(z, t, ignore_index=9).item() == pytest.approx(_mdca_loops(z, t, 9), rel=1e-12)
    zb = torch.randn(40, generator=g, dtype=torch.float64) * 2
    yb = torch.randint(0, 2, (40,), generator=g)
    two = torch.stack([torch.zeros_like(zb), zb], 1)
    assert mdca(zb, yb.double()).item() == pytest.approx(_mdca_loops(two, yb), rel=1e-12)
    # -inf masked class: p = 0 for it, same as a logit of -1e3
    zm = z[:, :, 0].clone()
    zm[:, 3] = float("-inf")
    tm = t[:, 0].clone()
    tm[tm == 3] = 0
    ref = zm.clone()
    ref[:, 3] = -1e3
    torch.testing.assert_close(mdca(zm, tm), mdca(ref, tm), **TOL)
    # zero when the batch's mean forecast equals its class frequencies
    q = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert mdca(q.log().expand(4, 3), torch.tensor([0, 0, 1, 2])).item() < 1e-15
    assert torch.isnan(mdca(z, torch.full((30, 2), 9), ignore_index=9))


def test_dca_mdca_gradcheck_and_gradients_match_loops():
    g = torch.Generator().manual_seed(22)
    z = torch.randn(12, 4, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 4, (12,), generator=g)
    t[3] = -100
    assert gradcheck(lambda x: dca(x, t), (z,))
    assert gradcheck(lambda x: mdca(x, t), (z,))
    zb = torch.randn(10, generator=g, dtype=torch.float64, requires_grad=True)
    yb = torch.randint(0, 2, (10,), generator=g).double()
    assert gradcheck(lambda x: dca(x, yb), (zb,))
    assert gradcheck(lambda x: mdca(x, yb), (zb,))
    # the MDCA gradient against a plain autograd version of the formula
    used = t != -100
    p = torch.softmax(z[used], 1)
    y = torch.nn.functional.one_hot(t[used], 4).double()
    plain = (p.mean(0) - y.mean(0)).abs().mean()
    torch.testing.assert_close(
        torch.autograd.grad(mdca(z, t), z)[0], torch.autograd.grad(plain, z)[0], **TOL
    )


@pytest.mark.parametrize("module", [DCALoss, MDCALoss])
def test_penalty_modules_scale_by_beta_exactly(module):
    fn = dca if module is DCALoss else mdca
    g = torch.Generator().manual_seed(23)
    z = torch.randn(16, 3, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 3, (16,), generator=g)
    t[0] = 2
    base = fn(z, t, ignore_index=2)
    assert base.item() > 0
    for beta in [0.0, 0.5, 3.0, 25.0]:
        out = module(beta=beta, ignore_index=2)(z, t)
        assert torch.equal(out, beta * base)
        (g_mod,) = torch.autograd.grad(out, z, retain_graph=True)
        (g_fn,) = torch.autograd.grad(base, z, retain_graph=True)
        torch.testing.assert_close(g_mod, beta * g_fn, **TOL)
    assert "beta=3.0" in repr(module(beta=3.0)) and module().beta == 1.0
    assert list(module().state_dict()) == []


def test_confidence_penalty_module_scales_by_beta_and_equals_functional():
    g = torch.Generator().manual_seed(24)
    z = torch.randn(8, 4, generator=g, dtype=torch.float64)
    t = torch.randint(0, 4, (8,), generator=g)
    t[2] = -5
    for beta in [0.0, 0.25, 4.0]:
        loss = ConfidencePenaltyLoss(beta=beta, ignore_index=-5, reduction="sum")
        assert torch.equal(
            loss(z, t), confidence_penalty(z, t, beta=beta, ignore_index=-5, reduction="sum")
        )
    unit = confidence_penalty(z, t, ignore_index=-5, reduction="none")
    torch.testing.assert_close(
        ConfidencePenaltyLoss(beta=4.0, ignore_index=-5, reduction="none")(z, t), 4.0 * unit, **TOL
    )
    assert torch.equal(ConfidencePenaltyLoss()(z), confidence_penalty(z))
    assert "beta=0.25" in repr(ConfidencePenaltyLoss(beta=0.25))


# ---------------------------------------------------------------- properness harness


def test_regularisers_are_not_proper():
    nll = expected(lambda z, y: log_score(z, y), Q)
    torch.testing.assert_close(argmin_forecast(nll, 3), Q, rtol=0, atol=1e-6)  # harness ok
    # confidence penalty: flatter than q, at the stationary point of
    # sum_c q_c (-log p_c) + beta sum_c p_c log p_c on the simplex:
    # -q_c / p_c + beta log p_c is the same for every class
    beta = 0.5
    p = argmin_forecast(lambda z: nll(z) + confidence_penalty(z[None], beta=beta), 3)
    stationarity = -Q / p + beta * p.log()
    assert (stationarity - stationarity.mean()).abs().max() < 1e-6
    assert entropy(p) > entropy(Q) + 0.05 and (p - Q).abs().max() > 0.05
    # DCA and MDCA per item: the expected penalty rewards max p, so the argmin is sharper
    for fn in (dca, mdca):
        reg = expected(lambda z, y, fn=fn: fn(z, y), Q)
        p = argmin_forecast(lambda z, reg=reg: nll(z) + 2.0 * reg(z), 3)
        assert p[0] > Q[0] + 0.05, fn.__name__
    # MDCA at batch level (label frequencies = q, one shared forecast) vanishes at q,
    # so log score + MDCA of such a batch is minimised by q
    t = torch.tensor([0] * 12 + [1] * 5 + [2] * 3)
    p = argmin_forecast(lambda z: log_score(z.expand(20, 3), t) + 2.0 * mdca(z.expand(20, 3), t), 3)
    torch.testing.assert_close(
        p, torch.tensor([0.6, 0.25, 0.15], dtype=torch.float64), rtol=0, atol=1e-5
    )


def test_label_smoothing_is_not_proper():
    eps = 0.3
    smoothed = expected(lambda z, y: log_score(z, y, label_smoothing=eps), Q)
    torch.testing.assert_close(
        argmin_forecast(smoothed, 3), (1 - eps) * Q + eps / 3, rtol=0, atol=1e-6
    )


# ----------------------------------------------------------------------- Modules, inputs


def test_modules_equal_functional_and_keep_weight():
    g = torch.Generator().manual_seed(8)
    z = torch.randn(12, 4, generator=g, dtype=torch.float64)
    t = torch.randint(0, 4, (12,), generator=g)
    w = torch.rand(4, generator=g, dtype=torch.float64)
    focal = FocalLoss(gamma="adaptive", weight=w, reduction="sum")
    assert torch.equal(focal(z, t), focal_loss(z, t, gamma="adaptive", weight=w, reduction="sum"))
    assert "weight" in focal.state_dict() and "gamma='adaptive'" in repr(focal)
    assert torch.equal(MMCELoss(width=0.2, squared=True)(z, t), mmce(z, t, width=0.2, squared=True))
    assert torch.equal(SoftBinnedECELoss(bins=7, p=1.0)(z, t), soft_binned_ece(z, t, bins=7, p=1.0))


BAD = [
    (
        lambda: focal_loss(torch.zeros(2, 3), torch.tensor([0, 1]), gamma=-1.0),
        ValueError,
        r"gamma: expected a finite number >= 0",
    ),
    (
        lambda: focal_loss(torch.zeros(2, 3), torch.tensor([0, 1]), gamma="auto"),
        ValueError,
        r"gamma: expected a number >= 0 or 'adaptive'",
    ),
    (
        lambda: focal_loss(torch.zeros(2, 1), torch.tensor([0, 2])),
        ValueError,
        r"target: expected binary labels in \{0, 1\}, got 2 at position 1",
    ),
    (
        lambda: focal_loss(torch.tensor([[float("nan"), 0.0]]), torch.tensor([0])),
        ValueError,
        r"logits: expected finite values",
    ),
    (
        lambda: mmce(torch.zeros(2, 3), torch.tensor([0, 3])),
        ValueError,
        r"target: expected class indices in \[0, 2\], got 3 at position 1",
    ),
    (
        lambda: mmce(torch.zeros(2, 3), torch.tensor([0, 1]), width=0.0),
        ValueError,
        r"width: expected a finite number > 0",
    ),
    (
        lambda: mmce(torch.zeros(2, 3), torch.tensor([0, 1]), width=1e-4),
        ValueError,
        r"width: expected a kernel width >= 1e-3",
    ),
    (
        lambda: mmce(torch.tensor([[0.0, float("inf")]]), torch.tensor([0])),
        ValueError,
        r"logits: expected finite values",
    ),
    (
        lambda: soft_binned_ece(torch.zeros(2, 3), torch.tensor([0.0, 1.0])),
        ValueError,
        r"target: expected integer class indices",
    ),
    (
        lambda: soft_binned_ece(torch.zeros(2, 3), torch.tensor([0, 1]), bins=0),
        ValueError,
        r"bins: expected an int >= 1",
    ),
    (
        lambda: soft_binned_ece(torch.zeros(2, 3), torch.tensor([0, 1]), p=0.5),
        ValueError,
        r"p: expected a number >= 1",
    ),
    (lambda: FocalLoss(gamma="x"), ValueError, r"gamma: expected"),
    (lambda: FocalLoss(reduction="avg"), ValueError, r"reduction: expected one of"),
    (lambda: MMCELoss(width=-1.0), ValueError, r"width: expected a finite number > 0"),
    (lambda: MMCELoss(width=1e-4), ValueError, r"width: expected a kernel width >= 1e-3"),
    (lambda: SoftBinnedECELoss(p=0.5), ValueError, r"p: expected a number >= 1"),
    (lambda: SoftBinnedECELoss(temperature=0.0), ValueError, r"temperature: expected"),
    (
        lambda: confidence_penalty(torch.zeros(2, 3), beta=-0.1),
        ValueError,
        r"beta: expected a finite number >= 0",
    ),
    (
        lambda: confidence_penalty(torch.zeros(2, 3), beta=float("nan")),
        ValueError,
        r"beta: expected a finite number >= 0",
    ),
    (
        lambda: confidence_penalty(torch.zeros(2, 3), beta="1"),
        TypeError,
        r"beta: expected a number",
    ),
    (
        lambda: confidence_penalty(torch.zeros(4)),
        ValueError,
        r"logits: expected multiclass logits \(N, C, \*\) with C >= 2 when no target",
    ),
    (
        lambda: confidence_penalty(torch.zeros(4, 1)),
        ValueError,
        r"logits: expected multiclass logits",
    ),
    (
        lambda: confidence_penalty(torch.zeros(2, 3), reduction="avg"),
        ValueError,
        r"reduction: expected one of",
    ),
    (
        lambda: confidence_penalty(torch.zeros(2, 3, dtype=torch.long)),
        ValueError,
        r"logits: expected a floating-point tensor",
    ),
    (
        lambda: confidence_penalty(torch.tensor([[0.0, float("nan")]])),
        ValueError,
        r"logits: expected finite values, found NaN or \+Inf",
    ),
    (
        lambda: confidence_penalty(torch.full((1, 2), float("-inf"))),
        ValueError,
        r"logits: expected at least one finite logit per item",
    ),
    (
        lambda: confidence_penalty(torch.zeros(2, 3), torch.tensor([0, 3])),
        ValueError,
        r"target: expected class indices in \[0, 2\], got 3 at position 1",
    ),
    (
        lambda: confidence_penalty(torch.zeros(2, 3), ignore_index=1.5),
        TypeError,
        r"ignore_index: expected an int",
    ),
    (
        lambda: confidence_penalty(torch.tensor([0.0, float("inf")]), torch.ones(2)),
        ValueError,
        r"logits: expected finite values",
    ),
    (
        lambda: dca(torch.zeros(2, 3), torch.tensor([0.0, 1.0])),
        ValueError,
        r"target: expected integer class indices",
    ),
    (
        lambda: dca(torch.zeros(2), torch.tensor([0.0, 2.0])),
        ValueError,
        r"target: expected binary labels in \{0, 1\}, got 2.0 at position 1",
    ),
    (
        lambda: dca(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)),
        ValueError,
        r"logits: expected a non-empty tensor",
    ),
    (
        lambda: mdca(torch.zeros(2, 3), torch.tensor([0, -2])),
        ValueError,
        r"target: expected class indices in \[0, 2\], got -2 at position 1",
    ),
    (
        lambda: mdca(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long)),
        ValueError,
        r"target: expected shape",
    ),
    (
        lambda: mdca(torch.tensor([[float("-inf"), 0.0]]), torch.tensor([0])),
        ValueError,
        r"logits: the true class has logit -inf",
    ),
    (lambda: ConfidencePenaltyLoss(beta=-1.0), ValueError, r"beta: expected a finite number"),
    (lambda: ConfidencePenaltyLoss(reduction="avg"), ValueError, r"reduction: expected one of"),
    (lambda: DCALoss(beta=float("inf")), ValueError, r"beta: expected a finite number >= 0"),
    (lambda: MDCALoss(beta=True), TypeError, r"beta: expected a number"),
    (lambda: MDCALoss(ignore_index=None), TypeError, r"ignore_index: expected an int"),
]


@pytest.mark.parametrize("case", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input(case):
    call, exc, match = case
    with pytest.raises(exc, match=match):
        call()


# ------------------------------- issue 9: finite gradients at 0, layouts of float targets

_SET_LEVEL = {
    "mmce": lambda z, t, **k: mmce(z, t, **k),
    "mmce_squared": lambda z, t, **k: mmce(z, t, squared=True, **k),
    "soft_binned_ece": lambda z, t, **k: soft_binned_ece(z, t, **k),
    "soft_binned_ece_p1": lambda z, t, **k: soft_binned_ece(z, t, p=1.0, **k),
    "soft_binned_ece_p3_noroot": lambda z, t, **k: soft_binned_ece(z, t, p=3.0, root=False, **k),
    "dca": lambda z, t, **k: dca(z, t, **k),
    "mdca": lambda z, t, **k: mdca(z, t, **k),
    "confidence_penalty": lambda z, t, **k: confidence_penalty(z, t, **k),
    "focal": lambda z, t, **k: focal_loss(z, t, **k),
}


@pytest.mark.parametrize("name", list(_SET_LEVEL))
@pytest.mark.parametrize("margin", [20.0, 1e2, 1e3])
@pytest.mark.parametrize("correct", [True, False], ids=["all-correct", "all-wrong"])
def test_regularisers_have_finite_gradients_on_saturated_batches(name, margin, correct):
    # a saturated all-correct batch has value 0: sqrt / ^(1/p) at 0 gave NaN gradients
    t = torch.tensor([0, 1, 2, 1, 0])
    z = torch.zeros(5, 3)
    z[torch.arange(5), t if correct else (t + 1) % 3] = margin
    z.requires_grad_(True)
    value = _SET_LEVEL[name](z, t)
    (grad,) = torch.autograd.grad(value, z)
    assert torch.isfinite(value) and torch.isfinite(grad).all(), (value, grad)
    if correct and margin >= 1e2 and name not in ("confidence_penalty", "focal"):
        assert value.item() == 0.0
    zb = torch.full((4,), margin) * torch.tensor([1.0, -1.0, 1.0, -1.0])
    yb = (zb > 0).float() if correct else (zb < 0).float()
    zb.requires_grad_(True)
    (gb,) = torch.autograd.grad(_SET_LEVEL[name](zb, yb), zb)
    assert torch.isfinite(gb).all()


def test_root_forms_equal_the_root_of_the_smooth_forms_and_gradcheck():
    g = torch.Generator().manual_seed(40)
    z = torch.randn(30, 4, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 4, (30,), generator=g)
    torch.testing.assert_close(mmce(z, t) ** 2, mmce(z, t, squared=True), rtol=1e-12, atol=0)
    torch.testing.assert_close(
        soft_binned_ece(z, t, p=3.0) ** 3,
        soft_binned_ece(z, t, p=3.0, root=False),
        rtol=1e-12,
        atol=0,
    )
    assert gradcheck(lambda x: mmce(x, t), (z,))
    assert gradcheck(lambda x: soft_binned_ece(x, t, p=3.0, temperature=0.05), (z,))


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0, 3.0, 5.0, "adaptive"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_focal_finite_gradients_saturated_all_correct_and_all_wrong(gamma, dtype):
    t = torch.tensor([0, 1, 2])
    for shift in (0, 1):
        z = torch.zeros(3, 3, dtype=dtype)
        z[torch.arange(3), (t + shift) % 3] = 1e3
        z.requires_grad_(True)
        value = focal_loss(z, t, gamma=gamma)
        (grad,) = torch.autograd.grad(value, z)
        assert torch.isfinite(value) and torch.isfinite(grad).all()


def test_class_probability_targets_in_regularisers():
    # never read as independent sigmoids: the confidence readings raise, mdca uses the
    # mean target probabilities, multilabel=True is the per-element binary reading
    g = torch.Generator().manual_seed(41)
    z = torch.randn(12, 3, generator=g, dtype=torch.float64)
    t = torch.randint(0, 3, (12,), generator=g)
    one_hot = F.one_hot(t, 3).double()
    for fn in (focal_loss, mmce, soft_binned_ece, dca):
        with pytest.raises(ValueError, match=r"^target: \w+ needs class indices"):
            fn(z, one_hot)
        torch.testing.assert_close(
            fn(z, one_hot, multilabel=True), fn(z.reshape(-1), one_hot.reshape(-1))
        )
    torch.testing.assert_close(mdca(z, one_hot), mdca(z, t), rtol=1e-12, atol=1e-15)
    q = torch.softmax(torch.randn(12, 3, generator=g, dtype=torch.float64), 1)
    ref = (torch.softmax(z, 1).mean(0) - q.mean(0)).abs().mean()
    torch.testing.assert_close(mdca(z, q), ref, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(confidence_penalty(z, q), confidence_penalty(z), rtol=0, atol=0)


@pytest.mark.parametrize("name", list(_SET_LEVEL))
def test_binary_head_n_by_1_equals_binary_in_regularisers(name):
    g = torch.Generator().manual_seed(42)
    z = torch.randn(10, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 2, (10,), generator=g).double()
    ref = _SET_LEVEL[name](z, y)
    torch.testing.assert_close(_SET_LEVEL[name](z[:, None], y), ref, rtol=0, atol=0)
    torch.testing.assert_close(_SET_LEVEL[name](z[:, None], y[:, None]), ref, rtol=0, atol=0)
