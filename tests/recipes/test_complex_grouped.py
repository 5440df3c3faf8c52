"""Training on grouped queries (``--data.group_queries``): same data, same loss, same gradients
as training on the triples one score row each."""

from __future__ import annotations

import collections
import pathlib

import pytest
import torch
import torch.nn.functional as F
from _complex_helpers import QUIET, TINY_FAMILY, small_module

from recipes.complex_link_prediction.cli import build_parser, main
from recipes.complex_link_prediction.data import KGDataModule
from recipes.complex_link_prediction.datasets import load_dataset, with_reciprocals
from recipes.complex_link_prediction.model import ComplExModule, Pow15


@pytest.fixture(scope="module")
def data():
    return load_dataset("family", num_families=3, generations=4, seed=0)


def test_grouped_epoch_holds_every_triple_once(data):
    dm = KGDataModule(data, batch_size=7, seed=3, group_queries=True)
    seen: collections.Counter = collections.Counter()
    queries_seen = []
    for queries, query_index, tails in dm.train_dataloader():
        assert query_index.tolist() == sorted(query_index.tolist())
        assert set(query_index.tolist()) == set(range(len(queries)))  # every query has tails
        queries_seen += [tuple(q) for q in queries.tolist()]
        seen.update(zip(*queries[query_index].T.tolist(), tails.tolist()))
    triples = with_reciprocals(data.train, data.num_relations).tolist()
    assert seen == collections.Counter(map(tuple, triples))
    # one row per distinct query, each once per epoch
    assert sorted(queries_seen) == sorted({(h, r) for h, r, _ in triples})


def _reference(m, h, r, t, loss, reg):
    """Per triple, from the complex numbers: the proper score of the true tail over all
    entities plus ``reg * sum |x|^3 / N`` over head, relation and tail (Lacroix et al. 2018)."""
    E = torch.complex(*m.entity.weight.chunk(2, -1))
    W = torch.complex(*m.relation.weight.chunk(2, -1))
    scores = ((E[h] * W[r]) @ E.conj().T).real
    if loss == "log":
        fit = F.cross_entropy(scores, t)
    else:
        fit = ((scores.softmax(1) - F.one_hot(t, len(E))) ** 2).sum(1).mean()
    n3 = sum((x.abs() ** 3).sum() for x in (E[h], W[r], E[t])) / len(t)
    return fit + reg * n3


@pytest.mark.parametrize("loss", ["log", "brier"])
def test_grouped_loss_and_gradients_equal_the_per_triple_ones(data, loss):
    reg = 0.05
    module = small_module(data, loss=loss, regularization=reg).double()
    m = module.model
    dm = KGDataModule(data, batch_size=16, seed=1, group_queries=True)
    queries, query_index, tails = next(iter(dm.train_dataloader()))
    assert len(tails) > len(queries)  # some query has several tails: the case that matters
    triples = torch.cat([queries[query_index], tails[:, None]], 1)
    params = [m.entity.weight, m.relation.weight]
    module.on_train_epoch_start()
    grouped = module.training_step((queries, query_index, tails), 0)
    per_triple = module.training_step(triples[torch.randperm(len(triples))], 0)
    ref = _reference(m, *triples.unbind(1), loss, reg)
    g_grouped = torch.autograd.grad(grouped, params)
    g_triple = torch.autograd.grad(per_triple, params)
    g_ref = torch.autograd.grad(ref, params)
    assert grouped.dtype == torch.float64
    value = grouped.detach().item()
    assert value == pytest.approx(per_triple.detach().item(), rel=1e-12, abs=1e-12)
    assert value == pytest.approx(ref.detach().item(), rel=1e-12, abs=1e-12)
    for a, b, c in zip(g_grouped, g_triple, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)
    # the epoch's mean score counts triples, not queries
    assert module._score_count == 2 * len(tails)


def test_n3_power_matches_pow_and_gradcheck():
    x = torch.rand(5, 4, dtype=torch.float64) + 0.1
    torch.testing.assert_close(Pow15.apply(x), x.pow(1.5), rtol=1e-14, atol=0)
    assert torch.autograd.gradcheck(Pow15.apply, (x.requires_grad_(),))
    zero = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(Pow15.apply(zero).sum(), zero)
    assert torch.equal(g, torch.zeros(3, dtype=torch.float64))  # finite (0) at 0


def test_grouped_queries_only_in_one_to_n(data):
    module = ComplExModule(
        data.num_entities, data.num_relations, data.train, data.known(), rank=4, mode="negatives"
    )
    dm = KGDataModule(data, batch_size=4, group_queries=True)
    module.on_train_epoch_start()
    with pytest.raises(ValueError, match="^data.group_queries"):
        module.training_step(next(iter(dm.train_dataloader())), 0)


def test_grouped_recipe_end_to_end_and_the_kinships_config(tmp_path, capsys):
    tiny = [
        *TINY_FAMILY,
        "--model.rank",
        "8",
        "--trainer.max_epochs",
        "2",
        *QUIET,
        "--audit.k",
        "5",
        "--data.group_queries",
        "true",
        "--data.batch_size",
        "40",
    ]
    assert main(tiny + ["--output_dir", str(tmp_path / "g")]) == 0
    assert main(tiny + ["--mode", "negatives", "--output_dir", str(tmp_path / "n")]) == 2
    assert "data.group_queries: only mode 'one_to_n'" in capsys.readouterr().err
    root = pathlib.Path(__file__).resolve().parents[2]
    cfg = build_parser().parse_args(
        ["--config", str(root / "configs" / "complex" / "kinships.yaml")]
    )
    assert cfg.data.group_queries is True and cfg.mode == "one_to_n"
