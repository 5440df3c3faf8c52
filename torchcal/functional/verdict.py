"""The audit's verdict as a statistical test: equivalence (PASS), non-equivalence (FAIL) or
neither (INCONCLUSIVE), at a stated level ``alpha`` (docs/design.md section 6c).

Everything is computed from the binned sufficient statistics
(:class:`~torchcal.functional.BinnedStats` ``(..., K, B)``; leading axes such as
replicates or groups are kept), so a simulation can test thousands of replicates in one call
and the audit streams any file:

* :func:`window_gap_test`: the gap ``mean confidence - accuracy`` in a threshold window, its
  ``1 - 2 alpha`` interval (the continuity-corrected Wilson interval of the accuracy,
  shifted by the mean confidence) and the p-values of PASS (two one-sided score tests: ``|gap| < tolerance``) and
  FAIL (``|gap| > tolerance``);
* :func:`ece_test_from_stats`: a test on the binned L1 ECE that accounts for its upward bias
  (about ``sqrt(2 / pi) sum_b sd_b``, which grows like ``sqrt(bins / n)``): a bias-corrected
  estimate, a ``1 - 2 alpha`` interval inside ``[0, 1]`` and the two p-values;
* :func:`holm_adjust`: Holm's step-down adjustment of the FAIL p-values of a family (the
  pooled row and the groups: a FAIL anywhere is a union of claims), optionally on the
  conditional p-values of the rows not far inside their null (the segments);
* :func:`decide`: the per-row codes ``PASS``/``FAIL``/``INCONCLUSIVE`` and the overall one (a
  PASS needs every row to pass: an intersection-union test, level ``alpha`` without any
  adjustment).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from torchcal.functional._checks import check_number
from torchcal.functional.calibration.binning import BinnedStats
from torchcal.functional.calibration.intervals import wilson_interval
from torchcal.functional.decision import _window_bins, window_gap_from_stats

#: verdict codes of :func:`decide`
PASS, FAIL, INCONCLUSIVE = 0, 1, 2
#: how the tests read sample weights (docs/design.md section 6f): ``importance`` by the
#: effective sample size ``(sum w)^2 / sum w^2`` (Kish; scale-free), ``frequency`` as
#: repetitions (``sum w`` rows: integer weights give the repeated dataset's verdict)
WEIGHTS = ("importance", "frequency")

_SQRT_2_PI = math.sqrt(2.0 / math.pi)


def check_alpha(alpha: float) -> float:
    """``alpha`` in ``(0, 0.5)`` (the level of each one-sided test)."""
    a = check_number("alpha", alpha, strict=True)
    if not a < 0.5:
        raise ValueError(f"alpha: expected a level in (0, 0.5), e.g. 0.05, got {alpha!r}")
    return a


def check_weights(weights: str) -> str:
    """``weights`` one of :data:`WEIGHTS`."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights: expected one of {WEIGHTS}, got {weights!r}")
    return weights


def design_factor(stats: BinnedStats, weights: str) -> Tensor | None:
    """Per bin ``sum w^2 / sum w`` (the variance of a weighted sum over that of the rows it
    counts; 0 in a bin of weight 0), or ``None`` where the tests read counts (unweighted
    statistics, or ``frequency`` weights). Importance weights need ``stats.weight2``."""
    if stats.weight is None or check_weights(weights) == "frequency":
        return None
    if stats.weight2 is None:
        raise ValueError(
            "weights: importance weights are read by their effective sample size, which needs "
            "the sum of w^2 per bin (a state written before it had one: re-create it, or read "
            "integer repetition counts with weights='frequency')"
        )
    w = stats.weight
    return torch.where(w > 0, stats.weight2 / torch.where(w > 0, w, 1.0), 0.0)


def kish_n(mass: Tensor, weight2: Tensor) -> Tensor:
    """Kish's effective sample size ``mass^2 / weight2`` (``(sum w)^2 / sum w^2``; 0 where
    ``weight2`` is 0).

    Example:
        >>> kish_n(torch.tensor([2.0, 0.0]), torch.tensor([2.0, 0.0])).tolist()
        [2.0, 0.0]
    """
    return torch.where(weight2 > 0, mass * mass / torch.where(weight2 > 0, weight2, 1.0), 0.0)


