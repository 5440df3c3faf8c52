"""Conformal classification sets: exact coverage by seeded simulation, sharp against a rank shift
of one in either direction; class-conditional coverage; RAPS against APS; the set API."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import torchcal.functional.conformal as CF
from torchcal.functional import conformal_score_matrix, conformal_scores, conformal_sets
from torchcal.scaling import conformal_quantile

F64 = torch.float64
ALPHA, N_CAL = 0.1, 500


def _k(n: torch.Tensor) -> torch.Tensor:
    """ceil((n + 1) * 9 / 10) in integers, independent of the library."""
    return -(-(n + 1) * 9 // 10)


@pytest.fixture
def rank_offset(request, monkeypatch):
    """Shift the library's rank by ``request.param`` (the hook that proves the tests sharp)."""
    off = request.param
    if off:
        true_rank = CF.conformal_rank
        monkeypatch.setattr(CF, "conformal_rank", lambda n, a: true_rank(n, a) + off)
    return off


def _pool(P: int = 2000, C: int = 10, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = 1.5 * torch.randn(P, C, generator=g, dtype=F64)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    logits = 1.5 * z  # an over-confident model of the true z
    u = torch.rand(P, generator=g, dtype=F64)
    return logits, y, u, g


def _splits(P: int, S: int, g: torch.Generator) -> torch.Tensor:
    return torch.argsort(torch.rand(S, P, generator=g), dim=1)


METHODS = [
    ("lac", {}),
    ("aps", {}),
    ("raps", {"lam": 0.01, "k_reg": 2}),
    # non-randomised, both set rules: the published one (include_last, never empty) and the
    # inclusive-mass one; continuous scores away from 0, so the coverage is k / (n + 1) too
    ("aps", {"randomized": False}),
    ("aps", {"randomized": False, "include_last": False}),
    ("raps", {"lam": 0.01, "k_reg": 2, "randomized": False}),
    ("raps", {"lam": 0.01, "k_reg": 2, "randomized": False, "include_last": False}),
]


@pytest.mark.parametrize("rank_offset", [0, -1, 1], indirect=True)
def test_marginal_coverage_is_exact_and_sharp(rank_offset: int) -> None:
    # S random calibration/test splits of a fixed pool: with continuous scores the mean
    # coverage is exactly k / (n + 1) = 451 / 501 in [0.9, 0.9 + 1 / 501]; the standard error
    # over 4000 splits is ~2.2e-4, a rank shift of one moves the mean by 1 / 501 = 2.0e-3
    logits, y, u, g = _pool()
    P, S = logits.shape[0], 4000
    perm = _splits(P, S, g)
    cal, test = perm[:, :N_CAL], perm[:, N_CAL:]
    sid = torch.arange(S).repeat_interleave(N_CAL)
    k = int(_k(torch.tensor(N_CAL)))
    assert Fraction(k, N_CAL + 1) >= Fraction(9, 10) > Fraction(k - 1, N_CAL + 1)
    verdicts = []
    for method, kw in METHODS:
        s = conformal_scores(logits, y, method, u=u, **kw)
        q, n, _ = conformal_quantile(s[cal].reshape(-1), ALPHA, sid, S)
        cover = (s[test] <= q[:, None]).double().mean(1)
        mean, se = float(cover.mean()), float(cover.std()) / math.sqrt(S)
        exact_ok = abs(mean - k / (N_CAL + 1)) <= 4 * se
        band_ok = 0.9 - 4 * se <= mean <= 0.9 + 1 / (N_CAL + 1) + 4 * se
        verdicts.append(exact_ok and band_ok)
    if rank_offset == 0:
        assert all(verdicts), verdicts
    else:
        assert not any(verdicts), verdicts


@pytest.mark.parametrize("rank_offset", [0, -1, 1], indirect=True)
def test_class_conditional_coverage_per_class(rank_offset: int) -> None:
    # one threshold per true class (groups = target): within every class the coverage is
    # k_c / (n_c + 1) >= 0.9 given the class counts n_c of the split
    logits, y, u, g = _pool(P=2000, C=10, seed=1)
    P, C, S = logits.shape[0], logits.shape[1], 1000
    perm = _splits(P, S, g)
    cal, test = perm[:, :N_CAL], perm[:, N_CAL:]
    for method, kw in METHODS[:2]:
        s = conformal_scores(logits, y, method, u=u, **kw)
        gid = (torch.arange(S)[:, None] * C + y[cal]).reshape(-1)
        q, n, _ = conformal_quantile(s[cal].reshape(-1), ALPHA, gid, S * C)
        q, n = q.reshape(S, C), n.reshape(S, C)
        yt = y[test]
        hit = (s[test] <= q.gather(1, yt)).double()  # each test point against its class
        onehot = torch.nn.functional.one_hot(yt, C).double()  # (S, T, C)
        cov = (hit[:, :, None] * onehot).sum(1) / onehot.sum(1)  # (S, C)
        expect = (_k(n).double() / (n + 1).double()).mean(0)
        mean, se = cov.mean(0), cov.std(0) / math.sqrt(S)
        ok = ((mean - expect).abs() <= 4 * se) & (mean >= 0.9 - 4 * se)
        if rank_offset == 0:
            assert bool(ok.all()), (method, mean, expect)
        else:
            assert not bool(ok.any()), (method, mean, expect)


def _hard_100_class_pool(P: int, g: torch.Generator):
    """100 classes; the model ranks the likely labels first but is over-confident and its
    top-1 confidence varies widely between points (the setting where APS sets blow up)."""
    C = 100
    z = torch.randn(P, C, generator=g, dtype=F64)
    a = 2 + 6 * torch.rand(P, generator=g, dtype=F64)
    order = torch.argsort(torch.rand(P, C, generator=g), 1)
    z.scatter_(1, order[:, :3], torch.stack([a, a - 2, a - 3], 1))
    rank_p = torch.tensor([0.85, 0.07, 0.03] + [0.05 / 97] * 97, dtype=F64)
    r = torch.multinomial(rank_p, P, replacement=True, generator=g)
    return 2 * z, order.gather(1, r[:, None])[:, 0]


def test_raps_sets_smaller_than_aps_at_equal_coverage() -> None:
    g = torch.Generator().manual_seed(2)
    P, S, n = 3000, 40, 1000
    logits, y = _hard_100_class_pool(P, g)
    u = torch.rand(P, generator=g, dtype=F64)
    perm = _splits(P, S, g)
    cal, test = perm[:, :n], perm[:, n:]
    sid = torch.arange(S).repeat_interleave(n)
    out = {}
    for name, method, kw in [("aps", "aps", {}), ("raps", "raps", {"lam": 0.01, "k_reg": 5})]:
        m = conformal_score_matrix(logits, method, u=u, **kw)
        s = m.gather(1, y[:, None])[:, 0]
        q, _, _ = conformal_quantile(s[cal].reshape(-1), ALPHA, sid, S)
        cover = (s[test] <= q[:, None]).double().mean(1)
        size = (m[test] <= q[:, None, None]).sum(-1).double().mean(1)
        out[name] = (float(cover.mean()), float(cover.std()) / math.sqrt(S), float(size.mean()))
    (ca, sa, za), (cr, sr, zr) = out["aps"], out["raps"]
    assert abs(ca - cr) <= 4 * math.hypot(sa, sr)  # equal coverage
    assert min(ca, cr) >= 0.9 - 4 * max(sa, sr)
    assert zr < 0.6 * za, out  # measured: about 7 against 15 labels


# ----------------------------------------------------------------------------- the set API


def _aps_reference(p: list[float], u: float, rule: str, lam: float, k_reg: int):
    """Row-by-row Python APS / RAPS scores of every label (the independent reference):
    randomised, inclusive mass, or (the published non-randomised rule) the smallest threshold
    whose set ``{ranks up to the first whose cumulative score reaches it}`` holds the label."""
    order = sorted(range(len(p)), key=lambda j: (-p[j], j))
    out, above = [0.0] * len(p), 0.0
    inclusive = []
    for r, j in enumerate(order, start=1):
        inclusive.append(above + p[j] + lam * max(0, r - k_reg))
        if rule == "published":
            out[j] = 0.0 if r == 1 else inclusive[r - 2]
        else:
            out[j] = above + (u * p[j] if rule == "randomized" else p[j]) + lam * max(0, r - k_reg)
        above += p[j]
    return out


@pytest.mark.parametrize("rule", ["randomized", "inclusive", "published"])
@pytest.mark.parametrize("lam, k_reg", [(0.0, 0), (0.05, 2)])
def test_aps_raps_scores_match_a_row_by_row_reference(rule, lam, k_reg) -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(30, 7, generator=g, dtype=F64) * 2
    logits[0, 3] = logits[0, 5]  # a tie: ranked by label index
    u = torch.rand(30, generator=g, dtype=F64)
    method = "raps" if lam else "aps"
    kw = {"randomized": rule == "randomized"}
    if rule == "inclusive":
        kw["include_last"] = False
    got = conformal_score_matrix(logits, method, u=u, lam=lam, k_reg=k_reg, **kw)
    p = torch.softmax(logits, 1)
    for b in range(30):
        ref = _aps_reference(p[b].tolist(), float(u[b]), rule, lam, k_reg)
        assert got[b].tolist() == pytest.approx(ref, abs=1e-12)


def test_sets_thresholds_sizes_and_topk() -> None:
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 4, generator=g)
    s = conformal_score_matrix(logits, "lac")
    for t in (0.5, torch.tensor(0.5), torch.full((6, 1), 0.5), torch.full((1, 4), 0.5)):
        assert torch.equal(conformal_sets(logits, t, "lac"), s <= 0.5)
    assert bool(conformal_sets(logits, math.inf, "aps", u=torch.zeros(6)).all())
    top2 = conformal_sets(logits, 2.0, "topk")
    assert top2.sum(1).tolist() == [2] * 6
    assert torch.equal(top2, torch.zeros_like(top2).scatter(1, logits.topk(2, 1).indices, True))
    with pytest.raises(ValueError, match="^threshold"):
        conformal_sets(logits, torch.zeros(4), "lac")  # 1-d: ambiguous
    with pytest.raises(ValueError, match="^logits"):
        conformal_sets(logits[:, :1], 0.5, "lac")
    with pytest.raises(ValueError, match="^method"):
        conformal_sets(logits, 0.5, "naive")
    with pytest.raises(ValueError, match="^target"):
        conformal_scores(logits, torch.full((6,), 4), "lac")
    with pytest.raises(ValueError, match="^u"):
        conformal_scores(logits, torch.zeros(6, dtype=torch.long), "aps", u=torch.zeros(5))
    masked = logits.clone()
    masked[:, 0] = -math.inf  # a mask: probability 0, ranked last, never in a LAC set < 1
    assert not bool(conformal_sets(masked, 0.99, "lac")[:, 0].any())
    assert bool((conformal_score_matrix(masked, "topk")[:, 0] == 4).all())
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="^logits"):
            conformal_sets(torch.full((2, 3), bad), 0.5, "lac")
    with pytest.raises(ValueError, match="^logits: a row is masked"):
        conformal_sets(torch.full((2, 3), -math.inf), 0.5, "lac")
    # probabilities in, temperature applied to their logs
    p = torch.softmax(logits.double(), 1)
    a = conformal_score_matrix(p, "aps", input="probs", u=torch.zeros(6), temperature=2.0)
    b = conformal_score_matrix(logits, "aps", u=torch.zeros(6), temperature=2.0)
    assert torch.allclose(a, b, atol=1e-12)


@pytest.mark.cuda
def test_sets_on_gpu_match_cpu() -> None:
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(1000, 50, generator=g)
    u = torch.rand(1000, generator=g, dtype=F64)
    for method in ("lac", "aps", "raps", "topk"):
        cpu = conformal_score_matrix(logits, method, u=u)
        gpu = conformal_score_matrix(logits.cuda(), method, u=u.cuda())
        assert torch.allclose(cpu, gpu.cpu(), atol=1e-12, rtol=0)
        q = torch.tensor(0.9, dtype=F64)
        assert conformal_sets(logits.cuda(), q.cuda(), method, u=u.cuda()).is_cuda
