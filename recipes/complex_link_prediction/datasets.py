"""Knowledge-graph datasets for the ComplEx recipe: a generated family KG, the small
benchmarks shipped inside ``pykeen`` (Nations, Kinships, UMLS) and user TSV files. No training
code lives here (the Lightning DataModule is :mod:`.data`).

Every dataset becomes a :class:`KGData`: integer triples ``(head, relation, tail)`` for the
train/valid/test splits plus ``hidden`` (true triples removed from every split, kept only as
hidden truth to measure the open-world effect), with the entity and relation vocabularies.
"""

from __future__ import annotations

import importlib.util
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = [
    "FAMILY_RELATIONS",
    "FamilyKG",
    "KGData",
    "PYKEEN_DATASETS",
    "apply_family_rules",
    "family_kg",
    "generate_family",
    "load_dataset",
    "load_pykeen_dataset",
    "load_tsv_dataset",
    "read_tsv_triples",
    "with_reciprocals",
]

PYKEEN_DATASETS = ("nations", "kinships", "umls")

# "h <relation> t" reads "h is the <relation> of t". Base facts: father, mother (of a child),
# spouse (both directions). Derived, by blood and first degree only (see _family_rules):
#   son/daughter      a child of t, by h's gender
#   brother/sister    shares both parents with t (h != t; there are no half-siblings)
#   grandfather/-mother  a parent of a parent of t
#   uncle/aunt        a brother/sister of a parent of t (blood only: the husband of a
#                     parent's sister is not an uncle unless he is also a parent's brother)
#   nephew/niece      the son/daughter of a sibling of t (the inverse of uncle/aunt)
#   cousin            a child of a sibling of a parent of t (first cousins, symmetric)
#   father/mother_in_law  a parent of t's spouse
#   son/daughter_in_law   the spouse of a child of t
FAMILY_RELATIONS = (
    "father",
    "mother",
    "spouse",  # base facts
    "son",
    "daughter",
    "brother",
    "sister",
    "grandfather",
    "grandmother",
    "uncle",
    "aunt",
    "nephew",
    "niece",
    "cousin",
    "father_in_law",
    "mother_in_law",
    "son_in_law",
    "daughter_in_law",
)


@dataclass
class KGData:
    """A knowledge graph as integer triples (``(n, 3)`` long tensors of ``head, relation, tail``).

    ``hidden`` holds true triples that appear in no split (empty unless a ``hide`` fraction
    was asked for): they are unknown to training and to the observed filter, and count as
    true when scoring against true labels.
    """

    name: str
    entities: list[str]
    relations: list[str]
    train: Tensor
    valid: Tensor
    test: Tensor
    hidden: Tensor = field(default_factory=lambda: torch.empty(0, 3, dtype=torch.long))

    @property
    def num_entities(self) -> int:
        return len(self.entities)

    @property
    def num_relations(self) -> int:
        return len(self.relations)

    def known(self) -> Tensor:
        """All observed triples (train + valid + test), the standard filter."""
        return torch.cat([self.train, self.valid, self.test])

    def truth(self) -> Tensor:
        """Every true triple: observed plus hidden."""
        return torch.cat([self.known(), self.hidden])

    def summary(self) -> str:
        return (
            f"{self.name}: {self.num_entities} entities, {self.num_relations} relations, "
            f"train/valid/test/hidden = {len(self.train)}/{len(self.valid)}/"
            f"{len(self.test)}/{len(self.hidden)} triples"
        )


# ----------------------------------------------------------------------------------------
# TSV files
# ----------------------------------------------------------------------------------------


