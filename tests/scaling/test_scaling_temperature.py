"""TemperatureScaler against the float64 Brent optimum on log T, plus its guarantees."""

import io
import math
import warnings

import numpy as np
import pytest
import torch
from scipy.optimize import brentq

from torchcal.functional.invariants import check_monotone_map
from torchcal.functional.temperature import fit as temperature_fit
from torchcal.scaling import CalibrationWarning, NotFittedError, TemperatureScaler


# ----------------------------------------------------------------------------- oracles
def nll_at(logits: torch.Tensor, target: torch.Tensor, log_t: float) -> float:
    """Mean NLL at T = exp(log_t), written independently of torchcal (float64)."""
    z = logits.double() / math.exp(log_t)
    if z.dim() == 1:
        y = target.double()
        # exact log(1 + e^z) - y z; -inf logits (target 0) contribute 0
        sp = torch.where(
            torch.isneginf(z), torch.zeros_like(z), torch.logaddexp(torch.zeros_like(z), z)
        )
        yz = torch.where(y > 0, z, torch.zeros_like(z))
        return float((sp - yz).mean())
    return float((torch.logsumexp(z, 1) - z.gather(1, target[:, None]).squeeze(1)).mean())


def grad_log_t(logits: torch.Tensor, target: torch.Tensor, log_t: float) -> float:
    """d mean NLL / d log T, written independently of torchcal (float64)."""
    beta = math.exp(-log_t)
    z = logits.double()
    if z.dim() == 1:
        finite = torch.isfinite(z)
        z, y = z[finite], target.double()[finite]
        g_beta = ((torch.sigmoid(beta * z) - y) * z).sum() / logits.shape[0]
    else:  # numpy: E_p[z] - z_y with p = softmax(beta z); masked entries have p = 0
        zn = z.numpy()
        finite = np.isfinite(zn)
        p = beta * zn
        p -= p.max(1, keepdims=True)
        np.exp(p, out=p)
        p /= p.sum(1, keepdims=True)
        ez = np.einsum("ij,ij->i", p, np.where(finite, zn, 0.0))
        g_beta = np.mean(ez - zn[np.arange(zn.shape[0]), target.numpy()])
    return -beta * float(g_beta)


def brent_optimum(logits, target, t_hint=1.0):
    """float64 Brent's method on log T (the root of the NLL's derivative); (T, NLL).

    The bracket starts around ``t_hint`` and widens until the derivative changes sign, so the
    root is certified by the oracle alone; a good hint only saves evaluations.
    """
    width = 1e-4
    lo, hi = math.log(t_hint) - width, math.log(t_hint) + width
    while grad_log_t(logits, target, lo) > 0:
        width *= 8
        lo -= width
    while grad_log_t(logits, target, hi) < 0:
        width *= 8
        hi += width
    root = brentq(lambda lt: grad_log_t(logits, target, lt), lo, hi, xtol=1e-14, rtol=1e-14)
    return math.exp(root), nll_at(logits, target, root)


def sample_multiclass(n, c, true_t, seed, scale=3.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / true_t, 1), 1, generator=g).squeeze(1)
    return z.to(dtype), y


def sample_binary(n, true_t, seed, scale=10.0):
    g = torch.Generator().manual_seed(seed)
    s = scale * torch.randn(n, generator=g, dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(s / true_t), generator=g)
    return s, y


def assert_optimal(res, logits, target, rel=1e-6, nats=1e-10, ref=None):
    t_ref, f_ref = brent_optimum(logits, target, t_hint=res.temperature) if ref is None else ref
    assert res.converged and res.warnings == ()
    assert abs(res.temperature / t_ref - 1) <= rel, (res.temperature, t_ref)
    assert abs(res.nll_after - f_ref) <= nats, (res.nll_after, f_ref)
    # the reported NLL is the NLL at the reported T
    assert abs(res.nll_after - nll_at(logits, target, math.log(res.temperature))) <= 1e-12
    assert abs(res.nll_before - nll_at(logits, target, 0.0)) <= 1e-12
    assert res.nll_after <= res.nll_before
    assert res.grad_norm <= 1e-9


