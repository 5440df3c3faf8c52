"""torchcal.scaling.calibrate: the candidates on shared folds, the lowest CV NLL kept (issue 28,
item 7)."""

import pytest
import torch
import torch.nn.functional as F

from torchcal.functional.folds import fold_complement, kfold_indices
from torchcal.scaling import (
    Calibrated,
    TemperatureScaler,
    VectorScaler,
    calibrate,
    register_calibrator,
)


def _data(n, c, seed, bias=True):
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(n, c, generator=g, dtype=torch.float64)
    b = torch.linspace(-1, 1, c, dtype=torch.float64) if bias else 0.0
    y = torch.multinomial(torch.softmax(z / 2 + b, 1), 1, generator=g).squeeze(1)
    return z, y


def test_keeps_the_lowest_cv_nll_refitted_on_all_rows():
    z, y = _data(1500, 4, seed=0)
    best = calibrate(z, y, methods=("temperature", "vector", "matrix"), folds=4, seed=2)
    assert isinstance(best, Calibrated)
    assert [c.name for c in best.table] == ["temperature", "vector", "matrix"]
    scores = [c.cv_nll for c in best.table]
    assert best.name == best.table[scores.index(min(scores))].name != "temperature"
    assert best.table[0].note == "refitted per fold" and best.table[1].note == "own folds"
    assert all(c.fit_time > 0 for c in best.table)
    # the chosen calibrator is that method fitted on all rows with the same folds
    alone = {"vector": VectorScaler(4, folds=4, seed=2)}.get(best.name)
    if alone is not None:
        alone.fit(z, y)
        assert torch.equal(alone(z), best.calibrator(z))
    # the temperature row: TemperatureScaler refitted on each shared fold
    n, total = 1500, 0.0
    for ho in kfold_indices(n, 4, 2):
        fit = fold_complement(n, ho)
        ts = TemperatureScaler()
        ts.fit(z[fit], y[fit])
        total += float(F.cross_entropy(ts(z[ho]), y[ho], reduction="sum"))
    assert best.table[0].cv_nll == pytest.approx(total / n, abs=1e-12)
    assert "vector" in str(best) and "CV NLL" in str(best)


def test_where_one_temperature_is_right_it_is_chosen_or_tied():
    z, y = _data(2000, 4, seed=1, bias=False)
    best = calibrate(z, y)
    assert [c.name for c in best.table] == ["temperature", "vector", "matrix", "dirichlet"]
    t_row = best.table[0]
    assert min(c.cv_nll for c in best.table) >= t_row.cv_nll - 2e-3


def test_instances_classes_and_registered_names():
    z, y = _data(800, 3, seed=3)
    proto = VectorScaler(3, reg=0.01)
    best = calibrate(z, y, methods=(TemperatureScaler, proto))
    assert not proto.is_fitted  # deep-copied, never fitted in place
    assert [c.name for c in best.table] == ["TemperatureScaler", "VectorScaler"]
    assert best.table[1].note == "refitted per fold"  # a number reg: no own folds
    register_calibrator("test_vector_strong", lambda c, k, s: VectorScaler(c, reg=100.0))
    best = calibrate(z, y, methods=("test_vector_strong",), folds=3)
    assert best.name == "test_vector_strong" and best.calibrator.is_fitted
    with pytest.raises(ValueError, match="^name: 'test_vector_strong' is already registered"):
        register_calibrator("test_vector_strong", lambda c, k, s: VectorScaler(c))
    with pytest.raises(TypeError, match="^factory: expected a callable"):
        register_calibrator("test_other", 3)


def test_bad_input():
    z, y = _data(50, 3, seed=4)
    with pytest.raises(ValueError, match="^methods: unknown method 'platt'"):
        calibrate(z, y, methods=("platt",))
    with pytest.raises(ValueError, match="^methods: expected a non-empty sequence"):
        calibrate(z, y, methods=())
    with pytest.raises(ValueError, match="^methods: expected a non-empty sequence"):
        calibrate(z, y, methods="vector")
    with pytest.raises(TypeError, match="^methods: expected names"):
        calibrate(z, y, methods=(3,))
    with pytest.raises((TypeError, ValueError), match="^folds: "):
        calibrate(z, y, folds=1)
    with pytest.raises(ValueError, match="^folds: expected at most N = 50"):
        calibrate(z, y, folds=51)
    with pytest.raises(ValueError, match="^seed: "):
        calibrate(z, y, seed=0.5)
    with pytest.raises(ValueError, match=r"^logits: expected \(N, C\) multiclass"):
        calibrate(z[:, 0], y)
    with pytest.raises(ValueError, match="^target: expected shape"):
        calibrate(z, y[:10])
