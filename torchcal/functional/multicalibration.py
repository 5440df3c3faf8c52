"""Multicalibration: the Kuiper-type cumulative calibration error (ECCE) of every segment of the
data, in sigma units, and the worst segment (docs/design.md section 6g).

ECCE (Arrieta-Ibarra et al. 2022, "Metrics of calibration for probabilistic predictions") of a
set of rows sorted by the predicted probability ``p`` is the range (max minus min) of the
cumulative differences ``C_k = sum_{i <= k} w_i (y_i - p_i) / sum_i w_i`` (with ``C_0 = 0``): a
bin-free statistic. Under perfect calibration its scale is

    sigma = sqrt(sum_i w_i^2 p_i (1 - p_i)) / sum_i w_i,

and ``ECCE / sigma`` follows (asymptotically) the range of a standard Brownian motion on
[0, 1], whose tail gives the p-value (:func:`ecce_pvalue`). The multicalibration error of Guy et
al. (2025, "Measuring multi-calibration") is the largest ``ECCE / sigma`` over the segments
(the whole data set is segment 0) -- ``mce_sigma`` -- and ``mce = mce_sigma * sigma_global``
(the absolute scale of ``mcgrad.metrics.MulticalibrationError``; tested equal to it to 1e-9).

One convention of ours: rows with *tied* probabilities enter the cumulative sum as one block
(``C`` is read only at the end of each block), so every value here is independent of the order
of the rows (``mcgrad`` sorts ties in whatever order its sort leaves them, so its ECCE of tied
data can depend on the row order). Without ties the two are the same statistic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_binary_target,
    check_finite,
    check_int,
    check_positive,
    check_probabilities,
    check_same_shape,
    check_tensor,
)
from torchcal.functional.calibration.binning import BinnedStats

__all__ = [
    "MulticalibrationResult",
    "ecce",
    "ecce_pvalue",
    "multicalibration_error",
    "segment_masks",
]

#: Elements of a chunk of the (segments x rows) cumulative sums held at once.
_CHUNK_ELEMENTS = 1 << 23
#: Above this many sigmas the Brownian range's CDF is 1 to double precision.
_SIGMA_MAX = 8.26732673


class MulticalibrationResult(NamedTuple):
    """What :func:`multicalibration_error` found (float64 tensors; ``S`` segments, segment 0
    the whole data set)."""

    mce_sigma: Tensor  # () the largest ECCE / sigma over the segments
    mce: Tensor  # () mce_sigma * sigma of the whole data set (mcgrad's absolute scale)
    worst: int  # index of the segment with the largest ECCE / sigma (the first on a tie)
    ecce: Tensor  # (S,) ECCE per segment
    sigma: Tensor  # (S,) its scale under perfect calibration
    ecce_sigma: Tensor  # (S,) ECCE / sigma (inf where sigma is 0 and ECCE is not, else 0)
    pvalue: Tensor  # (S,) p-value of each segment's ECCE (not adjusted for multiplicity)
    rows: Tensor  # (S,) int64 rows per segment


def _inputs(probs: Tensor, target: Tensor, weight: Tensor | None) -> tuple[Tensor, ...]:
    check_probabilities("probs", check_tensor("probs", probs))
    if probs.dim() != 1 or probs.numel() == 0:
        raise ValueError(f"probs: expected a non-empty 1-D tensor, got shape {tuple(probs.shape)}")
    check_same_shape("probs", probs, "target", check_tensor("target", target))
    check_binary_target("target", target)
    p = probs.detach().to(torch.float64)
    y = target.detach().to(torch.float64)
    if weight is None:
        w = torch.ones_like(p)
    else:
        check_same_shape("probs", probs, "weight", check_tensor("weight", weight))
        if not weight.is_floating_point():
            weight = weight.to(torch.float64)
        check_finite("weight", weight)
        check_positive("weight", weight, strict=False)
        w = weight.detach().to(torch.float64)
        top = float(w.max())
        if not top > 0:
            raise ValueError("weight: expected a positive total weight, got 0")
        w = w / top  # ECCE and sigma do not change under w -> c w; w^2 must not underflow
    return p, y, w


def _check_segments(segments: Tensor, n: int) -> Tensor:
    check_tensor("segments", segments)
    if segments.dtype != torch.bool or segments.dim() != 2 or segments.shape[1] != n:
        raise ValueError(
            f"segments: expected a bool tensor of shape (S, {n}) (one row mask per segment), "
            f"got {segments.dtype} of shape {tuple(segments.shape)}"
        )
    if segments.shape[0] == 0:
        raise ValueError("segments: expected at least one segment, got 0")
    return segments


def _segment_sums(p: Tensor, y: Tensor, w: Tensor, segments: Tensor) -> tuple[Tensor, Tensor]:
    """(ECCE, sigma) of every segment: one sort, tie blocks read at their ends, the cumulative
    sums over chunks of segments (bounded memory)."""
    order = torch.sort(p, stable=True).indices
    ps, d, w2v = p[order], (w * (y - p))[order], (w * w * p * (1 - p))[order]
    ws = w[order]
    _, counts = torch.unique_consecutive(ps, return_counts=True)
    ends = torch.cumsum(counts, 0) - 1  # the last row of each tie block
    masks = segments[:, order]
    step = max(1, _CHUNK_ELEMENTS // max(1, p.numel()))
    ecce_parts, sigma_parts = [], []
    for start in range(0, masks.shape[0], step):
        m = masks[start : start + step].to(torch.float64)
        total = m @ ws
        cum = torch.cumsum(m * d, dim=1)[:, ends]
        cum = torch.cat([torch.zeros_like(cum[:, :1]), cum], dim=1)
        span = cum.amax(dim=1) - cum.amin(dim=1)
        safe = torch.where(total > 0, total, torch.ones_like(total))
        ecce_parts.append(torch.where(total > 0, span / safe, torch.zeros_like(span)))
        sigma_parts.append(
            torch.where(total > 0, torch.sqrt(m @ w2v) / safe, torch.zeros_like(span))
        )
    return torch.cat(ecce_parts), torch.cat(sigma_parts)


def ecce(probs: Tensor, target: Tensor, *, weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(ECCE, sigma)`` of binary probabilities ``probs`` ``(N,)`` and labels in {0, 1}
    (float64 scalars): the range of the cumulative calibration differences and its scale
    under perfect calibration (module docstring). ``weight``: finite, ``>= 0`` row weights.

    Example:
        >>> import torch
        >>> from torchcal.functional.multicalibration import ecce
        >>> p = torch.tensor([0.1, 0.4, 0.6, 0.9])
        >>> value, sigma = ecce(p, torch.tensor([0, 1, 0, 1]))
        >>> round(float(value), 4), round(float(sigma), 4)
        (0.15, 0.2031)
    """
    p, y, w = _inputs(probs, target, weight)
    value, sigma = _segment_sums(p, y, w, torch.ones(1, p.numel(), dtype=torch.bool))
    return value[0], sigma[0]