def fit_both(logits, target, oracle_logits=None):
    """Fit with the Newton solver and with LBFGS (the default of ``fit``); both must reach the
    one Brent optimum at the same tolerances. Returns the Newton scaler and result."""
    oracle_logits = logits if oracle_logits is None else oracle_logits
    scaler = TemperatureScaler(method="newton")
    res = scaler.fit(logits, target)
    assert res.method == "newton"
    ref = brent_optimum(oracle_logits, target, t_hint=res.temperature)
    assert_optimal(res, oracle_logits, target, ref=ref)
    res_lbfgs = TemperatureScaler().fit(logits, target)
    assert res_lbfgs.method == "lbfgs"  # the default of the in-memory fit
    assert_optimal(res_lbfgs, oracle_logits, target, ref=ref)
    return scaler, res


# ----------------------------------------------------------------------------- optimum
@pytest.mark.parametrize("true_t", [0.5, 2.5, 10.0])
def test_multiclass_reaches_brent_optimum_and_keeps_argmax(true_t):
    logits, target = sample_multiclass(50_000, 100, true_t, seed=1)
    scaler, res = fit_both(logits, target)
    assert abs(math.log(res.temperature / true_t)) < 0.1
    check = check_monotone_map(logits, scaler(logits).detach())
    assert check.ok and check.top1_kept and check.strict_inversions == 0


def test_binary_with_huge_logits_keeps_ranking_and_auc():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    s, y = sample_binary(20_000, 3.0, seed=2)
    s[:50] = s[:50].sign() * torch.linspace(25.0, 1e4, 50, dtype=torch.float64)
    assert bool((s.abs() > 20).sum() > 500) and float(s.abs().max()) == 1e4
    scaler, res = fit_both(s, y)
    out = scaler(s).detach()
    check = check_monotone_map(s, out)  # no strict inversion, every decision at 0 kept
    assert check.ok and check.strict_inversions == 0 and check.decisions_kept
    auc0 = sklearn_metrics.roc_auc_score(y.numpy(), s.numpy())
    assert sklearn_metrics.roc_auc_score(y.numpy(), out.numpy()) == auc0


def test_many_classes():
    logits, target = sample_multiclass(2000, 1000, 0.7, seed=3)
    fit_both(logits, target)


def test_masked_logits():
    logits, target = sample_multiclass(5000, 100, 2.0, seed=4, dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(logits.shape, generator=g) < 0.1
    mask[torch.arange(5000), target] = False
    logits[mask] = -math.inf
    scaler, res = fit_both(logits, target)
    out = scaler(logits).detach()
    assert torch.equal(torch.isneginf(out), mask)
    check = check_monotone_map(logits, out)
    assert check.ok and check.top1_kept


def test_binary_masked_negatives_contribute_nothing():
    s, y = sample_binary(4000, 2.0, seed=6)
    s_masked = torch.cat([s, torch.full((100,), -math.inf, dtype=torch.float64)])
    y_masked = torch.cat([y, torch.zeros(100, dtype=torch.float64)])
    _, res = fit_both(s_masked, y_masked)
    assert abs(res.temperature / TemperatureScaler().fit(s, y).temperature - 1) < 1e-7


def test_float16_logits():
    logits, target = sample_multiclass(10_000, 100, 2.0, seed=7, dtype=torch.float16)
    _, res = fit_both(logits, target, oracle_logits=logits.double())
    assert TemperatureScaler(method="newton").fit(logits, target).temperature == res.temperature


def test_lbfgs_method_reaches_the_same_optimum():
    logits, target = sample_multiclass(4000, 10, 2.5, seed=8)
    res = TemperatureScaler(method="lbfgs", grad_tol=1e-9).fit(logits, target)
    t_ref, f_ref = brent_optimum(logits, target)
    assert res.method == "lbfgs" and res.converged
    assert abs(res.temperature / t_ref - 1) <= 1e-6
    assert abs(res.nll_after - f_ref) <= 1e-10
    # every evaluation is one data pass, and LBFGS needs more of them than Newton on 1-D
    assert res.passes >= TemperatureScaler(method="newton").fit(logits, target).passes
    assert TemperatureScaler().fit(logits, target).method == "lbfgs"
    stream = TemperatureScaler().fit_stream([(logits, target)])
    assert stream.method == "newton"  # the streamed default: sums, one pass per step


def test_reference_recipe_stops_short_but_ours_does_not():
    """The widely copied LBFGS(lr=0.01, max_iter=50) on T ends far from the optimum."""
    logits, target = sample_multiclass(2000, 10, 0.5, seed=9)
    t = torch.ones(1, requires_grad=True)
    opt = torch.optim.LBFGS([t], lr=0.01, max_iter=50)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits / t, target)
        loss.backward()
        return loss

    opt.step(closure)
    t_ref, _ = brent_optimum(logits, target)
    assert abs(t.item() / t_ref - 1) > 0.1
    assert abs(TemperatureScaler().fit(logits, target).temperature / t_ref - 1) < 1e-6


