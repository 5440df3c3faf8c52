"""Metric states at validation-loop sizes (issue 18): they persist in ``state_dict``, loaded
or merged states are checked, the deferred binning of small batches is invisible to every
reader, the device path of ``update`` never synchronises the host, and the NLL sum does not
depend on the thread count."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from sync_recorder import Recorder
from torchmetrics import MetricCollection

from torchcal.functional import binned_statistics
from torchcal.functional._checks import force_sync_free
from torchcal.functional.calibration.binning import accumulate
from torchcal.functional.calibration.readings import prepare_inputs
from torchcal.metrics import (
    CRPS,
    BrierDecomposition,
    CalibrationError,
    ClasswiseCalibrationError,
    GaussianNLL,
    IntervalCoverage,
    IntervalScore,
    NegativeLogLikelihood,
    PITHistogram,
    QuantileCalibrationError,
    ReliabilityDiagram,
)
from torchcal.metrics._base import STAT_NAMES


def _cls_batches(n: int = 5, b: int = 64, c: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(b, c, generator=g) * 2, torch.randint(0, c, (b,), generator=g))
        for _ in range(n)
    ]


def _reg_batches(n: int = 4, b: int = 50, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        loc = torch.randn(b, generator=g)
        scale = torch.rand(b, generator=g) + 0.5
        y = loc + scale * torch.randn(b, generator=g)
        out.append((loc, scale, y))
    return out


def _inputs(name: str, seed: int = 0) -> list[tuple]:
    """The ``update`` arguments of a few batches for the metric ``name`` (one of CASES)."""
    if name == "binary":
        return [(x[:, 0], (y == 0).long()) for x, y in _cls_batches(seed=seed)]
    if name in ("nll", "ece", "ece_probs", "top_label", "classwise", "diagram", "brier_conf"):
        return [(x.softmax(1) if name == "ece_probs" else x, y) for x, y in _cls_batches(seed=seed)]
    out = []
    for loc, scale, y in _reg_batches(seed=seed):
        k = torch.tensor([0.67, 1.64])
        if name == "pit":
            out.append((torch.distributions.Normal(loc, scale).cdf(y),))
        elif name == "coverage":
            out.append((loc[:, None] - k * scale[:, None], loc[:, None] + k * scale[:, None], y))
        elif name == "qce":
            out.append((loc[:, None] + torch.tensor([-0.67, 0.0, 0.67]) * scale[:, None], y))
        elif name == "interval_score":
            out.append((loc - scale, loc + scale, y))
        else:  # coverage_normal, crps, gnll
            out.append((loc, scale, y))
    return out


def _feed(name: str, m, seed: int = 0) -> None:
    for args in _inputs(name, seed):
        m.update(*args)


CASES = {
    "nll": lambda: NegativeLogLikelihood(),
    "ece": lambda: CalibrationError(n_bins=10),
    "binary": lambda: CalibrationError(n_bins=10, reading="binary"),
    "ece_probs": lambda: CalibrationError(n_bins=10, input="probs"),
    "top_label": lambda: CalibrationError(n_bins=10, reading="top_label", num_classes=5),
    "classwise": lambda: ClasswiseCalibrationError(num_classes=5, n_bins=8),
    "diagram": lambda: ReliabilityDiagram(n_bins=6),
    "brier_conf": lambda: BrierDecomposition(n_bins=6, reading="confidence"),
    "pit": lambda: PITHistogram(n_bins=8),
    "coverage": lambda: IntervalCoverage(levels=(0.5, 0.9)),
    "coverage_normal": lambda: IntervalCoverage(levels=(0.5, 0.9), family="normal"),
    "qce": lambda: QuantileCalibrationError(levels=(0.25, 0.5, 0.75)),
    "crps": lambda: CRPS("normal"),
    "gnll": lambda: GaussianNLL(),
    "interval_score": lambda: IntervalScore(alpha=0.3),
}


def _same(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    else:  # a ReliabilityTable
        for f in ("count", "conf", "acc", "ci_low", "ci_high"):
            _same(getattr(a, f), getattr(b, f))


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_dict_round_trips_a_streamed_metric(name):
    m = CASES[name]()
    _feed(name, m)
    sd = m.state_dict()
    assert set(sd) == set(m._defaults), "every state is persistent"
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    fresh = CASES[name]()
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    _same(fresh.compute(), m.compute())
    # and the reloaded metric keeps streaming like the original
    _feed(name, m, seed=1)
    _feed(name, fresh, seed=1)
    _same(fresh.compute(), m.compute())
    for k in m._defaults:
        assert getattr(fresh, k).dtype == getattr(m, k).dtype


def test_a_state_dict_without_states_still_loads():
    """A checkpoint of an earlier version (no metric states) loads strictly, states untouched."""
    m = CalibrationError(n_bins=5)
    m.load_state_dict({}, strict=True)
    assert int(m.count.sum()) == 0


@pytest.mark.parametrize(
    ("name", "state", "value", "needle"),
    [
        ("ece", "count", -3, "non-negative counts"),
        ("ece", "sum_acc", 1e9, "must lie in [0, count]"),
        ("ece", "sum_conf", float("nan"), "finite sums"),
        ("nll", "count", -1, "non-negative counts"),
        ("nll", "nll_sum", -2.0, "non-negative sums"),
        ("coverage", "hits", 10**6, "must lie in [0, n]"),
        ("coverage", "n", -5, "non-negative counts"),
        ("pit", "counts", -1, "non-negative counts"),
        ("qce", "below", 10**6, "must lie in [0, n]"),
        ("gnll", "total", float("inf"), "finite sums"),
    ],
)
def test_tampered_states_are_rejected_on_load_and_merge(name, state, value, needle):
    m = CASES[name]()
    _feed(name, m)
    good = m.compute()
    sd = m.state_dict()
    bad = sd[state].clone()
    bad.view(-1)[0] = value
    sd[state] = bad
    fresh = CASES[name]()
    with pytest.raises(ValueError, match=rf"state_dict: state '{state}' .*{needle[:12]}"):
        fresh.load_state_dict(sd)
    other = copy.deepcopy(m)
    other.__dict__.get("_pending", []).clear()
    setattr(other, state, bad)
    with pytest.raises(ValueError, match=rf"other: state '{state}'"):
        m.merge_state(other)
    with pytest.raises(ValueError, match=rf"other: state '{state}'"):
        m.merge_state(dict(m.state_dict(), **{state: bad}))
    _same(m.compute(), good)  # a rejected merge leaves the states as they were


def test_the_tampered_coverage_and_ece_of_the_audit_are_errors():
    """The hostile audit's reproductions: negative counts gave coverage -3.86, ECE -0.114."""
    m = IntervalCoverage(levels=(0.9,))
    m.update(torch.zeros(4, 1), torch.ones(4, 1), torch.full((4,), 0.5))
    sd = m.state_dict()
    sd["n"] = torch.tensor([-1])
    with pytest.raises(ValueError, match="state 'n'"):
        IntervalCoverage(levels=(0.9,)).load_state_dict(sd)
    e = CalibrationError(n_bins=4)
    e.update(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))
    sd = e.state_dict()
    sd["count"] = -sd["count"]
    with pytest.raises(ValueError, match="state 'count'"):
        CalibrationError(n_bins=4).load_state_dict(sd)


