"""Issue 30: the published non-randomised APS / RAPS rule (never an empty set), deterministic
ConformalClassifier sets by default, probabilities used as given (MAPIE's LAC scores), and a
threshold of 1 that admits every label (the RAPS authors' tau == 1 rule)."""

from __future__ import annotations

import pytest
import torch

from torchcal.functional import conformal_score_matrix, conformal_scores, conformal_sets
from torchcal.scaling import ConformalClassifier, conformal_quantile

F64 = torch.float64


def _confident(seed: int = 0, n: int = 2000, C: int = 10):
    """The issue's case: a confident 10-class model, logits 6 * randn, labels drawn from it."""
    g = torch.Generator().manual_seed(seed)
    z = 6 * torch.randn(n, C, generator=g, dtype=F64)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    return z, y


@pytest.mark.parametrize("method", ["aps", "raps"])
def test_published_rule_never_returns_an_empty_set(method: str) -> None:
    z, y = _confident()
    published = ConformalClassifier(alpha=0.1, method=method)  # randomized=False by default
    published.fit(z[:1000], y[:1000])
    sets = published.predict(z[1000:])
    assert int((sets.sum(1) == 0).sum()) == 0
    assert float(sets[torch.arange(1000), y[1000:]].double().mean()) >= 0.9 - 3 * 0.0095
    old = ConformalClassifier(alpha=0.1, method=method, include_last=False)
    old.fit(z[:1000], y[:1000])
    empty = old.predict(z[1000:]).sum(1) == 0
    # the defect under the old rule: empty sets, all on the surest rows
    assert int(empty.sum()) > 20
    top = torch.softmax(z[1000:], 1).max(1).values
    assert float(top[empty].min()) > float(old.score_quantiles[0]) - 0.02


def test_published_rule_admits_the_crossing_label() -> None:
    p = torch.tensor([[0.5, 0.3, 0.2], [0.97, 0.02, 0.01]], dtype=F64)
    sets = conformal_sets(p, 0.6, "aps", input="probs", randomized=False)
    # row 0: 0.5 < 0.6, then 0.8 crosses: two labels; row 1: 0.97 crosses at once: the top one
    assert sets.tolist() == [[True, True, False], [True, False, False]]
    plain = conformal_sets(p, 0.6, "aps", input="probs", randomized=False, include_last=False)
    assert plain.tolist() == [[True, False, False], [False, False, False]]
    # the calibration score is the smallest threshold whose set holds the label
    s = conformal_score_matrix(p, "aps", input="probs", randomized=False)
    assert torch.allclose(s, torch.tensor([[0.0, 0.5, 0.8], [0.0, 0.97, 0.99]], dtype=F64))


def test_include_last_only_where_it_applies() -> None:
    z, _ = _confident(n=4)
    for kw in ({"method": "lac"}, {"method": "topk"}, {"method": "aps", "randomized": True}):
        with pytest.raises(ValueError, match="^include_last: only for non-randomised"):
            conformal_sets(z, 0.5, include_last=True, **kw)
        with pytest.raises(ValueError, match="^include_last"):
            ConformalClassifier(0.1, include_last=False, **kw)
    with pytest.raises(TypeError, match="^include_last"):
        conformal_sets(z, 0.5, "aps", randomized=False, include_last=1)
    with pytest.raises(TypeError, match="^randomized"):
        ConformalClassifier(0.1, randomized=1)


def test_predict_is_deterministic_by_default() -> None:
    z, y = _confident(seed=1)
    cc = ConformalClassifier(alpha=0.1)
    cc.fit(z[:1000], y[:1000])
    assert torch.equal(cc.predict(z[1000:]), cc.predict(z[1000:]))
    # randomised sets: fresh draws each call unless the user fixes them
    rnd = ConformalClassifier(alpha=0.1, randomized=True)
    rnd.fit(z[:1000], y[:1000], generator=torch.Generator().manual_seed(0))
    a, b = rnd.predict(z[1000:]), rnd.predict(z[1000:])
    assert not torch.equal(a, b)
    g1, g2 = (torch.Generator().manual_seed(5) for _ in range(2))
    assert torch.equal(rnd.predict(z[1000:], generator=g1), rnd.predict(z[1000:], generator=g2))


