"""Tests for torchcal.functional.scoring: peers, closed forms, gradients, properness, inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _gradcheck_cases import weighted_multiclass
from _properness import argmin_forecast, lbfgs_minimise
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck, gradgradcheck

from torchcal.functional import (
    brier_score,
    log_score,
    ranked_probability_score,
    spherical_score,
    validation_enabled,
)
from torchcal.functional.calibration.nll import nll_items

RULES = [log_score, brier_score, spherical_score, ranked_probability_score]
RULE_IDS = [f.__name__ for f in RULES]
TOL = {"rtol": 1e-12, "atol": 1e-12}


def _onehot(target: torch.Tensor, num_classes: int) -> torch.Tensor:
    return F.one_hot(target, num_classes).movedim(-1, 1).double()


def reference(rule, logits: torch.Tensor, target: torch.Tensor) -> np.ndarray:
    """Independent float64 per-item reference written from the textbook formulas."""
    z = logits.double().numpy()
    if target.shape == logits.shape:  # binary: forecast (1 - p, p)
        p = 1.0 / (1.0 + np.exp(-z))
        y = target.double().numpy()
        if rule is log_score:
            return -(y * np.log(p) + (1 - y) * np.log1p(-p))
        if rule is spherical_score:
            return 1.0 - np.where(y == 1, p, 1 - p) / np.sqrt(p**2 + (1 - p) ** 2)
        return (p - y) ** 2
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = _onehot(target, z.shape[1]).numpy()
    p_y = (p * y).sum(axis=1)
    if rule is log_score:
        return -np.log(p_y)
    if rule is brier_score:
        return ((p - y) ** 2).sum(axis=1)
    if rule is spherical_score:
        return 1.0 - p_y / np.sqrt((p**2).sum(axis=1))
    return ((np.cumsum(p, axis=1) - np.cumsum(y, axis=1))[:, :-1] ** 2).sum(axis=1)


# ----------------------------------------------------------------- peers and references


def test_log_score_matches_cross_entropy_for_every_option_combination():
    g = torch.Generator().manual_seed(1)
    layouts = [(7, 5), (4, 3, 2, 3)]
    for shape, weighted, ignore, reduction in itertools.product(
        layouts, [False, True], [None, -100, 2], ["mean", "sum", "none"]
    ):
        z = torch.randn(*shape, generator=g, dtype=torch.float64) * 3
        t = torch.randint(0, shape[1], shape[:1] + shape[2:], generator=g)
        kwargs = {"reduction": reduction}
        if ignore is not None:
            t.view(-1)[::3] = ignore
            kwargs["ignore_index"] = ignore
        if weighted:
            kwargs["weight"] = torch.rand(shape[1], generator=g, dtype=torch.float64) + 0.1
        ours = log_score(z, t, **kwargs)
        theirs = F.cross_entropy(z, t, **kwargs)
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, **TOL)


def test_log_score_all_ignored_is_nan_like_cross_entropy():
    z = torch.randn(3, 4, dtype=torch.float64)
    t = torch.full((3,), -100)
    assert torch.isnan(log_score(z, t)) and torch.isnan(F.cross_entropy(z, t))
    assert log_score(z, t, reduction="sum").item() == 0.0


def test_binary_rules_match_scoringrules_and_properscoring():
    sr = pytest.importorskip("scoringrules")
    ps = pytest.importorskip("properscoring")
    g = torch.Generator().manual_seed(2)
    # |z| <~ 8: beyond that the peers' log(1 - p) on p = sigmoid(z) itself loses 1e-12
    z = torch.randn(200, generator=g, dtype=torch.float64) * 2.5
    y = torch.randint(0, 2, (200,), generator=g).double()
    p = torch.sigmoid(z).numpy()
    yn = y.numpy()
    np.testing.assert_allclose(
        log_score(z, y, reduction="none").numpy(), sr.log_score(yn, p), rtol=1e-12, atol=1e-12
    )
    brier = brier_score(z, y, reduction="none").numpy()
    np.testing.assert_allclose(brier, sr.brier_score(yn, p), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(brier, ps.brier_score(yn, p), rtol=1e-12, atol=1e-12)
    # binary RPS: two ordered categories (scoringrules counts categories from 1)
    rps = ranked_probability_score(z, y, reduction="none").numpy()
    np.testing.assert_allclose(
        rps, sr.rps_score(yn + 1, np.stack([1 - p, p], -1)), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("num_classes", [2, 5, 11])
def test_multiclass_rules_match_scoringrules(num_classes):
    sr = pytest.importorskip("scoringrules")
    g = torch.Generator().manual_seed(num_classes)
    z = torch.randn(64, num_classes, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, num_classes, (64,), generator=g)
    p = torch.softmax(z, 1).numpy()
    onehot = F.one_hot(t, num_classes).double().numpy()
    # sr.rps_score: sum over k = 1..K of squared CDF differences (last term 0), unnormalised
    np.testing.assert_allclose(
        ranked_probability_score(z, t, reduction="none").numpy(),
        sr.rps_score(t.numpy() + 1, p),
        rtol=1e-12,
        atol=1e-12,
    )
    # multiclass Brier = sum over classes of the binary Brier of each one-vs-rest event
    np.testing.assert_allclose(
        brier_score(z, t, reduction="none").numpy(),
        sr.brier_score(onehot, p).sum(-1),
        rtol=1e-12,
        atol=1e-12,
    )
    # log score of the true class = binary log score of the event "class y occurred"
    p_y = (p * onehot).sum(-1)
    np.testing.assert_allclose(
        log_score(z, t, reduction="none").numpy(),
        sr.log_score(np.ones_like(p_y), p_y),
        rtol=1e-12,
        atol=1e-12,
    )


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_rules_match_float64_reference_multiclass_and_binary(rule):
    g = torch.Generator().manual_seed(3)
    z = torch.randn(5, 6, 2, 3, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, 6, (5, 2, 3), generator=g)
    np.testing.assert_allclose(
        rule(z, t, reduction="none").numpy(), reference(rule, z, t), rtol=1e-12, atol=1e-12
    )
    zb = torch.randn(4, 7, generator=g, dtype=torch.float64) * 3
    yb = torch.randint(0, 2, (4, 7), generator=g).double()
    np.testing.assert_allclose(
        rule(zb, yb, reduction="none", multilabel=True).numpy(),
        reference(rule, zb, yb),
        rtol=1e-12,
        atol=1e-12,
    )


# ------------------------------------------- class-probability targets, multilabel, (N, 1)


def expected_reference(
    rule, logits: torch.Tensor, q: torch.Tensor, weight: torch.Tensor | None = None
) -> np.ndarray:
    """``sum_c w_c q_c S(p, c)`` per item, from the per-class textbook reference (numpy)."""
    num_classes = logits.shape[1]
    w = np.ones(num_classes) if weight is None else weight.double().numpy()
    qn = q.double().numpy()
    total = np.zeros(logits.shape[:1] + logits.shape[2:])
    for c in range(num_classes):
        t = torch.full(logits.shape[:1] + logits.shape[2:], c, dtype=torch.long)
        total += w[c] * qn[:, c] * reference(rule, logits, t)
    return total


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_float_one_hot_target_equals_class_indices(rule):
    # issue 9 item 2: a float one-hot (N, C) target is read as class probabilities, exactly
    # as F.cross_entropy does, never as independent sigmoids
    g = torch.Generator().manual_seed(21)
    z = torch.randn(7, 5, 3, generator=g, dtype=torch.float64) * 2
    t = torch.randint(0, 5, (7, 3), generator=g)
    one_hot = _onehot(t, 5)
    w = torch.rand(5, generator=g, dtype=torch.float64) + 0.1
    torch.testing.assert_close(
        rule(z, one_hot, reduction="none"), rule(z, t, reduction="none"), **TOL
    )
    torch.testing.assert_close(rule(z, one_hot), rule(z, t), **TOL)
    torch.testing.assert_close(
        rule(z, one_hot, weight=w, reduction="sum"), rule(z, t, weight=w, reduction="sum"), **TOL
    )
    # F.cross_entropy's 'mean' with probability targets divides by N, not by the weights
    torch.testing.assert_close(
        rule(z, one_hot, weight=w), rule(z, t, weight=w, reduction="sum") / t.numel(), **TOL
    )


def test_log_score_probability_targets_match_cross_entropy():
    g = torch.Generator().manual_seed(22)
    z = torch.randn(6, 4, 2, generator=g, dtype=torch.float64) * 3
    q = torch.softmax(torch.randn(6, 4, 2, generator=g, dtype=torch.float64), 1)
    w = torch.rand(4, generator=g, dtype=torch.float64) + 0.1
    for weight, eps, reduction in itertools.product([None, w], [0.0, 0.2], ["mean", "sum", "none"]):
        ours = log_score(z, q, weight=weight, label_smoothing=eps, reduction=reduction)
        ref = F.cross_entropy(z, q, weight=weight, label_smoothing=eps, reduction=reduction)
        torch.testing.assert_close(ours, ref, **TOL)
    # the numbers: a one-hot float target is softmax cross-entropy (1.891), not
    # the mean of independent sigmoids (0.758), which needs multilabel=True
    zi = torch.randn(32, 10, generator=torch.Generator().manual_seed(0))
    yi = F.one_hot(
        torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(1)), 10
    ).float()
    torch.testing.assert_close(log_score(zi, yi), F.cross_entropy(zi, yi))
    torch.testing.assert_close(
        log_score(zi, yi, multilabel=True), F.binary_cross_entropy_with_logits(zi, yi)
    )
    assert (log_score(zi, yi) - log_score(zi, yi, multilabel=True)).abs() > 0.5


@pytest.mark.parametrize(
    "rule",
    [brier_score, spherical_score, ranked_probability_score],
    ids=["brier_score", "spherical_score", "ranked_probability_score"],
)
def test_probability_targets_are_the_expected_score(rule):
    g = torch.Generator().manual_seed(23)
    z = torch.randn(8, 5, 2, generator=g, dtype=torch.float64) * 2
    q = torch.softmax(torch.randn(8, 5, 2, generator=g, dtype=torch.float64) * 2, 1)
    q[0, :, 0] = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    w = torch.rand(5, generator=g, dtype=torch.float64) + 0.1
    np.testing.assert_allclose(
        rule(z, q, reduction="none").numpy(), expected_reference(rule, z, q), rtol=1e-12, atol=1e-12
    )
    ref_w = expected_reference(rule, z, q, w)
    np.testing.assert_allclose(
        rule(z, q, weight=w, reduction="none").numpy(), ref_w, rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(rule(z, q, weight=w).item(), ref_w.mean(), rtol=1e-12)
    zg = z.clone().requires_grad_(True)
    assert gradcheck(lambda x: rule(x, q, weight=w), (zg,))


def test_probability_brier_is_distance_plus_target_entropy():
    # sum_c q_c ||p - e_c||^2 = ||p - q||^2 + sum_c q_c (1 - q_c): the same gradient as
    # the squared distance to q, and the same value for one-hot q
    g = torch.Generator().manual_seed(24)
    z = torch.randn(10, 4, generator=g, dtype=torch.float64)
    q = torch.softmax(torch.randn(10, 4, generator=g, dtype=torch.float64), 1)
    p = torch.softmax(z, 1)
    expected = ((p - q) ** 2).sum(1) + (q * (1 - q)).sum(1)
    torch.testing.assert_close(brier_score(z, q, reduction="none"), expected, **TOL)


PROB_TARGET_ERRORS = [
    (
        "row sum 1.2",
        torch.tensor([[0.6, 0.6, 0.0]]),
        r"target: expected class probabilities "
        r"whose sum over dim 1 is 1 \(tolerance 0.0001\), got 1.2",
    ),
    ("row sum 0", torch.zeros(1, 3), r"target: expected class probabilities whose sum"),
    ("negative", torch.tensor([[1.5, -0.5, 0.0]]), r"target: expected probabilities in \[0, 1\]"),
    ("nan", torch.tensor([[float("nan"), 0.5, 0.5]]), r"target: expected probabilities"),
    ("integer same shape", torch.tensor([[1, 0, 0]]), r"target: expected class indices of shape"),
]


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
@pytest.mark.parametrize("case", PROB_TARGET_ERRORS, ids=[c[0] for c in PROB_TARGET_ERRORS])
def test_invalid_probability_targets_raise(rule, case):
    _, q, match = case
    with pytest.raises(ValueError, match=match):
        rule(torch.zeros(1, 3), q)


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_probability_target_tolerance_and_masks(rule):
    z = torch.zeros(2, 3)
    q = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q_ok = q + torch.tensor([[5e-5, 0.0, 0.0], [0.0, 0.0, -5e-5]])  # inside 1e-4
    assert torch.isfinite(rule(z, q_ok))
    with pytest.raises(ValueError, match="^target: expected class probabilities"):
        rule(z, q + torch.tensor([[2e-4, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    # -inf masks are not allowed with probability targets (0 * -inf)
    with pytest.raises(ValueError, match="^logits: expected finite values"):
        rule(torch.tensor([[0.0, 1.0, float("-inf")]] * 2), q)
    with pytest.raises(ValueError, match="^weight: expected a 1-d tensor of 3 class weights"):
        rule(z, q, weight=torch.ones(2, 3))


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_binary_head_n_by_1_equals_binary(rule):
    g = torch.Generator().manual_seed(25)
    z = torch.randn(9, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 2, (9,), generator=g).double()
    y[2] = -100
    w = torch.rand(9, generator=g, dtype=torch.float64)
    ref = rule(z, y, weight=w, reduction="none")
    torch.testing.assert_close(rule(z[:, None], y, weight=w, reduction="none"), ref, **TOL)
    torch.testing.assert_close(
        rule(z[:, None], y[:, None], weight=w[:, None], reduction="none"), ref[:, None], **TOL
    )
    torch.testing.assert_close(rule(z[:, None], y), rule(z, y), **TOL)
    with pytest.raises(ValueError, match=r"^target: expected shape \(9, 1\) or \(9,\)"):
        rule(z[:, None], y[:5])


def test_multilabel_rejects_class_indices_and_is_a_bool():
    with pytest.raises(ValueError, match="^target: multilabel=True expects 0/1 float labels"):
        log_score(torch.zeros(2, 3), torch.tensor([0, 1]), multilabel=True)
    with pytest.raises(TypeError, match="^multilabel: expected a bool"):
        brier_score(torch.zeros(2, 3), torch.tensor([0, 1]), multilabel=1)


def test_hand_worked_values():
    # p = (0.1, 0.2, 0.3, 0.4), y = class 2 (0-based): CDF (.1, .3, .6), step (0, 0, 1)
    z = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float64))
    t = torch.tensor([2])
    assert ranked_probability_score(z, t).item() == pytest.approx(0.01 + 0.09 + 0.16, abs=1e-14)
    assert brier_score(z, t).item() == pytest.approx(0.01 + 0.04 + 0.49 + 0.16, abs=1e-14)
    assert log_score(z, t).item() == pytest.approx(-np.log(0.3), abs=1e-14)
    assert spherical_score(z, t).item() == pytest.approx(1 - 0.3 / np.sqrt(0.3), abs=1e-14)
    # uniform over C classes: spherical = 1 - 1/sqrt(C)
    assert spherical_score(torch.zeros(1, 9), torch.tensor([4])).item() == pytest.approx(
        1 - 1 / 3, abs=1e-7
    )


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_binary_equals_two_class_multiclass(rule):
    z = torch.linspace(-6, 6, 13, dtype=torch.float64)
    y = (torch.arange(13) % 2).double()
    two_class = torch.stack([torch.zeros_like(z), z], dim=1)
    multi = rule(two_class, y.long(), reduction="none")
    factor = 2.0 if rule is brier_score else 1.0  # binary Brier is half the 2-class sum
    torch.testing.assert_close(factor * rule(z, y, reduction="none"), multi, **TOL)


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_weight_and_ignore_index_semantics(rule):
    g = torch.Generator().manual_seed(4)
    z = torch.randn(9, 4, generator=g, dtype=torch.float64)
    t = torch.randint(0, 4, (9,), generator=g)
    t[[1, 5]] = -1
    w = torch.tensor([0.5, 2.0, 1.0, 3.0], dtype=torch.float64)
    per_item = torch.from_numpy(reference(rule, z, t.clamp(min=0)))
    w_item = w[t.clamp(min=0)] * (t != -1)
    none = rule(z, t, weight=w, ignore_index=-1, reduction="none")
    torch.testing.assert_close(none, w_item * per_item, **TOL)
    assert none[1].item() == 0.0 and none[5].item() == 0.0
    torch.testing.assert_close(
        rule(z, t, weight=w, ignore_index=-1, reduction="sum"), (w_item * per_item).sum(), **TOL
    )
    torch.testing.assert_close(
        rule(z, t, weight=w, ignore_index=-1), (w_item * per_item).sum() / w_item.sum(), **TOL
    )
    # binary: per-element weight broadcast over the target, ignore_index against the label
    zb = torch.randn(3, 4, generator=g, dtype=torch.float64)
    yb = torch.randint(0, 2, (3, 4), generator=g).double()
    yb[0, 1] = -100
    wb = torch.tensor([1.0, 0.5, 2.0, 4.0], dtype=torch.float64)  # broadcast over rows
    per_item = torch.from_numpy(reference(rule, zb, yb.clamp(min=0)))
    w_item = wb.expand(3, 4) * (yb != -100)
    # (N, C) 0/1 float targets are independent sigmoids only with multilabel=True
    torch.testing.assert_close(
        rule(zb, yb, weight=wb, reduction="none", multilabel=True), w_item * per_item, **TOL
    )
    torch.testing.assert_close(
        rule(zb, yb, weight=wb, multilabel=True), (w_item * per_item).sum() / w_item.sum(), **TOL
    )


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_ignored_items_get_zero_gradient(rule):
    z = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, -100, 2, 3, -100, 1])
    (grad,) = torch.autograd.grad(rule(z, t), z)
    assert torch.all(grad[[1, 4]] == 0) and torch.all(grad[[0, 2, 3, 5]].abs().sum(1) > 0)
    zb = torch.randn(6, dtype=torch.float64, requires_grad=True)
    yb = torch.tensor([0.0, -100.0, 1.0, 1.0, -100.0, 0.0])
    (grad,) = torch.autograd.grad(rule(zb, yb, reduction="sum"), zb)
    assert grad[1] == 0 and grad[4] == 0 and torch.all(grad[[0, 2, 3, 5]] != 0)


# ------------------------------------------------------------------------ gradients


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_gradcheck_multiclass_with_weight_ignore_and_extra_dims(rule):
    _, z, t, w = weighted_multiclass(5, 3, ignored=(0, 1))
    assert gradcheck(lambda x: rule(x, t, weight=w), (z,))
    assert gradcheck(lambda x: rule(x, t, reduction="none"), (z,))
    assert gradgradcheck(lambda x: rule(x, t, weight=w, reduction="sum"), (z,))


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_gradcheck_binary_with_weight_and_ignore(rule):
    g = torch.Generator().manual_seed(6)
    z = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True) * 3
    y = torch.randint(0, 2, (3, 4), generator=g).double()
    y[1, 2] = -100
    w = torch.rand(3, 4, generator=g, dtype=torch.float64) + 0.1
    assert gradcheck(lambda x: rule(x, y, weight=w, multilabel=True), (z,))
    assert gradgradcheck(lambda x: rule(x, y, reduction="none", multilabel=True), (z,))


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_create_graph_gradient_equals_plain_gradient(rule):
    # gradgradcheck differentiates the create_graph=True gradient; it must be the same
    # gradient as the plain backward (the Brier Function has two backward paths)
    g = torch.Generator().manual_seed(10)
    z = torch.randn(6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 5, (6,), generator=g)
    gout = torch.rand(6, generator=g, dtype=torch.float64)
    (plain,) = torch.autograd.grad(rule(z, t, reduction="none"), z, gout)
    (graph,) = torch.autograd.grad(rule(z, t, reduction="none"), z, gout, create_graph=True)
    assert graph.requires_grad
    torch.testing.assert_close(graph, plain, **TOL)


def _plain_brier(z, t):
    return ((torch.softmax(z, 1) - F.one_hot(t, z.shape[1])) ** 2).sum(1)


def _plain_rps(z, t):
    cdf = torch.softmax(z, 1).cumsum(1) - F.one_hot(t, z.shape[1]).cumsum(1)
    return (cdf[:, :-1] ** 2).sum(1)


def _plain_spherical(z, t):
    p = torch.softmax(z, 1)
    return 1 - p.gather(1, t[:, None]).squeeze(1) / p.norm(dim=1)


@pytest.mark.parametrize(
    ("rule", "plain"),
    [
        (brier_score, _plain_brier),
        (spherical_score, _plain_spherical),
        (ranked_probability_score, _plain_rps),
    ],
    ids=["brier", "spherical", "rps"],
)
def test_fused_backward_float32_matches_float64_autograd(rule, plain):
    g = torch.Generator().manual_seed(7)
    z = (torch.randn(32, 50, generator=g) * 5).requires_grad_()
    t = torch.randint(0, 50, (32,), generator=g)
    gout = torch.rand(32, generator=g)
    (ours,) = torch.autograd.grad(rule(z, t, reduction="none"), z, gout)
    z64 = z.detach().double().requires_grad_()
    (truth,) = torch.autograd.grad(plain(z64, t), z64, gout.double())
    torch.testing.assert_close(ours, truth.float(), rtol=1e-5, atol=2e-6)


# ---------------------------------------------------------------------- -inf masks


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_neg_inf_masks_equal_dropping_the_class(rule):
    g = torch.Generator().manual_seed(8)
    z = torch.randn(5, 4, generator=g, dtype=torch.float64)
    t = torch.tensor([0, 1, 0, 1, 0])
    masked = torch.cat([z, torch.full((5, 1), float("-inf"), dtype=torch.float64)], 1)
    masked.requires_grad_()
    out = rule(masked, t, reduction="none")
    # the masked class is last, so even the cumulative (RPS) view is unchanged
    torch.testing.assert_close(out, rule(z, t, reduction="none"), **TOL)
    (grad,) = torch.autograd.grad(out.sum(), masked)
    assert torch.isfinite(grad).all() and torch.all(grad[:, -1] == 0)


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_masked_class_zero_on_an_ignored_row_is_allowed(rule):
    z = torch.randn(3, 4)
    z[1, :2] = float("-inf")
    t = torch.tensor([2, -100, 3])
    assert torch.isfinite(rule(z, t))


# ------------------------------------------------------------------------- properness


def minimise_expected_score(score_fn, q: torch.Tensor) -> torch.Tensor:
    """argmin_p E_{y~q} S(p, y) over p = softmax(z): the expected score as the class-weighted
    sum (weight = q) over one row per class."""
    num_classes = q.numel()
    classes = torch.arange(num_classes)
    return argmin_forecast(
        lambda z: score_fn(z.expand(num_classes, num_classes), classes, weight=q, reduction="sum"),
        num_classes,
        max_iter=200,
    )


def minimise_expected_binary_score(score_fn, q1: float) -> float:
    """argmin_p E_{y~Bernoulli(q1)} S(p, y) over p = sigmoid(z)."""
    y = torch.tensor([0.0, 1.0], dtype=torch.float64)
    w = torch.tensor([1 - q1, q1], dtype=torch.float64)
    z = lbfgs_minimise(
        lambda z: score_fn(z.expand(2), y, weight=w, reduction="sum"),
        torch.zeros(1, dtype=torch.float64),
        max_iter=200,
    )
    return torch.sigmoid(z).item()


def _p_y_squared_error(logits, target, *, weight, reduction):
    """Not proper: squared error on the true class's probability only."""
    p_y = torch.softmax(logits, 1).gather(1, target[:, None]).squeeze(1)
    return ((1 - p_y) ** 2 * weight[target]).sum()


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
@pytest.mark.parametrize("num_classes", [2, 5])
def test_strict_properness_argmin_is_the_truth(rule, num_classes):
    g = torch.Generator().manual_seed(100 + num_classes)
    for _ in range(3):
        q = torch.distributions.Dirichlet(torch.ones(num_classes)).sample()
        q = (q * 0.9 + 0.1 / num_classes).double()  # stay away from the simplex boundary
        torch.testing.assert_close(minimise_expected_score(rule, q), q, rtol=0, atol=1e-6)
    q1 = float(torch.rand(1, generator=g) * 0.8 + 0.1)
    assert minimise_expected_binary_score(rule, q1) == pytest.approx(q1, abs=1e-6)


