r"""Conformal prediction for classes: the exact finite-sample rank, LAC / APS / RAPS / top-k
scores and sets, group- and class-conditional thresholds, and conformal risk control.

**The rank.** With ``n`` calibration scores and miscoverage ``alpha``, the threshold is the
``k``-th smallest score, ``k = ceil((n + 1)(1 - alpha))`` (Vovk et al. 2005; Lei et al. 2018),
computed in integers from ``alpha`` read as an exact fraction (:mod:`torchcal.functional._levels`,
docs/design.md section 6e): the simplest fraction that rounds to the given float in its own
precision (``0.7`` is ``7/10``, ``1/3`` is ``1/3``, ``np.float32(0.1)`` is ``1/10``, ``1e-10``
is ``1/10^10``), or ``1 - c`` where the float is ``1 - c`` of a float ``c`` read so (``1 -
0.8`` is ``1/5``, not ``0.19999999999999996``); ``confidence=c`` (every entry point takes it
instead of ``alpha``) is ``alpha = 1 - c`` exactly. A :class:`~fractions.Fraction` or
:class:`~decimal.Decimal` is taken as it is. ``(n + 1)(1 - alpha)`` in floating point puts
``k`` one order statistic too high in some cells (MAPIE, TorchCP at ``alpha = 1/3`` and
``0.7``, crepes); a denominator cap (``limit_denominator``) turns ``1 - 1e-10`` into ``1`` and
``k`` into 0. Here ``1 <= k <= n + 1`` always, and ``k = n + 1`` (``k > n``: fewer than ``1 /
alpha - 1`` points) means an infinite threshold.

**The guarantee.** For exchangeable calibration and test points, ``P(score_test <= q_k) >= k /
(n + 1) >= 1 - alpha``, and, without ties among the scores, ``= k / (n + 1) < 1 - alpha + 1 /
(n + 1)`` (marginal over the calibration draw and the test point). Per group (Mondrian, Vovk et
al. 2005: one threshold per group from that group's scores) it holds within each group with
that group's ``n``; with the true class as the group (class-conditional) it holds per class.

**Scores** (``conformal_score_matrix``: the score of every label, ``(B, C)``; lower = more
conforming; the set is ``{j : score(x, j) <= q}``), with ``p`` the softmax of ``logits / T`` or,
with ``input="probs"``, the probabilities as given (validated rows, never renormalised):

- ``"lac"`` (least ambiguous set-valued classifier, Sadinle et al. 2019): ``1 - p_j``.
- ``"aps"`` (Romano, Sesia & Candes 2020): the mass ranked above ``j`` plus ``u p_j`` with ``u
  ~ U(0, 1)`` one per row (``randomized=True``, exact coverage, may return the empty set) or
  plus ``p_j`` (``randomized=False``, conservative). The mass is capped at 1, its exact bound
  (a float cumulative sum passes it by up to ~4e-16), so a threshold of 1 admits every label,
  as the RAPS authors' code special-cases ``tau == 1``.
- ``"raps"`` (Angelopoulos et al. 2021): APS plus ``lam * max(0, rank_j - k_reg)`` (rank
  1-based), which stops the long tail of an over-confident model.
- ``"topk"``: the label's rank (1-based); the set is the top ``q`` labels.

**The non-randomised set rule.** Non-randomised APS / RAPS sets hold every label up to and
including the one whose cumulative mass first reaches ``q`` (``include_last=True``, the default:
Romano et al.'s published rule, MAPIE's ``include_last_label=True``, the RAPS authors'
``(cumsum <= tau).sum() + 1``), so a set is never empty. Its score, the smallest ``q`` whose set
holds the label (Romano et al.'s ``E = min{tau : y in S(x, tau)}``), is the score of the label
ranked just above: the mass above ``j`` (0 for the top label) plus, for RAPS, the penalty of
rank ``j - 1``. Calibrating on that same score keeps ``score <= q`` as the set and the
guarantee: coverage ``>= 1 - alpha`` (ties at 0, the rows whose true label ranks first, can
only raise it). MAPIE and the RAPS code calibrate on the inclusive mass and then admit the
crossing label, which over-covers (0.95 and 0.9995 at ``alpha = 0.1`` in docs/sets.md's
table). ``include_last=False`` keeps the inclusive score ``above + p_j``, which can give the
empty set for the surest rows (a top probability above ``q``).

Ties between probabilities are ranked by label index (a stable sort), the same at calibration
and at test time.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_finite,
    check_floating,
    check_nonempty,
    check_option,
    check_probabilities,
    check_tensor,
)
from torchcal.functional._levels import alpha_fraction, miscoverage
from torchcal.functional._validation import check_group_ids, check_probability_rows

__all__ = [
    "conformal_rank",
    "conformal_quantile",
    "conformal_score_matrix",
    "conformal_scores",
    "conformal_sets",
    "conformal_risk_control",
    "multilabel_fnr_losses",
    "set_size_losses",
]

METHODS = ("lac", "aps", "raps", "topk")
_INPUTS = ("logits", "probs")


def conformal_rank(
    n: Tensor | int, alpha: object | None = None, *, confidence: object | None = None
) -> Tensor:
    """``k = ceil((n + 1)(1 - alpha))`` exactly, int64 of ``n``'s shape, ``1 <= k <= n + 1``
    (``k = n + 1 > n``: the threshold is infinite). Pass ``alpha`` or ``confidence`` (``1 -
    alpha``, read as written: ``confidence=0.8`` is 4/5, and ``alpha=1 - 0.8`` is 1/5). See
    :mod:`torchcal.functional.conformal`.

    Example:
        >>> from torchcal.scaling import conformal_rank
        >>> conformal_rank(9, 0.2).item(), conformal_rank(9, 0.7).item(), conformal_rank(9, 0.05).item()
        (8, 3, 10)
        >>> conformal_rank(50, 1 - 1e-10).item(), conformal_rank(2, 1 / 3).item()
        (1, 2)
        >>> conformal_rank(4, 1 - 0.8).item(), conformal_rank(4, confidence=0.8).item()
        (4, 4)
    """
    frac = miscoverage(alpha, confidence)
    p, q = frac.numerator, frac.denominator
    nt = torch.as_tensor(n)
    if nt.is_floating_point() or nt.dtype == torch.bool or bool((nt < 0).any()):
        raise ValueError("n: expected non-negative integer counts")
    flat = nt.reshape(-1).tolist()
    # Python integers: (n + 1) * (q - p) may exceed int64 for a fine-grained alpha
    ks = [-((-(m + 1) * (q - p)) // q) for m in flat]
    return torch.tensor(ks, dtype=torch.int64, device=nt.device).reshape(nt.shape)


def conformal_quantile(
    scores: Tensor,
    alpha: object | None = None,
    groups: Tensor | None = None,
    num_groups: int | None = None,
    *,
    confidence: object | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The conformal score quantile per group: the ``k``-th smallest score of each group.

    Args:
        scores: finite conformity scores (any shape).
        alpha: miscoverage in ``(0, 1)`` (see :func:`conformal_rank`); or ``confidence``.
        groups: integer group ids of ``scores``' shape (``None``: one group).
        num_groups: the number of groups (``None``: ``max(groups) + 1``).

    Returns:
        ``(q, n, k)``: float64 quantiles ``(G,)`` (``inf`` where ``k > n``, e.g. an empty
        group; a group never reads another group's score), int64 counts and ranks ``(G,)``.
        One sort; no loop over groups.

    Example:
        >>> import torch
        >>> from torchcal.scaling import conformal_quantile
        >>> s = torch.tensor([3.0, 1.0, 2.0, 5.0, 4.0, 9.0, 7.0, 8.0, 6.0])
        >>> q, n, k = conformal_quantile(s, 0.2)           # k = ceil(10 * 0.8) = 8
        >>> q.tolist(), n.tolist(), k.tolist()
        ([8.0], [9], [8])
    """
    frac = miscoverage(alpha, confidence)
    check_floating("scores", check_tensor("scores", scores))
    check_nonempty("scores", scores)
    check_finite("scores", scores)
    x = scores.detach().reshape(-1).to(torch.float64)
    if groups is None:
        if num_groups is not None:
            raise ValueError("num_groups: given without groups")
        g = torch.zeros(x.shape, dtype=torch.long, device=x.device)
        G = 1
    else:
        G = check_group_ids(groups, scores.shape, num_groups)
        g = groups.detach().reshape(-1).to(device=x.device, dtype=torch.long)
    order = torch.argsort(x, stable=True)
    order = order[torch.argsort(g[order], stable=True)]  # by group, then by score
    sorted_x = x[order]
    n = torch.bincount(g, minlength=G)
    k = conformal_rank(n, frac).to(x.device)
    start = torch.cumsum(n, 0) - n
    inside = k <= n
    idx = torch.where(inside, start + k - 1, torch.zeros_like(k))  # k - 1 < n: own group
    q = torch.where(inside, sorted_x[idx], torch.full_like(sorted_x[idx], float("inf")))
    return q, n, k