def _z(q: float) -> float:
    return float(torch.special.ndtri(torch.tensor(q, dtype=torch.float64)))


def _score_tail(hits: Tensor, q0: Tensor, n: Tensor, *, upper: bool) -> Tensor:
    """One-sided p-value of the continuity-corrected score test of ``q = q0`` (the test
    :func:`wilson_cc_interval` inverts): ``Phi((k + 1/2 - n q0) / sqrt(n q0 (1 - q0)))`` for
    "at most ``k`` successes", ``1 - Phi((k - 1/2 - n q0) / ...)`` for "at least ``k``";
    ``q0`` strictly inside (0, 1)."""
    q = q0.clamp(1e-300, 1 - 1e-16)
    se = torch.sqrt(n * q * (1 - q))
    if upper:
        return 1 - torch.special.ndtr((hits - 0.5 - n * q) / se)
    return torch.special.ndtr((hits + 0.5 - n * q) / se)


def wilson_cc_interval(
    successes: Tensor, trials: Tensor, level: float = 0.9
) -> tuple[Tensor, Tensor]:
    """Wilson's score interval with continuity correction (Newcombe 1998, method 4): the
    ``q0`` that the continuity-corrected score test does not reject, each side at ``(1 -
    level) / 2``. Closer to the exact binomial test than the plain Wilson interval at small
    ``n`` (the plain one rejects a true ``q`` too often there). ``NaN`` where ``trials == 0``.

    Example:
        >>> import torch
        >>> lo, hi = wilson_cc_interval(torch.tensor([4.0]), torch.tensor([5.0]), 0.9)
        >>> round(float(lo), 4), round(float(hi), 4)
        (0.3493, 0.9861)
    """
    z = float(torch.special.ndtri(torch.tensor(0.5 + level / 2, dtype=torch.float64)))
    k = successes.to(torch.float64)
    n = trials.to(torch.float64)
    p = k / n
    z2 = z * z
    den = 2 * (n + z2)
    lo = (
        2 * n * p
        + z2
        - 1
        - z * torch.sqrt((z2 - 2 - 1 / n + 4 * p * (n * (1 - p) + 1)).clamp_min(0))
    ) / den
    hi = (
        2 * n * p
        + z2
        + 1
        + z * torch.sqrt((z2 + 2 - 1 / n + 4 * p * (n * (1 - p) - 1)).clamp_min(0))
    ) / den
    lo = torch.where(k <= 0, 0.0, lo.clamp(0, 1))
    hi = torch.where(k >= n, 1.0, hi.clamp(0, 1))
    return torch.where(n > 0, lo, math.nan), torch.where(n > 0, hi, math.nan)


