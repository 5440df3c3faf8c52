"""Streaming selective-prediction metrics: AURC, AUGRC, risk at a coverage, coverage at a risk
and the risk-coverage curve, on the binned core (thin shells over
:mod:`torchcal.functional.selective`).

The state is the confidence reading's binned statistics (O(``n_bins``), summed across ranks
under DDP, merged by addition); each bin is one tie block, and the distance to the exact value
is bounded by :meth:`bound`. With ``exact=True`` the confidences and outcomes are kept (O(N),
concatenated across ranks) and the result equals the functional, tie-averaged value, bitwise
independent of row order, batch boundaries and the order in which ranks are gathered.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_option
from torchcal.functional._validation import check_finite_value
from torchcal.functional.calibration.readings import samples_from
from torchcal.functional.selective import (
    INTEGRATIONS,
    RiskCoverage,
    augrc_of,
    aurc_of,
    coverage_at_risk_of,
    coverage_fraction,
    risk_at_coverage_of,
    risk_coverage_curve,
    risk_coverage_from_stats,
    selective_binned_bound,
)
from torchcal.metrics._base import BinnedMetric

__all__ = ["AURC", "AUGRC", "RiskAtCoverage", "CoverageAtRisk", "RiskCoverageCurve"]


class RiskCoverageCurve(BinnedMetric):
    """The risk-coverage summary (:class:`~torchcal.functional.RiskCoverage`) of the top-label
    confidence against the 0/1 error, streamed.

    Args:
        n_bins: bins of the binned core (each a tie block); the bound :meth:`bound` shrinks
            with them.
        input: ``"logits"`` or ``"probs"``.
        exact: keep the samples and compute the exact tie-averaged values.
        num_classes, validate_args, ignore_index: as :class:`~torchcal.metrics.CalibrationError`.

    Example:
        >>> import torch
        >>> from torchcal.metrics import AURC
        >>> m = AURC(exact=True)
        >>> m.update(torch.tensor([[3.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))
        >>> m.update(torch.tensor([[2.0, 0.0], [0.0, 0.1]]), torch.tensor([0, 1]))
        >>> round(float(m.compute()), 4)                     # (0 + 0 + 1/3 + 1/4) / 4
        0.1458
    """

    higher_is_better = False

    def __init__(
        self,
        n_bins: int = 1000,
        *,
        input: str = "logits",
        exact: bool = False,
        num_classes: int | None = None,
        validate_args: bool = True,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            n_bins,
            reading="confidence",
            input=input,
            num_classes=num_classes,
            validate_args=validate_args,
            ignore_index=ignore_index,
            **kwargs,
        )
        if not isinstance(exact, bool):
            raise TypeError(f"exact: expected a bool, got {type(exact).__name__}")
        self.exact = exact
        if exact:
            self.add_state("sample_conf", [], dist_reduce_fx="cat")
            self.add_state("sample_outcome", [], dist_reduce_fx="cat")

    _CONFIG = BinnedMetric._CONFIG + ("exact", "integration")

    def _cat_dtypes(self) -> dict[str, torch.dtype]:
        if not self.exact:
            return {}
        return {"sample_conf": torch.float64, "sample_outcome": torch.float64}

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Accumulate logits/probabilities ``(N, C)`` and class ids ``(N,)``."""
        prep = self._prepare(preds, target, None)
        self._update_binned(prep)
        if self.exact:
            s = samples_from(prep)
            self.sample_conf.append(s.conf)
            self.sample_outcome.append(s.outcome)

    def _summary(self) -> RiskCoverage:
        self._check_seen()
        if not self.exact:
            return risk_coverage_from_stats(self._stats().pooled())

        def cat(x: Any) -> Tensor:
            return x if isinstance(x, Tensor) else torch.cat(x)

        conf, outcome = cat(self.sample_conf), cat(self.sample_outcome)
        return risk_coverage_curve(conf, 1.0 - outcome)

    def compute(self) -> Any:
        """The :class:`~torchcal.functional.RiskCoverage` summary."""
        return self._summary()

    def bound(self) -> tuple[Tensor, Tensor]:
        """``(aurc_bound, augrc_bound)``: the most the binned values can differ from the exact
        ones (:func:`~torchcal.functional.selective_binned_bound`); zeros with ``exact=True``."""
        self._check_seen()
        if self.exact:
            z = torch.zeros((), dtype=torch.float64)
            return z, z.clone()
        return selective_binned_bound(self.statistics().stats.pooled())

    def plot(self, val: Any = None, ax: Any = None) -> Any:
        from torchcal.plotting import plot_risk_coverage

        return plot_risk_coverage(self._summary() if val is None else val, ax=ax)


class AURC(RiskCoverageCurve):
    """Streaming AURC (tie-averaged; see :class:`RiskCoverageCurve` for the arguments);
    ``integration="mean"`` (default, ``(1/N) sum_i S_i / i``) or ``"trapezoid"`` (fd-shifts'
    ``aurc``), as :func:`~torchcal.functional.aurc`.

    Example:
        >>> import torch
        >>> from torchcal.metrics import AURC
        >>> m = AURC(n_bins=10)
        >>> m.update(torch.tensor([[3.0, 0.0], [0.0, 1.0], [2.0, 0.0]]), torch.tensor([0, 0, 0]))
        >>> round(float(m.compute()), 4)                     # (0 + 0 + 1/3) / 3
        0.1111
    """

    def __init__(self, n_bins: int = 1000, *, integration: str = "mean", **kwargs: Any) -> None:
        super().__init__(n_bins, **kwargs)
        check_option("integration", integration, INTEGRATIONS)
        self.integration = integration

    def compute(self) -> Tensor:
        return aurc_of(self._summary(), self.integration)


class AUGRC(RiskCoverageCurve):
    """Streaming AUGRC (Traub et al. 2024), tie-averaged (:class:`RiskCoverageCurve`);
    ``integration="trapezoid"`` (default: the paper's rule, fd-shifts' value) or ``"mean"``
    (``(1/N) sum_i S_i / N``), as :func:`~torchcal.functional.augrc`.

    Example:
        >>> import torch
        >>> from torchcal.metrics import AUGRC
        >>> m = AUGRC(n_bins=10)
        >>> m.update(torch.tensor([[3.0, 0.0], [0.0, 1.0], [2.0, 0.0]]), torch.tensor([0, 0, 0]))
        >>> round(float(m.compute()), 4)                     # trapezoid (2/3, 0) -> (1, 1/3)
        0.0556
    """

    def __init__(
        self, n_bins: int = 1000, *, integration: str = "trapezoid", **kwargs: Any
    ) -> None:
        super().__init__(n_bins, **kwargs)
        check_option("integration", integration, INTEGRATIONS)
        self.integration = integration

    def compute(self) -> Tensor:
        return augrc_of(self._summary(), self.integration)


class RiskAtCoverage(RiskCoverageCurve):
    """Streaming selective risk at ``coverage`` (the top ``ceil(coverage * N)`` accepted, ties
    in expectation; :class:`RiskCoverageCurve` for the other arguments).

    Example:
        >>> import torch
        >>> from torchcal.metrics import RiskAtCoverage
        >>> m = RiskAtCoverage(0.5, n_bins=10)
        >>> m.update(torch.tensor([[3.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 0.1]]),
        ...          torch.tensor([0, 0, 0, 1]))
        >>> float(m.compute())
        0.0
    """

    def __init__(self, coverage: float, n_bins: int = 1000, **kwargs: Any) -> None:
        super().__init__(n_bins, **kwargs)
        # read as an exact fraction in its own precision (np.float32(0.1) is 1/10), kept as
        # the float that reads back as that fraction
        self.coverage = float(coverage_fraction(coverage))

    _CONFIG = RiskCoverageCurve._CONFIG + ("coverage",)

    def compute(self) -> Tensor:
        return risk_at_coverage_of(self._summary(), self.coverage)


class CoverageAtRisk(RiskCoverageCurve):
    """Streaming coverage at selective risk ``<= risk`` (:class:`RiskCoverageCurve`).

    Example:
        >>> import torch
        >>> from torchcal.metrics import CoverageAtRisk
        >>> m = CoverageAtRisk(0.2, n_bins=10)           # risks 0, 0, 1/3, 1/4 by coverage
        >>> m.update(torch.tensor([[3.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 0.1]]),
        ...          torch.tensor([0, 0, 0, 1]))
        >>> float(m.compute())
        0.5
    """

    def __init__(self, risk: float, n_bins: int = 1000, **kwargs: Any) -> None:
        super().__init__(n_bins, **kwargs)
        r = check_finite_value("risk", risk)
        if r < 0:
            raise ValueError(f"risk: expected a value >= 0, got {risk!r}")
        self.risk = r

    _CONFIG = RiskCoverageCurve._CONFIG + ("risk",)

    def compute(self) -> Tensor:
        return coverage_at_risk_of(self._summary(), self.risk)
