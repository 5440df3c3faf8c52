"""Structured matrix scaling's fit (docs/design.md section 4, "Structured scaling"): one
temperature plus a per-class scale, a per-class bias and a low-rank correction, regularised
toward the temperature map with a strength chosen on held-out folds.

The map, on the log-probabilities ``x = log_softmax(z / T0)`` of a fitted temperature ``T0``::

    out = x * scale + bias + (x @ basis) @ coef.T

``basis`` ``(C, r)`` holds the top ``r`` right singular vectors of the fitting rows' ``x``
(orthonormal; the identity when ``r = C``, i.e. the full matrix of SMS), ``coef`` ``(C, r)``
the correction in that subspace. ``scale = a + d`` where ``a`` (one unpenalised factor:
a temperature refitted on top of ``T0``) and ``d`` are fitted jointly. The penalty is the
structured ridge of Berta et al. (2026, "Structured matrix scaling for multi-class
calibration"; ``probmetrics``' SMS), with ``n`` fitting rows and a multiplier ``lam``::

    lam * (C / n) * (|d|^2 + |bias|^2) + lam * (C (C - 1) / n) * |coef|^2

(``lam = 1`` is SMS's default strength). A ridge solution's rows lie in the span of the
feature rows, so restricting the correction to their top singular directions loses only what
the ridge shrinks most (the cost falls from ``n C^2`` to ``n C r`` a pass).

The fit is full-batch LBFGS on a diagonally preconditioned parameter vector (the Hessian's
diagonal at the temperature map); the passes over the data run in float32 (sums, parameters
and the result in float64), which keeps the NLL to ~1e-7, far below the folds' noise.
``lam="cv"``: :func:`choose_strength` scores strengths ``4^k`` on the shared folds
(:func:`~torchcal.functional.folds.kfold_indices`), walking from ``lam = 1`` toward the better
neighbour until the held-out NLL rises; the guard compares the best against the temperature
map on the same folds. Above :func:`cv_row_limit` rows (``n C > 2^21`` and ``n > 2,000``),
the strength, the guard and ``T0`` come from a seeded subsample of that many rows
(:func:`cv_subsample`) and only the refit runs on all rows: the ridge is ``lam C`` on the
summed NLL, a prior whose best ``lam`` does not depend on ``n`` to first order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional.folds import fold_complement, kfold_indices
from torchcal.functional.temperature.fit import fit_temperature

_WORK = torch.float32  # dtype of the passes over the data
#: entries of a block of rows in a pass (1M float32: 4 MB, cache-sized; one reused buffer, so
#: a pass allocates no ``(n, C)`` tensors: at 25,000 x 1,000 a gradient pass took 0.37 s
#: unblocked, 0.07 s blocked)
_BLOCK_ENTRIES = 1 << 20
_CHANGE_TOL = 1e-9  # an objective change below this is float32 noise (n >= 1 rows of ~1e-7)
FOLD_TOL_FACTOR = 30  # the fold fits' gradient tolerance: this times the refit's
#: ``reg="cv"`` scores the strengths on at most ``max(CV_MIN_ROWS, CV_ENTRIES // C)`` rows (a
#: seeded subsample above: design 4): 5,000 x 100 and smaller fits are unchanged; at C = 1,000
#: 2,000 rows (folds of 400 held-out rows) picked the strength all 25,000 rows picked
CV_ENTRIES = 1 << 21
CV_MIN_ROWS = 2_000


class StructuredParams(NamedTuple):
    """The fitted parameters (float64): ``a`` (a scalar tensor), ``d``, ``bias`` ``(C,)``,
    ``coef`` ``(C, r)``."""

    a: Tensor
    d: Tensor
    bias: Tensor
    coef: Tensor

    @staticmethod
    def zero(num_classes: int, rank: int, device: torch.device) -> StructuredParams:
        """The temperature map itself: ``a = 1``, the rest 0."""
        z = torch.zeros(num_classes, dtype=torch.float64, device=device)
        return StructuredParams(
            torch.ones((), dtype=torch.float64, device=device),
            z,
            z.clone(),
            torch.zeros(num_classes, rank, dtype=torch.float64, device=device),
        )

    def flat(self) -> Tensor:
        return torch.cat([self.a.reshape(1), self.d, self.bias, self.coef.flatten()])

    @staticmethod
    def of(x: Tensor, num_classes: int) -> StructuredParams:
        c = num_classes
        return StructuredParams(
            x[0], x[1 : 1 + c], x[1 + c : 1 + 2 * c], x[1 + 2 * c :].view(c, -1)
        )


def structured_features(logits: Tensor, temperature: float) -> tuple[Tensor, Tensor | None]:
    """``(x, mask)``: float32 ``log_softmax(logits / temperature)`` with 0 at the ``-inf``
    (masked) entries, and the mask (``None`` when nothing is masked)."""
    z = logits.detach().to(_WORK)
    mask = torch.isneginf(z)
    x = torch.log_softmax(z / temperature, dim=1)
    if not bool(mask.any()):
        return x, None
    return x.masked_fill(mask, 0.0), mask


def structured_basis(x: Tensor, rank: int, seed: int = 0) -> Tensor:
    """The top ``rank`` right singular vectors ``(C, rank)`` (float64, orthonormal) of ``x``
    ``(n, C)``: the identity when ``rank = C``, else a seeded subspace iteration (two power
    steps, 8 extra columns) -- the same basis for the same rows and seed."""
    c = x.shape[1]
    if rank >= c:
        return torch.eye(c, dtype=torch.float64, device=x.device)
    g = torch.Generator().manual_seed(seed)
    q = min(c, rank + 8)
    omega = torch.randn(c, q, generator=g, dtype=x.dtype).to(x.device)
    y = torch.linalg.qr(x @ omega).Q
    for _ in range(2):
        y = torch.linalg.qr(x @ torch.linalg.qr(x.T @ y).Q).Q
    small = (y.T @ x).double()  # (q, C): x's rows projected on the subspace
    vh = torch.linalg.svd(small, full_matrices=False).Vh
    return vh[:rank].T.contiguous()


def structured_logits(
    x: Tensor, scale: Tensor, bias: Tensor, basis: Tensor, coef: Tensor, mask: Tensor | None
) -> Tensor:
    """The map's output on features ``x`` (in ``x``'s dtype; ``-inf`` where masked)."""
    dt = x.dtype
    out = torch.addmm(x * scale.to(dt) + bias.to(dt), x @ basis.to(dt), coef.to(dt).T)
    return out if mask is None else out.masked_fill(mask, float("-inf"))


@dataclass
class StructuredProblem:
    """The penalised mean NLL of the map on fixed features (rows ``x``, labels ``y``,
    ``xb = x @ basis``); ``passes`` counts the passes over the data."""

    x: Tensor
    y: Tensor
    xb: Tensor
    mask: Tensor | None
    passes: int = 0

    def __post_init__(self) -> None:
        n, c = self.x.shape
        self._block = max(1, min(n, _BLOCK_ENTRIES // c))
        self._ar = torch.arange(self._block, device=self.x.device)

    @staticmethod
    def of(x: Tensor, y: Tensor, basis: Tensor, mask: Tensor | None) -> StructuredProblem:
        return StructuredProblem(x, y, x @ basis.to(x.dtype), mask)

    def rows(self, index: Tensor) -> StructuredProblem:
        m = None if self.mask is None else self.mask[index]
        return StructuredProblem(self.x[index], self.y[index], self.xb[index], m)

    def _blocks(self, p: StructuredParams) -> Iterator[tuple[slice, Tensor, Tensor, Tensor]]:
        """Per block of rows: ``(rows, e, nll, total)``: ``e = exp(out - rowmax)`` in one
        reused buffer (a block of ~``_BLOCK_ENTRIES`` entries stays in cache), the rows'
        NLL ``(m,)`` and ``total = e.sum(1)``."""
        n, c = self.x.shape
        dt = self.x.dtype
        scale, bias, coef_t = (p.a + p.d).to(dt), p.bias.to(dt), p.coef.to(dt).T
        buf = torch.empty(self._block, c, dtype=dt, device=self.x.device)
        for s in range(0, n, self._block):
            rows = slice(s, min(n, s + self._block))
            o = buf[: rows.stop - s]
            torch.addcmul(bias, self.x[rows], scale, out=o)
            if coef_t.shape[0]:
                o.addmm_(self.xb[rows], coef_t)
            if self.mask is not None:
                o.masked_fill_(self.mask[rows], float("-inf"))
            o.sub_(o.amax(1, keepdim=True))
            at_y = o.gather(1, self.y[rows, None]).squeeze(1)
            o.exp_()
            total = o.sum(1)
            yield rows, o, torch.log(total) - at_y, total

    def nll(self, p: StructuredParams) -> float:
        """Mean NLL (no penalty)."""
        self.passes += 1
        f = math.fsum(float(lse.sum(dtype=torch.float64)) for _, _, lse, _ in self._blocks(p))
        return f / self.x.shape[0]

    def nll_grad(self, p: StructuredParams) -> tuple[float, StructuredParams]:
        """Mean NLL and its gradient (float64) w.r.t. every block."""
        self.passes += 1
        n, c = self.x.shape
        f = 0.0
        gx = torch.zeros(c, dtype=torch.float64, device=self.x.device)
        gb, gc = gx.clone(), torch.zeros(c, self.xb.shape[1], dtype=torch.float64, device=gx.device)
        prod = torch.empty(self._block, c, dtype=self.x.dtype, device=self.x.device)
        for rows, e, lse, total in self._blocks(p):
            f += float(lse.sum(dtype=torch.float64))
            g = e.div_(total[:, None])  # softmax
            g[self._ar[: g.shape[0]], self.y[rows]] -= 1.0
            gx += torch.mul(g, self.x[rows], out=prod[: g.shape[0]]).sum(0).double()
            gb += g.sum(0).double()
            gc += (g.T @ self.xb[rows]).double()
        return f / n, StructuredParams(gx.sum() / n, gx / n, gb / n, gc / n)

    def curvature(self, rows: int = 1024) -> tuple[float, Tensor]:
        """The mean NLL's Hessian at the temperature map, estimated on (at most) the first
        ``rows`` rows: its ``a`` entry and the per-class blocks ``(C, r + 2, r + 2)`` over
        ``(d_c, bias_c, coef_c)`` (cross-class terms left out: a preconditioner)."""
        self.passes += 1
        x, xb = self.x[:rows].double(), self.xb[:rows].double()
        o = x if self.mask is None else x.masked_fill(self.mask[:rows], float("-inf"))
        s = torch.softmax(o, 1)
        w = s * (1 - s)
        m = x.shape[0]
        s_x = (s * x).sum(1)
        h_a = float(((s * x * x).sum(1) - s_x * s_x).sum()) / m
        c, r = x.shape[1], xb.shape[1]
        h = torch.empty(c, r + 2, r + 2, dtype=torch.float64, device=x.device)
        wx = w * x
        h[:, 0, 0] = (wx * x).sum(0)
        h[:, 0, 1] = h[:, 1, 0] = wx.sum(0)
        h[:, 1, 1] = w.sum(0)
        h[:, 0, 2:] = h[:, 2:, 0] = wx.T @ xb
        h[:, 1, 2:] = h[:, 2:, 1] = w.T @ xb
        h[:, 2:, 2:] = torch.einsum("ic,ij,ik->cjk", w, xb, xb)
        return h_a, h / m


def _weights(num_classes: int, n: int, lam: float) -> tuple[float, float]:
    """The ridge weights ``(on d and bias, on coef)`` of strength ``lam`` at ``n`` rows."""
    c = num_classes
    return lam * c / n, lam * c * (c - 1) / n


class FitInfo(NamedTuple):
    params: StructuredParams
    objective: float
    grad_norm: float
    iterations: int
    evaluations: int


def _blocks(p: StructuredParams) -> Tensor:
    """``(C, r + 2)``: each class's ``(d_c, bias_c, coef_c)``."""
    return torch.cat([p.d[:, None], p.bias[:, None], p.coef], dim=1)


