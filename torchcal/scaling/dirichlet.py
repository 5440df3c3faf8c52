"""Dirichlet calibration (Kull et al., 2019): an affine map of log-probabilities, its strength
chosen on held-out folds by default (docs/design.md section 4)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from torchcal.functional import recalibration as R
from torchcal.functional.affine import AffineMap, matrix_map, vector_map
from torchcal.functional.cv import FoldSolver
from torchcal.scaling.affine import _AffineScaler, diagonal_start, resolve_strengths

__all__ = ["DirichletScaler"]

_VARIANTS = ("full", "diagonal", "fixed_diagonal")


class DirichletScaler(_AffineScaler):
    r"""Dirichlet calibration: ``forward(z) = log_softmax(z) @ weight.T + bias``.

    Kull et al. (2019, "Beyond temperature scaling: Obtaining well-calibrated multi-class
    probabilities with Dirichlet calibration") fit a multinomial logistic regression on the
    log-probabilities ``x = log_softmax(z)``. Variants:

    - ``"full"``: ``weight`` ``(C, C)``, ``bias`` ``(C,)``, with the ODIR penalty
      ``off_diagonal_reg / (C (C - 1)) * sum_{i != j} W_ij^2 + bias_reg / C * ||b||^2``
      (the diagonal is free);
    - ``"diagonal"``: ``x * weight + bias`` with ``weight`` ``(C,)``, penalised as
      :class:`VectorScaler` (``reg / C`` on the spread of ``weight`` about its mean and on
      ``bias``);
    - ``"fixed_diagonal"``: ``weight = a`` on every class, ``bias = 0``: the same
      probabilities as one temperature ``T = 1 / a`` (fitted by ``TemperatureScaler``'s
      solver; no penalty, no folds; ``reg`` must stay ``"cv"``).

    ``reg="cv"`` (the default) chooses one strength for every penalty term on ``folds``
    seeded, shuffled folds, with the temperature guard, exactly as :class:`MatrixScaler`
    (path ``C (C - 1) / N * 10**k``, ``k = 6, ..., -1``, for ``"full"``; ``C / N * 10**k``,
    ``k = 4, ..., -3``, for ``"diagonal"``; the result is a :class:`CVFit`); a number sets
    every term; ``off_diagonal_reg`` / ``bias_reg`` are the two ODIR strengths (``"full"``).

    Conventions against ``dirichletcal`` (the authors' package): its ``reg_lambda`` /
    ``reg_mu`` are raw by default (``reg_norm=False``); ours are normalised as in the paper
    (divided by ``C (C - 1)`` and ``C``: dirichletcal's ``reg_norm=True``). It takes
    probabilities and clips them before the log; we take logits and use ``log_softmax``
    (exact, no clipping). It fixes a reference row (``ref_row=True``: the last row of
    ``[W | b]`` is subtracted from every row before the penalty, so that row is 0); we
    penalise all ``C`` rows as they are (the penalty makes the optimum unique). The two
    agree where the penalty is 0; a strength ``r`` of ours is dirichletcal's ``reg_norm=True,
    ref_row=False`` at ``r``.

    Invariance: none guaranteed (argmax may change), except ``"fixed_diagonal"`` (a
    temperature keeps every argmax). ``-inf`` logits are masks: probability 0, nothing
    contributed to the other classes. ``forward`` before ``fit`` raises.

    State: ``weight`` (``(C, C)`` for ``"full"``, else ``(C,)``), ``bias`` ``(C,)`` (float64,
    finite on load), ``fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import DirichletScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(3000, 3, generator=g)
        >>> y = torch.multinomial(torch.softmax(z / 2 + torch.tensor([1.0, 0.0, -1.0]), 1), 1,
        ...                       generator=g).squeeze(1)
        >>> res = DirichletScaler(3).fit(z, y)
        >>> res.chosen, res.nll_after < res.nll_before
        ('map', True)
    """

    def __init__(
        self,
        num_classes: int,
        *,
        variant: str = "full",
        reg: str | float = "cv",
        off_diagonal_reg: float | None = None,
        bias_reg: float | None = None,
        folds: int = 5,
        seed: int = 0,
        grad_tol: float = 1e-10,
        max_iter: int = 500,
    ) -> None:
        super().__init__(num_classes, grad_tol, max_iter, folds, seed)
        if variant not in _VARIANTS:
            raise ValueError(f"variant: expected one of {_VARIANTS}, got {variant!r}")
        self.variant = variant
        C = self.num_classes
        full = variant == "full"
        if not full and (off_diagonal_reg is not None or (variant != "diagonal" and bias_reg)):
            raise ValueError(
                f"off_diagonal_reg: only the 'full' variant has off-diagonal weights "
                f"(variant={variant!r}); pass reg"
            )
        if variant == "fixed_diagonal":
            if reg != "cv":
                raise ValueError(
                    f"reg: the fixed_diagonal variant (one temperature) has no penalty, got {reg!r}"
                )
            self.reg, self.strengths = reg, ()
        elif full:
            self.reg, self.strengths = resolve_strengths(
                reg,
                {"off_diagonal_reg": off_diagonal_reg, "bias_reg": bias_reg},
                {"off_diagonal_reg": 0.0, "bias_reg": 0.0},
                2,
            )
        else:
            self.reg, self.strengths = resolve_strengths(
                reg, {"bias_reg": bias_reg}, {"bias_reg": 0.0}, 2
            )
        self._affine = R.matrix_affine if full else R.vector_affine  # type: ignore[assignment]
        self._hessian = R.matrix_nll_hessian if full else R.vector_nll_hessian  # type: ignore[assignment]
        self._path_top = 6.0 if full else 4.0
        w0 = torch.eye(C, dtype=torch.float64) if full else torch.ones(C, dtype=torch.float64)
        self.weight = nn.Parameter(w0)
        self.bias = nn.Parameter(torch.zeros(C, dtype=torch.float64))

    def _inputs(self, z: Tensor) -> Tensor:
        return torch.log_softmax(z, dim=1)

    def _make_map(self, strengths: tuple[float, ...]) -> AffineMap:
        make = matrix_map if self.variant == "full" else vector_map
        return make(self.num_classes, *(strengths or (0.0, 0.0)))

    def _path_scale(self, n: int) -> float:
        C = self.num_classes
        return C * (C - 1) / n if self.variant == "full" else C / n

    def _temperature_map(self, beta: float) -> tuple[Tensor, Tensor]:
        C = self.num_classes
        bias = torch.zeros(C, dtype=torch.float64)
        if self.variant == "full":
            return beta * torch.eye(C, dtype=torch.float64), bias
        return torch.full((C,), beta, dtype=torch.float64), bias

    def _fold_solver(self) -> FoldSolver | None:
        return None if self.variant == "full" else self._vector_fold_solver()

    def _path_start(
        self, z: Tensor, y: Tensor, mask: Tensor | None, beta: float, lam: float
    ) -> tuple[Tensor, Tensor]:
        if self.variant == "full":
            return diagonal_start(z, y, mask, beta, lam)
        return self._temperature_map(beta)
