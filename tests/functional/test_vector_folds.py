"""The vector map's fold fit (functional/vector_folds.py): damped Newton with the exact Hessian
on float32 passes reaches the float64 optimum of the same penalised objective, masks included,
and the cross-validated path it gives is the LBFGS path's (docs/design.md section 4)."""

import math

import pytest
import torch

from torchcal.functional import recalibration as R
from torchcal.functional.affine import affine_inputs, affine_objective, fit_affine, vector_map
from torchcal.functional.cv import FOLD_GRAD_TOL, cross_validate_path, strength_path
from torchcal.functional.vector_folds import VectorFold


def _data(n, c, seed, masked=False):
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(n, c, generator=g, dtype=torch.float64)
    bias = torch.randn(c, generator=g, dtype=torch.float64)
    scale = torch.exp(0.3 * torch.randn(c, generator=g, dtype=torch.float64))
    logits = z / 2 * scale + bias
    if masked:  # a fifth of the entries masked, never the label's
        mask = torch.rand(n, c, generator=g) < 0.2
        mask[:, 0] = False
        z, logits = z.masked_fill(mask, -math.inf), logits.masked_fill(mask, -math.inf)
    y = torch.multinomial(torch.softmax(logits, 1), 1, generator=g).squeeze(1)
    return z, y


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("lam", [1e-3, 0.1, 10.0])
def test_the_fold_fit_reaches_the_float64_optimum(lam, masked):
    c = 12
    z, y = _data(2000, c, 1, masked)
    zi, yi, mask = affine_inputs(z, y)
    m = vector_map(c, lam, lam)
    one, zero = torch.ones(c, dtype=torch.float64), torch.zeros(c, dtype=torch.float64)
    ref = fit_affine(z, y, m, one, zero, grad_tol=1e-12)
    fold = VectorFold(zi, yi, mask)
    x = fold.solve(torch.cat([one, zero]), lam, lam, 1e-7, 100)
    # the float32 gradient's error is ~3e-8: the parameters are off by that over the
    # curvature of the flattest direction; the float64 objective is at its optimum
    assert torch.allclose(x, torch.cat([ref.weight, ref.bias]), atol=1e-4, rtol=0)
    f_ours = affine_objective(m, zi, yi, x[:c], x[c:], mask)[0]
    f_ref = affine_objective(m, zi, yi, ref.weight, ref.bias, mask)[0]
    assert float(f_ref) <= float(f_ours) <= float(f_ref) + 1e-10
    nll, g, _ = fold.evaluate(torch.cat([ref.weight, ref.bias]))
    assert nll == pytest.approx(ref.nll_after, abs=1e-6)  # the float32 pass: ~1e-7
    pw, pb = R.vector_penalty_grad(ref.weight, ref.bias, lam, lam)
    assert float((g + torch.cat([pw, pb])).abs().max()) <= 1e-7  # the optimum's gradient
    assert fold.hessian_data is not None  # kept for the next strength


def test_the_hessian_from_float32_passes_is_the_exact_one_to_float32():
    c = 7
    z, y = _data(600, c, 2)
    fold = VectorFold(z, y, None)
    x = torch.cat([torch.linspace(0.3, 0.8, c), torch.linspace(-1, 1, c)]).double()
    h = fold.hessian(fold.evaluate(x)[2])
    ref = torch.autograd.functional.hessian(
        lambda v: torch.nn.functional.cross_entropy(R.vector_affine(z, v[:c], v[c:]), y), x
    )
    assert torch.allclose(h, ref, rtol=1e-5, atol=1e-7)
    assert torch.allclose(h, h.T, rtol=0, atol=1e-7)  # float32 products: not bit-symmetric


def test_the_path_equals_the_lbfgs_paths():
    """The same strengths scored, the same best, cv NLLs within 1e-6 a row."""
    c, n = 20, 1500
    z, y = _data(n, c, 3)
    zi, yi, mask = affine_inputs(z, y)

    def start(zf, yf, mf, beta, lam):
        return torch.full((c,), beta, dtype=torch.float64), torch.zeros(c, dtype=torch.float64)

    def solver(zf, yf, mf):
        fold = VectorFold(zf, yf, mf)
        return lambda x0, lam: fold.solve(x0, lam, lam, FOLD_GRAD_TOL, 500)

    path = strength_path(c / n, top=4.0)
    args = (zi, yi, mask, lambda lam: vector_map(c, lam, lam), start, path)
    ours = cross_validate_path(*args, fold_solver=solver)
    ref = cross_validate_path(*args)
    assert ours.strengths == ref.strengths and ours.best == ref.best
    assert len(ours.strengths) >= 3  # the walk went past the strong end
    for a, b in zip(ours.cv_nll, ref.cv_nll):
        assert a == pytest.approx(b, abs=1e-6)
    assert ours.temperature_cv_nll == ref.temperature_cv_nll
    assert torch.allclose(ours.start[0], ref.start[0], atol=1e-4)
