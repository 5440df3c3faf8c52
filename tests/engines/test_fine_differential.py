"""The fine histogram is the same on every road (issue 31, docs/design.md 6f, 6g): the
streaming Auditor (a file, ``--engine memory``), the in-process engine
(:func:`~torchcal.engines.memory.state_from_arrays`), DuckDB and Spark, grouped and weighted;
counts identical, sums within 1e-12 (the engines sum in another order), and through a state
file written by DuckDB and read back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchcal.audit.core import Auditor
from torchcal.engines.memory import state_from_arrays

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb")


def _table(n: int = 6000, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = np.where(rng.random(n) < 0.3, np.round(rng.random(n), 2), rng.beta(5, 2, n))
    p[:5] = [0.0, 1.0, 0.25, 0.5, 1 - 2**-13]  # bin edges: 0.25 * 4096 is an edge exactly
    y = (rng.random(n) < p).astype(np.int64)
    g = rng.choice(np.array(["b", "a", "c"]), n)
    w = rng.integers(0, 4, n).astype(np.float64) + rng.random(n).round(3)
    return {"p": p, "y": y, "g": g, "w": w}


def _auditor(t: dict[str, np.ndarray], weighted: bool):
    names = sorted(set(t["g"].tolist()))
    ids = torch.from_numpy(np.searchsorted(np.array(names), t["g"]))
    a = Auditor()
    w = torch.from_numpy(t["w"]) if weighted else None
    a.update(torch.from_numpy(t["p"]), torch.from_numpy(t["y"]), ids, w)
    return a.state(names).fine


def _close(a, b) -> None:
    assert a is not None and b is not None
    assert torch.equal(a.count, b.count)
    for x, z in zip(a[1:], b[1:], strict=True):
        assert torch.allclose(x, z, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_the_fine_histogram_is_the_same_on_every_road(tmp_path, weighted):
    from torchcal.engines.duck import audit_duckdb, state_from_duckdb
    from torchcal.engines.state import read_state, write_state

    t = _table()
    cols = {"p": t["p"], "y": t["y"], "g": t["g"].tolist()}
    if weighted:
        cols["w"] = t["w"]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table(cols), path)
    ref = _auditor(t, weighted)
    mem = state_from_arrays(t["p"], t["y"], groups=t["g"], weight=t["w"] if weighted else None).fine
    kw = {"preds": "p", "label": "y", "group": "g", "weight": "w" if weighted else None}
    duck = audit_duckdb(str(path), **kw).state
    direct = state_from_duckdb(path, **kw).fine
    for other in (mem, duck.fine, direct):
        _close(ref, other)
    write_state(duck, tmp_path / "s.parquet")
    back = read_state(tmp_path / "s.parquet").fine
    assert back is not None
    assert all(torch.equal(x, z) for x, z in zip(back, duck.fine, strict=True))  # every bit
    assert int(ref.count[:, 1024].sum()) >= 1  # 0.25 sits on a fine-bin edge, in bin 1024
    assert int(ref.count[:, FINE_LAST].sum()) >= 2  # 1 - 2^-13 and 1.0 share the last bin


FINE_LAST = 4095


def test_spark_gives_the_same_fine_histogram(spark):
    from torchcal.engines.spark import audit_spark, state_from_spark

    t = _table(3000, 1)
    df = spark.createDataFrame(
        [
            (float(a), int(b), str(c), float(d))
            for a, b, c, d in zip(t["p"], t["y"], t["g"], t["w"])
        ],
        "p double, y long, g string, w double",
    )
    ref = _auditor(t, True)
    kw = {"preds": "p", "label": "y", "group": "g", "weight": "w"}
    _close(ref, audit_spark(df, **kw).state.fine)
    _close(ref, state_from_spark(df, **kw).fine)
