"""CalibrationMonitor(selective_bins=...) logs the tie-averaged AURC and AUGRC."""

from __future__ import annotations

import pytest
import torch
from _callbacks_helpers import TinyModule, loader, make_data, quiet_warnings, trainer

from torchcal.callbacks import CalibrationMonitor
from torchcal.functional import risk_coverage_from_stats
from torchcal.functional.calibration.binning import accumulate
from torchcal.functional.calibration.readings import prepare_inputs


@pytest.fixture(autouse=True)
def _quiet():
    quiet_warnings()


def test_monitor_logs_aurc_and_augrc(tmp_path):
    val = make_data(200, 3)
    model = TinyModule()
    mon = CalibrationMonitor(n_bins=8, sinks=(), selective_bins=500)
    out = trainer(tmp_path, callbacks=[mon]).validate(model, loader(val), verbose=False)[0]
    with torch.no_grad():
        logits = torch.cat([model(b[0]) for b in loader(val)])
    y = torch.cat([b[1] for b in loader(val)])
    prep = prepare_inputs(logits, y, reading="confidence", input="logits")
    ref = risk_coverage_from_stats(accumulate(prep, 500).pooled())
    assert out["val/aurc"] == pytest.approx(float(ref.aurc), abs=1e-6)
    assert out["val/augrc"] == pytest.approx(float(ref.augrc), abs=1e-6)
    assert mon.history[-1]["aurc"] == pytest.approx(float(ref.aurc), abs=1e-12)
    assert mon.metrics[-2:] == ("aurc", "augrc")


def test_monitor_selective_is_opt_in_and_confidence_only():
    assert "aurc" not in CalibrationMonitor().metrics
    assert CalibrationMonitor().state_key == CalibrationMonitor(selective_bins=None).state_key
    with pytest.raises(ValueError, match="^selective_bins"):
        CalibrationMonitor(reading="binary", selective_bins=100)
    with pytest.raises(ValueError, match="^selective_bins"):
        CalibrationMonitor(selective_bins=0)
