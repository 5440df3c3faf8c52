"""torchcal.audit: every reported number against a numpy float64 recomputation from the
samples, streaming equals one call, the seeded sample, verdicts, the temperature repair,
JSON round trip and bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import binomtest, foldnorm, norm

from torchcal.audit import Auditor, AuditReport, audit


def judging(n: int, seed: int, k_over: float = 2.5) -> tuple[torch.Tensor, ...]:
    """Two domains: true p ~ Beta(2, 2), y ~ Bernoulli(p); domain 0 states p (calibrated),
    domain 1 states sigmoid(k * logit p) (over-confident)."""
    rng = np.random.default_rng(seed)
    p = torch.from_numpy(rng.beta(2.0, 2.0, 2 * n))
    y = torch.from_numpy(rng.random(2 * n) < p.numpy()).long()
    grp = torch.arange(2 * n) % 2
    k = torch.where(grp == 1, k_over, 1.0)
    stated = torch.sigmoid(k * (torch.log(p) - torch.log1p(-p)))
    return stated, y, grp


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, ...]:
    return judging(3000, 0)


def ref(p: np.ndarray, y: np.ndarray, B: int = 10) -> dict[str, float]:
    """numpy float64 reference of the summary numbers (binary reading)."""
    b = np.minimum(np.floor(p * B), B - 1).astype(int)
    n = np.bincount(b, minlength=B).astype(float)
    sc = np.bincount(b, weights=p, minlength=B)
    sy = np.bincount(b, weights=y.astype(float), minlength=B)
    N = len(p)
    ok = n > 0
    fb, ob = sc[ok] / n[ok], sy[ok] / n[ok]
    o = y.mean()
    # the bias-corrected ECE and its 90 % interval (scipy's folded normal, brentq)
    T = np.abs(sc - sy).sum() / N
    sd = np.sqrt(np.bincount(b, weights=p * (1 - p), minlength=B)) / N
    S, L, z = sd.sum(), np.sqrt((sd**2).sum()), norm.ppf(0.95)

    def solve(target: float) -> float:
        f = lambda u: S * foldnorm.mean(u / S) - target  # noqa: E731
        return 0.0 if f(0) >= 0 else brentq(f, 0, target + 1, xtol=1e-14)

    return {
        "ece": T,
        "ece_debiased": solve(T),
        "ece_ci": [max(T - np.sqrt(2 / np.pi) * S - z * L, 0), min(solve(T + z * L), 1)],
        "mce": np.max(np.abs(fb - ob)),
        "brier": np.mean((p - y) ** 2),
        "reliability": np.sum(n[ok] * (fb - ob) ** 2) / N,
        "resolution": np.sum(n[ok] * (ob - o) ** 2) / N,
        "uncertainty": o * (1 - o),
        "nll": -np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)),
        "accuracy": np.mean((p >= 0.5) == (y == 1)),
    }


def test_every_number_against_numpy(data: tuple[torch.Tensor, ...]) -> None:
    p, y, grp = data
    r = audit(p, y, groups=grp, group_names=["math", "open_qa"], threshold=0.8)
    for name, s in [
        ("pooled", r.pooled),
        ("math", r.groups["math"]),
        ("open_qa", r.groups["open_qa"]),
    ]:
        m = (
            np.ones(len(p), bool)
            if name == "pooled"
            else (grp == ["math", "open_qa"].index(name)).numpy()
        )
        pn, yn = p.numpy()[m], y.numpy()[m]
        e = ref(pn, yn)
        assert s["n"] == m.sum()
        for key in ("ece", "mce", "brier", "nll", "accuracy"):
            assert s[key] == pytest.approx(e[key], rel=1e-9, abs=1e-12), key
        assert s["ece_debiased"] == pytest.approx(e["ece_debiased"], rel=1e-8, abs=1e-12)
        assert s["ece_ci"] == pytest.approx(e["ece_ci"], rel=1e-8, abs=1e-12)
        for key in ("reliability", "resolution", "uncertainty"):
            assert s["brier_decomposition"][key] == pytest.approx(e[key], rel=1e-9, abs=1e-12)
        assert s["ece_ci"][0] <= s["ece"] <= s["ece_ci"][1]
        win = (pn >= 0.7) & (pn < 0.9)
        w = s["threshold_gap"]
        assert s["threshold_window"] == [0.7, 0.9] and w["n"] == win.sum()
        assert w["gap"] == pytest.approx(pn[win].mean() - yn[win].mean(), rel=1e-9)
        ci = binomtest(int(yn[win].sum()), int(win.sum())).proportion_ci(0.95, method="wilson")
        assert w["accuracy_ci"] == pytest.approx([ci.low, ci.high], abs=1e-10)
        top = s["table"][-1]
        b9 = pn >= 0.9
        assert (top["bin"], top["n"]) == (9, b9.sum())
        assert top["accuracy"] == pytest.approx(yn[b9].mean(), rel=1e-12)


def test_calibrated_passes_overconfident_fails_with_reason(data: tuple[torch.Tensor, ...]) -> None:
    p, y, grp = data
    r = audit(p, y, groups=grp, group_names=["math", "open_qa"], threshold=0.8)
    assert r.verdict == "fail"
    assert r.groups["math"]["verdict"] == "pass"
    assert r.groups["math"]["reasons"][0].startswith("calibrated near 0.8 within +-0.05")
    reason = r.groups["open_qa"]["reasons"][0]
    assert (
        reason.startswith("over-confident by") and "near 0.8" in reason and "[0.7, 0.9)" in reason
    )
    assert [x.split(":")[0] for x in r.reasons] == ["pooled", "open_qa"]  # math passes
    assert r.reasons[1].startswith("open_qa: over-confident")
    assert r.pooled["verdict"] == "inconclusive"  # its own gap +0.062 [+0.040, +0.085]
    only_math = audit(p[grp == 0], y[grp == 0], threshold=0.8)
    assert only_math.verdict == "pass"
    no_threshold = audit(p[grp == 1], y[grp == 1])  # judged on the ECE
    assert no_threshold.verdict == "fail" and no_threshold.reasons[0].startswith(
        "pooled: ECE above the tolerance"
    )


def test_fit_temperature_repairs_on_the_held_out_half(data: tuple[torch.Tensor, ...]) -> None:
    p, y, grp = data
    r = audit(
        p, y, groups=grp, group_names=["math", "open_qa"], threshold=0.8, fit_temperature=True
    )
    t = r.temperature
    assert t["n_fit"] + t["n_eval"] == 6000 and t["rows"] == "all"
    assert t["eval_before"]["groups"]["open_qa"]["verdict"] == "fail"
    after, before = t["eval_after"], t["eval_before"]
    assert after["verdict"] in ("pass", "inconclusive")  # 1500 held-out rows a group
    assert "fail" not in {g["verdict"] for g in after["groups"].values()}
    gap = lambda ev: abs(ev["groups"]["open_qa"]["threshold_gap"]["gap"])  # noqa: E731
    assert gap(after) < 0.03 < 0.1 < gap(before)
    assert t["group_T"]["open_qa"] == pytest.approx(2.5, rel=0.15)
    assert t["group_T"]["math"] == pytest.approx(1.0, rel=0.15)


def test_streaming_in_odd_chunks_with_late_groups_equals_one_call(
    data: tuple[torch.Tensor, ...],
) -> None:
    p, y, grp = data
    order = torch.argsort(grp, stable=True)  # group 1 appears only after 3000 rows
    p, y, grp = p[order], y[order], grp[order]
    one = Auditor(sample_size=500, seed=3)
    one.update(p, y, grp)
    many = Auditor(sample_size=500, seed=3)
    cuts = [0, 7, 1000, 2999, 3001, 4567, 6000]
    for a, b in zip(cuts, cuts[1:]):
        many.update(p[a:b], y[a:b], grp[a:b])
    kw = {"threshold": 0.8, "group_names": ["a", "b"], "cost_error": 5.0, "cost_escalation": 1.0}
    d1, d2 = one.report(**kw).to_dict(), many.report(**kw).to_dict()
    assert _close(d1, d2)
    s1, s2 = one.sample(), many.sample()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert s1["row"].numel() == 500 and bool((s1["row"].diff() > 0).all())
    assert torch.equal(s1["preds"], p[s1["row"]]) and torch.equal(s1["group"], grp[s1["row"]])


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(u, v) for u, v in zip(a, b))
    if isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-15)
        return True
    assert a == b
    return True


def test_reservoir_sample_is_uniform_and_chunking_free() -> None:
    n = 20000
    p = torch.rand(n, dtype=torch.float64)
    y = (torch.rand(n, dtype=torch.float64) < p).long()
    rows = []
    for chunk in (n, 333, 4096):
        a = Auditor(sample_size=2000, seed=11)
        for i in range(0, n, chunk):
            a.update(p[i : i + chunk], y[i : i + chunk])
        rows.append(a.sample()["row"])
    assert torch.equal(rows[0], rows[1]) and torch.equal(rows[0], rows[2])
    # uniform over the stream: a quarter of the kept rows in each quarter (binomial +- 5 sd)
    counts = torch.bincount(rows[0] // (n // 4), minlength=4).double()
    assert bool(((counts - 500).abs() < 5 * math.sqrt(2000 * 0.25 * 0.75)).all())


def test_ece_at_matches_numpy(data: tuple[torch.Tensor, ...]) -> None:
    p, y, grp = data
    r = audit(p, y, groups=grp, group_names=["math", "open_qa"], sample_size=2500, seed=1)
    s = r.sample
    assert s["target"].numel() == 2500
    for T, B, group in [(1.0, 10, None), (2.5, 15, "open_qa"), (0.4, 7, "math"), (1.7, 50, None)]:
        m = (
            np.ones(2500, bool)
            if group is None
            else (s["group"] == s["names"].index(group)).numpy()
        )
        pn, yn = s["preds"].numpy()[m], s["target"].numpy()[m]
        c = 1 / (1 + np.exp(-(np.log(pn) - np.log1p(-pn)) / T))
        b = np.minimum(np.floor(c * B), B - 1).astype(int)
        e = np.abs(np.bincount(b, c - yn, minlength=B)).sum() / len(c)
        assert r.ece_at(T, B, group) == pytest.approx(e, rel=1e-9)
    assert r.ece_at(1.0, 10) == pytest.approx(
        ref(s["preds"].numpy(), s["target"].numpy())["ece"], rel=1e-9
    )
    with pytest.raises(ValueError, match="^group"):
        r.ece_at(1.0, 10, "nope")


def test_json_round_trip_text_and_markdown(data: tuple[torch.Tensor, ...], tmp_path) -> None:
    p, y, grp = data
    r = audit(p[:900], y[:900], groups=grp[:900], group_names=["math", "open_qa"], threshold=0.8,
              cost_error=4.0, cost_escalation=1.0, min_group=500)  # fmt: skip
    text = r.to_json()
    back = AuditReport.from_json(text)
    assert back.to_dict() == r.to_dict() == json.loads(text)
    path = tmp_path / "report.json"
    path.write_text(text)
    assert AuditReport.from_json(path).to_dict() == r.to_dict()
    assert AuditReport.from_json(str(path)).verdict == r.verdict
    assert set(r.to_dict()["pooled"]) >= {"n", "ece", "ece_ci", "ece_debiased", "mce", "brier",
                                          "nll", "accuracy", "threshold_gap", "verdict", "reasons",
                                          "table", "cost", "brier_decomposition"}  # fmt: skip
    assert len(r.warnings) == 2 and "only 450 items" in r.warnings[0]
    out = r.to_text()
    assert "open_qa" in out and r.verdict.upper() in out and "95% Wilson" in out
    assert "cannot tell near 0.8" in out  # 450 rows a group: the data cannot tell
    assert "positive rate" in out and "rule: each row is judged on the gap" in out
    assert "| open_qa |" in r.to_markdown()
    with pytest.raises(ValueError, match="^source"):
        AuditReport.from_json('{"schema_version": 99}')
    with pytest.raises(ValueError, match="re-run the audit"):
        AuditReport.from_json('{"schema_version": 1}')


def test_multiclass_confidence_reading_against_numpy() -> None:
    g = torch.Generator().manual_seed(5)
    logits = 3 * torch.randn(800, 4, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(logits / 2, 1), 1, generator=g).squeeze(1)
    probs = torch.softmax(logits, 1)
    r = audit(probs, y, threshold=0.8)
    r2 = audit(logits, y, input="logits", threshold=0.8)
    assert r.settings["reading"] == "confidence"
    pn = probs.numpy()
    c, ok = pn.max(1), (pn.argmax(1) == y.numpy())
    b = np.minimum(np.floor(c * 10), 9).astype(int)
    ece = np.abs(np.bincount(b, c - ok, minlength=10)).sum() / 800
    for rep in (r, r2):
        assert rep.pooled["ece"] == pytest.approx(ece, rel=1e-9)
        assert rep.pooled["accuracy"] == pytest.approx(ok.mean())
        assert rep.pooled["nll"] == pytest.approx(
            -np.log(pn[np.arange(800), y.numpy()]).mean(), rel=1e-9
        )
    assert r.verdict == "fail"  # over-confident by construction
    assert r.ece_at(2.0, 10) == pytest.approx(r2.ece_at(2.0, 10), rel=1e-9)
    with pytest.raises(ValueError, match="^reading"):
        audit(probs, y, reading="binary")


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"preds": torch.tensor([0.5, 1.2])}, "preds"),
        ({"preds": torch.tensor([0.5, float("nan")])}, "preds"),
        ({"target": torch.tensor([0, 2])}, "target"),
        ({"target": torch.tensor([0, 1, 1])}, "target"),
        ({"groups": torch.tensor([0, -1])}, "groups"),
        ({"groups": torch.tensor([0.0, 1.0])}, "groups"),
        ({"threshold": 1.5}, "threshold"),
        ({"tolerance": 0.0}, "tolerance"),
        ({"cost_error": 1.0}, "cost_escalation"),
        ({"cost_escalation": 1.0}, "cost_error"),
        ({"cost_error": -1.0, "cost_escalation": 1.0}, "cost_error"),
        ({"cost_error": 1.0, "cost_escalation": 0.0}, "cost_escalation"),
        ({"n_bins": 0}, "n_bins"),
        ({"input": "odds"}, "input"),
        ({"group_names": ["a"], "groups": torch.tensor([0, 1])}, "group_names"),
    ],
)
def test_bad_input_names_the_argument(kw: dict, name: str) -> None:
    args = {"preds": torch.tensor([0.2, 0.7]), "target": torch.tensor([0, 1])} | kw
    with pytest.raises(ValueError, match=f"^{name}"):
        audit(args.pop("preds"), args.pop("target"), **args)


@pytest.mark.filterwarnings("ignore::torchcal.scaling.CalibrationWarning")
def test_auditor_state_errors() -> None:
    a = Auditor()
    with pytest.raises(ValueError, match="^preds"):
        a.report()
    a.update(torch.tensor([0.2, 0.7]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="^groups"):
        a.update(torch.tensor([0.2, 0.7]), torch.tensor([0, 1]), torch.tensor([0, 1]))
    with pytest.warns(UserWarning, match="^fit_temperature: 1 probabilities.*--logits"):
        b = audit(torch.tensor([1.0, 0.3, 0.6, 0.2, 0.8, 0.1]), torch.tensor([1, 0, 1, 0, 1, 0]),
                  fit_temperature=True)  # fmt: skip
    assert b.temperature["clamped"] == 1 and b.settings["saturated"] == 1
    assert any("exactly 0 or 1" in w and "--logits" in w for w in b.warnings)


def test_save_writes_the_report_folder(data: tuple[torch.Tensor, ...], tmp_path) -> None:
    p, y, grp = data
    r = audit(p[:1000], y[:1000], groups=grp[:1000], group_names=["m", "o/q"], threshold=0.8)
    paths = r.save(tmp_path / "out")
    names = sorted(x.name for x in paths)
    assert names == sorted(["report.json", "report.md", "report.txt", "report.html",
                            "reliability_pooled.png", "reliability_group_0_m.png",
                            "reliability_group_1_o_q.png"])  # fmt: skip
    d = json.loads((tmp_path / "out" / "report.json").read_text())
    assert d == r.to_dict() and d["diagrams"]["o/q"] == "reliability_group_1_o_q.png"
    assert (tmp_path / "out" / "reliability_pooled.png").read_bytes()[:4] == b"\x89PNG"


def test_ece_at_unit_temperature_bins_probabilities_as_given() -> None:
    p = torch.tensor([0.3, 0.7, 0.1, 0.5, 0.9, 0.2], dtype=torch.float64)  # on bin edges
    y = torch.tensor([0, 1, 0, 1, 1, 0])
    r = audit(p, y, n_bins=10)
    assert r.ece_at(1.0, 10) == r.pooled["ece"]
    b = np.minimum(np.floor(p.numpy() * 10), 9).astype(int)
    assert r.pooled["ece"] == pytest.approx(np.abs(np.bincount(b, p.numpy() - y.numpy())).sum() / 6)


def test_text_and_markdown_hold_every_section(data: tuple[torch.Tensor, ...]) -> None:
    """The summary row of each group (n, ECE), the cost section, the warnings, the reasons."""
    p, y, grp = data
    r = audit(p[:900], y[:900], groups=grp[:900], group_names=["math", "open_qa"], threshold=0.8,
              cost_error=4.0, cost_escalation=1.0, min_group=500)  # fmt: skip
    text, md = r.to_text(), r.to_markdown()
    for name, s in r.groups.items():
        lines = text.splitlines()
        row = [
            ln
            for ln in lines
            if ln.startswith(f"{name} ") and ln.endswith(("PASS", "FAIL", "INCONCLUSIVE"))
        ]
        assert len(row) == 1 and f" {s['n']} " in row[0] and f"{s['ece']:.4f}" in row[0]
        assert f"| {name} | {s['n']} | {s['ece']:.4f} |" in md
        cost = f"| {name} | {s['cost']['threshold']:.2f} | {s['cost']['n_automated']} |"
        assert cost in md
    assert "automation threshold from the costs" in text and "automation threshold" in md
    assert all(f"warning: {w}" in text for w in r.warnings) and r.warnings
    assert all(w in md for w in r.warnings)
    assert r.groups["open_qa"]["reasons"][0] in text


def test_non_finite_numbers_are_written_as_null() -> None:
    r = AuditReport("pass", {"ece": math.nan, "x": [math.inf, 1.0]}, {}, {"n_bins": 10})
    assert json.loads(r.to_json())["pooled"] == {"ece": None, "x": [None, 1.0]}


def test_many_groups_are_linear_and_json_compact_above_1000_groups() -> None:
    """3000 groups: one summary per group, every group's own numbers (a group equals an audit
    of its rows alone), and report.json compact (indent only up to 1000 groups)."""
    g = torch.Generator().manual_seed(9)
    n, G = 30000, 3000
    p = torch.rand(n, generator=g, dtype=torch.float64)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < p).long()
    grp = torch.randint(0, G, (n,), generator=g)
    r = audit(p, y, groups=grp, threshold=0.8, sample_size=0)
    assert len(r.groups) == G and r.settings["family"] == G + 1
    for k in (0, 1234, G - 1):
        alone = audit(p[grp == k], y[grp == k], threshold=0.8, sample_size=0)
        for key in ("n", "ece", "ece_debiased", "ece_ci", "mce", "table"):
            assert _close(r.groups[str(k)][key], alone.pooled[key]), key
    text = r.to_json()
    assert "\n" not in text and json.loads(text) == r.to_dict()
