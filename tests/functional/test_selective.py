"""Risk-coverage, AURC and AUGRC with ties as blocks: equal to the tie-averaged brute force,
bitwise invariant under row permutations, and the binned form within its stated bound."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from torchcal.functional import (
    augrc,
    aurc,
    binned_statistics,
    coverage_at_risk,
    risk_at_coverage,
    risk_coverage_curve,
    risk_coverage_from_stats,
    selective_binned_bound,
)
from torchcal.functional.calibration.binning import accumulate
from torchcal.functional.calibration.readings import prepare_inputs, samples_from

F64 = torch.float64


def _brute(conf: list[float], loss: list[Fraction], coverage: Fraction):
    """Average over every order within the tie blocks, in exact fractions."""
    N = len(conf)
    levels = sorted(set(conf), reverse=True)
    blocks = [[loss[i] for i in range(N) if conf[i] == v] for v in levels]
    tot_aurc = tot_augrc = tot_trap = tot_risk = Fraction(0)
    count = 0
    k = math.ceil(coverage * N)
    for orders in itertools.product(*(itertools.permutations(b) for b in blocks)):
        seq = [x for o in orders for x in o]
        S = list(itertools.accumulate(seq))
        tot_aurc += sum(S[i] / (i + 1) for i in range(N)) / N
        tot_augrc += sum(S) / (N * N)
        tot_trap += sum((a + b) / 2 for a, b in zip([0, *S[:-1]], S)) / (N * N)
        tot_risk += S[k - 1] / k
        count += 1
    return tot_aurc / count, (tot_augrc / count, tot_trap / count), tot_risk / count


@pytest.mark.parametrize("seed", range(6))
def test_exact_equals_tie_averaged_brute_force(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    N = 9
    conf = (torch.randint(0, 4, (N,), generator=g) / 4).tolist()  # heavy ties
    raw = torch.randint(0, 5, (N,), generator=g).tolist()
    loss = [Fraction(r, 4) if seed % 2 else Fraction(int(r > 2)) for r in raw]
    for cov in (Fraction(1, 3), Fraction(1, 2), Fraction(7, 10), Fraction(1)):
        a, b, r = _brute(conf, loss, cov)
        c, lo = torch.tensor(conf, dtype=F64), torch.tensor([float(x) for x in loss], dtype=F64)
        assert abs(float(aurc(c, lo)) - float(a)) <= 1e-12
        b_mean, b_trapezoid = b  # the trapezoid over every sample, averaged over tie orders
        assert abs(float(augrc(c, lo)) - float(b_trapezoid)) <= 1e-12
        assert abs(float(augrc(c, lo, integration="mean")) - float(b_mean)) <= 1e-12
        gap = float(b_mean - b_trapezoid) - float(sum(loss)) / (2 * N * N)
        assert abs(gap) <= 1e-15  # exactly mean(loss) / (2N)
        assert abs(float(risk_at_coverage(c, lo, float(cov))) - float(r)) <= 1e-12


def _grid_case(N: int = 10_000, seed: int = 0):
    # the case: 10k stated confidences on a 0.1 grid, outcomes drawn at that rate
    g = torch.Generator().manual_seed(seed)
    conf = torch.randint(5, 11, (N,), generator=g).to(F64) / 10
    correct = torch.rand(N, generator=g, dtype=F64) < conf * 0.9
    return conf, (~correct).to(F64)


def _row_order_aurc(conf: torch.Tensor, loss: torch.Tensor) -> float:
    """AURC with ties broken by row order (what a plain stable sort does)."""
    order = torch.argsort(conf, descending=True, stable=True)
    S = torch.cumsum(loss[order], 0)
    return float((S / torch.arange(1, len(S) + 1, dtype=F64)).mean())


def test_bitwise_invariant_under_shuffles_and_outcome_sorted_orders() -> None:
    conf, loss = _grid_case()
    ref = risk_coverage_curve(conf, loss)
    ref_r = risk_at_coverage(conf, loss, 0.5)
    ref_c = coverage_at_risk(conf, loss, 0.2)
    g = torch.Generator().manual_seed(1)
    orders = [torch.randperm(len(conf), generator=g) for _ in range(50)]
    orders += [torch.argsort(loss, stable=True), torch.argsort(-loss, stable=True)]
    naive = []
    for o in orders:
        rc = risk_coverage_curve(conf[o], loss[o])
        for x, y in zip(rc, ref):
            assert torch.equal(x, y)  # bitwise
        assert torch.equal(risk_at_coverage(conf[o], loss[o], 0.5), ref_r)
        assert torch.equal(coverage_at_risk(conf[o], loss[o], 0.2), ref_c)
        naive.append(_row_order_aurc(conf[o], loss[o]))
    # the trap it avoids: breaking ties by row order moves the AURC by far more than 1e-3
    assert max(naive) - min(naive) > 0.05
    assert min(naive) < float(ref.aurc) < max(naive)


def test_binned_within_its_stated_bound_and_exact_on_separated_ties() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(5000, 4, generator=g, dtype=F64) * 2
    y = torch.multinomial(torch.softmax(logits, 1), 1, generator=g)[:, 0]
    prep = prepare_inputs(logits, y, reading="confidence", input="logits")
    samples = samples_from(prep)
    exact = risk_coverage_curve(samples.conf, 1 - samples.outcome)
    for bins in (10, 15, 100, 1000):
        st = accumulate(prep, bins).pooled()
        binned = risk_coverage_from_stats(st)
        b_aurc, b_augrc = selective_binned_bound(st)
        assert abs(float(binned.aurc - exact.aurc)) <= float(b_aurc) + 1e-12
        assert abs(float(binned.augrc - exact.augrc)) <= float(b_augrc) + 1e-12
    # stated confidences k / 10 fall one level per bin with 20 bins: binned equals exact
    conf, loss = _grid_case(2000)
    st = binned_statistics(
        torch.stack([conf, 1 - conf], 1), (loss > 0).long(), n_bins=20, input="probs"
    ).pooled()  # predicted class 0 with confidence conf, correct iff loss == 0
    rc = risk_coverage_from_stats(st)
    assert abs(float(rc.aurc - aurc(conf, loss))) <= 1e-12
    assert abs(float(rc.augrc - augrc(conf, loss))) <= 1e-12


def test_curve_values_and_bad_input() -> None:
    c = torch.tensor([0.9, 0.8, 0.8, 0.6])
    lo = torch.tensor([0.0, 1.0, 0.0, 1.0])
    rc = risk_coverage_curve(c, lo)
    assert rc.count.tolist() == [1, 2, 1] and rc.generalized_risk.tolist() == [0, 0.25, 0.5]
    assert float(coverage_at_risk(c, lo, 0.0)) == 0.25
    assert float(coverage_at_risk(torch.tensor([0.5]), torch.tensor([1.0]), 0.1)) == 0.0
    assert float(risk_at_coverage(c, lo, 1.0)) == 0.5
    with pytest.raises(ValueError, match="^loss"):
        aurc(c, -lo)
    with pytest.raises(ValueError, match="^loss"):
        aurc(c, lo[:3])
    with pytest.raises(ValueError, match="^confidence"):
        aurc(torch.tensor([math.nan, 0.5]), lo[:2])
    with pytest.raises(ValueError, match="^coverage"):
        risk_at_coverage(c, lo, 0.0)
    with pytest.raises(ValueError, match="^risk"):
        coverage_at_risk(c, lo, -1.0)


def test_thread_count_does_not_change_a_bit() -> None:
    g = torch.Generator().manual_seed(3)
    conf = (torch.rand(400_000, generator=g, dtype=F64) * 100).round() / 100
    loss = torch.rand(400_000, generator=g, dtype=F64)
    old = torch.get_num_threads()
    try:
        got = []
        for t in (1, 2):
            torch.set_num_threads(t)
            got.append((aurc(conf, loss), augrc(conf, loss)))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])


# fd-shifts (IML-DKFZ/fd-shifts, fd_shifts/tests/utils.py, RC_STATS_TEST_CASES: the AUGRC
# authors' own cases, N = 100, n_bins irrelevant to these two values): (aurc, augrc) of
# (confidence, correct), loss = 1 - correct. fd-shifts' "aurc" is the trapezoid rule over the
# block ends (its curve starts at the first block's risk), its "augrc" the trapezoid from (0, 0).
FD_SHIFTS_CASES = {
    ("all_equal", "all_one"): (0.0, 0),
    ("all_equal", "all_zero"): (1.0, 0.5),
    ("all_equal", "alt01"): (0.5, 0.25),
    ("all_equal", "asc"): (0.5, 0.24999999999999997),
    ("all_equal", "plateaus"): (0.5, 0.25000000000000017),
    ("alt01", "all_one"): (0.0, 0),
    ("alt01", "all_zero"): (1.0, 0.5),
    ("alt01", "alt01"): (0.125, 0.125),
    ("alt01", "asc"): (0.49621212121212127, 0.24873737373737373),
    ("alt01", "plateaus"): (0.49699999999999944, 0.24899999999999978),
    ("alt10", "all_one"): (0.0, 0),
    ("alt10", "all_zero"): (1.0, 0.5),
    ("alt10", "alt01"): (0.875, 0.375),
    ("alt10", "asc"): (0.503787878787879, 0.25126262626262635),
    ("alt10", "plateaus"): (0.5029999999999994, 0.2509999999999998),
    ("asc", "all_one"): (0.0, 0),
    ("asc", "all_zero"): (1.0, 0.5),
    ("asc", "alt01"): (0.48281112575762547, 0.2475),
    ("asc", "asc"): (0.24750000000000133, 0.16583333333333353),
    ("asc", "plateaus"): (0.3182085320116945, 0.18750000000000108),
    ("asc_unnormalized", "all_one"): (0.0, 0),
    ("asc_unnormalized", "all_zero"): (1.0, 0.5),
    ("asc_unnormalized", "alt01"): (0.48281112575762547, 0.2475),
    ("asc_unnormalized", "asc"): (0.24750000000000133, 0.16583333333333353),
    ("asc_unnormalized", "plateaus"): (0.3182085320116945, 0.18750000000000108),
    ("plateaus", "all_one"): (0.0, 0),
    ("plateaus", "all_zero"): (1.0, 0.5),
    ("plateaus", "alt01"): (0.49083333333333334, 0.2475),
    ("plateaus", "plateau_permutation"): (0.49083333333333334, 0.2475),
    ("plateaus", "asc"): (0.2632575757575754, 0.17108585858585845),
    ("plateaus", "plateaus"): (0.31250000000000255, 0.18750000000000097),
}


def _fd_shifts_arrays() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    N = 100
    ar = torch.arange(N, dtype=F64)
    plateaus = torch.tensor([0.2, 0.4, 0.6, 0.8], dtype=F64).repeat_interleave(N // 4)
    conf = {
        "all_equal": torch.full((N,), 0.37, dtype=F64),  # fd-shifts: one np.random.random()
        "alt01": ar % 2,
        "alt10": (ar + 1) % 2,
        "asc": torch.linspace(0, 1, N, dtype=F64),
        "asc_unnormalized": torch.arange(-(N // 2), N // 2, dtype=F64),
        "plateaus": plateaus,
    }
    g = torch.Generator().manual_seed(0)  # fd-shifts: a random permutation within each quarter
    quarters = (ar % 2).reshape(4, N // 4)
    perm = torch.cat([q[torch.randperm(N // 4, generator=g)] for q in quarters])
    correct = {
        "all_one": torch.ones(N, dtype=F64),
        "all_zero": torch.zeros(N, dtype=F64),
        "alt01": ar % 2,
        "asc": torch.linspace(0, 1, N, dtype=F64),
        "plateaus": plateaus,
        "plateau_permutation": perm,
    }
    return conf, correct


@pytest.mark.parametrize("case", sorted(FD_SHIFTS_CASES), ids="-".join)
def test_augrc_and_trapezoid_aurc_equal_fd_shifts(case: tuple[str, str]) -> None:
    conf, correct = _fd_shifts_arrays()
    c, loss = conf[case[0]], 1 - correct[case[1]]
    want_aurc, want_augrc = FD_SHIFTS_CASES[case]
    assert abs(float(augrc(c, loss)) - want_augrc) <= 1e-12
    assert abs(float(aurc(c, loss, integration="trapezoid")) - want_aurc) <= 1e-12
    # the mean form is larger by exactly mean(loss) / (2N) (all wrong: 0.505 against 0.5)
    gap = float(augrc(c, loss, integration="mean") - augrc(c, loss))
    assert abs(gap - float(loss.mean()) / 200) <= 1e-15


def test_integration_is_checked() -> None:
    c, lo = torch.tensor([0.9, 0.8]), torch.tensor([0.0, 1.0])
    for f in (aurc, augrc):
        with pytest.raises(ValueError, match="^integration"):
            f(c, lo, integration="simpson")
