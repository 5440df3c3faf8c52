"""Proper scores of predictive distributions as streaming Metrics: CRPS, Gaussian NLL,
interval score (issue 11).

Each keeps a float64 sum and an int64 count per group and calls the functional with
``reduction="none"`` on the inputs upcast to float64 (float32 transcendentals round
differently with a value's position in a batch, docs/design.md section 3), so a stream equals
one call to float64 rounding whatever the input dtype. Shapes and checks are the functionals':
forecast first, ``target`` last and never broadcast; ``groups`` has the target's shape.
``compute()`` returns the mean (float64 scalar) or a :class:`~torchcal.GroupedResult`
with ``num_groups`` (``NaN`` for an empty group).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_option, validation_enabled
from torchcal.functional._forecast import check_location_scale, gaussian_spread
from torchcal.functional._validation import check_alpha
from torchcal.functional.calibration.results import GroupedResult
from torchcal.functional.continuous import gaussian_nll_of, interval_score
from torchcal.functional.crps import crps_ensemble, crps_laplace, crps_logistic, crps_normal
from torchcal.metrics._base import StateRules
from torchcal.metrics.regression import RegressionMetric

__all__ = [
    "CRPS",
    "GaussianNLL",
    "IntervalScore",
]


def as_float64(*xs: Tensor) -> list[Tensor]:
    """Floating tensors upcast to float64 (anything else is left to the functional's checks)."""
    return [
        x.detach().to(torch.float64) if isinstance(x, Tensor) and x.is_floating_point() else x
        for x in xs
    ]


CRPS_CLOSED_FORMS = {"normal": crps_normal, "laplace": crps_laplace, "logistic": crps_logistic}


class MeanScore(RegressionMetric):
    """A float64 sum of per-item scores and an int64 count per group; ``compute`` = mean."""

    higher_is_better = False

    def __init__(
        self, *, num_groups: int | None = None, validate_args: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(num_groups=num_groups, validate_args=validate_args, **kwargs)
        self.add_state("total", torch.zeros(self._G, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros(self._G, dtype=torch.int64), dist_reduce_fx="sum")

    def _add(self, items: Tensor, target: Tensor, groups: Tensor | None) -> None:
        """Add the per-item scores ``items`` (the target's shape)."""
        ids = self._group_ids(groups, target.shape)
        total = self._sum_rows(items.reshape(-1, 1), ids, torch.float64)[:, 0]
        self.total.add_(total.to(self.total.device))
        self.count.add_(self._count_rows(ids, target.numel()).to(self.count.device))

    def compute(self) -> Tensor | GroupedResult:
        """The mean score (float64 scalar), or a GroupedResult."""
        return self._result(
            lambda t, n: t / n.to(torch.float64), [self.total, self.count], self.count
        )


class CRPS(MeanScore):
    """Streaming mean continuous ranked probability score.

    ``family="normal" | "laplace" | "logistic"``: ``update(loc, scale, target, groups=None)``
    (the closed forms :func:`~torchcal.functional.crps_normal`, ...); ``family="ensemble"``:
    ``update(samples, target, groups=None)`` (:func:`~torchcal.functional.crps_ensemble` with
    ``estimator`` and ``ensemble_dim``).

    Args:
        family: the forecast family.
        estimator: ``"fair"`` or ``"nrg"`` (ensembles only).
        ensemble_dim: the members' dimension of ``samples`` (ensembles only).
        num_groups: per-group means (``update`` then needs ``groups`` of ``target``'s shape).
        validate_args: run the value checks (NaN, scale > 0, group ids).

    Example:
        >>> import torch
        >>> from torchcal.metrics import CRPS
        >>> m = CRPS("normal")
        >>> m.update(torch.zeros(2), torch.ones(2), torch.zeros(2))
        >>> round(float(m.compute()), 6)  # (sqrt(2) - 1) / sqrt(pi)
        0.233695
    """

    _CONFIG = ("family", "estimator", "num_groups")
    _RULES = StateRules(counts=("count",), sums=("total",))  # the fair estimator can be < 0

    def __init__(
        self,
        family: str = "normal",
        *,
        estimator: str = "fair",
        ensemble_dim: int = -1,
        num_groups: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_groups=num_groups, validate_args=validate_args, **kwargs)
        self.family = check_option("family", family, (*CRPS_CLOSED_FORMS, "ensemble"))
        self.estimator = check_option("estimator", estimator, ("fair", "nrg"))
        self.ensemble_dim = int(ensemble_dim)

    def update(self, *forecast_and_target: Tensor, groups: Tensor | None = None) -> None:
        """``update(loc, scale, target)`` or, for ensembles, ``update(samples, target)``."""
        want = ("samples", "target") if self.family == "ensemble" else ("loc", "scale", "target")
        if len(forecast_and_target) != len(want):
            raise TypeError(
                f"update() of CRPS(family={self.family!r}) takes ({', '.join(want)}), "
                f"got {len(forecast_and_target)} positional arguments"
            )
        target = forecast_and_target[-1]
        args = as_float64(*forecast_and_target)
        with validation_enabled(self.validate_args):
            if self.family == "ensemble":
                items = crps_ensemble(
                    *args,
                    estimator=self.estimator,
                    ensemble_dim=self.ensemble_dim,
                    reduction="none",
                )
            else:
                items = CRPS_CLOSED_FORMS[self.family](*args, reduction="none")
        self._add(items.detach(), target, groups)


class GaussianNLL(MeanScore):
    """Streaming mean Gaussian negative log-likelihood (the log score of ``N(loc, scale^2)``,
    with the ``log(2 pi) / 2`` constant; :func:`~torchcal.functional.gaussian_nll`).

    ``update(loc, scale, target, groups=None)`` with the positional ``scale`` the **standard
    deviation**; or name the spread, ``update(loc, target=y, sd=s)`` or ``update(loc,
    target=y, var=v)`` (the variance). ``var=`` with ``sd=`` raise ``ValueError``, a
    positional spread with a named one ``TypeError``; the spread is never guessed from its
    values. (The loss :class:`~torchcal.losses.GaussianNLLLoss` reads its positional spread as
    the variance, as torch: name it when in doubt.)

    Args:
        num_groups: per-group means (``update`` then needs ``groups`` of ``target``'s shape).
        validate_args: run the value checks (NaN, scale > 0, group ids).

    Example:
        >>> import torch
        >>> from torchcal.metrics import GaussianNLL
        >>> m = GaussianNLL()
        >>> m.update(torch.zeros(1), torch.ones(1), torch.zeros(1))
        >>> round(float(m.compute()), 6)  # log(2 pi) / 2
        0.918939
        >>> m = GaussianNLL()
        >>> m.update(torch.zeros(1), target=torch.full((1,), 2.0), var=torch.full((1,), 4.0))
        >>> round(float(m.compute()), 4)
        2.1121
    """

    _CONFIG = ("num_groups",)
    _RULES = StateRules(counts=("count",), sums=("total",))

    def update(
        self,
        loc: Tensor,
        scale: Tensor | None = None,
        target: Tensor | None = None,
        groups: Tensor | None = None,
        *,
        var: Tensor | None = None,
        sd: Tensor | None = None,
    ) -> None:
        """Accumulate a batch (shapes as :func:`~torchcal.functional.gaussian_nll`)."""
        name = "var" if var is not None else "sd" if sd is not None else "scale"
        spread, is_var = gaussian_spread("GaussianNLL.update", scale, var, sd, "sd")
        if target is None:
            raise TypeError("GaussianNLL.update: missing target (the observations)")
        with validation_enabled(self.validate_args):  # checked here to name the spread
            loc64, spread64, target64 = as_float64(loc, spread, target)
            mu, spread64, y = check_location_scale(loc64, spread64, target64, name)
        with validation_enabled(False):
            items = gaussian_nll_of(mu, spread64, y, is_var, True, "none")
        self._add(items.detach(), target, groups)


class IntervalScore(MeanScore):
    """Streaming mean interval score of central ``(1 - alpha)`` intervals
    (:func:`~torchcal.functional.interval_score`; width plus ``2 / alpha`` times the miss).

    ``update(lower, upper, target, groups=None)``; for several levels at once use
    :class:`~torchcal.metrics.IntervalCoverage` (its ``interval_score`` per level).

    Args:
        alpha: the miscoverage level in (0, 1).
        num_groups: per-group means (``update`` then needs ``groups`` of ``target``'s shape).
        validate_args: run the value checks (NaN, lower <= upper, group ids).

    Example:
        >>> import torch
        >>> from torchcal.metrics import IntervalScore
        >>> m = IntervalScore(alpha=0.5)
        >>> m.update(torch.zeros(2), torch.ones(2), torch.tensor([0.5, 2.0]))
        >>> float(m.compute())  # (1 + 5) / 2
        3.0
    """

    _CONFIG = ("alpha", "num_groups")
    _RULES = StateRules(counts=("count",), nonnegative=("total",))

    def __init__(
        self,
        alpha: float,
        *,
        num_groups: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_groups=num_groups, validate_args=validate_args, **kwargs)
        if isinstance(alpha, Tensor):
            raise TypeError("alpha: expected a float (one level); use IntervalCoverage for several")
        self.alpha = check_alpha(alpha)

    def update(
        self, lower: Tensor, upper: Tensor, target: Tensor, groups: Tensor | None = None
    ) -> None:
        """Accumulate a batch (shapes as :func:`~torchcal.functional.interval_score`)."""
        with validation_enabled(self.validate_args):
            args = as_float64(lower, upper, target)
            items = interval_score(*args, alpha=self.alpha, reduction="none")
        self._add(items.detach(), target, groups)