def window_gap_test(
    stats: BinnedStats,
    lo: float,
    hi: float,
    tolerance: float,
    *,
    alpha: float = 0.05,
    family: int = 1,
    power: float = 0.8,
    weights: str = "importance",
) -> dict[str, Tensor]:
    """Test the calibration gap in the window ``[lo, hi)`` (bin edges of ``stats``
    ``(..., K, B)``; slots pooled) against ``tolerance``.

    Given the confidences, the outcomes in the window are independent Bernoulli(q_i), so the
    accuracy has mean ``q = mean q_i`` and variance ``sum q_i (1 - q_i) / n^2 <= q (1 - q) / n``:
    the binomial score test of the accuracy (continuity-corrected: the plain one is too
    liberal for a window of a few items) is valid, slightly conservative, for the gap ``c - q`` (``c`` the window's mean confidence). With ``q_over = c - tolerance``
    and ``q_under = c + tolerance``:

    * ``p_fail`` (``H0: |gap| <= tolerance``) is the smaller of the two one-sided score
      p-values "accuracy below ``q_over``" and "above ``q_under``" (1 where that side is
      impossible, e.g. ``c <= tolerance``);
    * ``p_pass`` (``H0: |gap| >= tolerance``; two one-sided tests) is the larger of the
      score p-values "accuracy above ``q_over``" and "below ``q_under``" (0 for an
      impossible side);
    * ``gap_ci = c - (`` :func:`wilson_cc_interval` ``of the accuracy at 1 - 2 alpha)``: ``p_pass <= alpha``
      exactly when it lies inside ``(-tolerance, tolerance)``, ``p_fail <= alpha`` when it
      lies outside;
    * ``detectable``: the gap beyond the tolerance that a FAIL at level ``alpha / family``
      (Holm's first step) finds with probability ``power``: ``tolerance + (z_{1 - alpha /
      family} + z_power) sqrt(c (1 - c) / n)``.

    Weighted statistics: the score test counts ``n_eff = (sum w)^2 / sum w^2`` trials in the
    window and ``accuracy * n_eff`` hits with ``weights="importance"`` (Kish: scale-free), the
    weight total with ``"frequency"`` (docs/design.md section 6f).

    Returns ``n``, ``confidence``, ``accuracy``, ``gap``, ``accuracy_ci`` (95 % Wilson, as in
    the reliability tables), ``gap_ci``
    (``(..., 2)``), ``p_pass``, ``p_fail``, ``detectable``; NaN where the window is empty.

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> c = torch.full((400,), 0.8, dtype=torch.float64)
        >>> y = (torch.arange(400) % 10 < 8).long()  # accuracy 0.8 exactly
        >>> s = binned_statistics(c, y, n_bins=10, reading="binary", input="probs").pooled()
        >>> t = window_gap_test(s, 0.7, 0.9, 0.05)
        >>> [round(float(x), 3) for x in t["gap_ci"]], bool(t["p_pass"] < 0.05)
        ([-0.032, 0.036], True)
    """
    tol = check_number("tolerance", tolerance, strict=True)
    alpha = check_alpha(alpha)
    w = window_gap_from_stats(stats, lo, hi)  # n, confidence, accuracy, 95 % Wilson
    n, conf, acc = w["n"], w["confidence"], w["accuracy"]
    nf = w["mass"]  # the row count, or the weight total (frequency weights: repeated rows)
    hits = torch.round(acc * nf)  # a count of 0/1 outcomes: exact after rounding
    if design_factor(stats, weights) is not None:  # importance weights: Kish's n_eff
        a, b = _window_bins(stats, lo, hi)
        w2 = stats.weight2[..., a:b].sum((-2, -1))  # type: ignore[index]
        nf = kish_n(nf, w2)
        hits = acc * nf
        ci = wilson_interval(hits, nf)  # the 95 % interval on n_eff too (scale-free)
        w = {**w, "accuracy_ci": torch.stack(ci, -1)}
    w_lo, w_hi = wilson_cc_interval(hits, nf, level=1 - 2 * alpha)
    q_over, q_under = conf - tol, conf + tol
    p_over = torch.where(q_over > 0, _score_tail(hits, q_over, nf, upper=False), 1.0)
    p_under = torch.where(q_under < 1, _score_tail(hits, q_under, nf, upper=True), 1.0)
    p_fail = torch.minimum(p_over, p_under)
    # TOST: "gap >= tol" (q <= q_over) is rejected by many hits, "gap <= -tol" by few
    p_big = torch.where(q_over > 0, _score_tail(hits, q_over, nf, upper=True), 0.0)
    p_small = torch.where(q_under < 1, _score_tail(hits, q_under, nf, upper=False), 0.0)
    p_pass = torch.maximum(p_big, p_small)
    z = _z(1 - alpha / max(int(family), 1)) + _z(power)
    empty = (n == 0) | ~(w["mass"] > 0)  # no rows, or rows of weight 0 only
    nan = torch.full_like(conf, math.nan)
    return {
        **w,
        "gap_ci": torch.stack([conf - w_hi, conf - w_lo], -1),
        "p_pass": torch.where(empty, nan, p_pass),
        "p_fail": torch.where(empty, nan, p_fail),
        "detectable": tol + z * torch.sqrt(conf * (1 - conf) / nf),
    }


