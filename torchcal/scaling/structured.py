"""Structured matrix scaling: one temperature plus a per-class scale and bias and a low-rank
correction, regularised toward the temperature map (docs/design.md section 4)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_class_target, check_finite, check_int
from torchcal.functional.structured import fit_structured_map, structured_logits
from torchcal.functional.temperature.chunks import Chunk
from torchcal.functional.temperature.validation import validate_masked_target
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
from torchcal.scaling.affine import CVFit, check_reg

__all__ = ["StructuredScaler"]


class StructuredScaler(FittedMixin):
    r"""Structured matrix scaling: a temperature plus a per-class scale, a per-class bias and
    a rank-``r`` correction of the log-probabilities, regularised toward the temperature map.

    On ``x = log_softmax(z / T0)``, ``forward(z) = x * scale + bias + (x @ basis) @ coef.T``
    (calibrated logits). This is the map of ``probmetrics``' SMS (Berta et al., 2026,
    "Structured matrix scaling for multi-class calibration": ``(I + Delta) x + b`` after a
    temperature, with the ridge ``lam (C/n) |diag Delta|^2 + lam (C/n) |b|^2 +
    lam (C(C-1)/n) |offdiag Delta|^2``) with ``Delta = diag(d) + coef @ basis.T`` restricted
    to the top ``r = min(rank, C)`` singular directions of the fitting rows' ``x`` (the full
    matrix when ``rank >= C``), and the temperature refitted jointly (``scale = a + d``,
    ``a`` unpenalised). See :mod:`torchcal.functional.structured` for the fit.

    ``reg="cv"`` (default) picks ``lam`` among powers of 4 by the held-out NLL on ``folds``
    seeded, shuffled folds (:func:`~torchcal.functional.folds.kfold_indices`), refits on all
    rows, and guards: if the chosen map's cross-validated NLL is not below the temperature
    map's on the same folds, the fit returns the temperature map (``fallback``, with a
    :class:`~torchcal.scaling.CalibrationWarning`). A number fixes ``lam`` (``1``: SMS's
    default; ``0``: unregularised). Deterministic for a ``seed``.

    Args:
        num_classes: ``C``.
        rank: the correction's rank ``r`` (capped at ``C``; ``0``: per-class scale and bias
            only, SMS's vector variant SVS).
        reg: ``"cv"`` or the ridge multiplier ``lam >= 0``.
        folds, seed: the cross-validation split (``seed`` also seeds the basis).
        grad_tol: max-abs preconditioned gradient of the refit on all rows (fold fits: 30x).
        max_iter: LBFGS iterations per fit.
        cv_rows: the most rows ``reg="cv"`` chooses the strength on (``None``: at least
            2,000, else ``2**21 // C``, e.g. 20,971 at ``C = 100``, 2,097 at ``C = 1,000``).
            With more rows, the strength and the guard are scored on the folds of a seeded
            subsample of that many rows (and ``T0`` fitted on it), then the map is refitted
            on all rows from the temperature map. The ridge is a fixed prior on the summed
            NLL (``lam C`` per unit of ``|d|^2``), so its best ``lam`` does not depend on
            ``n`` to first order, while the folds' cost grows as ``n C``.

    Invariance: none guaranteed (per-class terms can change the argmax). ``-inf`` logits are
    masks (fit and forward): a masked entry contributes nothing to the other classes and
    stays ``-inf`` (probability 0); the target class may not be masked.

    State: ``log_temperature`` ``()``, ``scale``, ``bias`` ``(C,)``, ``basis``, ``coef``
    ``(C, r)`` (float64 buffers, float64 under ``.to(dtype)``; finite on load), ``fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import StructuredScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(1500, 4, generator=g)
        >>> y = torch.multinomial(torch.softmax(z / 2 + torch.tensor([1.0, 0, 0, -1]), 1), 1,
        ...                       generator=g).squeeze(1)
        >>> res = StructuredScaler(4).fit(z, y)
        >>> res.chosen, res.nll_after < res.nll_before, min(res.cv_nll) < res.temperature_cv_nll
        ('map', True, True)
    """

    log_temperature: Tensor
    scale: Tensor
    bias: Tensor
    basis: Tensor
    coef: Tensor

    def __init__(
        self,
        num_classes: int,
        *,
        rank: int = 16,
        reg: float | str = "cv",
        folds: int = 5,
        seed: int = 0,
        grad_tol: float = 1e-4,
        max_iter: int = 200,
        cv_rows: int | None = None,
    ) -> None:
        super().__init__()
        self.num_classes = check_int("num_classes", num_classes, minimum=2)
        self.rank = min(check_int("rank", rank, minimum=0), self.num_classes)
        self.reg = check_reg(reg)
        self.folds = check_int("folds", folds, minimum=2)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed: expected an int, got {seed!r}")
        self.seed = seed
        if isinstance(grad_tol, bool) or not isinstance(grad_tol, (int, float)) or not grad_tol > 0:
            raise ValueError(f"grad_tol: expected a number > 0, got {grad_tol!r}")
        self.grad_tol = float(grad_tol)
        self.max_iter = check_int("max_iter", max_iter, minimum=1)
        self.cv_rows = None if cv_rows is None else check_int("cv_rows", cv_rows, minimum=folds)
        c, r, f64 = self.num_classes, self.rank, torch.float64
        self.register_buffer("log_temperature", torch.zeros((), dtype=f64))
        self.register_buffer("scale", torch.ones(c, dtype=f64))
        self.register_buffer("bias", torch.zeros(c, dtype=f64))
        self.register_buffer("basis", torch.eye(c, dtype=f64)[:, :r].contiguous())
        self.register_buffer("coef", torch.zeros(c, r, dtype=f64))
        self._init_fitted()

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        check_state_finite(state, prefix, "log_temperature", "scale", "bias", "basis", "coef")

    def _check_logits(self, logits: object) -> None:
        if (
            not isinstance(logits, Tensor)
            or not logits.is_floating_point()
            or logits.dim() != 2
            or logits.shape[1] != self.num_classes
        ):
            raise ValueError(
                f"logits: expected a floating-point tensor of shape (N, {self.num_classes})"
            )

    def forward(self, logits: Tensor) -> Tensor:
        """Calibrated logits ``(N, C)`` in the dtype of ``logits``; a ``-inf`` (masked) logit
        stays ``-inf`` (probability 0) and contributes nothing to the other classes."""
        self._check_fitted()
        self._check_logits(logits)
        check_finite("logits", logits, allow_neg_inf=True)
        work = working_dtype(logits)
        z = logits.to(work)
        mask = torch.isneginf(z)
        x = torch.log_softmax(z / torch.exp(self.log_temperature).to(work), dim=1)
        has_mask = bool(mask.any())
        if has_mask:
            x = x.masked_fill(mask, 0.0)

        def here(t: Tensor) -> Tensor:
            return t.to(device=logits.device, dtype=work)

        out = structured_logits(
            x,
            here(self.scale),
            here(self.bias),
            here(self.basis),
            here(self.coef),
            mask if has_mask else None,
        )
        return logits_as(out, logits.dtype, 1)

    def fit(self, logits: Tensor, target: Tensor) -> NLLFit:
        """Fit the map on multiclass logits ``(N, C)`` and class indices ``(N,)``: a
        :class:`~torchcal.scaling.CVFit` for ``reg="cv"`` (the strengths scored, their
        cross-validated and per-fold NLLs, one temperature's, ``fallback``), else an
        :class:`~torchcal.scaling.NLLFit`."""
        check_logits_target(logits, target, multiclass_only=True)
        if logits.shape[1] != self.num_classes:
            raise ValueError(
                f"logits: expected {self.num_classes} columns (num_classes), got "
                f"shape {tuple(logits.shape)}"
            )
        check_finite("logits", logits, allow_neg_inf=True)
        check_class_target("target", target, self.num_classes)
        if self.reg == "cv" and logits.shape[0] < self.folds:
            raise ValueError(
                f"logits: expected at least folds = {self.folds} rows for reg='cv', got "
                f"{logits.shape[0]}"
            )
        warn_if_probabilities(logits)
        if bool(torch.isneginf(logits).any()):
            validate_masked_target(Chunk(logits.detach(), target.detach().long()))
        with torch.inference_mode(False), torch.no_grad():
            sol = fit_structured_map(
                logits,
                target,
                rank=self.rank,
                reg=self.reg,
                folds=self.folds,
                seed=self.seed,
                grad_tol=self.grad_tol,
                max_iter=self.max_iter,
                cv_rows=self.cv_rows,
            )
        self._store("log_temperature", math.log(sol.temperature))
        for name in ("scale", "bias", "basis", "coef"):
            self._store(name, getattr(sol, name).to(self.scale.device))
        self._mark_fitted()
        common: dict[str, Any] = dict(
            nll_before=sol.nll_before,
            nll_after=sol.nll_after,
            grad_norm=sol.grad_norm,
            iterations=sol.iterations,
            warnings=warn_all(sol.messages),
            passes=sol.passes,
        )
        choice = sol.choice
        if choice is None:
            return NLLFit(converged=not sol.messages, method="lbfgs", **common)
        return CVFit(
            converged=sol.fell_back or not sol.messages,
            method="temperature" if sol.fell_back else "lbfgs",
            reg=None if sol.fell_back else sol.strength,
            strengths=choice.strengths,
            cv_nll=choice.cv_nll,
            fold_nll=choice.fold_nll,
            temperature_cv_nll=choice.temperature_cv_nll,
            temperature_fold_nll=choice.temperature_fold_nll,
            chosen="temperature" if sol.fell_back else "map",
            fallback=sol.fell_back,
            temperature=sol.temperature if sol.fell_back else None,
            folds=self.folds,
            seed=self.seed,
            **common,
        )
