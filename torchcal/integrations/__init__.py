"""Calibration where LLM evaluations already run (docs/design.md section 6h; the user's page
is docs/llm.md): lm-evaluation-harness and Hugging Face ``evaluate``.

- the confidence rules ``raw`` (``softmax(ll)``, the harness's ``brier_score``) and ``norm``
  (``softmax(ll / len)``, ``acc_norm``'s answer) of a multiple-choice evaluation
  (:func:`choice_logits`), its calibration metrics (:func:`choice_scores`, and
  :func:`aggregate` on the harness's per-document items);
- the reader of the harness's ``samples_*.jsonl`` (:func:`read_samples`: every task a group,
  a bad or truncated line a one-line error with its line number) and the audit of a run,
  ``torchcal audit --from lm-eval RESULTS_DIR`` (:func:`audit_samples`, with a temperature
  cross-fitted per task: :func:`cross_fitted_temperature`);
- a Hugging Face ``evaluate`` metric module, loaded by path
  (:func:`evaluate_module_path`).

None of these imports the harness or ``evaluate`` (they read their files), and ``import
torchcal`` does not import this namespace. The harness side is the module
``torchcal.integrations.lm_eval_task`` (it imports ``lm_eval``; ``pip install
'torchcal[llm]'``): importing it registers ``torchcal_<metric>`` and ``torchcal_<metric>_norm``
for every metric of :data:`METRICS` with the harness, and its ``CalibratedMultipleChoiceTask``
is the task class a YAML task names to emit them (docs/llm.md).

Example:
    >>> import torch
    >>> from torchcal.integrations import choice_logits, choice_scores
    >>> lls = torch.tensor([[-1.0, -3.0], [-2.0, -1.5]], dtype=torch.float64)
    >>> lengths = torch.tensor([[2.0, 8.0], [3.0, 1.0]], dtype=torch.float64)
    >>> s = choice_scores(choice_logits(lls, lengths, "norm"), torch.tensor([0, 1]))
    >>> sorted(s)
    ['aurc', 'brier', 'ece', 'nll', 'smooth_ece']
"""

from torchcal.integrations._lm_eval_samples import LoggedSamples, read_samples, sample_files
from torchcal.integrations.lm_eval import (
    METRICS,
    N_BINS,
    RULES,
    aggregate,
    audit_samples,
    choice_logits,
    choice_scores,
    cross_fitted_temperature,
    evaluate_module_path,
    items_to_tensors,
)

__all__ = [
    "METRICS",
    "N_BINS",
    "RULES",
    "LoggedSamples",
    "aggregate",
    "audit_samples",
    "choice_logits",
    "choice_scores",
    "cross_fitted_temperature",
    "evaluate_module_path",
    "items_to_tensors",
    "read_samples",
    "sample_files",
]
