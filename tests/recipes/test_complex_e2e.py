"""The ComplEx recipe end to end on a tiny family KG: invariants, report keys, determinism."""

from __future__ import annotations

import json
import pathlib
import types

import pytest
import torch
from _complex_helpers import QUIET, TINY_FAMILY

from recipes.complex_link_prediction import audit as audit_mod
from recipes.complex_link_prediction.cli import build_parser, main
from recipes.complex_link_prediction.report import TIMING_KEYS

TINY = [
    *TINY_FAMILY,
    "--data.batch_size",
    "400",
    "--model.rank",
    "16",
    "--trainer.max_epochs",
    "3",
    "--trainer.enable_progress_bar",
    "false",
    "--audit.k",
    "5",
    "--seed",
    "7",
    "--data.hide",
    "0.1",
]

TOP_KEYS = {
    "dataset",
    "seed",
    "mode",
    "mrr",
    "hits@1",
    "hits@3",
    "hits@10",
    "train_seconds",
    "epoch_seconds",
    "invariants_ok",
    "audits",
}
AUDIT_KEYS = {
    "temperature",
    "ece_before",
    "ece_after",
    "nll_before",
    "nll_after",
    "invariants_ok",
    "n_calibration",
    "n_evaluation",
}
TRIPLE_KEYS = AUDIT_KEYS | {
    "base_rate",
    "auc_before",
    "auc_after",
    "acc_before",
    "acc_after",
    "ece_platt",
}
TAIL_KEYS = AUDIT_KEYS | {"hits1_before", "hits1_after"}


def _load(path):
    with open(path / "report.json") as fh:
        rep = json.load(fh)
    return rep, {k: v for k, v in rep.items() if k not in TIMING_KEYS}


