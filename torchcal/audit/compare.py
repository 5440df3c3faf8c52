"""Drift between two audits: :func:`compare` and :class:`Comparison`.

Per group present in both audits: the change in the debiased ECE (intervals from each
report's ECE interval at its ``interval_level``) and in the absolute gap near the threshold
(intervals from each report's gap interval), each through
:func:`~torchcal.functional.decision.drift_from_summaries`; a group is flagged when either got
significantly worse (the 95 % interval of the change lies above 0). A group of the old audit
missing from the new one (renamed?), or one whose estimates are missing on either side, is
*unjudged*: listed, never a silent pass (the CLI exits with the INCONCLUSIVE code). Both
reports are validated by the schema (:func:`~torchcal.audit.report.check_report_dict`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from torchcal.audit._format import display_name
from torchcal.audit.report import AuditReport, load_report_dict
from torchcal.functional.decision import drift_from_summaries

__all__ = ["Comparison", "compare"]

#: settings two reports must share to be compared (docs/design.md section 6c.2)
COMPARED_SETTINGS = ("threshold", "n_bins", "reading")


def check_comparable(
    old: dict[str, Any], new: dict[str, Any], old_name: str, new_name: str
) -> None:
    """``ValueError`` naming both reports when they were made with another threshold, bin
    count or reading (their ECEs and gaps measure different things).

    Example:
        >>> a = {"settings": {"threshold": 0.8, "n_bins": 10, "reading": "binary"}}
        >>> b = {"settings": {"threshold": 0.8, "n_bins": 21, "reading": "binary"}}
        >>> check_comparable(a, b, "old.json", "new.json")
        Traceback (most recent call last):
        ...
        ValueError: --reference: old.json was made with n_bins 10, new.json with 21: the reports measure different things (pass --allow-mismatch to compare them anyway)
    """
    for key in COMPARED_SETTINGS:
        x, y = old["settings"].get(key), new["settings"].get(key)
        if x != y:
            raise ValueError(
                f"--reference: {old_name} was made with {key} {x}, {new_name} with {y}: the "
                f"reports measure different things (pass --allow-mismatch to compare them "
                f"anyway)"
            )


def _as_dict(x: AuditReport | dict[str, Any] | str | os.PathLike[str], name: str) -> dict[str, Any]:
    if isinstance(x, AuditReport):
        x = x.to_dict()
    if not isinstance(x, (dict, str, os.PathLike)):
        raise ValueError(
            f"{name}: expected an AuditReport, a dict or a path, got {type(x).__name__}"
        )
    try:
        return load_report_dict(x)
    except ValueError as e:
        path = isinstance(x, os.PathLike) or (isinstance(x, str) and not x.lstrip().startswith("{"))
        where = f"{os.fspath(x)}: " if path else ""
        raise ValueError(f"{name}: {where}{str(e).removeprefix('source: ')}") from None


def _to_95(ci: list[float], level: float) -> list[float]:
    """An interval at ``level`` rescaled to the 95 % that drift_from_summaries reads."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + level / 2)
    mid, half = (ci[0] + ci[1]) / 2, (ci[1] - ci[0]) / 2
    return [mid - half * 1.959963984540054 / z, mid + half * 1.959963984540054 / z]


def _abs_gap(s: dict[str, Any], level: float) -> dict[str, Any]:
    """``|gap|`` near the threshold with its interval (the gap interval's half-width)."""
    w = s.get("threshold_gap")
    if not w or w.get("gap") is None or not w.get("gap_ci") or None in w["gap_ci"]:
        return {"value": None, "ci": None}
    lo, hi = _to_95(w["gap_ci"], level)
    half = (hi - lo) / 2
    return {"value": abs(w["gap"]), "ci": [abs(w["gap"]) - half, abs(w["gap"]) + half]}


def _ece(s: dict[str, Any], level: float) -> dict[str, Any]:
    if s.get("ece_debiased") is None or not s.get("ece_ci") or None in s["ece_ci"]:
        return {"value": None, "ci": None}
    return {"value": s["ece_debiased"], "ci": _to_95(s["ece_ci"], level)}


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

    @property
    def flagged_names(self) -> list[str]:
        """:attr:`flagged`, escaped for a console line."""
        return [display_name(g) for g in self.flagged]

    @property
    def unjudged(self) -> list[str]:
        """Groups of the old audit missing from the new one, and groups whose ECE or gap
        has no estimate on either side (not judged: never a silent pass)."""
        none = [g for g, d in self.groups.items() if d["ece_delta"] is None
                or (d["gap_old"] is not None or d["gap_new"] is not None) and d["gap_delta"] is None]  # fmt: skip
        return self.only_old + none

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "only_old": self.only_old,
            "only_new": self.only_new,
            "flagged": self.flagged,
            "unjudged": self.unjudged,
        }

    def to_text(self) -> str:
        """A table of the changes; flagged groups are marked ``WORSE``."""

        def f(x: Any) -> str:
            return "n/a" if x is None else f"{x:+.4f}"

        def _v(x: Any) -> str:
            return "n/a" if x is None else f"{x:.4f}"

        def ci(p: Any) -> str:
            return "n/a" if p is None else f"[{p[0]:+.4f}, {p[1]:+.4f}]"

        lines = [
            "group  debiased ECE old -> new  change [95% CI]  |gap| old -> new  change [95% CI]  drift"
        ]
        for g, d in self.groups.items():
            ece = f"{_v(d['ece_old'])} -> {_v(d['ece_new'])}"
            gap = f"{_v(d['gap_old'])} -> {_v(d['gap_new'])}"
            lines.append(
                f"{display_name(g)}  {ece}  {f(d['ece_delta'])} {ci(d['ece_delta_ci'])}  {gap}  "
                f"{f(d['gap_delta'])} {ci(d['gap_delta_ci'])}  {'WORSE' if d['worse'] else 'ok'}"
            )
        for name, only in (("old", self.only_old), ("new", self.only_new)):
            if only:
                lines.append(f"only in the {name} audit: {', '.join(map(display_name, only))}")
        if self.unjudged:
            lines.append(
                "not judged (missing in the new audit or no estimate): "
                + ", ".join(map(display_name, self.unjudged))
            )
        lines.append(f"flagged: {', '.join(self.flagged_names) if self.flagged else 'none'}")
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
    la, lb = a["settings"]["interval_level"], b["settings"]["interval_level"]
    out = {}
    for g in [k for k in b["groups"] if k in a["groups"]]:
        so, sn = a["groups"][g], b["groups"][g]
        de = drift_from_summaries(_ece(so, la), _ece(sn, lb))
        go, gn = _abs_gap(so, la), _abs_gap(sn, lb)
        dg = drift_from_summaries(go, gn)
        out[g] = {
            "ece_old": so.get("ece_debiased"),
            "ece_new": sn.get("ece_debiased"),
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