def test_subsample_warm_start_path(monkeypatch):
    monkeypatch.setattr(temperature_fit, "SUBSAMPLE_ELEMENTS", 10_000)
    logits, target = sample_multiclass(8000, 50, 2.5, seed=10)
    for method in ("lbfgs", "newton"):
        res = TemperatureScaler(method=method).fit(logits, target)
        assert res.method == method
        assert_optimal(res, logits, target)


@pytest.mark.parametrize("method", ["newton", "lbfgs"])
def test_degenerate_sets_warn_and_stay_bounded(method):
    g = torch.Generator().manual_seed(11)
    z = torch.randn(1000, 5, generator=g)
    with pytest.warns(CalibrationWarning, match="perfectly separated"):
        res = TemperatureScaler(method=method).fit(z, z.argmax(1))
    assert res.temperature == pytest.approx(1e-3) and not res.converged and res.warnings
    assert res.passes <= 20  # stops on the bound, does not keep pushing against it
    # anti-informative logits: the target always has the smallest logit -> T -> inf
    with pytest.warns(CalibrationWarning, match="no better than uniform"):
        res = TemperatureScaler(bounds=(1e-2, 50.0), method=method).fit(z, z.argmin(1))
    assert res.temperature == pytest.approx(50.0) and not res.converged
    assert math.isfinite(res.nll_after) and res.nll_after <= res.nll_before
    s = torch.randn(500, generator=g)
    with pytest.warns(CalibrationWarning, match="perfectly separated"):
        res = TemperatureScaler(method=method).fit(s, (s > 0).float())
    assert res.temperature == pytest.approx(1e-3) and not res.converged
    # constant rows: the NLL does not depend on T at all; T stays at 1, flagged
    for logits, target, uniform in (
        (torch.zeros(100, 4), torch.arange(100) % 4, math.log(4)),
        (torch.zeros(50), torch.arange(50.0) % 2, math.log(2)),
    ):
        with pytest.warns(CalibrationWarning, match="does not depend on T"):
            res = TemperatureScaler(method=method).fit(logits, target)
        assert res.temperature == 1.0 and not res.converged
        assert res.nll_after == res.nll_before == pytest.approx(uniform, rel=1e-15)


def test_works_inside_inference_mode():
    logits, target = sample_multiclass(2000, 10, 2.0, seed=12)
    ref = TemperatureScaler().fit(logits, target).temperature
    scaler = TemperatureScaler()
    with torch.inference_mode():
        inf_logits = logits.clone()
        res = scaler.fit(inf_logits, target.clone())
        out = scaler(inf_logits)
    assert res.temperature == ref
    assert torch.allclose(out, logits / ref)
    # the parameter is still a normal tensor usable with autograd afterwards
    loss = torch.nn.functional.cross_entropy(scaler(logits), target)
    loss.backward()
    assert scaler.log_temperature.grad is not None
    # a scaler built inside inference mode (e.g. in a validation hook), on many chunks (threads)
    big, big_target = sample_multiclass(30_000, 20, 2.0, seed=12)
    ref = TemperatureScaler().fit(big, big_target)
    for method in ("newton", "lbfgs"):
        with torch.inference_mode():
            inner = TemperatureScaler(method=method)
            res = inner.fit(big, big_target)
            stream = TemperatureScaler(method=method).fit_stream([(big, big_target)])
        assert inner.is_fitted and abs(res.temperature / ref.temperature - 1) < 1e-9
        assert abs(stream.temperature / ref.temperature - 1) < 1e-9