def mean_gap_test(
    stats: BinnedStats,
    tolerance: float,
    *,
    alpha: float = 0.05,
    family: int = 1,
    power: float = 0.8,
    weights: str = "importance",
) -> dict[str, Tensor]:
    """Test the signed calibration gap over all bins, ``gap = (sum w c - sum w y) / sum w``,
    against ``tolerance`` (the segments' FAIL test; docs/design.md section 6g.1).

    ``|gap| <= ECE`` (the triangle inequality over the bins), so ``|gap| > tolerance`` implies
    ``ECE > tolerance``: a FAIL here is a valid FAIL of the ECE claim, without the ECE's upward
    bias (which at 1,500 rows and 10 bins eats ~0.03 of a 0.05 margin). Given the confidences
    the outcomes are independent, so ``D = sum w (c - y)`` has variance ``sum_b k_b m_b
    q_b (1 - q_b)`` at most (bins stratify: ``m_b`` a bin's mass, ``q_b`` its mean true
    accuracy, ``k_b = sum w^2 / sum w`` Kish's design factor, 1 unweighted and for
    ``"frequency"`` weights). Each side's variance is the larger of the plug-in ``a_b (1 -
    a_b)`` (the bin's observed accuracy: consistent) and its value at the side's null, ``q0_b =
    c_b -+ tolerance`` (never 0 where the null has spread), and the z statistic has a
    continuity correction of half a row: ``p_over = 1 - Phi((D - n tolerance - 1/2) /
    sqrt(V_over))``, ``p_under`` alike for ``-D``; ``p_fail = min`` (``H0: |gap| <=
    tolerance``). ``gap_ci``: the ``1 - 2 alpha`` Wald interval on the larger variance;
    ``detectable``: ``tolerance + (z_{1 - alpha / family} + z_power) sqrt(V) / n``.

    Returns ``n`` (rows), ``mass``, ``gap``, ``gap_ci`` ``(..., 2)``, ``p_fail``,
    ``detectable``; NaN where there is no mass.

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(2000, generator=g, dtype=torch.float64)
        >>> y = (torch.rand(2000, generator=g, dtype=torch.float64) < p - 0.15).long()
        >>> s = binned_statistics(p, y, n_bins=10, reading="binary", input="probs").pooled()
        >>> t = mean_gap_test(s, 0.05)
        >>> round(float(t["gap"]), 3), bool(t["p_fail"] < 1e-6)
        (0.135, True)
    """
    tol = check_number("tolerance", tolerance, strict=True)
    alpha = check_alpha(alpha)
    m = stats.mass().flatten(-2)
    n = m.sum(-1)
    safe = torch.where(m > 0, m, 1.0)
    a = (stats.acc.flatten(-2) / safe).clamp(0, 1)
    c = (stats.conf.flatten(-2) / safe).clamp(0, 1)
    k = design_factor(stats, weights)
    kb = torch.ones_like(m) if k is None else k.flatten(-2)
    d = (stats.conf - stats.acc).flatten(-2).sum(-1)
    plug = a * (1 - a)

    def var(q0: Tensor) -> Tensor:
        q0 = q0.clamp(0, 1)
        return (kb * m * torch.maximum(plug, q0 * (1 - q0))).sum(-1)

    v_over, v_under = var(c - tol), var(c + tol)
    w2 = (kb * m).sum(-1)
    cc = 0.5 * torch.where(n > 0, w2 / torch.where(n > 0, n, 1.0), 1.0)  # half a row

    def tail(x: Tensor, v: Tensor) -> Tensor:
        return torch.where(
            v > 0,
            1 - torch.special.ndtr(x / torch.sqrt(torch.where(v > 0, v, 1.0))),
            (x <= 0).double(),
        )

    p_fail = torch.minimum(tail(d - n * tol - cc, v_over), tail(-d - n * tol - cc, v_under))
    safe_n = torch.where(n > 0, n, 1.0)
    gap = d / safe_n
    se = torch.sqrt(torch.maximum(v_over, v_under)) / safe_n
    z = _z(1 - alpha)
    zd = _z(1 - alpha / max(int(family), 1)) + _z(power)
    empty = ~(n > 0)
    nan = torch.full_like(gap, math.nan)

    def f(x: Tensor) -> Tensor:
        return torch.where(empty, nan, x)

    return {
        "n": stats.count.flatten(-2).sum(-1),
        "mass": n,
        "gap": f(gap),
        "gap_ci": torch.stack([f(gap - z * se), f(gap + z * se)], -1),
        "p_fail": f(p_fail),
        "detectable": f(tol + zd * se),
    }


