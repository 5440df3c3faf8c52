"""Inputs a review found mishandled (conformal sets, risk control, selective metrics, the
soft-binned ECE and the root forms of the regularisers): each now gets the right number or
an error naming the argument."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import torchcal.functional as TF
import torchcal.losses as L
from torchcal.functional import (
    conformal_risk_control,
    conformal_score_matrix,
    conformal_sets,
    multilabel_fnr_losses,
    risk_at_coverage,
    set_size_losses,
)
from torchcal.metrics import RiskAtCoverage
from torchcal.scaling import ConformalClassifier, TemperatureScaler

F64 = torch.float64


# ------------------------------------------------------------------ conformal sets


@pytest.mark.parametrize(
    "probs",
    [
        [[0.5, 0.5, 0.5]],  # sums to 1.5: renormalised to 1/3 each before
        [[0.6, 0.6, 0.0]],  # LAC at alpha 0.45 dropped both 0.6 labels after renormalising
        [[0.0, 0.0, 0.0]],  # NaN scores and an empty set before
    ],
)
def test_probs_input_rows_must_be_distributions(probs) -> None:
    p = torch.tensor(probs)
    with pytest.raises(ValueError, match=r"^logits: expected probabilities whose sum"):
        conformal_score_matrix(p, "lac", input="probs")
    with pytest.raises(ValueError, match=r"^logits: expected probabilities whose sum"):
        conformal_sets(p, 10.0, "aps", input="probs", randomized=False)


def test_probs_input_within_tolerance_is_read_as_given() -> None:
    p = torch.tensor([[0.6, 0.4 + 5e-5, 0.0]], dtype=F64)  # sum 1 + 5e-5: inside 1e-4
    s = conformal_score_matrix(p, "lac", input="probs")
    assert torch.equal(s, 1 - p)  # used as given, not renormalised
    assert conformal_sets(p, 0.61, "lac", input="probs").tolist() == [[True, True, False]]


# ------------------------------------------------------------------ risk control


def test_risk_control_rejects_an_empty_grid() -> None:
    with pytest.raises(ValueError, match=r"^lambdas: expected a non-empty 1-d grid"):
        conformal_risk_control(torch.zeros(5, 0, dtype=F64), 0.2, torch.zeros(0, dtype=F64))


@pytest.mark.parametrize("bad", [math.nan, -3.0, 7.0])
def test_risk_control_losses_reject_values_outside_probabilities(bad: float) -> None:
    lam = torch.tensor([0.5, 1.0], dtype=F64)
    p = torch.tensor([[bad, 0.9, 0.2]])
    with pytest.raises(ValueError, match=r"^probs: expected probabilities in \[0, 1\]"):
        multilabel_fnr_losses(p, torch.tensor([[1, 1, 0]]), lam)
    with pytest.raises(ValueError, match=r"^probs: expected probabilities in \[0, 1\]"):
        set_size_losses(p, lam)


def test_risk_control_losses_on_valid_probabilities() -> None:
    lam = torch.tensor([0.5, 1.0], dtype=F64)
    p = torch.tensor([[0.0, 0.9, 0.2]])  # lambda = 1: threshold 1 - 1 = 0, every label in
    assert multilabel_fnr_losses(p, torch.tensor([[1, 1, 0]]), lam).tolist() == [[0.5, 0.0]]
    assert set_size_losses(p, lam).tolist() == [[1 / 3, 0.0]]


# ------------------------------------------------------------------ selective metrics


def _selective_data() -> tuple[torch.Tensor, torch.Tensor]:
    """Ten samples, the second most confident the only wrong one."""
    conf = torch.linspace(0.99, 0.55, 10)
    loss = torch.zeros(10)
    loss[1] = 1.0
    return conf, loss


@pytest.mark.parametrize(
    ("coverage", "expected"),
    [
        (0.1, 0.0),  # ceil(10 / 10) = 1 accepted: the right one
        (np.float32(0.1), 0.0),  # 1/10 in float32 precision, not 0.10000000149
        (np.float32(0.3), 1 / 3),  # 3/10: three accepted
        (Fraction(1, 5), 1 / 2),
        (torch.tensor(0.1), 0.0),
        (1, 0.1),
    ],
)
def test_coverage_is_read_as_an_exact_fraction(coverage, expected: float) -> None:
    conf, loss = _selective_data()
    assert float(risk_at_coverage(conf, loss, coverage)) == pytest.approx(expected, abs=1e-15)
    m = RiskAtCoverage(coverage, exact=True)
    logits = torch.stack([conf.log(), (1 - conf).log()], dim=1)  # class 0, confidence conf
    target = loss.long()  # wrong (class 1) only where the loss is 1
    m.update(logits, target)
    assert float(m.compute()) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize("coverage", ["0.5", True, None, [0.5]])
def test_coverage_of_the_wrong_type(coverage) -> None:
    conf, loss = _selective_data()
    with pytest.raises(TypeError, match=r"^coverage: expected a number"):
        risk_at_coverage(conf, loss, coverage)
    with pytest.raises(TypeError, match=r"^coverage: expected a number"):
        RiskAtCoverage(coverage)


@pytest.mark.parametrize("coverage", [0.0, 1.5, math.nan, -0.1])
def test_coverage_out_of_range(coverage: float) -> None:
    with pytest.raises(ValueError, match=r"^coverage: expected a value in \(0, 1\]"):
        RiskAtCoverage(coverage)


# ------------------------------------------------------------------ the conformal classifier


def _fitted(conditional: str = "marginal") -> ConformalClassifier:
    g = torch.Generator().manual_seed(0)
    cc = ConformalClassifier(0.2, "lac", conditional=conditional)
    cc.fit(torch.randn(60, 3, generator=g), torch.arange(60) % 3)
    return cc


@pytest.mark.parametrize("conditional", ["marginal", "class"])
def test_predict_checks_the_class_count(conditional: str) -> None:
    cc = _fitted(conditional)
    assert cc.predict(torch.randn(2, 3)).shape == (2, 3)
    with pytest.raises(ValueError, match=r"^logits: calibrated on 3 classes, got 7 columns"):
        cc.predict(torch.randn(2, 7))


def test_class_count_survives_a_state_dict_and_is_validated() -> None:
    cc = _fitted()
    fresh = ConformalClassifier(0.2, "lac")
    fresh.load_state_dict(cc.state_dict())
    assert int(fresh.num_classes) == 3
    with pytest.raises(ValueError, match=r"^logits: calibrated on 3 classes"):
        fresh.predict(torch.randn(2, 4))
    bad = dict(cc.state_dict(), num_classes=torch.tensor(-1))
    with pytest.raises(ValueError, match=r"num_classes: expected one integer >= 2"):
        ConformalClassifier(0.2, "lac").load_state_dict(bad)


@pytest.mark.parametrize("t", [np.float32(2.0), np.float64(2.0), torch.tensor(2.0), 2])
def test_set_temperature_of_numpy_and_tensor_types(t) -> None:
    cc = ConformalClassifier(temperature=t, temperature_source="calibration")
    assert float(cc.set_temperature) == 2.0


# ------------------------------------------------------------------ scalar options


@pytest.mark.parametrize("value", ["1e-3", None, True])
def test_scalar_option_of_the_wrong_type_is_named(value) -> None:
    with pytest.raises(TypeError, match=r"^grad_tol: expected a number"):
        TemperatureScaler(grad_tol=value)


# ------------------------------------------------------------------ regularisers


def _sb_ece_reference(
    conf: torch.Tensor, correct: torch.Tensor, bins: int, temperature: float, p: float
) -> float:
    """SB-ECE_p^p in float64, written out: soft memberships to the bin centres, each bin's
    |A_b - C_b|^p weighted by its share of the soft count; bins with no count left out."""
    r = conf.double()
    centres = (torch.arange(bins, dtype=F64) + 0.5) / bins
    u = torch.softmax(-((r[:, None] - centres) ** 2) / temperature, dim=1)
    total = 0.0
    for b in range(bins):
        s = float(u[:, b].sum())
        if s == 0.0:
            continue
        acc = float((u[:, b] * correct.double()).sum()) / s
        cnf = float((u[:, b] * r).sum()) / s
        total += s * abs(acc - cnf) ** p
    return total / r.numel()


@pytest.mark.parametrize("p", [1.5, 2.0, 3.0])
@pytest.mark.parametrize("temperature", [1e-2, 1.3e-3, 1e-3, 1e-4])
def test_soft_binned_ece_with_underflowing_bins(p: float, temperature: float) -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 10, generator=g, dtype=F64)
    z[:, 0] += 20.0  # every confidence > 0.9999: the far bins' memberships underflow
    y = torch.randint(0, 10, (64,), generator=g)
    conf, top = torch.softmax(z, 1).max(1)
    ref = _sb_ece_reference(conf, top == y, 15, temperature, p)
    zz = z.clone().requires_grad_()
    got = TF.soft_binned_ece(zz, y, temperature=temperature, p=p, root=False)
    assert float(got) == pytest.approx(ref, rel=1e-9)
    root = TF.soft_binned_ece(z, y, temperature=temperature, p=p, root=True)
    assert float(root) == pytest.approx(ref ** (1 / p), rel=1e-9)
    got.backward()
    assert bool(torch.isfinite(zz.grad).all())  # NaN / inf at T = 1e-3 before


def test_root_forms_keep_nan_when_every_item_is_ignored() -> None:
    z = torch.randn(4, 3)
    y = torch.full((4,), -100)
    for value in (
        TF.mmce(z, y),
        TF.mmce(z, y, squared=True),
        TF.soft_binned_ece(z, y),
        TF.soft_binned_ece(z, y, root=False),
        L.MMCELoss(squared=False)(z, y),
        L.SoftBinnedECELoss(root=True)(z, y),
    ):
        assert math.isnan(float(value))


def test_root_forms_keep_the_subgradient_zero_at_zero() -> None:
    z = torch.tensor([[40.0, -40.0], [-40.0, 40.0]], dtype=F64, requires_grad=True)
    y = torch.tensor([0, 1])
    value = TF.mmce(z, y)  # every item right and all but certain: MMCE rounds to 0
    value.backward()
    assert float(value) == 0.0 and not math.copysign(1.0, float(value)) < 0
    assert bool(torch.isfinite(z.grad).all())


def test_mdca_hot_path_error_is_the_float32_rounding_of_its_means() -> None:
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for n, c in ((300_000, 3), (1024, 2), (256, 10)):
        z = torch.randn(n, c, generator=g) * 2
        y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
        worst = max(worst, abs(float(TF.mdca(z, y)) - float(TF.mdca(z.double(), y))))
    assert worst < 1.2e-7  # the documented bound (float32 means near 1 / C)


# ------------------------------------------------------------------ regression readings


def test_pit_of_a_zero_width_top_segment_is_one_at_the_jump() -> None:
    # the CDF jumps to 1 at q_K (right-continuous): F(q_K) = 1, not 0 * inf = NaN
    assert (
        TF.pit_quantiles(torch.tensor([[0.0, 0.0]]), [0.25, 0.75], torch.tensor([0.0])).item()
        == 1.0
    )
    q = torch.tensor([[-1.0, 0.0, 1.0, 1.0]])
    got = TF.pit_quantiles(q, [0.2, 0.4, 0.6, 0.8], torch.tensor([1.0, 2.0, 0.5]))
    assert got.tolist() == pytest.approx([1.0, 1.0, 0.5], abs=1e-7)
    q = torch.tensor([[-1.0, 0.0, 1.0, 2.0]])  # a tail of positive width: F(q_K) = tau_K
    assert TF.pit_quantiles(q, [0.2, 0.4, 0.6, 0.8], torch.tensor([2.0])).item() == pytest.approx(
        0.8
    )


@pytest.mark.parametrize(
    ("counts", "message"),
    [([[-1.0, 3.0]], "expected values >= 0"), ([[math.nan, 1.0]], "expected finite values")],
)
def test_pit_error_from_counts_rejects_invalid_counts(counts, message: str) -> None:
    from torchcal.functional.coverage import pit_calibration_error_from_counts

    with pytest.raises(ValueError, match=rf"^counts: {message}"):
        pit_calibration_error_from_counts(torch.tensor(counts))
    assert float(pit_calibration_error_from_counts(torch.tensor([[1, 3]]))) == 0.5


@pytest.mark.parametrize("observed", [[1.5, 0.9], [math.nan, 0.5]])
def test_frequency_error_rejects_values_outside_probabilities(observed) -> None:
    from torchcal.functional.coverage import frequency_calibration_error

    with pytest.raises(ValueError, match=r"^observed: expected probabilities in \[0, 1\]"):
        frequency_calibration_error(torch.tensor(observed, dtype=F64), [0.5, 0.9])


# ------------------------------------------------------------------ calibration metrics


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        (dict(estimator="equal_mass", exact="False"), TypeError, "exact"),
        (dict(validate_args="False"), TypeError, "validate_args"),
        (dict(seed=1.7), TypeError, "seed"),
        (dict(estimator="smooth", sigma=True), TypeError, "sigma"),
        (dict(estimator="smooth", sigma="0.1"), TypeError, "sigma"),
        (dict(estimator="smooth", sigma=math.inf), ValueError, "sigma"),
        (dict(estimator="smooth", sigma=-1.0), ValueError, "sigma"),
    ],
)
def test_calibration_error_options_are_checked_at_construction(kwargs, error, name) -> None:
    from torchcal.metrics import CalibrationError

    with pytest.raises(error, match=rf"^{name}: expected"):
        CalibrationError(**kwargs)


def test_reliability_level_of_the_wrong_type() -> None:
    from torchcal.metrics import ReliabilityDiagram

    with pytest.raises(TypeError, match=r"^level: expected a number"):
        ReliabilityDiagram(level="0.9")
    assert ReliabilityDiagram(level=np.float64(0.9)).level == 0.9


def test_grouped_nll_takes_class_probability_targets() -> None:
    from torchcal.metrics import NegativeLogLikelihood

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, generator=g)
    q = torch.softmax(torch.randn(6, 3, generator=g), 1)
    groups = torch.tensor([0, 0, 1, 1, 1, 0])
    m = NegativeLogLikelihood(num_groups=2)
    m.update(x, q, groups)
    per = m.compute().per_group
    for k in (0, 1):
        want = torch.nn.functional.cross_entropy(x[groups == k].double(), q[groups == k].double())
        assert float(per[k]) == pytest.approx(float(want), rel=1e-6)
    with pytest.raises(ValueError, match=r"^groups: expected one group id per sample"):
        m.update(x, q, torch.zeros(6, 3, dtype=torch.long))


@pytest.mark.parametrize("estimator", ["sweep", "equal_mass"])
def test_exact_estimators_do_not_depend_on_the_update_order(estimator: str) -> None:
    from torchcal.metrics import CalibrationError

    p1, y1 = torch.tensor([0.5, 0.5], dtype=F64), torch.tensor([1, 1])
    p2, y2 = torch.tensor([0.5, 0.5, 0.9, 0.9], dtype=F64), torch.tensor([0, 0, 1, 1])
    values = []
    for batches in (((p1, y1), (p2, y2)), ((p2, y2), (p1, y1))):
        m = CalibrationError(
            reading="binary", input="probs", estimator=estimator, exact=True, n_bins=4
        )
        for p, y in batches:
            m.update(p, y)
        values.append(float(m.compute()))
    assert values[0] == values[1]  # the sweep read 0.1333 or 0.3667 before


def test_weighted_estimates_do_not_floor_a_weight_total_at_one() -> None:
    import dataclasses

    from torchcal.functional import binned_statistics, brier_decomposition_from_stats
    from torchcal.functional.verdict import ece_test_from_stats

    g = torch.Generator().manual_seed(0)
    p = torch.rand(3000, generator=g, dtype=F64)
    y = (torch.rand(3000, generator=g, dtype=F64) < p**1.3).long()
    s = binned_statistics(p, y, n_bins=10, reading="binary", input="probs").pooled()
    c = 1e-7  # every row weighted 1e-7: the totals are below 1 (floored at 1 before)
    w = dataclasses.replace(
        s,
        conf=s.conf * c,
        acc=s.acc * c,
        conf2=s.conf2 * c,
        conf_acc=s.conf_acc * c,
        weight=s.count.to(F64) * c,
        weight2=s.count.to(F64) * c**2,  # importance weights: Kish n per bin = the count
    )
    assert float(ece_test_from_stats(w, 0.05)["ece"]) == pytest.approx(
        float(ece_test_from_stats(s, 0.05)["ece"]), rel=1e-9
    )
    a, b = brier_decomposition_from_stats(s), brier_decomposition_from_stats(w)
    for key in ("brier", "reliability", "resolution"):
        assert float(b[key]) == pytest.approx(float(a[key]), rel=1e-9)


# ------------------------------------------------------------------ the command line


def test_cli_example_writes_csv_only_and_a_bracketed_file_is_a_file(tmp_path, capsys) -> None:
    from torchcal import cli

    assert cli.main(["example", str(tmp_path / "e.parquet")]) == 2
    assert "expected a name ending in .csv" in capsys.readouterr().err
    assert not (tmp_path / "e.parquet").exists()
    one, other = tmp_path / "data[1].csv", tmp_path / "data1.csv"
    assert cli.main(["example", str(one), "--n", "300"]) == 0
    assert cli.main(["example", str(other), "--n", "900"]) == 0
    capsys.readouterr()
    cli.main(["audit", str(one), "--probs", "p_correct", "--label", "correct"])
    assert "(600 rows" in capsys.readouterr().out  # 300 per domain; data1.csv has 1800


def test_cli_state_refuses_bins(tmp_path, capsys) -> None:
    from torchcal import cli

    rows = tmp_path / "rows.csv"
    state = tmp_path / "s.parquet"
    assert cli.main(["example", str(rows), "--n", "300"]) == 0
    cli.main(
        [
            "audit",
            str(rows),
            "--probs",
            "p_correct",
            "--label",
            "correct",
            "--engine",
            "memory",
            "--write-state",
            str(state),
        ]
    )
    capsys.readouterr()
    assert cli.main(["audit", "--state", str(state), "--bins", "20"]) == 2
    assert "--bins: a state keeps the bins" in capsys.readouterr().err


def test_an_inconclusive_reason_says_when_only_holm_kept_it_from_fail() -> None:
    from torchcal.audit._evaluate import reason_of

    row = {
        "verdict": "inconclusive",
        "n": 6000,
        "ece": 0.066,
        "ece_ci": [0.051, 0.076],
        "ece_debiased": 0.069,
        "ece_debiased_clipped": False,
        "ece_test": {"p_fail_holm": 0.068, "detectable": 0.074},
    }
    text = reason_of(row, None, 0.05, 0.05, 0.8)
    assert "lies above the tolerance 0.05" in text and "Holm-adjusted p = 0.068" in text
    assert "not on one side" not in text  # the interval is on one side
    row["ece_ci"] = [0.04, 0.076]
    assert "is not on one side of the tolerance 0.05" in reason_of(row, None, 0.05, 0.05, 0.8)
