"""The hot path of the class scores and regularisers (docs/design.md section 3).

A Module or functional with 2-D logits, class indices and no weight takes the ``*_fast``
kernel and checks what it computed; everything else goes through ``prepare``. These tests
pin that the two paths agree (values and gradients, float32 and float64), that the fast
path is really taken on clean input, and that every input the full path rejects makes the
fast path hand over (``None``), so that the errors and their messages do not change.
"""

from __future__ import annotations

import pytest
import torch

import torchcal.functional as TF
import torchcal.losses as L
from torchcal.functional.item_regularizers import confidence_penalty_fast, focal_loss_fast
from torchcal.functional.regularizers import (
    dca_fast,
    mdca_fast,
    mmce_fast,
    soft_binned_ece_fast,
)
from torchcal.functional.scoring import (
    brier_score_fast,
    log_score_fast,
    ranked_probability_score_fast,
    spherical_score_fast,
)

#: name -> (functional, its fast kernel with the default options, Module factory)
RULES = {
    "log_score": (TF.log_score, lambda z, y: log_score_fast(z, y, -100, "mean"), L.LogScoreLoss),
    "brier": (TF.brier_score, lambda z, y: brier_score_fast(z, y, -100, "mean"), L.BrierLoss),
    "spherical": (
        TF.spherical_score,
        lambda z, y: spherical_score_fast(z, y, -100, "mean"),
        L.SphericalLoss,
    ),
    "rps": (
        TF.ranked_probability_score,
        lambda z, y: ranked_probability_score_fast(z, y, -100, "mean"),
        L.RPSLoss,
    ),
    "focal": (
        TF.focal_loss,
        lambda z, y: focal_loss_fast(z, y, -100, "mean", 2.0),
        L.FocalLoss,
    ),
    "mmce": (
        lambda z, y, **kw: TF.mmce(z, y, squared=True, **kw),
        lambda z, y: mmce_fast(z, y, -100, 0.4, True),
        L.MMCELoss,
    ),
    "soft_binned_ece": (
        lambda z, y, **kw: TF.soft_binned_ece(z, y, root=False, **kw),
        lambda z, y: soft_binned_ece_fast(z, y, -100, 15, 0.01, 2.0, False),
        L.SoftBinnedECELoss,
    ),
    "confidence_penalty": (
        lambda z, y: TF.confidence_penalty(z),
        lambda z, y: confidence_penalty_fast(z, "mean", 1.0),
        lambda: (lambda m: lambda z, y: m(z))(L.ConfidencePenaltyLoss()),
    ),
    "dca": (TF.dca, lambda z, y: dca_fast(z, y, -100), L.DCALoss),
    "mdca": (TF.mdca, lambda z, y: mdca_fast(z, y, -100), L.MDCALoss),
}
#: rules whose full path rejects a -inf true class (the confidence penalty has no target)
TRUE_CLASS = sorted(set(RULES) - {"confidence_penalty"})


def _batch(n: int, c: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(n, c, generator=g, dtype=dtype) * 3.0).requires_grad_()
    return z, torch.randint(0, c, (n,), generator=g)


def _value_and_grad(fn, z, y):
    out = fn(z, y)
    (grad,) = torch.autograd.grad(out, z)
    return out.detach(), grad


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [(64, 5), (40, 1000)], ids=["one-thread", "large"])
def test_fast_path_equals_full_path(name, dtype, size):
    """The fast path (2-D) against the full path of the same items as ``(N, C, 1)``
    logits (which never take it): values and gradients to the dtype's rounding."""
    rule, fast, _ = RULES[name]
    z, y = _batch(*size, dtype)
    assert fast(z.detach(), y) is not None, "clean input must take the fast path"
    got, g_got = _value_and_grad(rule, z, y)
    z3 = z.detach().unsqueeze(2).requires_grad_()
    want, g_want = _value_and_grad(rule, z3, y.unsqueeze(1))
    # different kernels of one formula: a few eps relative to the scale (values and
    # gradient entries are O(1) here)
    eps = torch.finfo(dtype).eps
    tol = {"rtol": 256 * eps, "atol": 64 * eps}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(g_got, g_want.squeeze(2), **tol)


