"""BetaScaler (issue 28 item 3): betacal's three forms at the exact optimum of its objective
(against betacal itself and a float64 scipy solve), its refit rule, its clip, the logits
input, state and bad input."""

import io
import warnings

import numpy as np
import pytest
import torch

from torchcal.functional.beta import beta_features, beta_midpoint, fit_beta
from torchcal.scaling import BetaScaler, CalibrationWarning, NotFittedError

FORMS = ("abm", "ab", "am")


def _data(seed=0, n=3000, a=1.7, b=0.6, c=0.4):
    """Beta-distributed scores with labels drawn from a beta calibration map (a, b, c)."""
    rng = np.random.default_rng(seed)
    p = rng.beta(2.0, 3.0, n)
    truth = 1.0 / (1.0 + np.exp(-(a * np.log(p) - b * np.log(1 - p) + c)))
    y = (rng.random(n) < truth).astype(np.float64)
    return p, y


def _abc(scaler):
    return tuple(float(getattr(scaler, k).detach()) for k in "abc")


def _objective(p, y, a, b, c):
    """betacal's objective (mean NLL) of the map (a, b, c), computed in float64."""
    z = a * np.log(p) - b * np.log1p(-p) + c
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def _betacal(p, y, form):
    """betacal's fit as (a, b, c, m) and its predict."""
    betacal = pytest.importorskip("betacal")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = betacal.BetaCalibration(form).fit(p, y)
    cal = model.calibrator_
    a, b, m = (float(v) for v in cal.map_)
    coef = cal.lr_.coef_[0]
    inter = float(cal.lr_.intercept_[0]) if cal.lr_.fit_intercept else 0.0
    if form == "ab":
        c = (float(coef[0]) + float(coef[1])) * np.log(2.0)
    else:
        c = inter
    return (a, b, c, m), model.predict


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_optimum_of_betacals_objective(form, seed):
    p, y = _data(seed)
    (a0, b0, c0, m0), predict = _betacal(p, y, form)
    scaler = BetaScaler(form)
    res = scaler.fit(torch.tensor(p), torch.tensor(y))
    a, b, c = _abc(scaler)
    ours, theirs = _objective(p, y, a, b, c), _objective(p, y, a0, b0, c0)
    assert ours <= theirs + 1e-12
    assert res.nll_after == pytest.approx(ours, abs=1e-12)
    assert res.converged and res.grad_norm <= 1e-12
    # betacal stops at lbfgs tol 1e-4: close, not equal
    assert np.allclose([a, b, c], [a0, b0, c0], atol=2e-2)
    assert scaler.m == pytest.approx(m0, abs=1e-3)
    # betacal's own predictions are the map it reports
    z = a0 * np.log(p) - b0 * np.log1p(-p) + c0
    assert np.allclose(predict(p), 1.0 / (1.0 + np.exp(-z)), atol=1e-9)


@pytest.mark.parametrize("form", FORMS)
def test_equals_a_float64_scipy_solve(form):
    scipy_optimize = pytest.importorskip("scipy.optimize")
    p, y = _data(2, n=2000)
    x = beta_features(torch.tensor(p).log(), torch.log1p(-torch.tensor(p)), form).numpy()

    def f(w):
        z = x @ w
        return np.mean(np.logaddexp(0.0, z) - y * z)

    def grad(w):
        return x.T @ (1.0 / (1.0 + np.exp(-(x @ w))) - y) / len(y)

    def hess(w):
        s = 1.0 / (1.0 + np.exp(-(x @ w)))
        return (x * (s * (1 - s))[:, None]).T @ x / len(y)

    ref = scipy_optimize.minimize(
        f, np.zeros(x.shape[1]), jac=grad, hess=hess, method="trust-exact", options={"gtol": 1e-12}
    )
    assert np.linalg.norm(grad(ref.x)) < 1e-10
    sol = fit_beta(
        torch.tensor(p).log(), torch.log1p(-torch.tensor(p)), torch.tensor(y), parameters=form
    )
    if form == "abm":
        w = [sol.a, sol.b, sol.c]
    elif form == "ab":
        w = [sol.a, -sol.b]
    else:
        w = [sol.a, sol.c]
    assert sol.dropped == ""
    assert np.allclose(w, ref.x, atol=1e-6, rtol=0)
    assert sol.nll_after <= ref.fun + 1e-12


@pytest.mark.parametrize("form", FORMS)
def test_held_out_nll_no_worse_than_betacal(form):
    p, y = _data(3, n=1000)
    p_test, y_test = _data(4, n=20000)
    _, predict = _betacal(p, y, form)
    scaler = BetaScaler(form)
    scaler.fit(torch.tensor(p), torch.tensor(y))
    q = scaler.predict_proba(torch.tensor(p_test)).numpy()
    q0 = np.clip(predict(p_test), 1e-300, 1 - 1e-16)

    def nll(v):
        return float(-np.mean(y_test * np.log(v) + (1 - y_test) * np.log1p(-v)))

    # the exact fit-set optimum is not the held-out one: across seeds the two differ by a few
    # 1e-6 either way (sampling noise); here ours is no worse beyond that
    assert nll(q) <= nll(q0) + 1e-5


