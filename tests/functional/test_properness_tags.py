"""``is_proper`` tags of every loss in torchcal.losses, checked by the properness harness.

The harness (tests/functional/_properness.py, shared with test_scoring.py and
test_regularizers.py): for a true class distribution ``q`` and one forecast
``p = softmax(z)``, minimise the expected loss ``E_{y ~ q} L(z, y) = sum_c q_c L(z[None], c)``
over ``z`` by LBFGS in float64 and compare the argmin with ``q``. A "strict" rule must give
``q``; a "no" rule, as used, must give something else (or leave ``q`` one of many
minimisers).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _properness import Q, argmin_forecast, entropy, expected, lbfgs_minimise, log_plus

import torchcal.losses as L

TAGS = {"strict", "proper", "no"}

# one instance of every loss, with the tag it must carry
INSTANCES = {
    "LogScoreLoss": [(L.LogScoreLoss(), "strict"), (L.LogScoreLoss(label_smoothing=0.1), "no")],
    "BrierLoss": [(L.BrierLoss(), "strict")],
    "SphericalLoss": [(L.SphericalLoss(), "strict")],
    "RPSLoss": [(L.RPSLoss(), "strict")],
    "FocalLoss": [
        (L.FocalLoss(gamma=0.0), "strict"),
        (L.FocalLoss(gamma=2.0), "no"),
        (L.FocalLoss(gamma="adaptive"), "no"),
    ],
    "MMCELoss": [(L.MMCELoss(), "no")],
    "SoftBinnedECELoss": [(L.SoftBinnedECELoss(), "no")],
    "ConfidencePenaltyLoss": [(L.ConfidencePenaltyLoss(), "no")],
    "DCALoss": [(L.DCALoss(), "no")],
    "MDCALoss": [(L.MDCALoss(), "no")],
    "CRPSLoss": [(L.CRPSLoss("normal"), "strict"), (L.CRPSLoss("ensemble"), "strict")],
    "EnergyScoreLoss": [(L.EnergyScoreLoss(), "strict")],
    "IntervalScoreLoss": [(L.IntervalScoreLoss(alpha=0.1), "proper")],
    "QuantileLoss": [(L.QuantileLoss([0.1, 0.9]), "proper")],
    "GaussianNLLLoss": [(L.GaussianNLLLoss(), "strict")],
    "DawidSebastianiLoss": [(L.DawidSebastianiLoss(), "proper")],
}


# ------------------------------------------------------------------------------------ tags


def test_every_loss_has_a_tag():
    assert set(INSTANCES) == set(L.__all__)  # a new loss must be added here with its tag
    for name, cases in INSTANCES.items():
        for loss, tag in cases:
            assert type(loss).__name__ == name
            assert loss.is_proper in TAGS and loss.is_proper == tag, (name, loss)
            assert f'is_proper = "{tag}"' in type(loss).__doc__ or "``is_proper``:" in (
                type(loss).__doc__
            )


def test_tags_follow_the_options():
    assert L.LogScoreLoss(label_smoothing=0.0).is_proper == "strict"
    assert L.FocalLoss(gamma=0).is_proper == "strict"
    assert L.FocalLoss(gamma=0.5).is_proper == "no"
    focal = L.FocalLoss(gamma=0.0)
    focal.gamma = 1.0  # a property, not a value frozen at construction
    assert focal.is_proper == "no"


# ------------------------------------------------------------------- strict: argmin = q


STRICT_CLASSIFICATION = [
    (name, loss)
    for name, cases in INSTANCES.items()
    for loss, tag in cases
    if tag == "strict" and name in L.classification.__all__
]


@pytest.mark.parametrize(
    ("name", "loss"), STRICT_CLASSIFICATION, ids=[n for n, _ in STRICT_CLASSIFICATION]
)
def test_strict_classification_losses_pass_the_harness(name, loss):
    for q in (Q, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)):
        p = argmin_forecast(expected(loss, q), q.numel())
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- "no": the harness fails


def test_improper_alone_label_smoothing_and_focal():
    # used alone, in place of the log score
    p = argmin_forecast(expected(L.LogScoreLoss(label_smoothing=0.1), Q), 3)
    torch.testing.assert_close(p, 0.9 * Q + 0.1 / 3, rtol=0, atol=1e-6)
    assert (p - Q).abs().max() > 0.02
    for gamma in (2.0, "adaptive"):  # focal and FLSD-53: flatter than the truth
        p = argmin_forecast(expected(L.FocalLoss(gamma=gamma), Q), 3)
        assert entropy(p) > entropy(Q) + 0.02 and (p - Q).abs().max() > 0.02, gamma


def test_improper_alone_mmce_and_soft_binned_ece():
    # used alone: they read only the top-class confidence, so they pin p_max = q_max and
    # leave the rest where the optimiser started (uniform): q is one of many minimisers
    for reg in (L.MMCELoss(), L.SoftBinnedECELoss()):
        score = expected(reg, Q)
        p = argmin_forecast(score, 3)
        assert p[0].item() == pytest.approx(0.6, abs=1e-6)
        torch.testing.assert_close(p, torch.tensor([0.6, 0.2, 0.2], dtype=torch.float64))
        assert (p - Q).abs().max() > 0.04
        assert score(p.log()).item() <= score(Q.log()).item() + 1e-12
        # added to the log score (per item) both terms are minimised at q: no shift there
        p = argmin_forecast(expected(log_plus(1.0, reg), Q), 3)
        torch.testing.assert_close(p, Q, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "regulariser",
    [L.DCALoss(beta=1.0), L.MDCALoss(beta=1.0), L.ConfidencePenaltyLoss(beta=0.5)],
    ids=["DCA", "MDCA", "confidence_penalty"],
)
def test_improper_as_used_log_score_plus_regulariser(regulariser):
    # as used: log score + regulariser (beta inside the module); DCA / MDCA per item reward
    # a larger top probability (sharper), the confidence penalty rewards entropy (flatter)
    p = argmin_forecast(expected(log_plus(1.0, regulariser), Q), 3)
    assert (p - Q).abs().max() > 0.02
    if isinstance(regulariser, L.ConfidencePenaltyLoss):
        assert entropy(p) > entropy(Q) + 0.02
    else:
        assert p[0] > Q[0] + 0.02


# ------------------------------------------------------------ continuous strict rules


def _normal_argmin(loss_of_loc_scale) -> tuple[float, float]:
    """argmin over (mu, log sigma) of a loss already averaged over the truth's quadrature."""
    start = torch.zeros(2, dtype=torch.float64)
    theta = lbfgs_minimise(lambda t: loss_of_loc_scale(t[0], t[1].exp()), start)
    return theta[0].item(), theta[1].exp().item()


