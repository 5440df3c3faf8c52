"""The audit's verdict is a test with stated error rates (docs/design.md section 6c), measured
by seeded simulation on models whose truth is known.

Each replicate is scored by the same functions the audit calls
(:func:`~torchcal.functional.verdict.window_gap_test` /
:func:`~torchcal.functional.verdict.ece_test_from_stats` and
:func:`~torchcal.functional.verdict.decide`), vectorised over replicates (their statistics
are built with one ``bincount``); :func:`test_audit_applies_the_same_rule` proves on a few
dozen replicates that :func:`torchcal.audit.audit` gives the same verdicts. Rates are checked
against binomial bounds (a 1-in-1000 Monte-Carlo tolerance), so a test fails only when the
rate is really off.

``python tests/audit/test_verdict_rates.py`` prints the full table (model x n x groups x rule).
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import binom

from torchcal.audit import audit
from torchcal.functional import BinnedStats
from torchcal.functional.decision import threshold_window
from torchcal.functional.verdict import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    decide,
    ece_test_from_stats,
    window_gap_test,
)

R = 300  # replicates per cell
B, TOL, ALPHA, T = 10, 0.05, 0.05, 0.8


def draw(model: str, reps: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Stated confidences and outcomes ``(reps, n)`` of a model whose truth is known.

    ``u01``/``u51``: perfectly calibrated, p ~ U(0, 1) / U(0.5, 1); ``judge``: the example's
    over-confident judge (true log-odds z ~ N(1.2, 1), stated sigmoid(2.5 z): about 15
    points over-confident near 0.8); ``boundary``: stated = true + 0.05 everywhere (a gap of
    exactly the tolerance in every bin: the ECE and every window gap equal 0.05)."""
    u = torch.rand(reps, n, generator=gen, dtype=torch.float64)
    if model == "u01":
        p = q = u
    elif model == "u51":
        p = q = 0.5 + 0.5 * u
    elif model == "judge":
        z = 1.2 + torch.randn(reps, n, generator=gen, dtype=torch.float64)
        p, q = torch.sigmoid(2.5 * z), torch.sigmoid(z)
    elif model == "boundary":
        q = 0.95 * u
        p = q + 0.05
    else:  # pragma: no cover
        raise ValueError(model)
    y = (torch.rand(reps, n, generator=gen, dtype=torch.float64) < q).long()
    return p, y


def family_stats(p: torch.Tensor, y: torch.Tensor, g: torch.Tensor, G: int) -> BinnedStats:
    """Per replicate the statistics of the family the audit judges: ``(reps, 1 + G, 1, B)``
    (the pooled row, then the groups) for ``G > 1``; ``(reps, 1, 1, B)`` for one group."""
    reps = p.shape[0]
    b = (p * B).floor().long().clamp(0, B - 1)
    idx = ((torch.arange(reps)[:, None] * G + g) * B + b).reshape(-1)
    size = reps * G * B

    def s(w: torch.Tensor | None) -> torch.Tensor:
        out = torch.bincount(idx, weights=None if w is None else w.reshape(-1), minlength=size)
        return out.view(reps, G, 1, B)

    yf = y.double()
    st = BinnedStats(s(None), s(p), s(yf), s(p * p), s(p * yf))
    pooled = st.map(lambda t: t.sum(1, keepdim=True))
    if G == 1:
        return pooled
    return BinnedStats(*(torch.cat([getattr(pooled, k), getattr(st, k)], 1) for k in FIELDS))


FIELDS = ("count", "conf", "acc", "conf2", "conf_acc")


def verdicts(stats: BinnedStats, rule: str) -> torch.Tensor:
    """The overall verdict code of each replicate."""
    family = stats.count.shape[1]
    if rule == "ece":
        t = ece_test_from_stats(stats, TOL, alpha=ALPHA, family=family)
    else:
        t = window_gap_test(stats, *threshold_window(T, B), TOL, alpha=ALPHA, family=family)
    return decide(t["p_pass"], t["p_fail"], ALPHA)[1]


def rates(model: str, n: int, G: int, rule: str, seed: int = 0, reps: int = R) -> dict[str, int]:
    """Counts of FAIL / PASS / INCONCLUSIVE over ``reps`` replicates of ``n`` rows."""
    gen = torch.Generator().manual_seed(seed)
    p, y = draw(model, reps, n, gen)
    g = torch.randint(0, G, (reps, n), generator=gen)
    v = verdicts(family_stats(p, y, g, G), rule)
    return {
        k: int((v == c).sum()) for k, c in (("fail", FAIL), ("pass", PASS), ("inc", INCONCLUSIVE))
    }