def test_properness_harness_rejects_an_improper_score():
    # interior minimiser p_y = 1 - lambda / q_y = (.347, .288, .216, .129, .020), not q
    q = torch.tensor([0.24, 0.22, 0.2, 0.18, 0.16], dtype=torch.float64)
    p = minimise_expected_score(_p_y_squared_error, q)
    lam = 4 / (1 / q).sum()
    torch.testing.assert_close(p, 1 - lam / q, rtol=0, atol=1e-6)  # the harness converged
    assert (p - q).abs().max() > 0.1


# --------------------------------------------------------------------------- bad input


def _z(*shape):
    return torch.randn(*shape)


BAD_INPUTS = [
    # (case id, logits, target, kwargs, exception, message fragment)
    (
        "nan",
        torch.tensor([[0.0, float("nan")]]),
        torch.tensor([0]),
        {},
        ValueError,
        r"logits: expected finite values.*\(0, 1\)",
    ),
    (
        "+inf",
        torch.tensor([[0.0, 1.0], [float("inf"), 0.0]]),
        torch.tensor([0, 1]),
        {},
        ValueError,
        r"logits: expected finite values.*\(1, 0\)",
    ),
    (
        "binary -inf",
        torch.tensor([0.0, float("-inf")]),
        torch.tensor([0.0, 0.0]),
        {},
        ValueError,
        r"logits: expected finite values",
    ),
    (
        "all -inf row",
        torch.tensor([[0.0, 1.0], [float("-inf")] * 2]),
        torch.tensor([0, 1]),
        {},
        ValueError,
        r"logits: expected at least one finite logit per item.*item 1",
    ),
    (
        "true class -inf",
        torch.tensor([[0.0, float("-inf")]]),
        torch.tensor([1]),
        {},
        ValueError,
        r"logits: the true class has logit -inf at item 0",
    ),
    (
        "class out of range",
        _z(4, 3),
        torch.tensor([0, 1, 3, 2]),
        {},
        ValueError,
        r"target: expected class indices in \[0, 2\], got 3 at position 2",
    ),
    (
        "negative class",
        _z(2, 3),
        torch.tensor([0, -1]),
        {},
        ValueError,
        r"target: expected class indices in \[0, 2\], got -1 at position 1",
    ),
    (
        "float multiclass target",
        _z(4, 3),
        torch.tensor([0.0, 1.0, 2.0, 1.0]),
        {},
        ValueError,
        r"target: expected integer class indices",
    ),
    (
        "binary label 2",
        _z(3),
        torch.tensor([0.0, 2.0, 1.0]),
        {},
        ValueError,
        r"target: expected binary labels in \{0, 1\}, got 2.0 at position 1",
    ),
    (
        "binary nan label",
        _z(2),
        torch.tensor([0.0, float("nan")]),
        {},
        ValueError,
        r"target: expected binary labels",
    ),
    (
        "shape mismatch",
        _z(4, 3),
        torch.tensor([0, 1, 2]),
        {},
        ValueError,
        r"target: expected shape \(4,\) .* or \(4, 3\)",
    ),
    (
        "shape mismatch 1-d",
        _z(4),
        torch.tensor([0.0, 1.0]),
        {},
        ValueError,
        r"target: expected shape \(4,\)",
    ),
    (
        "integer binary label 2",
        _z(3),
        torch.tensor([0, 2, 1]),
        {},
        ValueError,
        r"target: expected binary labels in \{0, 1\}, got 2 at position 1",
    ),
    (
        "unknown reduction",
        _z(2, 3),
        torch.tensor([0, 1]),
        {"reduction": "avg"},
        ValueError,
        r"reduction: expected one of",
    ),
    (
        "empty",
        torch.empty(0, 3),
        torch.empty(0, dtype=torch.long),
        {},
        ValueError,
        r"logits: expected a non-empty tensor",
    ),
    (
        "integer logits",
        torch.zeros(2, 3, dtype=torch.long),
        torch.tensor([0, 1]),
        {},
        ValueError,
        r"logits: expected a floating-point tensor",
    ),
    (
        "weight shape",
        _z(2, 3),
        torch.tensor([0, 1]),
        {"weight": torch.ones(2)},
        ValueError,
        r"weight: expected a 1-d tensor of 3 class weights",
    ),
    (
        "weight negative",
        _z(2, 3),
        torch.tensor([0, 1]),
        {"weight": torch.tensor([1.0, -1.0, 1.0])},
        ValueError,
        r"weight: expected non-negative",
    ),
    (
        "weight nan",
        _z(2, 3),
        torch.tensor([0, 1]),
        {"weight": torch.tensor([1.0, float("nan"), 1.0])},
        ValueError,
        r"weight: expected finite values",
    ),
    (
        "binary weight shape",
        _z(2, 3),
        torch.zeros(2, 3),
        {"weight": torch.ones(2), "multilabel": True},
        ValueError,
        r"weight: expected a tensor broadcastable to the target's shape",
    ),
    (
        "not a tensor",
        [[0.0, 1.0]],
        torch.tensor([0]),
        {},
        TypeError,
        r"logits: expected a torch.Tensor",
    ),
    (
        "ignore_index type",
        _z(2, 3),
        torch.tensor([0, 1]),
        {"ignore_index": 1.5},
        TypeError,
        r"ignore_index: expected an int",
    ),
]


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises(rule, case):
    _, logits, target, kwargs, exc, match = case
    with pytest.raises(exc, match=match):
        rule(logits, target, **kwargs)


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
@pytest.mark.parametrize(
    "shape, target_shape", [((3,), (3,)), ((4, 1), (4,)), ((4, 1), (4, 1)), ((2, 3), (2, 3))]
)
@pytest.mark.parametrize("dtype", [torch.long, torch.int32, torch.bool])
def test_integer_binary_labels(rule, shape, target_shape, dtype):
    """One rule with the metrics' negative log-likelihood (issue 10): 0/1 labels of an integer
    or bool dtype in a binary layout (decided by the shapes) score as their float twins,
    ignore_index included; the (N, 1) binary head reads its (N,) target as binary labels."""
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(shape, generator=g, dtype=torch.float64)
    y = torch.randint(0, 2, target_shape, generator=g)
    kw = {"multilabel": True} if len(shape) == 2 and shape[1] > 1 else {}
    for reduction in ("none", "sum", "mean"):
        assert torch.equal(
            rule(logits, y.to(dtype), reduction=reduction, **kw),
            rule(logits, y.double(), reduction=reduction, **kw),
        )
    if dtype != torch.bool:
        yi = y.clone().to(dtype)
        yi.view(-1)[0] = -100
        yf = yi.double()
        assert torch.equal(
            rule(logits, yi, reduction="none", **kw), rule(logits, yf, reduction="none", **kw)
        )
    if rule is log_score:  # the metrics' entry point: the same kernel, the same numbers
        assert torch.equal(
            nll_items(logits, y.to(dtype), **kw),
            log_score(logits, y.to(dtype), reduction="none", **kw),
        )