def _folded_mean(r: Tensor) -> Tensor:
    """``E|r + Z|``, ``Z ~ N(0, 1)``: ``r erf(r / sqrt 2) + 2 phi(r)`` (increasing in r >= 0)."""
    return r * torch.special.erf(r / math.sqrt(2.0)) + _SQRT_2_PI * torch.exp(-0.5 * r * r)


def _solve_folded(target: Tensor, scale: Tensor) -> Tensor:
    """The ``u >= 0`` with ``scale * E|u / scale + Z| = target`` (0 where ``target`` is below
    ``scale sqrt(2 / pi)``), by 64 vectorised bisection steps on ``r = u / scale`` in
    ``[0, target / scale]`` (``E|r + Z| >= r``)."""
    safe = torch.where(scale > 0, scale, 1.0)
    hi = (target / safe).clamp_min(0)
    lo = torch.zeros_like(hi)
    for _ in range(64):
        mid = (lo + hi) / 2
        below = _folded_mean(mid) < target / safe
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    u = (lo + hi) / 2 * scale
    return torch.where(scale > 0, u, target.clamp_min(0))


def ece_test_from_stats(
    stats: BinnedStats,
    tolerance: float,
    *,
    alpha: float = 0.05,
    family: int = 1,
    power: float = 0.8,
    weights: str = "importance",
) -> dict[str, Tensor]:
    """Test the binned L1 ECE of ``(..., K, B)`` statistics against ``tolerance``.

    The plug-in ECE is ``T = sum_b |D_b| / n`` with ``D_b = sum (c - y)`` in bin ``b``. Given
    the confidences, ``D_b`` is approximately normal with mean ``n_b delta_b`` (``delta_b``
    the bin's true gap; the target is ``ECE = sum_b n_b |delta_b| / n``) and, for a calibrated
    bin, variance ``sum c (1 - c)`` (``conf - conf2``), so ``sd_b = sqrt(conf_b - conf2_b) / n``
    is the scale of bin ``b``'s term. ``T`` is biased upward: for a calibrated model its mean
    is ``sqrt(2 / pi) sum_b sd_b`` (~``sqrt(bins / n)``). By the Gaussian Poincare
    inequality ``sd(T) <= L = sqrt(sum_b sd_b^2)`` for every ``delta``. Then, with
    ``S = sum_b sd_b`` and ``z = z_{1 - alpha}``:

    * FAIL (``H0: ECE <= tolerance``): ``T <= ECE + sum_b sd_b |Z_b|``, so the lower bound is
      ``low = T - sqrt(2 / pi) S - z L`` (clipped at 0); ``p_fail = 1 - Phi((T - tolerance -
      sqrt(2/pi) S) / L)``;
    * PASS (``H0: ECE >= tolerance``): ``E T`` is smallest, for a given ECE ``u``, when each
      bin's mean term is proportional to its scale (Jensen on the convex folded-normal bias),
      ``E T = S m(u / S)`` with ``m(r) = E|r + Z|``; the upper bound ``high`` solves
      ``S m(high / S) = T + z L`` (clipped to [0, 1]); ``p_pass = Phi((T - S m(tolerance /
      S)) / L)``;
    * ``debiased``: the ``u`` with ``S m(u / S) = T`` (``clipped`` where that is below 0: the
      estimate is then 0 and says so);
    * ``detectable``: the ECE that a FAIL at level ``alpha / family`` finds with probability
      ``power``: ``tolerance + sqrt(2 / pi) S + (z_{1 - alpha / family} + z_power) L``.

    Weighted statistics (``n`` the weight total, ``D_b = sum w (c - y)``): with
    ``weights="importance"`` bin ``b``'s variance is ``sum w c (1 - c)`` times ``sum w^2 /
    sum w`` (Kish's design effect, exact when ``c (1 - c)`` does not vary with ``w`` in the
    bin), so multiplying every weight by a constant changes no number; with ``"frequency"``
    it is ``sum w c (1 - c)`` (``w`` repetitions of each row; docs/design.md section 6f).

    ``p_pass <= alpha`` exactly when ``high < tolerance`` and ``p_fail <= alpha`` exactly when
    ``low > tolerance``. Returns ``ece``, ``debiased``, ``clipped`` (bool), ``ci``
    (``(..., 2)``), ``p_pass``, ``p_fail``, ``detectable``, ``scale`` (``S``) and
    ``spread`` (``L``); NaN where there are no items.

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(20000, generator=g, dtype=torch.float64)
        >>> y = (torch.rand(20000, generator=g, dtype=torch.float64) < p).long()
        >>> s = binned_statistics(p, y, n_bins=10, reading="binary", input="probs").pooled()
        >>> t = ece_test_from_stats(s, 0.05)
        >>> bool(t["ci"][1] < 0.05), bool(t["p_pass"] < 0.05), bool(t["ece"] > t["debiased"])
        (True, True, True)
    """
    tol = check_number("tolerance", tolerance, strict=True)
    alpha = check_alpha(alpha)
    count = stats.mass().flatten(-2)  # the weight total when weighted (frequency weights)
    n = count.sum(-1)
    safe_n = torch.where(n > 0, n, 1.0)  # a weight total may be below 1
    d = (stats.conf - stats.acc).flatten(-2)
    var = (stats.conf - stats.conf2).flatten(-2).clamp_min(0)  # sum c (1 - c) per bin
    k = design_factor(stats, weights)
    if k is not None:  # importance weights: Var sum w (c - y) ~ sum w c (1 - c) * w2 / w
        var = var * k.flatten(-2)
    T = d.abs().sum(-1) / safe_n
    sd = torch.sqrt(var) / safe_n[..., None]
    S = sd.sum(-1)
    L = torch.sqrt((sd * sd).sum(-1))
    z = _z(1 - alpha)
    null_mean = _SQRT_2_PI * S
    low = (T - null_mean - z * L).clamp(0, 1)
    high = _solve_folded(T + z * L, S).clamp(0, 1)
    deb_raw = _solve_folded(T, S)
    clipped = T <= null_mean
    safe_L = torch.where(L > 0, L, 1.0)
    safe_S = torch.where(S > 0, S, 1.0)
    p_fail = torch.where(
        L > 0, 1 - torch.special.ndtr((T - tol - null_mean) / safe_L), (T <= tol).double()
    )
    p_pass = torch.where(
        L > 0,
        torch.special.ndtr((T - S * _folded_mean(tol / safe_S)) / safe_L),
        (T >= tol).double(),
    )
    zd = _z(1 - alpha / max(int(family), 1)) + _z(power)
    empty = n == 0
    nan = torch.full_like(T, math.nan)

    def m(x: Tensor) -> Tensor:
        return torch.where(empty, nan, x)

    return {
        "ece": m(T),
        "debiased": m(deb_raw),
        "clipped": clipped & ~empty,
        "ci": torch.stack([m(low), m(high)], -1),
        "p_pass": m(p_pass),
        "p_fail": m(p_fail),
        "detectable": m(tol + null_mean + zd * L),
        "scale": m(S),
        "spread": m(L),
    }


