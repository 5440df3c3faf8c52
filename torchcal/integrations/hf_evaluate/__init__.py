"""The Hugging Face ``evaluate`` metric module (``torchcal_calibration.py``), loaded by path."""
