"""Knowledge-graph datasets for the ComplEx recipe: a generated family KG, the small
benchmarks shipped inside ``pykeen`` (Nations, Kinships, UMLS) and user TSV files. No training
code lives here (the Lightning DataModule is :mod:`.data`).

Every dataset becomes a :class:`KGData`: integer triples ``(head, relation, tail)`` for the
train/valid/test splits plus ``hidden`` (true triples removed from every split, kept only as
hidden truth to measure the open-world effect), with the entity and relation vocabularies.
The family world itself (generator and rules) lives in :mod:`._family`; its public names are
re-exported here.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field

import torch
from torch import Tensor

from recipes.complex_link_prediction._family import (
    FAMILY_RELATIONS,
    FamilyKG,
    apply_family_rules,
    family_kg,
    generate_family,
)

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
    "find_test_leaks",
    "with_reciprocals",
]

PYKEEN_DATASETS = ("nations", "kinships", "umls")


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
    #: the test split's leak counts as loaded (:func:`load_dataset` fills it):
    #: ``num_test_in_train``, ``num_test_duplicates``, ``num_test_dropped``
    leaks: dict[str, int] = field(default_factory=dict)

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
# The family knowledge graph's splits (the world itself is built in _family.py)
# ----------------------------------------------------------------------------------------


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
    drop_leaked: bool = False,
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
        drop_leaked: drop the test triples that also occur in train and the repeats of an
            earlier test triple (they are always counted and warned about:
            ``KGData.leaks``, :func:`find_test_leaks`).
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
        data = _family_dataset(num_families, generations, hide, valid_fraction, test_fraction, seed)
        return _check_leaks(data, drop_leaked)
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
    return _check_leaks(data, drop_leaked)


def find_test_leaks(data: KGData) -> tuple[Tensor, Tensor]:
    """Boolean masks over ``data.test``: ``(in_train, duplicate)``. ``in_train``: the triple
    also occurs in the training triples (every copy counts); ``duplicate``: the triple repeats
    an earlier test row (the first copy is not a duplicate). Either way its two queries (tail
    and reciprocal head prediction) measure memory or count twice.

    Example:
        >>> import torch
        >>> d = KGData("x", ["a", "b", "c"], ["r"], torch.tensor([[0, 0, 1]]),
        ...            torch.empty(0, 3, dtype=torch.long),
        ...            torch.tensor([[0, 0, 1], [1, 0, 2], [1, 0, 2], [0, 0, 1]]))
        >>> [m.tolist() for m in find_test_leaks(d)]
        [[True, False, False, True], [False, False, True, True]]
    """
    E, R = data.num_entities, data.num_relations

    def keys(x: Tensor) -> Tensor:
        return (x[:, 0] * R + x[:, 1]) * E + x[:, 2]

    key = keys(data.test)
    in_train = torch.isin(key, keys(data.train))
    order = torch.argsort(key, stable=True)
    sk = key[order]
    duplicate = torch.zeros(len(key), dtype=torch.bool)
    duplicate[order[1:]] = sk[1:] == sk[:-1]
    return in_train, duplicate


def _check_leaks(data: KGData, drop: bool) -> KGData:
    """Count (and with ``drop`` remove) the leaked and duplicate test triples, into
    ``data.leaks``."""
    in_train, duplicate = find_test_leaks(data)
    bad = in_train | duplicate
    data.leaks = {
        "num_test_in_train": int(in_train.sum()),
        "num_test_duplicates": int(duplicate.sum()),
        "num_test_dropped": int(bad.sum()) if drop else 0,
    }
    if drop:
        data.test = data.test[~bad]
    return data


def with_reciprocals(triples: Tensor, num_relations: int) -> Tensor:
    """``(h, r, t)`` plus ``(t, r + R, h)``: tail prediction for both directions."""
    inv = torch.stack([triples[:, 2], triples[:, 1] + num_relations, triples[:, 0]], dim=1)
    return torch.cat([triples, inv])
