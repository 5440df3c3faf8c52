"""nn.Module twins of the continuous scoring rules: same numbers, options checked in __init__."""

from __future__ import annotations

import pytest
import torch

import torchcal.functional as TF
from torchcal.losses import (
    CRPSLoss,
    DawidSebastianiLoss,
    EnergyScoreLoss,
    GaussianNLLLoss,
    IntervalScoreLoss,
    QuantileLoss,
)

D64 = torch.float64


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    loc = torch.randn(6, 3, dtype=D64, generator=g)
    scale = torch.rand(6, 3, dtype=D64, generator=g) + 0.2
    y = torch.randn(6, 3, dtype=D64, generator=g)
    samples = torch.randn(6, 3, 5, dtype=D64, generator=g)
    return loc, scale, y, samples


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_modules_equal_functional(data, reduction):
    loc, scale, y, samples = data
    r = {"reduction": reduction}
    for dist in ("normal", "laplace", "logistic"):
        fn = getattr(TF, f"crps_{dist}")
        torch.testing.assert_close(
            CRPSLoss(dist, **r)(loc, scale, y), fn(loc, scale, y, **r), rtol=0, atol=0
        )
    for est in ("fair", "nrg"):
        torch.testing.assert_close(
            CRPSLoss("ensemble", estimator=est, **r)(samples, y),
            TF.crps_ensemble(samples, y, estimator=est, **r),
            rtol=0,
            atol=0,
        )
        torch.testing.assert_close(
            CRPSLoss("ensemble", ensemble_dim=0, estimator=est, **r)(samples.movedim(-1, 0), y),
            TF.crps_ensemble(samples, y, estimator=est, **r),
        )
        torch.testing.assert_close(
            EnergyScoreLoss(estimator=est, **r)(samples.transpose(-1, -2), y),
            TF.energy_score(samples.transpose(-1, -2), y, estimator=est, **r),
            rtol=0,
            atol=0,
        )
    lo, hi = loc - scale, loc + scale
    torch.testing.assert_close(
        IntervalScoreLoss(0.2, **r)(lo, hi, y),
        TF.interval_score(lo, hi, y, alpha=0.2, **r),
        rtol=0,
        atol=0,
    )
    alphas = torch.tensor([0.1, 0.2, 0.5], dtype=D64)
    torch.testing.assert_close(
        IntervalScoreLoss(alphas, **r)(lo, hi, y),
        TF.interval_score(lo, hi, y, alpha=alphas, **r),
        rtol=0,
        atol=0,
    )
    qs = [0.1, 0.5, 0.9]
    pred = torch.sort(loc, dim=-1).values
    torch.testing.assert_close(
        QuantileLoss(qs, **r)(pred, y[:, 0]),
        TF.quantile_score(pred, y[:, 0], qs, **r),
        rtol=0,
        atol=0,
    )
    torch.testing.assert_close(
        GaussianNLLLoss(**r)(loc, scale**2, y), TF.gaussian_nll(loc, target=y, var=scale**2, **r)
    )
    torch.testing.assert_close(
        GaussianNLLLoss(spread="scale", full=False, **r)(loc, scale, y),
        TF.gaussian_nll(loc, scale, y, full=False, **r),
    )
    torch.testing.assert_close(
        DawidSebastianiLoss(**r)(loc, scale, y),
        TF.dawid_sebastiani_score(loc, scale, y, **r),
        rtol=0,
        atol=0,
    )


def test_gaussian_nll_matches_torch_without_clamp(data):
    loc, scale, y, _ = data
    var = scale**2
    # forecast first, target last: torch's (input, target, var) with the last two swapped
    ours = GaussianNLLLoss(full=True)(loc, var, y)
    ref = torch.nn.GaussianNLLLoss(full=True)(loc, y, var)
    torch.testing.assert_close(ours, ref)
    with pytest.raises(ValueError, match="^spread"):
        GaussianNLLLoss()(loc, torch.zeros_like(var), y)  # torch would clamp silently


BAD_INIT = [
    ("family", lambda: CRPSLoss("gamma")),
    ("estimator", lambda: CRPSLoss("ensemble", estimator="pwm")),
    ("reduction", lambda: CRPSLoss("normal", reduction="avg")),
    ("estimator", lambda: EnergyScoreLoss(estimator="qd")),
    ("reduction", lambda: EnergyScoreLoss(reduction="max")),
    ("alpha", lambda: IntervalScoreLoss(0.0)),
    ("alpha", lambda: IntervalScoreLoss(1.5)),
    ("alpha", lambda: IntervalScoreLoss(torch.tensor([0.1, 1.0]))),
    ("alpha", lambda: IntervalScoreLoss(torch.tensor([1, 2]))),
    ("reduction", lambda: IntervalScoreLoss(0.1, reduction="x")),
    ("quantiles", lambda: QuantileLoss([0.1, 1.0])),
    ("quantiles", lambda: QuantileLoss([])),
    ("quantiles", lambda: QuantileLoss([[0.1, 0.2]])),
    ("reduction", lambda: QuantileLoss([0.5], reduction="x")),
    ("spread", lambda: GaussianNLLLoss(spread="std")),
    ("reduction", lambda: GaussianNLLLoss(reduction="x")),
    ("reduction", lambda: DawidSebastianiLoss(reduction="x")),
]


@pytest.mark.parametrize("arg,make", BAD_INIT)
def test_bad_options_raise_in_init(arg, make):
    with pytest.raises(ValueError, match=f"^{arg}:"):
        make()


