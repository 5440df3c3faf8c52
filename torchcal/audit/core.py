"""The streaming audit: :class:`Auditor` (chunk by chunk) and :func:`audit` (one call).

State is O(groups x bins) plus a bounded sample: per group the binned sufficient statistics
(:class:`~torchcal.functional.BinnedStats`), the summed NLL and the number of
right decisions, and a seeded uniform sample of at most ``sample_size`` rows. The sample is a
reservoir by random keys: each row draws a uniform key from a seeded generator in row order
and the ``sample_size`` smallest keys are kept, so the sample is identical for any chunking
(it is kept in row order). Every number comes from :mod:`torchcal.functional`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from torchcal.audit._evaluate import build_report
from torchcal.audit.report import AuditReport
from torchcal.audit.state import (
    DEFAULT_BINS,
    GRID,
    AuditSettings,
    AuditState,
    GridCounts,
    empty_sample,
    generator_seed,
)
from torchcal.engines._state_checks import check_cells
from torchcal.functional._checks import check_int, check_option, validation_enabled
from torchcal.functional.calibration.binning import BinnedStats, accumulate
from torchcal.functional.calibration.nll import nll_terms
from torchcal.functional.calibration.readings import INPUTS, prepare_inputs, warn_probs_as_logits
from torchcal.functional.calibration.weights import accumulate_weighted
from torchcal.functional.histogram_scores import MAX_FINE_GROUPS, FineHistogram, fine_histogram

__all__ = ["Auditor", "audit"]

AUDIT_READINGS = ("binary", "confidence")
#: groups above which the per-value counts are dropped (memory: 16 bytes x 101 per group)
MAX_GRID_GROUPS = 10_000
#: the engine name of the in-process road in ``report.json["settings"]["engine"]``
ENGINE = "memory"


def reading_of(preds: Tensor, reading: str | None) -> str:
    """``binary`` for ``(N,)``/``(N, 1)`` preds, ``confidence`` for ``(N, C)``, ``C >= 2``;
    an explicit ``reading`` must agree with the shape."""
    if reading is not None:
        check_option("reading", reading, AUDIT_READINGS)
    if not isinstance(preds, Tensor) or preds.dim() not in (1, 2):
        shape = tuple(preds.shape) if isinstance(preds, Tensor) else type(preds).__name__
        raise ValueError(f"preds: expected a tensor of shape (N,), (N, 1) or (N, C), got {shape}")
    auto = "binary" if preds.dim() == 1 or preds.shape[1] == 1 else "confidence"
    if reading is not None and reading != auto:
        raise ValueError(
            f"reading: {reading!r} does not fit preds of shape {tuple(preds.shape)} "
            f"(expected {auto!r}: (N,) or (N, 1) is binary, (N, C) with C >= 2 is confidence)"
        )
    return auto


class Auditor:
    """Streaming calibration audit: feed chunks with :meth:`update`, then :meth:`report`.

    Args:
        input: ``"probs"`` (P(y=1) for binary, probability rows for multiclass) or
            ``"logits"``.
        num_classes: expected classes of multiclass preds (checked; inferred if ``None``).
        n_bins: equal-width bins (at most :data:`MAX_BINS`); ``None``: 10, or, when every
            confidence sits on a 0.05 or 0.1 grid (stated confidences such as "85%"), one
            bin per grid value (``1 / grid + 1`` bins: value ``k * grid`` lands in bin ``k``
            by the usual rule), said in the report.
        sample_size: rows kept in the seeded uniform sample (the HTML page, :meth:`AuditReport
            .ece_at` and the temperature fit use it).
        seed: seeds the sample and the fit/eval split.
        reading: ``None`` (from the shape), ``"binary"`` or ``"confidence"``.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(5000, generator=g, dtype=torch.float64)
        >>> y = (torch.rand(5000, generator=g, dtype=torch.float64) < p).long()
        >>> a = Auditor(n_bins=10)
        >>> a.update(p[:300], y[:300]); a.update(p[300:], y[300:])
        >>> r = a.report(threshold=0.8)
        >>> r.verdict, r.pooled["n"], r.pooled["threshold_gap"]["n"]
        ('pass', 5000, 963)
    """

    def __init__(
        self,
        *,
        input: str = "probs",
        num_classes: int | None = None,
        n_bins: int | None = None,
        sample_size: int = 20000,
        seed: int = 0,
        reading: str | None = None,
    ) -> None:
        self.input = str(check_option("input", input, INPUTS))
        self.auto_bins = n_bins is None
        AuditSettings(n_bins=n_bins, seed=seed, sample_size=sample_size)  # the checks
        self.n_bins = DEFAULT_BINS if n_bins is None else n_bins
        self.sample_size = sample_size
        self.seed = seed
        if num_classes is not None:
            check_int("num_classes", num_classes, minimum=2)
        self.num_classes = num_classes
        self.reading = (
            None if reading is None else str(check_option("reading", reading, AUDIT_READINGS))
        )
        self.n_rows = 0
        self.stats = BinnedStats.zeros(1, 1, self.n_bins)
        self.nll = torch.zeros(1, dtype=torch.float64)
        self.nll_inf = torch.zeros(1, dtype=torch.int64)
        self.saturated = 0
        self.hits = torch.zeros(1, dtype=torch.float64)
        self.grouped = False
        self.weighted: bool | None = None  # set by the first update
        # exact counts per (group, confidence on the 0.01 grid) while every value is on it
        self.grid: GridCounts | None = (
            GridCounts(
                torch.zeros(1, GRID + 1, dtype=torch.int64),
                torch.zeros(1, GRID + 1, dtype=torch.float64),
            )
            if self.auto_bins
            else None
        )
        self._gen = torch.Generator().manual_seed(generator_seed(self.seed))
        self._sample: dict[str, Tensor] | None = None
        # the fine histogram of the confidence (global ECCE, resolution), <= 128 groups
        self.fine: FineHistogram | None = FineHistogram.zeros(1)

    @property
    def num_groups(self) -> int:
        return int(self.stats.count.shape[0])

    def _check_shapes(
        self, preds: Tensor, target: Tensor, groups: Tensor | None, weight: Tensor | None
    ) -> Tensor:
        reading = reading_of(preds, self.reading)
        if self.reading is None:
            self.reading = reading
        if reading == "binary" and preds.dim() == 2:
            preds = preds.reshape(-1)
        if reading == "confidence":
            C = preds.shape[1]
            if self.num_classes is None:
                self.num_classes = C
            elif C != self.num_classes:
                raise ValueError(f"preds: expected {self.num_classes} classes in dim 1, got {C}")
        if not isinstance(target, Tensor) or target.shape != preds.shape[:1]:
            got = tuple(target.shape) if isinstance(target, Tensor) else type(target).__name__
            raise ValueError(f"target: expected shape {tuple(preds.shape[:1])}, got {got}")
        if groups is None and self.grouped:
            raise ValueError("groups: expected group ids (earlier updates had them), got None")
        if groups is not None and self.n_rows and not self.grouped:
            raise ValueError("groups: earlier updates had no group ids; give them on every update")
        if self.weighted is not None and self.weighted != (weight is not None):
            raise ValueError("weight: give weights on every update or on none")
        if weight is not None:
            if not isinstance(weight, Tensor) or weight.shape != preds.shape[:1]:
                got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
                raise ValueError(f"weight: expected shape {tuple(preds.shape[:1])}, got {got}")
            w = weight.to(torch.float64)
            if not bool((torch.isfinite(w) & (w >= 0)).all()):
                raise ValueError("weight: expected finite weights >= 0")
        return preds

    def grow(self, G: int) -> None:
        """Pad the per-group state to ``G`` groups (ids may appear late)."""
        extra = G - self.num_groups
        if extra <= 0:
            return
        pad = BinnedStats.zeros(extra, 1, self.n_bins)
        if self.stats.weight is not None:
            pad = _weighted(pad, torch.zeros_like(pad.conf))
        self.stats = _cat(self.stats, pad)
        self.nll = torch.cat([self.nll, torch.zeros(extra, dtype=torch.float64)])
        self.nll_inf = torch.cat([self.nll_inf, torch.zeros(extra, dtype=torch.int64)])
        if self.grid is not None:
            if G > MAX_GRID_GROUPS:
                self.grid = None
            else:
                z = torch.zeros(extra, GRID + 1, dtype=torch.int64)
                g = self.grid
                self.grid = GridCounts(
                    torch.cat([g.count, z]),
                    torch.cat([g.pos, z.double()]),
                    None if g.weight is None else torch.cat([g.weight, z.double()]),
                    None if g.weight2 is None else torch.cat([g.weight2, z.double()]),
                )
        self.hits = torch.cat([self.hits, torch.zeros(extra, dtype=torch.float64)])
        if self.fine is not None:
            self.fine = None if G > MAX_FINE_GROUPS else self.fine.grow(G)

    def update(
        self,
        preds: Tensor,
        target: Tensor,
        groups: Tensor | None = None,
        weight: Tensor | None = None,
    ) -> None:
        """Add a chunk: ``preds`` ``(N,)``/``(N, 1)`` (binary) or ``(N, C)``, ``target``
        ``(N,)`` labels, ``groups`` ``(N,)`` int ids ``>= 0`` (the set may grow), ``weight``
        ``(N,)`` frequency weights (finite, ``>= 0``; on every update or none)."""
        preds = self._check_shapes(preds, target, groups, weight)
        prep = prepare_inputs(
            preds, target, reading=self.reading or "binary", input=self.input, groups=groups
        )
        warn_probs_as_logits(prep)
        if groups is not None:
            self.grouped = True
        w = None if weight is None else weight.to(torch.float64)
        if self.weighted is None:
            self.weighted = w is not None
            if w is not None:
                s = self.stats
                self.stats = _weighted(s, torch.zeros_like(s.conf))
                if self.grid is not None:
                    zero = self.grid.pos.clone()
                    self.grid = GridCounts(self.grid.count, self.grid.pos, zero, zero.clone())
        # (G_chunk, 1, B): ids seen in this chunk; the size bound before allocating
        check_cells(max(self.num_groups, prep.num_groups), 1, self.n_bins, "groups")
        chunk = (
            accumulate(prep, self.n_bins)
            if w is None
            else accumulate_weighted(prep, self.n_bins, w)
        )
        G = max(self.num_groups, prep.num_groups)
        self.grow(G)
        if prep.num_groups < G:
            pad = BinnedStats.zeros(G - prep.num_groups, 1, self.n_bins)
            if w is not None:
                pad = _weighted(pad, torch.zeros_like(pad.conf))
            chunk = _cat(chunk, pad)
        self.stats = self.stats + chunk
        if self.fine is not None:
            lead = prep.lead if groups is not None else None
            chunk_fine = fine_histogram(
                prep.conf, prep.outcome, groups=lead, num_groups=G, weight=w
            )
            self.fine = self.fine.plus(chunk_fine)
        if self.grid is not None:
            if self.input == "probs":
                self._track_grid(prep, G, w)
            else:
                self.grid = None
        g = torch.zeros(target.shape[0], dtype=torch.int64) if groups is None else groups.long()
        items = _nll_items(preds, target, self.input)
        inf = torch.isinf(items)
        if w is not None:
            inf = inf & (w > 0)
            items = torch.where(w == 0, 0.0, w * items)
        if bool(inf.any()):  # counted apart, so the other rows keep a finite NLL
            self.nll_inf += torch.bincount(g[inf], minlength=G)
            items = torch.where(inf, 0.0, items)
        self.nll += torch.bincount(g, weights=items, minlength=G)
        if self.input == "probs":
            edge = (preds == 0) | (preds == 1)
            self.saturated += int((edge if edge.dim() == 1 else edge.any(1)).sum())
        right = _right_decisions(prep.conf, prep.outcome, self.reading)
        if w is None:
            self.hits += torch.bincount(g * 2 + right, minlength=2 * G).view(G, 2)[:, 1]
        else:
            self.hits += torch.bincount(g, weights=w * right, minlength=G)
        self._keep_sample(preds, target, g)
        self.n_rows += target.shape[0]

    def _track_grid(self, prep: Any, G: int, w: Tensor | None) -> None:
        """Exact per-value counts while every confidence is a multiple of 0.01 (to 1e-9)."""
        assert self.grid is not None
        if self.reading == "confidence" and prep.per_sample != 1:  # pragma: no cover
            self.grid = None
            return
        c = prep.conf.to(torch.float64)
        k = torch.round(c * GRID)
        if not bool((torch.abs(c * GRID - k) <= 1e-9 * GRID).all()):
            self.grid = None
            return
        lead = prep.lead if prep.lead is not None else torch.zeros_like(k, dtype=torch.int64)
        idx = lead.to(torch.int64) * (GRID + 1) + k.to(torch.int64)
        size = G * (GRID + 1)
        cnt = torch.bincount(idx, minlength=size).view(G, GRID + 1)
        y = prep.outcome.to(torch.float64)
        pos = torch.bincount(idx, weights=y if w is None else w * y, minlength=size)
        g = self.grid
        wsum = w2sum = None
        if g.weight is not None and g.weight2 is not None and w is not None:
            wsum = g.weight + torch.bincount(idx, weights=w, minlength=size).view(G, GRID + 1)
            w2 = torch.bincount(idx, weights=w * w, minlength=size).view(G, GRID + 1)
            w2sum = g.weight2 + w2
        self.grid = GridCounts(g.count + cnt, g.pos + pos.view(G, GRID + 1), wsum, w2sum)

    def grid_of_values(self) -> float | None:
        """The coarsest of the grids 0.1 and 0.05 every confidence seen sits on, else None."""
        if self.grid is None or self.n_rows == 0:
            return None
        return self.grid.step()

    def _keep_sample(self, preds: Tensor, target: Tensor, g: Tensor) -> None:
        N = target.shape[0]
        keys = torch.rand(N, generator=self._gen, dtype=torch.float64)
        if self.sample_size == 0:
            return
        old = self._sample
        s = self.sample_size
        full = old is not None and old["key"].numel() >= s
        # only keys below the cut can be among the s smallest: the largest kept key once the
        # sample is full, else a cut with s new keys below it but for a ~1e-9 chance
        cut = float(old["key"].max()) if full else _cut(s, N)
        idx = (keys < cut).nonzero().squeeze(1) if cut < 1.0 else torch.arange(N)
        below = idx.numel() + (0 if old is None else int((old["key"] < cut).sum()))
        if not full and below < s:  # the cut was too low: every new key is a candidate
            idx = torch.arange(N)
        new = {
            "key": keys[idx],
            "row": idx + self.n_rows,
            "preds": preds.detach()[idx].to(torch.float64),
            "target": target.detach()[idx].to(torch.int64),
            "group": g[idx],
        }
        if old is not None:
            new = {k: torch.cat([old[k], new[k]]) for k in new}
        if new["key"].numel() > self.sample_size:
            keep = torch.topk(new["key"], self.sample_size, largest=False).indices
            keep = keep.sort().values  # keep row order
            new = {k: v[keep] for k, v in new.items()}
        self._sample = new

    def sample(self) -> dict[str, Tensor]:
        """The kept rows in row order: ``row``, ``preds`` (float64), ``target``, ``group``."""
        if self._sample is None:
            return empty_sample(self.reading or "binary", self.num_classes)
        return {k: v for k, v in self._sample.items() if k != "key"}

    def state(
        self,
        group_names: list[str] | None = None,
        *,
        read_log: dict[str, Any] | None = None,
        weight: str | None = None,
    ) -> AuditState:
        """The :class:`~torchcal.audit.state.AuditState` of everything seen so far (groups
        named by ``group_names``, one per id; ``"0"``, ``"1"``, ... without them)."""
        names = _check_names(group_names, self.num_groups, self.grouped)
        self.grow(len(names))
        return AuditState(
            stats=self.stats,
            nll=self.nll,
            nll_inf=self.nll_inf,
            hits=self.hits,
            names=tuple(names),
            grouped=self.grouped,
            input=self.input,
            reading=self.reading or "binary",
            num_classes=self.num_classes,
            n_rows=self.n_rows,
            saturated=self.saturated,
            engine=ENGINE,
            grid=self.grid if self.n_rows else None,
            fine=self.fine if self.n_rows else None,
            sample=self.sample(),
            read_log=dict(read_log or {}),
            weight=weight if self.weighted else None,
        )

    def report(
        self,
        *,
        group_names: list[str] | None = None,
        threshold: float | None = None,
        tolerance: float = 0.05,
        cost_error: float | None = None,
        cost_escalation: float | None = None,
        fit_temperature: bool = False,
        min_group: int = 200,
        alpha: float = 0.05,
        power: float = 0.8,
        read_log: dict[str, Any] | None = None,
        segments: Any = None,
    ) -> AuditReport:
        """The :class:`~torchcal.audit.AuditReport` of everything seen so far.

        The verdict is a test at level ``alpha`` (docs/design.md section 6c): with a
        ``threshold`` each row (pooled, each group) is judged on the gap ``mean confidence -
        accuracy`` in the window around it, else on the binned ECE. A row PASSes when its
        ``1 - 2 alpha`` interval lies inside the ``tolerance`` (two one-sided tests), FAILs
        when it lies outside (Holm-adjusted over the pooled row and the groups), else is
        INCONCLUSIVE; the report PASSes when every row does, FAILs when any does. The
        smallest gap (or ECE) each row could detect with probability ``power`` is reported.
        ``read_log`` (the reader's ``ReadLog.to_dict()``: rows excluded, percents read) is
        reported as is. Groups are reported in name order.

        ``fit_temperature=True`` fits T (pooled and per group) on a seeded half of the kept
        sample (all rows when ``n_rows <= sample_size``) and reports the other half before and
        after (``report.temperature``). Probabilities of exactly 0 or 1 get clamped logits
        for the fit, with a warning that counts them. ``segments``: the
        :class:`~torchcal.engines.segments.SegmentStats` to judge with them (docs/design.md 6g.1).
        """
        seg_kw = {} if segments is None else {
            "segments": tuple(r.name for r in segments.rules), "segment_bins": segments.bins,
            "depth": segments.depth, "min_segment": segments.min_rows,
        }  # fmt: skip
        settings = AuditSettings(
            **seg_kw,
            threshold=threshold,
            tolerance=tolerance,
            alpha=alpha,
            power=power,
            n_bins=None if self.auto_bins else self.n_bins,
            seed=self.seed,
            cost_error=cost_error,
            cost_escalation=cost_escalation,
            fit_temperature=fit_temperature,
            min_group=min_group,
            sample_size=self.sample_size,
        )
        if self.n_rows == 0:
            raise ValueError("preds: no rows were given to the audit (empty input)")
        state = self.state(group_names, read_log=read_log)
        state = state if segments is None else replace(state, segments=segments)
        return build_report(state, settings, rows_state)


def rows_state(
    preds: Tensor,
    target: Tensor,
    groups: Tensor | None,
    names: list[str] | None,
    input: str,
    n_bins: int,
) -> AuditState:
    """The :class:`~torchcal.audit.state.AuditState` of rows given at once (no sample): the
    held-out evaluations of the temperature fit."""
    a = Auditor(input=input, n_bins=n_bins, sample_size=0)
    a.update(preds, target, groups)
    return a.state(names)


def _check_names(group_names: list[str] | None, G: int, grouped: bool) -> list[str]:
    if group_names is None:
        return [str(g) for g in range(G)] if grouped else ["all"]
    names = list(group_names)
    if len(names) < G or not all(isinstance(n, str) and n for n in names):
        raise ValueError(
            f"group_names: expected at least {G} non-empty strings (one per group id), "
            f"got {names[: G + 2]!r}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"group_names: expected unique names, got {names!r}")
    return names


def _weighted(s: BinnedStats, weight: Tensor | None) -> BinnedStats:
    w2 = None if weight is None else torch.zeros_like(weight)  # sum w * w (zero stats only)
    return BinnedStats(s.count, s.conf, s.acc, s.conf2, s.conf_acc, weight=weight, weight2=w2)


def _cat(a: BinnedStats, b: BinnedStats) -> BinnedStats:
    w = None if a.weight is None or b.weight is None else torch.cat([a.weight, b.weight])
    w2 = None if a.weight2 is None or b.weight2 is None else torch.cat([a.weight2, b.weight2])
    c = [torch.cat(p) for p in zip(_fields(a), _fields(b), strict=True)]
    return BinnedStats(c[0], c[1], c[2], c[3], c[4], weight=w, weight2=w2)


def _fields(s: BinnedStats) -> tuple[Tensor, ...]:
    return (s.count, s.conf, s.acc, s.conf2, s.conf_acc)


def _cut(k: int, n: int) -> float:
    """A value with at least ``k`` of ``n`` uniform keys below it but for a ~1e-9 chance (the
    mean of the k-th smallest plus 6 standard deviations); 1.0 when ``k >= n``."""
    if k >= n:
        return 1.0
    q = k / n
    return min(1.0, q + 6.0 * math.sqrt(q * (1.0 - q) / n) + 16.0 / n)


def _nll_items(preds: Tensor, target: Tensor, input: str) -> Tensor:
    """Per-row NLL in float64 by :func:`~torchcal.functional.calibration.nll.nll_terms`; binary
    probabilities as the rows ``(1 - p, p)`` with the label as the class (one log per row
    instead of two ``xlogy``: the same log score, ~2x faster)."""
    if input == "probs" and preds.dim() == 1:
        p = preds.to(torch.float64)
        preds = torch.stack([1.0 - p, p], dim=1)
    with validation_enabled(False):  # checked by prepare_inputs
        items, _ = nll_terms(preds, target.long(), input=input)
    return items.to(torch.float64)


def _right_decisions(conf: Tensor, outcome: Tensor, reading: str | None) -> Tensor:
    """Which rows were decided right: binary ``(p >= 0.5) == y``; confidence: the argmax."""
    if reading == "binary":
        return ((conf.to(torch.float64) >= 0.5) == outcome.bool()).long()
    return outcome.long()


def audit(
    preds: Tensor,
    target: Tensor,
    *,
    groups: Tensor | None = None,
    group_names: list[str] | None = None,
    input: str = "probs",
    reading: str | None = None,
    threshold: float | None = None,
    tolerance: float = 0.05,
    n_bins: int | None = None,
    cost_error: float | None = None,
    cost_escalation: float | None = None,
    fit_temperature: bool = False,
    sample_size: int = 20000,
    seed: int = 0,
    min_group: int = 200,
    alpha: float = 0.05,
    power: float = 0.8,
    segments: Any = None,
    segment_bins: int = 4,
    depth: int = 2,
    min_segment: int = 200,
) -> AuditReport:
    """Audit ``preds`` against ``target`` in one call (one :class:`Auditor` update + report).
    ``segments`` maps column names to ``N`` values (texts, or a tensor): every cross of up to
    ``depth`` of them is judged too (docs/design.md 6g.1; as ``torchcal audit --segments``).

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(5000, generator=g, dtype=torch.float64)
        >>> y = (torch.rand(5000, generator=g, dtype=torch.float64) < p).long()
        >>> r = audit(p, y, threshold=0.8)
        >>> r.verdict, sorted(r.groups)
        ('pass', ['all'])
        >>> audit(p[:300], y[:300], threshold=0.8).verdict  # 300 rows cannot show it
        'inconclusive'
    """
    a = Auditor(
        input=input,
        n_bins=n_bins,
        sample_size=sample_size,
        seed=seed,
        reading=reading,
    )
    a.update(preds, target, groups)
    seg = None
    if segments is not None:
        from torchcal.audit.segments import segments_of_rows

        AuditSettings(segments=tuple(segments), segment_bins=segment_bins, depth=depth,
                      min_segment=min_segment)  # the checks  # fmt: skip
        seg = segments_of_rows(
            preds, target, segments, input=input, n_bins=a.n_bins, bins=segment_bins,
            depth=depth, min_rows=min_segment,
        )  # fmt: skip
    return a.report(
        segments=seg,
        group_names=group_names,
        threshold=threshold,
        tolerance=tolerance,
        cost_error=cost_error,
        cost_escalation=cost_escalation,
        fit_temperature=fit_temperature,
        min_group=min_group,
        alpha=alpha,
        power=power,
    )
