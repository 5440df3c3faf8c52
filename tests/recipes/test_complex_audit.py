"""The two calibration audits of the ComplEx recipe: the exact invariants catch a repair that
moves a decision or a ranking, and the hidden-truth numbers equal a brute-force reference."""

from __future__ import annotations

import math
import types

import pytest
import torch

import torchcal.functional as TF
from recipes.complex_link_prediction import audit as audit_mod
from recipes.complex_link_prediction.audit import tail_audit, triple_audit
from recipes.complex_link_prediction.datasets import load_dataset, with_reciprocals
from recipes.complex_link_prediction.items import stratified_halves
from recipes.complex_link_prediction.model import ComplEx


@pytest.fixture
def world():
    """A tiny family KG with hidden truth and a ComplEx after a short 1-N fit (an untrained
    model is a degenerate audit); seed and one thread come from tests/conftest.py."""
    data = load_dataset("family", num_families=3, generations=4, seed=0, hide=0.15)
    model = ComplEx(data.num_entities, data.num_relations, rank=16, init_scale=0.1)
    train = with_reciprocals(data.train, data.num_relations)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.2)
    for _ in range(30):
        h, r, t = train.unbind(1)
        scores, n3 = model.scores_and_n3(h, r, t)
        opt.zero_grad()
        (TF.log_score(scores, t) + 0.01 * n3).backward()
        opt.step()
    return data, model


class _Scaler:
    """A stand-in for TemperatureScaler applying ``fn`` (damage done on purpose)."""

    def __init__(self, fn):
        self.fn = fn

    def fit(self, logits, target):
        return types.SimpleNamespace(temperature=1.0, converged=True)

    def __call__(self, logits):
        return self.fn(logits.clone())


def _swap_two_below_top(x):
    """Swap two distinct finite negative scores below the first row's top: an inversion
    only."""
    y = x / 2
    row = y[0]
    finite = torch.isfinite(row) & (row < 0) & (row < row.max())
    i, j = torch.nonzero(finite).flatten()[:2].tolist()
    assert row[i] != row[j]
    row[i], row[j] = row[j].clone(), row[i].clone()
    return y


def _swap_top_two(x):
    y = x / 2
    order = y.argsort(dim=-1, descending=True)
    top, second = order[:, :1], order[:, 1:2]
    a, b = y.gather(1, top), y.gather(1, second)
    return y.scatter(1, top, b).scatter(1, second, a)


def _lift_last_mask(x):
    """Replace the last -inf of the first row holding two by a finite floor: a broken tie."""
    y = x / 2
    two = (y == -math.inf).sum(1) >= 2
    r = int(torch.nonzero(two)[0, 0])
    j = int(torch.nonzero(y[r] == -math.inf).flatten()[-1])
    y[r, j] = -1e300
    return y


def _shift_down(x):
    return x / 2 - 1e6  # increasing, but every positive decision flips


def _coarse(x):
    """Increasing and sign-keeping, but merges scores up to 0.25 apart into ties."""
    return torch.trunc(x * 4) / 4 + 0.125 * torch.sign(x)


@pytest.mark.parametrize(
    ("audit", "damage", "fails"),
    [
        ("tail", _swap_two_below_top, {"no_strict_inversion"}),
        ("triple", _swap_two_below_top, {"no_strict_inversion"}),
        ("tail", _swap_top_two, {"no_strict_inversion", "top1_kept"}),
        ("triple", _swap_top_two, {"no_strict_inversion", "top1_kept", "decisions_unchanged"}),
        ("tail", _lift_last_mask, {"ties_kept"}),
        ("triple", _shift_down, {"decisions_unchanged"}),
        ("tail", _coarse, {"created_ties_within_bound"}),
        ("triple", _coarse, {"created_ties_within_bound"}),
    ],
)
def test_each_invariant_catches_its_damage(world, monkeypatch, audit, damage, fails):
    data, model = world
    run = {
        "tail": lambda: tail_audit(model, data, seed=1),
        "triple": lambda: triple_audit(model, data, k=4, seed=1),
    }[audit]
    good = run()
    assert good.invariants_ok and good.summary["invariants_ok"] is True
    monkeypatch.setattr(audit_mod, "TemperatureScaler", lambda: _Scaler(damage))
    bad = run()
    failed = {k for k, v in bad.invariants.items() if not v}
    if audit == "triple" and damage is _swap_top_two:
        # swapping a positive top-1 with a negative second flips decisions too, unless every
        # query's top two share a sign; two queries (h, r) may share a candidate, a tie in
        # the complete order that a per-row swap breaks; inversion and top-1 fail either way
        assert {"no_strict_inversion", "top1_kept"} <= failed <= fails | {"ties_kept"}
    else:
        assert failed == fails, bad.invariants
    assert bad.summary["invariants_ok"] is False


