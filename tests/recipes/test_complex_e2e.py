"""The ComplEx recipe end to end on a tiny family KG: invariants, report keys, determinism."""

from __future__ import annotations

import json

import pytest

from recipes.complex_link_prediction import audit as audit_mod
from recipes.complex_link_prediction.cli import main
from recipes.complex_link_prediction.report import TIMING_KEYS

TINY = ["--data.dataset", "family", "--data.num_families", "3", "--data.generations", "4",
        "--data.batch_size", "400", "--model.rank", "16", "--trainer.max_epochs", "3",
        "--trainer.enable_progress_bar", "false", "--audit.k", "5", "--seed", "7",
        "--data.hide", "0.1"]

TOP_KEYS = {"dataset", "seed", "mode", "mrr", "hits@1", "hits@3", "hits@10", "train_seconds",
            "epoch_seconds", "invariants_ok", "audits"}
AUDIT_KEYS = {"temperature", "ece_before", "ece_after", "nll_before", "nll_after",
              "invariants_ok", "n_calibration", "n_evaluation"}
TRIPLE_KEYS = AUDIT_KEYS | {"base_rate", "auc_before", "auc_after", "acc_before", "acc_after",
                            "ece_platt"}
TAIL_KEYS = AUDIT_KEYS | {"hits1_before", "hits1_after"}


def _load(path):
    with open(path / "report.json") as fh:
        rep = json.load(fh)
    return rep, {k: v for k, v in rep.items() if k not in TIMING_KEYS}


def test_tiny_family_end_to_end(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(TINY + ["--output_dir", str(a)]) == 0
    rep, rep_a = _load(a)
    assert TOP_KEYS <= set(rep)
    assert TAIL_KEYS <= set(rep["audits"]["tail"])
    assert TRIPLE_KEYS <= set(rep["audits"]["triple"])
    assert rep["invariants_ok"] is True
    assert all(rep["audits"][n]["invariants"] for n in ("tail", "triple"))
    tail = rep["audits"]["tail"]
    assert tail["hits1_before"] == tail["hits1_after"] and tail["mrr_before"] == tail["mrr_after"]
    assert rep["audits"]["triple"]["base_rate"] == pytest.approx(1 / 6)
    # hidden truth: ECE against observed and against true labels side by side
    assert rep["num_hidden"] > 0 and "mrr_true" in rep
    for name in ("tail", "triple"):
        assert {"ece_true_before", "ece_true_after"} <= set(rep["audits"][name])
    assert rep["audits"]["triple"]["auc_before"] == rep["audits"]["triple"]["auc_after"]
    # the fitted temperature never makes the calibration-half NLL worse; the evaluation
    # half is reported as measured
    for name in ("tail", "triple"):
        assert rep["audits"][name]["temperature"] > 0
    for f in ("report.txt", "report.md", "reliability_tail_before.png",
              "reliability_tail_after.png", "reliability_triple_before.png",
              "reliability_triple_after.png"):
        assert (a / f).stat().st_size > 0
    assert "exact invariants under T" in (a / "report.txt").read_text()
    # the calibration monitor logged a reliability table every validation epoch
    csv = next(a.glob("logs/*/reliability.csv")).read_text().splitlines()
    assert csv[0].startswith("epoch,step,bin") and {ln.split(",")[0] for ln in csv[1:]} == {
        "0", "1", "2"}

    # same seed -> byte-identical report.json apart from the timing keys
    assert main(TINY + ["--output_dir", str(b), "--audit.plots", "false"]) == 0
    _, rep_b = _load(b)
    rep_a["config"]["audit"].pop("plots")
    rep_b["config"]["audit"].pop("plots")
    assert json.dumps(rep_a, sort_keys=True) == json.dumps(rep_b, sort_keys=True)

    # a failed invariant makes the command fail
    monkeypatch.setattr(audit_mod, "same_ranking", lambda x, y: False)
    c = tmp_path / "c"
    assert main(TINY + ["--output_dir", str(c), "--audit.plots", "false",
                        "--trainer.max_epochs", "1"]) == 1
    assert json.loads((c / "report.json").read_text())["invariants_ok"] is False


def test_bad_tsv_is_a_clear_error(tmp_path, capsys):
    bad, ok = tmp_path / "train.tsv", tmp_path / "ok.tsv"
    bad.write_text("a\tr\tb\nb r c\n")
    ok.write_text("a\tr\tb\n")
    rc = main(["--data.dataset", "tsv", "--data.train", str(bad), "--data.valid", str(ok),
               "--data.test", str(ok), "--output_dir", str(tmp_path / "out")])
    assert rc == 2
    assert f"{bad}:2: expected 'head<TAB>relation<TAB>tail'" in capsys.readouterr().err
