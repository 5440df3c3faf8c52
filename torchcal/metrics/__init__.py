"""torchmetrics Metrics over the binned core in torchcal.functional.calibration."""