def _probs(logits: Tensor, input: str, temperature: float | Tensor | None) -> Tensor:
    """float64 probabilities: the softmax of ``logits / T``, or the probabilities as given
    (validated, never renormalised; a temperature ``T != 1`` is ``softmax(log p / T)``)."""
    check_option("input", input, _INPUTS)
    check_floating("logits", check_tensor("logits", logits))
    if logits.dim() != 2 or logits.shape[1] < 2:
        raise ValueError(
            f"logits: expected (B, C) scores with C >= 2, got shape {tuple(logits.shape)}"
        )
    check_nonempty("logits", logits)
    t = None
    if temperature is not None:
        t = float(temperature)
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"temperature: expected a finite value > 0, got {t!r}")
    z = logits.detach().to(torch.float64)
    if input == "probs":
        if bool(torch.isnan(z).any()) or bool(((z < 0) | (z > 1)).any()):
            raise ValueError("logits: input='probs' expects probabilities in [0, 1]")
        # rows summing to 1 (the shared tolerance): a row is never silently renormalised
        check_probability_rows(
            "logits", logits, hint="; input='probs' expects one distribution per row"
        )
        return z if t is None or t == 1.0 else torch.softmax(torch.log(z) / t, dim=1)
    # -inf is a mask (probability 0); NaN, +inf and all-masked rows are errors
    if bool((torch.isnan(z) | (z == math.inf)).any()):
        raise ValueError("logits: expected finite values (or -inf masks), got NaN or +inf")
    if bool(torch.isneginf(z).all(dim=1).any()):
        raise ValueError("logits: a row is masked entirely (every logit -inf)")
    return torch.softmax(z if t is None else z / t, dim=1)


