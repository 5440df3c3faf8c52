"""Heteroscedastic regression: is a predictive distribution calibrated, sharp and right where
it matters? Three reference forecasts (climatology, homoscedastic, the truth) and two small
networks trained with a proper score (Gaussian NLL, CRPS), then repaired on a held-out split
with :class:`torchcal.scaling.VarianceScaler` and split conformal intervals.

Run ``python -m recipes.heteroscedastic_regression --config
configs/regression/heteroscedastic.yaml``. Modules: :mod:`.data` (the process),
:mod:`.model` (the networks and their training loop), :mod:`.forecasts` (the forecasts and
their scores), :mod:`.report` (outputs), :mod:`.cli` (the command).
"""