def test_deferred_binning_is_invisible_to_readers():
    batches = _cls_batches(n=7, b=33)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    ref = binned_statistics(x, y, n_bins=10)
    m = CalibrationError(n_bins=10)
    for xb, yb in batches:
        m.update(xb, yb)
    assert m.__dict__["_pending"], "small batches are deferred"
    assert torch.equal(m.count, ref.count)  # a plain attribute read bins them first
    assert not m.__dict__["_pending"]
    for name, f in zip(STAT_NAMES, ("count", "conf", "acc", "conf2", "conf_acc")):
        torch.testing.assert_close(getattr(m, name), getattr(ref, f), rtol=1e-12, atol=1e-12)
    # bit-identical to binning each batch at its update, in order (the eager metric)
    eager = [torch.zeros_like(getattr(m, n)) for n in STAT_NAMES]
    for xb, yb in batches:
        s = accumulate(prepare_inputs(xb, yb), 10)
        for acc, t in zip(eager, (s.count, s.conf, s.acc, s.conf2, s.conf_acc)):
            acc.add_(t)
    for name, acc in zip(STAT_NAMES, eager):
        assert torch.equal(getattr(m, name), acc), name
    st = m.statistics()
    assert torch.equal(st.stats.count, ref.count) and int(st.group_counts) == y.numel()
    # pickling, deepcopy, clone, reset, forward all see the whole stream
    m2 = CalibrationError(n_bins=10)
    for xb, yb in batches:
        m2.update(xb, yb)
    assert m2.__dict__["_pending"]
    for other in (pickle.loads(pickle.dumps(m2)), copy.deepcopy(m2), m2.clone()):
        assert torch.equal(other.compute(), m.compute())
    batch_value = m2(batches[0][0], batches[0][1])  # forward: the batch's value, states kept
    assert torch.equal(batch_value, CalibrationError(n_bins=10)(batches[0][0], batches[0][1]))
    assert int(m2.count.sum()) == y.numel() + batches[0][1].numel()
    m2.reset()
    assert int(m2.count.sum()) == 0 and not m2.__dict__["_pending"]


