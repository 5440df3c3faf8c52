"""The loss bake-off recipe: the tiny config end to end (in process), deterministic per seed,
the report's rows and keys, the noise floor against a closed form, the loss registry and
option errors."""

from __future__ import annotations

import json
import math
import pathlib
import re

import pytest
import torch

from recipes.loss_bakeoff.cli import main
from recipes.loss_bakeoff.data import Teacher, make_data
from recipes.loss_bakeoff.evaluate import METRICS, ece_noise_floor, score
from recipes.loss_bakeoff.losses import LOSS_NAMES, PAPER_WEIGHTS, build_loss, properness
from recipes.loss_bakeoff.model import validation_interval

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "bakeoff" / "tiny.yaml")


def _strip_timing(rep: dict) -> dict:
    """Everything but the timing and the one option that differs (``report.plots``)."""
    out = {k: v for k, v in rep.items() if k != "timing"}
    out["config"] = {**out["config"], "report": {**out["config"]["report"], "plots": None}}
    return out


@pytest.fixture(scope="module")
def tiny_reports(tmp_path_factory) -> tuple[dict, dict, pathlib.Path]:
    """The tiny config twice in this process (about 3 s each), the first with the PNG."""
    a, b = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    assert main(["--config", TINY, "--output_dir", str(a), "--report.plots", "true"]) == 0
    assert main(["--config", TINY, "--output_dir", str(b)]) == 0
    load = lambda d: json.loads((d / "report.json").read_text())  # noqa: E731
    return load(a), load(b), a


def test_tiny_config_is_deterministic(tiny_reports):
    first, second, _ = tiny_reports
    assert "timing" in first
    assert _strip_timing(first) == _strip_timing(second)


def test_tiny_report_rows_and_files(tiny_reports):
    rep, _, out = tiny_reports
    assert [r["loss"] for r in rep["rows"]] == ["log_score", "flsd53", "mmce"]
    assert rep["sizes"] == {"train": 300, "val": 200, "test": 2000}
    for row in rep["rows"]:
        assert set(METRICS) <= set(row) and "temperature" in row and "is_proper" in row
        assert [s["seed"] for s in row["seeds"]] == [0, 1]
        for m in METRICS:
            for stage in ("before", "after"):
                cell = row[m][stage]
                vals = [s[stage][m] for s in row["seeds"]]
                assert cell["mean"] == pytest.approx(sum(vals) / 2, rel=1e-9)
                assert cell["std"] == pytest.approx(abs(vals[0] - vals[1]) / math.sqrt(2), abs=1e-9)
        # a temperature keeps every argmax: the accuracy does not move
        for s in row["seeds"]:
            assert s["before"]["accuracy"] == s["after"]["accuracy"]
            assert s["temperature"] > 0
        assert row["seeds"][0]["after"]["true_ce"] >= 0
        # CalibrationMonitor saw the last epoch (the one T was fitted on)
        assert all(s["val_monitor"]["epoch"] == 3 for s in row["seeds"])
        assert all(0 <= s["val_monitor"]["ece"] <= 1 for s in row["seeds"])
    for name in ("report.md", "report.txt", "reliability.png"):
        assert (out / name).stat().st_size > 0
    assert "true CE before → after" in (out / "report.txt").read_text()


def test_properness_tags():
    """Regularised objectives are never proper; the plain rules carry torchcal's own tags."""
    assert build_loss("mmce").is_proper == "no"
    assert properness(build_loss("dca", {"dca": 0.0})) == "strict"  # weight 0: the log score
    expected = {"log_score": "strict", "brier": "strict", "spherical": "strict"}
    for name in LOSS_NAMES:
        assert properness(build_loss(name)) == expected.get(name, "no"), name


def test_every_loss_builds_and_trains_a_step():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 5, generator=g, requires_grad=True)
    target = torch.randint(0, 5, (32,), generator=g)
    assert len(LOSS_NAMES) == 11
    for name in LOSS_NAMES:
        loss = build_loss(name)(logits, target)
        (grad,) = torch.autograd.grad(loss, logits)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), name


def test_regularised_loss_is_base_plus_weight_times_penalty():
    from torchcal.functional import dca, log_score

    g = torch.Generator().manual_seed(1)
    z, y = torch.randn(20, 4, generator=g), torch.randint(0, 4, (20,), generator=g)
    got = build_loss("dca", {"dca": 3.0})(z, y)
    assert float(got) == pytest.approx(float(log_score(z, y) + 3.0 * dca(z, y)), rel=1e-6)
    assert PAPER_WEIGHTS["dca"] == 5.0