@pytest.mark.parametrize(("truth", "dropped"), [((-0.8, 1.5, -1.0), "a"), ((1.5, -0.8, 1.0), "b")])
def test_abm_refits_without_a_negative_coefficient_as_betacal(truth, dropped):
    p, y = _data(5, n=4000, a=truth[0], b=truth[1], c=truth[2])
    (a0, b0, c0, m0), _ = _betacal(p, y, "abm")
    sol = fit_beta(torch.tensor(p).log(), torch.log1p(-torch.tensor(p)), torch.tensor(y))
    assert sol.dropped == dropped
    assert (sol.a if dropped == "a" else sol.b) == 0.0
    assert (a0 if dropped == "a" else b0) == 0.0  # betacal drops the same one
    assert _objective(p, y, sol.a, sol.b, sol.c) <= _objective(p, y, a0, b0, c0) + 1e-12
    assert np.allclose([sol.a, sol.b, sol.c], [a0, b0, c0], atol=2e-2)
    # this refitted map never crosses 1/2: m is the end where it comes nearest (betacal:
    # its bounded search's end point, within 1e-5)
    assert sol.m == (0.0 if dropped == "a" else 1.0)
    assert sol.m == pytest.approx(m0, abs=1e-4)


def test_midpoint_and_the_identity():
    assert beta_midpoint(1.0, 1.0, 0.0, "abm") == pytest.approx(0.5, abs=1e-15)
    assert beta_midpoint(2.0, 3.0, 0.0, "ab") == 0.5
    assert beta_midpoint(2.0, 2.0, 2.0, "am") == pytest.approx(1 / (1 + np.e), abs=1e-15)
    assert beta_midpoint(0.0, 1.0, 1.0, "abm") == 0.0  # never 1/2: the nearer end
    assert beta_midpoint(0.0, 1.0, -1.0, "abm") == pytest.approx(1 - np.exp(-1), abs=1e-14)
    assert beta_midpoint(1.0, 0.0, 1.0, "abm") == pytest.approx(np.exp(-1), abs=1e-14)
    # a calibrated set is (nearly) left alone
    rng = np.random.default_rng(6)
    p = rng.uniform(0.02, 0.98, 20000)
    y = (rng.random(p.size) < p).astype(np.float64)
    scaler = BetaScaler()
    res = scaler.fit(torch.tensor(p), torch.tensor(y))
    assert res.nll_after <= res.nll_before
    assert res.nll_before - res.nll_after < 1e-3


def test_betacals_clip_and_the_logits_input():
    p, y = _data(7, n=1500)
    p[:3] = [0.0, 1.0, 1e-20]  # clipped to [eps, 1 - eps] as betacal does
    (a0, b0, c0, _), predict = _betacal(p, y, "abm")
    scaler = BetaScaler()
    scaler.fit(torch.tensor(p), torch.tensor(y))
    pc = np.clip(p, np.finfo(np.float64).eps, 1 - np.finfo(np.float64).eps)
    assert _objective(pc, y, *_abc(scaler)) <= (_objective(pc, y, a0, b0, c0) + 1e-12)
    out = scaler.predict_proba(torch.tensor(p[:3])).numpy()
    assert np.allclose(out, predict(p[:3]), atol=5e-3)
    # logits: the same map of p = sigmoid(s), computed in log space (no clip needed)
    p, y = _data(8, n=1500)
    s = torch.tensor(np.log(p) - np.log1p(-p))
    by_probs, by_logits = BetaScaler(), BetaScaler(input="logits")
    by_probs.fit(torch.tensor(p), torch.tensor(y))
    by_logits.fit(s, torch.tensor(y))
    for name in ("a", "b", "c"):
        assert getattr(by_logits, name).detach().item() == pytest.approx(
            getattr(by_probs, name).detach().item(), abs=1e-9
        )
    assert torch.allclose(by_logits(s), by_probs(torch.tensor(p)), atol=1e-9)
    with pytest.warns(CalibrationWarning, match="^scores: every value is in \\[0, 1\\]"):
        BetaScaler(input="logits").fit(torch.tensor(p), torch.tensor(y))
    far = torch.tensor([-60.0, 60.0], dtype=torch.float64)
    assert torch.isfinite(by_logits(far)).all()


def test_forward_state_and_determinism():
    p, y = _data(9, n=800)
    pt, yt = torch.tensor(p), torch.tensor(y)
    one, two = BetaScaler("am"), BetaScaler("am")
    one.fit(pt, yt)
    two.fit(pt, yt)
    assert torch.equal(one(pt), two(pt))
    out = one(pt.float())
    assert out.dtype == torch.float32 and out.shape == pt.shape
    assert one(pt.unsqueeze(1)).shape == (800, 1)
    assert torch.allclose(torch.sigmoid(one(pt)), one.predict_proba(pt), atol=1e-15)
    buf = io.BytesIO()
    torch.save(one.state_dict(), buf)
    buf.seek(0)
    loaded = BetaScaler("am")
    loaded.load_state_dict(torch.load(buf, weights_only=True))
    assert loaded.is_fitted and torch.equal(loaded(pt), one(pt))
    assert loaded.a.dtype == torch.float64
    bad = dict(one.state_dict(), c=torch.tensor(float("nan"), dtype=torch.float64))
    with pytest.raises(ValueError, match="^c: expected finite"):
        BetaScaler("am").load_state_dict(bad)


