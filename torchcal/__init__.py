"""torchcal: make model confidence mean something, during training and after it.

Sub-packages: :mod:`torchcal.functional` (the math), :mod:`torchcal.losses`
(``nn.Module`` losses), :mod:`torchcal.metrics` (torchmetrics ``Metric`` s),
:mod:`torchcal.scaling` (post-hoc calibrators) and :mod:`torchcal.callbacks`
(Lightning callbacks, imported on demand).
"""

from torchcal import functional, losses, metrics, rewards, scaling
from torchcal.report import ReliabilityTable

__version__ = "0.1.0"

__all__ = [
    "ReliabilityTable",
    "functional",
    "losses",
    "metrics",
    "rewards",
    "scaling",
    "__version__",
]
