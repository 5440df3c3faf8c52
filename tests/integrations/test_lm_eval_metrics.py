"""The confidence rules and the metrics of torchcal.integrations.lm_eval against the harness's
own formulas (lm_eval/api/task.py, lm_eval/api/metrics.py) and torchcal's (docs/design.md
section 6h)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from torchcal.functional import calibration_error, risk_coverage_curve
from torchcal.integrations.lm_eval import (
    METRICS,
    aggregate,
    choice_logits,
    choice_scores,
    items_to_tensors,
)
from torchcal.metrics import CalibrationError, NegativeLogLikelihood


def _items(n: int, seed: int, choices: tuple[int, ...] = (4,)) -> list[tuple]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.choice(choices))
        lengths = rng.integers(1, 30, size=k).astype(float)
        lls = -(rng.gamma(2.0, 1.0, size=k) * lengths / 5)
        out.append((int(rng.integers(k)), tuple(lls.tolist()), tuple(lengths.tolist())))
    return out


def _harness_brier(items: list[tuple]) -> float:
    """lm-eval's brier_score: its multiple_choice process_results (``utils.softmax(lls)``) and
    its aggregation, run from the installed harness."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.metrics import brier_score
    from lm_eval.utils import softmax

    return float(brier_score([(g, softmax(np.array(lls))) for g, lls, _ in items]))


def test_raw_brier_equals_the_harness_brier_score() -> None:
    items = _items(3000, seed=0)
    assert abs(aggregate(items, "brier", "raw") - _harness_brier(items)) <= 1e-12


def test_norm_argmax_is_the_acc_norm_answer_and_differs_from_raw() -> None:
    items = _items(2000, seed=1, choices=(2, 3, 5))
    gold, lls, lengths = items_to_tensors(items)
    pred = choice_logits(lls, lengths, "norm").argmax(1)
    expect = [int(np.argmax(np.array(ll) / np.array(n))) for _, ll, n in items]  # acc_norm's
    assert pred.tolist() == expect
    raw = choice_logits(lls, lengths, "raw").argmax(1)
    assert (raw != pred).float().mean() > 0.1  # the rules disagree on many documents


def test_every_metric_equals_torchcal_on_the_probabilities() -> None:
    items = _items(2500, seed=2, choices=(3, 4))
    gold, lls, lengths = items_to_tensors(items)
    for rule in ("raw", "norm"):
        z = choice_logits(lls, lengths, rule)
        p = torch.softmax(z, 1)
        s = choice_scores(z, gold)
        assert list(s) == list(METRICS)
        m = CalibrationError(15, input="probs")
        m.update(p, gold)
        assert abs(s["ece"] - float(m.compute())) <= 1e-12
        nll = NegativeLogLikelihood(input="probs")
        nll.update(p, gold)
        assert abs(s["nll"] - float(nll.compute())) <= 1e-12
        onehot = torch.nn.functional.one_hot(gold, p.shape[1]).to(p)
        assert abs(s["brier"] - float(((p - onehot) ** 2).sum(1).mean())) <= 1e-12
        conf, pred = p.max(1)
        rc = risk_coverage_curve(conf, (pred != gold).double())
        assert abs(s["aurc"] - float(rc.aurc)) <= 1e-12
        smooth = calibration_error(p, gold, input="probs", estimator="smooth", exact=True)
        assert abs(s["smooth_ece"] - float(smooth)) <= 1e-9


def test_padding_changes_nothing_per_document() -> None:
    items = _items(400, seed=3, choices=(2, 5))
    two = [it for it in items if len(it[1]) == 2]
    gold, lls, lengths = items_to_tensors(items)
    assert lls.shape[1] == 5 and bool(torch.isinf(lls).any())
    g2, l2, n2 = items_to_tensors(two)
    assert l2.shape[1] == 2
    keep = torch.tensor([len(it[1]) == 2 for it in items])
    for rule in ("raw", "norm"):
        padded = torch.softmax(choice_logits(lls, lengths, rule), 1)[keep]
        alone = torch.softmax(choice_logits(l2, n2, rule), 1)
        torch.testing.assert_close(padded[:, :2], alone, rtol=0, atol=1e-15)
        assert float(padded[:, 2:].abs().max()) == 0.0
    # the harness's brier_score cannot take documents with different numbers of choices
    per = [
        sum((p - (c == g)) ** 2 for c, p in enumerate(np.exp(ll) / np.exp(ll).sum()))
        for g, ll, _ in items
    ]
    b = aggregate(items, "brier", "raw")
    assert math.isclose(b, sum(per) / len(per), rel_tol=0, abs_tol=1e-12)


def test_bad_inputs_are_named() -> None:
    lls = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="^rule: expected one of"):
        choice_logits(lls, None, "bytes")
    with pytest.raises(ValueError, match="^lengths: expected a tensor of shape"):
        choice_logits(lls, None, "norm")
    with pytest.raises(ValueError, match="^lengths: expected choice lengths > 0"):
        choice_logits(lls, torch.tensor([[1.0, 0.0]], dtype=torch.float64), "norm")
    with pytest.raises(TypeError, match="^lls: expected a floating"):
        choice_logits(torch.tensor([[1, 2]]), None, "raw")
    with pytest.raises(ValueError, match="^metric: expected one of"):
        aggregate([(0, (-1.0, -2.0), (1.0, 1.0))], "acc", "raw")
    with pytest.raises(ValueError, match="^items: no documents"):
        aggregate([], "ece", "raw")
    with pytest.raises(ValueError, match="^items: document 0 has 2 lls and 1 lengths"):
        aggregate([(0, (-1.0, -2.0), (1.0,))], "ece", "raw")


def test_harness_registration_is_idempotent_and_refuses_a_taken_name() -> None:
    pytest.importorskip("lm_eval")
    from lm_eval.api.registry import aggregation_registry, get_metric_aggregation

    from torchcal.integrations.lm_eval_task import HARNESS_METRICS, register_harness_metrics

    assert register_harness_metrics() == list(HARNESS_METRICS) == register_harness_metrics()
    items = _items(300, seed=4)
    agg = get_metric_aggregation("torchcal_nll_norm")
    assert agg(items) == aggregate(items, "nll", "norm")
    real = aggregation_registry._objs["torchcal_aurc"]
    aggregation_registry._objs["torchcal_aurc"] = len
    try:
        with pytest.raises(ValueError, match="^torchcal_aurc: already registered"):
            register_harness_metrics()
    finally:
        aggregation_registry._objs["torchcal_aurc"] = real


def test_import_torchcal_imports_neither_the_harness_nor_evaluate() -> None:
    code = (
        "import sys, torchcal, torchcal.integrations.lm_eval, torchcal.cli; "
        "print(sorted(m for m in ('lm_eval', 'evaluate', 'datasets') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
