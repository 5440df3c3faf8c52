"""Calibration of an lm-evaluation-harness multiple-choice evaluation (docs/design.md
section 6h; the user's page is docs/llm.md).

A multiple-choice document gives the harness one log-likelihood ``ll_i`` per choice. Two
confidence rules turn them into probabilities over the choices:

- ``raw``: ``softmax(ll)``, the probabilities the harness's ``brier_score`` scores (its
  ``acc`` answers by their arg-max);
- ``norm``: ``softmax(ll / len)``, ``len`` the choice's character count: the arg-max is the
  answer ``acc_norm`` scores, so the probability judged is that of the answer judged.

Both are logits for :mod:`torchcal.functional` (``-inf`` past a document's choices: tasks
whose documents have different numbers of choices are padded). :func:`choice_scores` gives
``ece`` (equal-width, :data:`N_BINS` bins on the top-choice confidence, bin
``min(floor(c * B), B - 1)``), ``smooth_ece`` (Blasiok & Nakkiran 2023, exact),
``nll``, ``brier`` (``sum_c (p_c - [c = gold])^2``, the harness's convention) and ``aurc``
(the 0/1 error of the arg-max answer against the confidence). :func:`aggregate` is the
harness's aggregation of its per-document items ``(gold, lls, lengths)``; the harness side
(metric registration, the task class) is :mod:`torchcal.integrations.lm_eval_task`.

:func:`audit_samples` (``torchcal audit --from lm-eval RESULTS_DIR``) reads the run's
``samples_*.jsonl`` (every task a group), audits the rule's probabilities as the audit does
any file, and reports a temperature over the choices cross-fitted per task: two seeded folds
per task, each scored with the ``T`` fitted on the other.

Example:
    >>> import torch
    >>> lls = torch.tensor([[-1.0, -3.0], [-2.0, -1.5]], dtype=torch.float64)
    >>> lengths = torch.tensor([[2.0, 8.0], [3.0, 1.0]], dtype=torch.float64)
    >>> choice_logits(lls, lengths, "norm").tolist()
    [[-0.5, -0.375], [-0.6666666666666666, -1.5]]
    >>> s = choice_scores(choice_logits(lls, lengths, "raw"), torch.tensor([0, 1]))
    >>> round(s["brier"], 4), round(s["nll"], 4)
    (0.1567, 0.3005)
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from torchcal.audit.core import Auditor, audit
from torchcal.audit.report import AuditReport
from torchcal.functional._checks import check_int, check_option
from torchcal.functional.calibration.nll import negative_log_likelihood
from torchcal.functional.calibration.wrappers import calibration_error
from torchcal.functional.folds import kfold_indices
from torchcal.functional.scoring import brier_score
from torchcal.functional.selective import aurc
from torchcal.integrations._lm_eval_samples import LoggedSamples, read_samples
from torchcal.scaling.group import GroupTemperatureScaler

#: the confidence rules (module docstring)
RULES = ("raw", "norm")
#: the metrics of :func:`choice_scores`, in its order
METRICS = ("ece", "smooth_ece", "nll", "brier", "aurc")
#: equal-width bins of ``ece``
N_BINS = 15
#: folds of the cross-fitted temperature
FOLDS = 2


def choice_logits(lls: Tensor, lengths: Tensor | None, rule: str) -> Tensor:
    """The logits over the choices under ``rule``: ``lls`` (``raw``) or ``lls / lengths``
    (``norm``), ``(N, C)`` float64 with ``-inf`` past a document's choices.

    Args:
        lls: ``(N, C)`` log-likelihoods (``-inf`` past the choices).
        lengths: ``(N, C)`` character lengths ``> 0`` (needed by ``norm``).
        rule: ``"raw"`` or ``"norm"``.
    """
    check_option("rule", rule, RULES)
    if not isinstance(lls, Tensor) or lls.dim() != 2 or not lls.is_floating_point():
        raise TypeError("lls: expected a floating (N, C) tensor")
    lls = lls.to(torch.float64)
    if rule == "raw":
        return lls
    if not isinstance(lengths, Tensor) or lengths.shape != lls.shape:
        raise ValueError(f"lengths: expected a tensor of shape {tuple(lls.shape)} for 'norm'")
    if not bool((lengths > 0).all()):
        raise ValueError("lengths: expected choice lengths > 0")
    return lls / lengths.to(torch.float64)


def choice_scores(
    logits: Tensor, gold: Tensor, *, n_bins: int = N_BINS, metrics: Sequence[str] = METRICS
) -> dict[str, float]:
    """The ``metrics`` (of :data:`METRICS`) of the probabilities ``softmax(logits)`` against
    the gold choices, every formula from :mod:`torchcal.functional` (module docstring)."""
    check_int("n_bins", n_bins, minimum=1)
    for m in metrics:
        check_option("metric", m, METRICS)
    out: dict[str, float] = {}
    if "ece" in metrics:
        out["ece"] = float(calibration_error(logits, gold, n_bins=n_bins))  # type: ignore[arg-type]
    if "smooth_ece" in metrics:
        smooth = calibration_error(logits, gold, estimator="smooth", exact=True)
        out["smooth_ece"] = float(smooth)  # type: ignore[arg-type]
    if "nll" in metrics:
        out["nll"] = float(negative_log_likelihood(logits, gold))
    if "brier" in metrics:
        out["brier"] = float(brier_score(logits, gold))
    if "aurc" in metrics:
        conf, pred = torch.softmax(logits, dim=1).max(dim=1)
        out["aurc"] = float(aurc(conf, (pred != gold).to(torch.float64)))
    return {m: out[m] for m in METRICS if m in out}


def items_to_tensors(items: Sequence[Any]) -> tuple[Tensor, Tensor, Tensor]:
    """The harness's per-document items ``(gold, lls, lengths)`` as ``(gold (N,), lls (N, C),
    lengths (N, C))``, padded with ``-inf`` and 1 past a document's choices."""
    if len(items) == 0:
        raise ValueError("items: no documents")
    width = max(len(it[1]) for it in items)
    gold = torch.tensor([int(it[0]) for it in items], dtype=torch.int64)
    lls = torch.full((len(items), width), float("-inf"), dtype=torch.float64)
    lengths = torch.ones((len(items), width), dtype=torch.float64)
    for i, (_, ll, n) in enumerate(items):
        if len(n) != len(ll):
            raise ValueError(f"items: document {i} has {len(ll)} lls and {len(n)} lengths")
        lls[i, : len(ll)] = torch.tensor([float(x) for x in ll], dtype=torch.float64)
        lengths[i, : len(n)] = torch.tensor([float(x) for x in n], dtype=torch.float64)
    return gold, lls, lengths


