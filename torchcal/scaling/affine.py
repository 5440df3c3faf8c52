"""Vector and matrix scaling: per-class affine maps of multiclass logits, their strength
chosen on held-out folds by default (docs/design.md section 4)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from torchcal.functional import recalibration as R
from torchcal.functional._checks import check_class_target, check_finite, check_int
from torchcal.functional._validation import check_finite_value
from torchcal.functional.affine import (
    NEWTON_MAX_PARAMS,
    AffineMap,
    AffineSolution,
    Objective,
    affine_inputs,
    affine_nll_hessian,
    affine_objective,
    fit_affine,
    matrix_map,
    minimise,
    vector_map,
)
from torchcal.functional.cv import (
    FOLD_GRAD_TOL,
    FOLD_NEWTON_MAX,
    FoldSolver,
    cross_validate_path,
    strength_path,
)
from torchcal.functional.temperature.fit import fit_temperature
from torchcal.functional.vector_folds import NEWTON_MAX as VECTOR_NEWTON_MAX
from torchcal.functional.vector_folds import VectorFold
from torchcal.scaling._base import (
    FittedMixin,
    NLLFit,
    check_logits_target,
    check_state_finite,
    logits_as,
    warn_all,
    warn_if_probabilities,
    working_dtype,
)

__all__ = ["CVFit", "VectorScaler", "MatrixScaler"]


@dataclass(frozen=True, kw_only=True)
class CVFit(NLLFit):
    """What the fit of a map with a cross-validated strength (``reg="cv"``) did.

    Attributes:
        reg: the chosen strength (the refit's), or ``None`` where the guard fell back.
        strengths: the strengths scored, strongest first (the walk stops at the first
            strength that lowers the best by no more than ``1e-4``).
        cv_nll: per strength, the held-out NLL summed over the folds, per row.
        fold_nll: per strength, each fold's held-out mean NLL.
        temperature_cv_nll, temperature_fold_nll: the same for one temperature fitted on the
            same folds.
        chosen: ``"map"``, or ``"temperature"`` where the map's best ``cv_nll`` is not below
            ``temperature_cv_nll`` (the guard: the parameters are then the temperature map's,
            weight ``1 / T`` on the diagonal, bias 0, with a :class:`CalibrationWarning`).
        fallback: ``chosen == "temperature"``; ``temperature``: the fallback's ``T``
            (``None`` otherwise).
        folds, seed: the shared split (:func:`torchcal.functional.folds.kfold_indices`).
        nll_before, nll_after, grad_norm, iterations, ...: those of the refit on all rows
            (of the temperature fit where it fell back; see :class:`NLLFit`).

    Example:
        >>> import torch
        >>> from torchcal.scaling import VectorScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(2000, 3, generator=g)
        >>> y = torch.multinomial(torch.softmax(z / 2 + torch.tensor([1.0, 0.0, -1.0]), 1), 1,
        ...                       generator=g).squeeze(1)
        >>> res = VectorScaler(3).fit(z, y)
        >>> res.chosen, min(res.cv_nll) < res.temperature_cv_nll
        ('map', True)
    """

    deprecated_aliases: ClassVar[dict[str, object]] = {"temperatures": None}

    reg: float | None
    strengths: tuple[float, ...]
    cv_nll: tuple[float, ...]
    fold_nll: tuple[tuple[float, ...], ...]
    temperature_cv_nll: float
    temperature_fold_nll: tuple[float, ...]
    chosen: str
    fallback: bool
    temperature: float | None
    folds: int
    seed: int


def check_reg(reg: object) -> str | float:
    """``reg``: ``"cv"`` or a finite number ``>= 0``."""
    if isinstance(reg, str):
        if reg != "cv":
            raise ValueError(f'reg: expected "cv" or a finite number >= 0, got {reg!r}')
        return reg
    if isinstance(reg, bool) or not isinstance(reg, (int, float)):
        raise ValueError(f'reg: expected "cv" or a finite number >= 0, got {reg!r}')
    return check_finite_value("reg", float(reg))


def resolve_strengths(
    reg: object, legacy: dict[str, float | None], defaults: dict[str, float], terms: int
) -> tuple[str | float, tuple[float, ...] | None]:
    """``(reg, strengths)``: ``strengths`` ``None`` under ``reg="cv"``; a number sets every
    penalty term; the older per-term keywords (``legacy``, ``None`` where not given) set the
    map's old penalty (the others at their old ``defaults``) and exclude ``reg``."""
    reg = check_reg(reg)
    given = {k: v for k, v in legacy.items() if v is not None}
    if given:
        if reg != "cv":
            raise ValueError(
                f"reg: pass either reg or {' / '.join(legacy)}, not both (got reg={reg!r})"
            )
        values = {k: check_finite_value(k, v) for k, v in given.items()}
        full = [values.get(k, defaults[k]) for k in defaults]
        return reg, tuple([0.0] * (terms - len(full)) + full)
    if reg == "cv":
        return reg, None
    return reg, (float(reg),) * terms


def check_folds(folds: object) -> int:
    return check_int("folds", folds, minimum=2)


class _AffineScaler(FittedMixin):
    """Shared fit: float64, full batch, on a convex objective (Newton or LBFGS); the
    strength by cross-validation under ``reg="cv"`` (docs/design.md section 4)."""

    weight: nn.Parameter
    bias: nn.Parameter
    # the map's penalty strengths (None: cross-validated) and the (weight, bias) of the
    # temperature map softmax(beta * z), set by the subclasses
    strengths: tuple[float, ...] | None
    reg: str | float

    def __init__(
        self, num_classes: int, grad_tol: float, max_iter: int, folds: int, seed: int
    ) -> None:
        super().__init__()
        self.num_classes = check_int("num_classes", num_classes, minimum=2)
        self.grad_tol = float(grad_tol)
        self.max_iter = check_int("max_iter", max_iter, minimum=1)
        self.folds = check_folds(folds)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed: expected an int, got {seed!r}")
        self.seed = seed
        self.chosen_reg: float | None = None  # the last CV fit's strength (not state)
        self._init_fitted()

    # the map and its NLL Hessian from (z, p): functions of torchcal.functional.recalibration
    _affine: Callable[[Tensor, Tensor, Tensor], Tensor]
    _hessian: Callable[[Tensor, Tensor], Tensor]

    def _make_map(self, strengths: tuple[float, ...]) -> AffineMap:
        raise NotImplementedError

    _path_top = 6.0  # the path: _path_scale(N) * 10**k, k = _path_top, ..., _path_top - 7

    def _path_scale(self, n: int) -> float:
        raise NotImplementedError

    def _temperature_map(self, beta: float) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _inputs(self, z: Tensor) -> Tensor:
        """The map's input from the logits (identity; Dirichlet: ``log_softmax``)."""
        return z

    def _identity(self) -> tuple[Tensor, Tensor]:
        return self._temperature_map(1.0)

    def _penalty(self, weight: Tensor, bias: Tensor) -> Tensor:
        return self._map().penalty(weight, bias)

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        check_state_finite(state, prefix, "weight", "bias")

    def _map(self) -> AffineMap:
        if self.strengths is None:  # reg="cv": the last fit's chosen strength (0 before)
            return self._make_map(self._tied(self.chosen_reg or 0.0))
        return self._make_map(self.strengths)

    def forward(self, logits: Tensor) -> Tensor:
        """Calibrated logits ``(N, C)`` in the dtype of ``logits``; a ``-inf`` (masked) logit
        stays ``-inf`` (probability 0) and contributes nothing to the other classes."""
        self._check_fitted()
        if (
            not isinstance(logits, Tensor)
            or not logits.is_floating_point()
            or logits.dim() != 2
            or logits.shape[1] != self.num_classes
        ):
            raise ValueError(
                f"logits: expected a floating-point tensor of shape (N, {self.num_classes})"
            )
        check_finite("logits", logits, allow_neg_inf=True)
        work = working_dtype(logits)
        w = self.weight.to(device=logits.device, dtype=work)
        b = self.bias.to(device=logits.device, dtype=work)
        z = self._inputs(logits.to(work))
        mask = torch.isneginf(z)
        if not bool(mask.any()):
            return logits_as(self._affine(z, w, b), logits.dtype, 1)
        out = R.masked_affine(self._affine(z.masked_fill(mask, 0.0), w, b), mask)
        return logits_as(out, logits.dtype, 1)

    def objective(
        self,
        logits: Tensor,
        target: Tensor,
        weight: Tensor,
        bias: Tensor,
        mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(mean NLL + penalty, mean NLL)`` at the given parameters (float64) of the map's
        inputs (the logits; Dirichlet: their ``log_softmax``); with ``mask``, ``logits``
        holds 0 at the masked entries (see :meth:`forward`). Under ``reg="cv"`` the penalty
        is at the last fit's chosen strength (none before a fit, or after a fallback)."""
        return affine_objective(self._map(), logits, target, weight, bias, mask)

    def _nll_hessian(
        self, z: Tensor, weight: Tensor, bias: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        return affine_nll_hessian(
            AffineMap(self._affine, self._hessian, lambda w, b: w.sum() * 0), z, weight, bias, mask
        )

    def _check_fit_inputs(self, logits: Tensor, target: Tensor) -> None:
        check_logits_target(logits, target, multiclass_only=True)
        if logits.shape[1] != self.num_classes:
            raise ValueError(
                f"logits: expected {self.num_classes} columns (num_classes), got "
                f"shape {tuple(logits.shape)}"
            )
        check_finite("logits", logits, allow_neg_inf=True)
        check_class_target("target", target, self.num_classes)
        warn_if_probabilities(logits)
        if self.strengths is None and self.folds > logits.shape[0]:
            raise ValueError(
                f"folds: expected at most N = {logits.shape[0]} folds (one row each), "
                f"got {self.folds}"
            )

    def fit(self, logits: Tensor, target: Tensor) -> NLLFit:
        """Fit the weights and biases on multiclass logits ``(N, C)`` and class indices;
        under ``reg="cv"`` the strength by cross-validation, with the temperature guard
        (a :class:`CVFit`)."""
        self._check_fit_inputs(logits, target)
        x = self._inputs(logits.detach().to(torch.float64))
        with torch.inference_mode(False), torch.no_grad():
            if self.strengths == ():  # no penalised term: one temperature on the inputs
                t = fit_temperature(x, target)
                self._set(*self._temperature_map(math.exp(-t.log_temperature)))
                return NLLFit.of(t, t.method)
            if self.strengths is not None:
                sol = self._solve(x, target, self._make_map(self.strengths), self._identity())
                self._set(sol.weight, sol.bias)
                return NLLFit.of(sol, sol.method)
            res = self._fit_cv(x, target)
            self.chosen_reg = res.reg
            return res

    def _solve(
        self, x: Tensor, target: Tensor, m: AffineMap, start: tuple[Tensor, Tensor]
    ) -> AffineSolution:
        return fit_affine(
            x,
            target,
            m,
            *start,
            grad_tol=self.grad_tol,
            max_iter=self.max_iter,
            name=type(self).__name__,
        )

    def _set(self, weight: Tensor, bias: Tensor) -> None:
        self._store("weight", weight)
        self._store("bias", bias)
        self._mark_fitted()

    def _fit_cv(self, x: Tensor, target: Tensor) -> CVFit:
        z, y, mask = affine_inputs(x, target)
        n, name = z.shape[0], type(self).__name__
        path = cross_validate_path(
            z,
            y,
            mask,
            lambda lam: self._make_map(self._tied(lam)),
            self._path_start,
            strength_path(self._path_scale(n), top=self._path_top),
            folds=self.folds,
            seed=self.seed,
            max_iter=self.max_iter,
            newton_max=FOLD_NEWTON_MAX,
            fold_solver=self._fold_solver(),
        )
        best = path.cv_nll[path.best]
        common: dict[str, Any] = dict(
            strengths=path.strengths,
            cv_nll=path.cv_nll,
            fold_nll=path.fold_nll,
            temperature_cv_nll=path.temperature_cv_nll,
            temperature_fold_nll=path.temperature_fold_nll,
            folds=self.folds,
            seed=self.seed,
        )
        if best < path.temperature_cv_nll:
            lam = path.strengths[path.best]
            sol = self._solve(x, target, self._make_map(self._tied(lam)), path.start)
            self._set(sol.weight, sol.bias)
            return CVFit(
                nll_before=sol.nll_before,
                nll_after=sol.nll_after,
                grad_norm=sol.grad_norm,
                iterations=sol.iterations,
                converged=not sol.messages,
                warnings=warn_all(sol.messages, stacklevel=4),
                passes=sol.passes,
                method=sol.method,
                reg=lam,
                chosen="map",
                fallback=False,
                temperature=None,
                **common,
            )
        zt = z if mask is None else z.masked_fill(mask, -math.inf)
        t = fit_temperature(zt, y)  # TemperatureScaler's fit: the same T and messages
        beta = math.exp(-t.log_temperature)
        self._set(*self._temperature_map(beta))
        msg = (
            f"{name}: the cross-validated NLL of the map ({best:.6g}, strength "
            f"{path.strengths[path.best]:.3g}) is not below one temperature's "
            f"({path.temperature_cv_nll:.6g}) on {self.folds} folds: fitted the temperature "
            f"map instead (T = {1 / beta:.6g}); TemperatureScaler is the better map here"
        )
        return CVFit(
            nll_before=t.nll_before,
            nll_after=t.nll_after,
            grad_norm=t.grad_norm,
            iterations=t.iterations,
            converged=t.converged,
            warnings=warn_all([msg, *t.messages], stacklevel=4),
            passes=t.passes,
            method=t.method,
            reg=None,
            chosen="temperature",
            fallback=True,
            temperature=1 / beta,
            **common,
        )

    def _path_start(
        self, z: Tensor, y: Tensor, mask: Tensor | None, beta: float, lam: float
    ) -> tuple[Tensor, Tensor]:
        """A fold's first fit starts from its temperature map (the matrix maps: from their
        diagonal's fit)."""
        return self._temperature_map(beta)

    def _fold_solver(self) -> FoldSolver | None:
        """The map's own fold fit (``None``: :func:`cross_validate_path`'s LBFGS / Newton)."""
        return None

    def _vector_fold_solver(self) -> FoldSolver | None:
        """The vector map's fold fit: damped Newton with the exact Hessian, float32 passes
        (``functional/vector_folds``), up to ``C = 256`` classes (else ``None``)."""
        if 2 * self.num_classes > VECTOR_NEWTON_MAX:
            return None
        max_iter = self.max_iter

        def make(z: Tensor, y: Tensor, mask: Tensor | None) -> Callable[[Tensor, float], Tensor]:
            fold = VectorFold(z, y, mask)
            return lambda x0, lam: fold.solve(x0, lam, lam, FOLD_GRAD_TOL, max_iter)

        return make

    def _tied(self, lam: float) -> tuple[float, ...]:
        """Every penalty term at the path's strength ``lam``."""
        return (lam, lam)


class VectorScaler(_AffineScaler):
    r"""Vector scaling: ``forward(z) = z * weight + bias`` with one scale and bias per class.

    Guo et al. (2017, "On Calibration of Modern Neural Networks") fit ``weight, bias in R^C``
    by minimising the NLL; we add the L2 penalty

        weight_reg / C * ||weight - mean(weight)||^2 + bias_reg / C * ||bias||^2,

    which shrinks the map toward one temperature (equal scales, no bias). ``reg="cv"`` (the
    default) sets both strengths to one value chosen on ``folds`` seeded, shuffled folds
    (:func:`~torchcal.functional.cv.cross_validate_path`: the strengths
    ``C / N * 10**k``, ``k = 4, 3, ..., -3``, scored strongest first, warm-started; the
    lowest fold-summed held-out NLL wins and is refitted on all rows) and falls back to one
    temperature, with a :class:`CalibrationWarning`, where one temperature fitted on the same
    folds scores no worse (the result, a :class:`CVFit`, says which and holds the fold NLLs).
    A number ``reg`` sets both strengths; ``bias_reg`` alone is the older penalty (bias only,
    no ``reg``). The objective is convex; it is minimised in float64, full batch, to
    ``grad_tol`` (max-abs gradient): by Newton's method with the exact Hessian and
    backtracking while there are at most 256 parameters, else by diagonally preconditioned
    LBFGS with closed-form gradients (the fold fits: to ``1e-6``, up to ``C = 256`` by damped
    Newton with the exact Hessian on float32 passes, :mod:`torchcal.functional.vector_folds`;
    LBFGS beyond).

    Invariance: none guaranteed -- per-class scales and biases can change the argmax (and the
    accuracy). ``-inf`` logits are masks (fit and forward): a masked entry stays ``-inf``
    (probability 0), whatever the sign of its weight. ``forward`` before ``fit`` raises.

    State: ``weight`` ``(C,)``, ``bias`` ``(C,)`` (float64 parameters, float64 under
    ``.to(dtype)``; finite on load), ``fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import VectorScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(3000, 3, generator=g)
        >>> y = torch.multinomial(torch.softmax(z / 2 + torch.tensor([0.5, 0.0, -0.5]), 1), 1,
        ...                       generator=g).squeeze(1)
        >>> res = VectorScaler(3, reg=0.0).fit(z, y)
        >>> res.converged, res.grad_norm <= 1e-8, res.nll_after < res.nll_before
        (True, True, True)
    """

    _affine = staticmethod(R.vector_affine)
    _hessian = staticmethod(R.vector_nll_hessian)

    def __init__(
        self,
        num_classes: int,
        *,
        reg: str | float = "cv",
        bias_reg: float | None = None,
        folds: int = 5,
        seed: int = 0,
        grad_tol: float = 1e-10,
        max_iter: int = 500,
    ) -> None:
        super().__init__(num_classes, grad_tol, max_iter, folds, seed)
        self.reg, self.strengths = resolve_strengths(
            reg, {"bias_reg": bias_reg}, {"bias_reg": 0.0}, 2
        )
        self.weight = nn.Parameter(torch.ones(num_classes, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(num_classes, dtype=torch.float64))

    def _make_map(self, strengths: tuple[float, ...]) -> AffineMap:
        return vector_map(self.num_classes, *strengths)

    _path_top = 4.0

    def _path_scale(self, n: int) -> float:
        return self.num_classes / n

    def _fold_solver(self) -> FoldSolver | None:
        return self._vector_fold_solver()

    def _temperature_map(self, beta: float) -> tuple[Tensor, Tensor]:
        C = self.num_classes
        return torch.full((C,), beta, dtype=torch.float64), torch.zeros(C, dtype=torch.float64)


class MatrixScaler(_AffineScaler):
    r"""Matrix scaling: ``forward(z) = z @ weight.T + bias`` with a full ``C x C`` matrix.

    Fit by minimising the NLL plus the ODIR penalty of Kull et al. (2019, "Beyond temperature
    scaling: Obtaining well-calibrated multi-class probabilities with Dirichlet calibration"):

        off_diagonal_reg / (C (C - 1)) * sum_{i != j} W_ij^2 + bias_reg / C * sum_j b_j^2,

    which keeps the map near a per-class scaling (``C^2`` free parameters overfit easily).
    ``reg="cv"`` (the default) sets both strengths to one value chosen on ``folds`` seeded,
    shuffled folds, on the path ``C (C - 1) / N * 10**k``, ``k = 6, ..., -1``, with the
    temperature guard (as :class:`VectorScaler`; the result is a :class:`CVFit`); a number
    ``reg`` sets both; ``off_diagonal_reg`` / ``bias_reg`` are the older keywords (each
    ``1e-2`` where the other is given; no ``reg`` with them). Convex; minimised in float64
    as :class:`VectorScaler` (Newton up to 256 parameters, i.e. ``C <= 15``, diagonally
    preconditioned LBFGS with closed-form gradients beyond).

    Invariance: none guaranteed (argmax may change). ``-inf`` logits are masks (fit and
    forward): a masked entry contributes nothing to the other classes (it enters the product
    as 0) and its own output stays ``-inf`` (probability 0). ``forward`` before ``fit`` raises.

    State: ``weight`` ``(C, C)``, ``bias`` ``(C,)`` (float64 parameters, float64 under
    ``.to(dtype)``; finite on load), ``fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import MatrixScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(3000, 3, generator=g)
        >>> y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
        >>> res = MatrixScaler(3, reg=1e-2).fit(z, y)
        >>> res.converged, res.nll_after < res.nll_before
        (True, True)
    """

    _affine = staticmethod(R.matrix_affine)
    _hessian = staticmethod(R.matrix_nll_hessian)

    def __init__(
        self,
        num_classes: int,
        *,
        reg: str | float = "cv",
        off_diagonal_reg: float | None = None,
        bias_reg: float | None = None,
        folds: int = 5,
        seed: int = 0,
        grad_tol: float = 1e-10,
        max_iter: int = 500,
    ) -> None:
        super().__init__(num_classes, grad_tol, max_iter, folds, seed)
        self.reg, self.strengths = resolve_strengths(
            reg,
            {"off_diagonal_reg": off_diagonal_reg, "bias_reg": bias_reg},
            {"off_diagonal_reg": 1e-2, "bias_reg": 1e-2},
            2,
        )
        self.weight = nn.Parameter(torch.eye(num_classes, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(num_classes, dtype=torch.float64))

    def _make_map(self, strengths: tuple[float, ...]) -> AffineMap:
        return matrix_map(self.num_classes, *strengths)

    def _path_scale(self, n: int) -> float:
        return self.num_classes * (self.num_classes - 1) / n

    def _temperature_map(self, beta: float) -> tuple[Tensor, Tensor]:
        C = self.num_classes
        eye = torch.eye(C, dtype=torch.float64)
        return beta * eye, torch.zeros(C, dtype=torch.float64)

    def _path_start(
        self, z: Tensor, y: Tensor, mask: Tensor | None, beta: float, lam: float
    ) -> tuple[Tensor, Tensor]:
        return diagonal_start(z, y, mask, beta, lam)


def diagonal_start(
    z: Tensor, y: Tensor, mask: Tensor | None, beta: float, lam: float
) -> tuple[Tensor, Tensor]:
    """The matrix map's start at the strongest strength ``lam``: the fit of its diagonal and
    bias alone (the vector map, bias penalty ``lam / C``; Newton up to 256 parameters, else LBFGS, from
    the temperature map), as
    ``(diag(w), b)``: the off-diagonal entries, penalised hardest there, stay near 0, and
    the full fit takes a few LBFGS steps instead of a hundred."""
    C = z.shape[1]
    obj = Objective(vector_map(C, 0.0, lam), z, y, mask, torch.Size([C]))
    x0 = torch.cat([torch.full((C,), beta, dtype=torch.float64), torch.zeros(C).double()])
    with torch.enable_grad():
        x = minimise(obj, x0, FOLD_GRAD_TOL, 500, NEWTON_MAX_PARAMS)[0]
    return torch.diag(x[:C]), x[C:]
