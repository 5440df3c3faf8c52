"""The two calibration audits of the ComplEx recipe: the exact invariants catch a repair that
moves a decision or a ranking, and the hidden-truth numbers equal a brute-force reference."""

from __future__ import annotations

import math
import types

import pytest
import torch

import torchcal.functional as TF
from recipes.complex_link_prediction import audit as audit_mod
from recipes.complex_link_prediction.audit import stratified_halves, tail_audit, triple_audit
from recipes.complex_link_prediction.data import load_dataset, with_reciprocals
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


class _Reorders:
    """A stand-in for TemperatureScaler whose output is not monotone in the logits."""

    def fit(self, logits, target):
        return types.SimpleNamespace(temperature=1.0, converged=True)

    def __call__(self, logits):
        g = torch.Generator().manual_seed(0)
        return logits - 0.5 - 20 * torch.rand(logits.shape, generator=g, dtype=logits.dtype)


def test_invariants_hold_under_t_and_each_fails_when_a_ranking_moves(world, monkeypatch):
    data, model = world
    tail = tail_audit(model, data, seed=1)
    triple = triple_audit(model, data, k=4, seed=1)
    assert tail.invariants_ok and triple.invariants_ok
    assert len(tail.invariants) == 4 and len(triple.invariants) == 3
    monkeypatch.setattr(audit_mod, "TemperatureScaler", _Reorders)
    tail = tail_audit(model, data, seed=1)
    triple = triple_audit(model, data, k=4, seed=1)
    # every single check detects the damage on its own
    assert not any(tail.invariants.values()), tail.invariants
    assert not any(triple.invariants.values()), triple.invariants
    assert tail.summary["invariants_ok"] is False and triple.summary["invariants_ok"] is False


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
        return float(TF.calibration_error(conf_t, torch.tensor(y, dtype=torch.float64),
                                          n_bins=n_bins, reading="binary", input="probs"))

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
    y_true = torch.tensor([[float((hh, rr, e) in truth) for e in row] for hh, rr, row in
                           zip(h.tolist(), r.tolist(), cand.tolist())], dtype=torch.float64)
    with torch.no_grad():
        p = torch.sigmoid(model.score(h, r, cand, dtype=torch.float64))
    ref = TF.calibration_error(p.reshape(-1), y_true.reshape(-1), n_bins=n_bins,
                               reading="binary", input="probs")
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