def test_invariant_names():
    # the report and the CLI's error name these; the triple audit adds the decision at 0
    names = audit_mod.named_invariants(
        TF.check_monotone_map(torch.ones(2), torch.ones(2)), decisions=True
    )
    assert set(names) == {
        "no_strict_inversion",
        "ties_kept",
        "top1_kept",
        "decisions_unchanged",
        "created_ties_within_bound",
    }


def test_one_ulp_near_ties_merged_by_t_pass_and_are_counted(world, monkeypatch):
    """The failure of issue 9: two scores one ulp apart become one after / T. Plant such a
    near-tie at the top of every query row (the second best moved to one ulp below the
    best): the real TemperatureScaler merges some of them, and the audit passes and counts
    them, where the old exact same-weak-order check failed."""
    data, model = world
    orig = audit_mod.all_tail_logits
    seen = {}

    def planted(*args, **kwargs):
        x = orig(*args, **kwargs)
        order = x.argsort(dim=1, descending=True)
        top = x.gather(1, order[:, :1])
        near = torch.nextafter(top, torch.full_like(top, -math.inf))
        seen["x"] = x.scatter(1, order[:, 1:2], near)
        return seen["x"]

    monkeypatch.setattr(audit_mod, "all_tail_logits", planted)
    a = tail_audit(model, data, seed=1)
    s = a.summary
    assert a.invariants_ok, a.invariants
    assert s["ties_created"] > 0 and s["max_tie_gap_ulps"] == 1
    assert s["strict_inversions"] == 0 and s["ties_broken"] == 0
    # the ties are real: the top two of some scaled rows are equal
    top2 = (seen["x"] / s["temperature"]).topk(2, dim=1).values
    assert int((top2[:, 0] == top2[:, 1]).sum()) == s["ties_created"]