def read_tsv_triples(path: str) -> list[tuple[str, str, str, int]]:
    """Read ``head<TAB>relation<TAB>tail`` lines; returns ``(h, r, t, line_number)``.

    Blank lines are skipped; anything else that is not three non-empty tab-separated
    fields raises ``ValueError`` naming the file and the line. An empty file raises too.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such triples file")
    rows: list[tuple[str, str, str, int]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 3 or any(not p.strip() for p in parts):
                raise ValueError(
                    f"{path}:{lineno}: expected 'head<TAB>relation<TAB>tail', got {line!r}"
                )
            h, r, t = (p.strip() for p in parts)
            rows.append((h, r, t, lineno))
    if not rows:
        raise ValueError(f"{path}: expected at least one triple, the file is empty")
    return rows


def _index_split(
    rows: list[tuple[str, str, str, int]], ent: dict[str, int], rel: dict[str, int], path: str
) -> Tensor:
    out = torch.empty(len(rows), 3, dtype=torch.long)
    for i, (h, r, t, lineno) in enumerate(rows):
        for name, kind, vocab in ((h, "entity", ent), (r, "relation", rel), (t, "entity", ent)):
            if name not in vocab:
                raise ValueError(
                    f"{path}:{lineno}: {kind} {name!r} does not occur in the training triples"
                )
        out[i, 0], out[i, 1], out[i, 2] = ent[h], rel[r], ent[t]
    return out


def load_tsv_dataset(train: str, valid: str, test: str, name: str | None = None) -> KGData:
    """Load three TSV triple files. Vocabularies come from the training file (sorted)."""
    train_rows = read_tsv_triples(train)
    valid_rows = read_tsv_triples(valid)
    test_rows = read_tsv_triples(test)
    entities = sorted({x for h, _, t, _ in train_rows for x in (h, t)})
    relations = sorted({r for _, r, _, _ in train_rows})
    ent = {e: i for i, e in enumerate(entities)}
    rel = {r: i for i, r in enumerate(relations)}
    return KGData(
        name=name or os.path.basename(os.path.dirname(os.path.abspath(train))) or "tsv",
        entities=entities,
        relations=relations,
        train=_index_split(train_rows, ent, rel, train),
        valid=_index_split(valid_rows, ent, rel, valid),
        test=_index_split(test_rows, ent, rel, test),
    )


def _pykeen_datasets_dir() -> str:
    spec = importlib.util.find_spec("pykeen")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "data.dataset: Nations, Kinships and UMLS are read from the installed 'pykeen' "
            "package, which is not installed; `pip install torchcal[kg]` or pass TSV files "
            "with --data.train/--data.valid/--data.test"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "datasets")


def load_pykeen_dataset(name: str) -> KGData:
    """Nations, Kinships or UMLS from the TSV files inside the installed ``pykeen`` package
    (read directly; pykeen itself is not imported)."""
    key = name.lower()
    if key not in PYKEEN_DATASETS:
        raise ValueError(f"data.dataset: expected one of {PYKEEN_DATASETS}, got {name!r}")
    d = os.path.join(_pykeen_datasets_dir(), key)
    return load_tsv_dataset(
        *(os.path.join(d, f"{s}.txt") for s in ("train", "valid", "test")), name=key
    )


# ----------------------------------------------------------------------------------------
# The family knowledge graph
# ----------------------------------------------------------------------------------------


@dataclass
class FamilyKG:
    """The generated family world: people, their gender and the closed set of true triples."""

    people: list[str]
    male: dict[str, bool]
    base: set[tuple[str, str, str]]
    triples: set[tuple[str, str, str]]


def generate_family(
    num_families: int = 16,
    generations: int = 5,
    max_children: int = 4,
    marriage_rate: float = 0.85,
    seed: int = 0,
) -> tuple[list[str], dict[str, bool], set[tuple[str, str, str]]]:
    """Generate people and the base facts ``father``, ``mother``, ``spouse`` (seeded).

    ``num_families`` founder couples start the world; every married couple of a generation
    has 1..``max_children`` children; each child marries with probability
    ``marriage_rate``: with probability 1/2 an unmarried person of the other gender and of
    another bloodline (no common ancestor) of the same generation, otherwise (or when none is
    free) someone who marries in from outside and has no parents in the world. Marriages of
    the last generation have no children.

    One function over 60 lines on purpose: the order of the seeded draws is the generated
    world, and reading it top to bottom is how to check it.
    """
    rng = random.Random(seed)
    people: list[str] = []
    male: dict[str, bool] = {}
    ancestors: dict[str, frozenset[str]] = {}
    base: set[tuple[str, str, str]] = set()

    def person(is_male: bool, anc: frozenset[str] = frozenset()) -> str:
        name = f"p{len(people):04d}"
        people.append(name)
        male[name] = is_male
        ancestors[name] = anc
        return name

    def marry(a: str, b: str) -> None:
        base.add((a, "spouse", b))
        base.add((b, "spouse", a))

    couples: list[tuple[str, str]] = []
    for _ in range(num_families):
        hus, wife = person(True), person(False)
        marry(hus, wife)
        couples.append((hus, wife))
    for gen in range(1, generations):
        children: list[str] = []
        for hus, wife in couples:
            anc = ancestors[hus] | ancestors[wife] | {hus, wife}
            for _ in range(rng.randint(1, max_children)):
                c = person(rng.random() < 0.5, frozenset(anc))
                base.add((hus, "father", c))
                base.add((wife, "mother", c))
                children.append(c)
        rng.shuffle(children)
        couples = []
        single = set(children)
        for c in children:
            if c not in single:
                continue
            single.discard(c)
            if rng.random() >= marriage_rate:
                continue
            blood = ancestors[c] | {c}
            partner = next(
                (
                    o
                    for o in children
                    if o in single and male[o] != male[c] and not (ancestors[o] | {o}) & blood
                ),
                None,
            )
            if partner is None or rng.random() < 0.5:
                partner = person(not male[c])  # marries in from outside
            else:
                single.discard(partner)
            marry(c, partner)
            if gen < generations - 1:
                couples.append((c, partner) if male[c] else (partner, c))
    return people, male, base


def _pairs(facts: dict[str, set[tuple[str, str]]], rel: str) -> set[tuple[str, str]]:
    return facts.get(rel, set())


def _compose(a: set[tuple[str, str]], b: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """{(x, z) : (x, y) in a, (y, z) in b}."""
    by_first: dict[str, list[str]] = {}
    for y, z in b:
        by_first.setdefault(y, []).append(z)
    return {(x, z) for x, y in a for z in by_first.get(y, ())}


def _family_rules(male: dict[str, bool]) -> list[tuple[str, Callable[[dict], set]]]:
    """Horn rules over the relations, each returning the pairs it derives for its head
    (the definitions are listed above :data:`FAMILY_RELATIONS`)."""

    def inv(s: set[tuple[str, str]]) -> set[tuple[str, str]]:
        return {(b, a) for a, b in s}

    def m(s: set[tuple[str, str]], want: bool) -> set[tuple[str, str]]:
        return {(a, b) for a, b in s if male[a] == want}

    def parent(f: dict) -> set[tuple[str, str]]:
        return _pairs(f, "father") | _pairs(f, "mother")

    def sibling(f: dict) -> set[tuple[str, str]]:
        return _pairs(f, "brother") | _pairs(f, "sister")

    def child(f: dict) -> set[tuple[str, str]]:
        return _pairs(f, "son") | _pairs(f, "daughter")

    def uncle_aunt(f: dict) -> set[tuple[str, str]]:
        return _pairs(f, "uncle") | _pairs(f, "aunt")

    def siblings_of(f: dict) -> set[tuple[str, str]]:
        return {(x, z) for x, z in _compose(child(f), parent(f)) if x != z}

    return [
        ("son", lambda f: m(inv(parent(f)), True)),
        ("daughter", lambda f: m(inv(parent(f)), False)),
        ("brother", lambda f: m(siblings_of(f), True)),
        ("sister", lambda f: m(siblings_of(f), False)),
        ("grandfather", lambda f: m(_compose(parent(f), parent(f)), True)),
        ("grandmother", lambda f: m(_compose(parent(f), parent(f)), False)),
        ("uncle", lambda f: m(_compose(sibling(f), parent(f)), True)),
        ("aunt", lambda f: m(_compose(sibling(f), parent(f)), False)),
        ("nephew", lambda f: m(inv(uncle_aunt(f)), True)),
        ("niece", lambda f: m(inv(uncle_aunt(f)), False)),
        ("cousin", lambda f: _compose(_compose(child(f), sibling(f)), parent(f))),
        ("father_in_law", lambda f: m(_compose(parent(f), _pairs(f, "spouse")), True)),
        ("mother_in_law", lambda f: m(_compose(parent(f), _pairs(f, "spouse")), False)),
        ("son_in_law", lambda f: m(_compose(_pairs(f, "spouse"), child(f)), True)),
        ("daughter_in_law", lambda f: m(_compose(_pairs(f, "spouse"), child(f)), False)),
    ]


def _by_relation(triples: Iterable[tuple[str, str, str]]) -> dict[str, set[tuple[str, str]]]:
    facts: dict[str, set[tuple[str, str]]] = {}
    for h, r, t in triples:
        facts.setdefault(r, set()).add((h, t))
    return facts


def apply_family_rules(
    triples: set[tuple[str, str, str]], male: dict[str, bool]
) -> set[tuple[str, str, str]]:
    """Apply every family rule once to ``triples``; returns what they derive (new or not)."""
    facts = _by_relation(triples)
    return {(a, rel, b) for rel, rule in _family_rules(male) for a, b in rule(facts)}


def family_kg(
    num_families: int = 16,
    generations: int = 5,
    max_children: int = 4,
    marriage_rate: float = 0.85,
    seed: int = 0,
) -> FamilyKG:
    """The family world with every derived relation materialised: forward chaining of the
    rules to a fixed point, so the world is closed (every triple not in it is false).

    Example:
        >>> world = family_kg(num_families=2, generations=3, seed=0)
        >>> apply_family_rules(world.triples, world.male) <= world.triples
        True
    """
    people, male, base = generate_family(
        num_families, generations, max_children, marriage_rate, seed
    )
    triples = set(base)
    while True:
        new = apply_family_rules(triples, male) - triples
        if not new:
            break
        triples |= new
    return FamilyKG(people=people, male=male, base=base, triples=triples)


def _family_dataset(
    num_families: int,
    generations: int,
    hide: float,
    valid_fraction: float,
    test_fraction: float,
    seed: int,
) -> KGData:
    world = family_kg(num_families=num_families, generations=generations, seed=seed)
    entities = sorted(world.people)
    ent = {e: i for i, e in enumerate(entities)}
    rel = {r: i for i, r in enumerate(FAMILY_RELATIONS)}
    present = {r for _, r, _ in world.triples}
    missing = [r for r in FAMILY_RELATIONS if r not in present]
    if missing:
        raise ValueError(
            f"data.num_families: the generated world is too small, it has no "
            f"{missing} facts; use more families or generations"
        )
    all_ids = torch.tensor(
        sorted((ent[h], rel[r], ent[t]) for h, r, t in world.triples), dtype=torch.long
    )
    g = torch.Generator().manual_seed(seed)
    perm = all_ids[torch.randperm(len(all_ids), generator=g)]
    n = len(perm)
    n_hide = int(round(hide * n))
    n_valid = int(round(valid_fraction * n))
    n_test = int(round(test_fraction * n))
    hidden = perm[:n_hide]
    valid = perm[n_hide : n_hide + n_valid]
    test = perm[n_hide + n_valid : n_hide + n_valid + n_test]
    train = perm[n_hide + n_valid + n_test :]
    # A held-out triple whose entity or relation never occurs in training can't be
    # embedded: move it to train (the world stays closed, only the split changes).
    seen_e = torch.zeros(len(entities), dtype=torch.bool)
    seen_r = torch.zeros(len(FAMILY_RELATIONS), dtype=torch.bool)
    seen_e[train[:, 0]] = True
    seen_e[train[:, 2]] = True
    seen_r[train[:, 1]] = True
    moved = []
    kept = []
    for split in (valid, test):
        ok = seen_e[split[:, 0]] & seen_e[split[:, 2]] & seen_r[split[:, 1]]
        moved.append(split[~ok])
        kept.append(split[ok])
    train = torch.cat([train, *moved])
    return KGData(
        name="family",
        entities=entities,
        relations=list(FAMILY_RELATIONS),
        train=train,
        valid=kept[0],
        test=kept[1],
        hidden=hidden,
    )


def load_dataset(
    dataset: str = "family",
    *,
    train: str | None = None,
    valid: str | None = None,
    test: str | None = None,
    hide: float = 0.0,
    num_families: int = 16,
    generations: int = 5,
    valid_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> KGData:
    """One entry point: ``"family"`` (generated), ``"nations"``/``"kinships"``/``"umls"``
    (from pykeen) or ``"tsv"`` with the three file paths.

    The command line's ``--data.*`` dataset options are this signature's (jsonargparse reads
    it).

    Args:
        dataset: 'family' (generated), 'nations', 'kinships', 'umls' (from pykeen) or 'tsv'.
        train: TSV training triples (dataset 'tsv').
        valid: TSV validation triples (dataset 'tsv').
        test: TSV test triples (dataset 'tsv').
        hide: fraction of true triples kept out of the data as hidden truth (family: from
            every split; pykeen/tsv: from valid and test, whose triples are then true but
            unobserved), kept as ``KGData.hidden``.
        num_families: founder couples of the family KG.
        generations: generations of the family KG.
        valid_fraction: share of the family KG's triples in the validation split.
        test_fraction: share of the family KG's triples in the test split (the audits' data).
        seed: seed of the family KG and of the splits.

    Example:
        >>> data = load_dataset("family", num_families=3, generations=4, seed=0, hide=0.1)
        >>> data.num_relations, len(data.hidden) > 0
        (18, True)
    """
    if not 0.0 <= hide < 1.0:
        raise ValueError(f"data.hide: expected a fraction in [0, 1), got {hide!r}")
    key = dataset.lower()
    if key == "family":
        if not (
            0 < valid_fraction < 1
            and 0 < test_fraction < 1
            and hide + valid_fraction + test_fraction < 0.9
        ):
            raise ValueError(
                "data.valid_fraction/test_fraction: expected fractions in (0, 1) "
                "that leave at least 10 % of the triples for training, got "
                f"{valid_fraction}/{test_fraction} with hide={hide}"
            )
        return _family_dataset(num_families, generations, hide, valid_fraction, test_fraction, seed)
    if key in PYKEEN_DATASETS:
        data = load_pykeen_dataset(key)
    elif key == "tsv":
        if not (train and valid and test):
            raise ValueError(
                "data.train: dataset 'tsv' needs --data.train, --data.valid and --data.test paths"
            )
        data = load_tsv_dataset(train, valid, test)
    else:
        raise ValueError(
            f"data.dataset: expected 'family', 'tsv' or one of {PYKEEN_DATASETS}, got {dataset!r}"
        )
    if hide > 0:
        g = torch.Generator().manual_seed(seed)
        parts = []
        for split in (data.valid, data.test):
            keep = torch.rand(len(split), generator=g) >= hide
            parts.append((split[keep], split[~keep]))
        data.valid, data.test = parts[0][0], parts[1][0]
        data.hidden = torch.cat([parts[0][1], parts[1][1]])
    return data


def with_reciprocals(triples: Tensor, num_relations: int) -> Tensor:
    """``(h, r, t)`` plus ``(t, r + R, h)``: tail prediction for both directions."""
    inv = torch.stack([triples[:, 2], triples[:, 1] + num_relations, triples[:, 0]], dim=1)
    return torch.cat([triples, inv])