def _unblock(a: Tensor, blocks: Tensor) -> StructuredParams:
    return StructuredParams(a, blocks[:, 0], blocks[:, 1], blocks[:, 2:])


def fit_structured(
    prob: StructuredProblem,
    lam: float,
    start: StructuredParams,
    *,
    curvature: tuple[float, Tensor],
    temperature_only: bool = False,
    grad_tol: float = 1e-6,
    max_iter: int = 200,
) -> FitInfo:
    """Minimise the penalised mean NLL at strength ``lam`` from ``start`` by LBFGS on the
    parameters preconditioned by ``curvature`` (:meth:`StructuredProblem.curvature`) plus
    the ridge's: ``v_c = L_c^T theta_c`` per class with ``L_c L_c^T`` the block;
    ``grad_tol`` is on the gradient in ``v``. ``temperature_only``: only ``a`` moves (the
    temperature map refitted on these rows, the guard's reference)."""
    n, c = prob.x.shape
    w_db, w_c = _weights(c, n, lam)
    h_a, h = curvature
    r2 = h.shape[1]
    ridge = torch.full((r2,), 2 * w_c, dtype=torch.float64, device=h.device)
    ridge[:2] = 2 * w_db
    chol = torch.linalg.cholesky(
        h + torch.diag(ridge).clamp_min(0) + 1e-10 * torch.eye(r2, dtype=h.dtype, device=h.device)
    )
    sa = math.sqrt(max(h_a, 1e-12))
    pen = ridge / 2

    def theta(v: Tensor) -> StructuredParams:
        if temperature_only:
            return start._replace(a=v[0] / sa)
        vb = v[1:].view(c, r2, 1)
        blocks = torch.linalg.solve_triangular(chol.mT, vb, upper=True).squeeze(2)
        return _unblock(v[0] / sa, blocks - blocks.mean(0))

    def evaluate(v: Tensor) -> tuple[Tensor, Tensor]:
        p = theta(v)
        f, g = prob.nll_grad(p)
        b = _blocks(p)
        f += float((pen * b * b).sum())
        if temperature_only:
            return torch.tensor(f, dtype=torch.float64), (g.a / sa).reshape(1)
        gb = _blocks(g) + 2 * pen * b
        gb = (gb - gb.mean(0))[:, :, None]
        gv = torch.linalg.solve_triangular(chol, gb, upper=False).squeeze(2)
        return torch.tensor(f, dtype=torch.float64), torch.cat(
            [(g.a / sa).reshape(1), gv.flatten()]
        )

    v0 = (start.a * sa).reshape(1)
    if not temperature_only:
        vb = (chol.mT @ _blocks(start)[:, :, None]).squeeze(2)
        v0 = torch.cat([v0, vb.flatten()])
    v, iterations, evaluations = _lbfgs(evaluate, v0, grad_tol, max_iter)
    f, g = evaluate(v)
    return FitInfo(theta(v), float(f), float(g.abs().max()), iterations, evaluations)


