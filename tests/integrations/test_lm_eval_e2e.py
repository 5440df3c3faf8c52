"""End to end, offline: a local multiple-choice task run by the installed lm-evaluation-harness
with a tiny in-test model, ``log_samples``, then ``torchcal audit --from lm-eval`` on its output
directory (docs/design.md section 6h)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.model import LM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402

from torchcal.cli import main  # noqa: E402
from torchcal.integrations.lm_eval import choice_logits  # noqa: E402
from torchcal.integrations.lm_eval_task import HARNESS_METRICS  # noqa: E402

TASK_CLASS = "!function torchcal.integrations.lm_eval_task.CalibratedMultipleChoiceTask"
WORDS = ["red", "green", "blue", "seven", "a cat", "the moon", "dogs and cats", "x", "forty two"]


def _ll(context: str, continuation: str) -> float:
    """A deterministic log-likelihood: longer continuations less likely, plus a hashed part."""
    h = int(hashlib.sha256(f"{context}|{continuation}".encode()).hexdigest()[:8], 16)
    return -0.4 * len(continuation) - (h % 1000) / 250.0


@register_model("torchcal-test-hashed")
class HashedLM(LM):  # type: ignore[misc]
    def loglikelihood(self, requests, disable_tqdm=False):  # noqa: ANN001
        return [(_ll(*r.arguments), False) for r in requests]

    def loglikelihood_rolling(self, requests, disable_tqdm=False):  # noqa: ANN001
        raise NotImplementedError

    def generate_until(self, requests, disable_tqdm=False):  # noqa: ANN001
        raise NotImplementedError


def _write_task(d: Path, name: str, n: int, choices: int | None, metrics: list[str]) -> None:
    rng = np.random.default_rng(len(name))
    rows = []
    for i in range(n):
        k = choices or int(rng.integers(3, 6))
        opts = [str(w) for w in rng.choice(WORDS, size=k, replace=False)]
        rows.append({"q": f"question {i}?", "choices": opts, "label": int(rng.integers(k))})
    data = d / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metric_list = "".join(f"  - metric: {m}\n    higher_is_better: false\n" for m in metrics)
    (d / f"{name}.yaml").write_text(
        f"task: {name}\nclass: {TASK_CLASS}\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n  cache_dir: {d / 'hf_cache'}\n"
        f"test_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "Q: {{q}}\\nA:"\ndoc_to_choice: choices\ndoc_to_target: label\n'
        f"metric_list:\n{metric_list}"
    )


@pytest.fixture(scope="module")
def harness_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    mp.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    mp.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    d = tmp_path_factory.mktemp("lm_eval")
    ours = list(HARNESS_METRICS)
    _write_task(d, "tc_fixed", 240, 4, ["acc", "acc_norm", "brier_score", *ours])
    _write_task(d, "tc_varied", 200, None, ["acc", "acc_norm", "torchcal_ece_norm"])
    out = d / "out"
    tracker = EvaluationTracker(output_path=str(out))
    res = lm_eval.simple_evaluate(
        model=HashedLM(),
        tasks=["tc_fixed", "tc_varied"],
        task_manager=TaskManager(include_path=str(d), include_defaults=False),
        bootstrap_iters=0,
        log_samples=True,
        evaluation_tracker=tracker,
    )
    tracker.save_results_aggregated(results=res, samples=res["samples"])
    for task, samples in res["samples"].items():
        tracker.save_results_samples(task_name=task, samples=samples)
    mp.undo()
    return res, out


def test_the_harness_reports_our_metrics_and_its_brier_equals_ours(harness_run) -> None:
    res, _ = harness_run
    fixed = res["results"]["tc_fixed"]
    assert abs(fixed["torchcal_brier,none"] - fixed["brier_score,none"]) <= 1e-12
    assert fixed["torchcal_brier_norm,none"] != pytest.approx(fixed["brier_score,none"], abs=1e-6)
    for name, (metric, _) in HARNESS_METRICS.items():
        assert 0 <= fixed[f"{name},none"] < (10.0 if metric == "nll" else 2.0)
    assert 0 <= res["results"]["tc_varied"]["torchcal_ece_norm,none"] <= 1


def test_the_norm_rule_answers_as_acc_norm(harness_run) -> None:
    import torch

    res, _ = harness_run
    for task in ("tc_fixed", "tc_varied"):
        samples = res["samples"][task]
        for s in samples:
            lls = torch.tensor([[float(r[0]) for r in s["filtered_resps"]]], dtype=torch.float64)
            lengths = torch.tensor([[len(c) for c in s["doc"]["choices"]]], dtype=torch.float64)
            pred = int(choice_logits(lls, lengths, "norm").argmax())
            assert float(pred == int(s["target"])) == float(s["acc_norm"])


def test_audit_from_lm_eval_on_the_output_directory(harness_run, tmp_path, capsys) -> None:
    _, out = harness_run
    report_dir = tmp_path / "report"
    code = main(
        [
            "audit",
            "--from",
            "lm-eval",
            str(out),
            "--rule",
            "norm",
            "--out",
            str(report_dir),
            "--diagrams",
            "1",
        ]
    )
    text = capsys.readouterr().out
    assert code in (0, 1, 3)
    d = json.loads((report_dir / "report.json").read_text())
    assert sorted(d["groups"]) == ["tc_fixed", "tc_varied"]
    assert d["groups"]["tc_fixed"]["n"] == 240 and d["groups"]["tc_varied"]["n"] == 200
    assert d["read"]["rule"] == "norm" and d["settings"]["reading"] == "confidence"
    t = d["temperature"]
    assert all(len(t["fold_T"][g]) == 2 for g in ("tc_fixed", "tc_varied"))
    assert (report_dir / "report.html").is_file()
    assert "temperature: pooled T" in text


def test_evaluate_metric_on_the_harness_probabilities(harness_run, tmp_path, monkeypatch) -> None:
    evaluate = pytest.importorskip("evaluate")
    import torch

    from torchcal.integrations.lm_eval import evaluate_module_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(evaluate.config, "HF_MODULES_CACHE", tmp_path / "modules")
    res, _ = harness_run
    samples = res["samples"]["tc_fixed"]
    lls = [[float(r[0]) for r in s["filtered_resps"]] for s in samples]
    p = torch.softmax(torch.tensor(lls, dtype=torch.float64), 1)
    metric = evaluate.load(evaluate_module_path(), cache_dir=str(tmp_path / "cache"))
    out = metric.compute(predictions=p.tolist(), references=[int(s["target"]) for s in samples])
    fixed = res["results"]["tc_fixed"]
    assert abs(out["ece"] - fixed["torchcal_ece,none"]) <= 1e-12
    assert abs(out["brier"] - fixed["brier_score,none"]) <= 1e-12
    assert abs(out["nll"] - fixed["torchcal_nll,none"]) <= 1e-12