def test_deterministic_across_thread_counts():
    """Bit-identical T for repeated calls and any torch thread count (docs/design.md section
    3: seeds give byte-identical reports), on data spanning many chunks."""
    logits, target = sample_multiclass(20_000, 100, 2.0, seed=13)
    prev = torch.get_num_threads()
    temps = []
    try:
        for threads in (1, 2, 3, 4):
            torch.set_num_threads(threads)
            for method in ("newton", "lbfgs"):
                temps.append(
                    (method, TemperatureScaler(method=method).fit(logits, target).temperature)
                )
    finally:
        torch.set_num_threads(prev)
    newton = {t for m, t in temps if m == "newton"}
    lbfgs = {t for m, t in temps if m == "lbfgs"}
    assert len(newton) == 1 and len(lbfgs) == 1, temps
    assert abs(newton.pop() / lbfgs.pop() - 1) < 1e-9


@pytest.mark.parametrize("kind", ["multiclass", "binary", "groups"])
def test_pass_sums_do_not_depend_on_the_worker_count(kind):
    """The per-chunk sums are added in chunk order whatever the number of threads."""
    from torchcal.functional.recalibration import temperature_terms
    from torchcal.functional.temperature.chunks import tensor_chunks
    from torchcal.functional.temperature.sums import BLOCK, WINDOW, temperature_pass

    if kind == "binary":
        z, y = sample_binary(30_000, 2.0, seed=20)
    else:
        z, y = sample_multiclass(6000, 37, 2.0, seed=20)
    groups = torch.arange(y.shape[0]) * 7 % 3 if kind == "groups" else None
    chunks = tensor_chunks(z, y, groups, rows=17)
    assert len(chunks) > BLOCK > 2 * WINDOW  # several windows and blocks
    u = torch.tensor([0.3, -0.2, 0.1][: 3 if groups is not None else 1], dtype=torch.float64)
    kw = dict(
        binary=kind == "binary",
        num_classes=None if kind == "binary" else 37,
        num_groups=3 if groups is not None else 1,
        identity=True,
    )
    ref = temperature_pass(chunks, u, workers=1, **kw)
    for workers in (2, 3, 5):
        assert torch.equal(temperature_pass(chunks, u, workers=workers, **kw), ref)
    # and the sums are right (float64, one pass, against a plain sum over the rows)
    terms = temperature_terms(
        z,
        y,
        torch.exp(u)[groups] if groups is not None else float(torch.exp(u[0])),
        binary=kind == "binary",
        identity=True,
    )
    g = torch.zeros(y.shape[0], dtype=torch.long) if groups is None else groups
    for k, col in enumerate(terms):
        want = torch.zeros(kw["num_groups"], dtype=torch.float64).index_add_(0, g, col)
        assert torch.allclose(ref[:, 1 + k], want, rtol=1e-12, atol=1e-9)
    assert torch.equal(ref[:, 0], torch.bincount(g, minlength=kw["num_groups"]).double())


# ----------------------------------------------------------------------------- stream
@pytest.mark.parametrize("binary", [False, True])
def test_fit_stream_equals_fit(binary):
    if binary:
        logits, target = sample_binary(6000, 2.0, seed=14)
    else:
        logits, target = sample_multiclass(6000, 40, 2.0, seed=14)
    full = TemperatureScaler().fit(logits, target)
    sizes = [1000, 7, 2500, 2493]
    chunks = list(zip(logits.split(sizes), target.split(sizes)))
    stream = TemperatureScaler().fit_stream(chunks)
    assert abs(stream.temperature / full.temperature - 1) <= 1e-7
    assert abs(stream.nll_after - full.nll_after) <= 1e-12
    assert abs(stream.nll_before - full.nll_before) <= 1e-12
    # a zero-argument callable that returns a fresh iterable works too
    again = TemperatureScaler().fit_stream(lambda: iter(chunks))
    assert again.temperature == stream.temperature


def test_fit_stream_rejects_one_shot_iterators_and_mixed_chunks():
    logits, target = sample_multiclass(100, 4, 2.0, seed=15)
    with pytest.raises(ValueError, match="^batches: expected a re-iterable"):
        TemperatureScaler().fit_stream(iter([(logits, target)]))
    with pytest.raises(ValueError, match="^batches: every chunk"):
        TemperatureScaler().fit_stream([(logits, target), (logits[:, :3], target.clamp(max=2))])
    with pytest.raises(ValueError, match="^batches: expected at least one"):
        TemperatureScaler().fit_stream([])
    bad = logits.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"^logits: .*position \(53, 1\)"):
        TemperatureScaler().fit_stream([(logits[:50], target[:50]), (bad, target)])