def test_bad_option_types_raise_type_error():
    with pytest.raises(TypeError, match="^ensemble_dim"):
        CRPSLoss("ensemble", ensemble_dim=1.0)
    with pytest.raises(TypeError, match="^alpha"):
        IntervalScoreLoss("0.1")
    with pytest.raises(TypeError, match="^full"):
        GaussianNLLLoss(full=1)


def test_bad_forward_inputs(data):
    loc, scale, y, samples = data
    with pytest.raises(TypeError, match="samples, target"):
        CRPSLoss("ensemble")(loc, scale, y)
    with pytest.raises(TypeError, match="loc, scale"):
        CRPSLoss("normal")(samples, y)
    cases = [
        ("scale", lambda: CRPSLoss("laplace")(loc, -scale, y)),
        ("target", lambda: CRPSLoss("normal")(loc, scale, y[:2, :2])),
        ("samples", lambda: CRPSLoss("ensemble")(samples[..., :1], y)),
        ("target", lambda: CRPSLoss("ensemble")(samples, torch.full_like(y, float("nan")))),
        ("target", lambda: EnergyScoreLoss()(samples, y[:, :2])),
        ("upper", lambda: IntervalScoreLoss(0.1)(loc + scale, loc - scale, y)),
        ("pred", lambda: QuantileLoss([0.1, 0.9])(loc, y[:, 0])),
        ("spread", lambda: GaussianNLLLoss()(loc, -scale, y)),
        ("loc", lambda: DawidSebastianiLoss()(loc * float("inf"), scale, y)),
    ]
    for arg, call in cases:
        with pytest.raises(ValueError, match=f"^{arg}:"):
            call()


def test_buffers_state_dict_and_repr():
    q = QuantileLoss([0.25, 0.75])
    assert "quantiles" in q.state_dict() and q.quantiles.dtype == D64
    a = IntervalScoreLoss(torch.tensor([0.1, 0.2]))
    assert "alpha" in a.state_dict()
    # dtype casts keep the buffers' own dtype (issue 9 item 6): alpha stays float32 here
    assert a.to(D64).alpha.dtype == torch.float32
    assert "estimator='fair'" in repr(CRPSLoss("ensemble"))
    assert "family='laplace'" in repr(CRPSLoss("laplace"))
    assert "quantiles=[0.25, 0.75]" in repr(q)


def test_training_with_module_fits_gaussian(data):
    # fit loc/log-scale of a normal to N(2, 0.5^2) data with CRPSLoss: converges to the truth
    g = torch.Generator().manual_seed(1)
    y = 2 + 0.5 * torch.randn(1000, generator=g)
    loc = torch.zeros((), requires_grad=True)
    log_scale = torch.zeros((), requires_grad=True)
    opt = torch.optim.Adam([loc, log_scale], lr=0.1)
    loss_fn = CRPSLoss("normal")
    for _ in range(150):
        loss = loss_fn(loc.expand_as(y), log_scale.exp().expand_as(y), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert abs(loc.item() - y.mean().item()) < 0.02
    assert abs(log_scale.exp().item() - y.std().item()) < 0.02


# --------------------------------------- issue 9 item 6: buffers keep their dtype under casts


def _buffered_losses():
    from torchcal.losses import BrierLoss, FocalLoss, LogScoreLoss

    w = torch.tensor([0.3, 1.7, 0.9], dtype=D64)
    return [
        QuantileLoss([0.1, 0.5, 0.9]),
        IntervalScoreLoss(torch.tensor([0.1, 0.9], dtype=D64)),
        LogScoreLoss(weight=w),
        BrierLoss(weight=w),
        FocalLoss(weight=w),
    ]


@pytest.mark.parametrize(
    "cast", ["bfloat16", "half", "float", "to_bf16", "lightning_bf16_true", "lightning_16_true"]
)
def test_float64_buffers_survive_dtype_casts(cast):
    for loss in _buffered_losses():
        before = {k: v.clone() for k, v in loss.state_dict().items()}
        if cast == "to_bf16":
            loss.to(torch.bfloat16)
        elif cast.startswith("lightning"):
            from lightning.pytorch.plugins.precision import HalfPrecision

            HalfPrecision("bf16-true" if "bf16" in cast else "16-true").convert_module(loss)
        else:
            getattr(loss, cast)()
        after = loss.state_dict()
        assert after.keys() == before.keys()
        for k, v in before.items():
            assert after[k].dtype == D64 and torch.equal(after[k], v), (type(loss), k)
    # a QuantileLoss level 0.9 stayed 0.9 (bfloat16 would round it to 0.898...)
    q = QuantileLoss([0.9]).bfloat16()
    assert q.quantiles.item() == 0.9
    assert torch.tensor(0.9, dtype=torch.bfloat16).item() != 0.9  # the test can fail


def test_buffers_still_follow_device_moves_and_load_old_state_dicts():
    q = QuantileLoss([0.25, 0.75])
    moved = q.to("meta")
    assert moved.quantiles.device.type == "meta" and moved.quantiles.dtype == D64
    fresh = QuantileLoss([0.5, 0.5])
    fresh.load_state_dict({"quantiles": torch.tensor([0.25, 0.75], dtype=torch.float32)})
    assert fresh.quantiles.dtype == D64 and fresh.quantiles.tolist() == [0.25, 0.75]
