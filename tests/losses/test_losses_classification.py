"""Tests for the classification scoring-rule Modules in torchcal.losses."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchcal.functional as TF
from torchcal.losses import (
    BrierLoss,
    ConfidencePenaltyLoss,
    DCALoss,
    LogScoreLoss,
    MDCALoss,
    RPSLoss,
    SphericalLoss,
)

PAIRS = [
    (LogScoreLoss, TF.log_score),
    (BrierLoss, TF.brier_score),
    (SphericalLoss, TF.spherical_score),
    (RPSLoss, TF.ranked_probability_score),
]
IDS = [m.__name__ for m, _ in PAIRS]


@pytest.mark.parametrize(("module", "fn"), PAIRS, ids=IDS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_module_equals_functional(module, fn, reduction):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 4, (6, 2), generator=g)
    t[2, 1] = 3
    w = torch.rand(4, generator=g, dtype=torch.float64)
    loss = module(weight=w, ignore_index=3, reduction=reduction)
    out = loss(z, t)
    expected = fn(z, t, weight=w, ignore_index=3, reduction=reduction)
    assert torch.equal(out, expected)
    (g_mod,) = torch.autograd.grad(out.sum(), z)
    (g_fn,) = torch.autograd.grad(expected.sum(), z)
    assert torch.equal(g_mod, g_fn)
    zb = torch.randn(5, generator=g, dtype=torch.float64)
    yb = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0])
    assert torch.equal(module(reduction=reduction)(zb, yb), fn(zb, yb, reduction=reduction))


@pytest.mark.parametrize(("module", "fn"), PAIRS, ids=IDS)
def test_weight_is_a_buffer_in_state_dict_and_moves_with_the_module(module, fn):
    w = torch.tensor([1.0, 2.0, 0.5])
    loss = module(weight=w)
    assert isinstance(loss, nn.Module)
    assert "weight" in loss.state_dict()
    assert torch.equal(loss.state_dict()["weight"], w)
    assert [name for name, _ in loss.named_parameters()] == []
    loss = loss.double()  # dtype casts keep the weight's own dtype (issue 9, item 6)
    assert loss.weight.dtype == torch.float32 and torch.equal(loss.weight, w)
    fresh = module(weight=torch.zeros(3, dtype=torch.float64))
    fresh.load_state_dict(loss.state_dict())
    assert torch.equal(fresh.weight, w.double())
    assert "weight" not in module().state_dict()
    assert "reduction='mean'" in repr(loss) and "ignore_index=-100" in repr(loss)


def test_weighted_log_score_loss_equals_cross_entropy_loss():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(8, 5, 3, 3, generator=g, dtype=torch.float64)
    t = torch.randint(0, 5, (8, 3, 3), generator=g)
    t[0, 0, 0] = 4
    w = torch.rand(5, generator=g, dtype=torch.float64)
    ours = LogScoreLoss(weight=w, ignore_index=4)(z, t)
    theirs = nn.CrossEntropyLoss(weight=w, ignore_index=4)(z, t)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


BAD_INIT = [
    ({"reduction": "avg"}, ValueError, r"reduction: expected one of"),
    ({"reduction": None}, ValueError, r"reduction: expected one of"),
    ({"ignore_index": 1.0}, TypeError, r"ignore_index: expected an int"),
    ({"weight": torch.tensor([1, 2])}, ValueError, r"weight: expected a floating-point tensor"),
    ({"weight": [1.0, 2.0]}, TypeError, r"weight: expected a torch.Tensor"),
]


@pytest.mark.parametrize(("module", "fn"), PAIRS, ids=IDS)
@pytest.mark.parametrize("case", BAD_INIT, ids=[str(c[0]) for c in BAD_INIT])
def test_bad_constructor_arguments(module, fn, case):
    kwargs, exc, match = case
    with pytest.raises(exc, match=match):
        module(**kwargs)


BAD_FORWARD = [
    (
        "nan",
        torch.tensor([[0.0, float("nan")]]),
        torch.tensor([0]),
        {},
        r"logits: expected finite values",
    ),
    (
        "class out of range",
        torch.zeros(3, 2),
        torch.tensor([0, 2, 1]),
        {},
        r"target: expected class indices in \[0, 1\], got 2 at position 1",
    ),
    (
        "float multiclass target",
        torch.zeros(3, 2),
        torch.tensor([0.0, 1.0, 1.0]),
        {},
        r"target: expected integer class indices",
    ),
    (
        "binary label",
        torch.zeros(3),
        torch.tensor([0.0, 0.5, 1.0]),
        {},
        r"target: expected binary labels in \{0, 1\}, got 0.5 at position 1",
    ),
    ("shape", torch.zeros(3, 2), torch.zeros(2, dtype=torch.long), {}, r"target: expected shape"),
    (
        "empty",
        torch.zeros(0, 2),
        torch.zeros(0, dtype=torch.long),
        {},
        r"logits: expected a non-empty tensor",
    ),
    (
        "weight size",
        torch.zeros(3, 2),
        torch.tensor([0, 1, 1]),
        {"weight": torch.ones(3)},
        r"weight: expected a 1-d tensor of 2 class weights",
    ),
    (
        "true class masked",
        torch.tensor([[float("-inf"), 0.0]]),
        torch.tensor([0]),
        {},
        r"logits: the true class has logit -inf",
    ),
]


@pytest.mark.parametrize(("module", "fn"), PAIRS, ids=IDS)
@pytest.mark.parametrize("case", BAD_FORWARD, ids=[c[0] for c in BAD_FORWARD])
def test_bad_forward_inputs(module, fn, case):
    _, logits, target, kwargs, match = case
    with pytest.raises(ValueError, match=match):
        module(**kwargs)(logits, target)


@pytest.mark.parametrize(("module", "fn"), PAIRS, ids=IDS)
def test_module_trains_a_linear_model(module, fn):
    torch.manual_seed(0)
    x = torch.randn(256, 3)
    t = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()  # 3 ordered classes
    model = nn.Linear(3, 3)
    loss_fn = module()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    first = loss_fn(model(x), t).item()
    for _ in range(50):
        opt.zero_grad()
        loss = loss_fn(model(x), t)
        loss.backward()
        opt.step()
    assert loss.item() < 0.7 * first


# ------------------------------------------------------------------- label smoothing


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5])
def test_label_smoothing_equals_cross_entropy_for_every_option_combination(eps):
    g = torch.Generator().manual_seed(30)
    for shape, weighted, ignore, reduction in itertools.product(
        [(7, 5), (4, 3, 2, 3)], [False, True], [None, -100, 2], ["mean", "sum", "none"]
    ):
        z = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
        t = torch.randint(0, shape[1], shape[:1] + shape[2:], generator=g)
        kwargs = {"reduction": reduction, "label_smoothing": eps}
        if ignore is not None:
            t.view(-1)[::3] = ignore
            kwargs["ignore_index"] = ignore
        if weighted:
            kwargs["weight"] = torch.rand(shape[1], generator=g, dtype=torch.float64) + 0.1
        ours = TF.log_score(z, t, **kwargs)
        theirs = F.cross_entropy(z, t, **kwargs)
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
        module = LogScoreLoss(**kwargs)(z, t)
        assert torch.equal(module, ours)
        (g_ours,) = torch.autograd.grad(ours.sum(), z)
        (g_theirs,) = torch.autograd.grad(theirs.sum(), z)
        torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-12)


def test_label_smoothing_gradcheck_float32_and_module_state():
    g = torch.Generator().manual_seed(31)
    z = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 3, -100, 1, 2])
    w = torch.rand(4, generator=g, dtype=torch.float64) + 0.1
    assert torch.autograd.gradcheck(
        lambda x: TF.log_score(x, t, weight=w, label_smoothing=0.2), (z,)
    )
    # float32 logits with a float32 weight; fp16 logits are computed in float32
    z32 = z.detach().float()
    torch.testing.assert_close(
        TF.log_score(z32, t, weight=w.float(), label_smoothing=0.2),
        F.cross_entropy(z32, t, weight=w.float(), label_smoothing=0.2),
    )
    out16 = TF.log_score(z32.half(), t, label_smoothing=0.2)
    assert out16.dtype == torch.float32
    torch.testing.assert_close(out16, F.cross_entropy(z32.half().float(), t, label_smoothing=0.2))
    loss = LogScoreLoss(label_smoothing=0.25)
    assert loss.label_smoothing == 0.25 and "label_smoothing=0.25" in repr(loss)
    assert "label_smoothing" not in repr(LogScoreLoss())
    # the default path is untouched
    assert torch.equal(LogScoreLoss()(z, t), TF.log_score(z, t))


BAD_SMOOTHING = [
    (
        lambda: TF.log_score(torch.zeros(2, 3), torch.tensor([0, 1]), label_smoothing=1.0),
        ValueError,
        r"label_smoothing: expected a number in \[0, 1\), got 1.0",
    ),
    (
        lambda: TF.log_score(torch.zeros(2, 3), torch.tensor([0, 1]), label_smoothing=-0.1),
        ValueError,
        r"label_smoothing: expected a number in \[0, 1\)",
    ),
    (
        lambda: TF.log_score(torch.zeros(2, 3), torch.tensor([0, 1]), label_smoothing=float("nan")),
        ValueError,
        r"label_smoothing: expected a number in \[0, 1\)",
    ),
    (
        lambda: TF.log_score(torch.zeros(2, 3), torch.tensor([0, 1]), label_smoothing="0.1"),
        TypeError,
        r"label_smoothing: expected a number",
    ),
    (
        lambda: TF.log_score(torch.zeros(3), torch.tensor([0.0, 1.0, 1.0]), label_smoothing=0.1),
        ValueError,
        r"label_smoothing: supported for multiclass logits",
    ),
    (
        lambda: TF.log_score(
            torch.tensor([[0.0, float("-inf"), 1.0]]), torch.tensor([0]), label_smoothing=0.1
        ),
        ValueError,
        r"logits: expected finite values, found NaN or Inf at position \(0, 1\)",
    ),
    (
        lambda: TF.log_score(torch.zeros(2, 3), torch.tensor([0, 3]), label_smoothing=0.1),
        ValueError,
        r"target: expected class indices in \[0, 2\], got 3",
    ),
    (lambda: LogScoreLoss(label_smoothing=1.5), ValueError, r"label_smoothing: expected"),
]


@pytest.mark.parametrize("case", BAD_SMOOTHING, ids=[str(i) for i in range(len(BAD_SMOOTHING))])
def test_label_smoothing_bad_input(case):
    call, exc, match = case
    with pytest.raises(exc, match=match):
        call()


# ---------------------------------------------------------------- regulariser Modules


def test_regulariser_modules_equal_functional_and_validate_in_init():
    g = torch.Generator().manual_seed(32)
    z = torch.randn(10, 3, generator=g, dtype=torch.float64)
    t = torch.randint(0, 3, (10,), generator=g)
    t[4] = -1
    for reduction in ["mean", "sum", "none"]:
        assert torch.equal(
            ConfidencePenaltyLoss(beta=0.3, ignore_index=-1, reduction=reduction)(z, t),
            TF.confidence_penalty(z, t, beta=0.3, ignore_index=-1, reduction=reduction),
        )
    assert torch.equal(DCALoss(ignore_index=-1)(z, t), TF.dca(z, t, ignore_index=-1))
    assert torch.equal(MDCALoss(ignore_index=-1)(z, t), TF.mdca(z, t, ignore_index=-1))
    for module in (ConfidencePenaltyLoss, DCALoss, MDCALoss):
        with pytest.raises(ValueError, match=r"beta: expected a finite number >= 0"):
            module(beta=-0.5)
        with pytest.raises(TypeError, match=r"ignore_index: expected an int"):
            module(ignore_index="x")


def test_log_score_plus_penalties_train_a_linear_model():
    torch.manual_seed(0)
    x = torch.randn(256, 3)
    t = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    model = nn.Linear(3, 3)
    nll = LogScoreLoss(label_smoothing=0.05)
    penalties = [ConfidencePenaltyLoss(beta=0.1), DCALoss(beta=1.0), MDCALoss(beta=1.0)]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    first = TF.log_score(model(x), t).item()
    for _ in range(50):
        opt.zero_grad()
        z = model(x)
        loss = nll(z, t) + sum(p(z, t) for p in penalties)
        loss.backward()
        opt.step()
    assert TF.log_score(model(x), t).item() < 0.7 * first