@pytest.mark.parametrize("name", ["log_score", "brier", "spherical", "rps", "focal"])
@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_fast_path_reductions(name, reduction):
    rule = RULES[name][0]
    z, y = _batch(30, 7, torch.float64)
    got = rule(z, y, reduction=reduction)
    want = rule(z.unsqueeze(2), y.unsqueeze(1), reduction=reduction)
    torch.testing.assert_close(got, want.reshape(got.shape), rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", sorted(RULES))
def test_module_takes_the_same_kernel(name):
    rule, _, module = RULES[name]
    z, y = _batch(50, 6, torch.float32)
    torch.testing.assert_close(module()(z, y), rule(z, y), rtol=0, atol=0)


def _hostile(kind: str):
    z, y = _batch(6, 4, torch.float32)
    z = z.detach().clone()
    if kind == "nan":
        z[2, 1] = float("nan")
    elif kind == "posinf":
        z[3, 0] = float("inf")
    elif kind == "all-neginf":
        z[1] = float("-inf")
    elif kind == "neginf-true-class":
        z[4, y[4]] = float("-inf")
    elif kind == "label-out-of-range":
        y = y.clone()
        y[5] = 4
    elif kind == "ignored-with-nan":
        y = y.clone()
        y[0] = -100
        z[0, 2] = float("nan")
    return z, y


LOGIT_FAULTS = ["nan", "posinf", "all-neginf"]
TARGET_FAULTS = ["neginf-true-class", "label-out-of-range", "ignored-with-nan"]
#: the confidence penalty has no target: no true class, no labels, no ignored item
HOSTILE_CASES = [(name, kind) for name in sorted(RULES) for kind in LOGIT_FAULTS] + [
    (name, kind) for name in TRUE_CLASS for kind in TARGET_FAULTS
]


@pytest.mark.parametrize(("name", "kind"), HOSTILE_CASES)
def test_fast_path_hands_bad_input_to_the_full_path(name, kind):
    """Every input the full path rejects: the fast kernel returns ``None`` (it raises
    nothing of its own), and the functional and the Module raise the full path's
    ``ValueError``."""
    rule, fast, module = RULES[name]
    z, y = _hostile(kind)
    assert fast(z, y) is None
    match = r"^target: expected class indices" if kind == "label-out-of-range" else r"^logits: "
    with pytest.raises(ValueError, match=match):
        rule(z, y)
    with pytest.raises(ValueError, match=match):
        module()(z, y)


@pytest.mark.parametrize("name", TRUE_CLASS)
def test_ignored_items_leave_the_fast_path_and_are_left_out(name):
    """An ignored label (also ``ignore_index >= C``, as 255 in segmentation) sends the call
    to the full path, which leaves the item out: the value of the other items."""
    rule, fast, _ = RULES[name]
    z, y = _batch(12, 4, torch.float64)
    z = z.detach()
    y_ign = y.clone()
    y_ign[3] = 255
    keep = torch.arange(12) != 3
    kw = {"ignore_index": 255}
    if name in ("log_score", "brier", "spherical", "rps", "focal"):
        got, want = rule(z, y_ign, reduction="sum", **kw), rule(z[keep], y[keep], reduction="sum")
    else:
        got, want = rule(z, y_ign, **kw), rule(z[keep], y[keep])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["brier", "spherical", "rps", "focal", "mmce", "dca", "mdca"])
@pytest.mark.parametrize("size", [(8, 5), (40, 1000)], ids=["one-thread", "large"])
def test_a_mask_on_another_class_is_allowed(name, size):
    """A ``-inf`` logit masking a class other than the target is allowed: the value of the
    full path. Large batches (and the focal loss, whose score shows a masked true class,
    and the confidence readings, which gather the true logits) keep it on the fast path;
    a one-thread-sized batch of the other rules tests every logit with one reduction and
    hands any mask over."""
    rule, fast, _ = RULES[name]
    n, c = size
    z, y = _batch(n, c, torch.float64)
    z = z.detach().clone()
    z[2, (y[2] + 1) % c] = float("-inf")
    out = fast(z, y)
    assert (out is not None) == (name in ("focal", "mmce", "dca", "mdca") or n * c > 32768)
    want = rule(z.unsqueeze(2), y.unsqueeze(1))
    torch.testing.assert_close(rule(z, y), want, rtol=1e-12, atol=1e-15)
    if out is not None:
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-15)


def test_confidence_penalty_mask_goes_to_the_full_path():
    """``0 * -inf`` is NaN in the fast formula: the full path reads ``0 log 0 = 0``."""
    z = torch.tensor([[0.0, float("-inf"), 1.0], [2.0, 0.0, 0.0]], dtype=torch.float64)
    assert confidence_penalty_fast(z, "mean", 1.0) is None
    assert torch.isfinite(TF.confidence_penalty(z))
    torch.testing.assert_close(
        TF.confidence_penalty(z), TF.confidence_penalty(z.unsqueeze(2)), rtol=1e-12, atol=0
    )


def test_validation_off_still_takes_the_fast_path_and_ignores():
    from torchcal.functional import validation_enabled

    z, y = _batch(10, 3, torch.float64)
    y = y.clone()
    y[1] = -100
    with validation_enabled(False):
        for name in ("log_score", "brier", "focal", "dca"):
            rule = RULES[name][0]
            torch.testing.assert_close(
                rule(z, y), rule(z.unsqueeze(2), y.unsqueeze(1)), rtol=1e-12, atol=1e-15
            )


@pytest.mark.parametrize("name", sorted(RULES))
def test_cpu_autocast_does_not_change_the_fast_path(name):
    """The fast path has no autocast switch: under CPU autocast (bfloat16) every fast kernel
    still computes in the logits' float32, bit for bit."""
    rule, fast, _ = RULES[name]
    z, y = _batch(32, 6, torch.float32)
    z = z.detach()
    want = fast(z, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fast(z, y)
        full = rule(z.unsqueeze(2), y.unsqueeze(1))
    assert got is not None and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-6)


def test_soft_bin_centres_are_built_once_and_never_in_inference_mode():
    """The soft-binned ECE's bin centres are cached per (bins, device) in eager mode, equal to
    a fresh build; a first call inside ``torch.inference_mode`` caches nothing (its tensors
    may not meet autograd later), and the loss still trains after it."""
    from torchcal.functional import regularizers as R

    R._CENTRES.clear()
    logits = torch.randn(64, 5, generator=torch.Generator().manual_seed(0))
    target = torch.randint(0, 5, (64,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        in_inference = TF.soft_binned_ece(logits, target, bins=7)
    assert R._CENTRES == {}
    z = logits.clone().requires_grad_()
    value = TF.soft_binned_ece(z, target, bins=7)
    value.backward()
    assert torch.isfinite(z.grad).all()
    assert value.item() == in_inference.item()
    (cached,) = R._CENTRES.values()
    assert torch.equal(cached, torch.arange(0.5, 7, dtype=torch.float64) / 7)
    assert TF.soft_binned_ece(logits, target, bins=7).item() == value.item()
    assert len(R._CENTRES) == 1