def ecce_pvalue(ecce_sigma: Tensor) -> Tensor:
    """P(range of a standard Brownian motion on [0, 1] >= x) at ``x = ecce_sigma`` (float64;
    1 at 0, ``2.2e-16`` beyond 8.27 sigma, where the series is 1 to double precision).

    The series is ``1 - sum_{k >= 0} (8/x^2 + 2/(pi^2 (k+1/2)^2)) exp(-2 pi^2 (k+1/2)^2 / x^2)``,
    summed until its terms fall below machine precision.

    Example:
        >>> import torch
        >>> from torchcal.functional.multicalibration import ecce_pvalue
        >>> [round(v, 4) for v in ecce_pvalue(torch.tensor([0.5, 2.0, 3.0])).tolist()]
        [1.0, 0.1815, 0.0108]
    """
    x = check_tensor("ecce_sigma", ecce_sigma).detach().to(torch.float64)
    if bool(torch.isnan(x).any()) or bool((x < 0).any()):
        raise ValueError("ecce_sigma: expected values >= 0 (sigmas), got a negative or NaN value")
    eps = torch.finfo(torch.float64).eps
    out = torch.full_like(x, eps)
    live = x < _SIGMA_MAX
    xc = x[live].clamp_min(1e-3)  # below 1e-3 sigma the CDF is 0 to double precision
    fact = 4.0 / math.sqrt(2.0 * math.pi) * (1.0 / xc + xc / math.pi**2)
    kmax = (
        int(
            torch.ceil(
                0.5 + xc / math.pi / math.sqrt(2.0) * torch.sqrt(torch.log(fact / eps))
            ).max()
        )
        if xc.numel()
        else 0
    )
    k = torch.arange(max(kmax, 1), dtype=torch.float64) + 0.5
    coeff = 8.0 / xc[:, None] ** 2 + 2.0 / (k[None, :] ** 2 * math.pi**2)
    cdf = (coeff * torch.exp(-2.0 * k[None, :] ** 2 * math.pi**2 / xc[:, None] ** 2)).sum(1)
    out[live] = (1.0 - cdf).clamp(eps, 1.0)
    return out