# ----------------------------------------------------------------------------- fit_model
class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 5)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return 4 * self.drop(self.lin(x))


@pytest.mark.parametrize("as_dict", [False, True])
def test_fit_model_collects_once_in_eval_mode(as_dict):
    g = torch.Generator().manual_seed(16)
    net = _Net()
    net.train()
    x = torch.randn(600, 3, generator=g)
    with torch.no_grad():
        y = torch.multinomial(torch.softmax(net.lin(x), 1), 1, generator=g).squeeze(1)
    if as_dict:
        batches = [{"input": x[i : i + 100], "target": y[i : i + 100]} for i in range(0, 600, 100)]
    else:
        batches = [(x[i : i + 100], y[i : i + 100]) for i in range(0, 600, 100)]
    res = TemperatureScaler().fit_model(net, batches)
    assert net.training  # restored
    with torch.no_grad():
        ref = TemperatureScaler().fit(4 * net.lin(x), y)  # eval(): dropout off
    assert abs(res.temperature / ref.temperature - 1) < 1e-6
    assert abs(res.temperature - 4.0) < 1.0
    half = TemperatureScaler().fit_model(net, batches, cache_dtype=torch.float16)
    assert abs(half.temperature / ref.temperature - 1) < 1e-2


def test_fit_model_rejects_unknown_batches():
    with pytest.raises(ValueError, match="^dataloader:"):
        TemperatureScaler().fit_model(_Net(), [{"foo": torch.zeros(2, 3)}])
    with pytest.raises(ValueError, match="^dataloader: expected at least one batch"):
        TemperatureScaler().fit_model(_Net(), [])


# ----------------------------------------------------------------------------- state
def test_state_dict_round_trip_with_weights_only_load():
    logits, target = sample_multiclass(1000, 5, 2.0, seed=17)
    scaler = TemperatureScaler()
    scaler.fit(logits, target)
    state = scaler.state_dict()
    assert set(state) == {"log_temperature", "fitted"}
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = TemperatureScaler()
    with pytest.raises(NotFittedError):
        loaded(logits)
    loaded.load_state_dict(torch.load(buf, weights_only=True))
    assert loaded.is_fitted and loaded.temperature == scaler.temperature
    assert torch.equal(loaded(logits), scaler(logits))


def test_forward_before_fit_raises_and_manual_temperature():
    scaler = TemperatureScaler()
    with pytest.raises(NotFittedError, match="not fitted"):
        scaler(torch.zeros(2, 3))
    scaler.temperature = 2.0
    assert scaler.is_fitted
    assert torch.equal(scaler(torch.tensor([[2.0, -4.0]])), torch.tensor([[1.0, -2.0]]))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="^temperature: expected a finite value > 0"):
            scaler.temperature = bad
    assert scaler.temperature == 2.0


@pytest.mark.parametrize("temperature", [0.7, 2.3])
def test_forward_invariance_in_every_dtype(temperature):
    """Exact argmax / ranking in float32 and float64; in half precision rounding can tie two
    adjacent logits but never inverts a pair: the original top-1 is still a top-1."""
    g = torch.Generator().manual_seed(21)
    z64 = 3 * torch.randn(20_000, 50, generator=g, dtype=torch.float64)
    scaler = TemperatureScaler()
    scaler.temperature = temperature
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        z = z64.to(dtype)
        out = scaler(z)
        check = check_monotone_map(z, out)  # per row: top-1 kept, never inverted
        assert check.ok and check.top1_kept and check.strict_inversions == 0
        assert check.max_tie_gap_ulps <= 2  # one correctly rounded division
        col = check_monotone_map(z[:, 0], out[:, 0])  # one column as a binary ranking
        assert col.ok and col.strict_inversions == 0 and col.decisions_kept


def test_forward_keeps_dtype_and_masks():
    scaler = TemperatureScaler()
    scaler.temperature = 4.0
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        z = torch.tensor([[8.0, -math.inf, 0.0]], dtype=dtype)
        out = scaler(z)
        assert out.dtype == dtype
        assert out[0, 0].item() == 2.0 and math.isinf(out[0, 1].item())


