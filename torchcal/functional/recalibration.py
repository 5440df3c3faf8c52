"""The recalibration objectives: temperature, Platt, affine (vector, matrix) and PAV.

Each post-hoc calibrator of :mod:`torchcal.scaling` fits one of the objectives below; the
formulas, their gradients and Hessians live here (``docs/design.md`` section 1: a formula lives
in one function in ``functional/``), the solvers in ``torchcal/scaling/_solvers.py``. Every
function is a float64 kernel without validation (the calibrators validate their inputs).

**Temperature** (Guo et al., 2017, "On Calibration of Modern Neural Networks"). With
``beta = 1 / T`` the multiclass NLL of logits ``z`` is

    l(beta) = mean_i [ logsumexp_j(beta z_ij) - beta z_iy ]
    l'(beta) = mean_i [ E_p[z_i] - z_iy ],        l''(beta) = mean_i Var_p[z_i],

with ``p = softmax(beta z_i)``. For binary logits ``s`` and ``p = sigmoid(beta s)``:

    l(beta) = mean_i [ softplus(beta s_i) - y_i beta s_i ]
    l'(beta) = mean_i (p_i - y_i) s_i,            l''(beta) = mean_i p_i (1 - p_i) s_i^2.

``l`` is convex in ``beta``; the solvers work on ``u = log beta = -log T`` where
``dl/du = beta l'(beta)`` and ``d2l/du2 = beta l'(beta) + beta^2 l''(beta)``
(:func:`log_beta_derivatives`).

**Platt** (Platt, 1999): the mean binary cross-entropy of ``sigmoid(a s + b)`` against
(possibly smoothed) targets, convex in ``(a, b)``, with its exact 2x2 Hessian
(:func:`platt_terms`).

**Affine maps** (vector / matrix scaling; Guo et al., 2017; Kull et al., 2019): the multiclass
NLL of ``z * w + b`` or ``z @ W.T + b`` and its exact Hessian ``mean_i S_i (x) u_i u_i^T`` with
``S_i = diag(p_i) - p_i p_i^T`` (:func:`vector_nll_hessian`, :func:`matrix_nll_hessian`), plus
the L2 / ODIR penalties, their closed-form gradients (:func:`affine_residual`,
:func:`vector_nll_grad`, :func:`matrix_nll_grad`: one pass, no autograd) and the diagonals of
the Hessians (the LBFGS preconditioner of ``functional/affine.py``). Dirichlet calibration is
the same matrix (or vector) map applied to ``log_softmax(z)``.

**Isotonic**: pool-adjacent-violators (:func:`pool_adjacent_violators`) on the log-odds score
(:func:`confidence_log_odds` for the confidence reading).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from torchcal.functional.scoring import binary_nll

_LOG2E = 1.0 / math.log(2.0)
_MASK_FLOOR = -1e300  # finite stand-in for -inf masks: exp(beta * floor) == 0 exactly
# PAV: vectorised rounds before the sequential stack algorithm takes over
_MAX_ROUNDS = 64


# ----------------------------------------------------------------------------- temperature
def _binary_temperature_terms(
    logits: Tensor, target: Tensor, beta: Tensor | float, identity: bool
) -> tuple[Tensor, ...]:
    y = target.to(torch.float64)
    # -inf (masked) with target 0 -> a finite floor: every term below is then exactly 0;
    # with target 1 it stays -inf, the loss is +inf and the pass reports the position
    z = logits.to(torch.float64)
    z = torch.where(y == 0, z.clamp(min=_MASK_FLOOR), z)
    t = z * beta
    # exact softplus: torch's F.softplus switches to the identity beyond t = 20
    loss = binary_nll(t, y)
    p = torch.sigmoid(t)
    d1 = (p - y) * z
    d2 = ((p * torch.sigmoid(-t)) * z) * z  # left to right: 0 * floor, never floor**2
    out: tuple[Tensor, ...] = (loss, d1, d2)
    if identity:
        wrong = ((y == 1) & (z < 0)) | ((y == 0) & (z > 0))
        out = out + (binary_nll(z, y), wrong.to(torch.float64))
    return out


def temperature_terms(
    logits: Tensor,
    target: Tensor,
    beta: Tensor | float,
    *,
    binary: bool,
    identity: bool = False,
    state: dict | None = None,
) -> tuple[Tensor, ...]:
    """Per-sample NLL, d/dbeta and d2/dbeta2 in float64 at inverse temperature ``beta``.

    ``beta`` is a float, a float64 scalar or a per-row ``(n,)`` tensor. ``-inf`` logits are
    masks: probability 0 (multiclass) or, in the binary case with target 0, no contribution.
    With ``identity=True`` two more tensors follow: the per-sample NLL at ``beta = 1`` and a
    0/1 flag for rows whose target is not a row maximum (binary: score on the wrong side).
    ``state`` (a dict kept across the chunks of a pass) remembers that masks were seen.
    """
    if binary:
        return _binary_temperature_terms(logits, target, beta, identity)
    b = beta.unsqueeze(-1) if isinstance(beta, Tensor) and beta.dim() == 1 else beta
    m = logits.amax(dim=1).to(torch.float64)
    zy = logits.gather(1, target.unsqueeze(1)).squeeze(1).to(torch.float64)
    if logits.dtype == torch.float64:
        d = logits - m.unsqueeze(1)
    else:
        d = logits.to(torch.float64)  # a float64 copy of the chunk
        d.sub_(m.unsqueeze(1))
    scale = b * _LOG2E
    masked = state is not None and state.get("masked", False)
    for attempt in range(2):
        if masked:
            d.clamp_(min=_MASK_FLOOR)  # -inf masks -> a finite floor whose exp is exactly 0
        e = d * scale
        e.exp2_()  # exp via exp2: a serial kernel (exp_ would go to VML's threaded path)
        s0 = e.sum(1)
        e.mul_(d)
        s1 = e.sum(1)
        # a -inf mask gives 0 * -inf = NaN here: redo the chunk with the floor, and keep
        # flooring the following chunks of this pass (clean data never pays for the clamp)
        if masked or attempt == 1 or not bool(torch.isnan(s1).any()):
            break
        masked = True
        if state is not None:
            state["masked"] = True
    e.mul_(d)
    s2 = e.sum(1)
    gap = m - zy
    mean_d = s1 / s0
    loss = torch.log(s0) + beta * gap
    d1 = mean_d + gap
    d2 = (s2 / s0 - mean_d * mean_d).clamp_(min=0.0)
    if identity:
        e1 = (d * _LOG2E).exp2_()
        return loss, d1, d2, torch.log(e1.sum(1)) + gap, (gap > 0).to(torch.float64)
    return loss, d1, d2


def log_beta_derivatives(
    loss: Tensor,
    dloss: Tensor,
    d2loss: Tensor,
    u: Tensor,
    center: Tensor | None = None,
    strength: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Objective, d/du and d2/du2 at ``u = log beta`` from the NLL and its beta-derivatives
    (sums or means), plus the prior ``strength / 2 * (u - center)**2`` where given."""
    beta = torch.exp(u)
    f = loss.clone()
    g = beta * dloss
    h = g + beta * beta * d2loss
    if center is not None and strength > 0:
        diff = u - center
        f = f + 0.5 * strength * diff * diff
        g = g + strength * diff
        h = h + strength
    return f, g, h


