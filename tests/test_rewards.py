"""Tests for torchcal.rewards / torchcal.functional.rewards: properness, values, gradients, inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from torch.autograd import gradcheck

import torchcal
from torchcal.functional import validation_enabled
from torchcal.rewards import (
    REWARDS,
    brier_reward,
    correctness_brier_reward,
    log_reward,
    spherical_reward,
)

STRICT = [brier_reward, log_reward, spherical_reward, correctness_brier_reward]
IDS = [f.__name__ for f in STRICT]
P_GRID = np.round(np.linspace(0.02, 0.98, 25), 12).tolist() + [0.5, 0.001, 0.999]


def expected_reward(reward, q: float, p: float, **options) -> float:
    """Closed-form ``E_{y ~ Bernoulli(p)} reward(q, y) = p r(q, 1) + (1 - p) r(q, 0)``, float64."""
    qq = torch.tensor([q, q], dtype=torch.float64)
    r = reward(qq, torch.tensor([1, 0]), **options)
    return p * r[0].item() + (1 - p) * r[1].item()


def maximiser(reward, p: float, bounds=(0.0, 1.0), **options) -> float:
    """argmax over q of the expected reward by bounded Brent (float64, xatol 1e-12)."""
    res = minimize_scalar(
        lambda q: -expected_reward(reward, q, p, **options),
        bounds=bounds,
        method="bounded",
        options={"xatol": 1e-12, "maxiter": 500},
    )
    assert res.success
    return float(res.x)


def improper_control(confidence: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """Pays the confidence on success, ``q * 1[correct]``: NOT proper (argmax q = 1)."""
    return confidence * correct.to(confidence.dtype)


def correctness_only(confidence: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """The 0/1 correctness reward: does not depend on the confidence at all."""
    return correct.to(confidence.dtype) + 0.0 * confidence


# ------------------------------------------------------------------------------ properness


@pytest.mark.parametrize("reward", STRICT, ids=IDS)
def test_expected_reward_is_maximised_at_the_truth(reward):
    for p in P_GRID:
        assert maximiser(reward, p) == pytest.approx(p, abs=1e-6), p


@pytest.mark.parametrize("reward", STRICT, ids=IDS)
def test_dense_grid_argmax_is_the_truth_and_unique(reward):
    # all grid points at once: E = p r(q, 1) + (1 - p) r(q, 0) for 20001 values of q
    q = torch.linspace(0, 1, 20001, dtype=torch.float64)
    r1 = reward(q, torch.ones_like(q, dtype=torch.long))
    r0 = reward(q, torch.zeros_like(q, dtype=torch.long))
    for p in [0.03, 0.2, 0.37, 0.5, 0.81, 0.96]:
        e = p * r1 + (1 - p) * r0
        e = torch.where(torch.isnan(e), -math.inf, e)  # log: 0 * -inf at the ends
        k = int(torch.argmax(e))
        assert abs(q[k].item() - p) <= 0.5e-4  # the grid point nearest p
        far = (q - p).abs() > 1e-2
        assert bool((e[far] < e[k] - 1e-6).all())  # strictly lower away from p


def test_closed_form_expected_rewards():
    # independent closed forms of E_p[r(q, Y)] (see the docstrings)
    for p, q in [(0.3, 0.6), (0.9, 0.2), (0.5, 0.5)]:
        assert expected_reward(brier_reward, q, p) == pytest.approx(-((q - p) ** 2) - p * (1 - p))
        kl = p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
        ent = -(p * math.log(p) + (1 - p) * math.log(1 - p))
        assert expected_reward(log_reward, q, p) == pytest.approx(-kl - ent, rel=1e-12)
        assert expected_reward(correctness_brier_reward, q, p) == pytest.approx(
            p - (q - p) ** 2 - p * (1 - p), rel=1e-12
        )
    # the combined reward's best value p^2 grows with p (prefers likely-right answers);
    # the Brier reward's best value -p(1 - p) does not
    best = [expected_reward(correctness_brier_reward, p, p) for p in (0.1, 0.5, 0.9)]
    assert best == pytest.approx([0.01, 0.25, 0.81], rel=1e-12)
    assert expected_reward(brier_reward, 0.0, 0.0) > expected_reward(brier_reward, 0.9, 0.9)


def test_improper_controls_fail_the_harness():
    for p in [0.1, 0.3, 0.6, 0.9]:
        assert maximiser(improper_control, p) > 1 - 1e-6  # pays over-confidence
        # 0/1 correctness: the expected reward is p whatever q is, no signal to calibrate
        values = [expected_reward(correctness_only, q, p) for q in (0.0, 0.3, p, 1.0)]
        assert max(values) - min(values) == 0.0


def test_log_reward_floor_breaks_strict_properness_below_the_floor():
    floor = 0.05
    # between the floors it is still strictly proper
    for p in [0.06, 0.3, 0.5, 0.9, 0.94]:
        assert maximiser(log_reward, p, floor=floor) == pytest.approx(p, abs=1e-6)
    # below the floor every q in [0, floor] earns the same expected reward: p is no longer
    # the unique maximiser (and the gradient there is 0, nothing pulls q towards p)
    for p in [0.001, 0.01, 0.03]:
        values = [expected_reward(log_reward, q, p, floor=floor) for q in (0.0, p, 0.02, floor)]
        assert max(values) - min(values) == 0.0
        assert expected_reward(log_reward, 0.0, p, floor=floor) > expected_reward(
            log_reward, floor + 1e-3, p, floor=floor
        )
        assert expected_reward(log_reward, 0.0, p) == -math.inf  # without a floor: -inf at 0
    q = torch.tensor([0.0, 0.02, 0.97, 1.0], dtype=torch.float64, requires_grad=True)
    log_reward(q, torch.tensor([1, 0, 1, 0]), floor=floor).sum().backward()
    assert torch.equal(q.grad, torch.zeros(4, dtype=torch.float64))


# ---------------------------------------------------------------------------------- values


def test_hand_worked_values():
    q = torch.tensor([0.9, 0.9, 0.25, 0.6, 1.0, 0.0], dtype=torch.float64)
    y = torch.tensor([1, 0, 0, 0, 1, 0])
    np.testing.assert_allclose(
        brier_reward(q, y).numpy(), [-0.01, -0.81, -0.0625, -0.36, 0.0, 0.0], rtol=1e-14
    )
    np.testing.assert_allclose(
        correctness_brier_reward(q, y).numpy(), [0.99, -0.81, -0.0625, -0.36, 1.0, 0.0], rtol=1e-14
    )
    np.testing.assert_allclose(
        log_reward(q, y).numpy(),
        [math.log(0.9), math.log(0.1), math.log(0.75), math.log(0.4), 0.0, 0.0],
        rtol=1e-14,
    )
    # spherical: (0.9, 1): 0.9 / sqrt(0.82); (0.6, 0): 0.4 / sqrt(0.52); certain and right: 1
    np.testing.assert_allclose(
        spherical_reward(q, y).numpy(),
        [0.9 / math.sqrt(0.82), 0.1 / math.sqrt(0.82), 0.75 / math.sqrt(0.625)]
        + [0.4 / math.sqrt(0.52), 1.0, 1.0],
        rtol=1e-14,
    )
    assert log_reward(torch.tensor([0.0, 1.0]), torch.tensor([1, 0])).tolist() == [
        -math.inf,
        -math.inf,
    ]
    # tiny q: log1p keeps full relative precision (log(1 - 1e-12) would lose about 4 digits)
    tiny = log_reward(torch.tensor([1e-12], dtype=torch.float64), torch.tensor([0]))
    assert tiny.item() == pytest.approx(-1e-12 - 0.5e-24, rel=1e-15)


@pytest.mark.parametrize("reward", STRICT, ids=IDS)
def test_label_dtypes_shapes_and_reductions(reward):
    g = torch.Generator().manual_seed(3)
    q = torch.rand(4, 5, generator=g, dtype=torch.float64) * 0.98 + 0.01
    y = torch.rand(4, 5, generator=g) < 0.5
    ref = reward(q, y)
    assert ref.shape == (4, 5) and ref.dtype == torch.float64
    for labels in (y.long(), y.double(), y.float(), y.to(torch.uint8)):
        assert torch.equal(reward(q, labels), ref)
    assert reward(q, y, reduction="sum").item() == pytest.approx(
        float(ref.numpy().sum()), rel=1e-14
    )
    assert reward(q, y, reduction="mean").item() == pytest.approx(
        float(ref.numpy().mean()), rel=1e-14
    )
    half = reward(q.half(), y)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, reward(q.half().float(), y), rtol=0, atol=0)


# ------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("reward", STRICT, ids=IDS)
def test_gradcheck_float64(reward):
    g = torch.Generator().manual_seed(4)
    q = (torch.rand(12, generator=g, dtype=torch.float64) * 0.9 + 0.05).requires_grad_()
    y = torch.randint(0, 2, (12,), generator=g)
    assert gradcheck(lambda x: reward(x, y), (q,))
    assert gradcheck(lambda x: reward(x, y, reduction="mean"), (q,))


def test_gradients_match_closed_forms_and_are_finite_at_the_ends():
    q = torch.tensor([0.0, 0.3, 1.0, 0.0, 0.7, 1.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 0, 0, 1, 1, 1])
    yf = y.double()
    (gb,) = torch.autograd.grad(brier_reward(q, y).sum(), q)
    torch.testing.assert_close(gb, -2 * (q.detach() - yf), rtol=0, atol=1e-15)
    (gc,) = torch.autograd.grad(correctness_brier_reward(q, y).sum(), q)
    torch.testing.assert_close(gc, gb, rtol=0, atol=0)
    (gl,) = torch.autograd.grad(log_reward(q, y).sum(), q)
    # d/dq: y / q - (1 - y) / (1 - q); infinite only where the reward is -inf
    assert gl[[0, 1, 4, 5]].tolist() == pytest.approx([-1.0, -1 / 0.7, 1 / 0.7, 1.0], rel=1e-14)
    assert not torch.isnan(gl).any()
    (gs,) = torch.autograd.grad(spherical_reward(q, y).sum(), q)
    assert torch.isfinite(gs).all()
    # y = 1: d/dq q / sqrt(q^2 + (1 - q)^2) = (1 - q) / (q^2 + (1 - q)^2)^(3/2)
    qq = 0.7
    assert gs[4].item() == pytest.approx((1 - qq) / (qq**2 + (1 - qq) ** 2) ** 1.5, rel=1e-13)


# ------------------------------------------------------------------------------- bad input

_Q = torch.tensor([0.2, 0.8])
_Y = torch.tensor([1, 0])

BAD = [
    (lambda f: f(torch.tensor([0.2, 1.5]), _Y), ValueError, r"^confidence: expected probabilities"),
    (
        lambda f: f(torch.tensor([-0.1, 0.5]), _Y),
        ValueError,
        r"^confidence: expected probabilities",
    ),
    (lambda f: f(torch.tensor([0.2, math.nan]), _Y), ValueError, r"^confidence: expected"),
    (lambda f: f(torch.tensor([1, 0]), _Y), ValueError, r"^confidence: expected a floating"),
    (
        lambda f: f(torch.tensor([]), torch.tensor([])),
        ValueError,
        r"^confidence: expected a non-empty",
    ),
    (lambda f: f(_Q, torch.tensor([1, 2])), ValueError, r"^correct: expected binary labels"),
    (lambda f: f(_Q, torch.tensor([0.5, 1.0])), ValueError, r"^correct: expected binary labels"),
    (lambda f: f(_Q, torch.tensor([math.nan, 1.0])), ValueError, r"^correct: expected binary"),
    (lambda f: f(_Q, torch.tensor([1])), ValueError, r"^correct: expected the shape of confidence"),
    (lambda f: f(_Q[None], _Y), ValueError, r"^correct: expected the shape of confidence"),
    (lambda f: f(_Q, _Y, reduction="avg"), ValueError, r"^reduction: expected one of"),
    (lambda f: f([0.2, 0.8], _Y), TypeError, r"^confidence: expected a torch.Tensor"),
    (lambda f: f(_Q, [1, 0]), TypeError, r"^correct: expected a torch.Tensor"),
]


@pytest.mark.parametrize("reward", STRICT, ids=IDS)
@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input(reward, case):
    call, exc, match = BAD[case]
    with pytest.raises(exc, match=match):
        call(reward)


@pytest.mark.parametrize("floor", [0.0, 0.5, -0.1, 1.0, math.nan])
def test_bad_floor(floor):
    with pytest.raises(ValueError, match=r"^floor: expected None or a number in \(0, 0.5\)"):
        log_reward(_Q, _Y, floor=floor)
    with pytest.raises(TypeError, match=r"^floor: expected a float or None"):
        log_reward(_Q, _Y, floor=True)


def test_value_checks_can_be_switched_off():
    with validation_enabled(False):
        out = brier_reward(torch.tensor([1.5]), torch.tensor([1]))
    assert out.item() == pytest.approx(-0.25)


# ------------------------------------------------------------------------ public namespace


def test_public_namespace_and_tags():
    assert torchcal.rewards.REWARDS is REWARDS
    assert "rewards" in torchcal.__all__
    assert set(REWARDS) == set(torchcal.rewards.__all__) - {"REWARDS"}
    for name, (fn, tag) in REWARDS.items():
        assert fn is getattr(torchcal.functional.rewards, name) and fn.__name__ == name
        assert tag in {"strict", "proper", "no"}
        assert f'is_proper = "{tag}"' in fn.__doc__