def test_a_compute_group_shares_the_deferred_states():
    coll = MetricCollection(
        {"ece": CalibrationError(n_bins=10), "diagram": ReliabilityDiagram(n_bins=10)}
    )
    batches = _cls_batches(n=4)
    for xb, yb in batches:
        coll.update(xb, yb)
    ref = CalibrationError(n_bins=10)
    for xb, yb in batches:
        ref.update(xb, yb)
    out = coll.compute()
    assert torch.equal(out["ece"], ref.compute())
    assert torch.equal(out["diagram"].count, ref.count.reshape(-1))


def test_many_small_batches_flush_at_the_bound():
    m = CalibrationError(n_bins=10)
    x = torch.randn(4096, 3)
    y = torch.randint(0, 3, (4096,))
    for _ in range(20):  # 81920 elements: automatic flushes at 2^14
        m.update(x, y)
    assert m.__dict__["_pending_n"] < 1 << 14
    assert int(m.count.sum()) == 20 * 4096


@pytest.mark.parametrize("reading", ["confidence", "top_label"])
@pytest.mark.parametrize("input", ["logits", "probs"])
def test_rows_path_equals_the_eager_general_path_bit_for_bit(reading, input):
    """Plain row batches take ``_update_rows`` (deferred, samples counted on the host); a
    large batch among them is binned at once, and batches of unequal sizes are flushed
    together. Every state equals binning each batch by ``prepare_inputs`` + ``accumulate``
    at its update, and the grouped path (``num_groups=1``) gives the same numbers."""
    g = torch.Generator().manual_seed(3)
    sizes = (256, 97, 20_000, 256, 1, 5000, 256)
    batches = []
    for b in sizes:
        x = torch.randn(b, 7, generator=g) * 2
        batches.append(
            (x.softmax(1) if input == "probs" else x, torch.randint(0, 7, (b,), generator=g))
        )
    kw = dict(n_bins=10, reading=reading, input=input, num_classes=7)
    m = CalibrationError(**kw)
    grouped = CalibrationError(**kw, num_groups=1)
    for x, y in batches:
        m.update(x, y)
        grouped.update(x, y, torch.zeros_like(y))
    assert m.__dict__["_pending"], "small batches are deferred"
    eager = [torch.zeros_like(getattr(m, n)) for n in STAT_NAMES]
    for x, y in batches:
        st = accumulate(prepare_inputs(x, y, reading=reading, input=input), 10)
        for acc, t in zip(eager, (st.count, st.conf, st.acc, st.conf2, st.conf_acc)):
            acc.add_(t)
    for name, acc in zip(STAT_NAMES, eager):
        assert torch.equal(getattr(m, name), acc), name
        assert torch.equal(getattr(grouped, name), acc), name
    assert m.group_count.tolist() == [sum(sizes)] == grouped.group_count.tolist()
    assert torch.equal(m.compute(), grouped.compute().pooled)


