"""The audit's result, :class:`AuditReport`, and its stable JSON schema.

``report.json`` (``schema_version: 2``; NaN and infinite numbers are written as ``null``)::

    {
      "schema_version": 2,
      "verdict": "pass" | "fail" | "inconclusive",
      "reasons": [str],                   # the overall verdict's reasons, one per row named
      "settings": {input, reading, n_bins, threshold, tolerance, rule ("threshold_gap" |
                   "ece"), alpha, interval_level (= 1 - 2 alpha), power, family (rows in the
                   Holm family), cost_error, cost_escalation, seed, n_rows, saturated (rows
                   with a probability exactly 0 or 1), sample_size, min_group, grouped,
                   confidences: CONCENTRATION},
      "warnings": [str],
      "read": {} | {rows, excluded: [{column, reason, count, where, text}], blank_lines,
               percent: {column: n}},   # the reader's log (torchcal.audit.io.ReadLog)
      "diagrams": {name: file name} | {},  # written by save(); "pooled", then the groups
                                          # (a group named "pooled" under "group:pooled")
      "pooled": SUMMARY,
      "groups": {name: SUMMARY},          # {"all": ...} without groups (the pooled row)
      "temperature": null | {pooled_T, group_T {name: T}, n_fit, n_eval, rows, clamped,
                             eval_before, eval_after, eval_after_pooled}
    }

    SUMMARY = {
      "n": int, "ece": float, "ece_debiased": float, "ece_debiased_clipped": bool,
      "ece_ci": [lo, hi], "ece_test": TEST,
      "mce": float, "brier": float,
      "brier_decomposition": {reliability, resolution, uncertainty, within_bin_variance,
                              within_bin_covariance},
      "nll": float | null, "nll_infinite": bool, "nll_infinite_rows": int,
      "nll_finite_rows": float | null, "accuracy": float,
      "threshold_window": [lo, hi] | null,
      "threshold_gap": {n, confidence, accuracy, gap, accuracy_ci [lo, hi], gap_ci [lo, hi],
                        TEST...} | null,
      "verdict": "pass" | "fail" | "inconclusive", "reasons": [str],
      "resolution": RESOLUTION | null,   # the fine histogram's (null without one: a note)
      "table": [{bin, lo, hi, n, confidence, accuracy, gap, ci_lo, ci_hi}],  # non-empty bins
      "cost": {threshold, n_automated, errors, error_rate, error_rate_ci, cost_per_item,
               naive_threshold}                                # only with costs
    }
    TEST = {p_pass, p_fail, p_fail_holm, detectable}
    RESOLUTION = {ecce, ecce_sigma (ECCE / sigma), ecce_scale (sigma), ecce_pvalue, ecce_bound
                  (exact ECCE in [ecce, ecce + bound]), distinct, distinct_exact, top_value,
                  top_share, auroc, auroc_ci [lo, hi], auroc_se, separates (lo > 0.5)}
    CONCENTRATION = {distinct, top_value, top_share, min, max, iqr, grid, grid_bins}

    eval_* = {"verdict", "pooled": {n, ece, ece_debiased, ece_ci, threshold_gap, verdict,
              reasons}, "groups": {name: {...the same}}}

Meaning: ``reading`` is ``"binary"`` (P(y=1) against y: ``accuracy`` in the tables and in
``threshold_gap`` is the observed **positive rate**; the summary's ``accuracy`` is that of
the decision ``p >= 0.5``) or ``"confidence"`` (max probability against correct; top-1
accuracy). ``ece`` is the plug-in equal-width L1 ECE (biased upward by about
``sqrt(bins / n)``), ``ece_debiased`` the bias-corrected estimate of
:func:`~torchcal.functional.verdict.ece_test_from_stats` (``ece_debiased_clipped``: the
correction went below 0 and the estimate says 0), ``ece_ci`` its ``interval_level``
interval (inside [0, 1]), ``mce`` the largest bin gap, ``brier`` the Brier score with its
exact Murphy decomposition, ``nll`` the mean log loss (``null`` with ``nll_infinite`` when a
label got probability 0: ``nll_finite_rows`` is the mean over the other rows).
``threshold_window`` is the bin holding the threshold and its lower neighbour;
``threshold_gap.gap = confidence - accuracy`` there (> 0: over-confident), ``accuracy_ci`` a
95 % Wilson interval, ``gap_ci`` the ``interval_level`` interval the verdict uses.
``TEST``: ``p_pass`` (equivalence: |gap| or ECE < tolerance), ``p_fail`` (and Holm-adjusted
over the family), ``detectable`` (the gap / ECE a FAIL finds with probability ``power``).
Verdict (``rule``): PASS when ``p_pass <= alpha`` (the interval inside the tolerance), FAIL
when ``p_fail_holm <= alpha`` (outside), else INCONCLUSIVE; the report FAILs when any row
does and PASSes when all do.
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

from torchcal.audit._format import CONSOLE_GROUPS, report_markdown, report_text, worst_groups
from torchcal.audit._sample import sample_ece, table_of

__all__ = ["AuditReport"]

SCHEMA_VERSION = 2
#: groups up to which report.json is indented (compact above: speed and size)
INDENT_GROUPS = 1000

#: diagrams drawn by :meth:`AuditReport.save` by default: the pooled one and the worst groups
MAX_DIAGRAMS = 20


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
        verdict: ``"pass"``, ``"fail"`` or ``"inconclusive"``.
        pooled: the summary over all rows.
        groups: one summary per group name (``{"all": ...}`` without groups).
        settings: the options and sizes of the audit.
        warnings: human-readable warnings (small groups, infinite NLL, clamped logits).
        temperature: the temperature fit and its held-out evaluation, or ``None``.
        sample: the kept rows: ``preds`` (float64, as given), ``target``, ``group`` tensors
            and ``names`` (empty tensors for a report read from JSON).
        reasons: the overall verdict's reasons (each row's, named).
        read_log: what the reader did (rows, excluded rows per reason with the first one,
            percents read), as ``ReadLog.to_dict()`` of :mod:`torchcal.audit.io`.
        diagrams: the PNG file of each diagram written by :meth:`save` (name -> file; a group
            whose name is taken, ``pooled``, is listed as ``group:pooled``).

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
    reasons: list[str] = field(default_factory=list)
    read_log: dict[str, Any] = field(default_factory=dict)
    diagrams: dict[str, str] = field(default_factory=dict)
    segments: dict[str, Any] | None = None  # with --segments (docs/design.md 6g.1)

    def _raw(self) -> dict[str, Any]:
        extra = {} if self.segments is None else {"segments": self.segments}
        return {
            "schema_version": SCHEMA_VERSION,
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "settings": self.settings,
            "warnings": list(self.warnings),
            "read": self.read_log,
            "diagrams": self.diagrams,
            "pooled": self.pooled,
            "groups": self.groups,
            "temperature": self.temperature,
            **extra,
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict (schema of the module docstring; no sample)."""
        return _strict(self._raw())

    def to_json(self, indent: int | None | str = "auto") -> str:
        """``report.json``'s text (strict JSON). ``indent="auto"``: 2 for up to
        :data:`INDENT_GROUPS` groups, else compact (json's C encoder: a 100k-group report is
        written in seconds instead of a minute)."""
        if indent == "auto":
            indent = 2 if len(self.groups) <= INDENT_GROUPS else None
        try:  # the summaries hold no NaN: no deep copy needed
            return json.dumps(self._raw(), indent=indent, allow_nan=False)  # type: ignore[arg-type]
        except ValueError:
            return json.dumps(self.to_dict(), indent=indent, allow_nan=False)  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, source: str | os.PathLike[str] | dict[str, Any]) -> AuditReport:
        """Read a report from a path, a JSON string or a dict (for ``compare``), validated by
        the schema (:func:`check_report_dict`: a wrong type, a NaN or a missing number is a
        ``ValueError`` naming the entry); the sample is not stored in JSON, so it comes back
        empty."""
        d = load_report_dict(source)
        return cls(
            d["verdict"],
            d["pooled"],
            d["groups"],
            d["settings"],
            list(d.get("warnings", [])),
            d.get("temperature"),
            {},
            list(d.get("reasons", [])),
            dict(d.get("read") or {}),
            dict(d.get("diagrams") or {}),
            d.get("segments"),
        )

    def to_text(self, console: bool = False) -> str:
        """Pooled and per-group tables, metrics, verdict and reasons (``report.txt``);
        ``console=True``: the worst :data:`~torchcal.audit._format.CONSOLE_GROUPS` groups,
        reasons and warnings, and how many more the files hold (100,000 groups would print
        tens of MB)."""
        return report_text(self.to_dict(), CONSOLE_GROUPS if console else None)

    def to_markdown(self) -> str:
        """``report.md``: the same content as markdown tables."""
        return report_markdown(self.to_dict())

    def to_html(self) -> str:
        """The self-contained interactive page (:func:`torchcal.audit.html.render_html`)."""
        from torchcal.audit.html import render_html

        return render_html(self)

    def save(
        self, directory: str | os.PathLike[str], max_diagrams: int | None = MAX_DIAGRAMS
    ) -> list[Path]:
        """Write ``report.json``, ``report.md``, ``report.txt``, ``report.html`` and the
        reliability diagrams (the pooled one and the worst groups, at most ``max_diagrams``
        in all, ``None``: every group; file names by :func:`diagram_files`, the mapping in
        ``report.json["diagrams"]``; skipped with a warning when matplotlib is missing) into
        ``directory``; returns the paths written."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        if max_diagrams is not None and (
            isinstance(max_diagrams, bool) or not isinstance(max_diagrams, int) or max_diagrams < 0
        ):
            raise ValueError(
                f"max_diagrams: expected an integer >= 0 or None, got {max_diagrams!r}"
            )
        has_mpl = importlib.util.find_spec("matplotlib") is not None
        self.diagrams = diagram_files(self, max_diagrams) if has_mpl else {}
        if not has_mpl:
            warnings.warn(
                "save: matplotlib is not installed; no PNG diagrams", UserWarning, stacklevel=2
            )
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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (the report's JSON is strict)")


def load_report_dict(source: str | os.PathLike[str] | dict[str, Any]) -> dict[str, Any]:
    """The report dict of a path, a JSON string or a dict, checked by :func:`check_report_dict`;
    every failure (unreadable file, invalid or too deeply nested JSON, a schema violation) is a
    ``ValueError`` whose message starts with ``source:``."""
    if isinstance(source, dict):
        d: Any = source
    else:
        text = str(source)
        try:
            if isinstance(source, os.PathLike) or not text.lstrip().startswith("{"):
                text = Path(source).read_text(encoding="utf-8")
            d = json.loads(text, parse_constant=_reject_constant)
        except RecursionError:
            raise ValueError(
                "source: the JSON is nested too deeply to be an audit report"
            ) from None
        except (OSError, UnicodeDecodeError, ValueError) as e:
            msg = " ".join(str(e).split())[:200]
            raise ValueError(f"source: not a readable audit report.json ({msg})") from None
    try:
        check_report_dict(d)
    except RecursionError:
        raise ValueError("source: the JSON is nested too deeply to be an audit report") from None
    return d


_VERDICT_NAMES = ("pass", "fail", "inconclusive")


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _need_num(x: Any, where: str, lo: float = -math.inf, hi: float = math.inf) -> None:
    if not _is_num(x) or not lo <= x <= hi:
        raise ValueError(
            f"source: {where}: expected a finite number in [{lo:g}, {hi:g}], got {x!r:.60}"
        )


def _need_int(x: Any, where: str) -> None:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise ValueError(f"source: {where}: expected a count (an integer >= 0), got {x!r:.60}")


def _need_pair(x: Any, where: str, lo: float = 0.0, hi: float = 1.0) -> None:
    """An interval ``[a, b]`` with ``lo <= a <= b <= hi`` (an ECE's or a rate's in [0, 1], a
    gap's in [-1, 1]: ``[-1e300, 1e300]`` is no interval of either)."""
    if (not isinstance(x, list) or len(x) != 2 or not all(_is_num(v) for v in x)
            or not lo <= x[0] <= x[1] <= hi):  # fmt: skip
        raise ValueError(
            f"source: {where}: expected [lo, hi] with {lo:g} <= lo <= hi <= {hi:g}, got {x!r:.60}"
        )


def _check_summary(s: Any, where: str, threshold: Any) -> None:
    if not isinstance(s, dict):
        raise ValueError(f"source: {where}: expected a summary mapping, got {s!r:.60}")
    _need_int(s.get("n"), f"{where}.n")
    if s.get("verdict") not in _VERDICT_NAMES:
        raise ValueError(
            f"source: {where}.verdict: expected one of {_VERDICT_NAMES}, got {s.get('verdict')!r:.60}"
        )
    if s["n"] > 0:
        _need_num(s.get("ece"), f"{where}.ece", 0, 1)
        _need_num(s.get("ece_debiased"), f"{where}.ece_debiased", 0, 1)
        _need_pair(s.get("ece_ci"), f"{where}.ece_ci")
    w = s.get("threshold_gap", "missing")
    if threshold is None:
        if w is not None:
            raise ValueError(
                f"source: {where}.threshold_gap: expected null (no threshold), got {w!r:.60}"
            )
        return
    if not isinstance(w, dict):
        raise ValueError(
            f"source: {where}.threshold_gap: expected a mapping (a threshold was set), got {w!r:.60}"
        )
    _need_int(w.get("n"), f"{where}.threshold_gap.n")
    if w["n"] > 0:
        for k in ("gap", "confidence"):
            _need_num(w.get(k), f"{where}.threshold_gap.{k}", -1, 1)
        _need_pair(w.get("gap_ci"), f"{where}.threshold_gap.gap_ci", -1.0)
        _need_pair(w.get("accuracy_ci"), f"{where}.threshold_gap.accuracy_ci")


def check_report_dict(d: Any) -> None:
    """``ValueError`` (``source: ENTRY: expected ..., got ...``) unless ``d`` is an audit
    report dict of this schema version with every number :func:`~torchcal.audit.compare`
    and the renderings read present and finite (a group with ``n = 0`` may have ``null``
    estimates: JSON writes NaN as ``null``)."""
    if not isinstance(d, dict):
        raise ValueError(
            f"source: expected an audit report (a JSON object), got {type(d).__name__}"
        )
    v = d.get("schema_version")
    if v != SCHEMA_VERSION or isinstance(v, bool):
        hint = " (written by an older torchcal: re-run the audit)" if v == 1 else ""
        raise ValueError(
            f"source: expected an audit report with schema_version {SCHEMA_VERSION}, got {v!r:.40}{hint}"
        )
    for key in ("verdict", "settings", "pooled", "groups"):
        if key not in d:
            raise ValueError(f"source: the report has no {key!r} entry")
    if d["verdict"] not in _VERDICT_NAMES:
        raise ValueError(
            f"source: verdict: expected one of {_VERDICT_NAMES}, got {d['verdict']!r:.60}"
        )
    st = d["settings"]
    if not isinstance(st, dict):
        raise ValueError(f"source: settings: expected a mapping, got {st!r:.60}")
    n_bins = st.get("n_bins")
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or not 1 <= n_bins <= 10_000:
        raise ValueError(
            f"source: settings.n_bins: expected an integer in [1, 10000], got {n_bins!r:.60}"
        )
    t = st.get("threshold", "missing")
    if t is not None:
        _need_num(t, "settings.threshold", 0, 1)
    _need_num(st.get("tolerance"), "settings.tolerance", 0, 1)
    _need_num(st.get("interval_level"), "settings.interval_level", 0, 1)
    _check_summary(d["pooled"], "pooled", t)
    groups = d["groups"]
    if not isinstance(groups, dict) or not groups:
        raise ValueError(
            f"source: groups: expected a mapping of names to summaries, got {groups!r:.60}"
        )
    for name, s in groups.items():
        _check_summary(s, f"groups[{name!r:.80}]", t)


def diagram_files(report: AuditReport, max_diagrams: int | None = MAX_DIAGRAMS) -> dict[str, str]:
    """The PNG file of each diagram :meth:`AuditReport.save` draws: ``"pooled"`` ->
    ``reliability_pooled.png``, then the groups with items, **worst first** (FAIL, then
    INCONCLUSIVE, then PASS; within each, the largest |gap| near the threshold or debiased
    ECE first), at most ``max_diagrams`` in all (``None``: every group). A group's file is
    ``reliability_group_<i>_<name>.png`` with ``i`` its position in the report and the name
    reduced to at most 40 of ``[A-Za-z0-9._-]``: collision-free (``a/b``, ``a.b``, ``a b``
    and ``a_b`` get different files) and short (a name of any length fits a file system)."""
    out = {"pooled": "reliability_pooled.png"} if report.pooled.get("n") else {}
    if not report.settings.get("grouped"):
        return out
    budget = None if max_diagrams is None else max(max_diagrams - len(out), 0)
    chosen = worst_groups(report.groups, budget)
    width = len(str(max(len(report.groups) - 1, 0)))
    index = {k: i for i, k in enumerate(report.groups)}
    for name in sorted(chosen, key=index.__getitem__):
        slug = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)
        key = name
        while key in out:  # a group named "pooled" never takes the pooled diagram's entry
            key = "group:" + key
        out[key] = f"reliability_group_{index[name]:0{width}d}_{slug[:40]}.png"
    return out


def _save_diagrams(report: AuditReport, out: Path) -> list[Path]:
    """Reliability diagrams of ``report.diagrams`` (PNG, via torchcal.plotting)."""
    if not report.diagrams:
        return []
    import matplotlib.pyplot as plt

    from torchcal.audit._format import display_name
    from torchcal.plotting import table_figure

    paths = []
    names = list(report.groups)
    for file in report.diagrams.values():
        if file == "reliability_pooled.png":
            label, summary = "pooled", report.pooled
        else:  # reliability_group_<index>_<slug>.png: the index names the group
            name = names[int(file.split("_")[2])]
            label, summary = f"group {display_name(name, 40)}", report.groups[name]
        fig = table_figure(table_of(summary, report.settings["n_bins"], report.settings["reading"]))
        fig.axes[0].set_title(
            f"{label}: {summary.get('verdict', '').upper()}, ECE "
            f"{'n/a' if summary['ece'] is None else format(summary['ece'], '.4f')}, "
            f"n={summary['n']}",
            fontsize=9,
        )
        path = out / file
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