def test_ignored_item_with_nan_logits_still_raises():
    z = torch.randn(3, 4)
    z[1, 2] = float("nan")
    for rule in RULES:
        with pytest.raises(ValueError, match=r"logits: expected finite values.*\(1, 2\)"):
            rule(z, torch.tensor([0, -100, 1]))


def test_validation_can_be_switched_off_but_shapes_are_still_checked():
    z = torch.tensor([[0.0, float("nan")]])
    with validation_enabled(False):
        assert torch.isnan(log_score(z, torch.tensor([0])))
        with pytest.raises(ValueError, match="target: expected shape"):
            brier_score(z, torch.tensor([0, 1]))


# ------------------------------------------------------------------ shapes (Hypothesis)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_shapes_and_weighted_mean(data):
    rule = data.draw(st.sampled_from(RULES))
    binary = data.draw(st.booleans())
    n = data.draw(st.integers(1, 6))
    extra = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    seed = data.draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    if binary:
        shape = (n,) + extra
        z = torch.randn(*shape, generator=g, dtype=torch.float64)
        target = torch.randint(0, 2, shape, generator=g).double()
        weight = torch.rand(shape[-1:], generator=g, dtype=torch.float64)
        ignore = target.new_zeros(shape, dtype=torch.bool).bernoulli_(0.2, generator=g)
        target[ignore] = -7
        w_item = weight.expand(shape) * ~ignore
    else:
        num_classes = data.draw(st.integers(2, 5))
        z = torch.randn(n, num_classes, *extra, generator=g, dtype=torch.float64)
        target = torch.randint(0, num_classes, (n,) + extra, generator=g)
        weight = torch.rand(num_classes, generator=g, dtype=torch.float64)
        ignore = torch.zeros_like(target, dtype=torch.bool).bernoulli_(0.2, generator=g)
        target[ignore] = -7
        w_item = weight[target.clamp(min=0)] * ~ignore
        shape = (n,) + extra
    kw = {"multilabel": binary}  # multi-dim 0/1 float targets: independent sigmoids
    none = rule(z, target, weight=weight, ignore_index=-7, reduction="none", **kw)
    assert none.shape == shape and none.dtype == torch.float64
    assert torch.all(none[ignore] == 0)
    total = rule(z, target, weight=weight, ignore_index=-7, reduction="sum", **kw)
    torch.testing.assert_close(total, none.sum(), **TOL)
    mean = rule(z, target, weight=weight, ignore_index=-7, reduction="mean", **kw)
    expected = none.sum() / w_item.sum()
    if torch.isnan(expected):
        assert torch.isnan(mean)
    else:
        torch.testing.assert_close(mean, expected, **TOL)
    unweighted = rule(z, target, ignore_index=-7, reduction="none", **kw)
    torch.testing.assert_close(none, unweighted * w_item, **TOL)


