"""The generated family world of the ComplEx recipe: people, the base facts ``father``,
``mother`` and ``spouse`` (seeded), and the Horn rules that derive every other relation, closed
by forward chaining (:func:`family_kg`). Internal: :mod:`.datasets` re-exports the public names
and turns the world into a :class:`~recipes.complex_link_prediction.datasets.KGData`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# "h <relation> t" reads "h is the <relation> of t". Base facts: father, mother (of a child),
# spouse (both directions). Derived, by blood and first degree only (see family_rules):
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


def pairs(facts: dict[str, set[tuple[str, str]]], rel: str) -> set[tuple[str, str]]:
    return facts.get(rel, set())


def compose(a: set[tuple[str, str]], b: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """{(x, z) : (x, y) in a, (y, z) in b}."""
    by_first: dict[str, list[str]] = {}
    for y, z in b:
        by_first.setdefault(y, []).append(z)
    return {(x, z) for x, y in a for z in by_first.get(y, ())}


def family_rules(male: dict[str, bool]) -> list[tuple[str, Callable[[dict], set]]]:
    """Horn rules over the relations, each returning the pairs it derives for its head
    (the definitions are listed above :data:`FAMILY_RELATIONS`)."""

    def inv(s: set[tuple[str, str]]) -> set[tuple[str, str]]:
        return {(b, a) for a, b in s}

    def m(s: set[tuple[str, str]], want: bool) -> set[tuple[str, str]]:
        return {(a, b) for a, b in s if male[a] == want}

    def parent(f: dict) -> set[tuple[str, str]]:
        return pairs(f, "father") | pairs(f, "mother")

    def sibling(f: dict) -> set[tuple[str, str]]:
        return pairs(f, "brother") | pairs(f, "sister")

    def child(f: dict) -> set[tuple[str, str]]:
        return pairs(f, "son") | pairs(f, "daughter")

    def uncle_aunt(f: dict) -> set[tuple[str, str]]:
        return pairs(f, "uncle") | pairs(f, "aunt")

    def siblings_of(f: dict) -> set[tuple[str, str]]:
        return {(x, z) for x, z in compose(child(f), parent(f)) if x != z}

    return [
        ("son", lambda f: m(inv(parent(f)), True)),
        ("daughter", lambda f: m(inv(parent(f)), False)),
        ("brother", lambda f: m(siblings_of(f), True)),
        ("sister", lambda f: m(siblings_of(f), False)),
        ("grandfather", lambda f: m(compose(parent(f), parent(f)), True)),
        ("grandmother", lambda f: m(compose(parent(f), parent(f)), False)),
        ("uncle", lambda f: m(compose(sibling(f), parent(f)), True)),
        ("aunt", lambda f: m(compose(sibling(f), parent(f)), False)),
        ("nephew", lambda f: m(inv(uncle_aunt(f)), True)),
        ("niece", lambda f: m(inv(uncle_aunt(f)), False)),
        ("cousin", lambda f: compose(compose(child(f), sibling(f)), parent(f))),
        ("father_in_law", lambda f: m(compose(parent(f), pairs(f, "spouse")), True)),
        ("mother_in_law", lambda f: m(compose(parent(f), pairs(f, "spouse")), False)),
        ("son_in_law", lambda f: m(compose(pairs(f, "spouse"), child(f)), True)),
        ("daughter_in_law", lambda f: m(compose(pairs(f, "spouse"), child(f)), False)),
    ]


def by_relation(triples: Iterable[tuple[str, str, str]]) -> dict[str, set[tuple[str, str]]]:
    facts: dict[str, set[tuple[str, str]]] = {}
    for h, r, t in triples:
        facts.setdefault(r, set()).add((h, t))
    return facts


def apply_family_rules(
    triples: set[tuple[str, str, str]], male: dict[str, bool]
) -> set[tuple[str, str, str]]:
    """Apply every family rule once to ``triples``; returns what they derive (new or not)."""
    facts = by_relation(triples)
    return {(a, rel, b) for rel, rule in family_rules(male) for a, b in rule(facts)}


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