def test_distinct_corruptions_and_left_out_queries(world):
    data, _ = world
    R = data.num_relations
    items = audit_mod.triple_items(data, 4, seed=1)
    srt = items.tails.sort(1).values
    assert bool((srt[:, 1:] != srt[:, :-1]).all())
    known = set(map(tuple, with_reciprocals(data.known(), R).tolist()))
    for h, r, row in zip(items.head.tolist(), items.relation.tolist(), items.tails.tolist()):
        assert all((h, r, e) not in known for e in row[1:])
    # brute force: a query is an item iff it has >= k tails that make no known triple
    queries = with_reciprocals(data.test, R).tolist()
    free = [sum((h, r, e) not in known for e in range(data.num_entities)) for h, r, _ in queries]
    k = sorted(free)[len(free) // 2]  # about half the queries have enough corruptions
    want = sum(f >= k for f in free)
    assert 0 < want < len(queries)
    assert len(audit_mod.triple_items(data, k, seed=1).head) == want


def test_tail_audit_confidence_reading_and_true_labels_match_brute_force(world):
    data, model = world
    R, seed, n_bins = data.num_relations, 1, 10
    a = tail_audit(model, data, seed=seed, n_bins=n_bins)
    queries = with_reciprocals(data.test, R)
    known = set(map(tuple, with_reciprocals(data.known(), R).tolist()))
    hidden = set(map(tuple, with_reciprocals(data.hidden, R).tolist()))
    ev = ~stratified_halves(data.test[:, 1], seed).repeat(2)
    conf, right, right_true = [], [], []
    for h, r, t in queries[ev].tolist():
        with torch.no_grad():
            s = model.score_all(torch.tensor([h]), torch.tensor([r]), dtype=torch.float64)[0]
        for e in range(data.num_entities):
            if e != t and (h, r, e) in known:
                s[e] = float("-inf")
        p = torch.softmax(s, 0)
        top = int(torch.argmax(s))
        conf.append(float(p[top]))
        right.append(top == t)
        right_true.append(top == t or (h, r, top) in hidden)
    assert sum(right_true) > sum(right)  # the hidden truth matters on this data
    conf_t = torch.tensor(conf, dtype=torch.float64)

    def ece(y):
        return float(
            TF.calibration_error(
                conf_t,
                torch.tensor(y, dtype=torch.float64),
                n_bins=n_bins,
                reading="binary",
                input="probs",
            )
        )

    s = a.summary
    assert s["n_evaluation"] == len(conf)
    assert s["ece_before"] == pytest.approx(ece(right), abs=1e-12)
    assert s["ece_true_before"] == pytest.approx(ece(right_true), abs=1e-12)
    assert s["hits1_before"] == pytest.approx(sum(right) / len(right), abs=1e-15)
    assert s["hits1_true"] == pytest.approx(sum(right_true) / len(right), abs=1e-15)
    assert a.tables["before"].reading == "confidence" and a.tables["before"].n == len(conf)


def test_triple_audit_true_labels_and_base_rate_column(world):
    data, model = world
    R, seed, k, n_bins = data.num_relations, 1, 4, 10
    a = triple_audit(model, data, k=k, seed=seed, n_bins=n_bins)
    items = audit_mod.triple_items(data, k, seed)
    ev = ~items.cal
    truth = set(map(tuple, with_reciprocals(data.truth(), R).tolist()))
    h, r, cand = items.head[ev], items.relation[ev], items.tails[ev]
    y_true = torch.tensor(
        [
            [float((hh, rr, e) in truth) for e in row]
            for hh, rr, row in zip(h.tolist(), r.tolist(), cand.tolist())
        ],
        dtype=torch.float64,
    )
    with torch.no_grad():
        p = torch.sigmoid(model.score(h, r, cand, dtype=torch.float64))
    ref = TF.calibration_error(
        p.reshape(-1), y_true.reshape(-1), n_bins=n_bins, reading="binary", input="probs"
    )
    s = a.summary
    assert s["ece_true_before"] == pytest.approx(float(ref), abs=1e-12)
    assert s["hidden_true_corruptions"] > 0
    # the base-rate column: a constant 1/(1+k) for every item
    b = 1 / (1 + k)
    assert s["base_rate"] == pytest.approx(b)
    assert s["brier_base_rate"] == pytest.approx(b * (1 - b), abs=1e-12)
    assert s["ece_base_rate"] == pytest.approx(0.0, abs=1e-12)
    assert s["acc_base_rate"] == pytest.approx(1 - b, abs=1e-12)
    assert s["auc_base_rate"] == 0.5
    entropy = -(b * math.log(b) + (1 - b) * math.log(1 - b))
    assert s["nll_base_rate"] == pytest.approx(entropy, abs=1e-12)
    assert a.tables["before"].reading == "binary"


@pytest.mark.parametrize(
    ("audit", "bounds"),
    [("tail", (50.0, 60.0)), ("triple", (1e-3, 2e-3))],
)
def test_a_temperature_that_raises_the_fit_nll_falls_back_to_one(world, monkeypatch, audit, bounds):
    """A constructed failed fit (T boxed far from the optimum, on the side away from T = 1):
    its calibration-half NLL is above T = 1's, so the audit uses T = 1 (the "after" column
    is the model's own) and says so; a correct fit keeps its T, whose NLL is not higher."""
    data, model = world
    run = tail_audit if audit == "tail" else lambda m, d: triple_audit(m, d, k=5)
    ok = run(model, data).summary
    assert ok["temperature_fallback"] is False and ok["temperature"] == ok["temperature_fitted"]
    assert ok["nll_fit_split_fitted"] <= ok["nll_fit_split_identity"]
    # the boxed interval lies on the far side of the optimum from 1
    t_opt = ok["temperature"]
    assert (t_opt < 1 < bounds[0]) or (bounds[1] < 1 < t_opt)

    real = audit_mod.TemperatureScaler
    monkeypatch.setattr(audit_mod, "TemperatureScaler", lambda: real(bounds=bounds))
    with pytest.warns(UserWarning):  # the boxed solver says it stopped on a bound
        s = run(model, data).summary
    assert s["temperature_fallback"] is True and s["temperature"] == 1.0
    assert bounds[0] * (1 - 1e-12) <= s["temperature_fitted"] <= bounds[1] * (1 + 1e-12)
    assert s["nll_fit_split_fitted"] > s["nll_fit_split_identity"]
    assert s["nll_fit_split_identity"] == ok["nll_fit_split_identity"]
    assert (s["ece_after"], s["nll_after"]) == (s["ece_before"], s["nll_before"])
    assert s["ties_created"] == 0 and s["invariants_ok"]
    from recipes.complex_link_prediction.cli import audit_line

    line = audit_line(types.SimpleNamespace(name=audit, summary=s, invariants_ok=True), "x")
    assert line.startswith("audit ") and "T = 1.0000 (fallback: the fitted T = " in line


def test_answer_sets_match_a_brute_force_split_conformal():
    """LAC sets against a loop: the threshold is the k-th smallest calibration score with
    k = ceil((n + 1)(1 - alpha)) (in integers), a set is every candidate with 1 - p <= it, a
    known other answer (-inf) is never in one, and coverage / sizes are counted per query."""
    from recipes.complex_link_prediction.answers import answer_sets

    g = torch.Generator().manual_seed(3)
    B, E = 400, 30
    z = 2 * torch.randn(B, E, generator=g, dtype=torch.float64)
    y = torch.randint(0, E, (B,), generator=g)
    known = torch.rand(B, E, generator=g) < 0.2
    known[torch.arange(B), y] = False
    z = z.masked_fill(known, -math.inf)
    cal = torch.rand(B, generator=g) < 0.5
    for alpha in (0.1, 0.3, 1 / 3):
        out = answer_sets(z, y, cal, alpha)
        p = torch.softmax(z, 1)
        scores = sorted((1 - p[i, y[i]]).item() for i in range(B) if cal[i])
        n = len(scores)
        num, den = (1, 3) if alpha == 1 / 3 else (round(alpha * 10), 10)
        k = -((-(n + 1) * (den - num)) // den)  # ceil((n + 1)(1 - alpha)), exactly
        q = scores[k - 1] if k <= n else math.inf
        assert (out["n"], out["k"]) == (n, k) and out["threshold"] == q
        covered, sizes = [], []
        for i in torch.nonzero(~cal).flatten().tolist():
            members = [j for j in range(E) if not known[i, j] and 1 - p[i, j].item() <= q]
            covered.append(int(y[i]) in members)
            sizes.append(len(members))
        assert out["coverage"] == pytest.approx(sum(covered) / len(covered), abs=1e-15)
        assert out["mean_size"] == pytest.approx(sum(sizes) / len(sizes), abs=1e-12)
        assert out["empty"] == sizes.count(0)


def test_relation_temperatures_shrink_toward_the_global_t(world):
    """The per-relation temperatures on a real audit: each raw T fits its relation's
    calibration queries no worse than the global T; every shrunk log T lies between the
    global and the raw one; the summary's NLLs are those of the scaled logits."""
    from recipes.complex_link_prediction.answers import (
        query_relation_names,
        relation_temperatures,
    )
    from recipes.complex_link_prediction.audit import all_tail_logits
    from recipes.complex_link_prediction.evaluation import TripleFilter

    data, model = world
    R = data.num_relations
    queries = with_reciprocals(data.test, R)
    known = TripleFilter(with_reciprocals(data.known(), R), data.num_entities, 2 * R)
    logits = all_tail_logits(model, queries, known)
    target, rel = queries[:, 2], queries[:, 1]
    cal = stratified_halves(data.test[:, 1], 0).repeat(2)
    t_glob_scaler = audit_mod.TemperatureScaler()
    t_glob = t_glob_scaler.fit(logits[cal], target[cal]).temperature
    costs: dict = {}
    out = relation_temperatures(
        logits, target, rel, cal, query_relation_names(data.relations), logits / t_glob, 10, costs
    )
    s = out.summary
    assert s["global_temperature"] == pytest.approx(t_glob, rel=1e-9)
    assert set(costs) == {"tail.relation_T_raw", "tail.relation_T_shrunk"}
    lg = math.log(s["global_temperature"])  # the group scaler's own global fit
    for p in out.per_relation:
        r = query_relation_names(data.relations).index(p["relation"])
        m = cal & (rel == r)
        assert int(m.sum()) == p["n_calibration"] > 0
        own = float(TF.log_score(logits[m] / p["t_raw"], target[m]))
        assert own <= float(TF.log_score(logits[m] / t_glob, target[m])) + 1e-12
        lo, hi = sorted((lg, math.log(p["t_raw"])))
        assert lo - 1e-12 <= math.log(p["t_shrunk"]) <= hi + 1e-12, p
        assert 0 <= p["weight"] < 1
    ev = ~cal
    assert s["nll_shrunk"] == pytest.approx(float(TF.log_score(out.scaled_shrunk[ev], target[ev])))
    assert s["nll_calibration_raw"] <= s["nll_calibration_global"] + 1e-12


def test_risk_coverage_row_matches_a_loop():
    """The top-1 risk-coverage row against the definitions, looped over the acceptance order
    (distinct confidences): AURC = mean_k risk(top k), AUGRC = mean_k (errors in top k) / N,
    risk at 80 % = the error rate of the top ceil(0.8 N)."""
    from recipes.complex_link_prediction.answers import risk_coverage

    g = torch.Generator().manual_seed(5)
    B, E = 200, 12
    z = 3 * torch.randn(B, E, generator=g, dtype=torch.float64)
    y = torch.randint(0, E, (B,), generator=g)
    pred = z.argmax(1)
    out = risk_coverage(z / 0.7, pred, y, 0.8)
    conf = torch.softmax(z / 0.7, 1).max(1).values
    assert len(set(conf.tolist())) == B  # no ties: one acceptance order
    wrong = [float(pred[i] != y[i]) for i in torch.argsort(conf, descending=True).tolist()]
    errors = [sum(wrong[: k + 1]) for k in range(B)]
    assert out["aurc"] == pytest.approx(sum(e / (k + 1) for k, e in enumerate(errors)) / B)
    assert out["augrc"] == pytest.approx((sum(errors) - errors[-1] / 2) / B / B)  # trapezoid
    assert out["risk_at_coverage"] == pytest.approx(errors[159] / 160)
    assert out["risk"] == pytest.approx(sum(wrong) / B)


def test_answer_sets_cover_one_minus_alpha_over_random_splits():
    """Seeded simulation on masked, KG-like logits whose true tail is drawn from their own
    softmax (so the model is calibrated) and whose known other answers are masked: over 1000
    random calibration/evaluation splits (n_cal = 150), the mean coverage of the recipe's
    filtered LAC sets lies in [1 - alpha, 1 - alpha + 1/(n + 1)] up to Monte-Carlo error."""
    from recipes.complex_link_prediction.answers import answer_sets

    g = torch.Generator().manual_seed(11)
    B, E, alpha, reps = 300, 25, 0.1, 1000
    z = 2.5 * torch.randn(B, E, generator=g, dtype=torch.float64)
    known = torch.rand(B, E, generator=g) < 0.15
    z = z.masked_fill(known, -math.inf)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)  # never a masked one
    cov = []
    for _ in range(reps):
        cal = torch.zeros(B, dtype=torch.bool)
        cal[torch.randperm(B, generator=g)[: B // 2]] = True
        cov.append(answer_sets(z, y, cal, alpha)["coverage"])
    c = torch.tensor(cov, dtype=torch.float64)
    se = float(c.std()) / math.sqrt(reps)
    n = B // 2
    assert 1 - alpha - 4 * se <= float(c.mean()) <= 1 - alpha + 1 / (n + 1) + 4 * se
