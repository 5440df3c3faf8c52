"""Every post-hoc map on the same logits, torchcal's and its peers': test NLL, ECE, accuracy and
fit time in one run, printed as one markdown table (docs/benchmarks.md, "Post-hoc maps").

Data (each map is fitted on the fit split and scored on the test split):

- ``synthetic-T C=10/100/1000``: ``z = 3 * randn``, labels drawn from ``softmax(z / 2)``: one
  temperature is the truth (the ``truth`` row scores the true probabilities).
- ``synthetic-bias C=10/100``: labels from ``softmax(z / 2 + b)`` with a fixed per-class bias
  ``b ~ N(0, 1)``: a richer map (vector scaling) is the truth.
- ``synthetic-beta binary``: binary scores whose truth is a beta map (``a = 1.6, b = 0.7``):
  the binary maps and peers (beta calibration, Venn-Abers).
- ``digits MLP``: the bake-off's two-layer MLP (recipes/loss_bakeoff) trained with the log
  score on scikit-learn's digits (shipped with scikit-learn); 697 training, 600 fit and 500 test
  images.
- ``ComplEx tail``: the held-out tail queries of recipes/complex_link_prediction/minimal.py
  (20 epochs on the generated family graph; the masked ``-inf`` entries are replaced by the
  row's finite minimum minus 50 for every map, since the peers cannot take ``-inf``), fit on one
  half of the queries, scored on the other.

Maps: torchcal's ``TemperatureScaler``, ``VectorScaler``, ``MatrixScaler`` and, where they can
be imported, ``DirichletScaler``, ``StructuredScaler``, ``BetaScaler``, ``VennAbersCalibrator``
and ``calibrate(...)`` (a map that cannot be imported is listed as "not available"); peers:
probmetrics (temperature scaling, SVS, SMS; its Dirichlet calibrator needs ``dirichletcal``,
which cannot be installed here), netcal (temperature scaling, beta), betacal and venn-abers
(binary). A map whose C^2 weights are too many for this CPU is listed as skipped. Each fit runs
on ``--threads`` threads (default 1); the fit time is the ``fit`` call alone, wall clock and (in
brackets) the CPU time of the process, which a loaded machine does not inflate.

    python benchmarks/bench_maps.py            # about 6 minutes of CPU (one thread)
    python benchmarks/bench_maps.py --quick    # tiny sizes, a smoke run
    python benchmarks/bench_maps.py --maps VennAbersCalibrator --cases "synthetic-T C=100" digits
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchcal.functional import calibration_error  # noqa: E402

MAX_SQUARE_CLASSES = 200  # full C x C maps are skipped above this many classes


@dataclass
class Case:
    """One data set: float32 logits (``(N, C)``, or ``(N,)`` binary) and int64 labels."""

    name: str
    fit: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]
    truth: Tensor | None = None  # the true test probabilities, where known

    @property
    def binary(self) -> bool:
        return self.fit[0].dim() == 1

    @property
    def num_classes(self) -> int:
        return 2 if self.binary else int(self.fit[0].shape[1])


# ---------------------------------------------------------------------------------- data
def _draw(p: Tensor, g: torch.Generator) -> Tensor:
    return torch.multinomial(p, 1, generator=g).squeeze(1)


def synthetic(c: int, n_fit: int, n_test: int, truth: str, seed: int = 0) -> Case:
    """Over-confident logits ``3 * randn``; labels from the true map (``"T"``: ``z / 2``;
    ``"bias"``: ``z / 2 + b``)."""
    g = torch.Generator().manual_seed(seed + c)
    z = 3 * torch.randn(n_fit + n_test, c, generator=g)
    bias = torch.randn(c, generator=g) if truth == "bias" else torch.zeros(c)
    p = torch.softmax(z.double() / 2 + bias.double(), 1)
    y = _draw(p, g)
    return Case(
        f"synthetic-{truth} C={c}",
        (z[:n_fit], y[:n_fit]),
        (z[n_fit:], y[n_fit:]),
        p[n_fit:],
    )


def synthetic_beta(n_fit: int, n_test: int, seed: int = 0) -> Case:
    """Binary logits ``s = logit(q)``, ``q ~ U(0.02, 0.98)``; the truth is the beta map
    ``1.6 ln q - 0.7 ln(1 - q) + 0.2``."""
    g = torch.Generator().manual_seed(seed + 7)
    q = 0.02 + 0.96 * torch.rand(n_fit + n_test, generator=g, dtype=torch.float64)
    p = torch.sigmoid(1.6 * torch.log(q) - 0.7 * torch.log1p(-q) + 0.2)
    y = torch.bernoulli(p, generator=g).long()
    s = torch.logit(q).float()
    return Case("synthetic-beta binary", (s[:n_fit], y[:n_fit]), (s[n_fit:], y[n_fit:]), p[n_fit:])


def digits(epochs: int) -> Case:
    """The bake-off's MLP trained with the log score on digits; its fit/test logits."""
    from recipes.loss_bakeoff.data import make_data
    from recipes.loss_bakeoff.model import make_mlp

    data = make_data(0, dataset="digits", n_val=600, n_test=500)
    torch.manual_seed(0)
    net = make_mlp(64, 10, 128, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=0.0)
    x, y = data.train
    g = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(128):
            opt.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
    with torch.no_grad():
        return Case(
            "digits MLP",
            (net(data.val[0]), data.val[1]),
            (net(data.test[0]), data.test[1]),
        )