def test_threshold_one_admits_every_label() -> None:
    # 2,000 random rows: the float cumulative sum passes 1 by ~4e-16 on many of them, which
    # dropped the last label at a threshold of exactly 1 (the RAPS authors: tau == 1.0 -> all)
    g = torch.Generator().manual_seed(2)
    z = 3 * torch.randn(2000, 10, generator=g, dtype=F64)
    p = torch.softmax(z, 1)
    cum = torch.cumsum(p.sort(1, descending=True).values, 1)
    assert int((cum[:, -1] > 1).sum()) > 100  # the case is real
    ones = torch.ones(2000, dtype=F64)
    for kw in (
        {"randomized": False},
        {"randomized": False, "include_last": False},
        {"randomized": True, "u": ones},
    ):
        for method, extra in (("aps", {}), ("raps", {"lam": 0.0})):
            assert bool(conformal_sets(z, 1.0, method, **kw, **extra).all()), (method, kw)
            probs = conformal_sets(p, 1.0, method, input="probs", **kw, **extra)
            assert bool(probs.all()), (method, kw)
    # RAPS with a penalty keeps its published score: a penalised label needs a larger threshold
    raps = conformal_sets(z, 1.0, "raps", randomized=False, lam=0.5, k_reg=2)
    assert raps.sum(1).max() == 3


def test_probabilities_are_used_as_given() -> None:
    p = torch.tensor([[0.5, 0.50009], [0.3, 0.7]], dtype=F64)  # row 0 sums to 1 + 9e-5
    s = conformal_score_matrix(p, "lac", input="probs")
    assert torch.equal(s, 1 - p)  # not renormalised: [0.5, 0.49991], not [0.500045, ...]
    # every score path reads p as given
    aps = conformal_score_matrix(p, "aps", input="probs", randomized=False, include_last=False)
    assert torch.equal(aps[1], torch.tensor([1.0, 0.7], dtype=F64))
    with pytest.raises(ValueError, match="^logits"):
        conformal_score_matrix(torch.tensor([[0.5, 0.6]], dtype=F64), "lac", input="probs")


def test_lac_scores_equal_mapie() -> None:
    mapie = pytest.importorskip("mapie")
    from mapie.conformity_scores import LACConformityScore

    assert mapie.__version__
    g = torch.Generator().manual_seed(3)
    p = torch.distributions.Dirichlet(torch.ones(5, dtype=F64)).sample((500,))
    p = p / p.sum(1, keepdim=True)
    y = torch.randint(0, 5, (500,), generator=g)
    ref = LACConformityScore().get_conformity_scores(y.numpy(), p.numpy(), y_enc=y.numpy())
    got = conformal_scores(p, y, "lac", input="probs")
    assert torch.equal(got, torch.from_numpy(ref.reshape(-1)))  # bitwise
    # renormalising (softmax(log p)) moved some of them by an ulp: the check is sharp
    renorm = 1 - torch.softmax(torch.log(p), 1).gather(1, y[:, None])[:, 0]
    assert not torch.equal(renorm, got)


def test_classifier_takes_probabilities() -> None:
    z, y = _confident(seed=4, n=1200)
    p = torch.softmax(z, 1)
    cc = ConformalClassifier(alpha=0.1, method="lac", input="probs")
    fit = cc.fit(p[:600], y[:600])
    q, _, _ = conformal_quantile(1 - p[:600].gather(1, y[:600, None])[:, 0], 0.1)
    assert fit.quantiles == (float(q[0]),)
    assert torch.equal(cc.predict(p[600:]), (1 - p[600:]) <= q[0])
    aps = ConformalClassifier(alpha=0.1, input="probs")
    aps.fit(p[:600], y[:600])
    ref = ConformalClassifier(alpha=0.1)
    ref.fit(z[:600], y[:600])
    assert abs(float(aps.score_quantiles[0]) - float(ref.score_quantiles[0])) <= 1e-12
    with pytest.raises(ValueError, match="^logits"):
        cc.fit(z[:600], y[:600])  # logits are not probabilities
    with pytest.raises(ValueError, match="^input"):
        ConformalClassifier(input="log_probs")
