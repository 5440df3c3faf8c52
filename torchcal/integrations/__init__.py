"""Adapters for the tools where LLM evaluations already run (docs/design.md section 6h).

- :mod:`torchcal.integrations.lm_eval`: the confidence rules ``raw``/``norm`` and the
  calibration metrics of a multiple-choice evaluation of lm-evaluation-harness, the reader of
  its ``samples_*.jsonl`` and ``torchcal audit --from lm-eval RESULTS_DIR``; it needs neither
  the harness nor ``evaluate`` (it reads their files);
- :mod:`torchcal.integrations.lm_eval_task`: the harness side (imports ``lm_eval``): the
  metrics registered with the harness and the task class that computes them;
- ``torchcal/integrations/hf_evaluate/torchcal_calibration.py``: a Hugging Face ``evaluate``
  metric module, loaded by path (:func:`torchcal.integrations.lm_eval.evaluate_module_path`).

Nothing here is imported by ``import torchcal``; ``pip install 'torchcal[llm]'`` installs the
harness and ``evaluate``.
"""

__all__: list[str] = []
