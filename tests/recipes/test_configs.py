"""Every config in configs/ runs end to end as a new user runs it: ``python -m
recipes.complex_link_prediction --config X`` in a fresh process, exit code 0, ``invariants ok``
on stdout. The pykeen configs at reduced epochs (the audits and invariants still run on all
their test triples); the family default at its real settings (about 20 s), the README's
first command."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "complex").glob("*.yaml"))
FAST = [
    "--trainer.enable_progress_bar",
    "false",
    "--audit.plots",
    "false",
    "--trainer.logger",
    "false",
]


def _run(
    args: list[str], timeout: float = 300, recipe: str = "complex_link_prediction"
) -> subprocess.CompletedProcess:
    """``python -m recipes.<recipe> *args`` in a fresh process at the repository root."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", f"recipes.{recipe}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _check(proc: subprocess.CompletedProcess, out: pathlib.Path, mode: str) -> dict:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    audit_lines = [ln for ln in lines if ln.startswith("audit ")]
    assert [ln.split(":")[0] for ln in audit_lines] == ["audit tail", "audit triple"]
    assert all("invariants ok (" in ln for ln in audit_lines), audit_lines
    # the triple line says why T cannot fix a 1-N model, and only for a 1-N model
    assert ("T cannot fix a 1-N model here" in audit_lines[1]) == (mode == "one_to_n")
    rep = json.loads((out / "report.json").read_text())
    assert rep["invariants_ok"] is True and rep["mode"] == mode
    for name in ("tail", "triple"):
        a = rep["audits"][name]
        assert a["strict_inversions"] == 0 and a["ties_broken"] == 0
        assert 0 <= a["max_tie_gap_ulps"] <= a["max_tie_gap_bound_ulps"] == 4
    # beyond one temperature: the per-relation T and the answer-set lines, each fit's cost
    assert any(ln.startswith("relation T: ") for ln in lines)
    assert any(ln.startswith("answer sets (alpha 0.1, global T): coverage ") for ln in lines)
    assert any(ln.startswith("fits (time / added peak memory): tail.temperature ") for ln in lines)
    tail = rep["audits"]["tail"]
    assert tail["invariants"]["relation_T_shrunk_monotone"] is True
    assert 0 <= tail["answer_sets"]["global_T"]["coverage"] <= 1
    assert set(rep["fit_costs"]) >= {"tail.temperature", "tail.relation_T_shrunk"}
    return rep


def test_there_are_configs():
    assert {c.stem for c in CONFIGS} >= {"family", "nations", "kinships", "umls", "umls_negatives"}


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_runs_at_reduced_epochs(config, tmp_path):
    import yaml

    mode = yaml.safe_load(config.read_text()).get("mode", "one_to_n")
    out = tmp_path / "out"
    proc = _run(
        ["--config", str(config), "--trainer.max_epochs", "2", "--output_dir", str(out), *FAST]
    )
    rep = _check(proc, out, mode)
    assert rep["epochs"] == 2


def test_family_default_at_its_real_settings(tmp_path):
    """The README's first command, as written (only the output directory and the progress
    bar differ): 30 epochs, exit 0, invariants ok, and a model good enough to audit."""
    out = tmp_path / "family"
    proc = _run(
        [
            "--config",
            "configs/complex/family.yaml",
            "--output_dir",
            str(out),
            "--trainer.enable_progress_bar",
            "false",
        ]
    )
    rep = _check(proc, out, "one_to_n")
    assert rep["epochs"] == 30
    assert rep["mrr"] > 0.9
    tail = rep["audits"]["tail"]
    assert tail["temperature"] < 1 and tail["ece_after"] < tail["ece_before"]
    assert tail["temperature_fallback"] is False
    # the answer sets cover about 1 - alpha of the evaluation queries (one seeded run: the
    # guarantee is in expectation, so a band of 4 standard errors)
    sets = tail["answer_sets"]["global_T"]
    assert abs(sets["coverage"] - 0.9) < 4 * sets["coverage_se"] and sets["mean_size"] < 5
    rt = tail["relation_temperature"]
    assert rt["nll_calibration_raw"] <= rt["nll_calibration_shrunk"]
    assert rt["nll_calibration_raw"] <= rt["nll_calibration_global"]
    assert (out / "report.md").stat().st_size > 0


REGRESSION_CONFIGS = sorted((ROOT / "configs" / "regression").glob("*.yaml"))


@pytest.mark.parametrize("config", REGRESSION_CONFIGS, ids=[c.stem for c in REGRESSION_CONFIGS])
def test_regression_config_at_its_real_settings(config, tmp_path):
    """``python -m recipes.heteroscedastic_regression --config X`` as written (20,000
    evaluation points, about 10 s): exit 0, every forecast scored, the truth calibrated."""
    out = tmp_path / "out"
    proc = _run(
        [
            "--config", str(config),
            "--output_dir", str(out), "--progress", "false", "--report.plots", "false",
        ],
        recipe="heteroscedastic_regression",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rep = json.loads((out / "report.json").read_text())
    truth = rep["forecasts"]["heteroscedastic"]
    assert abs(truth["coverage90"] - 0.9) < 3 * truth["coverage90_se"]
    for name in ("mlp_nll", "mlp_crps"):
        assert abs(rep["forecasts"][name]["crps"] - truth["crps"]) < 0.005 * truth["crps"]


BAKEOFF_CONFIGS = sorted((ROOT / "configs" / "bakeoff").glob("*.yaml"))


@pytest.mark.parametrize(
    "config",
    [c for c in BAKEOFF_CONFIGS if c.stem != "tiny"],
    ids=[c.stem for c in BAKEOFF_CONFIGS if c.stem != "tiny"],
)
def test_bakeoff_config_at_reduced_settings(config, tmp_path):
    """``python -m recipes.loss_bakeoff --config X`` in a fresh process with one seed, two
    losses and 3 epochs (its data, test size and metrics as written; the tiny config runs
    in tests/recipes/test_loss_bakeoff.py): exit 0 and a row per loss."""
    out = tmp_path / "out"
    proc = _run(
        [
            "--config", str(config),
            "--output_dir", str(out), "--progress", "false", "--report.plots", "false",
            "--seeds", "[0]", "--losses", "[log_score,focal_gamma3]", "--model.epochs", "3",
            "--model.val_every", "1",  # a divisor of the 3 epochs (digits.yaml validates every 5)
        ],
        recipe="loss_bakeoff",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rep = json.loads((out / "report.json").read_text())
    assert [r["loss"] for r in rep["rows"]] == ["log_score", "focal_gamma3"]
    truth = rep["rows"][0]["true_ce"]["before"]["mean"]
    assert (truth is not None) == (rep["dataset"] == "synthetic")


RL_CONFIGS = sorted((ROOT / "configs" / "rl").glob("*.yaml"))


@pytest.mark.parametrize("config", RL_CONFIGS, ids=[c.stem for c in RL_CONFIGS])
def test_rl_config_at_reduced_steps(config, tmp_path):
    """``python -m recipes.calibrated_rewards --config X`` at 300 steps (a few seconds):
    exit 0, the proper arm calibrated, the improper one over-confident."""
    out = tmp_path / "out"
    proc = _run(
        [
            "--config", str(config),
            "--out", str(out), "--progress", "false", "--plots", "false",
            "--train.steps", "300", "--train.batch_size", "1000", "--eval.per_context", "2000",
        ],
        recipe="calibrated_rewards",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    arms = json.loads((out / "report.json").read_text())["arms"]
    assert arms["correctness_brier"]["ece"] <= 0.05 < 0.2 <= arms["improper"]["ece"]