def _lbfgs(
    evaluate: Callable[[Tensor], tuple[Tensor, Tensor]], v0: Tensor, grad_tol: float, max_iter: int
) -> tuple[Tensor, int, int]:
    """``torch.optim.LBFGS`` (strong Wolfe) from ``v0`` until the max-abs gradient is below
    ``grad_tol``, or the objective stops changing at float32 resolution (the passes' noise
    floor), or ``max_iter`` iterations."""
    vp = v0.detach().clone().requires_grad_(True)
    opt = torch.optim.LBFGS(
        [vp],
        lr=1.0,
        max_iter=max_iter,
        max_eval=2 * max_iter,
        tolerance_grad=grad_tol,
        tolerance_change=_CHANGE_TOL,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> Tensor:
        f, g = evaluate(vp.detach())
        vp.grad = g
        return f

    with torch.enable_grad():
        opt.step(closure)
    state = opt.state[vp]
    return vp.detach(), int(state.get("n_iter", 0)), int(state.get("func_evals", 0))


class StrengthChoice(NamedTuple):
    """What :func:`choose_strength` scored (the fields of
    :class:`~torchcal.scaling.CVFit`): the strengths, strongest first, their
    cross-validated NLLs (held-out NLL summed over the folds, per row) and per-fold mean
    held-out NLLs, the same for the temperature map, the best strength, and the mean of its
    fold solutions (a warm start for the refit)."""

    strengths: tuple[float, ...]
    cv_nll: tuple[float, ...]
    fold_nll: tuple[tuple[float, ...], ...]
    temperature_cv_nll: float
    temperature_fold_nll: tuple[float, ...]
    best: float
    start: StructuredParams
    passes: int


class _Fold(NamedTuple):
    fit: StructuredProblem
    test: StructuredProblem
    curv: tuple[float, Tensor]
    ts: StructuredParams  # the temperature map refitted on the fit rows
    ts_nll: float  # its held-out NLL


def choose_strength(
    prob: StructuredProblem,
    *,
    folds: int,
    seed: int,
    grad_tol: float,
    max_iter: int,
    max_steps: int = 4,
) -> StrengthChoice:
    """Cross-validate the strength on ``folds`` seeded, shuffled folds: ``lam = 1``, then
    ``1/4`` (and ``4`` only where ``1/4`` is not better), then further by factors of 4 toward
    the better side while the held-out NLL falls (at most ``max_steps`` each way); the
    temperature map is fitted and scored on the same folds."""
    n, c = prob.x.shape
    zero = StructuredParams.zero(c, prob.xb.shape[1], prob.x.device)
    parts = []
    for held in kfold_indices(n, folds, seed):
        fit_rows, test_rows = prob.rows(fold_complement(n, held)), prob.rows(held)
        curv = fit_rows.curvature()
        ts = fit_structured(
            fit_rows, 1.0, zero, curvature=curv, temperature_only=True, grad_tol=grad_tol
        )
        parts.append(_Fold(fit_rows, test_rows, curv, ts.params, test_rows.nll(ts.params)))
    cv_ts = sum(p.test.x.shape[0] * p.ts_nll for p in parts) / n
    scored: dict[int, tuple[float, list[StructuredParams], tuple[float, ...]]] = {}

    def score(k: int, warm: int | None) -> float:
        total, sols, per_fold = 0.0, [], []
        for i, part in enumerate(parts):
            start = part.ts if warm is None else scored[warm][1][i]
            sol = fit_structured(
                part.fit,
                4.0**k,
                start,
                curvature=part.curv,
                grad_tol=FOLD_TOL_FACTOR * grad_tol,
                max_iter=max_iter,
            )
            per_fold.append(part.test.nll(sol.params))
            total += per_fold[-1] * part.test.x.shape[0]
            sols.append(sol.params)
        scored[k] = (total / n, sols, tuple(per_fold))
        return total / n

    # the held-out NLL is unimodal in log lam in practice: a weaker neighbour that improves
    # on lam = 1 settles the direction (the stronger one is not scored)
    at_one = score(0, None)
    step = -1 if score(-1, 0) < at_one else 1
    if step == 1:
        score(1, 0)
    k = step
    while abs(k) < max_steps and scored[k][0] < scored[k - step][0]:
        score(k + step, k)
        k += step
    ks = sorted(scored, reverse=True)  # strongest first
    best = min(ks, key=lambda j: scored[j][0])
    sols = scored[best][1]
    mean = StructuredParams(*(torch.stack([s[i] for s in sols]).mean(0) for i in range(4)))
    passes = sum(p.fit.passes + p.test.passes for p in parts)
    return StrengthChoice(
        tuple(4.0**j for j in ks),
        tuple(scored[j][0] for j in ks),
        tuple(scored[j][2] for j in ks),
        cv_ts,
        tuple(p.ts_nll for p in parts),
        4.0**best,
        mean,
        passes,
    )


def cv_row_limit(num_classes: int, cv_rows: int | None) -> int:
    """The most rows the strength is chosen on: ``cv_rows``, or by default
    ``max(CV_MIN_ROWS, CV_ENTRIES // C)`` (2,097 rows at C = 1,000, 20,971 at C = 100)."""
    if cv_rows is not None:
        return cv_rows
    return max(CV_MIN_ROWS, CV_ENTRIES // num_classes)


def cv_subsample(n: int, num_classes: int, cv_rows: int | None, seed: int) -> Tensor | None:
    """The rows (sorted int64) the strength is chosen on: ``None`` (all) when ``n`` is at
    most :func:`cv_row_limit`, else that many rows drawn without replacement by a generator
    seeded with ``seed``."""
    m = cv_row_limit(num_classes, cv_rows)
    if n <= m:
        return None
    g = torch.Generator().manual_seed(seed % (2**63))
    return torch.sort(torch.randperm(n, generator=g)[:m]).values


class StructuredSolution(NamedTuple):
    """What :func:`fit_structured_map` found (the scaler stores the map and issues
    ``messages``)."""

    temperature: float  # T0 of the features log_softmax(z / T0)
    scale: Tensor  # (C,) float64: a + d
    bias: Tensor  # (C,)
    basis: Tensor  # (C, r)
    coef: Tensor  # (C, r)
    strength: float  # the ridge multiplier used (chosen on folds, or given)
    fell_back: bool  # the guard returned the temperature map
    choice: StrengthChoice | None  # the cross-validation (None for a given strength)
    nll_before: float  # mean NLL of the raw logits
    nll_after: float  # mean NLL of the returned map (fitting rows)
    grad_norm: float  # max-abs preconditioned gradient at the returned map
    iterations: int
    passes: int
    messages: tuple[str, ...]


def fit_structured_map(
    logits: Tensor,
    target: Tensor,
    *,
    rank: int,
    reg: float | str = "cv",
    folds: int = 5,
    seed: int = 0,
    grad_tol: float = 1e-4,
    max_iter: int = 200,
    cv_rows: int | None = None,
) -> StructuredSolution:
    """Fit the structured map on multiclass ``logits`` ``(N, C)`` (``-inf`` masks allowed,
    never on the target class) and class indices ``target``: a temperature ``T0`` (the
    unpenalised factor on ``log_softmax(z)``), the basis of rank ``min(rank, C)`` on
    ``log_softmax(z / T0)``, then the map at strength ``reg`` (a number) or at the strength
    chosen on ``folds`` folds (``"cv"``), with the guard: if the chosen map's held-out NLL
    is not below the temperature map's, the temperature map is returned (``fell_back``).
    ``cv_rows``: the most rows the strength is chosen on (:func:`cv_row_limit`; above it,
    :func:`cv_subsample`'s rows, ``T0`` fitted on them and the refit started from the
    temperature map).

    Example:
        >>> import torch
        >>> from torchcal.functional.structured import fit_structured_map
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(2000, 5, generator=g)
        >>> y = torch.multinomial(torch.softmax(z / 2 + torch.tensor([1.0, 0, 0, 0, -1]), 1), 1,
        ...                       generator=g).squeeze(1)
        >>> sol = fit_structured_map(z, y, rank=5, reg=1.0)  # reg="cv": chosen on folds
        >>> sol.temperature > 1.5, sol.choice is None, sol.nll_after < sol.nll_before
        (True, True, True)
    """
    n, c = logits.shape
    y = target.detach().to(device=logits.device, dtype=torch.long)
    x1, mask = structured_features(logits, 1.0)
    raw = StructuredProblem.of(x1, y, torch.zeros(c, 0, dtype=torch.float64), mask)
    nll_before = raw.nll(StructuredParams.zero(c, 0, logits.device))
    rows = cv_subsample(n, c, cv_rows, seed) if reg == "cv" else None
    rows = None if rows is None else rows.to(logits.device)
    # T0 by TemperatureScaler's fit (bounded, T0 > 0: an unbounded inverse temperature went
    # <= 0 where the logits carry no signal, and log T0 failed); on the strength's subsample
    # when there is one: T0 only scales the features, the unpenalised ``a`` refits it
    on = (logits, y) if rows is None else (logits[rows], y[rows])
    t0 = math.exp(fit_temperature(*on).log_temperature)
    x, _ = structured_features(logits, t0)
    basis = structured_basis(x, min(rank, c), seed)
    prob = StructuredProblem.of(x, y, basis, mask)
    zero = StructuredParams.zero(c, basis.shape[1], logits.device)
    choice = None
    strength, start = (math.nan if reg == "cv" else float(reg)), zero
    if reg == "cv":
        cv_prob = prob if rows is None else prob.rows(rows)
        choice = choose_strength(
            cv_prob, folds=folds, seed=seed, grad_tol=grad_tol, max_iter=max_iter
        )
        # a subsample's fold solutions are too noisy to start all rows from (25,000 x 1,000
        # from 2,000 rows: 83 passes from their mean, 64 from the temperature map)
        strength, start = choice.best, (choice.start if rows is None else zero)
    messages: list[str] = []
    fell_back = choice is not None and min(choice.cv_nll) >= choice.temperature_cv_nll
    if fell_back:
        assert choice is not None
        exact = fit_temperature(logits, y)  # TemperatureScaler's fit: the same T
        t0 = math.exp(exact.log_temperature)
        x, _ = structured_features(logits, t0)
        prob = StructuredProblem.of(x, y, basis, mask)
        sol = FitInfo(zero, math.nan, exact.grad_norm, exact.iterations, exact.passes)
        messages.append(
            f"StructuredScaler: the cross-validated NLL of the map ({min(choice.cv_nll):.6g}, "
            f"strength {choice.best:.3g}) is not below one temperature's "
            f"({choice.temperature_cv_nll:.6g}) on {folds} folds: fitted the temperature map "
            f"instead (T = {t0:.6g}); TemperatureScaler is the better map here"
        )
    else:
        sol = fit_structured(
            prob, strength, start, curvature=prob.curvature(), grad_tol=grad_tol, max_iter=max_iter
        )
        if sol.grad_norm > grad_tol and sol.iterations >= max_iter:
            messages.append(
                f"StructuredScaler: LBFGS stopped after {max_iter} iterations before the "
                f"tolerance was met (|grad| = {sol.grad_norm:.3g})"
            )
    p = sol.params
    passes = raw.passes + prob.passes + (choice.passes if choice is not None else 0)
    return StructuredSolution(
        t0,
        p.a + p.d,
        p.bias,
        basis,
        p.coef,
        strength,
        fell_back,
        choice,
        nll_before,
        prob.nll(p),
        sol.grad_norm,
        sol.iterations,
        passes,
        tuple(messages),
    )
