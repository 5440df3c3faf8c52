"""torchcal: make model confidence mean something, during training and after it.

Sub-packages: :mod:`torchcal.functional` (the math), :mod:`torchcal.losses`
(``nn.Module`` losses), :mod:`torchcal.metrics` (torchmetrics ``Metric`` s),
:mod:`torchcal.scaling` (post-hoc calibrators) and :mod:`torchcal.callbacks`
(Lightning callbacks, imported on demand).

Every sub-package is imported on first use (PEP 562 ``__getattr__``), so ``import torchcal``
costs no more than what it is used for: ``torchcal.losses`` never imports torchmetrics or
Lightning, ``torchcal.metrics`` imports torchmetrics, ``torchcal.callbacks`` Lightning.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:  # one source: the version in pyproject.toml, read from the installed metadata
    __version__ = version("torchcal")
except PackageNotFoundError:  # pragma: no cover - imported from a checkout never installed
    __version__ = "0+unknown"

__all__ = [
    "GroupedResult",
    "ReliabilityTable",
    "functional",
    "losses",
    "metrics",
    "rewards",
    "scaling",
    "__version__",
]

#: sub-modules reachable as attributes of the package (imported on first access)
_SUBMODULES = frozenset(
    {
        "audit",
        "callbacks",
        "functional",
        "losses",
        "metrics",
        "plotting",
        "rewards",
        "scaling",
    }
)

if TYPE_CHECKING:
    from torchcal import functional, losses, metrics, rewards, scaling
    from torchcal.functional.calibration.results import GroupedResult, ReliabilityTable


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        value: Any = importlib.import_module(f"torchcal.{name}")
    elif name in ("GroupedResult", "ReliabilityTable"):
        value = getattr(importlib.import_module("torchcal.functional.calibration.results"), name)
    else:
        raise AttributeError(f"module 'torchcal' has no attribute {name!r}")
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