class SegmentSpec(NamedTuple):
    """The segments of :func:`segment_masks`, reusable on new rows (:func:`apply_segments`).

    ``names``: the columns; ``kinds``: per column ``"code"`` (categorical codes),
    ``"values"`` (a numeric column with at most ``bins`` distinct values: ``cuts`` holds them;
    a value not among them is in no segment of that column) or ``"edges"`` (quantile buckets:
    ``cuts`` holds the inner edges); ``cells``: ``(S, F)`` int64, the value (or bucket) of each
    column in each segment, ``-1`` where the segment leaves the column free (row 0: the whole
    data set)."""

    names: tuple[str, ...]
    kinds: tuple[str, ...]
    cuts: tuple[Tensor, ...]
    cells: Tensor


def _columns(columns: Mapping[str, Tensor], names: tuple[str, ...] | None = None) -> int:
    """Check the columns (1-D, one length, the names expected); return N."""
    if not isinstance(columns, Mapping) or not columns:
        raise ValueError("columns: expected a non-empty mapping of name -> 1-D tensor")
    if names is not None and tuple(columns) != names:
        raise ValueError(f"columns: expected the columns {list(names)!r}, got {list(columns)!r}")
    n = None
    for name, values in columns.items():
        check_tensor(f"columns[{name!r}]", values)
        if values.dim() != 1 or (n is not None and values.numel() != n):
            raise ValueError(
                f"columns[{name!r}]: expected a 1-D tensor of {n if n is not None else 'N'} "
                f"values, got shape {tuple(values.shape)}"
            )
        if values.is_complex():
            raise ValueError(f"columns[{name!r}]: expected real values, got {values.dtype}")
        if values.is_floating_point():
            check_finite(f"columns[{name!r}]", values)
        elif values.numel() and int(values.min()) < 0:
            raise ValueError(
                f"columns[{name!r}]: expected integer codes >= 0 (a missing value is a code of "
                f"its own), got {int(values.min())}"
            )
        n = values.numel()
    assert n is not None
    return n


def _code(kind: str, cut: Tensor, values: Tensor) -> Tensor:
    """Each row's value (or bucket) of one column under a spec's rule (-1: none)."""
    if kind == "code":
        return values.to(torch.int64)
    v = values.detach().to(torch.float64).contiguous()
    if kind == "edges":
        return torch.searchsorted(cut, v, right=False)
    at = torch.searchsorted(cut, v).clamp_max(cut.numel() - 1)
    return torch.where(cut[at] == v, at, torch.full_like(at, -1))


def segment_spec(
    columns: Mapping[str, Tensor], *, depth: int = 2, min_rows: int = 1, bins: int = 4
) -> SegmentSpec:
    """The :class:`SegmentSpec` of :func:`segment_masks` (same arguments)."""
    n = _columns(columns)
    depth = check_int("depth", depth, minimum=0)
    min_rows = check_int("min_rows", min_rows, minimum=1)
    bins = check_int("bins", bins, minimum=1)
    kinds, cuts, codes = [], [], []
    for values in columns.values():
        if values.dtype == torch.bool or not values.is_floating_point():
            kind, cut = "code", torch.zeros(0, dtype=torch.float64)
        else:
            v = values.detach().to(torch.float64)
            distinct = torch.unique(v)
            if distinct.numel() <= bins:
                kind, cut = "values", distinct
            else:
                q = torch.quantile(v, torch.linspace(0, 1, bins + 1, dtype=torch.float64))
                kind, cut = "edges", torch.unique(q)[1:-1].contiguous()
        kinds.append(kind)
        cuts.append(cut)
        codes.append(_code(kind, cut, values))
    values_of = [torch.unique(c[c >= 0]).tolist() for c in codes]
    cells = [[-1] * len(codes)]
    for d in range(1, min(depth, len(codes)) + 1):
        for cols in itertools.combinations(range(len(codes)), d):
            for combo in itertools.product(*(values_of[j] for j in cols)):
                mask = torch.ones(n, dtype=torch.bool)
                for j, v in zip(cols, combo):
                    mask &= codes[j] == v
                if int(mask.sum()) >= min_rows:
                    cell = [-1] * len(codes)
                    for j, v in zip(cols, combo):
                        cell[j] = int(v)
                    cells.append(cell)
    return SegmentSpec(
        tuple(columns), tuple(kinds), tuple(cuts), torch.tensor(cells, dtype=torch.int64)
    )


