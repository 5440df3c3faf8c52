"""The Hugging Face ``evaluate`` metric module, loaded offline by path, against torchcal.metrics
on the same data (docs/design.md section 6h)."""

from __future__ import annotations

import pytest
import torch

evaluate = pytest.importorskip("evaluate")

from torchcal.integrations.lm_eval import evaluate_module_path  # noqa: E402
from torchcal.metrics import (  # noqa: E402
    BrierDecomposition,
    CalibrationError,
    NegativeLogLikelihood,
)


@pytest.fixture(scope="module")
def metric(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True, raising=False)
    mp.setattr(evaluate.config, "HF_MODULES_CACHE", tmp_path_factory.mktemp("modules"))
    m = evaluate.load(evaluate_module_path(), cache_dir=str(tmp_path_factory.mktemp("cache")))
    yield m
    mp.undo()


def _torchcal(p: torch.Tensor, y: torch.Tensor, reading: str) -> dict[str, float]:
    ece = CalibrationError(15, reading=reading, input="probs", bootstrap=200, seed=0)
    mce = CalibrationError(15, norm="max", reading=reading, input="probs")
    nll = NegativeLogLikelihood(input="probs")
    for m in (ece, mce, nll):
        m.update(p, y)
    lo, hi = ece.compute_interval()
    return {"ece": float(ece.compute()), "ece_low": float(lo), "ece_high": float(hi),
            "mce": float(mce.compute()), "nll": float(nll.compute())}  # fmt: skip


def test_multiclass_equals_torchcal_metrics(metric) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(2 * torch.randn(3000, 5, generator=g, dtype=torch.float64), 1)
    y = torch.distributions.Categorical(probs=p.pow(0.7)).sample()
    out = metric.compute(predictions=p.tolist(), references=y.tolist())
    for k, v in _torchcal(p, y, "confidence").items():
        assert abs(out[k] - v) <= 1e-12, k
    onehot = torch.nn.functional.one_hot(y, 5).to(p)
    assert abs(out["brier"] - float(((p - onehot) ** 2).sum(1).mean())) <= 1e-12
    assert out["n_bins"] == 15 and "min(floor(c * 15), 14)" in out["bin_rule"]
    assert out["ece_low"] <= out["ece"] <= out["ece_high"]


def test_binary_equals_torchcal_metrics(metric) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(1)
    p = torch.rand(4000, generator=g, dtype=torch.float64)
    y = (torch.rand(4000, generator=g, dtype=torch.float64) < p**1.3).long()
    out = metric.compute(predictions=p.tolist(), references=y.tolist(), n_bins=10)
    ref = _torchcal(p, y, "binary")
    ece = CalibrationError(10, reading="binary", input="probs")
    ece.update(p, y)
    assert abs(out["ece"] - float(ece.compute())) <= 1e-12
    assert abs(out["nll"] - ref["nll"]) <= 1e-12
    brier = BrierDecomposition(10, input="probs")
    brier.update(p, y)
    assert abs(out["brier"] - float(brier.compute()["brier"])) <= 1e-12
    assert "P(y=1)" in out["bin_rule"]
