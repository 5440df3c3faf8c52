"""One temperature per group (domain), shrunk toward the global temperature."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import torch
from torch import Tensor, nn

from torchcal.functional import temperature as obj
from torchcal.functional._validation import (
    check_finite,
    check_finite_value,
    check_group_index,
    check_int,
    check_temperature_bounds,
)
from torchcal.functional.shrinkage import empirical_bayes_shrinkage
from torchcal.scaling._base import (
    FittedMixin,
    GroupTemperatureFit,
    as_binary_vector,
    check_logits_target,
    check_state_finite,
    logits_as,
    warn_all,
    working_dtype,
)
from torchcal.scaling.temperature import TemperatureScaler

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
        return check_group_index("groups", groups, n, self.num_groups, device)

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
        binary = check_logits_target(logits, target)
        logits = logits.detach()
        target = target.detach().to(logits.device)
        if not binary:
            target = target.long()
        groups = self._check_groups(groups, logits.shape[0], logits.device)
        glob = TemperatureScaler(
            bounds=self.bounds,
            grad_tol=self.grad_tol,
            step_tol=self.step_tol,
            max_iter=self.max_iter,
            method="newton",
        )
        res_g = glob.fit(logits, target)
        num_classes = None if binary else logits.shape[1]
        eb = self.shrinkage == "empirical_bayes"
        with torch.inference_mode(False), torch.no_grad():
            chunks = obj.tensor_chunks(logits, target, groups)
            workers = obj.default_workers(logits)
            res = self._solve_groups(
                chunks,
                binary,
                num_classes,
                -math.log(glob.temperature),
                workers=workers,
                strength=0.0 if eb else float(self.shrinkage),
            )
            if eb:
                res = self._empirical_bayes(
                    res, chunks, binary, num_classes, -math.log(glob.temperature), workers
                )
        msgs = list(res_g.warnings)
        empty = torch.nonzero(res.stats[:, obj.COUNT] == 0).flatten().tolist()
        if empty:
            msgs.append(f"groups: no samples in group(s) {empty}; they use the global T")
        if not eb:  # shrunk groups leave no bound: a raw fit on a bound gets the global T
            msgs += obj.degenerate_messages(res, self.bounds, what="T_g")
        msgs_t = warn_all(msgs[len(res_g.warnings) :], stacklevel=3)
        self._store("log_temperature", -res.u)
        self._store("log_temperature_global", math.log(glob.temperature))
        self._mark_fitted()
        n = float(res.stats[:, obj.COUNT].sum())
        assert res.identity_stats is not None
        return GroupTemperatureFit(
            temperature=glob.temperature,
            nll_before=float(res.identity_stats.sum()) / n,
            nll_after=float(res.stats[:, obj.LOSS].sum()) / n,
            grad_norm=float(torch.linalg.vector_norm(res.grad)),
            iterations=res.iterations,
            converged=bool(res.converged.all()) and res_g.converged,
            warnings=tuple(res_g.warnings) + msgs_t,
            passes=res.passes + res_g.passes,
            method="newton",
            temperatures=tuple(self.temperatures.tolist()),
        )

    def _solve_groups(
        self,
        chunks: list[obj.Chunk],
        binary: bool,
        num_classes: int | None,
        u_global: float,
        *,
        workers: int,
        strength: float,
    ) -> obj.LogBetaResult:
        """The penalised per-group solve, all groups at once, from and toward ``u_global``
        (``log beta`` of the global T)."""
        G = self.num_groups
        center = torch.full((G,), u_global, dtype=torch.float64)

        def evaluate(u: Tensor, identity: bool) -> Tensor:
            return self._pass(chunks, binary, num_classes, u, identity, workers)

        lo, hi = obj.log_bounds(*self.bounds)
        return obj.solve_log_beta(
            evaluate,
            center.clone(),
            lower=lo,
            upper=hi,
            grad_tol=self.grad_tol,
            step_tol=self.step_tol,
            max_iter=self.max_iter,
            center=center,
            strength=strength,
            identity_first=True,
        )

    def _pass(
        self,
        chunks: list[obj.Chunk],
        binary: bool,
        num_classes: int | None,
        u: Tensor,
        identity: bool,
        workers: int,
    ) -> Tensor:
        stats = obj.temperature_pass(
            chunks,
            u,
            binary=binary,
            num_classes=num_classes,
            num_groups=self.num_groups,
            identity=identity,
            workers=workers,
            check_labels=False,
        )
        obj.check_stats(stats, lambda: chunks, binary)
        return stats

    def _empirical_bayes(
        self,
        raw: obj.LogBetaResult,
        chunks: list[obj.Chunk],
        binary: bool,
        num_classes: int | None,
        u_global: float,
        workers: int,
    ) -> obj.LogBetaResult:
        """Shrink the unpenalised per-group ``u = log beta`` toward ``u_global`` (see the
        class docstring); the result holds the sums at the shrunk ``u``."""
        _, _, curv = obj.u_derivatives(raw.stats, raw.u)  # summed NLL's d2/du2 per group
        informative = (raw.stats[:, obj.COUNT] > 0) & ~(raw.at_lower | raw.at_upper)
        info = torch.where(informative, curv.clamp(min=0.0), torch.zeros_like(curv))
        u, weights, tau2 = empirical_bayes_shrinkage(raw.u, info, u_global)
        stats = self._pass(chunks, binary, num_classes, u, False, workers)
        _, grad, curv_u = obj.u_derivatives(stats, u)
        self.raw_temperatures = torch.exp(-raw.u)
        self.shrinkage_weights = weights
        self.between_group_variance = float(tau2)
        no = torch.zeros_like(raw.converged)
        return obj.LogBetaResult(
            u=u,
            stats=stats,
            grad=grad,
            curv=curv_u,
            converged=raw.converged | raw.at_lower | raw.at_upper,
            at_lower=no,
            at_upper=no,
            iterations=raw.iterations,
            passes=raw.passes + 1,
            identity_stats=raw.identity_stats,
        )
