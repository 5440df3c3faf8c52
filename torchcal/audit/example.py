"""Example data for ``torchcal audit``: a two-domain judging task.

A model judges answers and states ``p_correct``, its probability that the answer is correct.
In the ``math`` domain the stated probability is the true one (calibrated); in ``open_qa`` the
model is over-confident: its stated log-odds are the true log-odds times 2.5, so a stated 0.8
is right about 64 % of the time. The true log-odds are drawn from a normal distribution
(mean 1.2, sd 1), so about half of each domain lies in the bins around a 0.8 threshold.
``correct`` is drawn from the true probability. Used by the README's one-line example
(``torchcal example judging.csv``).

``--kind stated`` (:func:`make_stated_data`) writes what an LLM judge gives: a *stated*
confidence per answer, rounded to a 0.05 grid and written as a percent (``"85%"``). In
``math`` the stated confidence is the true probability rounded to the grid; in ``open_qa``
the judge says 85-95 % for most answers while it is right about 70 % of the time there.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

DOMAINS = {"math": 1.0, "open_qa": 2.5}  # name -> factor on the true log-odds
_MEAN, _SD = 1.2, 1.0


def make_judging_data(n_per_domain: int = 3000, seed: int = 0) -> dict[str, Tensor | list[str]]:
    """Rows of the judging task, domains interleaved in a seeded order: ``id`` (int64),
    ``domain`` (list of names), ``p_correct`` (float64, rounded to 6 decimals: what the CSV
    holds) and ``correct`` (int64 0/1).

    Example:
        >>> d = make_judging_data(50, seed=1)
        >>> len(d["domain"]), sorted(set(d["domain"]))
        (100, ['math', 'open_qa'])
        >>> bool(((d["p_correct"] > 0) & (d["p_correct"] < 1)).all())
        True
    """
    if isinstance(n_per_domain, bool) or not isinstance(n_per_domain, int) or n_per_domain < 1:
        raise ValueError(f"n_per_domain: expected a positive integer, got {n_per_domain!r}")
    g = torch.Generator().manual_seed(int(seed))
    z = _MEAN + _SD * torch.randn(len(DOMAINS), n_per_domain, generator=g, dtype=torch.float64)
    factor = torch.tensor(list(DOMAINS.values()), dtype=torch.float64)[:, None]
    stated = torch.sigmoid(factor * z).reshape(-1)
    correct = torch.bernoulli(torch.sigmoid(z).reshape(-1), generator=g).long()
    domain = torch.arange(len(DOMAINS)).repeat_interleave(n_per_domain)
    order = torch.randperm(domain.numel(), generator=g)
    names = list(DOMAINS)
    # the CSV's 6-decimal text, read back: the in-memory rows equal the file's
    p = torch.tensor([float(f"{v:.6f}") for v in stated[order].tolist()], dtype=torch.float64)
    return {
        "id": torch.arange(domain.numel()),
        "domain": [names[i] for i in domain[order].tolist()],
        "p_correct": p,
        "correct": correct[order],
    }


def write_judging_csv(path: str | os.PathLike[str], n_per_domain: int = 3000, seed: int = 0) -> int:
    """Write :func:`make_judging_data` as CSV (``id,domain,p_correct,correct``); returns the
    number of rows.

    Example:
        >>> import tempfile
        >>> path = tempfile.mkdtemp() + "/judging.csv"
        >>> write_judging_csv(path, 3)
        6
        >>> open(path).readline().strip()
        'id,domain,p_correct,correct'
    """
    d = make_judging_data(n_per_domain, seed)
    rows = zip(d["id"].tolist(), d["domain"], d["p_correct"].tolist(), d["correct"].tolist())
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("id,domain,p_correct,correct\n")
        f.writelines(f"{i},{dom},{p:.6f},{y}\n" for i, dom, p, y in rows)
    return len(d["domain"])


def make_stated_data(n_per_domain: int = 3000, seed: int = 0) -> dict[str, Tensor | list[str]]:
    """Rows of an LLM judge's stated confidences: ``id``, ``domain``, ``confidence`` (the
    stated value, float64 on a 0.05 grid in [0.5, 1]) and ``correct``. ``math``: the true
    probability of being right is the stated one; ``open_qa``: over-confident (true log-odds
    of the stated confidence divided by 2.5), so a stated 0.9 is right about 71 % of the time (and it says 90-95 % for most answers).

    Example:
        >>> d = make_stated_data(200, seed=1)
        >>> sorted({round(v * 20) for v in d["confidence"].tolist()}) [:3]
        [10, 11, 12]
    """
    if isinstance(n_per_domain, bool) or not isinstance(n_per_domain, int) or n_per_domain < 1:
        raise ValueError(f"n_per_domain: expected a positive integer, got {n_per_domain!r}")
    g = torch.Generator().manual_seed(int(seed))
    z = _MEAN + _SD * torch.randn(len(DOMAINS), n_per_domain, generator=g, dtype=torch.float64)
    factor = torch.tensor(list(DOMAINS.values()), dtype=torch.float64)[:, None]
    stated = (torch.sigmoid(factor * z) * 20).round().clamp(10, 19) / 20  # 0.50 .. 0.95
    true = torch.sigmoid(torch.logit(stated.clamp(0.5, 0.99)) / factor)
    correct = torch.bernoulli(true.reshape(-1), generator=g).long()
    domain = torch.arange(len(DOMAINS)).repeat_interleave(n_per_domain)
    order = torch.randperm(domain.numel(), generator=g)
    names = list(DOMAINS)
    return {
        "id": torch.arange(domain.numel()),
        "domain": [names[i] for i in domain[order].tolist()],
        "confidence": stated.reshape(-1)[order],
        "correct": correct[order],
    }


def write_stated_csv(path: str | os.PathLike[str], n_per_domain: int = 3000, seed: int = 0) -> int:
    """Write :func:`make_stated_data` as CSV (``id,domain,confidence,correct``) with the
    confidence as a percent string (``85%``); returns the number of rows.

    Example:
        >>> import tempfile
        >>> path = tempfile.mkdtemp() + "/stated.csv"
        >>> write_stated_csv(path, 3)
        6
        >>> open(path).read().splitlines()[1].split(",")[2].endswith("%")
        True
    """
    d = make_stated_data(n_per_domain, seed)
    rows = zip(d["id"].tolist(), d["domain"], d["confidence"].tolist(), d["correct"].tolist())
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("id,domain,confidence,correct\n")
        f.writelines(f"{i},{dom},{round(c * 100)}%,{y}\n" for i, dom, c, y in rows)
    return len(d["domain"])
