"""Equal-mass ECE assigns whole samples when the bin count does not divide N (issue 21, item 4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchcal.functional import calibration_error
from torchcal.functional.calibration.adaptive import (
    equal_mass_calibration_error_from_samples,
    equal_mass_calibration_error_from_stats,
)
from torchcal.functional.calibration.binning import accumulate
from torchcal.functional.calibration.readings import prepare_inputs, samples_from

F64 = torch.float64


def _array_split_ece(f: np.ndarray, y: np.ndarray, B: int) -> float:
    order = np.lexsort((y, f))  # by confidence, ties by outcome
    return sum(len(q) / len(f) * abs(f[q].mean() - y[q].mean()) for q in np.array_split(order, B))


def test_torch_uncertainty_case_is_0278() -> None:
    # torch-uncertainty's AdaptiveCalibrationError test: 3/5 (1 - mean(.7, .76, .75)) + 2/5 (.8 - .5)
    p = torch.tensor([[0.7, 0.3], [0.76, 0.24], [0.75, 0.25], [0.2, 0.8], [0.8, 0.2]], dtype=F64)
    y = torch.tensor([0, 0, 0, 1, 1])
    want = 3 / 5 * (1 - (0.7 + 0.76 + 0.75) / 3) + 2 / 5 * (0.8 - 0.5)
    for exact in (False, True):
        got = calibration_error(p, y, n_bins=2, input="probs", estimator="equal_mass", exact=exact)
        assert float(got) == pytest.approx(want, abs=1e-12)
    prep = prepare_inputs(p, y, reading="confidence", input="probs")
    fine, samples = accumulate(prep, 4096).pooled(), samples_from(prep)
    frac = (
        2.5 / 5 * abs(0.7 + 0.75 + 0.5 * 0.76 - 2.5) / 2.5
        + 2.5 / 5 * abs(0.5 * 0.76 + 1.6 - 1.5) / 2.5
    )  # the old convention splits the 0.76 sample in two
    for f in (
        equal_mass_calibration_error_from_stats(fine, 2, split="fractional"),
        equal_mass_calibration_error_from_samples(samples, 2, split="fractional"),
    ):
        assert float(f) == pytest.approx(frac, abs=1e-12) and round(float(f), 3) == 0.23
    with pytest.raises(ValueError, match="^split"):
        equal_mass_calibration_error_from_stats(fine, 2, split="half")


@pytest.mark.parametrize("N", [17, 29, 1001])
def test_whole_samples_match_array_split(N: int) -> None:
    rng = np.random.default_rng(N)
    f = rng.uniform(0, 1, N)
    y = (rng.uniform(0, 1, N) < f**2).astype(float)
    prep = prepare_inputs(torch.tensor(f), torch.tensor(y), reading="binary", input="probs")
    fine, samples = accumulate(prep, 4096).pooled(), samples_from(prep)
    for B in (2, 5, 15, 16):
        ref = _array_split_ece(f, y, B)
        assert abs(float(equal_mass_calibration_error_from_samples(samples, B)) - ref) <= 1e-12
        # distinct confidences in distinct fine bins: the histogram is exact too
        one_per_fine = np.bincount(np.minimum(np.floor(f * 4096), 4095).astype(int)).max() == 1
        if one_per_fine:
            assert abs(float(equal_mass_calibration_error_from_stats(fine, B)) - ref) <= 1e-12


def _stated_bound(f: np.ndarray, B: int, F: int) -> float:
    """The docstring's bound: 2 sum(m) / N + sum(m) / F over boundaries inside a fine bin."""
    N = len(f)
    cum = np.concatenate(
        [[0], np.cumsum(np.bincount(np.minimum(np.floor(f * F), F - 1).astype(int), minlength=F))]
    )
    b = np.arange(B + 1)
    ranks = b * (N // B) + np.minimum(b, N % B)
    m = 0
    for r in ranks:
        j = np.searchsorted(cum, r, side="right") - 1
        if j < F and cum[j] < r < cum[j + 1]:
            m += min(r - cum[j], cum[j + 1] - r)
    return 2 * m / N + m / F


def test_n17_on_a_confidence_grid_within_the_stated_bound() -> None:
    # issue 18: N = 17 with tied confidences, the histogram must stay within its stated bound
    rng = np.random.default_rng(17)
    worst = 0.0
    for _ in range(200):
        f = rng.integers(5, 11, 17) / 10
        y = (rng.uniform(0, 1, 17) < f).astype(float)
        prep = prepare_inputs(torch.tensor(f), torch.tensor(y), reading="binary", input="probs")
        fine, samples = accumulate(prep, 4096).pooled(), samples_from(prep)
        for B in (2, 5, 15):
            exact = float(equal_mass_calibration_error_from_samples(samples, B))
            assert abs(exact - _array_split_ece(f, y, B)) <= 1e-12
            err = abs(float(equal_mass_calibration_error_from_stats(fine, B)) - exact)
            bound = _stated_bound(f, B, 4096)
            assert err <= bound + 1e-12
            worst = max(worst, err)
    assert worst > 1e-3  # ties do straddle boundaries here: the bound is exercised