# ----------------------------------------------------------------------------- bad input
_Z = torch.randn(6, 3)
_Y = torch.tensor([0, 1, 2, 0, 1, 2])


def _nan():
    z = _Z.clone()
    z[4, 2] = float("nan")
    return z


def _posinf():
    z = _Z.clone()
    z[1, 0] = float("inf")
    return z


def _masked_target():
    z = _Z.clone()
    z[2, 2] = -float("inf")
    return z


@pytest.mark.parametrize(
    "logits, target, match",
    [
        (
            _nan(),
            _Y,
            r"^logits: expected finite values or -inf masks, found NaN or \+Inf at position \(4, 2\)",
        ),
        (_posinf(), _Y, r"^logits: .*position \(1, 0\)"),
        (_masked_target(), _Y, r"^logits: the target class is masked \(-inf\) at row 2"),
        (torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), "^logits: expected a non-empty"),
        (
            _Z,
            torch.tensor([0, 1, 2, 0, 1, 3]),
            r"^target: expected class indices in \[0, 2\], got 3 at position 5",
        ),
        (_Z, torch.tensor([0, 1, -1, 0, 1, 2]), "^target: expected class indices"),
        (_Z, _Y[:5], r"^target: expected shape \(6,\)"),
        (_Z, _Y.float(), "^target: expected integer class indices"),
        (_Z[:, :1], _Y, r"^target: expected binary labels"),  # (N, 1) logits are binary
        (
            torch.zeros(2, 3, 4),
            torch.zeros(2, dtype=torch.long),
            r"^logits: expected \(N,\) binary",
        ),
        (torch.zeros(4, dtype=torch.long), torch.zeros(4), "^logits: expected a floating-point"),
        (
            torch.randn(4),
            torch.tensor([0.0, 1.0, 0.5, 1.0]),
            r"^target: expected binary labels in \{0, 1\}, got 0.5 at position 2",
        ),
        (
            torch.tensor([0.0, -math.inf]),
            torch.tensor([0.0, 1.0]),
            "^logits: a -inf .* target 1 at position 1",
        ),
    ],
)
def test_bad_input_raises_clear_errors(logits, target, match):
    with pytest.raises(ValueError, match=match):
        TemperatureScaler().fit(logits, target)


def test_bad_options():
    with pytest.raises(ValueError, match="^bounds:"):
        TemperatureScaler(bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match="^method:"):
        TemperatureScaler(method="adam")
    with pytest.raises(TypeError, match="^logits: expected a torch.Tensor"):
        TemperatureScaler().fit(np.zeros((3, 2)), torch.zeros(3, dtype=torch.long))


def test_no_warning_on_a_regular_fit():
    logits, target = sample_multiclass(2000, 10, 2.0, seed=18)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = TemperatureScaler().fit(logits, target)
    assert res.warnings == () and res.converged and res.iterations >= 1 and res.passes >= 2