def _position(flat: int, shape: tuple[int, ...]) -> str:
    idx = np.unravel_index(flat, shape)
    return str(int(idx[0])) if len(shape) == 1 else "(" + ", ".join(str(int(i)) for i in idx) + ")"


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_hypothesis_bad_values_name_the_argument_and_position(data):
    # a NaN/+inf logit, a class index out of range or a bad binary label, at a random
    # position of a random (N, C, *) or binary layout: ValueError naming argument + position
    rule = data.draw(st.sampled_from(RULES))
    binary = data.draw(st.booleans())
    n = data.draw(st.integers(1, 5))
    extra = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    kind = data.draw(st.sampled_from(["nan", "inf", "target"]))
    num_classes = data.draw(st.integers(2, 5))
    shape = (n,) + extra if binary else (n, num_classes) + extra
    target_shape = shape if binary else (n,) + extra
    z = torch.zeros(shape)
    target = torch.zeros(target_shape) if binary else torch.zeros(target_shape, dtype=torch.long)
    if kind == "target":
        flat = data.draw(st.integers(0, target.numel() - 1))
        bad = data.draw(
            st.sampled_from([2.0, -1.0, 0.5])
            if binary
            else st.sampled_from([num_classes, num_classes + 7, -1])
        )
        target.view(-1)[flat] = bad
        name, where = "target", _position(flat, target_shape)
    else:
        flat = data.draw(st.integers(0, z.numel() - 1))
        z.view(-1)[flat] = float("nan") if kind == "nan" else float("inf")
        name, where = "logits", _position(flat, shape)
    with pytest.raises(ValueError) as info:
        rule(z, target, multilabel=binary)
    message = str(info.value)
    assert message.startswith(name + ":") and f"position {where}" in message, message


