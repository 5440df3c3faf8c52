"""Inductive Venn-Abers calibration (Vovk & Petej, 2014): a probability interval ``(p0, p1)``
with a validity guarantee, and its merge into one probability."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_option
from torchcal.functional.temperature.fit import fit_temperature
from torchcal.functional.venn_abers import (
    top_label_scores,
    top_label_spread,
    venn_abers_merge,
    venn_abers_table,
)
from torchcal.scaling._base import FittedMixin, NLLFit, warn_all
from torchcal.scaling._scores import check_input, check_scores

__all__ = ["VennAbersCalibrator"]

_TABLE = ("scores", "p0", "p1")
MULTICLASS = ("top_label", "one_vs_rest")


class VennAbersCalibrator(FittedMixin):
    r"""Inductive Venn-Abers prediction (IVAP; Vovk & Petej, 2014, "Venn-Abers predictors";
    Vovk, Petej & Fedorova, 2015): for a test score ``s``, ``p0`` and ``p1`` are the values
    at ``s`` of the isotonic regression of the calibration labels on their scores with the
    test point added as label 0, resp. 1 (ties pooled). The one of the true label is
    perfectly calibrated under exchangeability (Vovk & Petej's validity); the width
    ``p1 - p0`` is about one over the size of the isotonic block ``s`` falls in. :meth:`predict_interval` returns ``(p0, p1)``; :meth:`predict_proba` (and
    ``forward``) the merged ``p1 / (1 - p0 + p1)`` (the log-loss minimax choice).

    Binary: ``scores`` ``(N,)`` (or ``(N, 1)``), targets in {0, 1}. Multiclass ``(N, C)``,
    ``multiclass="top_label"`` (the default): one temperature ``T`` is fitted on the
    calibration rows (``fit_temperature``, :class:`~torchcal.scaling.TemperatureScaler`'s
    fit, on the logits or on ``log p``), and Venn-Abers calibrates the binary problem "is the
    argmax right?" scored by the top label's log-probability under ``softmax(z / T)``
    (Gupta & Ramdas, 2022, top-label calibration); the merged value goes to the top label,
    the rest of the mass to the other labels in proportion to their temperature-scaled
    probabilities (``predict_interval`` gives the ``(N, C)`` bounds of that split: ``[p0,
    p1]`` for the top label, ``q_j / sum_{k != top} q_k * [1 - p1, 1 - p0]`` for the others).
    The validity is that of the top label's probability; where one temperature is the truth
    the test NLL is within a few thousandths of ``TemperatureScaler``'s (docs/benchmarks.md).
    ``multiclass="one_vs_rest"``: class ``c`` calibrated on column ``c`` against ``target ==
    c``, the merged probabilities of a row divided by their sum (the ``venn-abers``
    package's ``va_type="one_vs_rest"``; ``predict_interval`` gives the per-class ``(p0,
    p1)`` before that); a class absent from the calibration set is calibrated as
    all-negative. One-vs-rest can fix per-class biases the top label cannot, but it has
    ``N / C`` positives a class and, normalised, no validity: it lost 0.01-0.15 nats to one
    temperature where that is the truth (C = 10-1000, 5,000 rows).

    The method only reads the order of the scores and their ties, so ``input="probs"``
    (default: ``P(y = 1)`` ``(N,)`` or probability rows ``(N, C)``, checked) reproduces the
    ``venn-abers`` package on the same probabilities exactly (its ``VennAbers`` /
    ``predict_proba(p_cal=..., va_type="one_vs_rest")``; tested to 1e-12, ties included;
    its ``precision`` rounding is not offered); ``input="logits"`` reads binary logits as they
    are and multiclass logits through ``log_softmax`` in float64 (the order of ``softmax``,
    without the ties that rounding to float creates near 0 and 1; top label: the same
    temperature fit as on ``log p``, to rounding).

    Fit: for each table (the top label's, or one a class) the ``(p0, p1)`` of every possible test position, O(n log n) (a sort
    and one stack sweep over the greatest convex minorant of the cumulative sum diagram,
    :func:`~torchcal.functional.venn_abers.venn_abers_table`); a query is one binary search.
    Everything is float64; ``0 <= p0 <= p1 <= 1``, ``p1 > 0``, so no output is NaN.

    State: ``scores`` ``(C', K)`` (the sorted distinct calibration scores per table, padded
    with ``+inf``; ``C' = 1`` binary and top label, ``C`` one-vs-rest), ``p0``, ``p1`` ``(C',
    K + 1)``, ``num_classes`` (0 binary, else ``C``), ``temperature`` (the top label's ``T``;
    1 otherwise) and ``fitted``; sizes set by the fit and by ``load_state_dict``, which checks
    them. Before ``fit`` every
    prediction raises :class:`~torchcal.scaling.NotFittedError`.

    Example:
        >>> import torch
        >>> from torchcal.scaling import VennAbersCalibrator
        >>> p = torch.tensor([0.1, 0.3, 0.3, 0.6, 0.8, 0.9])
        >>> y = torch.tensor([0, 0, 1, 0, 1, 1])
        >>> va = VennAbersCalibrator()
        >>> _ = va.fit(p, y)
        >>> p0, p1 = va.predict_interval(torch.tensor([0.3, 0.7]))
        >>> [round(v, 3) for v in p0.tolist()], [round(v, 3) for v in p1.tolist()]
        ([0.25, 0.25], [0.5, 1.0])
        >>> [round(v, 3) for v in va.predict_proba(torch.tensor([0.3, 0.7])).tolist()]
        [0.4, 0.571]
    """

    scores: Tensor
    p0: Tensor
    p1: Tensor

    num_classes: Tensor
    temperature: Tensor

    def __init__(self, *, input: str = "probs", multiclass: str = "top_label") -> None:
        super().__init__()
        self.input = check_input(input)
        self.multiclass = check_option("multiclass", multiclass, MULTICLASS)
        for name in _TABLE:
            self.register_buffer(name, torch.zeros(0, 0, dtype=torch.float64))
        self.register_buffer("num_classes", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("temperature", torch.tensor(1.0, dtype=torch.float64))
        self._init_fitted()

    @property
    def _top_label(self) -> bool:
        return self.multiclass == "top_label" and int(self.num_classes) > 0

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        s, p0, p1 = (state.get(k) for k in _TABLE)
        if s is None or p0 is None or p1 is None:
            return
        fitted = state.get("fitted")
        if s.dim() != 2 or p0.shape != (s.shape[0], s.shape[1] + 1) or p1.shape != p0.shape:
            raise ValueError(
                f"{prefix}p0: expected scores (C, K) and p0, p1 (C, K + 1), got "
                f"{tuple(s.shape)}, {tuple(p0.shape)}, {tuple(p1.shape)}"
            )
        if fitted is not None and bool(fitted) and (s.shape[0] == 0 or s.shape[1] == 0):
            raise ValueError(f"{prefix}scores: a fitted state needs at least one score, got none")
        sd = s.to(torch.float64)
        pad = torch.isposinf(sd)
        finite = torch.isfinite(sd)
        step_ok = (sd[:, 1:] > sd[:, :-1]) | pad[:, 1:]
        if not bool((finite | pad).all() and (pad[:, 1:] >= pad[:, :-1]).all() and step_ok.all()):
            raise ValueError(
                f"{prefix}scores: expected strictly increasing finite scores per row, then "
                f"+inf padding, in the loaded state"
            )
        lo, hi = p0.to(torch.float64), p1.to(torch.float64)
        if not bool(((lo >= 0) & (lo <= 1) & (hi > 0) & (hi <= 1)).all()):
            raise ValueError(
                f"{prefix}p1: expected p0 in [0, 1] and p1 in (0, 1] in the loaded state"
            )
        self._check_shape_state(state, prefix, s.shape[0])

    def _check_shape_state(self, state: Mapping[str, Tensor], prefix: str, rows: int) -> None:
        """``num_classes`` 0 (binary) or >= 2 with the tables ``multiclass`` needs, and a
        finite positive ``temperature``."""
        c, t = state.get("num_classes"), state.get("temperature")
        if c is not None:
            k = int(c.reshape(-1)[0]) if c.numel() == 1 else -1
            tables = 1 if k == 0 or self.multiclass == "top_label" else k
            if c.numel() != 1 or k == 1 or k < 0 or (rows > 0 and rows != tables):
                raise ValueError(
                    f"{prefix}num_classes: expected 0 (binary) or C >= 2 with "
                    f"{'1 table' if self.multiclass == 'top_label' else 'C tables'} "
                    f"(multiclass={self.multiclass!r}), got {c.tolist()} and {rows} tables"
                )
        if t is not None and not (t.numel() == 1 and math.isfinite(float(t)) and float(t) > 0):
            raise ValueError(f"{prefix}temperature: expected a finite T > 0, got {t.tolist()}")

    def _load_from_state_dict(
        self, state_dict: Mapping[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        for name in _TABLE:
            value = state_dict.get(prefix + name)
            if isinstance(value, Tensor):
                empty = torch.empty_like(value, dtype=torch.float64, device=self.scores.device)
                setattr(self, name, empty)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _logits(self, scores: Tensor) -> Tensor:
        """Multiclass scores as float64 logits (``input="probs"``: ``log p``, 0 is ``-inf``)."""
        x = scores.detach().to(torch.float64)
        return x if self.input == "logits" else torch.log(x)

    def _columns(self, scores: Tensor) -> Tensor:
        """The scores the tables are read with: ``(C', N)`` float64 (one row per table)."""
        x = scores.detach().to(torch.float64)
        if x.dim() == 1:
            return x.unsqueeze(0)
        if self._top_label:
            return top_label_scores(self._logits(x), float(self.temperature))[2].unsqueeze(0)
        if self.input == "logits":
            x = torch.log_softmax(x, dim=1)
        return x.T.contiguous()

    def _labels(self, scores: Tensor, target: Tensor) -> Tensor:
        """The 0/1 labels ``(C', N)`` of the tables."""
        y = target.detach().cpu().long()
        if scores.dim() == 1:
            return y.unsqueeze(0)
        if self._top_label:
            top = top_label_scores(self._logits(scores).cpu(), float(self.temperature))[1]
            return (top == y).long().unsqueeze(0)
        return (y.unsqueeze(0) == torch.arange(scores.shape[1]).unsqueeze(1)).long()

    def fit(self, scores: Tensor, target: Tensor) -> NLLFit:
        """Fit on calibration ``scores`` ``(N,)`` / ``(N, C)`` and ``target`` (0/1 labels /
        class indices); returns the NLL of the input and of the merged probability on it
        (top label: the temperature fit's messages are its ``warnings``)."""
        scores, checked = check_scores(scores, target, input=self.input)
        assert checked is not None
        target = checked
        messages: tuple[str, ...] = ()
        with torch.inference_mode(False), torch.no_grad():
            multi = scores.dim() == 2
            self._store("num_classes", float(scores.shape[1]) if multi else 0.0)
            if self._top_label:
                sol = fit_temperature(self._logits(scores), target)
                self._store("temperature", math.exp(sol.log_temperature))
                messages = sol.messages
            else:
                self._store("temperature", 1.0)
            cols = self._columns(scores).cpu()
            tables = [
                venn_abers_table(c, lab) for c, lab in zip(cols, self._labels(scores, target))
            ]
            width = max(t.scores.numel() for t in tables)
            table_s = torch.full((len(tables), width), torch.inf, dtype=torch.float64)
            table_p0 = torch.zeros(len(tables), width + 1, dtype=torch.float64)
            table_p1 = torch.ones(len(tables), width + 1, dtype=torch.float64)
            for r, t in enumerate(tables):
                k = t.scores.numel()
                table_s[r, :k], table_p0[r, : k + 1], table_p1[r, : k + 1] = t
            dev = self.scores.device
            self.scores, self.p0, self.p1 = table_s.to(dev), table_p0.to(dev), table_p1.to(dev)
            self._mark_fitted()
            before = _nll(self._input_proba(scores), target)
            after = _nll(self.predict_proba(scores), target)
        return NLLFit(
            nll_before=before,
            nll_after=after,
            grad_norm=0.0,
            iterations=1,
            converged=True,
            warnings=warn_all(messages, stacklevel=3),
            passes=1,
            method="ivap",
        )

    def _input_proba(self, scores: Tensor) -> Tensor:
        x = scores.detach().to(torch.float64)
        if self.input == "probs":
            return x
        return torch.sigmoid(x) if x.dim() == 1 else torch.softmax(x, dim=1)

    def predict_interval(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        """``(p0, p1)`` (float64): ``(N,)`` each for binary scores, ``(N, C)`` for multiclass
        ones (top label: the bounds of the split, see the class; one-vs-rest: per class, not
        normalised)."""
        scores, p0, p1 = self._table_interval(scores)
        if scores.dim() == 1:
            return p0[0].to(scores.device), p1[0].to(scores.device)
        if self._top_label:
            log_q, top, _ = top_label_scores(self._logits(scores), float(self.temperature))
            lo = top_label_spread(log_q, top, p1[0].to(log_q.device))
            hi = top_label_spread(log_q, top, p0[0].to(log_q.device))
            col = top.unsqueeze(1)
            lo = lo.scatter(1, col, p0.T.to(lo.device))
            return lo, hi.scatter(1, col, p1.T.to(hi.device))
        return p0.T.to(scores.device), p1.T.to(scores.device)

    def _table_interval(self, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The checked ``scores`` and the tables' ``(p0, p1)`` ``(C', N)`` at them."""
        self._check_fitted()
        scores, _ = check_scores(scores, input=self.input)
        c = int(self.num_classes)
        if (scores.dim() == 1) != (c == 0) or (scores.dim() == 2 and scores.shape[1] != c):
            want = "(N,) binary scores" if c == 0 else f"(N, {c}) scores"
            raise ValueError(
                f"scores: expected {want} (as at fit), got shape {tuple(scores.shape)}"
            )
        cols = self._columns(scores).to(self.scores.device)
        hi = torch.searchsorted(self.scores, cols)  # p1: s in (c_{j-1}, c_j]
        at = self.scores.gather(1, hi.clamp(max=self.scores.shape[1] - 1))
        lo = hi + (at == cols).long()  # p0: s in [c_j, c_{j+1})
        return scores, self.p0.gather(1, lo), self.p1.gather(1, hi)

    def predict_proba(self, scores: Tensor) -> Tensor:
        """The merged probability ``p1 / (1 - p0 + p1)`` (float64): ``(N,)`` binary; ``(N, C)``
        multiclass (top label: the merge for the top label, the rest spread; one-vs-rest:
        each row divided by its sum)."""
        if self._top_label:
            scores, p0, p1 = self._table_interval(scores)
            log_q, top, _ = top_label_scores(self._logits(scores), float(self.temperature))
            return top_label_spread(log_q, top, venn_abers_merge(p0, p1)[0].to(log_q.device))
        p0, p1 = self.predict_interval(scores)
        p = venn_abers_merge(p0, p1)
        return p if p.dim() == 1 else p / p.sum(dim=1, keepdim=True)

    def forward(self, scores: Tensor) -> Tensor:
        """:meth:`predict_proba` (Venn-Abers gives probabilities, not logits)."""
        return self.predict_proba(scores)


def _nll(p: Tensor, target: Tensor) -> float:
    """Mean NLL of probabilities ``p`` (``(N,)`` of class 1, or rows) of ``target``."""
    if p.dim() == 1:
        y = target.to(device=p.device, dtype=torch.float64)
        return float(-(torch.xlogy(y, p) + torch.xlogy(1 - y, 1 - p)).mean())
    return float(-p.gather(1, target.to(p.device).long().unsqueeze(1)).log().mean())