def complex_tail(epochs: int) -> Case:
    """The minimal ComplEx recipe's held-out tail logits (both directions, known answers
    masked), ``-inf`` replaced by the row's finite minimum minus 50."""
    from recipes.complex_link_prediction.datasets import load_dataset, with_reciprocals
    from recipes.complex_link_prediction.evaluation import TripleFilter, mask_known
    from recipes.complex_link_prediction.model import ComplEx
    from torchcal.losses import LogScoreLoss

    torch.manual_seed(0)
    data = load_dataset("family", num_families=8, generations=4, seed=0)
    E, R = data.num_entities, data.num_relations
    model = ComplEx(E, R, rank=64)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.1)
    loss_fn = LogScoreLoss()
    train = with_reciprocals(data.train, R)
    for _ in range(epochs):
        for batch in train[torch.randperm(len(train))].split(500):
            h, r, t = batch.unbind(1)
            scores, n3 = model.scores_and_n3(h, r, t)
            loss = loss_fn(scores, t) + 0.01 * n3
            opt.zero_grad()
            loss.backward()
            opt.step()
    h, r, t = with_reciprocals(data.test, R).unbind(1)
    known = TripleFilter(with_reciprocals(data.known(), R), E, 2 * R)
    with torch.no_grad():
        z = mask_known(model.score_all(h, r, dtype=torch.float64), t, known.mask(h, r))
    low = torch.where(torch.isinf(z), torch.inf, z).amin(1, keepdim=True) - 50
    z = torch.where(torch.isinf(z), low, z).float()
    half = torch.arange(len(t)) % 2 == 0
    return Case(f"ComplEx tail C={E}", (z[half], t[half]), (z[~half], t[~half]))


# ---------------------------------------------------------------------------------- maps
# a map: (fitted predict function returning test probabilities) = fit(case)
Fit = Callable[[Case], Callable[[Tensor], Tensor]]


@dataclass
class Map:
    name: str
    source: str
    kind: str  # "multiclass", "binary" or "both"
    fit: Fit | str  # a str: why it cannot run ("not available: ...")
    square: bool = False  # C x C weights: skipped above MAX_SQUARE_CLASSES


