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
    tot_aurc = tot_augrc = tot_risk = Fraction(0)
    count = 0
    k = math.ceil(coverage * N)
    for orders in itertools.product(*(itertools.permutations(b) for b in blocks)):
        seq = [x for o in orders for x in o]
        S = list(itertools.accumulate(seq))
        tot_aurc += sum(S[i] / (i + 1) for i in range(N)) / N
        tot_augrc += sum(S) / (N * N)
        tot_risk += S[k - 1] / k
        count += 1
    return tot_aurc / count, tot_augrc / count, tot_risk / count


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
        assert abs(float(augrc(c, lo)) - float(b)) <= 1e-12
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