def at_most(count: int, rate: float, reps: int = R) -> bool:
    """``count`` of ``reps`` is consistent with a true rate <= ``rate`` (one-sided 1e-3)."""
    return count <= binom.ppf(1 - 1e-3, reps, rate)


def at_least(count: int, rate: float, reps: int = R) -> bool:
    return count >= binom.ppf(1e-3, reps, rate)


CELLS = [(n, G, rule) for n in (100, 200, 500, 2000) for G in (1, 4) for rule in ("ece", "gap")]


@pytest.mark.parametrize("model", ["u01", "u51"])
def test_calibrated_model_fails_at_most_alpha(model: str) -> None:
    """A perfectly calibrated model FAILs in at most 5 % of the audits, at every n, with and
    without a threshold, one group and four (Holm over the pooled row and the groups)."""
    for i, (n, G, rule) in enumerate(CELLS):
        r = rates(model, n, G, rule, seed=100 + i)
        assert at_most(r["fail"], ALPHA), (model, n, G, rule, r)


@pytest.mark.parametrize("model", ["u01", "u51"])
@pytest.mark.parametrize("rule", ["ece", "gap"])
def test_calibrated_model_passes_at_n_5000(model: str, rule: str) -> None:
    """n = 5000 in one group PASSes in at least 90 %; four groups need about 5000 rows *per
    group* (20000 in all) for the same (the window near 0.8 holds a fifth of U(0, 1))."""
    assert at_least(rates(model, 5000, 1, rule, seed=7)["pass"], 0.90)
    assert at_least(rates(model, 20000, 4, rule, seed=8, reps=150)["pass"], 0.90, reps=150)


@pytest.mark.parametrize("rule", ["ece", "gap"])
def test_over_confident_judge_fails_at_2000_never_passes_at_200(rule: str) -> None:
    assert at_least(rates("judge", 2000, 1, rule, seed=11)["fail"], 0.95)
    assert at_most(rates("judge", 200, 1, rule, seed=12)["pass"], 0.05)
    assert at_most(rates("judge", 200, 4, rule, seed=13)["pass"], 0.05)


@pytest.mark.parametrize("rule", ["ece", "gap"])
def test_wrong_pass_and_wrong_fail_at_the_tolerance_are_at_most_alpha(rule: str) -> None:
    """At a true gap (or ECE) of exactly the tolerance both claims are wrong: each happens in
    at most alpha of the audits (the stated level), one group and four."""
    for i, (n, G) in enumerate([(200, 1), (2000, 1), (5000, 1), (2000, 4), (5000, 4)]):
        r = rates("boundary", n, G, rule, seed=200 + i)
        assert at_most(r["pass"], ALPHA) and at_most(r["fail"], ALPHA), (n, G, rule, r)


@pytest.mark.parametrize(
    ("model", "n", "G", "threshold"),
    [("u01", 500, 4, 0.8), ("judge", 2000, 1, None), ("u51", 5000, 1, 0.8), ("judge", 600, 4, 0.8)],
)
def test_audit_applies_the_same_rule(model: str, n: int, G: int, threshold: float | None) -> None:
    """audit() on each replicate gives the verdict the vectorised rule gives."""
    reps = 12
    gen = torch.Generator().manual_seed(300 + n)
    p, y = draw(model, reps, n, gen)
    g = torch.randint(0, G, (reps, n), generator=gen)
    want = verdicts(family_stats(p, y, g, G), "ece" if threshold is None else "gap").tolist()
    names = {PASS: "pass", FAIL: "fail", INCONCLUSIVE: "inconclusive"}
    for i in range(reps):
        kw = {"groups": g[i], "group_names": [f"g{j}" for j in range(G)]} if G > 1 else {}
        r = audit(p[i], y[i], threshold=threshold, n_bins=B, sample_size=0, **kw)
        assert r.verdict == names[want[i]], i
        assert r.settings["family"] == (1 if G == 1 else G + 1)


def table() -> str:  # pragma: no cover - the measured table of the report
    lines = ["model     rule  groups      n   FAIL   PASS  INCONCLUSIVE"]
    for model in ("u01", "u51", "judge", "boundary"):
        for rule in ("gap", "ece"):
            for G in (1, 4):
                for n in (100, 200, 500, 2000, 5000, 20000):
                    r = rates(model, n, G, rule, seed=1000 + n + G)
                    f, p_, i = (100 * r[k] / R for k in ("fail", "pass", "inc"))
                    lines.append(
                        f"{model:9s} {rule:4s} {G:6d} {n:6d} {f:5.1f}% {p_:5.1f}% {i:6.1f}%"
                    )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(table())
