"""torchcal: make model confidence mean something, during training and after it.

Sub-packages: :mod:`torchcal.functional` (the math), :mod:`torchcal.losses`
(``nn.Module`` losses), :mod:`torchcal.metrics` (torchmetrics ``Metric`` s),
:mod:`torchcal.scaling` (post-hoc calibrators) and :mod:`torchcal.callbacks`
(Lightning callbacks, imported on demand).
"""

from importlib.metadata import PackageNotFoundError, version

from torchcal import functional, losses, metrics, rewards, scaling
from torchcal.report import ReliabilityTable

try:  # one source: the version in pyproject.toml, read from the installed metadata
    __version__ = version("torchcal")
except PackageNotFoundError:  # pragma: no cover - imported from a checkout never installed
    __version__ = "0+unknown"

__all__ = [
    "ReliabilityTable",
    "functional",
    "losses",
    "metrics",
    "rewards",
    "scaling",
    "__version__",
]
