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
    """A schema-2 summary; the gap interval is ``conf - acc_ci`` (as the audit writes it)."""
    w = None
    if gap is not None:
        w = {"n": 100, "confidence": conf, "accuracy": conf - gap, "gap": gap,
             "accuracy_ci": acc_ci, "gap_ci": [conf - acc_ci[1], conf - acc_ci[0]]}  # fmt: skip
    n = 0 if ece is None else 100
    if w is None and n == 0:
        w = {"n": 0, "confidence": None, "accuracy": None, "gap": None,
             "accuracy_ci": [None, None], "gap_ci": [None, None]}  # fmt: skip
    return {"n": n, "ece": ece, "ece_debiased": ece, "ece_ci": ece_ci, "threshold_gap": w,
            "verdict": "inconclusive"}  # fmt: skip


def _report(groups, level=0.95):
    settings = {"n_bins": 10, "threshold": 0.8, "tolerance": 0.05, "interval_level": level}
    return {"schema_version": 2, "verdict": "pass", "settings": settings,
            "pooled": _summary(0.05, [0.04, 0.06], 0.0, [0.75, 0.85]), "groups": groups}  # fmt: skip


def test_hand_worked_drift_each_test_flags_alone():
    """|gap| (not the signed gap) with the gap interval's half-width as its interval; a group
    is flagged when the debiased ECE alone or the gap alone got significantly worse; a group
    without estimates is listed as not judged."""
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
    half = 1.96 * np.hypot(0.05 / 1.96, 0.04 / 1.96)  # half-widths 0.05 and 0.04
    assert u["gap_delta_ci"] == pytest.approx([-0.08 - half, -0.08 + half], rel=1e-4)
    assert c.groups["ece_only"]["gap_delta"] == pytest.approx(0.0)
    assert c.groups["gap_only"]["ece_delta"] == pytest.approx(0.0)
    assert c.flagged == ["ece_only", "gap_only"]
    assert c.groups["empty"]["worse"] is False and c.groups["empty"]["ece_delta"] is None
    assert c.unjudged == ["empty"]
    assert "empty  n/a -> n/a" in c.to_text() and "not judged" in c.to_text()


def test_interval_level_is_rescaled_to_95():
    """A 90 % interval (the audit's default) has a smaller half-width than the 95 % one the
    drift reads: compare rescales it by z_0.975 / z_0.95."""
    old = _report({"a": _summary(0.02, [0.01, 0.03], 0.01, [0.75, 0.83])}, level=0.90)
    new = _report({"a": _summary(0.05, [0.04, 0.06], 0.01, [0.75, 0.83])}, level=0.90)
    d = compare(old, new).groups["a"]
    half = 1.96 * np.hypot(0.01, 0.01) * (1.959964 / 1.644854) / 1.96
    assert d["ece_delta_ci"] == pytest.approx([0.03 - half, 0.03 + half], rel=1e-5)


def test_a_group_empty_on_one_side_prints():
    old = _report({"a": _summary(0.05, [0.04, 0.06], 0.01, [0.75, 0.83])})
    new = _report({"a": _summary(None, None, None, None)})
    c = compare(old, new)
    text = c.to_text()
    assert "a  0.0500 -> n/a" in text and "flagged: none" in text and c.unjudged == ["a"]


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda d: d["groups"]["a"].update(ece_debiased=None), "groups['a'].ece_debiased"),
        (lambda d: d["groups"]["a"].update(ece_ci=[0.1]), "groups['a'].ece_ci"),
        (lambda d: d["groups"]["a"].update(ece_ci=0.01), "groups['a'].ece_ci"),
        (lambda d: d["groups"]["a"]["threshold_gap"].update(gap=float("nan")), "threshold_gap.gap"),
        (lambda d: d["groups"]["a"].pop("n"), "groups['a'].n"),
        (lambda d: d["settings"].update(interval_level=None), "settings.interval_level"),
        (lambda d: d.update(verdict="maybe"), "verdict"),
        (lambda d: d.update(groups={}), "groups"),
    ],
)
def test_malformed_reference_is_an_error_naming_the_entry(edit, named):
    d = _report({"a": _summary(0.05, [0.04, 0.06], 0.01, [0.75, 0.83])})
    edit(d)
    with pytest.raises(ValueError, match="^old: ") as e:
        compare(d, _report({"a": _summary(0.05, [0.04, 0.06], 0.01, [0.75, 0.83])}))
    assert named in str(e.value)


def test_renamed_group_is_not_a_silent_pass():
    old = _report({"math": _summary(0.05, [0.04, 0.06], 0.01, [0.75, 0.83])})
    new = _report({"maths": _summary(0.05, [0.04, 0.06], 0.01, [0.75, 0.83])})
    c = compare(old, new)
    assert c.flagged == [] and c.unjudged == ["math"] and "not judged" in c.to_text()