def test_tiny_family_end_to_end(tmp_path, monkeypatch, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(TINY + ["--output_dir", str(a)]) == 0
    rep, rep_a = _load(a)
    out = capsys.readouterr().out
    # stdout: each audit's line with the ties / T created; the 1-N triple line says why T
    # cannot fix it
    tail_line = next(ln for ln in out.splitlines() if ln.startswith("audit tail:"))
    triple_line = next(ln for ln in out.splitlines() if ln.startswith("audit triple:"))
    assert "invariants ok (" in tail_line and "created by / T" in tail_line
    assert "invariants ok (" in triple_line
    assert (
        "T cannot fix a 1-N model here" in triple_line
        and "cannot move an offset" in triple_line
        and "base rate 0.1667" in triple_line
    )
    assert "T cannot fix" not in tail_line
    # the tail audit's extra lines: per-relation T, answer sets + risk-coverage, fit costs
    lines = out.splitlines()
    i = lines.index(tail_line)
    assert lines[i + 1].startswith("relation T: ") and "ECE global/raw/shrunk" in lines[i + 1]
    assert lines[i + 2].startswith("answer sets (alpha 0.1, global T): coverage ")
    assert "AURC" in lines[i + 2] and "at 80% coverage" in lines[i + 2]
    assert lines[i + 3] == triple_line
    cost = next(ln for ln in lines if ln.startswith("fits (time / added peak memory): "))
    for name in ("tail.temperature", "tail.relation_T_raw", "tail.relation_T_shrunk"):
        assert f"{name} " in cost
    assert set(rep["fit_costs"]) == {
        "tail.temperature",
        "tail.relation_T_raw",
        "tail.relation_T_shrunk",
        "triple.temperature",
        "triple.platt",
    }
    assert all(v["seconds"] > 0 and v["peak_mb"] >= 0 for v in rep["fit_costs"].values())
    rt = rep["audits"]["tail"]["relation_temperature"]
    assert rt["groups"] == 2 * rep["num_relations"]
    assert rt["nll_calibration_raw"] <= rt["nll_calibration_global"]
    assert {"t_raw", "weight", "t_shrunk"} <= set(rt["per_relation"][0])
    sets = rep["audits"]["tail"]["answer_sets"]["global_T"]
    assert 0 <= sets["coverage"] <= 1 and sets["mean_size"] >= 1 - sets["empty"]
    assert {"aurc", "augrc", "risk_at_coverage"} <= set(
        rep["audits"]["tail"]["risk_coverage"]["global_T"]
    )
    assert rep["audits"]["tail"]["invariants"]["relation_T_shrunk_monotone"] is True
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
    for f in (
        "report.txt",
        "report.md",
        "reliability_tail_before.png",
        "reliability_tail_after.png",
        "reliability_triple_before.png",
        "reliability_triple_after.png",
    ):
        assert (a / f).stat().st_size > 0
    text = (a / "report.txt").read_text()
    assert "exact invariants under T" in text
    # the triple audit: base rate beside every metric, and why T cannot fix a 1-N model
    header = next(
        ln for ln in text.split("Audit 'triple'")[1].splitlines() if ln.startswith("metric")
    )
    assert header.split()[-3:] == ["base", "rate", "0.1667"]
    assert "Why one temperature cannot calibrate these triples" in text
    assert "reliability table: reading=confidence" in text  # the tail audit's table
    # the calibration monitor logged a reliability table every validation epoch
    csv = next(a.glob("logs/*/reliability.csv")).read_text().splitlines()
    assert csv[0].startswith("epoch,step,bin") and {ln.split(",")[0] for ln in csv[1:]} == {
        "0",
        "1",
        "2",
    }

    # filtering the hidden true tails too can only raise the ranks' reciprocals; here it does
    for key in ("mrr", "hits@1", "hits@3", "hits@10"):
        assert rep[f"{key}_true"] >= rep[key]
    assert rep["mrr_true"] > rep["mrr"]

    # same seed -> byte-identical report.json apart from the timing keys, and the same
    # report.txt / report.md apart from the timing line
    assert main(TINY + ["--output_dir", str(b)]) == 0
    _, rep_b = _load(b)
    assert json.dumps(rep_a, sort_keys=True) == json.dumps(rep_b, sort_keys=True)
    # (report.json's timing keys hold nested values: compared above, as parsed JSON)
    timing = ("training: ", "fit costs (time / added peak memory): ")
    for name in ("report.txt", "report.md"):
        text_a, text_b = ((d / name).read_bytes().splitlines() for d in (a, b))
        assert len(text_a) == len(text_b)
        assert [ln for ln in text_a if not ln.decode().startswith(timing)] == [
            ln for ln in text_b if not ln.decode().startswith(timing)
        ], name

    # the counts behind the invariants are in the report, per audit
    for name in ("tail", "triple"):
        au = rep["audits"][name]
        assert au["strict_inversions"] == 0 and au["ties_broken"] == 0
        assert au["ties_created"] >= 0 and au["max_tie_gap_ulps"] <= au["max_tie_gap_bound_ulps"]
        assert f"ties created by / T: {au['ties_created']}" in text

    # a failed invariant (a "scaler" that reorders the scores) makes the command fail
    class Reorders:
        def fit(self, logits, target):
            return types.SimpleNamespace(temperature=1.0, converged=True)

        def __call__(self, logits):
            g = torch.Generator().manual_seed(0)
            return logits - 20 * torch.rand(logits.shape, generator=g, dtype=logits.dtype)

    monkeypatch.setattr(audit_mod, "TemperatureScaler", Reorders)
    c = tmp_path / "c"
    capsys.readouterr()
    assert (
        main(TINY + ["--output_dir", str(c), "--audit.plots", "false", "--trainer.max_epochs", "1"])
        == 1
    )
    assert json.loads((c / "report.json").read_text())["invariants_ok"] is False
    err = capsys.readouterr().err
    assert "invariant(s) failed: tail.no_strict_inversion" in err


def test_bad_tsv_is_a_clear_error(tmp_path, capsys):
    bad, ok = tmp_path / "train.tsv", tmp_path / "ok.tsv"
    bad.write_text("a\tr\tb\nb r c\n")
    ok.write_text("a\tr\tb\n")
    rc = main(
        [
            "--data.dataset",
            "tsv",
            "--data.train",
            str(bad),
            "--data.valid",
            str(ok),
            "--data.test",
            str(ok),
            "--output_dir",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 2
    assert f"{bad}:2: expected 'head<TAB>relation<TAB>tail'" in capsys.readouterr().err


def test_every_option_overrides_the_config(capsys):
    root = pathlib.Path(__file__).resolve().parents[2]
    parser = build_parser()
    for cfg in sorted((root / "configs" / "complex").glob("*.yaml")):
        parser.parse_args(["--config", str(cfg)])  # all configs valid
    cfg = parser.parse_args(
        [
            "--config",
            str(root / "configs" / "complex" / "family.yaml"),
            "--trainer.max_epochs",
            "5",
            "--seed",
            "3",
            "--data.hide",
            "0.1",
            "--model.rank",
            "8",
            "--mode",
            "negatives",
            "--audit.k",
            "7",
            "--audit.n_bins",
            "10",
        ]
    )
    assert (
        cfg.trainer.max_epochs,
        cfg.seed,
        cfg.data.hide,
        cfg.model.rank,
        cfg.mode,
        cfg.audit.k,
        cfg.audit.n_bins,
    ) == (5, 3, 0.1, 8, "negatives", 7, 10)
    assert cfg.data.num_families == 16  # the rest still comes from the file
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--trainer.max_epochs" in out and "--data.hide" in out and "hidden truth" in out


def test_negatives_mode_at_the_audit_base_rate(tmp_path, capsys):
    out = tmp_path / "neg"
    args = TINY + [
        "--mode",
        "negatives",
        "--model.num_negatives",
        "5",
        "--output_dir",
        str(out),
        "--audit.plots",
        "false",
        "--trainer.logger",
        "false",
        "--trainer.max_epochs",
        "2",
        "--audit.n_bins",
        "10",
    ]
    assert main(args) == 0
    assert "T cannot fix" not in capsys.readouterr().out
    rep = json.loads((out / "report.json").read_text())
    assert rep["mode"] == "negatives" and rep["invariants_ok"] is True
    text = (out / "report.txt").read_text()
    assert "one temperature is a legitimate repair" in text
    assert "ECE (L1, 10 bins)" in text and "10 bins, 95% wilson" in text


def _tsv(path, rows):
    path.write_text("".join(f"{h}\t{r}\t{t}\n" for h, r, t in rows))
    return str(path)


def _world(tmp_path, test_rows, extra_train=()):
    """A small TSV KG: 12 entities on a ring under two relations, so every query has free
    tails; ``test_rows`` as the test file."""
    ents = [f"e{i}" for i in range(12)]
    train = [(ents[i], "next", ents[(i + 1) % 12]) for i in range(12)]
    train += [(ents[i], "skip", ents[(i + 2) % 12]) for i in range(0, 12, 2)]
    train += list(extra_train)
    valid = [(ents[1], "skip", ents[3])]
    return [
        "--data.dataset",
        "tsv",
        "--data.train",
        _tsv(tmp_path / "train.tsv", train),
        "--data.valid",
        _tsv(tmp_path / "valid.tsv", valid),
        "--data.test",
        _tsv(tmp_path / "test.tsv", test_rows),
        "--model.rank",
        "4",
        *QUIET,
        "--monitor",
        "false",
        "--output_dir",
        str(tmp_path / "out"),
    ]


TEST_ROWS = [
    ("e3", "skip", "e5"),
    ("e5", "skip", "e7"),
    ("e7", "skip", "e9"),
    ("e9", "skip", "e11"),
    ("e2", "next", "e4"),
    ("e6", "next", "e8"),
]


@pytest.mark.parametrize(
    ("rows", "extra", "match"),
    [
        (
            [("e3", "skip", "e5")],
            ["--trainer.max_epochs", "1"],
            "error: data.test: expected at least 2 test triples",
        ),
        (
            [("e3", "skip", "e5"), ("e2", "next", "e4")],
            ["--trainer.max_epochs", "1"],
            "error: data.test: the evaluation half is empty",
        ),
        (
            TEST_ROWS,
            ["--trainer.max_epochs", "0"],
            "error: trainer.max_epochs: expected an int >= 1",
        ),
        (
            TEST_ROWS,
            ["--trainer.max_epochs", "-1"],
            "error: trainer.max_epochs: expected an int >= 1",
        ),
        (
            TEST_ROWS,
            ["--trainer.max_epochs", "1", "--audit.alpha", "1.5"],
            "error: audit.alpha: expected a number in (0, 1), got 1.5",
        ),
        (
            TEST_ROWS,
            ["--trainer.max_epochs", "1", "--audit.coverage", "0"],
            "error: audit.coverage: expected a number in (0, 1), got 0.0",
        ),
        # 12 entities: a query's own answer is known, so at most 11 tails are free: fewer than
        # k = 12 distinct corruptions
        (
            TEST_ROWS,
            ["--trainer.max_epochs", "1", "--audit.k", "12"],
            "error: audit.k: no test query of the calibration half has k = 12 distinct",
        ),
    ],
)
def test_unusable_input_is_exit_2_before_training(tmp_path, capsys, rows, extra, match):
    assert main(_world(tmp_path, rows) + extra) == 2
    captured = capsys.readouterr()
    assert match in captured.err
    assert "filtered MRR" not in captured.out  # nothing trained or reported
    assert not (tmp_path / "out" / "report.json").exists()


def test_test_triples_in_train_warn_and_are_counted(tmp_path, capsys):
    leaked = TEST_ROWS[:2]
    args = _world(tmp_path, TEST_ROWS, extra_train=leaked) + [
        "--trainer.max_epochs",
        "2",
        "--audit.k",
        "3",
    ]
    with pytest.warns(
        UserWarning, match="^data.test: 2 of 6 test triples also occur in the training triples"
    ):
        assert main(args) == 0
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["num_test_in_train"] == 2 and rep["num_test_duplicates"] == 0
    assert rep["num_test_dropped"] == 0 and rep["num_test"] == 6
    assert "invariants ok" in capsys.readouterr().out
    text = (tmp_path / "out" / "report.txt").read_text()
    assert "test leakage: 2 of 6 test triples also occur in train, 0 repeat" in text
    assert "(4 and 0 of 12 queries, both directions); kept" in text
    # and without the leak: no warning, a count of 0
    import warnings

    (tmp_path / "out" / "report.json").unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert (
            main(_world(tmp_path, TEST_ROWS) + ["--trainer.max_epochs", "2", "--audit.k", "3"]) == 0
        )
    assert not [w for w in caught if str(w.message).startswith("data.test")]
    assert json.loads((tmp_path / "out" / "report.json").read_text())["num_test_in_train"] == 0


def test_duplicate_and_leaked_test_triples_dropped_on_request(tmp_path, capsys):
    """Two leaked rows and one repeated row (the repeat of a leaked row counts in both):
    warned and counted; ``--data.drop_leaked true`` drops the three, the audits run on the
    rest."""
    rows = TEST_ROWS + [TEST_ROWS[4], TEST_ROWS[0]]  # a clean repeat and a leaked repeat
    base = _world(tmp_path, rows, extra_train=TEST_ROWS[:2])
    base += ["--trainer.max_epochs", "2", "--audit.k", "3"]
    with pytest.warns(UserWarning) as rec:
        assert main(base) == 0
    msgs = [str(w.message) for w in rec if str(w.message).startswith("data.test")]
    assert msgs[0].startswith("data.test: 3 of 8 test triples also occur in the training")
    assert msgs[1].startswith("data.test: 2 of 8 test triples repeat an earlier test triple")
    assert all(m.endswith("kept: --data.drop_leaked true drops them") for m in msgs)
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (rep["num_test_in_train"], rep["num_test_duplicates"]) == (3, 2)
    assert (rep["num_test_dropped"], rep["num_test"]) == (0, 8)
    with pytest.warns(UserWarning) as rec:
        assert main(base + ["--data.drop_leaked", "true"]) == 0
    msgs = [str(w.message) for w in rec if str(w.message).startswith("data.test")]
    assert len(msgs) == 2 and all(m.endswith("dropped (--data.drop_leaked)") for m in msgs)
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (rep["num_test_in_train"], rep["num_test_duplicates"]) == (3, 2)
    # dropped: the 3 copies of the 2 leaked triples and the repeat of a clean one
    assert (rep["num_test_dropped"], rep["num_test"]) == (4, 4)
    assert rep["audits"]["tail"]["n_calibration"] + rep["audits"]["tail"]["n_evaluation"] == 8
    text = (tmp_path / "out" / "report.txt").read_text()
    assert "; 4 dropped (--data.drop_leaked), 4 kept" in text
    assert "invariants ok" in capsys.readouterr().out