def _uniforms(
    B: int, device: torch.device, u: Tensor | None, generator: torch.Generator | None
) -> Tensor:
    if u is None:
        return torch.rand(B, dtype=torch.float64, device=device, generator=generator)
    check_floating("u", check_tensor("u", u))
    if u.shape != (B,):
        raise ValueError(f"u: expected shape ({B},), one uniform per row, got {tuple(u.shape)}")
    if bool(((u < 0) | (u > 1) | torch.isnan(u)).any()):
        raise ValueError("u: expected uniforms in [0, 1]")
    return u.detach().to(device=device, dtype=torch.float64)


def _include_last(method: str, randomized: bool, include_last: bool | None) -> bool:
    """Whether the set rule admits the label that crosses the threshold (docstring above)."""
    applies = method in ("aps", "raps") and not randomized
    if include_last is None:
        return applies
    if not isinstance(include_last, bool):
        raise TypeError(f"include_last: expected a bool, got {type(include_last).__name__}")
    if not applies:
        raise ValueError(
            "include_last: only for non-randomised APS / RAPS (method 'aps' or 'raps' with "
            "randomized=False)"
        )
    return include_last


def conformal_score_matrix(
    logits: Tensor,
    method: str = "aps",
    *,
    input: str = "logits",
    temperature: float | Tensor | None = None,
    randomized: bool = True,
    include_last: bool | None = None,
    lam: float = 0.01,
    k_reg: int = 5,
    u: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The nonconformity score of every label, float64 ``(B, C)`` (see the module docstring).

    Args:
        logits: ``(B, C)`` logits (``input="logits"``; ``-inf`` masks a label: probability 0)
            or probabilities (``"probs"``: each row in [0, 1] summing to 1 within 1e-4, or
            ``ValueError``; used as given: the LAC score is exactly ``1 - p``).
        method: ``"lac"``, ``"aps"``, ``"raps"`` or ``"topk"``.
        temperature: divide the logits by it first (``None``: as given; probabilities:
            ``softmax(log p / T)``, as given at ``T = 1``). The set temperature is a choice of
            its own: a temperature fitted for NLL can enlarge adaptive sets.
        randomized: APS/RAPS: add ``u p_j`` (exact) instead of ``p_j`` (conservative).
        include_last: non-randomised APS/RAPS only (default ``True``): the score of the label
            ranked just above (the mass above ``j``, plus the penalty of rank ``j - 1``), so
            ``score <= q`` admits the label that crosses ``q`` and never returns an empty set;
            ``False``: the mass up to and including ``j``.
        lam, k_reg: the RAPS penalty ``lam * max(0, rank - k_reg)``.
        u: ``(B,)`` uniforms, one per row (randomized APS/RAPS); else drawn from
            ``generator``. Use the same ``u`` for a row's calibration score and its set.

    Example:
        >>> import torch
        >>> from torchcal.functional import conformal_score_matrix
        >>> p = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
        >>> conformal_score_matrix(p, "aps", input="probs", randomized=False)
        tensor([[0.0000, 0.5000, 0.8000]], dtype=torch.float64)
        >>> conformal_score_matrix(p, "aps", input="probs", randomized=False, include_last=False)
        tensor([[0.5000, 0.8000, 1.0000]], dtype=torch.float64)
        >>> conformal_score_matrix(p, "lac", input="probs")
        tensor([[0.5000, 0.7000, 0.8000]], dtype=torch.float64)
    """
    check_option("method", method, METHODS)
    if not isinstance(randomized, bool):
        raise TypeError(f"randomized: expected a bool, got {type(randomized).__name__}")
    shift = _include_last(method, randomized, include_last)
    p = _probs(logits, input, temperature)
    if method == "lac":
        return 1.0 - p
    B, C = p.shape
    order = torch.argsort(p, dim=1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ar = torch.arange(1, C + 1, device=p.device).expand(B, C)
    ranks.scatter_(1, order, ar)
    if method == "topk":
        return ranks.to(torch.float64)
    ps = torch.gather(p, 1, order)
    above = torch.cumsum(ps, dim=1) - ps
    if shift:  # the score of the label ranked above: its mass is `above`
        s, rank = above, ar - 1
    else:
        w = _uniforms(B, p.device, u, generator)[:, None] if randomized else 1.0
        s, rank = above + w * ps, ar
    # the mass is at most 1 in exact arithmetic; the float sum can pass it by ~4e-16, which
    # would drop a label at a threshold of 1 (the RAPS authors special-case tau = 1)
    s = s.clamp_max(1.0)
    if method == "raps":
        if not (math.isfinite(float(lam)) and float(lam) >= 0):
            raise ValueError(f"lam: expected a finite value >= 0, got {lam!r}")
        if isinstance(k_reg, bool) or not isinstance(k_reg, int) or k_reg < 0:
            raise ValueError(f"k_reg: expected an integer >= 0, got {k_reg!r}")
        s = s + float(lam) * (rank - k_reg).clamp_min(0).to(torch.float64)
    return torch.empty_like(s).scatter_(1, order, s)


def _check_target(target: Tensor, B: int, C: int) -> Tensor:
    check_tensor("target", target)
    if target.is_floating_point() or target.dtype == torch.bool or target.shape != (B,):
        raise ValueError(
            f"target: expected ({B},) integer class ids, got shape {tuple(target.shape)} "
            f"and dtype {target.dtype}"
        )
    if B and bool(((target < 0) | (target >= C)).any()):
        raise ValueError(f"target: expected class ids in [0, {C - 1}]")
    return target.to(torch.long)


def conformal_scores(
    logits: Tensor,
    target: Tensor,
    method: str = "aps",
    **kwargs: object,
) -> Tensor:
    """The true label's score, float64 ``(B,)``: the calibration scores.

    Keyword arguments as :func:`conformal_score_matrix`. Calibrate with
    ``torchcal.scaling.conformal_quantile(scores, alpha)`` (``groups=target, num_groups=C`` for
    class-conditional thresholds, or any group ids for Mondrian ones), then
    :func:`conformal_sets`.

    Example:
        >>> import torch
        >>> from torchcal.functional import conformal_scores
        >>> p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]], dtype=torch.float64)
        >>> conformal_scores(p, torch.tensor([1, 1]), "lac", input="probs")
        tensor([0.7000, 0.4000], dtype=torch.float64)
    """
    return conformal_gather(conformal_score_matrix(logits, method, **kwargs), target)  # type: ignore[arg-type]


def conformal_gather(score_matrix: Tensor, target: Tensor) -> Tensor:
    """``score_matrix[b, target[b]]`` with ``target`` checked: ``(B,)`` class ids."""
    y = _check_target(target, *score_matrix.shape).to(score_matrix.device)
    return torch.gather(score_matrix, 1, y[:, None])[:, 0]


def conformal_sets(
    logits: Tensor,
    threshold: float | Tensor,
    method: str = "aps",
    *,
    input: str = "logits",
    temperature: float | Tensor | None = None,
    randomized: bool = True,
    include_last: bool | None = None,
    lam: float = 0.01,
    k_reg: int = 5,
    u: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Prediction sets as a boolean mask ``(B, C)``: label ``j`` is in row ``b``'s set iff its
    score is ``<= threshold`` (sizes: ``mask.sum(1)``); non-randomised APS / RAPS sets hold the
    label that crosses the threshold (``include_last=True``, their default, the published rule:
    never an empty set; ``include_last=False``: the inclusive-mass score, which can give one).

    ``threshold``: a number or 0-d tensor (one threshold), ``(B, 1)`` (per row: Mondrian,
    ``q[groups][:, None]``), ``(1, C)`` (per class: class-conditional, ``q[None, :]``) or ``(B,
    C)``; ``inf`` admits every label, and so does ``1`` for APS (its scores are at most 1).
    Keyword arguments as :func:`conformal_score_matrix` (the same ``method``, temperature and,
    for randomized sets, fresh uniforms per test row).

    Example:
        >>> import torch
        >>> from torchcal.functional import conformal_sets
        >>> p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]], dtype=torch.float64)
        >>> conformal_sets(p, 0.75, "lac", input="probs")
        tensor([[ True,  True, False],
                [False,  True,  True]])
        >>> conformal_sets(p, 0.55, "aps", input="probs", randomized=False)  # + the crossing label
        tensor([[ True,  True, False],
                [False,  True, False]])
    """
    s = conformal_score_matrix(
        logits,
        method,
        input=input,
        temperature=temperature,
        randomized=randomized,
        include_last=include_last,
        lam=lam,
        k_reg=k_reg,
        u=u,
        generator=generator,
    )
    return s <= set_threshold(threshold, s.shape[0], s.shape[1], s.device)