def holm_adjust(p: Tensor, discard: Tensor | float | None = None) -> Tensor:
    """Holm's step-down adjusted p-values along the last axis (a family of hypotheses);
    ``NaN`` entries are no hypothesis (not counted in the family) and stay ``NaN``.

    Rejecting every adjusted ``p <= alpha`` controls the family-wise error at ``alpha``.

    ``discard`` (per row, broadcast along ``p``; ``None``: plain Holm): Holm on the
    *conditional* p-values (Zhao, Small & Su 2019, "Multiple testing when many p-values are
    uniformly conservative"): a row with ``p > discard`` leaves the family (adjusted to 1), the
    others enter as ``p / discard`` and only they are counted. Valid where a null row's p-value
    is uniformly conservative (``P(p <= u t | p <= t) <= u``: a one-sided z test whose truth
    lies inside its null, e.g. a calibrated segment tested against a tolerance), so rows far
    inside their null stop diluting the ones that are not (docs/design.md section 6g.1);
    ``discard = 1`` is plain Holm.

    Example:
        >>> import torch
        >>> adj = holm_adjust(torch.tensor([0.01, 0.04, float("nan"), 0.03]))
        >>> [round(x, 4) for x in adj.tolist()]
        [0.03, 0.06, nan, 0.06]
        >>> adj = holm_adjust(torch.tensor([0.01, 0.04, 0.9, 0.97]), discard=0.5)
        >>> [round(x, 4) for x in adj.tolist()]  # two rows left: 2 x 0.01 / 0.5, 0.04 / 0.5
        [0.04, 0.08, 1.0, 1.0]
    """
    p = p.to(torch.float64)
    missing = torch.isnan(p)
    dropped = torch.zeros_like(missing)
    if discard is not None:
        tau = torch.as_tensor(discard, dtype=torch.float64, device=p.device).expand_as(p)
        if not bool(((tau > 0) & (tau <= 1)).all()):
            raise ValueError("discard: expected thresholds in (0, 1]")
        dropped = ~missing & (p > tau)
        p = torch.where(dropped, math.nan, p / tau)
    missing = torch.isnan(p)
    m = (~missing).sum(-1, keepdim=True)
    order = torch.where(missing, math.inf, p).argsort(dim=-1, stable=True)
    ps = p.gather(-1, order)
    rank = torch.arange(p.shape[-1], device=p.device).expand_as(ps)
    adj = ((m - rank).clamp_min(1) * ps).clamp_max(1.0)
    adj = torch.where(torch.isnan(adj), 0.0, adj).cummax(-1).values
    out = torch.empty_like(p).scatter_(-1, order, adj)
    return torch.where(dropped, 1.0, torch.where(missing, math.nan, out))


