"""One temperature per group (domain), shrunk toward the global temperature."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal, cast

import torch
from torch import Tensor, nn

from torchcal.functional._checks import check_finite, check_int
from torchcal.functional._validation import (
    check_finite_value,
    check_group_ids,
    check_temperature_bounds,
)
from torchcal.functional.temperature.group import fit_group_temperatures
from torchcal.scaling._base import (
    FittedMixin,
    GroupTemperatureFit,
    as_binary_vector,
    check_logits_target,
    check_state_finite,
    logits_as,
    warn_all,
    warn_if_probabilities,
    working_dtype,
)

__all__ = ["GroupTemperatureScaler"]


class GroupTemperatureScaler(FittedMixin):
    r"""Per-group temperatures ``T_g`` (e.g. per domain, per relation), shrunk to a global T.

    ``forward(logits, groups) = logits / T[groups]``. The fit first finds the global
    NLL-optimal ``T`` (exactly as :class:`TemperatureScaler`), then, per group ``g``, minimises
    the penalised NLL (a Gaussian prior on ``log T_g`` centred at ``log T``; a MAP estimate):

        sum_{i in g} NLL_i(T_g) + shrinkage / 2 * (log T_g - log T)^2.

    The NLL is *summed* over the group, so ``shrinkage`` acts like a prior pseudo-count: small
    groups stay near the global ``T``, large groups follow their own data. ``shrinkage=0``
    fits the groups independently; ``shrinkage -> inf`` gives the global ``T`` everywhere. A
    group without samples gets the global ``T``.

    ``shrinkage="empirical_bayes"`` estimates the prior from the data instead: each group's
    own ``log T_g`` is fitted (as with ``shrinkage=0``), then shrunk toward ``log T`` by
    :func:`~torchcal.functional.shrinkage.empirical_bayes_shrinkage`, with precision the
    curvature of the group's summed NLL at its own ``log T_g`` and the between-group variance
    ``tau^2`` by the DerSimonian-Laird moment estimate: weight ``n_g / (n_g + k_g)``, so a
    group with few samples (or whose own fit stopped on a bound: a perfectly separated or
    uninformative group) gets about the global ``T`` and a large one its own. The fit then
    sets ``raw_temperatures`` (the unshrunk ``T_g``), ``shrinkage_weights`` (``(G,)`` in
    ``[0, 1)``) and ``between_group_variance`` (``tau^2`` of ``log T``) on the scaler. The same float64 statistics and safeguarded
    Newton solver as :class:`TemperatureScaler` run on all groups at once (one pass per step).

    Invariance (tested): multiclass -- every argmax is kept (each row is divided by a positive
    ``T_g``); binary -- the ranking (and AUC) *within each group* is kept, not across groups.

    State: ``log_temperature`` ``(G,)`` float64 parameter, ``log_temperature_global`` (float64
    buffer) and ``fitted``. ``forward`` before ``fit`` raises
    :class:`~torchcal.scaling.NotFittedError`.

    Args:
        num_groups: number of groups ``G``; group ids are ``0 .. G-1``.
        shrinkage: prior precision on ``log T_g`` (>= 0), in units of samples, or
            ``"empirical_bayes"`` (estimated from the data, see above).
        bounds, grad_tol, step_tol, max_iter: as in :class:`TemperatureScaler`.

    Example:
        >>> import torch
        >>> from torchcal.scaling import GroupTemperatureScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> logits = 3 * torch.randn(4000, 5, generator=g)
        >>> groups = torch.arange(4000) % 2
        >>> true_t = torch.tensor([1.5, 4.0])[groups].unsqueeze(1)
        >>> y = torch.multinomial(torch.softmax(logits / true_t, 1), 1, generator=g).squeeze(1)
        >>> scaler = GroupTemperatureScaler(2, shrinkage=1.0)
        >>> res = scaler.fit(logits, y, groups)
        >>> [round(t, 1) for t in res.temperatures]
        [1.5, 4.1]
        >>> bool((scaler(logits, groups).argmax(1) == logits.argmax(1)).all())  # argmax kept
        True
    """

    log_temperature: nn.Parameter
    log_temperature_global: Tensor

    def __init__(
        self,
        num_groups: int,
        *,
        shrinkage: float | Literal["empirical_bayes"] = 1.0,
        bounds: tuple[float, float] = (1e-3, 1e3),
        grad_tol: float = 1e-10,
        step_tol: float = 1e-8,
        max_iter: int = 100,
    ) -> None:
        super().__init__()
        self.num_groups = check_int("num_groups", num_groups, minimum=1)
        if isinstance(shrinkage, str) and shrinkage != "empirical_bayes":
            raise ValueError(
                f"shrinkage: expected a float >= 0 or 'empirical_bayes', got {shrinkage!r}"
            )
        self.shrinkage: float | str = (
            shrinkage
            if shrinkage == "empirical_bayes"
            else check_finite_value("shrinkage", float(shrinkage))
        )
        self.raw_temperatures: Tensor | None = None
        self.shrinkage_weights: Tensor | None = None
        self.between_group_variance: float | None = None
        self.bounds = check_temperature_bounds("bounds", bounds)
        self.grad_tol = check_finite_value("grad_tol", grad_tol)
        self.step_tol = check_finite_value("step_tol", step_tol)
        self.max_iter = check_int("max_iter", max_iter, minimum=1)
        self.log_temperature = nn.Parameter(torch.zeros(num_groups, dtype=torch.float64))
        self.register_buffer("log_temperature_global", torch.zeros((), dtype=torch.float64))
        self._init_fitted()

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        check_state_finite(state, prefix, "log_temperature", "log_temperature_global")
        for name in ("log_temperature", "log_temperature_global"):
            v = state.get(name)
            if v is not None and v.numel() and not float(v.abs().max()) <= 700.0:
                raise ValueError(
                    f"{prefix}{name}: expected temperatures 0 < T < inf in "
                    f"float64 (|log T| <= 700), got {v.flatten()[:8].tolist()}"
                )

    @property
    def temperatures(self) -> Tensor:
        """The per-group temperatures ``(G,)`` (a detached float64 tensor)."""
        return self.log_temperature.detach().exp()

    def _check_groups(self, groups: object, n: int, device: torch.device) -> Tensor:
        check_group_ids(groups, (n,), self.num_groups, always=True)
        return cast(Tensor, groups).detach().to(device=device, dtype=torch.long)

    def forward(self, logits: Tensor, groups: Tensor) -> Tensor:
        """``logits / T[groups]`` (binary ``(N,)`` or multiclass ``(N, C)``)."""
        self._check_fitted()
        if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() == 0:
            raise ValueError("logits: expected a floating-point tensor of shape (N,) or (N, C)")
        check_finite("logits", logits, allow_neg_inf=True)
        groups = self._check_groups(groups, logits.shape[0], logits.device)
        work = working_dtype(logits)
        t = torch.exp(self.log_temperature).to(device=logits.device, dtype=work)[groups]
        out = logits.to(work) / t.reshape(-1, *([1] * (logits.dim() - 1)))
        return logits_as(out, logits.dtype, 1 if logits.dim() >= 2 else None)

    def fit(self, logits: Tensor, target: Tensor, groups: Tensor) -> GroupTemperatureFit:
        """Fit the global and the per-group temperatures (see the class docstring)."""
        logits, target, _ = as_binary_vector(logits, target)
        check_logits_target(logits, target)
        groups = self._check_groups(groups, logits.shape[0], logits.device)
        warn_if_probabilities(logits)
        with torch.inference_mode(False), torch.no_grad():
            sol = fit_group_temperatures(
                logits,
                target,
                groups,
                self.num_groups,
                shrinkage=self.shrinkage,
                bounds=self.bounds,
                grad_tol=self.grad_tol,
                step_tol=self.step_tol,
                max_iter=self.max_iter,
            )
        msgs = warn_all(sol.global_solution.messages + sol.messages, stacklevel=3)
        if sol.raw_log_temperatures is not None:
            self.raw_temperatures = torch.exp(sol.raw_log_temperatures)
            self.shrinkage_weights = sol.shrinkage_weights
            self.between_group_variance = sol.between_group_variance
        t_global = math.exp(sol.global_solution.log_temperature)
        self._store("log_temperature", sol.log_temperatures)
        self._store("log_temperature_global", math.log(t_global))
        self._mark_fitted()
        return GroupTemperatureFit(
            temperature=t_global,
            nll_before=sol.nll_before,
            nll_after=sol.nll_after,
            grad_norm=sol.grad_norm,
            iterations=sol.iterations,
            converged=sol.converged,
            warnings=msgs,
            passes=sol.passes,
            method="newton",
            temperatures=tuple(self.temperatures.tolist()),
        )