# ------------------------------------------------------------------------ dtypes


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_finite_and_close(rule, dtype):
    g = torch.Generator().manual_seed(9)
    z = (torch.randn(16, 10, generator=g) * 8).to(dtype).requires_grad_()
    t = torch.randint(0, 10, (16,), generator=g)
    out = rule(z, t)
    assert out.dtype == torch.float32 and torch.isfinite(out)
    out.backward()
    assert z.grad.dtype == dtype and torch.isfinite(z.grad).all()
    torch.testing.assert_close(out, rule(z.detach().float(), t))
    zb = (torch.randn(16, generator=g) * 30).to(dtype)
    yb = torch.randint(0, 2, (16,), generator=g).to(dtype)
    assert torch.isfinite(rule(zb, yb))


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_under_autocast(rule, dtype):
    lin = torch.nn.Linear(8, 6)
    x = torch.randn(12, 8) * 10
    t = torch.randint(0, 6, (12,))
    with torch.autocast("cpu", dtype=dtype):
        logits = lin(x)
        assert logits.dtype == dtype
        out = rule(logits, t)
    assert out.dtype == torch.float32 and torch.isfinite(out)
    out.backward()
    assert torch.isfinite(lin.weight.grad).all()


@pytest.mark.parametrize("rule", [brier_score, ranked_probability_score], ids=["brier", "rps"])
def test_binary_quadratic_rules_float32_relative_accuracy_near_certainty(rule):
    # (p - y)^2 with p = sigmoid(z) rounds p to y in float32 for |z| > ~17 and returns 0;
    # the score sigmoid(-|z|)^2 is representable, so it must stay relatively accurate
    z = torch.tensor([5.0, 12.0, 20.0, 30.0, -5.0, -12.0, -20.0, -30.0])
    y = (z > 0).float()
    ours = rule(z, y, reduction="none").double()
    ref = torch.sigmoid(-z.double().abs()).square()
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=0)


