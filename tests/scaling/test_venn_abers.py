"""VennAbersCalibrator (issue 28 item 5): the (p0, p1) table equals the definition (isotonic
regression with the test point added) and the venn-abers package to 1e-12, ties included,
binary and one-vs-rest; the default multiclass reduction (the top label of the
temperature-scaled probabilities) within 0.005 test NLL of one temperature where that is the
truth; logits input, state and bad input."""

import io
import warnings

import numpy as np
import pytest
import torch

from torchcal.functional.venn_abers import (
    venn_abers_interval,
    venn_abers_merge,
    venn_abers_table,
)
from torchcal.scaling import NotFittedError, TemperatureScaler, VennAbersCalibrator


def _package():
    return pytest.importorskip("venn_abers")


def _quiet(fn, *args, **kwargs):
    """Call the package (it warns on all-NaN slices of its own) with warnings silenced."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _binary(seed, n, decimals):
    """Scores rounded to ``decimals`` (many ties) and labels drawn from them."""
    rng = np.random.default_rng(seed)
    p = np.round(rng.beta(2.0, 2.0, n), decimals)
    y = (rng.random(n) < p**1.5).astype(np.int64)
    return p, y


def _queries(p, rng, m=500):
    """Test scores: every calibration score (ties), between and beyond them."""
    return np.concatenate([np.unique(p), rng.random(m), [0.0, 1.0]])


def _isotonic_at(s, y, value):
    """The definition: the isotonic regression of ``y`` on ``s`` (ties pooled, PAV), read at
    the score ``value`` (one of ``s``)."""
    keys = sorted(set(s))
    blocks = [[float(sum(y[s == k])), float(sum(s == k)), [k]] for k in keys]
    out = []
    for block in blocks:
        out.append(block)
        while len(out) > 1 and out[-2][0] / out[-2][1] > out[-1][0] / out[-1][1]:
            top = out.pop()
            out[-1] = [out[-1][0] + top[0], out[-1][1] + top[1], out[-1][2] + top[2]]
    return next(total / count for total, count, members in out if value in members)


def test_equals_the_definition_on_small_sets():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 25))
        s = rng.integers(0, int(rng.integers(1, 9)), n) / 8.0  # heavy ties
        y = (rng.random(n) < rng.random()).astype(np.float64)
        test = np.concatenate([np.unique(s), rng.integers(-1, 10, 6) / 8.0 + 1 / 16])
        table = venn_abers_table(torch.tensor(s), torch.tensor(y))
        p0, p1 = venn_abers_interval(table, torch.tensor(test))
        for value, q0, q1 in zip(test, p0.tolist(), p1.tolist()):
            for label, got in ((0, q0), (1, q1)):
                want = _isotonic_at(np.append(s, value), np.append(y, label), value)
                assert got == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(("seed", "n", "decimals"), [(0, 3000, 2), (1, 2000, 3), (2, 1500, 8)])
def test_binary_equals_the_package(seed, n, decimals):
    va = _package()
    p, y = _binary(seed, n, decimals)
    q = _queries(p, np.random.default_rng(seed + 10))
    ref = va.VennAbers()
    _quiet(ref.fit, np.stack([1 - p, p], 1), y)
    merged, p0p1 = _quiet(ref.predict_proba, np.stack([1 - q, q], 1))
    ours = VennAbersCalibrator()
    ours.fit(torch.tensor(p), torch.tensor(y))
    p0, p1 = ours.predict_interval(torch.tensor(q))
    assert np.abs(p0.numpy() - p0p1[:, 0]).max() <= 1e-12
    assert np.abs(p1.numpy() - p0p1[:, 1]).max() <= 1e-12
    assert np.abs(ours.predict_proba(torch.tensor(q)).numpy() - merged[:, 1]).max() <= 1e-12
    assert torch.equal(ours(torch.tensor(q)), ours.predict_proba(torch.tensor(q)))
    # the interval's order and the merge inside it
    m = venn_abers_merge(p0, p1)
    assert bool((p0 <= p1).all() and (p0 <= m).all() and (m <= p1).all() and (m > 0).all())


@pytest.mark.parametrize("num_classes", [3, 5])
def test_one_vs_rest_equals_the_package(num_classes):
    va = _package()
    rng = np.random.default_rng(num_classes)
    n = 1500
    z = rng.normal(size=(n, num_classes)) * 2
    prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    prob = np.round(prob, 3)  # ties within each column
    prob = prob / prob.sum(1, keepdims=True)
    y = np.array([rng.choice(num_classes, p=row) for row in prob])
    test = prob[rng.permutation(n)[:400]]
    test = np.concatenate([test, rng.dirichlet(np.ones(num_classes), 300)])
    merged, p0p1 = _quiet(
        va.VennAbersCalibrator().predict_proba,
        p_cal=prob,
        y_cal=y,
        p_test=test,
        va_type="one_vs_rest",
        p0_p1_output=True,
    )
    ours = VennAbersCalibrator(multiclass="one_vs_rest")
    ours.fit(torch.tensor(prob), torch.tensor(y))
    p0, p1 = ours.predict_interval(torch.tensor(test))
    assert p0.shape == p1.shape == (len(test), num_classes)
    for k in range(num_classes):
        assert np.abs(p0[:, k].numpy() - p0p1[k][:, 0]).max() <= 1e-12
        assert np.abs(p1[:, k].numpy() - p0p1[k][:, 1]).max() <= 1e-12
    out = ours.predict_proba(torch.tensor(test))
    assert np.abs(out.numpy() - merged).max() <= 1e-12
    assert torch.allclose(out.sum(1), torch.ones(len(test), dtype=torch.float64), atol=1e-12)


def test_logits_input_reads_the_same_order():
    g = torch.Generator().manual_seed(3)
    s = torch.randn(2000, generator=g, dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(2 * s), generator=g)
    by_logits, by_probs = VennAbersCalibrator(input="logits"), VennAbersCalibrator()
    by_logits.fit(s, y)
    by_probs.fit(torch.sigmoid(s), y)
    q = torch.randn(500, generator=g, dtype=torch.float64)
    assert torch.equal(by_logits(q), by_probs(torch.sigmoid(q)))
    z = 2 * torch.randn(2000, 4, generator=g, dtype=torch.float64)
    t = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    ovr = {"multiclass": "one_vs_rest"}
    multi_logits = VennAbersCalibrator(input="logits", **ovr)
    multi_probs = VennAbersCalibrator(**ovr)
    res = multi_logits.fit(z, t)
    multi_probs.fit(torch.softmax(z, 1), t)
    zq = torch.randn(300, 4, generator=g, dtype=torch.float64)
    assert torch.allclose(multi_logits(zq), multi_probs(torch.softmax(zq, 1)), atol=1e-15)
    assert res.converged and np.isfinite(res.nll_before) and np.isfinite(res.nll_after)
    # top label: the temperature fitted on the logits or on log p (equal to rounding)
    top_logits, top_probs = VennAbersCalibrator(input="logits"), VennAbersCalibrator()
    top_logits.fit(z, t)
    top_probs.fit(torch.softmax(z, 1), t)
    assert float(top_logits.temperature) == pytest.approx(float(top_probs.temperature), rel=1e-9)
    assert torch.allclose(top_logits(zq), top_probs(torch.softmax(zq, 1)), atol=1e-9)


def test_degenerate_sets_give_probabilities_never_nan():
    q = torch.tensor([-1.0, 0.0, 0.5, 2.0], dtype=torch.float64)
    for y in ([0, 0, 0], [1, 1, 1], [1, 0, 1]):
        va = VennAbersCalibrator(input="logits")
        va.fit(torch.tensor([-1.0, -1.0, 2.0], dtype=torch.float64), torch.tensor(y))
        p0, p1 = va.predict_interval(q)
        p = va(q)
        assert bool(((p0 >= 0) & (p0 <= p1) & (p1 <= 1) & (p > 0) & (p < 1)).all())
    # a class absent from the calibration set: all-negative, still a probability row
    prob = torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.7, 0.1], [0.6, 0.3, 0.1]], dtype=torch.float64)
    for multiclass in ("one_vs_rest", "top_label"):
        va = VennAbersCalibrator(multiclass=multiclass)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the top label's T: a separated set
            va.fit(prob, torch.tensor([0, 1, 0]))
        out = va(prob)
        assert torch.isfinite(out).all() and (out >= 0).all()  # separated: T at its bound
        assert torch.allclose(out.sum(1), torch.ones(3, dtype=out.dtype))


def test_state_round_trip_and_validation():
    p, y = _binary(4, 500, 2)
    va = VennAbersCalibrator()
    va.fit(torch.tensor(p), torch.tensor(y))
    q = torch.rand(200, dtype=torch.float64)
    buf = io.BytesIO()
    torch.save(va.state_dict(), buf)
    buf.seek(0)
    loaded = VennAbersCalibrator()
    loaded.load_state_dict(torch.load(buf, weights_only=True))
    assert loaded.is_fitted and torch.equal(loaded(q), va(q))
    state = va.state_dict()
    with pytest.raises(ValueError, match="^scores: expected strictly increasing"):
        VennAbersCalibrator().load_state_dict(dict(state, scores=state["scores"].flip(1)))
    with pytest.raises(ValueError, match="^p1: expected p0 in"):
        VennAbersCalibrator().load_state_dict(dict(state, p1=state["p1"] * float("nan")))
    with pytest.raises(ValueError, match="^p0: expected scores"):
        VennAbersCalibrator().load_state_dict(dict(state, p0=state["p0"][:, :-1]))


def test_bad_input():
    p, y = _binary(5, 100, 2)
    pt, yt = torch.tensor(p), torch.tensor(y)
    with pytest.raises(NotFittedError):
        VennAbersCalibrator()(pt)
    with pytest.raises(ValueError, match="^input: "):
        VennAbersCalibrator(input="log")
    with pytest.raises(TypeError, match="^scores: "):
        VennAbersCalibrator().fit(p, yt)
    with pytest.raises(ValueError, match="^scores: expected probabilities"):
        VennAbersCalibrator().fit(pt + 1, yt)
    with pytest.raises(ValueError, match="^scores: expected finite"):
        VennAbersCalibrator(input="logits").fit(pt / 0, yt)
    with pytest.raises(ValueError, match="^scores: expected probabilities whose sum"):
        VennAbersCalibrator().fit(torch.rand(10, 3, dtype=torch.float64), torch.zeros(10).long())
    with pytest.raises(ValueError, match="^target: expected binary labels"):
        VennAbersCalibrator().fit(pt, yt + 1)
    with pytest.raises(ValueError, match="^target: expected class indices"):
        VennAbersCalibrator().fit(torch.full((4, 2), 0.5), torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match="^target: expected shape"):
        VennAbersCalibrator().fit(pt, yt[1:])
    va = VennAbersCalibrator()
    va.fit(pt, yt)
    with pytest.raises(
        ValueError, match="^scores: expected \\(N,\\) binary scores \\(as at fit\\)"
    ):
        va.predict_interval(torch.full((4, 2), 0.5))


def test_fit_reports_the_nll_of_the_input_and_of_the_merge():
    p, y = _binary(6, 800, 2)
    p = np.clip(p, 0.01, 0.99)
    va = VennAbersCalibrator()
    res = va.fit(torch.tensor(p), torch.tensor(y))
    merged = va.predict_proba(torch.tensor(p)).numpy()

    def nll(q):
        return float(-np.mean(y * np.log(q) + (1 - y) * np.log1p(-q)))

    assert res.nll_before == pytest.approx(nll(p), rel=1e-12)
    assert res.nll_after == pytest.approx(nll(merged), rel=1e-12)
    rng = np.random.default_rng(7)
    prob = rng.dirichlet(np.ones(3), 600)
    t = np.array([rng.choice(3, p=row) for row in prob])
    multi = VennAbersCalibrator(multiclass="one_vs_rest")
    res = multi.fit(torch.tensor(prob), torch.tensor(t))
    out = multi.predict_proba(torch.tensor(prob)).numpy()
    assert res.nll_before == pytest.approx(-np.log(prob[np.arange(600), t]).mean(), rel=1e-12)
    assert res.nll_after == pytest.approx(-np.log(out[np.arange(600), t]).mean(), rel=1e-12)


def test_multiclass_logits_are_read_through_log_softmax():
    """Widely spread logits: softmax rounds many rows of a column to exactly 0 (ties that are
    not in the logits); each class's interval is the binary one of its log_softmax column."""
    g = torch.Generator().manual_seed(8)
    z = 400 * torch.randn(1000, 3, generator=g, dtype=torch.float64)
    t = torch.randint(0, 3, (1000,), generator=g)
    assert int((torch.softmax(z, 1)[:, 0] == 0).sum()) > 100  # the ties softmax would create
    multi = VennAbersCalibrator(input="logits", multiclass="one_vs_rest")
    multi.fit(z, t)
    zq = 400 * torch.randn(300, 3, generator=g, dtype=torch.float64)
    p0, p1 = multi.predict_interval(zq)
    for c in range(3):
        binary = VennAbersCalibrator(input="logits")
        binary.fit(torch.log_softmax(z, 1)[:, c].contiguous(), (t == c).long())
        b0, b1 = binary.predict_interval(torch.log_softmax(zq, 1)[:, c].contiguous())
        assert torch.equal(p0[:, c], b0) and torch.equal(p1[:, c], b1)