# ----------------------------------------------------------------------------- Platt
def platt_terms(s: Tensor, t: Tensor, a: float, b: float) -> tuple[float, Tensor, Tensor]:
    """Mean cross-entropy of ``sigmoid(a s + b)`` against targets ``t`` in ``[0, 1]``, its
    gradient ``(2,)`` and Hessian ``(2, 2)`` w.r.t. ``(a, b)`` (float64 ``s``, ``t``)."""
    z = s * a + b
    p = torch.sigmoid(z)
    r = p - t
    w = p * torch.sigmoid(-z)
    g = torch.stack([(r * s).mean(), r.mean()])
    ws = w * s
    h = torch.stack([torch.stack([(ws * s).mean(), ws.mean()]), torch.stack([ws.mean(), w.mean()])])
    return float(binary_nll(z, t).mean()), g, h


# ----------------------------------------------------------------------------- affine maps
def vector_affine(z: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Vector scaling ``z * weight + bias`` (one scale and bias per class)."""
    return z * weight + bias


def matrix_affine(z: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Matrix scaling ``z @ weight.T + bias``."""
    return torch.addmm(bias, z, weight.T)


def masked_affine(out: Tensor, mask: Tensor | None) -> Tensor:
    """An affine map's output with the masked entries (``-inf`` logits) set to ``-inf``."""
    return out if mask is None else out.masked_fill(mask, float("-inf"))


def vector_penalty(
    bias: Tensor,
    bias_reg: float,
    num_classes: int,
    weight: Tensor | None = None,
    weight_reg: float = 0.0,
) -> Tensor:
    """``bias_reg / C * ||bias||^2`` plus, with ``weight``, ``weight_reg / C * ||weight -
    mean(weight)||^2`` (the spread of the per-class scales about one temperature)."""
    out = bias_reg / num_classes * (bias * bias).sum()
    if weight is None:
        return out
    d = weight - weight.mean()
    return out + weight_reg / num_classes * (d * d).sum()


def vector_penalty_grad(
    weight: Tensor, bias: Tensor, weight_reg: float, bias_reg: float
) -> tuple[Tensor, Tensor]:
    """Gradient of :func:`vector_penalty` (with ``weight``) w.r.t. ``(weight, bias)``."""
    C = bias.shape[0]
    return 2 * weight_reg / C * (weight - weight.mean()), 2 * bias_reg / C * bias


def matrix_penalty(
    weight: Tensor, bias: Tensor, off_diagonal_reg: float, bias_reg: float
) -> Tensor:
    """ODIR (Kull et al., 2019): ``off_diagonal_reg / (C (C - 1)) * sum_{i != j} W_ij^2 +
    bias_reg / C * ||bias||^2``."""
    C = weight.shape[0]
    off = weight - torch.diag(torch.diagonal(weight))
    return off_diagonal_reg / (C * (C - 1)) * (off * off).sum() + bias_reg / C * (bias * bias).sum()


def matrix_penalty_grad(
    weight: Tensor, bias: Tensor, off_diagonal_reg: float, bias_reg: float
) -> tuple[Tensor, Tensor]:
    """Gradient of :func:`matrix_penalty` w.r.t. ``(weight, bias)``."""
    C = weight.shape[0]
    off = weight - torch.diag(torch.diagonal(weight))
    return 2 * off_diagonal_reg / (C * (C - 1)) * off, 2 * bias_reg / C * bias


def affine_residual(out: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """``(mean NLL, R)`` of calibrated logits ``out`` (``-inf`` at masks) with
    ``R = (softmax(out) - onehot(target)) / N``, the NLL's gradient w.r.t. ``out``."""
    n = out.shape[0]
    top = out.amax(1, keepdim=True)
    e = (out - top).exp_()
    s = e.sum(1)
    nll = (
        torch.log(s).sum() + (top.squeeze(1) - out.gather(1, target.unsqueeze(1)).squeeze(1)).sum()
    ) / n
    r = e.div_(s.unsqueeze(1))
    r[torch.arange(n, device=out.device), target] -= 1.0
    return nll, r.div_(n)


def vector_nll_grad(z: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """Gradient of the mean NLL of vector scaling w.r.t. ``(weight, bias)`` from the logits
    ``z`` (0 at masked entries) and :func:`affine_residual`'s ``R``."""
    return (r * z).sum(0), r.sum(0)


def matrix_nll_grad(z: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """Gradient of the mean NLL of matrix scaling w.r.t. ``(weight, bias)`` (``R.T @ z``,
    ``R.sum(0)``; inputs as in :func:`vector_nll_grad`)."""
    return r.T @ z, r.sum(0)


def vector_nll_hessian_diag(z: Tensor, p: Tensor) -> Tensor:
    """Diagonal of :func:`vector_nll_hessian` (``mean p (1 - p) z^2``, ``mean p (1 - p)``)."""
    q = p * (1 - p)
    return torch.cat([(q * z * z).mean(0), q.mean(0)])


def matrix_nll_hessian_diag(z: Tensor, p: Tensor) -> Tensor:
    """Diagonal of :func:`matrix_nll_hessian` in the order ``cat(weight.flatten(), bias)``."""
    q = p * (1 - p)
    return torch.cat([(q.T @ (z * z)).flatten() / z.shape[0], q.mean(0)])


def vector_nll_hessian(z: Tensor, p: Tensor, zp: Tensor | None = None) -> Tensor:
    """Exact Hessian (float64) of the mean NLL of vector scaling w.r.t. ``cat(weight,
    bias)``, from the logits ``z`` (0 at masked entries) and the fitted probabilities ``p`` (0
    there); ``zp = z * p`` where already computed. Float32 inputs: float32 products, float64
    assembly (the fold fits of ``functional/vector_folds.py``)."""
    # a_ic = w_c z_ic + b_c; S_i = diag(p_i) - p_i p_i^T; in C x C blocks:
    # H_ww = diag(sum z^2 p) - (zp)^T zp, H_wb = diag(sum zp) - (zp)^T p, H_bb = diag(sum p)
    # - p^T p, all over N (three C x C products, no N x 2C x 2C one)
    zp = p * z if zp is None else zp
    n, C = z.shape
    h = torch.empty(2 * C, 2 * C, dtype=torch.float64, device=z.device)
    h[:C, :C] = (zp.T @ zp).neg_()
    h[:C, C:] = (zp.T @ p).neg_()
    h[C:, C:] = (p.T @ p).neg_()
    idx = torch.arange(C, device=z.device)
    h[idx, idx] += (zp * z).sum(0).to(torch.float64)
    h[idx, idx + C] += zp.sum(0).to(torch.float64)
    h[idx + C, idx + C] += p.sum(0).to(torch.float64)
    h[C:, :C] = h[:C, C:].T
    return h.div_(n)


def vector_penalty_hessian(
    num_classes: int, weight_reg: float, bias_reg: float, device: torch.device | None = None
) -> Tensor:
    """The (constant) Hessian of :func:`vector_penalty` w.r.t. ``cat(weight, bias)``:
    ``2 weight_reg / C (I - 11^T / C)`` on the scales, ``2 bias_reg / C I`` on the biases."""
    C = num_classes
    eye = torch.eye(C, dtype=torch.float64, device=device)
    out = torch.zeros(2 * C, 2 * C, dtype=torch.float64, device=device)
    out[:C, :C] = 2 * weight_reg / C * (eye - 1.0 / C)
    out[C:, C:] = 2 * bias_reg / C * eye
    return out


def matrix_nll_hessian(z: Tensor, p: Tensor) -> Tensor:
    """Exact Hessian of the mean NLL of matrix scaling w.r.t. ``cat(weight.flatten(), bias)``
    (``z`` and ``p`` as in :func:`vector_nll_hessian`)."""
    # a_i = A u_i with A = [W | b], u_i = (z_i, 1); S_i = diag(p_i) - p_i p_i^T:
    # H[(c, k), (d, l)] = mean_i S_i[c, d] u_i[k] u_i[l]
    n, C = z.shape
    u = torch.cat([z, torch.ones(n, 1, dtype=z.dtype, device=z.device)], dim=1)  # (N, K)
    uu = torch.einsum("ik,il->ikl", u, u)  # (N, K, K)
    h = -torch.einsum("ic,id,ikl->ckdl", p, p, uu)
    h[torch.arange(C), :, torch.arange(C), :] += torch.einsum("ic,ikl->ckl", p, uu)
    h = h / n
    K = C + 1
    # reorder A's entries (c, k) into the parameter vector cat(W.flatten(), b)
    order = torch.empty(C * K, dtype=torch.long)
    ck = torch.arange(C * K)
    c, k = ck // K, ck % K
    order[ck] = torch.where(k < C, c * C + k, C * C + c)
    h = h.reshape(C * K, C * K)
    out = torch.empty_like(h)
    out[order.unsqueeze(1), order.unsqueeze(0)] = h
    return out


# ----------------------------------------------------------------------------- isotonic
def _sequential_pav(s: Tensor, c: Tensor, n: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Stack PAV over blocks (sum, weight, length); the fallback for adversarial orders."""
    ss, cc, nn_ = s.tolist(), c.tolist(), n.tolist()
    out_s: list[float] = []
    out_c: list[float] = []
    out_n: list[int] = []
    for si, ci, ni in zip(ss, cc, nn_):
        out_s.append(si)
        out_c.append(ci)
        out_n.append(ni)
        while len(out_s) > 1 and out_s[-2] / out_c[-2] >= out_s[-1] / out_c[-1]:
            s_last, c_last, n_last = out_s.pop(), out_c.pop(), out_n.pop()
            out_s[-1] += s_last
            out_c[-1] += c_last
            out_n[-1] += n_last
    return (
        torch.tensor(out_s, dtype=torch.float64),
        torch.tensor(out_c, dtype=torch.float64),
        torch.tensor(out_n, dtype=torch.long),
    )


def pool_adjacent_violators(y_sum: Tensor, weight: Tensor) -> tuple[Tensor, int]:
    """Non-decreasing least-squares fit of the means ``y_sum / weight`` (weighted), float64.

    Vectorised PAV: each round pools every maximal run of adjacent blocks whose means decrease
    (such blocks share one value in the solution); a few rounds suffice on calibration data,
    and after 64 rounds the remaining blocks finish with the sequential stack algorithm.
    Returns the fitted value per input point and the number of rounds.
    """
    s, c = y_sum.to(torch.float64), weight.to(torch.float64)
    n = torch.ones_like(s, dtype=torch.long)
    rounds = 0
    while s.numel() > 1:
        m = s / c
        viol = m[:-1] >= m[1:]
        if not bool(viol.any()):
            break
        if rounds >= _MAX_ROUNDS:
            s, c, n = _sequential_pav(s, c, n)
            break
        start = torch.ones_like(m, dtype=torch.bool)
        start[1:] = ~viol
        gid = torch.cumsum(start, 0) - 1
        k = int(gid[-1]) + 1
        s = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, s)
        c = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, c)
        n = torch.zeros(k, dtype=torch.long).index_add_(0, gid, n)
        rounds += 1
    return torch.repeat_interleave(s / c, n), rounds


def confidence_log_odds(logits: Tensor) -> tuple[Tensor, Tensor]:
    """``(x, top)``: the log-odds ``x = -logsumexp_{j != top}(z_j - z_top)`` of the max-softmax
    confidence in float64 (no saturation where the probability rounds to 1) and the argmax.
    ``-inf`` (masked) logits are allowed; an entirely masked row raises ``ValueError``."""
    z = logits.to(torch.float64)
    top = z.argmax(1)
    zmax = z.gather(1, top.unsqueeze(1))
    if bool(torch.isneginf(zmax).any()):
        raise ValueError("logits: a row is entirely masked (-inf)")
    rest = (z - zmax).scatter(1, top.unsqueeze(1), float("-inf"))
    return -torch.logsumexp(rest, dim=1), top
