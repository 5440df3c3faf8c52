"""torchcal.audit.compare on generated shifts: a drifted group is flagged, a stable one not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchcal.audit import AuditReport, Comparison, audit, compare


def month(n: int, seed: int, k_b: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Groups 'stable' (calibrated) and 'shifting' (stated = sigmoid(k_b * logit p))."""
    rng = np.random.default_rng(seed)
    p = rng.beta(2.0, 2.0, 2 * n)
    y = rng.random(2 * n) < p
    grp = np.arange(2 * n) % 2
    z = np.log(p) - np.log1p(-p)
    stated = 1 / (1 + np.exp(-np.where(grp == 1, k_b, 1.0) * z))
    return torch.from_numpy(stated), torch.from_numpy(y).long(), torch.from_numpy(grp)


def _audit(seed: int, k_b: float) -> AuditReport:
    p, y, g = month(1500, seed, k_b)
    return audit(p, y, groups=g, group_names=["stable", "shifting"], threshold=0.8, seed=seed)


@pytest.mark.parametrize("seed", range(5))
def test_drifted_group_flagged_stable_not(seed: int) -> None:
    old, new = _audit(100 + seed, 1.0), _audit(200 + seed, 2.2)
    c = compare(old, new)
    assert isinstance(c, Comparison)
    assert c.flagged == ["shifting"]
    d = c.groups["shifting"]
    assert d["ece_delta"] == pytest.approx(d["ece_new"] - d["ece_old"])
    assert d["ece_delta_ci"][0] > 0 and d["worse"]
    assert c.groups["stable"]["worse"] is False


def test_no_drift_no_flag_and_improvement_not_flagged() -> None:
    flags = [compare(_audit(300 + s, 1.0), _audit(400 + s, 1.0)).flagged for s in range(6)]
    assert sum(bool(f) for f in flags) <= 1  # two 95 % tests per group, two groups
    assert compare(_audit(1, 2.2), _audit(2, 1.0)).flagged == []


def test_inputs_paths_dicts_text_and_missing_groups(tmp_path) -> None:
    old, new = _audit(1, 1.0), _audit(2, 2.2)
    (tmp_path / "old.json").write_text(old.to_json())
    by_path = compare(tmp_path / "old.json", new.to_dict())
    assert by_path.to_dict() == compare(old, new).to_dict()
    p, y, g = month(400, 3, 1.0)
    third = audit(p, y, groups=g, group_names=["stable", "other"], threshold=0.8)
    c = compare(old, third)
    assert list(c.groups) == ["stable"] and c.only_old == ["shifting"] and c.only_new == ["other"]
    text = compare(old, new).to_text()
    assert "shifting" in text and "WORSE" in text and "flagged: shifting" in text
    with pytest.raises(ValueError, match="^old"):
        compare('{"schema_version": 2}', new)
    with pytest.raises(ValueError, match="^new"):
        compare(old, 3)  # type: ignore[arg-type]


def _summary(ece, ece_ci, gap, acc_ci, conf=0.8):
    w = None
    if gap is not None:
        w = {"n": 100, "confidence": conf, "accuracy": conf - gap, "gap": gap,
             "accuracy_ci": acc_ci}  # fmt: skip
    return {"n": 100, "ece": ece, "ece_ci": ece_ci, "threshold_gap": w}


def _report(groups):
    return {"schema_version": 1, "verdict": "pass", "settings": {}, "pooled": {},
            "groups": groups}  # fmt: skip


def test_hand_worked_drift_each_test_flags_alone():
    """|gap| (not the signed gap) with the Wilson half-width as its interval; a group is
    flagged when the ECE alone or the gap alone got significantly worse."""
    old = _report({
        "under": _summary(0.05, [0.04, 0.06], -0.10, [0.85, 0.95]),  # under-confident
        "ece_only": _summary(0.02, [0.01, 0.03], 0.01, [0.75, 0.83]),
        "gap_only": _summary(0.05, [0.03, 0.07], 0.01, [0.75, 0.83]),
        "empty": _summary(None, None, None, None),
    })  # fmt: skip
    new = _report({
        "under": _summary(0.05, [0.04, 0.06], 0.02, [0.74, 0.82]),
        "ece_only": _summary(0.08, [0.07, 0.09], 0.01, [0.75, 0.83]),
        "gap_only": _summary(0.05, [0.03, 0.07], 0.15, [0.61, 0.69]),
        "empty": _summary(None, None, None, None),
    })  # fmt: skip
    c = compare(old, new)
    u = c.groups["under"]
    assert u["gap_old"] == pytest.approx(0.10) and u["gap_new"] == pytest.approx(0.02)
    assert u["gap_delta"] == pytest.approx(-0.08) and u["ece_delta"] == pytest.approx(0.0)
    half = 1.96 * np.hypot(0.05 / 1.96, 0.04 / 1.96)  # Wilson half-widths 0.05 and 0.04
    assert u["gap_delta_ci"] == pytest.approx([-0.08 - half, -0.08 + half])
    assert c.groups["ece_only"]["gap_delta"] == pytest.approx(0.0)
    assert c.groups["gap_only"]["ece_delta"] == pytest.approx(0.0)
    assert c.flagged == ["ece_only", "gap_only"]
    assert c.groups["empty"]["worse"] is False and c.groups["empty"]["ece_delta"] is None
    assert "empty  n/a -> n/a" in c.to_text()


def test_a_group_empty_on_one_side_prints():
    old = _report({"a": _summary(0.05, [0.04, 0.06], 0.01, [0.75, 0.83])})
    new = _report({"a": _summary(None, None, None, None)})
    text = compare(old, new).to_text()
    assert "a  0.0500 -> n/a" in text and "flagged: none" in text
