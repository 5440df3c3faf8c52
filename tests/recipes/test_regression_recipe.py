"""The heteroscedastic regression recipe: its own arithmetic against independent references
(properscoring, numpy, scipy), then one tiny end-to-end run as a user runs it (a fresh
process) and a second in-process run that must give the same report.json."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import torchcal.functional as TF
from recipes.heteroscedastic_regression.cli import main
from recipes.heteroscedastic_regression.data import make_data, mean_true_variance, true_scale
from recipes.heteroscedastic_regression.forecasts import (
    EmpiricalForecast,
    GaussianForecast,
    group_rates,
    x_region,
)
from recipes.heteroscedastic_regression.report import TIMING_KEY

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = "configs/regression/heteroscedastic.yaml"
TINY = [
    "--config", CONFIG,
    "--data.n_train", "2000", "--data.n_calibration", "1000",
    "--data.n_eval", "6000", "--data.n_past", "2000",
    "--model.epochs", "8", "--model.batch_size", "250",
    "--report.plots", "true", "--progress", "false",
]  # fmt: skip
KEYS = {
    "coverage90", "width90", "coverage90_low_x", "coverage90_high_x",
    "pit_shares", "pit_ece", "nll", "crps",
}  # fmt: skip
FORECASTS = [
    "climatology", "homoscedastic", "heteroscedastic",
    "mlp_nll", "mlp_nll_scaled", "mlp_nll_conformal",
    "mlp_crps", "mlp_crps_scaled", "mlp_crps_conformal",
]  # fmt: skip


def _members(seed: int, m: int, discrete: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, generator=g, dtype=torch.float64)
    return torch.round(2 * x) / 2 if discrete else x


@pytest.mark.parametrize("discrete", [False, True])
def test_climatology_crps_matches_properscoring_and_expanded_crps_ensemble(discrete):
    import properscoring as ps

    x = _members(0, 301, discrete)
    y = _members(1, 200, discrete) * 1.5 + 0.2
    got = EmpiricalForecast(x, 200).crps(y)
    ref = ps.crps_ensemble(y.numpy(), np.broadcast_to(x.numpy(), (200, 301)))
    assert got == pytest.approx(float(ref.mean()), rel=1e-12, abs=0)
    nrg = TF.crps_ensemble(x.expand(200, -1), y, estimator="nrg")
    assert got == pytest.approx(float(nrg), rel=1e-12, abs=0)


@pytest.mark.parametrize("discrete", [False, True])
def test_climatology_pit_is_pit_ensemble_of_the_expanded_ensemble_bit_for_bit(discrete):
    x = _members(2, 257, discrete)
    y = _members(3, 500, discrete)
    if discrete:
        assert (x == y[:, None]).any(1).float().mean() > 0.5  # ties happen
    y[:3] = torch.tensor([-50.0, 50.0, float(x.min())])  # below, above, on the minimum
    got = EmpiricalForecast(x, 500).pit(y, torch.Generator().manual_seed(7))
    ref = TF.pit_ensemble(x.expand(500, -1), y, generator=torch.Generator().manual_seed(7))
    assert torch.equal(got, ref)


def test_empirical_quantiles_are_numpy_inverted_cdf():
    x = _members(4, 999, False)
    levels = torch.arange(1, 20, dtype=torch.float64) / 20
    f = EmpiricalForecast(x, 3)
    q = f.quantiles(levels)
    ref = np.quantile(x.numpy(), levels.numpy(), method="inverted_cdf")
    assert q.shape == (3, 19)
    np.testing.assert_array_equal(q[1].numpy(), ref)
    lo, hi = f.interval(0.9)
    assert float(lo[0]) == ref[0] and float(hi[0]) == ref[-1]
    assert f.sharpness() == pytest.approx(float(np.std(x.numpy())), rel=1e-12)


def test_gaussian_forecast_quantiles_and_interval_are_scipy():
    from scipy.stats import norm

    loc = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)
    scale = torch.tensor([1.0, 0.5, 3.0], dtype=torch.float64)
    f = GaussianForecast(loc, scale)
    levels = torch.tensor([0.05, 0.5, 0.9], dtype=torch.float64)
    ref = norm.ppf(levels.numpy()[None], loc.numpy()[:, None], scale.numpy()[:, None])
    np.testing.assert_allclose(f.quantiles(levels).numpy(), ref, rtol=0, atol=1e-12)
    lo, hi = f.interval(0.9)
    rlo, rhi = norm.interval(0.9, loc.numpy(), scale.numpy())
    np.testing.assert_allclose(lo.numpy(), rlo, atol=1e-12)
    np.testing.assert_allclose(hi.numpy(), rhi, atol=1e-12)


def test_mean_true_variance_and_data():
    from scipy.integrate import quad

    ref, _ = quad(lambda x: float(true_scale(torch.tensor(x, dtype=torch.float64))) ** 2, 0, 1)
    assert mean_true_variance() == pytest.approx(ref, rel=1e-13)
    d = make_data(0, n_train=5, n_calibration=5, n_eval=20_000, n_past=5)
    x, y = d.eval
    z = (y - 2 * x) / true_scale(x)
    assert abs(float(z.mean())) < 4 / math.sqrt(20_000) and abs(float(z.std()) - 1) < 0.02
    assert torch.equal(make_data(0, 5, 5, 20_000, 5).eval[1], y)  # seeded
    with pytest.raises(ValueError, match=r"^data\.n_eval"):
        make_data(0, n_eval=1)


def test_x_region_and_group_rates():
    x = torch.tensor([0.0, 1 / 3, 0.5, 2 / 3, 0.7, 1.0], dtype=torch.float64)
    assert x_region(x).tolist() == [0, 1, 1, 1, 2, 2]
    hits = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    p, se, n = group_rates(hits, x_region(x), 3)
    assert p.tolist() == [1.0, 2 / 3, 0.5] and n.tolist() == [1.0, 3.0, 2.0]
    np.testing.assert_allclose(se.numpy(), np.sqrt([0.0, 2 / 9 / 3, 0.25 / 2]))


def _run_subprocess(out: pathlib.Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "recipes.heteroscedastic_regression", *TINY, "--output_dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _without_timing(rep: dict) -> dict:
    return {k: v for k, v in rep.items() if k != TIMING_KEY}


def test_tiny_run_end_to_end_and_deterministic(tmp_path, monkeypatch):
    out = tmp_path / "a"
    proc = _run_subprocess(out)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rep = json.loads((out / "report.json").read_text())
    assert list(rep["forecasts"]) == FORECASTS
    for name, f in rep["forecasts"].items():
        assert KEYS <= set(f), name
        assert (f["nll"] is None) == (name == "climatology" or name.endswith("_conformal"))
        assert (f["crps"] is None) == name.endswith("_conformal")
    for name in ("report.txt", "report.md", "pit.png", "coverage_by_x.png",
                 "quantile_reliability.png"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    n = rep["sizes"]["n_eval"]
    truth = rep["forecasts"]["heteroscedastic"]
    assert abs(truth["coverage90"] - 0.9) < 3 * math.sqrt(0.09 / n)
    assert max(abs(s - 0.2) for s in truth["pit_shares"]) < 3.5 * math.sqrt(0.16 / n)
    # Marginal calibration hides conditional failure. Climatology: calibrated marginally
    # (coverage, PIT), but under-covers both ends of x and over-covers the middle.
    clim = rep["forecasts"]["climatology"]
    assert abs(clim["coverage90"] - 0.9) < 3 * math.sqrt(0.09 / n)
    assert clim["coverage90_low_x"] + 3 * clim["coverage90_low_x_se"] < 0.9
    assert clim["coverage90_high_x"] + 3 * clim["coverage90_high_x_se"] < 0.9
    assert clim["coverage90_mid_x"] > 0.97
    # Homoscedastic: too wide at small x, too narrow at large x.
    homo = rep["forecasts"]["homoscedastic"]
    assert homo["coverage90_low_x"] - 3 * homo["coverage90_low_x_se"] > 0.9
    assert homo["coverage90_high_x"] + 3 * homo["coverage90_high_x_se"] < 0.9
    # The proper score ranks truth < homoscedastic < climatology; sharpness likewise.
    crps = {
        k: rep["forecasts"][k]["crps"] for k in ("heteroscedastic", "homoscedastic", "climatology")
    }
    assert crps["heteroscedastic"] < crps["homoscedastic"] < crps["climatology"]
    assert truth["width90"] < homo["width90"] < clim["width90"]
    for r in rep["recalibration"].values():
        assert 0.5 < r["variance_scale"] < 2 and r["conformal_quantile"] > 0
    # Determinism: the same options in this process give the same report (timing apart).
    monkeypatch.chdir(ROOT)
    assert main([*TINY, "--output_dir", str(tmp_path / "b")]) == 0
    again = json.loads((tmp_path / "b" / "report.json").read_text())
    assert _without_timing(again) == _without_timing(rep)


@pytest.mark.parametrize(
    "args, name",
    [
        (["--model.epochs", "0"], "model.epochs"),
        (["--data.n_eval", "1"], "data.n_eval"),
        (["--report.pit_bins", "1"], "report.pit_bins"),
        (["--threads", "0"], "threads"),
    ],
)
def test_bad_options_exit_2_naming_the_option(args, name, tmp_path, capsys):
    small = ["--data.n_train", "20", "--data.n_calibration", "20", "--data.n_eval", "20"]
    code = main([*small, "--model.epochs", "1", "--progress", "false", *args,
                 "--output_dir", str(tmp_path)])  # fmt: skip
    assert code == 2
    assert capsys.readouterr().err.startswith(f"error: {name}:")