def decide(
    p_pass: Tensor,
    p_fail: Tensor,
    alpha: float = 0.05,
    discard: Tensor | float | None = None,
) -> tuple[Tensor, Tensor]:
    """Verdict codes (:data:`PASS`, :data:`FAIL`, :data:`INCONCLUSIVE`) of a family of rows
    along the last axis, and the overall verdict.

    A row FAILs when its Holm-adjusted ``p_fail`` is ``<= alpha`` (family-wise error of the
    FAIL claims ``<= alpha``; ``discard``: :func:`holm_adjust`'s conditional Holm), PASSes
    when ``p_pass <= alpha`` (each row's equivalence test), else is INCONCLUSIVE (also a row with ``NaN``: no items). Overall: FAIL if any row
    fails, PASS if every row passes (an intersection-union test: its level is ``alpha``
    with no adjustment), else INCONCLUSIVE.

    Example:
        >>> import torch
        >>> rows, overall = decide(torch.tensor([0.01, 0.2]), torch.tensor([0.9, 0.01]))
        >>> rows.tolist(), int(overall)
        ([0, 1], 1)
    """
    alpha = check_alpha(alpha)
    adj = holm_adjust(p_fail, discard)
    fail = adj <= alpha
    ok = (p_pass.to(torch.float64) <= alpha) & ~fail
    rows = torch.full(p_fail.shape, INCONCLUSIVE, dtype=torch.int64, device=p_fail.device)
    rows = torch.where(ok, PASS, torch.where(fail, FAIL, rows))
    overall = torch.where(
        fail.any(-1),
        FAIL,
        torch.where(ok.all(-1), PASS, INCONCLUSIVE),
    )
    return rows, overall
