"""ComplEx scoring, filtered ranks, corruptions, audit splits and AUC against brute force."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _complex_helpers import small_module

from recipes.complex_link_prediction.audit import auc
from recipes.complex_link_prediction.datasets import KGData, load_dataset, with_reciprocals
from recipes.complex_link_prediction.evaluation import (
    TripleFilter,
    evaluate,
    filtered_ranks,
    mask_known,
    ranking_metrics,
)
from recipes.complex_link_prediction.items import stratified_halves, triple_items
from recipes.complex_link_prediction.model import ComplEx, sample_corruptions


def _random_kg(g, n_ent=12, n_rel=3, n=60):
    trip = torch.stack(
        [
            torch.randint(n_ent, (n,), generator=g),
            torch.randint(n_rel, (n,), generator=g),
            torch.randint(n_ent, (n,), generator=g),
        ],
        1,
    )
    return torch.unique(trip, dim=0)


def test_complex_scores_match_complex_arithmetic():
    torch.manual_seed(0)
    m = ComplEx(7, 2, rank=5, init_scale=1.0)
    h, r, t = torch.tensor([0, 3, 6]), torch.tensor([0, 3, 1]), torch.tensor([2, 2, 5])
    E = torch.complex(*m.entity.weight.double().chunk(2, 1))
    W = torch.complex(*m.relation.weight.double().chunk(2, 1))
    ref_all = (E[h] * W[r]) @ E.conj().T  # Re <e_h, w_r, conj(e_t)> for every t
    assert torch.allclose(m.score_all(h, r, dtype=torch.float64), ref_all.real, atol=1e-12)
    assert torch.allclose(
        m.score(h, r, t, dtype=torch.float64), ref_all.real[torch.arange(3), t], atol=1e-12
    )
    ref_n3 = sum((x.abs() ** 3).sum() for x in (E[h], W[r], E[t])) / len(h)
    assert torch.allclose(m.n3(h, r, t).double(), ref_n3, rtol=1e-5)
    s, n3 = m.scores_and_n3(h, r, t)
    assert torch.allclose(s.double(), ref_all.real, atol=1e-5)
    assert torch.allclose(n3.double(), ref_n3, rtol=1e-5)
    # gradients flow through the complex views
    n3.backward()
    assert m.entity.weight.grad is not None and m.entity.weight.grad.abs().sum() > 0


def test_filtered_ranks_equal_brute_force():
    g = torch.Generator().manual_seed(0)
    n_ent, n_rel = 12, 3
    known = _random_kg(g, n_ent, n_rel)
    filt = TripleFilter(known, n_ent, n_rel)
    queries = known[torch.randperm(len(known), generator=g)[:25]]
    table = torch.randint(0, 4, (n_ent, n_rel, n_ent), generator=g).double()  # many ties

    def score_fn(h, r):
        return table[h, r]

    ranks = evaluate(score_fn, queries, filt, batch_size=7)
    kset = set(map(tuple, known.tolist()))
    for i, (h, r, t) in enumerate(queries.tolist()):
        s_t = table[h, r, t].item()
        others = [table[h, r, e].item() for e in range(n_ent) if e != t and (h, r, e) not in kset]
        assert ranks.optimistic[i] == 1 + sum(s > s_t for s in others)
        assert ranks.pessimistic[i] == 1 + sum(s >= s_t for s in others)
    mask = filt.mask(queries[:, 0], queries[:, 1])
    for i, (h, r, _) in enumerate(queries.tolist()):
        assert mask[i].nonzero().flatten().tolist() == sorted(
            e for e in range(n_ent) if (h, r, e) in kset
        )
    # head prediction: the reciprocal query (t, r + R, ?) is filtered by the known heads
    assert with_reciprocals(torch.tensor([[0, 1, 2]]), n_rel).tolist() == [
        [0, 1, 2],
        [2, 1 + n_rel, 0],
    ]
    both = TripleFilter(with_reciprocals(known, n_rel), n_ent, 2 * n_rel)
    heads = both.mask(queries[:, 2], queries[:, 1] + n_rel)
    for i, (_, r, t) in enumerate(queries.tolist()):
        assert heads[i].nonzero().flatten().tolist() == sorted(
            e for e in range(n_ent) if (e, r, t) in kset
        )
    m = ranking_metrics(ranks.realistic)
    ref = sum(
        2.0 / (a + b) for a, b in zip(ranks.optimistic.tolist(), ranks.pessimistic.tolist())
    ) / len(queries)
    assert m["mrr"] == pytest.approx(ref, abs=1e-12)


def test_corruptions_never_known():
    g = torch.Generator().manual_seed(1)
    n_ent = 10
    known = _random_kg(g, n_ent, 2, n=150)  # dense: most draws collide
    filt = TripleFilter(known, n_ent, 2)
    h, r = known[:, 0], known[:, 1]
    neg = sample_corruptions(h, r, 8, n_ent, filt, torch.Generator().manual_seed(2))
    assert neg.shape == (len(known), 8)
    kset = set(map(tuple, known.tolist()))
    for i in range(len(known)):
        for e in neg[i].tolist():
            assert (h[i].item(), r[i].item(), e) not in kset
    again = sample_corruptions(h, r, 8, n_ent, filt, torch.Generator().manual_seed(2))
    assert torch.equal(neg, again)
    # uniform over the unknown tails
    one = torch.tensor([0]).repeat(4000)
    draws = sample_corruptions(one, one, 1, n_ent, filt, torch.Generator().manual_seed(3))
    free = [e for e in range(n_ent) if (0, 0, e) not in kset]
    counts = torch.bincount(draws.flatten(), minlength=n_ent).double()
    assert counts[[e for e in range(n_ent) if e not in free]].sum() == 0
    expected = 4000 / len(free)
    assert ((counts[free] - expected).abs() < 5 * expected**0.5).all()
    full = torch.tensor([[0, 0, e] for e in range(n_ent)])
    with pytest.raises(ValueError, match="has no corruption"):
        sample_corruptions(
            torch.tensor([0]),
            torch.tensor([0]),
            2,
            n_ent,
            TripleFilter(full, n_ent, 1),
            torch.Generator(),
        )


def test_split_stratified_and_keeps_positive_with_corruptions():
    strata = torch.tensor([0] * 7 + [1] * 4 + [2] * 1 + [3] * 10)
    cal = stratified_halves(strata, seed=3)
    for s in range(4):
        n_cal = int(cal[strata == s].sum())
        n = int((strata == s).sum())
        assert n_cal == (n + 1) // 2
    assert torch.equal(cal, stratified_halves(strata, seed=3))
    assert not torch.equal(cal, stratified_halves(strata, seed=4))

    data = load_dataset("family", num_families=3, generations=4, seed=0)
    items = triple_items(data, k=5, seed=0)
    n = len(data.test)
    # one row per source positive: positive + its k corruptions share one half, and both
    # directions of a test triple too
    assert items.tails.shape == (2 * n, 6) and torch.equal(items.cal[:n], items.cal[n:])
    assert torch.equal(items.source, torch.arange(n).repeat(2))
    assert torch.equal(items.tails[:, 0], with_reciprocals(data.test, data.num_relations)[:, 2])
    known = set(map(tuple, with_reciprocals(data.known(), data.num_relations).tolist()))
    for h, r, row in zip(items.head.tolist(), items.relation.tolist(), items.tails.tolist()):
        assert (h, r, row[0]) in known
        assert all((h, r, e) not in known for e in row[1:])


def test_auc_matches_sklearn_with_ties():
    metrics = pytest.importorskip("sklearn.metrics")
    g = torch.Generator().manual_seed(0)
    s = torch.randint(0, 6, (300,), generator=g).double()
    y = (torch.rand(300, generator=g) < 0.3).double()
    assert auc(s, y) == pytest.approx(metrics.roc_auc_score(y.numpy(), s.numpy()), abs=1e-12)


def test_mask_known_keeps_target():
    scores = torch.zeros(2, 4)
    known = torch.tensor([[True, True, False, False], [False, False, True, True]])
    out = mask_known(scores, torch.tensor([1, 3]), known)
    assert out.tolist() == [[float("-inf"), 0, 0, 0], [0, 0, float("-inf"), 0]]
    r = filtered_ranks(out, torch.tensor([1, 3]))
    assert r.optimistic.tolist() == [1, 1] and r.pessimistic.tolist() == [3, 3]


def test_kgdata_summary():
    d = KGData(
        "x",
        ["a", "b"],
        ["r"],
        torch.tensor([[0, 0, 1]]),
        torch.tensor([[1, 0, 0]]),
        torch.tensor([[0, 0, 0]]),
    )
    assert d.known().shape == (3, 3) and "2 entities" in d.summary()


@pytest.mark.parametrize("name", ["datasets", "evaluation", "model", "items", "audit"])
def test_recipe_docstring_examples(name):
    import doctest
    import importlib

    mod = importlib.import_module(f"recipes.complex_link_prediction.{name}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(
    "mode,loss", [("one_to_n", "log"), ("one_to_n", "brier"), ("negatives", "log")]
)
def test_training_step_is_the_proper_score_plus_n3(mode, loss):
    data = load_dataset("family", num_families=3, generations=4, seed=0)
    k, reg, seed = 3, 0.05, 11
    module = small_module(
        data, mode=mode, loss=loss, num_negatives=k, regularization=reg, seed=seed
    )
    batch = with_reciprocals(data.train, data.num_relations)[:64]
    h, r, t = batch.unbind(1)
    module.on_train_epoch_start()
    got = module.training_step(batch, 0)
    m = module.model
    if mode == "negatives":
        filt = TripleFilter(
            with_reciprocals(data.train, data.num_relations),
            data.num_entities,
            2 * data.num_relations,
        )
        neg = sample_corruptions(
            h, r, k, data.num_entities, filt, torch.Generator().manual_seed(seed)
        )
        logits = m.score(h, r, torch.cat([t[:, None], neg], 1))
        labels = torch.zeros_like(logits)
        labels[:, 0] = 1
        fit = F.binary_cross_entropy_with_logits(logits, labels)
    elif loss == "log":
        fit = F.cross_entropy(m.score_all(h, r), t)
    else:
        p = torch.softmax(m.score_all(h, r), 1)
        fit = ((p - F.one_hot(t, data.num_entities)) ** 2).sum(1).mean()
    ref = fit + reg * m.n3(h, r, t)
    assert float(got.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    # and the same gradients, the N3 term's included
    params = [m.entity.weight, m.relation.weight]
    for a, b in zip(torch.autograd.grad(got, params), torch.autograd.grad(ref, params)):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)