def apply_segments(spec: SegmentSpec, columns: Mapping[str, Tensor]) -> Tensor:
    """The ``(S, N)`` bool row masks of ``spec``'s segments on the rows of ``columns`` (the
    spec's columns, in its order)."""
    n = _columns(columns, spec.names)
    codes = torch.stack(
        [_code(k, c, v) for k, c, v in zip(spec.kinds, spec.cuts, columns.values())], 1
    )  # (N, F)
    cells = spec.cells
    if cells.shape[0] == 0:
        return torch.zeros(0, n, dtype=torch.bool)
    free = cells < 0  # (S, F)
    return ((codes[None, :, :] == cells[:, None, :]) | free[:, None, :]).all(dim=2)


def spec_labels(spec: SegmentSpec) -> list[tuple[tuple[str, int], ...]]:
    """Each segment as ``(column, value)`` pairs (``()``: the whole data set)."""
    return [
        tuple((spec.names[j], int(v)) for j, v in enumerate(row) if v >= 0)
        for row in spec.cells.tolist()
    ]


def check_segment_options(
    columns: Sequence[str], numeric: Sequence[str], depth: int, min_rows: int, bins: int
) -> tuple[tuple[str, ...], tuple[str, ...], int, int, int]:
    """The checked segment settings of the metric and the repair: ``(columns, numeric in
    column order, depth, min_rows, bins)``."""
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise TypeError("columns: expected a sequence of column names (str)")
    if not columns or len(set(columns)) != len(columns):
        raise ValueError(f"columns: expected distinct names, got {list(columns)!r}")
    if isinstance(numeric, str) or not set(numeric) <= set(columns):
        raise ValueError(f"numeric: expected names among columns {list(columns)!r}")
    return (
        tuple(columns),
        tuple(c for c in columns if c in set(numeric)),
        check_int("depth", depth, minimum=0),
        check_int("min_rows", min_rows, minimum=1),
        check_int("bins", bins, minimum=1),
    )


def columns_from_features(
    features: Tensor, names: Sequence[str], numeric: Sequence[str]
) -> dict[str, Tensor]:
    """The segment columns of a ``(N, F)`` feature matrix: column ``j`` named ``names[j]``,
    integer codes (int64) unless its name is in ``numeric`` (float64 values)."""
    check_tensor("features", features)
    if features.dim() != 2 or features.shape[1] != len(names):
        raise ValueError(
            f"features: expected shape (N, {len(names)}) (one column per name in columns), "
            f"got {tuple(features.shape)}"
        )
    cols = {}
    for j, name in enumerate(names):
        v = features[:, j].detach()
        if name in numeric:
            cols[name] = v.to(torch.float64)
            continue
        if v.is_floating_point():
            if not bool(torch.isfinite(v).all()) or not bool((v == v.round()).all()):
                raise ValueError(
                    f"features: categorical column {name!r} holds non-integer codes (name it "
                    f"in numeric= to bucket it)"
                )
        cols[name] = v.to(torch.int64)
    return cols


def segment_masks(
    columns: Mapping[str, Tensor],
    *,
    depth: int = 2,
    min_rows: int = 1,
    bins: int = 4,
) -> tuple[Tensor, list[tuple[tuple[str, int], ...]]]:
    """The segments of every cross of up to ``depth`` columns: ``(masks (S, N) bool, labels)``.

    ``columns`` maps a name to a 1-D tensor of ``N`` values: an integer (or bool) tensor is
    categorical (each value a segment), a floating one is cut into ``bins`` quantile buckets
    (edges at the ``k / bins`` quantiles, linear interpolation, repeated edges merged; a bucket
    holds ``(e_{k-1}, e_k]``, the first also its lower edge; a column with at most ``bins``
    distinct values keeps them). Segment 0 is the whole data set (depth 0); then, for depth 1,
    2, ..., every combination of columns in the given order and every combination of their
    values (ascending). A segment with fewer than ``min_rows`` rows is left out. A label is
    the tuple of ``(column, value)`` pairs (the bucket index for a numeric column).

    Example:
        >>> import torch
        >>> from torchcal.functional.multicalibration import segment_masks
        >>> masks, labels = segment_masks({"lang": torch.tensor([0, 0, 1, 1]),
        ...                                "len": torch.tensor([1., 2., 3., 4.])},
        ...                               depth=1, bins=2)
        >>> masks.shape, labels[:3]
        (torch.Size([5, 4]), [(), (('lang', 0),), (('lang', 1),)])
    """
    spec = segment_spec(columns, depth=depth, min_rows=min_rows, bins=bins)
    return apply_segments(spec, columns), spec_labels(spec)


