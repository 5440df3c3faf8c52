"""Inputs for every public loss and every functional score, shared by the hot-path tests
(no host synchronisation, torch.compile fullgraph). A loss in ``torchcal.losses.__all__`` or
a score in ``torchcal.functional.__all__`` (from the modules in :data:`SCORE_MODULES`)
without an entry here makes those tests fail, so a new one cannot skip them."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

import torchcal.functional as TF
import torchcal.losses as L
from torchcal.rewards import brier_reward, correctness_brier_reward, log_reward, spherical_reward

SCORE_MODULES = (
    "torchcal.functional.scoring",
    "torchcal.functional.regularizers",
    "torchcal.functional.item_regularizers",
    "torchcal.functional.crps",
    "torchcal.functional.continuous",
    "torchcal.functional.rewards",
)

Inputs = Callable[[int, torch.Generator], tuple[Tensor, ...]]


def classes(n: int, g: torch.Generator) -> tuple[Tensor, ...]:
    return torch.randn(n, 5, generator=g) * 2.0, torch.randint(0, 5, (n,), generator=g)


def loc_scale(n: int, g: torch.Generator) -> tuple[Tensor, ...]:
    return (
        torch.randn(n, generator=g),
        torch.rand(n, generator=g) + 0.5,
        torch.randn(n, generator=g),
    )


def ensemble(n: int, g: torch.Generator) -> tuple[Tensor, ...]:
    return torch.randn(n, 6, generator=g), torch.randn(n, generator=g)


def energy(n: int, g: torch.Generator) -> tuple[Tensor, ...]:
    return torch.randn(n, 6, 3, generator=g), torch.randn(n, 3, generator=g)


def interval(n: int, g: torch.Generator) -> tuple[Tensor, ...]:
    centre = torch.randn(n, generator=g)
    half = torch.rand(n, generator=g) + 0.1
    return centre - half, centre + half, torch.randn(n, generator=g)


def quantiles(n: int, g: torch.Generator) -> tuple[Tensor, ...]:
    pred = torch.sort(torch.randn(n, 3, generator=g), dim=-1).values
    return pred, torch.randn(n, generator=g)


def rewards(n: int, g: torch.Generator) -> tuple[Tensor, ...]:
    return torch.rand(n, generator=g) * 0.98 + 0.01, torch.randint(0, 2, (n,), generator=g).bool()


LEVELS = (0.1, 0.5, 0.9)

#: loss name -> (module factory, inputs)
LOSS_CASES: dict[str, tuple[Callable[[], torch.nn.Module], Inputs]] = {
    "LogScoreLoss": (L.LogScoreLoss, classes),
    "BrierLoss": (L.BrierLoss, classes),
    "SphericalLoss": (L.SphericalLoss, classes),
    "RPSLoss": (L.RPSLoss, classes),
    "FocalLoss": (L.FocalLoss, classes),
    "MMCELoss": (L.MMCELoss, classes),
    "SoftBinnedECELoss": (L.SoftBinnedECELoss, classes),
    "ConfidencePenaltyLoss": (L.ConfidencePenaltyLoss, classes),
    "DCALoss": (L.DCALoss, classes),
    "MDCALoss": (L.MDCALoss, classes),
    "CRPSLoss": (L.CRPSLoss, loc_scale),
    "EnergyScoreLoss": (L.EnergyScoreLoss, energy),
    "IntervalScoreLoss": (lambda: L.IntervalScoreLoss(alpha=0.1), interval),
    "QuantileLoss": (lambda: L.QuantileLoss(list(LEVELS)), quantiles),
    "GaussianNLLLoss": (L.GaussianNLLLoss, loc_scale),
    "DawidSebastianiLoss": (L.DawidSebastianiLoss, loc_scale),
}
#: extra configurations of a loss that take another code path
LOSS_VARIANTS: dict[str, tuple[Callable[[], torch.nn.Module], Inputs]] = {
    "CRPSLoss[ensemble]": (lambda: L.CRPSLoss("ensemble"), ensemble),
    "CRPSLoss[laplace]": (lambda: L.CRPSLoss("laplace"), loc_scale),
    "CRPSLoss[logistic]": (lambda: L.CRPSLoss("logistic"), loc_scale),
    "FocalLoss[adaptive]": (lambda: L.FocalLoss(gamma="adaptive"), classes),
}


def _quantile_score(pred: Tensor, target: Tensor) -> Tensor:
    return TF.quantile_score(pred, target, torch.tensor(LEVELS, dtype=torch.float64))


#: functional score name -> (call, inputs)
SCORE_CASES: dict[str, tuple[Callable[..., Tensor], Inputs]] = {
    "log_score": (TF.log_score, classes),
    "brier_score": (TF.brier_score, classes),
    "spherical_score": (TF.spherical_score, classes),
    "ranked_probability_score": (TF.ranked_probability_score, classes),
    "focal_loss": (TF.focal_loss, classes),
    "mmce": (TF.mmce, classes),
    "soft_binned_ece": (TF.soft_binned_ece, classes),
    "confidence_penalty": (TF.confidence_penalty, classes),
    "dca": (TF.dca, classes),
    "mdca": (TF.mdca, classes),
    "crps_normal": (TF.crps_normal, loc_scale),
    "crps_laplace": (TF.crps_laplace, loc_scale),
    "crps_logistic": (TF.crps_logistic, loc_scale),
    "crps_ensemble": (TF.crps_ensemble, ensemble),
    "energy_score": (TF.energy_score, energy),
    "interval_score": (lambda lo, hi, y: TF.interval_score(lo, hi, y, alpha=0.1), interval),
    "quantile_score": (_quantile_score, quantiles),
    "gaussian_nll": (TF.gaussian_nll, loc_scale),
    "dawid_sebastiani_score": (TF.dawid_sebastiani_score, loc_scale),
    "brier_reward": (lambda q, y: brier_reward(q, y, reduction="mean"), rewards),
    "log_reward": (lambda q, y: log_reward(q, y, reduction="mean"), rewards),
    "spherical_reward": (lambda q, y: spherical_reward(q, y, reduction="mean"), rewards),
    "correctness_brier_reward": (
        lambda q, y: correctness_brier_reward(q, y, reduction="mean"),
        rewards,
    ),
}


def functional_scores() -> list[str]:
    """The names in ``torchcal.functional.__all__`` defined in :data:`SCORE_MODULES`."""
    return [
        name for name in TF.__all__ if getattr(getattr(TF, name), "__module__", "") in SCORE_MODULES
    ]


def leaves(inputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Fresh copies, the floating ones requiring grad."""
    return tuple(x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs)


def all_cases() -> dict[str, tuple[Callable[..., Tensor], Inputs]]:
    """Every loss (a fresh module), loss variant and functional score, by name."""
    cases: dict[str, tuple[Callable[..., Tensor], Inputs]] = {}
    for name, (make, inputs) in {**LOSS_CASES, **LOSS_VARIANTS}.items():
        cases[name] = (make(), inputs)
    cases.update(SCORE_CASES)
    return cases