def test_bad_input():
    p, y = _data(10, n=200)
    pt, yt = torch.tensor(p), torch.tensor(y)
    with pytest.raises(NotFittedError):
        BetaScaler()(pt)
    with pytest.raises(ValueError, match="^parameters: "):
        BetaScaler("abc")
    with pytest.raises(ValueError, match="^input: "):
        BetaScaler(input="prob")
    with pytest.raises(TypeError, match="^scores: "):
        BetaScaler().fit(p, yt)
    with pytest.raises(ValueError, match="^scores: expected \\(N,\\) binary"):
        BetaScaler().fit(torch.rand(10, 3, dtype=torch.float64), torch.zeros(10))
    with pytest.raises(ValueError, match="^scores: expected probabilities in \\[0, 1\\]"):
        BetaScaler().fit(pt * 2, yt)
    with pytest.raises(ValueError, match="^scores: expected probabilities"):
        BetaScaler().fit(torch.where(pt > 0.5, float("nan"), pt), yt)
    with pytest.raises(ValueError, match="^scores: expected finite"):
        BetaScaler(input="logits").fit(torch.full((5,), float("inf")), torch.zeros(5))
    with pytest.raises(ValueError, match="^target: expected shape"):
        BetaScaler().fit(pt, yt[:-1])
    with pytest.raises(ValueError, match="^target: expected binary labels"):
        BetaScaler().fit(pt, yt * 2)
    with pytest.raises(ValueError, match="^target: expected both classes"):
        BetaScaler().fit(pt, torch.ones_like(yt))
    with pytest.raises(ValueError, match="^target: the classes are perfectly separated"):
        BetaScaler().fit(pt, (pt > 0.5).double())
    with pytest.raises(ValueError, match="^target: the classes are perfectly separated"):
        BetaScaler().fit(pt, (pt < 0.5).double())


def test_abm_both_coefficients_negative_drops_a_first_as_betacal():
    """Anti-calibrated scores: the free fit has a < 0 and b < 0; betacal checks a first, drops
    it and does not check the refitted b again."""
    rng = np.random.default_rng(11)
    p = rng.beta(2.0, 2.0, 3000)
    y = (rng.random(p.size) < 1 - p).astype(np.float64)
    (a0, b0, c0, m0), _ = _betacal(p, y, "abm")
    sol = fit_beta(torch.tensor(p).log(), torch.log1p(-torch.tensor(p)), torch.tensor(y))
    assert sol.dropped == "a" and sol.a == 0.0 and sol.b < 0.0
    assert a0 == 0.0 and b0 < 0.0
    assert np.allclose([sol.a, sol.b, sol.c], [a0, b0, c0], atol=2e-3)
    assert sol.m == pytest.approx(m0, abs=1e-4)


def test_float32_scores_are_clipped_at_float32_eps():
    """betacal's clip uses the machine epsilon of the scores' dtype: float32 scores of 0 and 1
    become 2^-23 and 1 - 2^-23, exactly as the same values clipped in float64."""
    p, y = _data(12, n=1500)
    p[:4] = [0.0, 1.0, 0.0, 1.0]
    p32 = torch.tensor(p, dtype=torch.float32)
    eps32 = float(torch.finfo(torch.float32).eps)
    clipped = p32.double().clamp(eps32, 1.0 - eps32)
    by32, by64 = BetaScaler(), BetaScaler()
    by32.fit(p32, torch.tensor(y))
    by64.fit(clipped, torch.tensor(y))
    assert np.allclose(_abc(by32), _abc(by64), atol=1e-9, rtol=0)
    assert torch.allclose(by32.predict_proba(p32[:4]), by64.predict_proba(clipped[:4]), atol=1e-12)


def test_a_tie_at_the_class_boundary_is_still_separated():
    """Every negative's p <= every positive's with one shared value: no maximum likelihood."""
    p = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.4, 0.6, 0.7, 0.8], dtype=torch.float64)
    y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1], dtype=torch.float64)
    with pytest.raises(ValueError, match="^target: the classes are perfectly separated"):
        BetaScaler().fit(p, y)
    with pytest.raises(ValueError, match="^target: the classes are perfectly separated"):
        BetaScaler().fit(p, 1 - y)


def test_stopping_short_of_the_tolerance_is_reported():
    p, y = _data(13, n=1000)
    with pytest.warns(CalibrationWarning, match="parameters: stopped before the tolerance"):
        res = BetaScaler(max_iter=1).fit(torch.tensor(p), torch.tensor(y))
    assert not res.converged and res.grad_norm > 1e-12
