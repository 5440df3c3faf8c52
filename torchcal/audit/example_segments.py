"""Example data for ``torchcal audit --segments`` (``torchcal example --kind segments``): a
model whose pooled calibration is fine while two segments are not.

Rows carry a language (``en``, ``de``, ``fr``, ``es``), a document type (``chat``, ``email``,
``form``) and a length in tokens (numeric: quantile buckets). The stated ``p`` is the true
probability everywhere except in ``de & form``, where the truth is 20 points lower
(over-confident), and in ``fr & chat``, where it is 20 points higher: the two cancel in the
pooled bins, so the pooled audit PASSes and only ``--segments lang doc`` finds them.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

LANGS = ("en", "de", "fr", "es")
DOCS = ("chat", "email", "form")
#: (lang, doc) -> points added to the true probability
SHIFTS = {("de", "form"): -0.2, ("fr", "chat"): 0.2}


def make_segments_data(n_per_lang: int = 3000, seed: int = 0) -> dict[str, Tensor | list[str]]:
    """Rows of the segments example: ``lang``, ``doc`` (lists), ``length`` (int64), ``p``
    (float64, 6 decimals: the CSV's text) and ``correct`` (int64 0/1).

    Example:
        >>> d = make_segments_data(100, seed=1)
        >>> len(d["lang"]), sorted(set(d["doc"]))
        (400, ['chat', 'email', 'form'])
    """
    if isinstance(n_per_lang, bool) or not isinstance(n_per_lang, int) or n_per_lang < 1:
        raise ValueError(f"n: expected a positive integer, got {n_per_lang!r}")
    g = torch.Generator().manual_seed(int(seed))
    n = n_per_lang * len(LANGS)
    lang = torch.arange(len(LANGS)).repeat_interleave(n_per_lang)
    lang = lang[torch.randperm(n, generator=g)]
    doc = torch.randint(0, len(DOCS), (n,), generator=g)
    length = torch.exp(5 + 0.8 * torch.randn(n, generator=g, dtype=torch.float64)).round().long()
    raw = torch.sigmoid(0.6 + torch.randn(n, generator=g, dtype=torch.float64))
    p = torch.tensor([float(f"{v:.6f}") for v in raw.tolist()], dtype=torch.float64)
    shift = torch.zeros(n, dtype=torch.float64)
    for (lg, dc), s in SHIFTS.items():
        shift[(lang == LANGS.index(lg)) & (doc == DOCS.index(dc))] = s
    truth = (p + shift).clamp(0.01, 0.99)
    correct = torch.bernoulli(truth, generator=g).long()
    return {
        "lang": [LANGS[i] for i in lang.tolist()],
        "doc": [DOCS[i] for i in doc.tolist()],
        "length": length,
        "p": p,
        "correct": correct,
    }


def write_segments_csv(path: str | os.PathLike[str], n_per_lang: int = 3000, seed: int = 0) -> int:
    """Write :func:`make_segments_data` as CSV (``lang,doc,length,p,correct``); returns the
    number of rows."""
    d = make_segments_data(n_per_lang, seed)
    with open(path, "w", newline="") as f:
        f.write("lang,doc,length,p,correct\n")
        cols = [d["lang"], d["doc"]] + [t.tolist() for t in (d["length"], d["p"], d["correct"])
                                        if isinstance(t, Tensor)]  # fmt: skip
        for row in zip(*cols, strict=True):
            f.write(f"{row[0]},{row[1]},{row[2]},{row[3]:.6f},{row[4]}\n")
    return len(d["lang"])


def write_example(kind: str, path: str, n: int, seed: int) -> str:
    """Write ``torchcal example --kind KIND`` to ``path``; the line the command prints."""
    from torchcal.audit.example import DOMAINS, write_judging_csv, write_stated_csv

    if kind == "segments":
        rows = write_segments_csv(path, n, seed)
        return f"wrote {rows} rows (segments: lang, doc, length) to {path}"
    write = write_stated_csv if kind == "stated" else write_judging_csv
    return f"wrote {write(path, n, seed)} rows (domains: {', '.join(DOMAINS)}) to {path}"