def aggregate(items: Sequence[Any], metric: str, rule: str, n_bins: int = N_BINS) -> float:
    """One of :data:`METRICS` under ``rule`` from the harness's per-document items
    ``(gold, lls, lengths)`` (an lm-eval aggregation: registered by
    :func:`torchcal.integrations.lm_eval_task.register_harness_metrics`).

    Example:
        >>> items = [(0, [-1.0, -3.0], [2, 8]), (1, [-2.0, -1.5], [3, 1])]
        >>> round(aggregate(items, "brier", "raw"), 4)
        0.1567
    """
    check_option("metric", metric, METRICS)
    gold, lls, lengths = items_to_tensors(items)
    z = choice_logits(lls, lengths, rule)
    return choice_scores(z, gold, n_bins=n_bins, metrics=(metric,))[metric]


def evaluate_module_path() -> str:
    """The path of the Hugging Face ``evaluate`` metric module: ``evaluate.load(path)``."""
    return str(Path(__file__).with_name("hf_evaluate") / "torchcal_calibration.py")


def _fit_t(logits: Tensor, target: Tensor, group: Tensor, G: int) -> tuple[float, list[float]]:
    """(the pooled T, a T per group fitted on its rows alone): one pass per step for all."""
    with warnings.catch_warnings():  # the groups too small to split were left out, and said
        warnings.filterwarnings("ignore", "groups: no samples in group")
        fit = GroupTemperatureScaler(G, shrinkage=0.0).fit(logits, target, group)
    return fit.temperature, list(fit.temperatures)