def test_rows_path_flushes_anywhere_with_the_same_states():
    """Where the flushes fall (after every batch, or once at the end) does not change a bit."""
    batches = _cls_batches(n=9, b=300, c=4)
    lazy, eager = CalibrationError(n_bins=12), CalibrationError(n_bins=12)
    for x, y in batches:
        lazy.update(x, y)
        eager.update(x, y)
        eager.statistics()  # a read: flushes now
        assert not eager.__dict__["_pending"]
    for name in STAT_NAMES + ("group_count",):
        assert torch.equal(getattr(lazy, name), getattr(eager, name)), name


def test_rows_path_keeps_the_checks_and_the_warning():
    m = CalibrationError(n_bins=5, input="probs")
    with pytest.raises(ValueError, match="sum over the classes"):
        m.update(torch.tensor([[0.5, 0.6]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="target"):
        m.update(torch.tensor([[0.5, 0.5]]), torch.tensor([2]))
    with pytest.raises(ValueError, match="preds"):
        CalibrationError(n_bins=5).update(torch.tensor([[float("nan"), 0.0]]), torch.tensor([0]))
    assert int(m.group_count.sum()) == 0, "a rejected batch adds nothing"
    w = CalibrationError(n_bins=5)
    with pytest.warns(UserWarning, match="look like probabilities") as rec:
        w.update(torch.tensor([[0.3, 0.7]]), torch.tensor([1]))
    assert rec[0].filename == __file__, "the warning points at the caller's update"
    unchecked = CalibrationError(n_bins=5, validate_args=False)
    unchecked.update(torch.tensor([[0.3, 0.7]]), torch.tensor([1]))  # no check, no warning
    assert unchecked.group_count.tolist() == [1]


#: reads of host-side tensors that are no device synchronisation: the location-scale
#: coverage reads its interval factors (a CPU tensor built from the levels) once per batch
_HOST_READS = {"coverage_normal": ["tolist"] * 4}


def _updates_on_device_path(name: str) -> Recorder:
    m = CASES[name]()
    m.validate_args = False
    _feed(name, m)  # warm up (one-time work, e.g. the generator) outside the recording
    batches = _inputs(name, seed=1)
    rec = Recorder()
    with force_sync_free(), rec:
        for args in batches:
            m.update(*args)
    return rec


@pytest.mark.parametrize("name", sorted(CASES))
def test_update_never_synchronises_on_the_device_path(name):
    """``validate_args=False`` on the device path (CUDA, proven here on the CPU under
    ``force_sync_free``): no ``.item()``, ``bool()``, ``.tolist()``, ``nonzero``, ``.cpu()``,
    nor a ``bincount`` (which sizes its output on the host)."""
    rec = _updates_on_device_path(name)
    assert rec.names, "the recorder saw the calls"
    assert rec.syncs() == _HOST_READS.get(name, [])


@pytest.mark.parametrize("name", ["ece", "ece_probs", "top_label", "classwise", "nll", "pit"])
def test_validated_update_on_the_device_path_asserts_without_reading(name):
    m = CASES[name]()
    batches = _inputs(name)
    rec = Recorder()
    with force_sync_free(), rec:
        for args in batches:
            m.update(*args)
    assert rec.syncs() == _HOST_READS.get(name, [])
    assert "_assert_async" in rec.names


def test_recorder_sees_the_cpu_path_read_values():
    rec = Recorder()
    with rec:
        CalibrationError(n_bins=5).update(torch.randn(8, 3), torch.randint(0, 3, (8,)))
    assert rec.syncs(), "the CPU path reads its checks on the host"


def _nll_sum(threads: int) -> torch.Tensor:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(3)
        m = NegativeLogLikelihood()
        m.update(torch.randn(200_000, 4, generator=g), torch.randint(0, 4, (200_000,), generator=g))
        return m.nll_sum.clone()
    finally:
        torch.set_num_threads(before)


def test_nll_sum_does_not_depend_on_the_thread_count():
    assert torch.equal(_nll_sum(1), _nll_sum(2))


@pytest.mark.cuda
@pytest.mark.parametrize("input", ["logits", "probs"])
def test_rows_path_never_synchronises_on_cuda(input):
    """On a real device (``-m cuda``; skipped without one): 70 updates of 256 x 10 (one flush
    at 2^14 pending elements) and a 20000-row batch (binned at once) under
    ``set_sync_debug_mode("error")`` with ``validate_args=False``; the states equal the CPU
    metric's."""
    g = torch.Generator().manual_seed(6)
    batches = [(torch.randn(256, 10, generator=g) * 2, torch.randint(0, 10, (256,), generator=g))]
    batches = batches * 70 + [
        (torch.randn(20_000, 10, generator=g), torch.randint(0, 10, (20_000,), generator=g))
    ]
    if input == "probs":
        batches = [(x.softmax(1), y) for x, y in batches]
    cpu = CalibrationError(n_bins=15, input=input, validate_args=False)
    dev = CalibrationError(n_bins=15, input=input, validate_args=False).to("cuda")
    cuda_batches = [(x.cuda(), y.cuda()) for x, y in batches]
    dev.update(*cuda_batches[0])  # warm-up: lazy CUDA initialisation
    cpu.update(*batches[0])
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for x, y in cuda_batches[1:]:
            dev.update(x, y)
        _ = dev.count  # a read: bins the pending batches, on the device
        assert not dev.__dict__["_pending"]
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    for x, y in batches[1:]:
        cpu.update(x, y)
    # device and host confidences may differ in the last bit (a sample at a bin edge moves)
    assert dev.group_count.tolist() == cpu.group_count.tolist() == [256 * 70 + 20_000]
    assert int(dev.count.sum()) == int(cpu.count.sum())
    torch.testing.assert_close(dev.compute().cpu(), cpu.compute(), rtol=0, atol=1e-4)


@pytest.mark.parametrize("input", ["logits", "probs"])
def test_update_compiles_without_graph_breaks(input):
    """``torch.compile`` of ``CalibrationError.update`` (validation on: device-side
    assertions under tracing) is one graph, and the compiled updates give the eager value."""
    g = torch.Generator().manual_seed(7)
    batches = [(torch.randn(64, 10, generator=g) * 2, torch.randint(0, 10, (64,), generator=g))]
    batches.append((torch.randn(64, 10, generator=g), torch.randint(0, 10, (64,), generator=g)))
    if input == "probs":
        batches = [(x.softmax(1), y) for x, y in batches]
    torch._dynamo.reset()
    compiled = CalibrationError(n_bins=15, input=input)
    # torch.compile switches torch.distributions' default validation off for the process
    previous = torch.distributions.Distribution._validate_args
    try:
        explained = torch._dynamo.explain(compiled.update)(*batches[0])
        torch.compile(compiled.update)(*batches[1])
    finally:
        torch.distributions.Distribution.set_default_validate_args(previous)
    assert explained.graph_break_count == 0, explained.break_reasons
    eager = CalibrationError(n_bins=15, input=input)
    for x, y in batches:
        eager.update(x, y)
    # compiled kernels round float32 their own way: the eager value within float32 rounding
    assert compiled.group_count.tolist() == eager.group_count.tolist() == [128]
    torch.testing.assert_close(compiled.compute(), eager.compute(), rtol=0, atol=1e-5)
