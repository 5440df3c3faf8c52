"""What the ComplEx recipe tests share: the tiny family KG's command-line words, the quiet
run's, and the small model of the training-step checks."""

from __future__ import annotations

from typing import Any

from recipes.complex_link_prediction.datasets import KGData
from recipes.complex_link_prediction.model import ComplExModule

#: the tiny family KG (3 families over 4 generations)
TINY_FAMILY = ["--data.dataset", "family", "--data.num_families", "3", "--data.generations", "4"]
#: no progress bar, no logger, no audit plots
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.logger", "false"]
QUIET += ["--audit.plots", "false"]


def small_module(data: KGData, **kw: Any) -> ComplExModule:
    """A rank-6 :class:`ComplExModule` on ``data`` (initial scale 0.3); ``kw`` to the module."""
    return ComplExModule(
        data.num_entities,
        data.num_relations,
        data.train,
        data.known(),
        rank=6,
        init_scale=0.3,
        **kw,
    )