def multicalibration_error(
    probs: Tensor,
    target: Tensor,
    segments: Tensor,
    *,
    weight: Tensor | None = None,
) -> MulticalibrationResult:
    """ECCE, sigma and p-value per segment and the multicalibration error (module docstring).

    ``segments`` is a bool ``(S, N)`` tensor of row masks (e.g. from :func:`segment_masks`;
    put the whole data set first to have it compared too, as ``mcgrad`` does). A segment with
    zero weight has ECCE 0 and sigma 0.

    Example:
        >>> import torch
        >>> from torchcal.functional.multicalibration import multicalibration_error, segment_masks
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(4000, generator=g, dtype=torch.float64)
        >>> lang = torch.randint(0, 2, (4000,), generator=g)
        >>> true = (p + torch.where(lang == 1, 0.1, -0.1)).clamp(0, 1)   # cancels globally
        >>> y = torch.bernoulli(true, generator=g)
        >>> masks, labels = segment_masks({"lang": lang}, depth=1)
        >>> res = multicalibration_error(p, y, masks)
        >>> bool(res.ecce_sigma[0] < 3), labels[res.worst][0][0], bool(res.mce_sigma > 5)
        (True, 'lang', True)
    """
    p, y, w = _inputs(probs, target, weight)
    segments = _check_segments(segments, p.numel())
    value, sigma = _segment_sums(p, y, w, segments)
    ratio = torch.where(
        sigma > 0,
        value / torch.where(sigma > 0, sigma, torch.ones_like(sigma)),
        torch.where(value > 0, torch.full_like(value, math.inf), torch.zeros_like(value)),
    )
    worst = int(torch.argmax(ratio))
    _, sigma_all = _segment_sums(p, y, w, torch.ones(1, p.numel(), dtype=torch.bool))
    return MulticalibrationResult(
        mce_sigma=ratio[worst],
        mce=ratio[worst] * sigma_all[0],
        worst=worst,
        ecce=value,
        sigma=sigma,
        ecce_sigma=ratio,
        pvalue=ecce_pvalue(ratio.nan_to_num(posinf=1e300)),
        rows=segments.sum(dim=1),
    )


def ecce_from_stats(stats: BinnedStats) -> tuple[Tensor, Tensor]:
    """``(ECCE, sigma)`` of each leading row of binned statistics ``(R, K, B)`` (slots summed):
    the ECCE read at the bin ends (each bin one tie block, in score order), so at most the
    ECCE of the rows; ``sigma = sqrt(sum c (1 - c)) / n`` (frequency weights: ``sum w c (1 -
    c) / sum w``). Rows with no mass give ``(0, 0)``.

    Example:
        >>> import torch
        >>> from torchcal.functional.calibration.binning import binned_statistics
        >>> p, y = torch.tensor([0.1, 0.4, 0.6, 0.9]), torch.tensor([0, 1, 0, 1])
        >>> s = binned_statistics(p, y, n_bins=10, reading="binary", input="probs")
        >>> [round(float(v), 4) for v in ecce_from_stats(s)]
        [0.15, 0.2031]
    """
    n = stats.mass().sum((-2, -1))
    d = (stats.acc - stats.conf).sum(-2)  # (R, B) in score order
    safe = torch.where(n > 0, n, torch.ones_like(n))
    cum = torch.cumsum(d, dim=-1) / safe[..., None]
    cum = torch.cat([torch.zeros_like(cum[..., :1]), cum], dim=-1)
    value = torch.where(n > 0, cum.amax(-1) - cum.amin(-1), torch.zeros_like(n))
    var = (stats.conf - stats.conf2).sum((-2, -1)).clamp_min(0)
    return value, torch.where(n > 0, torch.sqrt(var) / safe, torch.zeros_like(n))
