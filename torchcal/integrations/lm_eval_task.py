"""The harness side of :mod:`torchcal.integrations.lm_eval` (docs/design.md section 6h):
torchcal's calibration metrics registered with lm-evaluation-harness, and the task class that
computes them. This module imports ``lm_eval`` (``pip install 'torchcal[llm]'``).

Importing it registers, for every metric of :data:`~torchcal.integrations.lm_eval.METRICS`,
``torchcal_<metric>`` (the ``raw`` rule) and ``torchcal_<metric>_norm`` (the ``norm``
rule), lower is better, with their aggregations. The harness's multiple-choice task emits only
its own metrics, so a task that lists them names the class::

    task: my_task
    class: !function torchcal.integrations.lm_eval_task.CalibratedMultipleChoiceTask
    output_type: multiple_choice
    ...
    metric_list:
      - metric: acc_norm
      - metric: brier_score
      - metric: torchcal_ece_norm
      - metric: torchcal_brier

Its per-document item is ``(gold, lls, lengths)``: the gold choice as the harness resolves
it, the log-likelihood of each choice and each choice's character count (``acc_norm``'s).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from lm_eval.api.registry import (  # type: ignore[import-untyped]
    aggregation_registry,
    metric_registry,
    register_aggregation,
    register_metric,
)
from lm_eval.api.task import ConfigurableTask  # type: ignore[import-untyped]

from torchcal.integrations.lm_eval import METRICS, RULES, aggregate

#: harness metric name -> (metric, rule)
HARNESS_METRICS = {
    f"torchcal_{m}{'' if r == 'raw' else '_' + r}": (m, r) for m in METRICS for r in RULES
}


def _passthrough(items: Any) -> Any:
    return items


def register_harness_metrics() -> list[str]:
    """Register :data:`HARNESS_METRICS` with lm-eval (done on import; again is a no-op);
    ``ValueError`` when another package took one of the names. Returns the names.

    Example:
        >>> "torchcal_ece_norm" in register_harness_metrics()
        True
    """
    for name, (metric, rule) in HARNESS_METRICS.items():
        if name in aggregation_registry:
            fn = aggregation_registry.get(name)
            if getattr(fn, "keywords", None) != {"metric": metric, "rule": rule}:
                raise ValueError(f"{name}: already registered with lm-eval by another package")
            continue
        register_aggregation(name)(partial(aggregate, metric=metric, rule=rule))
        if name not in metric_registry:
            register_metric(
                metric=name,
                higher_is_better=False,
                output_type=["multiple_choice"],
                aggregation=name,
            )(_passthrough)
    return list(HARNESS_METRICS)


class CalibratedMultipleChoiceTask(ConfigurableTask):  # type: ignore[misc]
    """A YAML multiple-choice task that also emits the :data:`HARNESS_METRICS` its
    ``metric_list`` names (module docstring); everything else is the harness's."""

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not isinstance(config, dict):
            raise TypeError("config: expected the task's YAML config (a dict)")
        super().__init__(config={k: v for k, v in config.items() if k != "class"}, **kwargs)
        if self.OUTPUT_TYPE != "multiple_choice" or self.multiple_input:
            raise ValueError(
                f"output_type: {type(self).__name__} needs a multiple_choice task with one "
                f"input, got {self.OUTPUT_TYPE!r}"
            )

    def process_results(self, doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = super().process_results(doc, results)
        wanted = [m for m in self._metric_fn_list if m in HARNESS_METRICS]
        if wanted:
            item = self.calibration_item(doc, results)
            out.update(dict.fromkeys(wanted, item))
        return out

    def calibration_item(self, doc: dict[str, Any], results: list[Any]) -> tuple[Any, ...]:
        """``(gold, lls, lengths)`` of one document, the gold resolved as the harness does
        (an index, or a choice's text); a gold outside the choices is a ``ValueError``."""
        choices = self.doc_to_choice(doc)
        lls = tuple(float(r[0]) for r in results)
        if len(lls) != len(choices):
            raise ValueError(f"results: {len(lls)} loglikelihoods for {len(choices)} choices")
        gold = self.doc_to_target(doc)
        if isinstance(gold, str):
            gold = choices.index(gold) if gold in choices else -1
        if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
            raise ValueError(f"doc_to_target: {gold!r} is not one of {len(choices)} choices")
        return gold, lls, tuple(float(len(c)) for c in choices)


register_harness_metrics()