def test_state_validation_rejects_what_fit_never_stores():
    p, y = _binary(9, 300, 2)
    va = VennAbersCalibrator()
    va.fit(torch.tensor(p), torch.tensor(y))
    state = va.state_dict()
    zero = state["p1"].clone()
    zero[0, 0] = 0.0  # p1 > 0 always (the test point's own label 1 is in its block)
    with pytest.raises(ValueError, match="^p1: expected p0 in"):
        VennAbersCalibrator().load_state_dict(dict(state, p1=zero))
    gap = state["scores"].clone()
    gap[0, 0] = float("inf")  # padding before a finite score
    with pytest.raises(ValueError, match="^scores: expected strictly increasing"):
        VennAbersCalibrator().load_state_dict(dict(state, scores=gap))
    empty = dict(
        state,
        scores=torch.zeros(1, 0, dtype=torch.float64),
        p0=torch.zeros(1, 1, dtype=torch.float64),
        p1=torch.ones(1, 1, dtype=torch.float64),
    )
    with pytest.raises(ValueError, match="^scores: a fitted state needs at least one score"):
        VennAbersCalibrator().load_state_dict(empty)


def test_multiclass_scores_of_another_class_count_are_refused():
    rng = np.random.default_rng(10)
    va = VennAbersCalibrator()
    va.fit(torch.tensor(rng.dirichlet(np.ones(3), 100)), torch.tensor(rng.integers(0, 3, 100)))
    with pytest.raises(ValueError, match=r"^scores: expected \(N, 3\) scores \(as at fit\)"):
        va.predict_interval(torch.tensor(rng.dirichlet(np.ones(4), 5)))