def _task_folds(group: Tensor, G: int, seed: int) -> tuple[list[Tensor], Tensor]:
    """The rows of each of :data:`FOLDS` folds, every group dealt into its own seeded folds
    (``kfold_indices(n_g, FOLDS, seed + g)``), and the mask of the rows in groups too small
    to split (fewer than ``2 * FOLDS``: they keep ``T = 1``)."""
    folds: list[list[Tensor]] = [[] for _ in range(FOLDS)]
    small = torch.zeros(group.numel(), dtype=torch.bool)
    for g in range(G):
        rows = torch.nonzero(group == g).squeeze(1)
        if rows.numel() < 2 * FOLDS:
            small[rows] = True
            continue
        for k, held in enumerate(kfold_indices(rows.numel(), FOLDS, seed + g)):
            folds[k].append(rows[held])
    return [torch.cat(f) if f else torch.zeros(0, dtype=torch.int64) for f in folds], small


def _eval_summary(report: AuditReport) -> dict[str, Any]:
    """The ``eval_*`` shape of report.json's ``temperature`` entry."""
    keep = ("n", "ece", "ece_debiased", "ece_ci", "threshold_gap", "verdict", "reasons")
    return {
        "verdict": report.verdict,
        "pooled": {k: report.pooled[k] for k in keep},
        "groups": {g: {k: v[k] for k in keep} for g, v in report.groups.items()},
    }


def cross_fitted_temperature(
    logits: Tensor,
    target: Tensor,
    group: Tensor,
    names: Sequence[str],
    *,
    seed: int = 0,
    rows: str = "all",
    **report_kw: Any,
) -> dict[str, Any]:
    """report.json's ``temperature`` entry for a temperature cross-fitted per group.

    Group ``g`` is dealt into :data:`FOLDS` seeded folds (``kfold_indices(n_g, FOLDS, seed +
    g)``); fold ``k``'s rows are divided by their group's ``T`` fitted on the group's other
    folds (all groups in one :class:`~torchcal.scaling.GroupTemperatureScaler` fit, no
    shrinkage: each group's ``T`` is its own), so every row is scored by a ``T`` that never
    saw it (``eval_after``; ``eval_after_pooled``: one ``T`` over all groups, fitted on the
    same fit folds). ``group_T``/``pooled_T`` are fitted on all rows (the ``T`` to deploy),
    ``fold_T`` the per-fold ones (fold ``k``: the ``T`` that scored fold ``k``). A group of fewer than ``2 * FOLDS`` rows keeps
    ``T = 1`` (a warning says so). ``rows`` is reported as given (``"all"``, or ``"sample"``:
    the rows are an audit's kept sample). ``report_kw`` are :func:`~torchcal.audit.audit`'s
    (threshold, tolerance, n_bins, alpha, power, ...).
    """
    G = len(names)
    folds, small = _task_folds(group, G, seed)
    tiny = {g for g in range(G) if bool(small[group == g].any())}
    for g in sorted(tiny):
        msg = f"group '{names[g]}': {int((group == g).sum())} rows, too few to cross-fit T (kept T = 1)"
        warnings.warn(msg, UserWarning, stacklevel=2)
    after, after_pooled = logits.clone(), logits.clone()
    fold_t: list[list[float]] = []
    for held in folds:
        fit = torch.ones(group.numel(), dtype=torch.bool)
        fit[held] = False
        fit &= ~small
        pooled_t, per = _fit_t(logits[fit], target[fit], group[fit], G)
        after[held] = logits[held] / torch.tensor(per, dtype=torch.float64)[group[held], None]
        after_pooled[held] = logits[held] / pooled_t
        fold_t.append(per)
    pooled_t, group_t = _fit_t(logits[~small], target[~small], group[~small], G)

    def run(z: Tensor) -> dict[str, Any]:
        kw: dict[str, Any] = {"input": "logits", "reading": "confidence", "sample_size": 0}
        kw["min_group"] = 0
        return _eval_summary(
            audit(z, target, groups=group, group_names=list(names), **kw, **report_kw)
        )

    n = int(target.numel())
    return {
        "pooled_T": pooled_t,
        "group_T": {m: 1.0 if g in tiny else group_t[g] for g, m in enumerate(names)},
        "fold_T": {m: None if g in tiny else [f[g] for f in fold_t] for g, m in enumerate(names)},
        "cross_fit": f"{FOLDS} seeded folds per group; each row scored by the T of the other",
        "n_fit": n,
        "n_eval": n,
        "rows": rows,
        "clamped": 0,
        "eval_before": run(logits),
        "eval_after": run(after),
        "eval_after_pooled": run(after_pooled),
    }


