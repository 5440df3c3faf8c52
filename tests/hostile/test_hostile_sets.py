"""Hostile inputs of the set surfaces of issue 30: stated levels (``confidence=``), the
non-randomised set rule, probabilities as given, set coverage and its metric state, and the
risk-coverage integration option. Every bad input is a named ValueError / TypeError."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from torchcal.functional import augrc, aurc, conformal_score_matrix, conformal_sets, set_coverage
from torchcal.metrics import AUGRC, AURC, SetCoverage
from torchcal.scaling import ConformalClassifier, SplitConformal, conformal_rank

F64 = torch.float64


@pytest.mark.parametrize(
    "confidence, error, match",
    [
        ("0.9", TypeError, "^confidence: expected a float"),
        (True, TypeError, "^confidence: expected a float"),
        (1, TypeError, "^confidence: expected a float"),
        (torch.tensor([0.9, 0.8]), TypeError, "^confidence: expected a float or a one-element"),
        (torch.tensor(9), TypeError, "^confidence: expected a float or a one-element"),
        (Decimal("1"), ValueError, "^confidence: expected a value in the open interval"),
        (Fraction(0), ValueError, "^confidence: expected a value in the open interval"),
        (math.inf, ValueError, "^confidence: expected a value in the open interval"),
        (-0.0, ValueError, "^confidence: expected a value in the open interval"),
        (np.float16(1.0), ValueError, "^confidence: expected a value in the open interval"),
    ],
)
def test_bad_confidence_is_named(confidence, error, match) -> None:
    with pytest.raises(error, match=match):
        conformal_rank(10, confidence=confidence)
    with pytest.raises(error, match=match):
        SplitConformal(confidence=confidence)


def test_confidence_of_exact_and_narrow_types() -> None:
    assert conformal_rank(9, confidence=Decimal("0.8")).item() == 8
    assert conformal_rank(9, confidence=Fraction(4, 5)).item() == 8
    assert conformal_rank(9, confidence=torch.tensor(0.8, dtype=torch.float16)).item() == 8
    assert conformal_rank(9, confidence=np.float32(0.8)).item() == 8
    # a level one ulp above 0.2 that is no 1 - c of a short c is not read as 1/5
    x = math.nextafter(0.2, 1.0)
    assert conformal_rank(10**17, x).item() != conformal_rank(10**17, 0.2).item()


def test_set_rule_with_masks_ties_and_thresholds_near_one() -> None:
    z = torch.tensor([[2.0, 2.0, -math.inf, 0.0], [5.0, -math.inf, -math.inf, -math.inf]])
    s = conformal_score_matrix(z, "aps", randomized=False)
    assert torch.equal(s[1], torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=F64))
    # the tie is ranked by label index; the masked label is reached only at a threshold 1
    sets = conformal_sets(z, math.nextafter(1.0, 0.0), "aps", randomized=False)
    assert sets.tolist() == [[True, True, False, True], [True, False, False, False]]
    assert bool(conformal_sets(z, 1.0, "aps", randomized=False).all())
    # a negative threshold is allowed and gives the empty set: nothing clips it
    assert not bool(conformal_sets(z, -0.5, "aps", randomized=False).any())
    with pytest.raises(ValueError, match="^threshold: NaN"):
        conformal_sets(z, math.nan, "aps", randomized=False)


@pytest.mark.parametrize(
    "probs",
    [
        [[0.5, math.nan]],
        [[1.2, -0.2]],
        [[0.5, 0.4]],  # sums to 0.9
    ],
)
def test_bad_probabilities_are_refused_not_renormalised(probs) -> None:
    with pytest.raises(ValueError, match="^logits"):
        conformal_score_matrix(torch.tensor(probs, dtype=F64), "aps", input="probs")
    with pytest.raises(ValueError, match="^logits"):
        ConformalClassifier(input="probs").fit(
            torch.tensor(probs * 4, dtype=F64), torch.zeros(4, dtype=torch.long)
        )


@pytest.mark.parametrize(
    "sets, target, error, match",
    [
        (torch.ones(3, 2), torch.zeros(3, dtype=torch.long), ValueError, "^sets: expected an"),
        (torch.ones(3, dtype=torch.bool), torch.zeros(3, dtype=torch.long), ValueError, "^sets"),
        (torch.ones(3, 2, dtype=torch.bool), torch.zeros(3), ValueError, "^target"),
        (torch.ones(3, 2, dtype=torch.bool), torch.full((3,), 2), ValueError, "^target"),
        (torch.ones(3, 2, dtype=torch.bool), torch.full((3,), -1), ValueError, "^target"),
        ([[True]], torch.zeros(1, dtype=torch.long), TypeError, "^sets"),
    ],
)
def test_bad_set_coverage_inputs(sets, target, error, match) -> None:
    with pytest.raises(error, match=match):
        set_coverage(sets, target)


def test_set_coverage_groups_and_levels() -> None:
    sets = torch.ones(4, 3, dtype=torch.bool)
    y = torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="^groups"):
        set_coverage(sets, y, torch.tensor([0, 1, 2, 3]), 3)
    with pytest.raises(ValueError, match="^groups"):
        set_coverage(sets, y, torch.zeros(4))
    with pytest.raises(ValueError, match="^num_groups: given without groups"):
        set_coverage(sets, y, None, 2)
    with pytest.raises(TypeError, match="^level"):
        set_coverage(sets, y, level=True)
    r = set_coverage(torch.zeros(4, 3, dtype=torch.bool), y)  # every set empty
    assert float(r.pooled.coverage) == 0.0 and float(r.pooled.empty) == 1.0
    assert float(r.pooled.median_size) == 0.0 and float(r.pooled.upper) > 0
    with pytest.raises(ValueError, match="^num_classes"):
        SetCoverage(num_classes=0)
    with pytest.raises(TypeError, match="^num_classes"):
        SetCoverage(num_classes=2.0)


def test_set_coverage_states_from_a_hostile_checkpoint() -> None:
    m = SetCoverage(num_classes=3, num_groups=2)
    m.update(
        torch.ones(4, 3, dtype=torch.bool),
        torch.zeros(4, dtype=torch.long),
        torch.tensor([0, 1, 0, 1]),
    )
    for name, value in (
        ("group_hits", torch.tensor([5, 0])),  # more covered rows than rows
        ("class_sizes", torch.zeros(3, 4)),  # floats for counts
        ("group_sizes", torch.zeros(2, 5, dtype=torch.int64)),  # a lying class count
    ):
        state = m.state_dict()
        state[name] = value
        with pytest.raises(ValueError, match="^state_dict: state"):
            SetCoverage(num_classes=3, num_groups=2).load_state_dict(state)


def test_integration_option_is_checked_everywhere() -> None:
    c, lo = torch.tensor([0.9, 0.1]), torch.tensor([0.0, 1.0])
    for bad in ("Trapezoid", None, 1):
        with pytest.raises((ValueError, TypeError), match="^integration"):
            aurc(c, lo, integration=bad)
        with pytest.raises((ValueError, TypeError), match="^integration"):
            augrc(c, lo, integration=bad)
        with pytest.raises((ValueError, TypeError), match="^integration"):
            AURC(integration=bad)
        with pytest.raises((ValueError, TypeError), match="^integration"):
            AUGRC(integration=bad)
    with pytest.raises(ValueError, match="^other: cannot merge"):
        AUGRC(n_bins=10).merge_state(AUGRC(n_bins=10, integration="mean"))