def test_regularisers_are_the_papers_objectives():
    """NLL + lambda * MMCE with the root (Kumar et al. 2018), NLL + beta * SB-ECE with the root
    (Karandikar et al. 2021), at the weights documented in recipes/loss_bakeoff/losses.py."""
    from torchcal.functional import confidence_penalty, log_score, mmce, soft_binned_ece

    assert PAPER_WEIGHTS == {
        "mmce": 2.0, "sb_ece": 1.0, "dca": 5.0, "mdca": 1.0, "confidence_penalty": 0.1,
    }  # fmt: skip
    g = torch.Generator().manual_seed(2)
    z, y = torch.randn(40, 4, generator=g), torch.randint(0, 4, (40,), generator=g)
    nll = log_score(z, y)
    roots = {
        "mmce": 2.0 * mmce(z, y, squared=False),
        "sb_ece": 1.0 * soft_binned_ece(z, y, bins=15, temperature=0.01, p=2.0, root=True),
        "confidence_penalty": confidence_penalty(z, y, beta=0.1),
    }
    for name, penalty in roots.items():
        got = build_loss(name)(z, y)
        assert float(got) == pytest.approx(float(nll + penalty), rel=1e-6), name
    smoothed = log_score(z, y, label_smoothing=0.1)
    assert float(build_loss("label_smoothing")(z, y)) == pytest.approx(float(smoothed), rel=1e-6)
    assert build_loss("focal_gamma3").gamma == 3.0


def test_noise_floor_matches_a_closed_form():
    """All confidences equal c (one bin): ECE = |mean(y) - c|, mean(y) ~ Binomial(n, c) / n;
    its expectation is summed exactly over the binomial law."""
    n, c = 50, 0.8
    floor = ece_noise_floor(torch.full((n,), c, dtype=torch.float64), draws=4000, seed=0)
    pmf = [math.comb(n, k) * c**k * (1 - c) ** (n - k) for k in range(n + 1)]
    exact = sum(p * abs(k / n - c) for k, p in enumerate(pmf))
    sd = math.sqrt(sum(p * (abs(k / n - c) - exact) ** 2 for k, p in enumerate(pmf)))
    assert floor["mean"] == pytest.approx(exact, abs=4 * sd / math.sqrt(4000))
    assert floor["std"] == pytest.approx(sd, rel=0.1)


def test_score_truth_columns_against_a_direct_computation():
    d = make_data(3, n_train=5, n_val=5, n_test=300)
    z = Teacher(8, 5, 16, 2.0, 7).logits(d.test[0])  # another network's logits
    s = score(z, d.test[1], d.test_truth, n_bins=10)
    p = torch.softmax(z, 1)
    conf, pred = p.max(1)
    q = d.test_truth[torch.arange(300), pred]
    b = torch.clamp((conf * 10).floor().long(), max=9)
    gap = sum(abs(float(conf[b == k].sum() - q[b == k].sum())) for k in range(10)) / 300
    assert s["true_ce"] == pytest.approx(gap, rel=1e-10)
    kl = (d.test_truth * (d.test_truth.log() - p.log())).sum(1).mean()
    assert s["kl"] == pytest.approx(float(kl), rel=1e-10)
    assert score(z, d.test[1], None)["true_ce"] is None


def test_teacher_is_fixed_and_data_follow_the_seed():
    a, b = make_data(0, n_train=4, n_val=4, n_test=4), make_data(1, n_train=4, n_val=4, n_test=4)
    x = torch.zeros(1, 8, dtype=torch.float64)
    t = Teacher(8, 5, 16, 2.0, 1234)
    assert torch.equal(t.probs(x), Teacher(8, 5, 16, 2.0, 1234).probs(x))
    assert not torch.equal(a.train[0], b.train[0])
    digits = make_data(5, dataset="digits", n_val=100, n_test=200)
    assert digits.sizes() == {"train": 1497, "val": 100, "test": 200}
    assert digits.test_truth is None and digits.num_classes == 10
    assert torch.equal(
        digits.test[1], make_data(6, dataset="digits", n_val=100, n_test=200).test[1]
    )


def test_validation_interval_always_hits_the_last_epoch():
    for epochs in range(1, 60):
        k = validation_interval(epochs)
        assert epochs % k == 0 and (epochs < 4 or epochs // k >= 4)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--losses", "[log_score,nope]"], "^error: losses"),
        (["--weights", "{dca: -1.0}"], "^error: weights"),
        (["--weights", "{focal: 1.0}"], "^error: weights"),
        (["--data.sharpness", "0"], "^error: data.sharpness"),
        (["--model.epochs", "0"], "^error: model.epochs"),
        (["--seeds", "[]"], "^error: seeds"),
    ],
)
def test_bad_options_exit_2(args, match, tmp_path, capsys):
    assert main(["--config", TINY, "--output_dir", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert re.match(match, err), err