def _import(path: str) -> Any:
    """``module:attr`` imported, or the reason it cannot be (a str)."""
    module, attr = path.split(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        return f"not available ({type(e).__name__})"


def _probs(out: Tensor, binary: bool) -> Tensor:
    """Logits or probabilities a map returned, as float64 probabilities of the case's kind."""
    out = out.detach().double()
    if binary:
        if out.dim() == 2 and out.shape[1] == 2:
            out = out[:, 1]
        return out.reshape(-1)
    return out / out.sum(1, keepdim=True)  # one-vs-rest maps need not sum to 1


def _torchcal(path: str) -> Fit | str:
    """A torchcal calibrator at its defaults (given ``num_classes`` and ``input="logits"``
    where its constructor takes them): ``fit(z, y)``; probabilities from ``predict_proba``
    where it has one, else the softmax/sigmoid of its logits."""
    cls = _import(path)
    if isinstance(cls, str):
        return cls
    params = inspect.signature(cls).parameters

    def fit(case: Case) -> Callable[[Tensor], Tensor]:
        kw: dict[str, Any] = {"input": "logits"} if "input" in params else {}
        if "num_classes" in params:
            kw["num_classes"] = case.num_classes
        m = cls(**kw)
        m.fit(*case.fit)

        def predict(z: Tensor) -> Tensor:
            with torch.no_grad():
                if hasattr(m, "predict_proba"):
                    return _probs(m.predict_proba(z), case.binary)
                out = m(z).double()
            return torch.sigmoid(out) if case.binary else torch.softmax(out, 1)

        return predict

    return fit


def _calibrate() -> Fit | str:
    """``torchcal.scaling.calibrate(logits, target)`` at its default candidates (multiclass;
    its matrix and Dirichlet candidates make it a C x C map): the candidate with the lowest
    cross-validated NLL, applied to the test logits; the row names the chosen one."""
    calibrate = _import("torchcal.scaling.select:calibrate")
    if isinstance(calibrate, str):
        return calibrate

    def fit(case: Case) -> Callable[[Tensor], Tensor]:
        res = calibrate(*case.fit)
        m = res if isinstance(res, torch.nn.Module) else None
        for attr in ("calibrator", "scaler", "best", "module", "model"):
            m = m or getattr(res, attr, None)
        if not isinstance(m, torch.nn.Module):
            raise TypeError(f"calibrate returned {type(res).__name__} with no calibrator")
        fitted: torch.nn.Module = m

        def predict(z: Tensor) -> Tensor:
            with torch.no_grad():
                return torch.softmax(fitted(z).double(), 1)

        predict.chosen = getattr(res, "name", "?")  # type: ignore[attr-defined]
        return predict

    return fit


def _two_columns(z: Tensor, binary: bool) -> Tensor:
    return torch.stack([torch.zeros_like(z), z], 1) if binary else z


def _probmetrics(method: str, **config: Any) -> Fit | str:
    get = _import("probmetrics.calibrators:get_calibrator")
    if isinstance(get, str):
        return get

    def fit(case: Case) -> Callable[[Tensor], Tensor]:
        from probmetrics.distributions import CategoricalLogits

        cal = get(method, **config)
        cal.fit_torch(
            CategoricalLogits(_two_columns(case.fit[0].double(), case.binary)), case.fit[1]
        )

        def predict(z: Tensor) -> Tensor:
            d = CategoricalLogits(_two_columns(z.double(), case.binary))
            return _probs(cal.predict_proba_torch(d).get_probs(), case.binary)

        return predict

    return fit


def _numpy_probs(z: Tensor, binary: bool) -> np.ndarray:
    z = z.double()
    return (torch.sigmoid(z) if binary else torch.softmax(z, 1)).numpy()


def _netcal(name: str) -> Fit | str:
    cls = _import(f"netcal.scaling:{name}")
    if isinstance(cls, str):
        return cls

    def fit(case: Case) -> Callable[[Tensor], Tensor]:
        cal = cls()
        cal.fit(_numpy_probs(case.fit[0], case.binary), case.fit[1].numpy())

        def predict(z: Tensor) -> Tensor:
            p = torch.as_tensor(np.asarray(cal.transform(_numpy_probs(z, case.binary))))
            return _probs(p, case.binary)

        return predict

    return fit


def _betacal() -> Fit | str:
    cls = _import("betacal:BetaCalibration")
    if isinstance(cls, str):
        return cls

    def fit(case: Case) -> Callable[[Tensor], Tensor]:
        cal = cls(parameters="abm")
        cal.fit(_numpy_probs(case.fit[0], True).reshape(-1, 1), case.fit[1].numpy())
        return lambda z: torch.as_tensor(cal.predict(_numpy_probs(z, True).reshape(-1, 1)))

    return fit


def _venn_abers() -> Fit | str:
    cls = _import("venn_abers:VennAbers")
    if isinstance(cls, str):
        return cls

    def two(z: Tensor) -> np.ndarray:
        p = _numpy_probs(z, True)
        return np.stack([1 - p, p], 1)

    def fit(case: Case) -> Callable[[Tensor], Tensor]:
        va = cls()
        va.fit(two(case.fit[0]), case.fit[1].numpy())
        return lambda z: _probs(torch.as_tensor(va.predict_proba(two(z))[0]), True)

    return fit


def all_maps() -> list[Map]:
    sc = "torchcal.scaling"
    return [
        Map("TemperatureScaler", "torchcal", "both", _torchcal(f"{sc}:TemperatureScaler")),
        Map("VectorScaler", "torchcal", "multiclass", _torchcal(f"{sc}:VectorScaler")),
        Map(
            "MatrixScaler", "torchcal", "multiclass",
            _torchcal(f"{sc}:MatrixScaler"), square=True,
        ),
        Map(
            "DirichletScaler", "torchcal", "multiclass",
            _torchcal(f"{sc}.dirichlet:DirichletScaler"), square=True,
        ),
        Map(
            "StructuredScaler", "torchcal", "multiclass",
            _torchcal(f"{sc}.structured:StructuredScaler"),
        ),
        Map(
            "BetaScaler", "torchcal", "binary",
            _torchcal(f"{sc}.beta:BetaScaler"),
        ),
        Map(
            "VennAbersCalibrator", "torchcal", "both",
            _torchcal(f"{sc}.venn_abers:VennAbersCalibrator"),
        ),
        Map("calibrate(...)", "torchcal", "multiclass", _calibrate(), square=True),
        Map("temp-scaling", "probmetrics", "both", _probmetrics("temp-scaling")),
        Map("svs", "probmetrics", "multiclass", _probmetrics("svs", svs_print_init_info=False)),
        Map("sms", "probmetrics", "multiclass", _probmetrics("sms", sms_print_init_info=False)),
        Map("TemperatureScaling", "netcal", "both", _netcal("TemperatureScaling")),
        Map("BetaCalibration", "netcal", "binary", _netcal("BetaCalibration")),
        Map("BetaCalibration", "betacal", "binary", _betacal()),
        Map("VennAbers", "venn-abers", "binary", _venn_abers()),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------- scoring
def score(p: Tensor, y: Tensor, binary: bool) -> dict[str, float]:
    """Test NLL (nats; ``inf`` where a true class got probability 0), ECE (15 equal-width
    bins, l1; top-label confidence, binary: P(y = 1)) and accuracy of float64 probabilities."""
    if binary:
        py = torch.where(y == 1, p, 1 - p)
        pred = (p > 0.5).long()
        ece = calibration_error(p, y, input="probs", reading="binary")
    else:
        py = p.gather(1, y[:, None]).squeeze(1)
        pred = p.argmax(1)
        ece = calibration_error(p, y, input="probs")
    return {
        "nll": float(-torch.log(py).mean()),
        "ece": float(ece),
        "accuracy": float((pred == y).double().mean()),
    }


def applies(m: Map, case: Case) -> str | None:
    """Why ``m`` does not run on ``case`` (``None``: it runs)."""
    if m.kind == "binary" and not case.binary:
        return "binary only"
    if m.kind == "multiclass" and case.binary:
        return "multiclass only"
    if isinstance(m.fit, str):
        return m.fit
    if m.square and case.num_classes > MAX_SQUARE_CLASSES:
        return f"skipped ({case.num_classes}^2 weights)"
    return None


def run_case(case: Case, maps: list[Map]) -> list[dict[str, Any]]:
    z, y = case.test
    rows: list[dict[str, Any]] = []
    base = torch.sigmoid(z.double()) if case.binary else torch.softmax(z.double(), 1)
    rows.append({"map": "none", "source": "-", **score(base, y, case.binary), "time": None})
    if case.truth is not None:
        rows.append(
            {"map": "truth", "source": "-", **score(case.truth, y, case.binary), "time": None}
        )
    for m in maps:
        why = applies(m, case)
        if why is not None:
            if not why.startswith(("binary only", "multiclass only")):
                rows.append({"map": m.name, "source": m.source, "note": why})
            continue
        assert not isinstance(m.fit, str)
        try:
            # netcal prints warnings on stdout, probmetrics its start: not into the table
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                t0, c0 = time.perf_counter(), time.process_time()
                predict = m.fit(case)
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                p = predict(z)
            name = f"{m.name} → {predict.chosen}" if hasattr(predict, "chosen") else m.name
            r = {"map": name, "source": m.source, **score(p, y, case.binary)}
            rows.append({**r, "time": dt, "cpu": dc})
            print(f"    {m.name} ({m.source}): {dt:.2f} s ({dc:.2f} s CPU)", file=sys.stderr)
        except Exception as e:  # a peer's failure is a row, not the end of the run
            rows.append(
                {"map": m.name, "source": m.source, "note": f"failed: {type(e).__name__}: {e}"[:90]}
            )
    return rows


def table(results: list[tuple[Case, list[dict[str, Any]]]]) -> str:
    lines = [
        "| data (fit / test rows) | map | source | test NLL | ECE | accuracy | fit: wall (CPU) |",
        "|---|---|---|---|---|---|---|",
    ]
    for case, rows in results:
        label = f"{case.name} ({len(case.fit[1])} / {len(case.test[1])})"
        for r in rows:
            if "note" in r:
                cells = [r["note"], "", "", ""]
            else:
                t = "-" if r["time"] is None else f"{r['time']:.2f} s ({r['cpu']:.2f} s)"
                nll = "inf" if math.isinf(r["nll"]) else f"{r['nll']:.4f}"
                cells = [nll, f"{r['ece']:.4f}", f"{r['accuracy']:.4f}", t]
            lines.append(f"| {label} | {r['map']} | {r['source']} | " + " | ".join(cells) + " |")
            label = ""
    return "\n".join(lines)


def cases(quick: bool, only: list[str] | None = None) -> list[Case]:
    """The data sets; ``only``: those named so, or whose name starts with one of these and a
    space (``"synthetic-T"``, ``"digits"``); the others are not built (digits and ComplEx
    train a model)."""
    if quick:
        made: list[tuple[str, Callable[[], Case]]] = [
            ("synthetic-T C=4", lambda: synthetic(4, 200, 300, "T")),
            ("synthetic-bias C=12", lambda: synthetic(12, 300, 300, "bias")),
            ("synthetic-beta binary", lambda: synthetic_beta(200, 300)),
            ("digits MLP", lambda: digits(epochs=2)),
        ]
    else:
        made = [
            (f"synthetic-{t} C={c}", lambda c=c, t=t: synthetic(c, 5000, 10000, t))
            for t, cs in (("T", (10, 100, 1000)), ("bias", (10, 100)))
            for c in cs
        ]
        made += [
            ("synthetic-beta binary", lambda: synthetic_beta(5000, 10000)),
            ("digits MLP", lambda: digits(epochs=40)),
            ("ComplEx tail", lambda: complex_tail(epochs=20)),
        ]
    return [
        build()
        for name, build in made
        if only is None or any(name == o or name.startswith(o + " ") for o in only)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--sources", nargs="*", default=None, help="only these sources")
    ap.add_argument("--maps", nargs="*", default=None, help="only these maps (by name)")
    ap.add_argument(
        "--cases", nargs="*", default=None, help='only these data sets ("synthetic-T C=100")'
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    maps = [
        m
        for m in all_maps()
        if (args.sources is None or m.source in args.sources)
        and (args.maps is None or m.name in args.maps)
    ]
    results = []
    for case in cases(args.quick, args.cases):
        results.append((case, run_case(case, maps)))
        print(f"[{time.perf_counter() - t0:6.1f} s] {case.name}", file=sys.stderr, flush=True)
    print(table(results))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s, {args.threads} thread(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
