"""Data of the ComplEx recipe: the family KG's closure, TSV errors, pykeen datasets."""

from __future__ import annotations

import itertools

import pytest
import torch

from recipes.complex_link_prediction.datasets import (
    FAMILY_RELATIONS,
    KGData,
    apply_family_rules,
    family_kg,
    find_test_leaks,
    generate_family,
    load_dataset,
    load_tsv_dataset,
)


def _oracle(people, male, base):
    """Every derived relation straight from the definitions, by brute force over people."""
    father = {t: h for h, r, t in base if r == "father"}
    mother = {t: h for h, r, t in base if r == "mother"}
    spouse = {(h, t) for h, r, t in base if r == "spouse"}

    def parents(x):
        return {p for p in (father.get(x), mother.get(x)) if p is not None}

    def siblings(x, y):
        return x != y and bool(parents(x)) and parents(x) == parents(y)

    out = set(base)
    for x, y in itertools.product(people, people):
        m = male[x]
        if x in parents(y):
            out.add((y, "son" if male[y] else "daughter", x))
        if siblings(x, y):
            out.add((x, "brother" if m else "sister", y))
        if any(x in parents(p) for p in parents(y)):
            out.add((x, "grandfather" if m else "grandmother", y))
        if any(siblings(x, p) for p in parents(y)):
            out.add((x, "uncle" if m else "aunt", y))
            out.add((y, "nephew" if male[y] else "niece", x))
        if x != y and any(siblings(a, b) for a in parents(x) for b in parents(y)):
            out.add((x, "cousin", y))
        if any((s, y) in spouse and x in parents(s) for s in people):
            out.add((x, "father_in_law" if m else "mother_in_law", y))
        if any((x, c) in spouse and y in parents(c) for c in people):
            out.add((x, "son_in_law" if m else "daughter_in_law", y))
    return out


def test_family_closure_complete_and_correct():
    world = family_kg(num_families=3, generations=4, seed=1)
    # re-deriving any rule on the closure adds nothing
    assert apply_family_rules(world.triples, world.male) <= world.triples
    # and the closure is exactly what the definitions say, computed independently
    assert world.triples == _oracle(world.people, world.male, world.base)
    assert {r for _, r, _ in world.triples} == set(FAMILY_RELATIONS)
    assert 12 <= len(FAMILY_RELATIONS) <= 20


def test_family_generator_seeded_and_sized():
    a = generate_family(seed=4)
    assert a == generate_family(seed=4)
    assert a[2] != generate_family(seed=5)[2]
    data = load_dataset("family", seed=0)
    assert 2000 <= len(data.truth()) <= 10000  # "a few thousand triples"
    # held-out entities and relations occur in training; splits are disjoint
    seen = set(data.train[:, [0, 2]].flatten().tolist())
    for split in (data.valid, data.test):
        assert set(split[:, [0, 2]].flatten().tolist()) <= seen
    keys = [set(map(tuple, s.tolist())) for s in (data.train, data.valid, data.test)]
    assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])


def test_family_hide_keeps_hidden_truth():
    full = load_dataset("family", num_families=3, generations=4, seed=2)
    hid = load_dataset("family", num_families=3, generations=4, seed=2, hide=0.2)
    assert len(hid.hidden) == round(0.2 * len(full.truth()))
    as_set = lambda x: set(map(tuple, x.tolist()))  # noqa: E731
    assert as_set(hid.truth()) == as_set(full.truth())
    assert not as_set(hid.hidden) & as_set(hid.known())


def _write(path, text):
    path.write_text(text)
    return str(path)


def test_tsv_loading_and_errors(tmp_path):
    tr = _write(tmp_path / "train.txt", "a\tr\tb\nb\tr\tc\n\nc\ts\ta\n")
    va = _write(tmp_path / "valid.txt", "a\ts\tc\n")
    te = _write(tmp_path / "test.txt", "b\tr\ta\n")
    data = load_tsv_dataset(tr, va, te)
    assert data.entities == ["a", "b", "c"] and data.relations == ["r", "s"]
    assert data.valid.tolist() == [[0, 1, 2]]
    bad = _write(tmp_path / "bad.txt", "a\tr\tb\na r b\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: expected 'head<TAB>relation<TAB>tail'"):
        load_tsv_dataset(bad, va, te)
    unseen = _write(tmp_path / "unseen.txt", "a\tr\tb\nz\tr\ta\n")
    with pytest.raises(ValueError, match=r"unseen\.txt:2: entity 'z' does not occur"):
        load_tsv_dataset(tr, va, unseen)
    empty = _write(tmp_path / "empty.txt", "\n")
    with pytest.raises(ValueError, match=r"empty\.txt: expected at least one triple"):
        load_tsv_dataset(tr, empty, te)
    with pytest.raises(ValueError, match="data.dataset"):
        load_dataset("nope")
    with pytest.raises(ValueError, match="data.train: dataset 'tsv' needs"):
        load_dataset("tsv", train=tr)
    # hide on user files: held-out triples become hidden truth
    big_va = _write(tmp_path / "v2.txt", "".join(f"a\t{r}\tb\n" for r in "rs" * 10))
    data = load_dataset("tsv", train=tr, valid=big_va, test=big_va, hide=0.5, seed=0)
    assert len(data.hidden) > 0 and len(data.valid) + len(data.test) + len(data.hidden) == 40


def test_pykeen_datasets_read_from_package():
    pytest.importorskip("pykeen")
    data = load_dataset("umls")
    assert (data.num_entities, data.num_relations) == (135, 46)
    assert (len(data.train), len(data.valid), len(data.test)) == (5216, 652, 661)
    assert torch.equal(data.known()[: len(data.train)], data.train)


def test_find_test_leaks_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    train = torch.randint(0, 3, (30, 3), generator=g)
    test = torch.randint(0, 3, (40, 3), generator=g)
    data = KGData("x", ["a", "b", "c"], ["p", "q", "r"], train, train[:0], test)
    in_train, dup = find_test_leaks(data)
    rows = [tuple(x) for x in test.tolist()]
    seen_train = {tuple(x) for x in train.tolist()}
    assert in_train.tolist() == [x in seen_train for x in rows]
    assert dup.tolist() == [x in rows[:i] for i, x in enumerate(rows)]
    assert 0 < int(in_train.sum()) < 40 and 0 < int(dup.sum()) < 40
    # load_dataset counts them (nothing leaks in the family KG's splits)
    fam = load_dataset("family", num_families=3, generations=4)
    assert fam.leaks == {"num_test_in_train": 0, "num_test_duplicates": 0, "num_test_dropped": 0}