def set_threshold(threshold: float | Tensor, B: int, C: int, device: torch.device) -> Tensor:
    """``threshold`` checked (a number, ``(B, 1)``, ``(1, C)`` or ``(B, C)``, no NaN), float64."""
    if isinstance(threshold, Tensor):
        check_floating("threshold", threshold)
        t = threshold.detach().to(device=device, dtype=torch.float64)
        if t.dim() != 0 and not (t.dim() == 2 and t.shape[0] in (1, B) and t.shape[1] in (1, C)):
            raise ValueError(
                f"threshold: expected a number, (B, 1) = ({B}, 1), (1, C) = (1, {C}) or "
                f"(B, C), got shape {tuple(t.shape)} (a 1-d threshold is ambiguous)"
            )
    elif isinstance(threshold, Real) and not isinstance(threshold, bool):
        t = torch.tensor(float(threshold), dtype=torch.float64, device=device)
    else:
        raise TypeError(f"threshold: expected a number or a tensor, got {type(threshold).__name__}")
    if bool(torch.isnan(t).any()):
        raise ValueError("threshold: NaN")
    return t


def conformal_risk_control(
    losses: Tensor, alpha: float, lambdas: Tensor, *, bound: float = 1.0
) -> tuple[Tensor, Tensor]:
    r"""Conformal risk control (Angelopoulos, Bates, Fisch, Lei & Schuster, ICLR 2024).

    ``losses[..., i, j]`` is calibration point ``i``'s loss at ``lambdas[j]`` (ascending), in
    ``[0, bound]`` and non-increasing in ``lambda`` along every row. The result is the smallest
    ``lambda`` with ``n / (n + 1) * R_hat(lambda) + bound / (n + 1) <= alpha`` (``R_hat``: the
    mean loss over the ``n`` points).

    **Guarantee:** for exchangeable calibration and test points and a loss non-increasing and
    right-continuous in ``lambda``, ``E[loss_{n+1}(lambda_hat)] <= alpha`` (over the
    calibration draw and the test point), provided the largest ``lambda`` has loss 0 (else,
    where no ``lambda`` qualifies, the result is ``inf`` with index ``L``). With the miscoverage
    loss ``1{score > lambda}`` it is split conformal: ``lambda_hat`` is the
    ``ceil((n + 1)(1 - alpha))``-th smallest score.

    Args:
        losses: ``(..., n, L)`` floating losses; leading dimensions are independent problems
            (e.g. random splits).
        alpha: the risk level.
        lambdas: ``(L,)`` ascending grid.
        bound: ``B``, the largest possible loss.

    Returns:
        ``(lambda_hat, index)``: float64 and int64 of shape ``losses.shape[:-2]``.

    Example:
        >>> import torch
        >>> from torchcal.functional import conformal_risk_control
        >>> lam = torch.linspace(0, 1, 11, dtype=torch.float64)
        >>> scores = torch.tensor([0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85])
        >>> losses = (scores[:, None] > lam).double()       # miscoverage
        >>> conformal_risk_control(losses, 0.2, lam)        # the 8th smallest score, 0.75 -> 0.8
        (tensor(0.8000, dtype=torch.float64), tensor(8))
    """
    check_floating("losses", check_tensor("losses", losses))
    check_floating("lambdas", check_tensor("lambdas", lambdas))
    if losses.dim() < 2 or losses.shape[-2] == 0:
        raise ValueError(f"losses: expected (..., n, L) with n >= 1, got {tuple(losses.shape)}")
    if lambdas.dim() != 1 or lambdas.shape[0] != losses.shape[-1]:
        raise ValueError(
            f"lambdas: expected ({losses.shape[-1]},) to match losses' last dimension, got "
            f"{tuple(lambdas.shape)}"
        )
    _check_lambdas(lambdas)  # a non-empty grid
    check_finite("losses", losses)
    check_finite("lambdas", lambdas)
    if bool((lambdas.diff() <= 0).any()):
        raise ValueError("lambdas: expected a strictly ascending grid")
    b = float(bound)
    if not (math.isfinite(b) and b > 0):
        raise ValueError(f"bound: expected a finite value > 0, got {bound!r}")
    x = losses.detach().to(torch.float64)
    if bool(((x < 0) | (x > b)).any()):
        raise ValueError(f"losses: expected values in [0, bound = {b:g}]")
    if bool((x.diff(dim=-1) > 0).any()):
        raise ValueError("losses: expected every row non-increasing in lambda")
    frac = alpha_fraction(alpha)
    n = x.shape[-2]
    # n/(n+1) R + B/(n+1) <= alpha  <=>  sum_i loss_i + B <= (n + 1) alpha, the right side
    # the correctly rounded (n + 1) p / q of alpha's exact fraction (exact for 0/1 losses)
    total = x.sum(dim=-2)
    ok = total + b <= (n + 1) * frac.numerator / frac.denominator
    L = x.shape[-1]
    first = ok.to(torch.int8).argmax(dim=-1)
    idx = torch.where(ok.any(dim=-1), first, torch.full_like(first, L))
    lam = torch.cat(
        [lambdas.detach().to(torch.float64), torch.tensor([math.inf], dtype=torch.float64)]
    )
    return lam.to(idx.device)[idx], idx


