"""The bake-off's data: a synthetic task with known ``p*(y | x)`` (a fixed random teacher
network) or scikit-learn's digits (shipped with scikit-learn, nothing downloaded).

``synthetic``: ``x ~ N(0, I_d)``; the teacher is a seeded two-layer tanh network whose logits,
standardised over a reference sample and multiplied by ``sharpness``, give
``p*(y | x) = softmax``; labels are drawn from ``p*``. The teacher depends only on
``teacher_seed`` (the same task for every training seed); the sample depends on the run's
seed. ``digits``: the 1,797 8x8 images scaled to [0, 1], split at random by ``split_seed``
(default 0: one split for every run, the seeds change only the training), or by the run's
seed with ``split_seed=None``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["BakeoffData", "Teacher", "make_data"]

DATASETS = ("synthetic", "digits")


class Teacher:
    """A fixed random network ``x (N, d) -> p*(y | x) (N, C)``, float64.

    Example:
        >>> t = Teacher(dim=4, num_classes=3, hidden=8, sharpness=2.0, seed=0)
        >>> p = t.probs(torch.zeros(2, 4, dtype=torch.float64))
        >>> p.shape, bool(torch.allclose(p.sum(1), torch.ones(2, dtype=torch.float64)))
        (torch.Size([2, 3]), True)
    """

    def __init__(self, dim: int, num_classes: int, hidden: int, sharpness: float, seed: int):
        g = torch.Generator().manual_seed(seed)
        kw = {"generator": g, "dtype": torch.float64}
        self.w1 = torch.randn(dim, hidden, **kw) / dim**0.5
        self.b1 = torch.randn(hidden, **kw) * 0.5
        self.w2 = torch.randn(hidden, num_classes, **kw) / hidden**0.5
        ref = self._raw(torch.randn(20000, dim, **kw))
        self.scale = sharpness / ref.std(dim=0).mean()
        self.shift = ref.mean(dim=0)

    def _raw(self, x: Tensor) -> Tensor:
        return torch.tanh(x @ self.w1 + self.b1) @ self.w2

    def logits(self, x: Tensor) -> Tensor:
        return (self._raw(x.to(torch.float64)) - self.shift) * self.scale

    def probs(self, x: Tensor) -> Tensor:
        return torch.softmax(self.logits(x), dim=1)


@dataclass
class BakeoffData:
    """Splits as ``(x float32, y int64)``; ``test_truth`` is ``p*`` of the test points
    (float64 ``(N, C)``) for ``synthetic``, ``None`` for ``digits``."""

    name: str
    train: tuple[Tensor, Tensor]
    val: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]
    test_truth: Tensor | None
    num_classes: int
    bayes_accuracy: float | None = None

    def sizes(self) -> dict[str, int]:
        return {k: len(getattr(self, k)[1]) for k in ("train", "val", "test")}


def _check_positive_ints(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"data.{name}: expected an int >= 1, got {v!r}")


def _synthetic(
    seed: int, n_train: int, n_val: int, n_test: int, dim: int, num_classes: int,
    hidden: int, sharpness: float, teacher_seed: int,
) -> BakeoffData:  # fmt: skip
    teacher = Teacher(dim, num_classes, hidden, sharpness, teacher_seed)
    g = torch.Generator().manual_seed(seed)
    n = n_train + n_val + n_test
    x = torch.randn(n, dim, generator=g, dtype=torch.float64)
    p = teacher.probs(x)
    y = torch.multinomial(p, 1, generator=g)[:, 0]
    xf = x.float()
    a, b = n_train, n_train + n_val
    truth = p[b:]
    return BakeoffData(
        "synthetic",
        (xf[:a], y[:a]),
        (xf[a:b], y[a:b]),
        (xf[b:], y[b:]),
        truth,
        num_classes,
        bayes_accuracy=float(truth.max(dim=1).values.mean()),
    )


def _digits(seed: int, n_val: int, n_test: int, split_seed: int | None) -> BakeoffData:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    if n_val + n_test >= len(y):
        raise ValueError(f"data.n_test: n_val + n_test must be < {len(y)}, got {n_val + n_test}")
    g = torch.Generator().manual_seed(seed if split_seed is None else split_seed)
    perm = torch.randperm(len(y), generator=g)
    test, val, train = perm[:n_test], perm[n_test : n_test + n_val], perm[n_test + n_val :]
    return BakeoffData(
        "digits", (x[train], y[train]), (x[val], y[val]), (x[test], y[test]), None, 10
    )


def make_data(
    seed: int,
    dataset: str = "synthetic",
    n_train: int = 3000,
    n_val: int = 2000,
    n_test: int = 50000,
    dim: int = 8,
    num_classes: int = 5,
    hidden: int = 16,
    sharpness: float = 2.0,
    teacher_seed: int = 1234,
    split_seed: int | None = 0,
) -> BakeoffData:
    """Build the splits for one training seed. The command line's ``--data.*`` options are
    the arguments after ``seed``.

    Args:
        seed: the run's seed (synthetic: the sample; digits: the split when ``split_seed``
            is ``None``).
        dataset: ``"synthetic"`` or ``"digits"``.
        n_train: synthetic training points (digits: the rest of the 1,797).
        n_val: validation points (the temperature is fitted on them).
        n_test: test points.
        dim: synthetic input dimension.
        num_classes: synthetic number of classes.
        hidden: width of the teacher's hidden layer.
        sharpness: standard deviation of the teacher's logits (higher: a more certain truth).
        teacher_seed: seed of the teacher's weights (the task).
        split_seed: digits: seed of the split, the same for every run (``None``: the run's).

    Example:
        >>> d = make_data(0, n_train=10, n_val=5, n_test=7)
        >>> d.sizes(), tuple(d.test_truth.shape)
        ({'train': 10, 'val': 5, 'test': 7}, (7, 5))
    """
    if dataset not in DATASETS:
        raise ValueError(f"data.dataset: expected one of {DATASETS}, got {dataset!r}")
    _check_positive_ints(n_val=n_val, n_test=n_test)
    if dataset == "digits":
        return _digits(seed, n_val, n_test, split_seed)
    _check_positive_ints(n_train=n_train, dim=dim, num_classes=num_classes, hidden=hidden)
    if num_classes < 2:
        raise ValueError(f"data.num_classes: expected an int >= 2, got {num_classes}")
    if not isinstance(sharpness, (int, float)) or not sharpness > 0:
        raise ValueError(f"data.sharpness: expected a float > 0, got {sharpness!r}")
    return _synthetic(
        seed, n_train, n_val, n_test, dim, num_classes, hidden, float(sharpness), teacher_seed
    )