def audit_samples(
    path: str | os.PathLike[str],
    *,
    rule: str = "raw",
    threshold: float | None = None,
    tolerance: float = 0.05,
    n_bins: int | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    cost_error: float | None = None,
    cost_escalation: float | None = None,
    seed: int = 0,
    sample_size: int = 20000,
) -> AuditReport:
    """The audit of an lm-eval run's ``samples_*.jsonl`` under ``path`` (``torchcal audit
    --from lm-eval``): the ``rule``'s probabilities over the choices, every task a group,
    with :func:`cross_fitted_temperature` as ``report.temperature``, fitted and evaluated on
    the audit's kept sample (``sample_size`` seeded uniform rows; all rows when fewer, as the
    audit's own ``fit_temperature`` does: ``rows`` says which); the other arguments are
    :class:`torchcal.audit.Auditor`'s and :meth:`~torchcal.audit.Auditor.report`'s.

    Example:
        >>> import json, tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> g = torch.Generator().manual_seed(0)
        >>> lines = []
        >>> for i in range(400):
        ...     ll = (2 * torch.randn(3, generator=g)).tolist()
        ...     gold = int(torch.distributions.Categorical(logits=torch.tensor(ll)).sample())
        ...     args = {f"gen_args_{c}": {"arg_0": "Q", "arg_1": f" choice {c}"} for c in range(3)}
        ...     resps = [[str(x), "False"] for x in ll]
        ...     lines.append(json.dumps({"target": str(gold), "arguments": args, "filtered_resps": resps}))
        >>> _ = (d / "samples_toy_2026-01-02T03-04-05.1.jsonl").write_text("\\n".join(lines) + "\\n")
        >>> r = audit_samples(d)  # the gold drawn from softmax(lls): T near 1
        >>> sorted(r.groups), r.settings["reading"], r.read_log["rule"]
        (['toy'], 'confidence', 'raw')
        >>> 0.8 < r.temperature["group_T"]["toy"] < 1.25
        True
        >>> r.temperature["group_T"]["toy"] > 5 * audit_samples(d, rule="norm").temperature["group_T"]["toy"]
        True
    """
    check_option("rule", rule, RULES)
    s: LoggedSamples = read_samples(path)
    z = choice_logits(s.lls, s.lengths, rule)
    auditor = Auditor(
        input="logits", n_bins=n_bins, sample_size=sample_size, seed=seed, reading="confidence"
    )
    auditor.update(z, s.target, s.group)
    kw: dict[str, Any] = {"threshold": threshold, "tolerance": tolerance, "alpha": alpha}
    kw["power"] = power
    kw |= {"cost_error": cost_error, "cost_escalation": cost_escalation}
    log = {"rows": int(s.target.numel()), "excluded": [], "blank_lines": s.blank_lines}
    log |= {"source": "lm-eval", "rule": rule, "files": list(s.files)}
    report = auditor.report(group_names=list(s.tasks), read_log=log, **kw)
    smp = auditor.sample()
    rows = "all" if smp["target"].numel() == auditor.n_rows else "sample"
    report.temperature = cross_fitted_temperature(
        smp["preds"],
        smp["target"],
        smp["group"],
        s.tasks,
        seed=seed,
        rows=rows,
        n_bins=n_bins,
        **kw,
    )
    return report
