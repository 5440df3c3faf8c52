"""Segment repair (multicalibration): per-segment logit offsets and slopes on top of a base
map, shrunk toward the global map, never worse than the base on held-out NLL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_binary_target, check_finite, check_int
from torchcal.functional.multicalibration import (
    SegmentSpec,
    apply_segments,
    check_segment_options,
    columns_from_features,
    segment_spec,
)
from torchcal.functional.segment_fit import fit_segment_map, segment_logits
from torchcal.scaling._base import (
    FittedMixin,
    NLLFit,
    as_binary_vector,
    check_logits_target,
    warn_all,
    warn_if_probabilities,
)

__all__ = ["SegmentCalibrator", "SegmentFit"]

_KINDS = ("code", "values", "edges")


@dataclass(frozen=True, kw_only=True)
class SegmentFit(NLLFit):
    """What :meth:`SegmentCalibrator.fit` did (see :class:`~torchcal.scaling.NLLFit`).

    Attributes:
        reg: the ridge strength used (``inf``: the global map alone; ``nan``: the base kept).
        cv_nll: the cross-validated mean NLL of each strength of the path
            (:data:`torchcal.functional.segment_fit.REG_PATH`; empty for a fixed ``reg``).
        cv_nll_base: the base logits' mean NLL (the same on every fold: they are not fitted).
        fallback: the guard kept the base logits (no strength beat them held out).
        segments: the number of segments of the map (the whole data set not counted).
    """

    reg: float
    cv_nll: tuple[float, ...]
    cv_nll_base: float
    fallback: bool
    segments: int


class SegmentCalibrator(FittedMixin):
    r"""A binary logit map with an offset and a slope per segment, shrunk toward one global
    slope and offset:

        z' = (a + \sum_s v_s [x in s]) z + b + \sum_s u_s [x in s],

    over every cross of up to ``depth`` of the segment ``columns`` (the segments of
    :func:`~torchcal.functional.segment_masks`: categorical codes as they are, numeric columns
    in ``bins`` quantile buckets whose edges are fixed at fit), each with at least
    ``min_rows`` fitting rows. ``z`` is the *base map's* logit: fit the temperature (or any
    calibrator) first and pass its output; this map repairs what a global fix leaves in the
    segments (Guy et al. 2025's multicalibration).

    The ridge penalty ``reg / 2 (|u|^2 + |v|^2)`` on the mean NLL shrinks the segment terms
    toward the global map; ``reg="cv"`` (the default) picks it from a warm-started path on
    ``folds`` seeded, shuffled folds, the global map alone (``reg = inf``) included. **Guard:**
    unless the chosen map's cross-validated NLL is below the base logits', the fit keeps the
    base logits (``a = 1``, the rest 0), says so (``SegmentFit.fallback``) and issues a
    :class:`~torchcal.scaling.CalibrationWarning`. The objective is convex: damped Newton with
    the exact Hessian in float64, the rows grouped by their segment memberships (its cost
    grows with the distinct membership patterns, not the rows).

    State: ``slope``, ``intercept`` (0-dim), ``slopes``, ``offsets`` ``(S,)``, the segment
    definitions (``cells`` ``(S, F)``, ``kinds``, ``cuts``, ``cut_sizes``), all tensors,
    resized and checked on load, and ``fitted``; round-trips under
    ``torch.load(weights_only=True)`` into a calibrator built with the same ``columns``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import SegmentCalibrator
        >>> g = torch.Generator().manual_seed(0)
        >>> z = torch.randn(6000, generator=g, dtype=torch.float64)
        >>> lang = torch.randint(0, 3, (6000,), generator=g)
        >>> y = torch.bernoulli(torch.sigmoid(z + 0.8 * (lang == 2)), generator=g)
        >>> cal = SegmentCalibrator(["lang"], depth=1, min_rows=100)
        >>> res = cal.fit(z, y, lang[:, None])
        >>> res.fallback, res.nll_after < res.nll_before, cal(z, lang[:, None]).shape
        (False, True, torch.Size([6000]))
    """

    slope: Tensor
    intercept: Tensor
    slopes: Tensor
    offsets: Tensor
    cells: Tensor
    kinds: Tensor
    cuts: Tensor
    cut_sizes: Tensor

    def __init__(
        self,
        columns: Sequence[str],
        *,
        numeric: Sequence[str] = (),
        depth: int = 2,
        min_rows: int = 200,
        bins: int = 4,
        reg: float | str = "cv",
        folds: int = 5,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.columns, self.numeric, self.depth, self.min_rows, self.bins = check_segment_options(
            columns, numeric, depth, min_rows, bins
        )
        if reg != "cv" and (
            isinstance(reg, (bool, str)) or not isinstance(reg, (int, float)) or not reg >= 0
        ):
            raise ValueError(f"reg: expected 'cv' or a strength >= 0 (inf allowed), got {reg!r}")
        self.reg = reg
        self.folds = check_int("folds", folds, minimum=2)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
        self.seed = seed
        f64 = torch.float64
        self.register_buffer("slope", torch.ones((), dtype=f64))
        self.register_buffer("intercept", torch.zeros((), dtype=f64))
        self.register_buffer("slopes", torch.zeros(0, dtype=f64))
        self.register_buffer("offsets", torch.zeros(0, dtype=f64))
        self.register_buffer("cells", torch.zeros(0, len(columns), dtype=torch.int64))
        self.register_buffer("kinds", torch.zeros(len(columns), dtype=torch.int64))
        self.register_buffer("cuts", torch.zeros(len(columns), 0, dtype=f64))
        self.register_buffer("cut_sizes", torch.zeros(len(columns), dtype=torch.int64))
        self._init_fitted()

    _RESIZED = ("slopes", "offsets", "cells", "cuts")

    def _load_from_state_dict(
        self, state_dict: Mapping[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        for name in self._RESIZED:
            value = state_dict.get(prefix + name)
            mine = getattr(self, name)
            if isinstance(value, Tensor) and value.dim() == mine.dim():
                setattr(self, name, torch.empty_like(value, dtype=mine.dtype, device=mine.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        f = len(self.columns)
        for name in ("slope", "intercept", "slopes", "offsets", "cuts"):
            t = state.get(name)
            if t is not None and not bool(torch.isfinite(t.double()).all()):
                raise ValueError(f"{prefix}{name}: expected finite values in the loaded state")
        cells, slopes, offsets = state.get("cells"), state.get("slopes"), state.get("offsets")
        if cells is not None and (cells.dim() != 2 or cells.shape[1] != f):
            raise ValueError(f"{prefix}cells: expected shape (S, {f}), got {tuple(cells.shape)}")
        if cells is not None and slopes is not None and offsets is not None:
            if not (slopes.shape == offsets.shape == (cells.shape[0],)):
                raise ValueError(
                    f"{prefix}offsets: expected the shape ({cells.shape[0]},) of cells' "
                    f"segments, got slopes {tuple(slopes.shape)}, offsets {tuple(offsets.shape)}"
                )
        kinds, sizes, cuts = state.get("kinds"), state.get("cut_sizes"), state.get("cuts")
        if kinds is not None and not bool(((kinds >= 0) & (kinds < len(_KINDS))).all()):
            raise ValueError(f"{prefix}kinds: expected codes 0..{len(_KINDS) - 1}")
        if sizes is not None and cuts is not None and bool((sizes > cuts.shape[-1]).any()):
            raise ValueError(f"{prefix}cut_sizes: larger than cuts' {cuts.shape[-1]} columns")

    def _spec(self) -> SegmentSpec:
        return SegmentSpec(
            self.columns,
            tuple(_KINDS[int(k)] for k in self.kinds),
            tuple(
                self.cuts[j, : int(self.cut_sizes[j])].contiguous()
                for j in range(len(self.columns))
            ),
            self.cells,
        )

    def _store_spec(self, spec: SegmentSpec) -> None:
        width = max([c.numel() for c in spec.cuts] + [0])
        cuts = torch.zeros(len(self.columns), width, dtype=torch.float64)
        for j, c in enumerate(spec.cuts):
            cuts[j, : c.numel()] = c
        self.cells = spec.cells[1:].clone()  # the whole data set is the global map
        self.kinds = torch.tensor([_KINDS.index(k) for k in spec.kinds], dtype=torch.int64)
        self.cuts = cuts
        self.cut_sizes = torch.tensor([c.numel() for c in spec.cuts], dtype=torch.int64)

    def _binary(self, logits: Tensor, what: str) -> Tensor:
        if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() != 1:
            raise ValueError(f"logits: expected a floating-point tensor of shape (N,) {what}")
        check_finite("logits", logits)
        return logits

    def fit(self, logits: Tensor, target: Tensor, features: Tensor) -> SegmentFit:
        """Fit on the base map's binary logits ``(N,)`` (or ``(N, 1)``), labels in {0, 1} and
        the segment columns ``features`` ``(N, len(columns))`` (integer codes; numeric
        columns as values)."""
        logits, target, _ = as_binary_vector(logits, target)
        check_logits_target(logits, target, binary_only=True)
        self._binary(logits, "(binary logits of the base map)")
        check_binary_target("target", target)
        warn_if_probabilities(logits)
        cols = columns_from_features(features, self.columns, self.numeric)
        if features.shape[0] != logits.shape[0]:
            raise ValueError(
                f"features: expected {logits.shape[0]} rows (one per logit), got {features.shape[0]}"
            )
        with torch.inference_mode(False), torch.no_grad():
            spec = segment_spec(cols, depth=self.depth, min_rows=self.min_rows, bins=self.bins)
            masks = apply_segments(spec, cols)[1:]
            sol = fit_segment_map(
                logits, target, masks, reg=self.reg, folds=self.folds, seed=self.seed
            )
        self._store_spec(spec)
        self.slope, self.intercept = sol.slope.clone(), sol.intercept.clone()
        self.slopes, self.offsets = sol.slopes.clone(), sol.offsets.clone()
        self._mark_fitted()
        return SegmentFit(
            nll_before=sol.nll_before,
            nll_after=sol.nll_after,
            grad_norm=sol.grad_norm,
            iterations=sol.iterations,
            converged=not sol.messages or sol.fallback,
            warnings=warn_all(sol.messages, stacklevel=3),
            passes=0,
            method="newton",
            reg=sol.reg,
            cv_nll=sol.cv_nll,
            cv_nll_base=sol.cv_nll_identity,
            fallback=sol.fallback,
            segments=int(masks.shape[0]),
        )

    def forward(self, logits: Tensor, features: Tensor) -> Tensor:
        """The repaired binary logits ``(N,)`` (the dtype of ``logits``; computed in float64)
        of the base map's logits and the rows' segment columns."""
        self._check_fitted()
        logits = self._binary(logits, "(binary logits of the base map)")
        cols = columns_from_features(features, self.columns, self.numeric)
        if features.shape[0] != logits.shape[0]:
            raise ValueError(
                f"features: expected {logits.shape[0]} rows (one per logit), got {features.shape[0]}"
            )
        spec = self._spec()
        x = apply_segments(spec, cols).T.to(torch.float64)
        z = logits.detach().to(torch.float64)
        out = segment_logits(z, x, self.slope, self.intercept, self.slopes, self.offsets)
        return out.to(logits.dtype)