def _check_lambdas(lambdas: Tensor) -> Tensor:
    check_floating("lambdas", check_tensor("lambdas", lambdas))
    if lambdas.dim() != 1 or lambdas.numel() == 0:
        raise ValueError(f"lambdas: expected a non-empty 1-d grid, got {tuple(lambdas.shape)}")
    check_finite("lambdas", lambdas)
    return lambdas.detach().to(torch.float64)


def multilabel_fnr_losses(probs: Tensor, labels: Tensor, lambdas: Tensor) -> Tensor:
    """False-negative rate of the multi-label set ``{j : p_j >= 1 - lambda}`` for every
    ``lambda``: ``(N, L)`` float64, ``1 - |set & Y| / |Y|`` (0 for a row without positives);
    non-increasing in ``lambda``, in ``[0, 1]``.

    Example:
        >>> import torch
        >>> from torchcal.functional import multilabel_fnr_losses
        >>> p = torch.tensor([[0.9, 0.4, 0.1]], dtype=torch.float64)
        >>> multilabel_fnr_losses(p, torch.tensor([[1, 1, 0]]), torch.tensor([0.2, 0.7]))
        tensor([[0.5000, 0.0000]], dtype=torch.float64)
    """
    check_floating("probs", check_tensor("probs", probs))
    if probs.dim() != 2:
        raise ValueError(f"probs: expected (N, C) probabilities, got {tuple(probs.shape)}")
    if labels.shape != probs.shape:
        raise ValueError(
            f"labels: expected probs' shape {tuple(probs.shape)}, got {tuple(labels.shape)}"
        )
    lam = _check_lambdas(lambdas).to(probs.device)
    check_probabilities("probs", probs)  # per label in [0, 1], no NaN (rows need not sum to 1)
    p = probs.detach().to(torch.float64)
    y = labels.detach().to(torch.float64)
    if bool(((y != 0) & (y != 1)).any()):
        raise ValueError("labels: expected 0/1 labels")
    inside = p[:, :, None] >= (1.0 - lam)  # (N, C, L)
    hit = (inside * y[:, :, None]).sum(dim=1)
    pos = y.sum(dim=1, keepdim=True)
    return torch.where(pos > 0, 1.0 - hit / pos.clamp_min(1.0), 0.0)


def set_size_losses(probs: Tensor, lambdas: Tensor) -> Tensor:
    """The relative size ``|{j : p_j >= lambda}| / C`` for every ``lambda``: ``(N, L)`` float64,
    non-increasing in ``lambda``, in ``[0, 1]`` (risk control of the set size).

    Example:
        >>> import torch
        >>> from torchcal.functional import set_size_losses
        >>> set_size_losses(torch.tensor([[0.6, 0.3, 0.1]]), torch.tensor([0.2, 0.5]))
        tensor([[0.6667, 0.3333]], dtype=torch.float64)
    """
    check_floating("probs", check_tensor("probs", probs))
    if probs.dim() != 2:
        raise ValueError(f"probs: expected (N, C) probabilities, got {tuple(probs.shape)}")
    lam = _check_lambdas(lambdas).to(probs.device)
    check_probabilities("probs", probs)  # per label in [0, 1], no NaN (rows need not sum to 1)
    p = probs.detach().to(torch.float64)
    return (p[:, :, None] >= lam).to(torch.float64).mean(dim=1)