def test_continuous_strict_rules_are_minimised_at_the_true_normal():
    # E_{Y ~ N(1.5, 0.7^2)} by 60-node Gauss-Hermite quadrature (exact to ~1e-15 here)
    mu, sigma = 1.5, 0.7
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)
    y = torch.tensor(mu + sigma * nodes, dtype=torch.float64)
    w = torch.tensor(weights / weights.sum(), dtype=torch.float64)
    crps = L.CRPSLoss("normal", reduction="none")
    nll = L.GaussianNLLLoss(spread="scale", reduction="none")
    for loss in (crps, nll):
        m, s = _normal_argmin(
            lambda loc, scale, loss=loss: (w * loss(loc.expand_as(y), scale.expand_as(y), y)).sum()
        )
        assert m == pytest.approx(mu, abs=1e-6) and s == pytest.approx(sigma, abs=1e-6), loss


def expected_over_batches(loss, q: torch.Tensor, m: int):
    """``z -> E loss(z repeated m times, y)`` over every batch ``y`` of ``m`` labels drawn
    from ``q`` (exact enumeration of the ``C^m`` batches: one context, a batch of ``m``)."""
    ys = torch.cartesian_prod(*[torch.arange(q.numel())] * m).reshape(-1, m)
    weights = q[ys].prod(dim=1)
    return lambda z: sum(w * loss(z.expand(m, -1), y) for w, y in zip(weights, ys))


@pytest.mark.parametrize(
    ("squared", "root"),
    [(L.MMCELoss(), L.MMCELoss(squared=False)),
     (L.SoftBinnedECELoss(), L.SoftBinnedECELoss(root=True))],
    ids=["MMCE", "SB-ECE"],
)  # fmt: skip
def test_log_plus_batch_penalty_squared_keeps_the_truth_root_moves_it(squared, root):
    # one context, a batch of 4: in one context the squared penalty is (mean(o) - r)^2 (its
    # expectation is minimised at r = q_max), the root |mean(o) - r| is not (a median); so
    # log + w * squared has a zero gradient at the truth, log + w * root does not (the
    # bake-off's objectives, as in the papers: recipes/loss_bakeoff/losses.py)
    at_truth = Q.log().clone().requires_grad_(True)
    for penalty, stationary in ((squared, True), (root, False)):
        score = expected_over_batches(log_plus(2.0, penalty), Q, 4)
        (grad,) = torch.autograd.grad(score(at_truth), at_truth)
        if stationary:
            assert grad.abs().max().item() < 1e-10, grad
        else:
            assert grad.abs().max().item() > 0.01, grad
