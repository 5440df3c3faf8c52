"""Loss bake-off: what each training-time calibration loss does to calibration, measured
against a known truth.

A small network is trained with each objective (the log, Brier and spherical scores; focal
loss and FLSD-53; label smoothing; MMCE, soft-binned ECE, DCA, MDCA and the confidence penalty
beside the log score at the weights of :data:`.losses.PAPER_WEIGHTS`, sources there), then
temperature-scaled on a validation split (Lightning with
:class:`torchcal.callbacks.CalibrationMonitor` and
:class:`torchcal.callbacks.TemperatureScaling`). On the synthetic task the true conditional
probabilities are known, so the **true calibration error** (confidence against the true
probability that the prediction is right, no label noise) is reported beside the ECE; on
scikit-learn's digits the ECE is printed beside its label-noise floor.

Run ``python -m recipes.loss_bakeoff --config configs/bakeoff/synthetic.yaml`` (or
``digits.yaml``). Modules: :mod:`.data` (teacher and splits), :mod:`.losses` (the
contestants), :mod:`.model` (network and Lightning training), :mod:`.evaluate` (test
metrics, noise floor), :mod:`.report` (outputs), :mod:`.cli` (the command).
"""
