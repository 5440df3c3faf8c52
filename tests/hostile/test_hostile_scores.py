"""Hostile inputs for every public entry point of the scoring area (issue 9, Build 6).

Scoring rules, regularisers and their Loss modules (torchcal.functional.scoring,
.regularizers, .continuous, torchcal.losses). Every case asserts a ValueError whose
message starts with the argument's name, or the right number against an independent
reference: never a plausible wrong number.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torchcal.functional as TF
from torchcal import losses as L

NAN, INF = float("nan"), float("inf")

# ------------------------------------------------------------------ classification

# name -> (callable(logits, target), per-item?)  every entry point taking (logits, target)
CLASS_FNS = {
    "log_score": TF.log_score,
    "brier_score": TF.brier_score,
    "spherical_score": TF.spherical_score,
    "ranked_probability_score": TF.ranked_probability_score,
    "focal_loss": TF.focal_loss,
    "mmce": TF.mmce,
    "soft_binned_ece": TF.soft_binned_ece,
    "confidence_penalty": TF.confidence_penalty,
    "dca": TF.dca,
    "mdca": TF.mdca,
    "LogScoreLoss": L.LogScoreLoss(),
    "BrierLoss": L.BrierLoss(),
    "SphericalLoss": L.SphericalLoss(),
    "RPSLoss": L.RPSLoss(),
    "FocalLoss": L.FocalLoss(),
    "MMCELoss": L.MMCELoss(),
    "SoftBinnedECELoss": L.SoftBinnedECELoss(),
    "ConfidencePenaltyLoss": L.ConfidencePenaltyLoss(),
    "DCALoss": L.DCALoss(),
    "MDCALoss": L.MDCALoss(),
}
# the rules that read a float (N, C) target as class probabilities (the others raise)
SOFT_OK = {
    "log_score",
    "brier_score",
    "spherical_score",
    "ranked_probability_score",
    "mdca",
    "confidence_penalty",
    "LogScoreLoss",
    "BrierLoss",
    "SphericalLoss",
    "RPSLoss",
    "MDCALoss",
    "ConfidencePenaltyLoss",
}

_Z = torch.tensor([[2.0, 0.0, -1.0], [0.5, 1.5, 0.0], [0.0, 0.0, 3.0], [1.0, -2.0, 0.5]])
_T = torch.tensor([0, 1, 2, 1])

CLASS_ERRORS = [
    # (case, logits, target, argument named by the error)
    ("nan logit", torch.tensor([[0.0, NAN, 1.0]] * 2), torch.tensor([0, 1]), "logits"),
    ("+inf logit", torch.tensor([[0.0, INF, 1.0]] * 2), torch.tensor([0, 1]), "logits"),
    ("all -inf row", torch.tensor([[0.0, 1.0, 2.0], [-INF] * 3]), torch.tensor([0, 1]), "logits"),
    ("-inf true class", torch.tensor([[0.0, 1.0, -INF]]), torch.tensor([2]), "logits"),
    ("binary -inf", torch.tensor([0.0, -INF]), torch.tensor([0.0, 1.0]), "logits"),
    ("binary nan", torch.tensor([0.0, NAN]), torch.tensor([0.0, 1.0]), "logits"),
    ("empty", torch.empty(0, 3), torch.empty(0, dtype=torch.long), "logits"),
    ("integer logits", torch.zeros(2, 3, dtype=torch.long), torch.tensor([0, 1]), "logits"),
    ("float class indices", _Z, _T.float(), "target"),
    ("class index out of range", _Z, torch.tensor([0, 1, 3, 1]), "target"),
    ("target too long", _Z, torch.tensor([0, 1, 2, 1, 0]), "target"),
    ("(N, 1) index target", _Z, _T[:, None], "target"),
    ("(N, 1) binary target for (N,) logits", _Z[:, 0], (_T[:, None] > 0).float(), "target"),
    ("binary label 2", _Z[:, 0], torch.tensor([0.0, 1.0, 2.0, 1.0]), "target"),
    ("integer binary label 2", _Z[:, 0], torch.tensor([0, 2, 1, 0]), "target"),
    ("unnormalised prob target", _Z, torch.full((4, 3), 0.5), "target"),
    ("negative prob target", _Z, torch.tensor([[1.5, -0.5, 0.0]] * 4), "target"),
    ("nan prob target", _Z, torch.tensor([[NAN, 0.5, 0.5]] * 4), "target"),
]


@pytest.mark.parametrize("name", list(CLASS_FNS))
@pytest.mark.parametrize("case", CLASS_ERRORS, ids=[c[0] for c in CLASS_ERRORS])
def test_classification_bad_input_names_the_argument(name, case):
    case_id, logits, target, arg = case
    if case_id == "-inf true class" and "onfidence" in name:
        # the penalty needs no true class: a masked class is scored as 0 log 0 = 0
        assert torch.isfinite(CLASS_FNS[name](logits, target))
        return
    with pytest.raises(ValueError, match=f"^{arg}:"):
        CLASS_FNS[name](logits, target)


@pytest.mark.parametrize("name", list(CLASS_FNS))
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_binary_target_equals_float_target(name, dtype):
    """One binary-label rule everywhere (issue 10): {0, 1} integer or bool labels of the logits'
    shape give exactly the numbers of the float labels (the metrics' NLL always accepted them)."""
    z, y = _Z[:, 0], torch.tensor([0.0, 1.0, 1.0, 0.0])
    assert torch.equal(CLASS_FNS[name](z, y.to(dtype)), CLASS_FNS[name](z, y))


def _conf_reference(z: torch.Tensor, t: torch.Tensor) -> tuple[float, float]:
    p = torch.softmax(z.double(), 1)[0]
    return float(p.max()), float(p.argmax() == t[0])


def _n1_reference(name: str, z: torch.Tensor, t: torch.Tensor) -> float:
    """Hand-written value of each rule on one item (float64)."""
    p = torch.softmax(z.double(), 1)[0]
    y = int(t[0])
    e = F.one_hot(t, 3)[0].double()
    base = name.replace("Loss", "").lower()
    if base in ("log_score", "logscore"):
        return -math.log(p[y])
    if base in ("brier_score", "brier"):
        return float(((p - e) ** 2).sum())
    if base in ("spherical_score", "spherical"):
        return 1 - float(p[y] / p.norm())
    if base in ("ranked_probability_score", "rps"):
        return float(((p.cumsum(0) - e.cumsum(0))[:-1] ** 2).sum())
    if base in ("focal_loss", "focal"):
        return -((1 - float(p[y])) ** 2) * math.log(p[y])
    if base in ("confidence_penalty", "confidencepenalty"):
        return float((p * p.log()).sum())
    if base in ("mdca",):
        return float((p - e).abs().mean())
    r, o = _conf_reference(z, t)
    if name == "MMCELoss":  # squared by default
        return (o - r) ** 2
    if name == "SoftBinnedECELoss":  # SB-ECE_2^2 (root=False) by default
        return (o - r) ** 2
    return abs(o - r)  # mmce, soft_binned_ece (p=2 root), dca: |o - r| for one item


@pytest.mark.parametrize("name", list(CLASS_FNS))
def test_a_single_item_gives_the_hand_worked_value(name):
    z, t = _Z[:1].double(), _T[:1]
    assert CLASS_FNS[name](z, t).item() == pytest.approx(
        _n1_reference(name, z, t), rel=1e-9, abs=1e-12
    )


@pytest.mark.parametrize("name", list(CLASS_FNS))
def test_one_hot_float_target_is_class_probabilities_or_raises(name):
    z = _Z.double()
    one_hot = F.one_hot(_T, 3).double()
    if name in SOFT_OK:
        torch.testing.assert_close(
            CLASS_FNS[name](z, one_hot), CLASS_FNS[name](z, _T), rtol=1e-12, atol=1e-14
        )
    else:
        with pytest.raises(ValueError, match="^target:"):
            CLASS_FNS[name](z, one_hot)


@pytest.mark.parametrize("name", list(CLASS_FNS))
def test_binary_head_n_by_1_is_binary(name):
    z = _Z[:, 1].double()
    y = (_T > 0).double()
    ref = CLASS_FNS[name](z, y)
    torch.testing.assert_close(CLASS_FNS[name](z[:, None], y), ref, rtol=0, atol=0)
    torch.testing.assert_close(CLASS_FNS[name](z[:, None], y[:, None]), ref, rtol=0, atol=0)


@pytest.mark.parametrize(
    "name",
    [
        n
        for n in CLASS_FNS
        if n in SOFT_OK and "Loss" not in n and n not in ("mdca", "confidence_penalty")
    ],
)
def test_probabilities_passed_as_logits_are_scored_as_logits(name):
    # the API takes logits: softmax(probs) is the forecast, exactly (no guess from values)
    probs = torch.softmax(_Z.double(), 1)
    torch.testing.assert_close(
        CLASS_FNS[name](probs, _T, reduction="none"),
        CLASS_FNS[name](torch.log(torch.softmax(probs, 1)), _T, reduction="none"),
        rtol=1e-12,
        atol=1e-14,
    )
    if name == "log_score":
        torch.testing.assert_close(TF.log_score(probs, _T), F.cross_entropy(probs, _T))


@pytest.mark.parametrize("name", list(CLASS_FNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_logits_give_finite_values_and_gradients(name, dtype):
    z = (_Z * 1e3).to(dtype).requires_grad_(True)
    value = CLASS_FNS[name](z, _T)
    (grad,) = torch.autograd.grad(value, z)
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    if name not in ("confidence_penalty", "ConfidencePenaltyLoss"):
        assert value.item() >= 0


# ---------------------------------------------------------------------- continuous

_V = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
_S = torch.tensor([1.0, 0.5, 2.0, 1.5], dtype=torch.float64)
_Y = torch.tensor([0.0, 1.0, 1.5, -2.0], dtype=torch.float64)
_ENS = _V[:, None] + torch.tensor([-1.0, 0.0, 0.5, 1.0], dtype=torch.float64)
_QS = [0.1, 0.5, 0.9]
_PRED = _V[:, None] + torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64)

# name -> callable(**parts) with the forecast parts and the target `y`
CONT_FNS = {
    "crps_normal": lambda a=_V, b=_S, y=_Y: TF.crps_normal(a, b, y),
    "crps_laplace": lambda a=_V, b=_S, y=_Y: TF.crps_laplace(a, b, y),
    "crps_logistic": lambda a=_V, b=_S, y=_Y: TF.crps_logistic(a, b, y),
    "dawid_sebastiani_score": lambda a=_V, b=_S, y=_Y: TF.dawid_sebastiani_score(a, b, y),
    "gaussian_nll": lambda a=_V, b=_S, y=_Y: TF.gaussian_nll(a, b, y),
    "interval_score": lambda a=_V, b=_S, y=_Y: TF.interval_score(a - b, a + b, y, alpha=0.2),
    "crps_ensemble": lambda a=_ENS, b=None, y=_Y: TF.crps_ensemble(a, y),
    "quantile_score": lambda a=_PRED, b=None, y=_Y: TF.quantile_score(a, y, _QS),
    "energy_score": lambda a=_ENS, b=None, y=_Y: TF.energy_score(
        a[..., None].expand(*a.shape, 2), y[..., None].expand(*y.shape, 2)
    ),
    "CRPSLoss": lambda a=_V, b=_S, y=_Y: L.CRPSLoss("normal")(a, b, y),
    "CRPSLoss_ensemble": lambda a=_ENS, b=None, y=_Y: L.CRPSLoss("ensemble")(a, y),
    "DawidSebastianiLoss": lambda a=_V, b=_S, y=_Y: L.DawidSebastianiLoss()(a, b, y),
    "GaussianNLLLoss": lambda a=_V, b=_S, y=_Y: L.GaussianNLLLoss(spread="scale")(a, b, y),
    "IntervalScoreLoss": lambda a=_V, b=_S, y=_Y: L.IntervalScoreLoss(0.2)(a - b, a + b, y),
    "QuantileLoss": lambda a=_PRED, b=None, y=_Y: L.QuantileLoss(_QS)(a, y),
    "EnergyScoreLoss": lambda a=_ENS, b=None, y=_Y: L.EnergyScoreLoss()(
        a[..., None].expand(*a.shape, 2), y[..., None].expand(*y.shape, 2)
    ),
}
_HAS_SCALE = {
    "crps_normal",
    "crps_laplace",
    "crps_logistic",
    "dawid_sebastiani_score",
    "gaussian_nll",
    "CRPSLoss",
    "DawidSebastianiLoss",
    "GaussianNLLLoss",
}
_SCALE_NAME = {"gaussian_nll": "spread", "GaussianNLLLoss": "spread"}


def _first_arg(name: str) -> str:
    if "ensemble" in name or "energy" in name or "Energy" in name:
        return "samples"
    if "quantile" in name or "Quantile" in name:
        return "pred"
    if "interval" in name or "Interval" in name:
        return "lower"
    return "loc"


def _with(value: float, x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x.view(-1)[1] = value
    return x


@pytest.mark.parametrize("name", list(CONT_FNS))
@pytest.mark.parametrize(
    "case",
    [
        "nan-target",
        "inf-target",
        "-inf-target",
        "nan-forecast",
        "inf-forecast",
        "(N,1)-target",
        "(1,N)-forecast",
        "short",
        "int-target",
        "empty",
    ],
)
def test_continuous_bad_input_names_the_argument(name, case):
    fn = CONT_FNS[name]
    a = _ENS if _first_arg(name) == "samples" else (_PRED if _first_arg(name) == "pred" else _V)
    uses_b = name in _HAS_SCALE or name in ("interval_score", "IntervalScoreLoss")
    calls = {
        "nan-target": (lambda: fn(y=_with(NAN, _Y)), "target"),
        "inf-target": (lambda: fn(y=_with(INF, _Y)), "target"),
        "-inf-target": (lambda: fn(y=_with(-INF, _Y)), "target"),
        "nan-forecast": (lambda: fn(a=_with(NAN, a)), None),
        "inf-forecast": (lambda: fn(a=_with(INF, a)), None),
        "(N,1)-target": (lambda: fn(y=_Y[:, None]), "target"),
        "(1,N)-forecast": (lambda: fn(a=a[None]), "target"),
        "short": (lambda: fn(y=_Y[:3]), "target"),
        "int-target": (lambda: fn(y=_Y.long()), "target"),
        "empty": (lambda: fn(a=a[:0], y=_Y[:0], **({"b": _S[:0]} if uses_b else {})), None),
    }
    call, arg = calls[case]
    if arg is None:  # the forecast's own argument (or the interval bounds it builds)
        arg = _first_arg(name)
        if name in ("interval_score", "IntervalScoreLoss"):
            arg = "(lower|upper)"
    with pytest.raises(ValueError, match=f"^{arg}:"):
        call()


@pytest.mark.parametrize("name", sorted(_HAS_SCALE))
@pytest.mark.parametrize("bad", [0.0, -1.0, NAN])
def test_non_positive_scale_names_the_argument(name, bad):
    with pytest.raises(ValueError, match=f"^{_SCALE_NAME.get(name, 'scale')}:"):
        CONT_FNS[name](b=_with(bad, _S))


def test_single_item_and_extreme_values_give_the_closed_form():
    from scipy.stats import norm

    # N = 1 against scipy; extreme offsets / tiny scales stay finite and exact enough
    loc, sc, y = (
        torch.tensor([0.3], dtype=torch.float64),
        torch.tensor([0.7], dtype=torch.float64),
        torch.tensor([1.1], dtype=torch.float64),
    )
    z = (1.1 - 0.3) / 0.7
    ref = 0.7 * (z * (2 * norm.cdf(z) - 1) + 2 * norm.pdf(z) - 1 / math.sqrt(math.pi))
    assert TF.crps_normal(loc, sc, y).item() == pytest.approx(ref, rel=1e-12)
    assert TF.gaussian_nll(loc, sc, y).item() == pytest.approx(
        -norm.logpdf(1.1, 0.3, 0.7), rel=1e-12
    )
    # tiny scale: CRPS -> |y - mu|; huge offsets in float32: ensemble CRPS is shift invariant
    tiny = TF.crps_normal(loc, torch.tensor([1e-30], dtype=torch.float64), y)
    assert tiny.item() == pytest.approx(0.8, rel=1e-12)
    ens = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    assert TF.crps_ensemble(ens + 1e4, torch.tensor([1e4 + 1.5])).item() == pytest.approx(
        TF.crps_ensemble(ens, torch.tensor([1.5])).item(), abs=1e-3
    )
