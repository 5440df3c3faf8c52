"""Drift between two audits: :func:`compare` and :class:`Comparison`.

Per group present in both audits: the change in ECE (intervals from the bootstrap CIs) and in
the absolute gap near the threshold (intervals from the Wilson interval of the window's
accuracy), each through :func:`~torchcal.functional.decision.drift_from_summaries`; a group
is flagged when either got significantly worse (the 95 % interval of the change lies above 0).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from torchcal.audit.report import AuditReport
from torchcal.functional.decision import drift_from_summaries

__all__ = ["Comparison", "compare"]


def _as_dict(x: AuditReport | dict[str, Any] | str | os.PathLike[str], name: str) -> dict[str, Any]:
    if isinstance(x, AuditReport):
        d = x.to_dict()
    elif isinstance(x, (dict, str, os.PathLike)):
        try:
            d = AuditReport.from_json(x).to_dict()
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from e
    else:
        raise ValueError(
            f"{name}: expected an AuditReport, a dict or a path, got {type(x).__name__}"
        )
    _check_groups(d["groups"], name)
    return d


def _check_groups(groups: Any, name: str) -> None:
    """A clear error (not a KeyError) when a report's groups lack what :func:`compare` reads."""
    if not isinstance(groups, dict):
        raise ValueError(f"{name}: expected 'groups' to map names to summaries, got {groups!r:.60}")
    for g, s in groups.items():
        if not isinstance(s, dict):
            raise ValueError(f"{name}: group {g!r}: expected a summary mapping, got {s!r:.60}")
        w = s.get("threshold_gap")
        need = [k for k in ("ece", "ece_ci", "threshold_gap") if k not in s]
        if isinstance(w, dict):
            need += [k for k in ("gap", "confidence", "accuracy_ci") if k not in w]
        elif w is not None:
            raise ValueError(f"{name}: group {g!r}: expected threshold_gap null or a mapping")
        if need:
            raise ValueError(f"{name}: group {g!r} has no {need[0]!r} entry")


def _abs_gap(s: dict[str, Any]) -> dict[str, Any]:
    """``|gap|`` near the threshold with an interval from the accuracy's Wilson interval."""
    w = s.get("threshold_gap")
    if not w or w["gap"] is None or None in w["accuracy_ci"]:
        return {"value": None, "ci": None}
    lo, hi = w["confidence"] - w["accuracy_ci"][1], w["confidence"] - w["accuracy_ci"][0]
    return {
        "value": abs(w["gap"]),
        "ci": [abs(w["gap"]) - (hi - lo) / 2, abs(w["gap"]) + (hi - lo) / 2],
    }


def _ece(s: dict[str, Any]) -> dict[str, Any]:
    return {"value": s["ece"], "ci": s["ece_ci"]}


@dataclass(eq=False)
class Comparison:
    """Per-group drift between two audits.

    Attributes:
        groups: ``{name: {ece_old, ece_new, ece_delta, ece_delta_ci, gap_old, gap_new,
            gap_delta, gap_delta_ci, worse}}`` for the groups in both (``gap`` = ``|gap|``
            near the threshold, ``None`` without one).
        only_old, only_new: groups in one audit only.
        flagged: the groups whose calibration got significantly worse.
    """

    groups: dict[str, dict[str, Any]]
    only_old: list[str] = field(default_factory=list)
    only_new: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> list[str]:
        return [g for g, d in self.groups.items() if d["worse"]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "only_old": self.only_old,
            "only_new": self.only_new,
            "flagged": self.flagged,
        }

    def to_text(self) -> str:
        """A table of the changes; flagged groups are marked ``WORSE``."""

        def f(x: Any) -> str:
            return "n/a" if x is None else f"{x:+.4f}"

        def _v(x: Any) -> str:
            return "n/a" if x is None else f"{x:.4f}"

        def ci(p: Any) -> str:
            return "n/a" if p is None else f"[{p[0]:+.4f}, {p[1]:+.4f}]"

        lines = ["group  ECE old -> new  change [95% CI]  |gap| old -> new  change [95% CI]  drift"]
        for g, d in self.groups.items():
            ece = f"{_v(d['ece_old'])} -> {_v(d['ece_new'])}"
            gap = f"{_v(d['gap_old'])} -> {_v(d['gap_new'])}"
            lines.append(
                f"{g}  {ece}  {f(d['ece_delta'])} {ci(d['ece_delta_ci'])}  {gap}  "
                f"{f(d['gap_delta'])} {ci(d['gap_delta_ci'])}  {'WORSE' if d['worse'] else 'ok'}"
            )
        for name, only in (("old", self.only_old), ("new", self.only_new)):
            if only:
                lines.append(f"only in the {name} audit: {', '.join(only)}")
        lines.append(f"flagged: {', '.join(self.flagged) if self.flagged else 'none'}")
        return "\n".join(lines) + "\n"


def compare(
    old: AuditReport | dict[str, Any] | str | os.PathLike[str],
    new: AuditReport | dict[str, Any] | str | os.PathLike[str],
) -> Comparison:
    """Compare two audits group by group (see the module docstring).

    Example:
        >>> import torch
        >>> from torchcal.audit import audit
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(3000, generator=g, dtype=torch.float64)
        >>> y = (torch.rand(3000, generator=g, dtype=torch.float64) < p).long()
        >>> y2 = (torch.rand(3000, generator=g, dtype=torch.float64) < p ** 3).long()
        >>> compare(audit(p, y, threshold=0.8), audit(p, y2, threshold=0.8)).flagged
        ['all']
    """
    a, b = _as_dict(old, "old"), _as_dict(new, "new")
    out = {}
    for g in [k for k in b["groups"] if k in a["groups"]]:
        so, sn = a["groups"][g], b["groups"][g]
        de = drift_from_summaries(_ece(so), _ece(sn))
        go, gn = _abs_gap(so), _abs_gap(sn)
        dg = drift_from_summaries(go, gn)
        out[g] = {
            "ece_old": so["ece"],
            "ece_new": sn["ece"],
            "ece_delta": de["delta"],
            "ece_delta_ci": de["delta_ci"],
            "gap_old": go["value"],
            "gap_new": gn["value"],
            "gap_delta": dg["delta"],
            "gap_delta_ci": dg["delta_ci"],
            "worse": bool(de["worse"] or dg["worse"]),
        }
    only_old = [k for k in a["groups"] if k not in b["groups"]]
    only_new = [k for k in b["groups"] if k not in a["groups"]]
    return Comparison(out, only_old, only_new)
