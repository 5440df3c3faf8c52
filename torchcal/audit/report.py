"""The audit's result, :class:`AuditReport`, and its stable JSON schema.

``report.json`` (``schema_version: 1``; NaN and infinite numbers are written as ``null``)::

    {
      "schema_version": 1,
      "verdict": "pass" | "fail",
      "settings": {input, reading, n_bins, threshold, tolerance, cost_error, cost_escalation,
                   seed, n_rows, sample_size, bootstrap, min_group, grouped},
      "warnings": [str],
      "pooled": SUMMARY,
      "groups": {name: SUMMARY},          # {"all": ...} without groups
      "temperature": null | {pooled_T, group_T {name: T}, n_fit, n_eval, rows, clamped,
                             eval_before, eval_after, eval_after_pooled}
    }

    SUMMARY = {
      "n": int, "ece": float, "ece_ci": [lo, hi] | null, "ece_debiased": float,
      "mce": float, "brier": float,
      "brier_decomposition": {reliability, resolution, uncertainty, within_bin_variance,
                              within_bin_covariance},
      "nll": float, "nll_infinite": bool, "accuracy": float,
      "threshold_window": [lo, hi] | null,
      "threshold_gap": {n, confidence, accuracy, gap, accuracy_ci [lo, hi]} | null,
      "verdict": "pass" | "fail", "reasons": [str],
      "table": [{bin, lo, hi, n, confidence, accuracy, gap, ci_lo, ci_hi}],  # non-empty bins
      "cost": {threshold, n_automated, errors, error_rate, error_rate_ci, cost_per_item,
               naive_threshold}                                # only with costs
    }

    eval_* = {"verdict", "pooled": {n, ece, threshold_gap, verdict, reasons},
              "groups": {name: {n, ece, threshold_gap, verdict, reasons}}}

Meaning: ``reading`` is ``"binary"`` (P(y=1) against y; ``accuracy`` is that of the decision
``p >= 0.5``) or ``"confidence"`` (max probability against correct; ``accuracy`` is top-1).
``ece`` is the equal-width L1 ECE, ``ece_ci`` its 95 % bootstrap interval, ``ece_debiased``
the debiased L2 error (Kumar et al. 2019), ``mce`` the largest bin gap, ``brier`` the Brier
score of the reading with its exact Murphy decomposition, ``nll`` the mean log loss (binary:
of P(y=1); multiclass: of the class probabilities). ``threshold_window`` is the bin holding
the threshold and its lower neighbour; ``threshold_gap.gap = confidence - accuracy`` there
(> 0: over-confident), ``accuracy_ci`` a 95 % Wilson interval. ``verdict`` fails when
``|gap| > tolerance`` in the window (or the window is empty); without a threshold when
``ece > tolerance``; the pooled verdict fails when a group fails.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchcal.audit._format import report_markdown, report_text
from torchcal.audit._sample import sample_ece, table_of

__all__ = ["SCHEMA_VERSION", "AuditReport"]

SCHEMA_VERSION = 1


def _strict(x: Any) -> Any:
    """NaN/inf -> None, recursively (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    return x


@dataclass(eq=False)
class AuditReport:
    """What :func:`~torchcal.audit.audit` found (see the module docstring for the schema).

    Attributes:
        verdict: ``"pass"`` or ``"fail"``.
        pooled: the summary over all rows.
        groups: one summary per group name (``{"all": ...}`` without groups).
        settings: the options and sizes of the audit.
        warnings: human-readable warnings (small groups, infinite NLL, clamped logits).
        temperature: the temperature fit and its held-out evaluation, or ``None``.
        sample: the kept rows: ``preds`` (float64, as given), ``target``, ``group`` tensors
            and ``names`` (empty tensors for a report read from JSON).

    Example:
        >>> import torch
        >>> from torchcal.audit import audit
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(500, generator=g, dtype=torch.float64)
        >>> y = (torch.rand(500, generator=g, dtype=torch.float64) < p).long()
        >>> r = audit(p, y)
        >>> AuditReport.from_json(r.to_json()).pooled == r.to_dict()["pooled"]
        True
    """

    verdict: str
    pooled: dict[str, Any]
    groups: dict[str, dict[str, Any]]
    settings: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    temperature: dict[str, Any] | None = None
    sample: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict (schema of the module docstring; no sample)."""
        return _strict(
            {
                "schema_version": SCHEMA_VERSION,
                "verdict": self.verdict,
                "settings": self.settings,
                "warnings": list(self.warnings),
                "pooled": self.pooled,
                "groups": self.groups,
                "temperature": self.temperature,
            }
        )

    def to_json(self, indent: int | None = 2) -> str:
        """``report.json``'s text (strict JSON)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, source: str | os.PathLike[str] | dict[str, Any]) -> AuditReport:
        """Read a report from a path, a JSON string or a dict (for ``compare``); the sample
        is not stored in JSON, so it comes back empty."""
        if isinstance(source, dict):
            d = source
        else:
            text = str(source)
            if isinstance(source, os.PathLike) or not text.lstrip().startswith("{"):
                text = Path(source).read_text(encoding="utf-8")
            d = json.loads(text)
        if not isinstance(d, dict) or d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"source: expected an audit report with schema_version {SCHEMA_VERSION}, "
                f"got {d.get('schema_version') if isinstance(d, dict) else type(d).__name__!r}"
            )
        for key in ("verdict", "settings", "pooled", "groups"):
            if key not in d:
                raise ValueError(f"source: the report has no {key!r} entry")
        return cls(
            d["verdict"],
            d["pooled"],
            d["groups"],
            d["settings"],
            list(d.get("warnings", [])),
            d.get("temperature"),
            {},
        )

    def to_text(self) -> str:
        """Console output: pooled and per-group tables, metrics, verdict and reasons."""
        return report_text(self.to_dict())

    def to_markdown(self) -> str:
        """``report.md``: the same content as markdown tables."""
        return report_markdown(self.to_dict())

    def to_html(self) -> str:
        """The self-contained interactive page (:func:`torchcal.audit.html.render_html`)."""
        from torchcal.audit.html import render_html

        return render_html(self)

    def save(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Write ``report.json``, ``report.md``, ``report.txt``, ``report.html`` and the
        reliability diagrams (``reliability_pooled.png``, ``reliability_<group>.png``; skipped
        with a warning when matplotlib is missing) into ``directory``; returns the paths."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, text in (
            ("report.json", self.to_json()),
            ("report.md", self.to_markdown()),
            ("report.txt", self.to_text()),
            ("report.html", self.to_html()),
        ):
            (out / name).write_text(text, encoding="utf-8")
            paths.append(out / name)
        return paths + _save_diagrams(self, out)

    def ece_at(self, temperature: float = 1.0, n_bins: int = 10, group: str | None = None) -> float:
        """L1 equal-width ECE of the kept sample after dividing its logits by ``temperature``
        (probabilities are turned into logits first: binary ``log p - log1p(-p)``,
        multiclass ``log p``; at ``temperature == 1`` they are binned as given, as in the
        report), for ``group`` (a name) or pooled (``None``): the reference
        the HTML sliders match.

        Example:
            >>> import torch
            >>> from torchcal.audit import audit
            >>> g = torch.Generator().manual_seed(0)
            >>> p = torch.rand(500, generator=g, dtype=torch.float64)
            >>> y = (torch.rand(500, generator=g, dtype=torch.float64) < p).long()
            >>> r = audit(p, y, n_bins=10)
            >>> abs(r.ece_at(1.0, 10) - r.pooled["ece"]) < 1e-12
            True
        """
        return sample_ece(self, temperature, n_bins, group)


def _save_diagrams(report: AuditReport, out: Path) -> list[Path]:
    """Reliability diagrams of the pooled and per-group tables (PNG, via torchcal.plotting)."""
    if importlib.util.find_spec("matplotlib") is None:
        warnings.warn(
            "save: matplotlib is not installed; no PNG diagrams", UserWarning, stacklevel=3
        )
        return []
    from torchcal.plotting import table_figure

    paths = []
    items = [("pooled", report.pooled)] + [(f"group_{k}", v) for k, v in report.groups.items()]
    if not report.settings.get("grouped"):
        items = items[:1]
    for i, (name, summary) in enumerate(items):
        if not summary["n"]:
            continue
        fig = table_figure(table_of(summary, report.settings["n_bins"], report.settings["reading"]))
        fig.axes[0].set_title(f"{name}: ECE {summary['ece']:.4f}, n={summary['n']}", fontsize=9)
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name) or f"group{i}"
        path = out / f"reliability_{safe}.png"
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths
