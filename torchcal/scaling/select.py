"""``calibrate``: fit the candidate post-hoc maps on shared folds and keep the one with the
lowest cross-validated NLL (docs/design.md section 4, "Choosing the map")."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torchcal.functional._checks import check_int
from torchcal.functional.folds import fold_complement, kfold_indices
from torchcal.scaling._base import check_logits_target
from torchcal.scaling.affine import CVFit, MatrixScaler, VectorScaler
from torchcal.scaling.dirichlet import DirichletScaler
from torchcal.scaling.temperature import TemperatureScaler

__all__ = ["calibrate", "Calibrated", "Candidate", "register_calibrator"]

#: a factory: ``(num_classes, folds, seed) -> unfitted calibrator``
Factory = Callable[[int, int, int], nn.Module]

#: scores within this many nats a row of the lowest are a tie, won by the earlier method (a
#: map that fell back to its temperature scores one temperature's NLL up to rounding)
TIE = 1e-9

_REGISTRY: dict[str, Factory] = {
    "temperature": lambda c, k, s: TemperatureScaler(),
    "vector": lambda c, k, s: VectorScaler(c, folds=k, seed=s),
    "matrix": lambda c, k, s: MatrixScaler(c, folds=k, seed=s),
    "dirichlet": lambda c, k, s: DirichletScaler(c, folds=k, seed=s),
}


def register_calibrator(name: str, factory: Factory) -> None:
    """Make ``name`` a method of :func:`calibrate`: ``factory(num_classes, folds, seed)``
    returns an unfitted calibrator (an ``nn.Module`` with ``fit(logits, target)`` and a
    ``forward`` returning calibrated logits). A registered name may not be replaced.

    Example:
        >>> from torchcal.scaling import DirichletScaler, register_calibrator
        >>> register_calibrator(
        ...     "dirichlet_diagonal",
        ...     lambda c, k, s: DirichletScaler(c, variant="diagonal", folds=k, seed=s))
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"name: {name!r} is already registered")
    if not callable(factory):
        raise TypeError(f"factory: expected a callable (num_classes, folds, seed), got {factory!r}")
    _REGISTRY[name] = factory


@dataclass(frozen=True)
class Candidate:
    """One row of :func:`calibrate`'s table: ``cv_nll`` the held-out NLL summed over the
    folds per row, ``fit_time`` seconds (the cross-validation and the refit), ``reg`` the
    chosen strength (``None``: none, or the map fell back to its temperature), ``note``
    what was measured (``"own folds"``: the map's own path on the shared folds;
    ``"refitted per fold"``: the candidate refitted on each fold's fit rows; a map that fell
    back to one temperature scores that temperature's NLL on the same folds)."""

    name: str
    cv_nll: float
    fit_time: float
    reg: float | None
    note: str


@dataclass(frozen=True)
class Calibrated:
    """What :func:`calibrate` chose: ``name``, the fitted ``calibrator`` (refitted on all
    rows) and the ``table`` of every candidate, in the order given."""

    name: str
    calibrator: nn.Module
    table: tuple[Candidate, ...]

    def __str__(self) -> str:
        rows = [f"{'method':<20} {'CV NLL':>10} {'time (s)':>9}  reg"]
        for c in self.table:
            mark = " *" if c.name == self.name else ""
            reg = "-" if c.reg is None else f"{c.reg:.3g}"
            rows.append(f"{c.name + mark:<20} {c.cv_nll:>10.5f} {c.fit_time:>9.2f}  {reg}")
        return "\n".join(rows)


def _resolve(method: object, num_classes: int, folds: int, seed: int) -> tuple[str, nn.Module]:
    if isinstance(method, str):
        if method not in _REGISTRY:
            raise ValueError(
                f"methods: unknown method {method!r}; expected one of {sorted(_REGISTRY)} "
                f"(register_calibrator adds one), a calibrator instance or class"
            )
        return method, _REGISTRY[method](num_classes, folds, seed)
    if isinstance(method, nn.Module) and callable(getattr(method, "fit", None)):
        return type(method).__name__, copy.deepcopy(method)
    if isinstance(method, type) and issubclass(method, nn.Module):
        try:
            return method.__name__, method(num_classes)
        except TypeError:
            return method.__name__, method()
    raise TypeError(f"methods: expected names, calibrator instances or classes, got {method!r}")


def _refit_per_fold(
    proto: nn.Module, logits: Tensor, target: Tensor, held: tuple[Tensor, ...]
) -> float:
    n, total = logits.shape[0], 0.0
    for ho in held:
        fit = fold_complement(n, ho)
        m = copy.deepcopy(proto)
        cast(Any, m).fit(logits[fit], target[fit])
        with torch.no_grad():
            out = m(logits[ho]).to(torch.float64)
        total += float(F.cross_entropy(out, target[ho], reduction="sum"))
    return total / n


def calibrate(
    logits: Tensor,
    target: Tensor,
    methods: Sequence[object] = ("temperature", "vector", "matrix", "dirichlet"),
    *,
    folds: int = 5,
    seed: int = 0,
) -> Calibrated:
    """Fit every candidate on the same seeded, shuffled folds
    (:func:`~torchcal.functional.folds.kfold_indices`) and return the one with the lowest
    cross-validated NLL, refitted on all rows, with the table of candidates.

    ``methods`` holds names (``"temperature"``, ``"vector"``, ``"matrix"``, ``"dirichlet"``
    and those added by :func:`register_calibrator`), calibrator instances (deep-copied,
    never fitted in place) or classes (built as ``cls(num_classes)``, else ``cls()``). A
    candidate whose fit returns a :class:`CVFit` on these folds is scored by its own path
    (its best strength's CV NLL, or the temperature's where it fell back: the strength's
    choice on the same folds makes it slightly optimistic); any other is refitted on each
    fold's fit rows and scored on the held-out rows. Ties (within :data:`TIE`) go to the earlier
    method.

    Example:
        >>> import torch
        >>> from torchcal.scaling import calibrate
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(1000, 4, generator=g)
        >>> bias = torch.tensor([1.0, 0.0, -1.0, 0.5])
        >>> y = torch.multinomial(torch.softmax(z / 2 + bias, 1), 1, generator=g).squeeze(1)
        >>> best = calibrate(z, y, methods=("temperature", "vector"))
        >>> best.name, [c.name for c in best.table], best.table[1].note
        ('vector', ['temperature', 'vector'], 'own folds')
    """
    check_logits_target(logits, target, multiclass_only=True)
    folds = check_int("folds", folds, minimum=2)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: expected an int, got {seed!r}")
    n, num_classes = logits.shape
    if folds > n:
        raise ValueError(f"folds: expected at most N = {n} folds (one row each), got {folds}")
    if isinstance(methods, (str, nn.Module)) or not methods:
        raise ValueError(f"methods: expected a non-empty sequence of methods, got {methods!r}")
    held = kfold_indices(n, folds, seed)
    table: list[Candidate] = []
    fitted: list[nn.Module] = []
    for method in methods:
        name, proto = _resolve(method, num_classes, folds, seed)
        start = time.perf_counter()
        model = copy.deepcopy(proto)
        res = cast(Any, model).fit(logits, target)
        if isinstance(res, CVFit) and (res.folds, res.seed) == (folds, seed):
            score = res.temperature_cv_nll if res.fallback else min(res.cv_nll)
            reg = res.reg
            note = "own folds, fell back to one temperature" if res.fallback else "own folds"
        else:
            score = _refit_per_fold(proto, logits, target, held)
            reg, note = None, "refitted per fold"
        table.append(Candidate(name, score, time.perf_counter() - start, reg, note))
        fitted.append(model)
    low = min(c.cv_nll for c in table)
    best = next(i for i, c in enumerate(table) if c.cv_nll <= low + TIE)
    return Calibrated(table[best].name, fitted[best], tuple(table))
