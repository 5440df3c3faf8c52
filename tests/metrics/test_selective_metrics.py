"""Streaming AURC / AUGRC / risk at coverage / coverage at risk: O(bins) summed state equal to the
functional binned form, exact mode bitwise equal to the functional tie-averaged value under any
batching or merge order, binned within the stated bound."""

from __future__ import annotations

import pytest
import torch

from torchcal.functional import (
    coverage_at_risk,
    risk_at_coverage,
    risk_coverage_curve,
    risk_coverage_from_stats,
)
from torchcal.functional.calibration.binning import accumulate
from torchcal.functional.calibration.readings import prepare_inputs, samples_from
from torchcal.metrics import AUGRC, AURC, CoverageAtRisk, RiskAtCoverage, RiskCoverageCurve

F64 = torch.float64


def _data(n: int = 3000, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 5, generator=g) * 2
    y = torch.multinomial(torch.softmax(logits, 1), 1, generator=g)[:, 0]
    return logits, y


def _stream(m, logits, y, cuts=(0, 7, 500, 1999, 3000)):
    for a, b in zip(cuts[:-1], cuts[1:]):
        m.update(logits[a:b], y[a:b])
    return m


@pytest.mark.parametrize("exact", [False, True])
def test_stream_equals_functional(exact: bool) -> None:
    logits, y = _data()
    prep = prepare_inputs(logits, y, reading="confidence", input="logits")
    if exact:
        s = samples_from(prep)
        conf, loss = s.conf, 1 - s.outcome
        ref = risk_coverage_curve(conf, loss)
        ref_r, ref_c = risk_at_coverage(conf, loss, 0.8), coverage_at_risk(conf, loss, 0.1)
    else:
        ref = risk_coverage_from_stats(accumulate(prep, 1000).pooled())
    assert torch.equal(_stream(AURC(exact=exact), logits, y).compute(), ref.aurc)
    assert torch.equal(_stream(AUGRC(exact=exact), logits, y).compute(), ref.augrc)
    curve = _stream(RiskCoverageCurve(exact=exact), logits, y).compute()
    for a, b in zip(curve, ref):
        assert torch.equal(a, b)
    if exact:
        assert torch.equal(_stream(RiskAtCoverage(0.8, exact=True), logits, y).compute(), ref_r)
        assert torch.equal(_stream(CoverageAtRisk(0.1, exact=True), logits, y).compute(), ref_c)


@pytest.mark.filterwarnings("ignore:The ``compute`` method")
@pytest.mark.parametrize("exact", [False, True])
def test_merge_in_any_order_is_bitwise_one_stream(exact: bool) -> None:
    # the DDP reduction: summed O(bins) states (binned) or concatenated samples (exact)
    logits, y = _data(seed=1)
    whole = _stream(AURC(exact=exact), logits, y).compute()
    parts = [AURC(exact=exact) for _ in range(3)]
    for i, m in enumerate(parts):
        m.update(logits[i::3], y[i::3])
    for order in ([0, 1, 2], [2, 0, 1]):
        head = AURC(exact=exact)
        for i in order:
            head.merge_state(parts[i])
        assert torch.equal(head.compute(), whole)
    m = AURC(n_bins=64)
    assert {k: tuple(v.shape) for k, v in m.metric_state.items()}["count"] == (1, 1, 64)


def test_binned_within_the_stated_bound() -> None:
    logits, y = _data(seed=2)
    exact = _stream(AURC(exact=True), logits, y).compute()
    exact_g = _stream(AUGRC(exact=True), logits, y).compute()
    for bins in (20, 200, 1000):
        m = _stream(AURC(n_bins=bins), logits, y)
        ba, bg = m.bound()
        assert abs(float(m.compute() - exact)) <= float(ba)
        g = _stream(AUGRC(n_bins=bins), logits, y)
        assert abs(float(g.compute() - exact_g)) <= float(bg)


@pytest.mark.filterwarnings("ignore:The ``compute`` method")
def test_bad_arguments_and_unseen() -> None:
    with pytest.raises(ValueError, match="^coverage"):
        RiskAtCoverage(0.0)
    with pytest.raises(ValueError, match="^risk"):
        CoverageAtRisk(-0.1)
    with pytest.raises(TypeError, match="^exact"):
        AURC(exact=1)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="no samples seen"):
        AURC().compute()


def test_plot_and_table() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from torchcal.plotting import risk_coverage_table

    logits, y = _data(300)
    m = _stream(RiskCoverageCurve(n_bins=50), logits, y, cuts=(0, 300))
    ax = m.plot()
    assert ax.get_xlabel() == "coverage" and "AURC" in ax.get_title()
    table = risk_coverage_table(m.compute())
    assert table.splitlines()[0] == "| coverage | risk |" and "AUGRC" in table