def _temperature_truth(num_classes, n, seed):
    """Logits ``3 * randn`` whose labels are drawn from ``softmax(z / 2)``: one temperature is
    the Bayes map."""
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(n, num_classes, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
    return z, y


def test_top_label_is_the_binary_table_of_the_temperature_scaled_argmax():
    z, y = _temperature_truth(6, 3000, 11)
    zq = _temperature_truth(6, 800, 12)[0]
    va = VennAbersCalibrator(input="logits")
    va.fit(z, y)
    ts = TemperatureScaler()
    ts.fit(z, y)
    assert float(va.temperature) == pytest.approx(float(ts.temperature), rel=1e-12)
    assert va.scores.shape[0] == 1 and int(va.num_classes) == 6
    T = float(va.temperature)
    lq, lq_test = torch.log_softmax(z / T, 1), torch.log_softmax(zq / T, 1)
    top, top_test = lq.argmax(1), lq_test.argmax(1)
    binary = VennAbersCalibrator(input="logits")
    binary.fit(lq.max(1).values, (top == y).long())
    b0, b1 = binary.predict_interval(lq_test.max(1).values)
    p0, p1 = va.predict_interval(zq)
    rows = torch.arange(len(zq))
    assert torch.equal(p0[rows, top_test], b0) and torch.equal(p1[rows, top_test], b1)
    out = va(zq)
    m = venn_abers_merge(b0, b1)
    assert torch.equal(out[rows, top_test], m)
    q = torch.softmax(zq / T, 1)
    rest = q.clone()
    rest[rows, top_test] = 0
    expect = rest / rest.sum(1, keepdim=True) * (1 - m).unsqueeze(1)
    expect[rows, top_test] = m
    assert torch.allclose(out, expect, rtol=1e-12, atol=0)
    assert torch.allclose(out.sum(1), torch.ones(len(zq), dtype=out.dtype), atol=1e-12)
    assert bool(((p0 <= out + 1e-15) & (out <= p1 + 1e-15)).all())  # the split's bounds


@pytest.mark.parametrize("num_classes", [10, 100])
def test_defaults_are_within_0_005_of_temperature_scaling_where_it_is_the_truth(num_classes):
    """Issue 28's Must-hold: the default (top label) stays within 0.005 test NLL and accuracy
    of TemperatureScaler where one temperature is the Bayes map; one-vs-rest does not."""
    z, y = _temperature_truth(num_classes, 5000, num_classes)
    zt, yt = _temperature_truth(num_classes, 10000, num_classes + 1)
    ts = TemperatureScaler()
    ts.fit(z, y)

    def nll_acc(p):
        return float(-p[torch.arange(len(yt)), yt].log().mean()), float(
            (p.argmax(1) == yt).double().mean()
        )

    t_nll, t_acc = nll_acc(torch.softmax(ts(zt).detach(), 1))
    nll, acc = nll_acc(_fitted(z, y)(zt))
    assert nll - t_nll <= 0.005 and t_acc - acc <= 0.005
    ovr = VennAbersCalibrator(input="logits", multiclass="one_vs_rest")
    ovr.fit(z, y)
    assert nll_acc(ovr(zt))[0] - t_nll > 0.005  # the old default: what this guards against


def _fitted(z, y):
    va = VennAbersCalibrator(input="logits")
    va.fit(z, y)
    return va


def test_top_label_state_round_trip_and_checks():
    z, y = _temperature_truth(4, 600, 13)
    va = _fitted(z, y)
    buf = io.BytesIO()
    torch.save(va.state_dict(), buf)
    buf.seek(0)
    loaded = VennAbersCalibrator(input="logits")
    loaded.load_state_dict(torch.load(buf, weights_only=True))
    zq = _temperature_truth(4, 50, 14)[0]
    assert torch.equal(loaded(zq), va(zq)) and float(loaded.temperature) != 1.0
    state = va.state_dict()
    with pytest.raises(ValueError, match="^temperature: expected a finite T > 0"):
        VennAbersCalibrator().load_state_dict(dict(state, temperature=torch.tensor(-1.0).double()))
    with pytest.raises(ValueError, match="^num_classes: expected 0 \\(binary\\) or C >= 2"):
        VennAbersCalibrator(multiclass="one_vs_rest").load_state_dict(state)  # 1 table, C = 4
    with pytest.raises(ValueError, match="^num_classes: expected 0"):
        VennAbersCalibrator().load_state_dict(dict(state, num_classes=torch.tensor(1)))
    with pytest.raises(ValueError, match="^multiclass: "):
        VennAbersCalibrator(multiclass="top")
    with pytest.raises(ValueError, match=r"^scores: expected \(N, 4\) scores \(as at fit\)"):
        va(zq[:, :3])