# ----------------------------------------------------------------------------- the math
@pytest.mark.parametrize("binary", [False, True])
def test_row_terms_derivatives_match_autograd(binary):
    """Per-sample dNLL/dbeta and d2NLL/dbeta2 of the one objective against autograd."""
    from torchcal.functional.recalibration import temperature_terms as row_terms

    g = torch.Generator().manual_seed(19)
    if binary:
        z = 4 * torch.randn(50, generator=g, dtype=torch.float64)
        z[:3] = torch.tensor([30.0, -45.0, -math.inf], dtype=torch.float64)
        y = torch.bernoulli(torch.sigmoid(z), generator=g)
        y[2] = 0.0
    else:
        z = 4 * torch.randn(50, 7, generator=g, dtype=torch.float64)
        y = torch.randint(0, 7, (50,), generator=g)
        z[torch.arange(50) % 3 == 0, (y[torch.arange(50) % 3 == 0] + 1) % 7] = -math.inf
    beta0 = 0.7

    def loss(b):
        if binary:
            zf = torch.where(torch.isfinite(z), z, torch.zeros_like(z))
            t = b * zf
            return torch.where(
                torch.isfinite(z),
                torch.nn.functional.softplus(t, threshold=1e9) - y * t,
                torch.zeros_like(t),
            )
        zf = torch.where(torch.isfinite(z), z, torch.zeros_like(z))  # no 0 * inf in backward
        zz = torch.where(torch.isfinite(z), zf * b, torch.full_like(z, -math.inf))
        return torch.logsumexp(zz, 1) - (z.gather(1, y[:, None]).squeeze(1) * b)

    b = torch.tensor(beta0, dtype=torch.float64, requires_grad=True)
    ref_l = loss(b)
    ref_d1 = torch.stack(
        [torch.autograd.grad(ref_l[i], b, create_graph=True)[0] for i in range(50)]
    )
    ref_d2 = torch.stack(
        [torch.autograd.grad(ref_d1[i], b, retain_graph=True)[0] for i in range(50)]
    )
    nll, d1, d2, l1, wrong = row_terms(
        z, y, torch.tensor(beta0, dtype=torch.float64), binary=binary, identity=True
    )
    if binary:
        ref_wrong = ((y == 1) & (z < 0)) | ((y == 0) & (z > 0))
    else:
        ref_wrong = z.gather(1, y[:, None]).squeeze(1) < z.max(1).values
    assert torch.equal(wrong, ref_wrong.double())
    assert torch.allclose(nll, ref_l.detach(), rtol=1e-12, atol=1e-12)
    assert torch.allclose(d1, ref_d1.detach(), rtol=1e-10, atol=1e-12)
    assert torch.allclose(d2, ref_d2.detach(), rtol=1e-8, atol=1e-12)
    assert torch.allclose(l1, loss(torch.tensor(1.0, dtype=torch.float64)), rtol=1e-12, atol=1e-12)


def test_forward_gradcheck():
    scaler = TemperatureScaler()
    scaler.temperature = 1.7
    z = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: scaler(x), (z,))


def test_property_random_inputs_never_nan_never_worse():
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")

    @hyp.settings(max_examples=25, deadline=None, derandomize=True)
    @hyp.given(
        n=st.integers(1, 40),
        c=st.integers(2, 6),
        scale=st.floats(1e-3, 1e3),
        seed=st.integers(0, 2**16),
        binary=st.booleans(),
    )
    def check(n, c, scale, seed, binary):
        g = torch.Generator().manual_seed(seed)
        if binary:
            z = scale * torch.randn(n, generator=g, dtype=torch.float64)
            y = torch.randint(0, 2, (n,), generator=g).double()
        else:
            z = scale * torch.randn(n, c, generator=g, dtype=torch.float64)
            y = torch.randint(0, c, (n,), generator=g)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            scaler = TemperatureScaler()
            res = scaler.fit(z, y)
        assert math.isfinite(res.temperature) and 1e-3 <= res.temperature * (1 + 1e-12)
        assert res.temperature <= 1e3 * (1 + 1e-12)
        assert math.isfinite(res.nll_after) and res.nll_after <= res.nll_before + 1e-12
        out = scaler(z).detach()
        check = check_monotone_map(z, out)
        assert check.ok and check.top1_kept and check.decisions_kept

    check()


@pytest.mark.parametrize(("rows", "seed"), [(10, 5), (10, 12), (6, 2), (6, 4)])
def test_lbfgs_line_search_past_the_bound_comes_back(rows, seed):
    """Near-flat logits whose optimum T lies just inside t_min = 1e-3: LBFGS's line search steps
    past the bound; it must come back to the optimum, not stop on the bound (it once returned
    T = t_min with converged=False, NLL far above the optimum's, in the recipe's tiny audit)."""
    g = torch.Generator().manual_seed(seed)
    logits = 0.02 * torch.randn(rows, 12, generator=g, dtype=torch.float64)
    target = torch.multinomial(torch.softmax(logits / 0.003, -1), 1, generator=g).squeeze(1)
    t_ref, nll_ref = brent_optimum(logits, target, t_hint=0.003)
    assert t_ref > 1.5e-3  # the case is inside the bounds
    res = TemperatureScaler(method="lbfgs").fit(logits, target)
    assert res.converged
    assert res.temperature == pytest.approx(t_ref, rel=1e-6)
    assert res.nll_after <= nll_ref + 1e-10