def test_rps_float32_is_relatively_accurate_for_confident_forecasts():
    # P_{C-1} - 1 is 0 by definition; float32 rounding of sum(p) would add ~1e-15, which is
    # about 1 % of the tiny score of a confident, correct forecast on the last class
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 40, generator=g) * 0.5
    z[:, -1] += 18.0
    t = torch.full((64,), 39)
    ours = ranked_probability_score(z, t, reduction="none").double()
    ref = torch.from_numpy(reference(ranked_probability_score, z.double(), t))
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=0)


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_extreme_float32_logits_are_finite_and_nonnegative(rule):
    z = torch.tensor([[1e4, -1e4, 0.0], [-3e3, 3e3, 1.0], [50.0, 0.0, -50.0]], requires_grad=True)
    t = torch.tensor([0, 0, 0])
    out = rule(z, t, reduction="none")
    assert torch.isfinite(out).all() and torch.all(out >= 0)
    out.sum().backward()
    assert torch.isfinite(z.grad).all()
    zb = torch.tensor([1e4, -1e4, 1e4], requires_grad=True)
    yb = torch.tensor([1.0, 1.0, 0.0])
    outb = rule(zb, yb, reduction="none")
    assert torch.isfinite(outb).all() and torch.all(outb >= 0)
    outb.sum().backward()
    assert torch.isfinite(zb.grad).all()
