"""ConformalClassifier: a thin shell over the functional sets; the set temperature is stated."""

from __future__ import annotations

import warnings

import pytest
import torch

from torchcal.functional import conformal_score_matrix, conformal_scores, conformal_sets
from torchcal.scaling import CalibrationWarning, ConformalClassifier, conformal_quantile

F64 = torch.float64


def _data(n: int = 1200, C: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, C, generator=g) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    return 2.0 * z, y, g  # over-confident logits


@pytest.mark.parametrize("method", ["lac", "aps", "raps", "topk"])
@pytest.mark.parametrize("randomized", [False, True])
def test_shell_equals_the_functional_pipeline(method: str, randomized: bool) -> None:
    logits, y, g = _data()
    u_cal = torch.rand(600, generator=g, dtype=F64)
    u_test = torch.rand(600, generator=g, dtype=F64)
    cc = ConformalClassifier(0.1, method, randomized=randomized)
    fit = cc.fit(logits[:600], y[:600], u=u_cal)
    s = conformal_scores(logits[:600], y[:600], method, u=u_cal, randomized=randomized)
    q, n, k = conformal_quantile(s, 0.1)
    assert fit.quantiles == tuple(q.tolist()) and fit.ranks == (541,)
    want = conformal_sets(logits[600:], q[0], method, u=u_test, randomized=randomized)
    assert torch.equal(cc.predict(logits[600:], u=u_test), want)
    again = ConformalClassifier(0.1, method, randomized=randomized)
    again.load_state_dict(cc.state_dict())
    assert torch.equal(again.predict(logits[600:], u=u_test), want)


def test_class_and_group_conditional() -> None:
    logits, y, g = _data()
    cc = ConformalClassifier(0.1, "lac", conditional="class")
    fit = cc.fit(logits[:600], y[:600])
    assert len(fit.quantiles) == 6 and sum(fit.counts) == 600
    sets = cc.predict(logits[600:])
    s = conformal_score_matrix(logits[600:], "lac")
    assert torch.equal(sets, s <= torch.tensor(fit.quantiles, dtype=F64)[None, :])
    grp = torch.arange(1200) % 3
    cg = ConformalClassifier(0.1, "lac", conditional="group")
    fit = cg.fit(logits[:600], y[:600], groups=grp[:600])
    sets = cg.predict(logits[600:], groups=grp[600:])
    q = torch.tensor(fit.quantiles, dtype=F64)[grp[600:]][:, None]
    assert torch.equal(sets, s <= q)
    with pytest.raises(ValueError, match="^groups"):
        cg.fit(logits[:600], y[:600])
    with pytest.raises(ValueError, match="^groups"):
        ConformalClassifier(0.1, "lac").fit(logits[:600], y[:600], groups=grp[:600])


def test_set_temperature_is_a_stated_choice() -> None:
    logits, y, g = _data()
    with pytest.warns(CalibrationWarning, match="^temperature: T = 1.7 used for the sets"):
        ConformalClassifier(0.1, "aps", temperature=1.7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cc = ConformalClassifier(
            0.1, "aps", randomized=True, temperature=1.7, temperature_source="calibration"
        )
        ConformalClassifier(0.1, "aps")  # no temperature: the logits as given
    u = torch.rand(600, generator=g, dtype=F64)
    cc.fit(logits[:600], y[:600], u=u)
    ref = conformal_scores(logits[:600], y[:600], "aps", u=u, temperature=1.7)
    assert float(cc.score_quantiles[0]) == float(conformal_quantile(ref, 0.1)[0][0])
    for bad in (dict(temperature=0.0), dict(temperature="auto")):
        with pytest.raises(ValueError, match="^temperature"):
            ConformalClassifier(0.1, "aps", **bad)
    with pytest.raises(ValueError, match="^temperature_source"):
        ConformalClassifier(0.1, "aps", temperature_source="calibration")


def test_fit_size_temperature_on_a_held_out_split() -> None:
    # T chosen for set size on a split disjoint from the calibration points; the sets are no
    # larger than at T = 1 on the size split, and coverage stays valid on fresh test points
    logits, y, g = _data(n=3000, seed=1)
    cc = ConformalClassifier(0.1, "aps", randomized=True, temperature="fit_size")
    with pytest.raises(ValueError, match="^size_split"):
        cc.fit(logits[:1000], y[:1000])
    cc.fit(logits[:1000], y[:1000], size_split=(logits[1000:2000], y[1000:2000]))
    t = float(cc.set_temperature)
    assert t != 1.0
    plain = ConformalClassifier(0.1, "aps", randomized=True)
    plain.fit(logits[:1000], y[:1000], generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(4)
    a = cc.predict(logits[2000:], generator=gen)
    b = plain.predict(logits[2000:], generator=torch.Generator().manual_seed(4))
    assert float(a.sum(1).double().mean()) < float(b.sum(1).double().mean())
    cover = float(a[torch.arange(1000), y[2000:]].double().mean())
    assert cover >= 0.9 - 3 * (0.09 / 1000) ** 0.5 - 1 / 1001
