"""Every figure torchcal draws, in one place: the reliability diagram of a
:class:`~torchcal.ReliabilityTable`, its pyplot-free twin for the loggers, the
"calibration over epochs" figure of :class:`~torchcal.callbacks.CalibrationMonitor`, and the
RGB rendering the image loggers take.

``matplotlib`` is optional (``pip install 'torchcal[plot]'``) and imported inside each
function, never at module import; a missing matplotlib raises ``ImportError`` when a figure is
asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from torchcal.functional.calibration.results import ReliabilityTable

__all__ = [
    "figure_rgb",
    "history_figure",
    "pit_figure",
    "reliability_diagram",
    "table_figure",
    "plot_risk_coverage",
    "risk_coverage_table",
]


def _pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - optional extra
        raise ImportError(
            "torchcal.plotting needs matplotlib (pip install 'torchcal[plot]')"
        ) from e
    return plt


def _diagram_axes(ax: Any) -> tuple[Any, Any]:
    """``(diagram axis, count axis)``: a twin axis behind ``ax``, or two stacked axes of a new
    pyplot figure when ``ax`` is ``None``."""
    if ax is None:
        _, (ax, ax_h) = _pyplot().subplots(
            2, 1, sharex=True, figsize=(4.5, 5.5), gridspec_kw={"height_ratios": [3, 1]}
        )
        return ax, ax_h
    ax_h = ax.twinx()
    ax.set_zorder(ax_h.get_zorder() + 1)  # the diagram in front of the counts
    ax.patch.set_visible(False)
    return ax, ax_h


def reliability_diagram(table: ReliabilityTable, ax: Any = None) -> Any:
    """Reliability diagram of ``table``.

    Accuracy bars per non-empty bin against the diagonal, the per-bin interval as whiskers
    (so seven right out of seven reads as "at least ~0.65", not 1.0), each bin's (mean
    confidence, accuracy) as a point (on the diagonal when calibrated), ``k/n`` (right /
    samples) written in each bin when there are at most 20 bins, and a count histogram: below
    the diagram when ``ax`` is ``None`` (a new pyplot figure), else behind it on a twin axis
    of ``ax`` (scaled into its bottom quarter). Returns the diagram's axis.
    """
    twin = ax is not None
    ax, ax_h = _diagram_axes(ax)
    idx = table.nonempty.numpy()
    lo, hi = table.lo.numpy(), table.hi.numpy()
    width, count, acc = hi - lo, table.count.numpy(), table.acc.numpy()[idx]
    centers = (lo + hi)[idx] / 2
    ax.plot([0, 1], [0, 1], "--", color="gray", lw=1, label="perfect calibration")
    _draw_bins(ax, table, idx, lo[idx], width[idx], centers, acc)
    if table.n_bins <= 20:
        _write_hits(ax, centers, acc, count[idx])
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(f"{table.reading}: ECE {table.ece:.4f}, n={table.n}")
    ax.legend(loc="best", fontsize="x-small" if twin else "small", framealpha=0.9)
    _draw_counts(ax, ax_h, lo, width, count, twin)
    return ax


def _draw_bins(
    ax: Any, table: ReliabilityTable, idx: Any, left: Any, width: Any, centers: Any, acc: Any
) -> None:
    """The non-empty bins (``idx``): accuracy bars from ``left``, the per-bin interval as
    whiskers at the ``centers``, and the (mean confidence, accuracy) points."""
    ax.bar(
        left,
        acc,
        width=width,
        align="edge",
        color="tab:blue",
        alpha=0.6,
        edgecolor="black",
        lw=0.6,
        label="accuracy",
    )
    yerr = [
        (acc - table.ci_low.numpy()[idx]).clip(min=0),
        (table.ci_high.numpy()[idx] - acc).clip(min=0),
    ]
    ax.errorbar(
        centers,
        acc,
        yerr=yerr,
        fmt="none",
        ecolor="black",
        elinewidth=1.2,
        capsize=3,
        label=f"{table.interval_label} interval",
    )
    ax.plot(
        table.conf.numpy()[idx],
        acc,
        "o",
        ms=3.5,
        color="tab:red",
        label="(mean confidence, accuracy)",
    )


def _write_hits(ax: Any, centers: Any, acc: Any, count: Any) -> None:
    """``k/n`` (right / samples) written upright at the foot of each non-empty bin."""
    hits = (acc * count).round().astype(int)
    for x, k, n in zip(centers, hits, count):
        ax.text(
            x,
            0.015,
            f"{k}/{n}",
            rotation=90,
            ha="center",
            va="bottom",
            fontsize=7,
            bbox={"boxstyle": "square,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.7},
        )


def _draw_counts(ax: Any, ax_h: Any, lo: Any, width: Any, count: Any, twin: bool) -> None:
    """The count histogram of every bin on ``ax_h`` (scaled into the bottom quarter of the
    twin axis when ``twin``), and the ``confidence`` label on the lower axis."""
    from matplotlib.ticker import MaxNLocator

    ax_h.bar(lo, count, width=width, align="edge", color="tab:gray", alpha=0.25 if twin else 0.6)
    ax_h.yaxis.set_major_locator(MaxNLocator(nbins=3, integer=True))
    ax_h.set_ylabel("count")
    if twin:
        ax_h.set_ylim(0, 4 * max(int(count.max()), 1))
        ax.set_xlabel("confidence")
    else:
        ax_h.set_xlabel("confidence")


def table_figure(table: ReliabilityTable) -> Any:
    """The reliability diagram of ``table`` on a fresh pyplot-free ``Figure`` (for the
    loggers: no pyplot state is touched)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.5, 4.0), dpi=80)
    reliability_diagram(table, ax=fig.add_subplot(1, 1, 1))
    # fixed margins (room for the count axis on the right): tight_layout() would double the
    # cost of the figure, drawn every validation epoch
    fig.subplots_adjust(left=0.15, right=0.83, bottom=0.13, top=0.9)
    return fig


def history_figure(
    history: Sequence[dict[str, Any]], title: str, *, brier_key: str = "brier_confidence"
) -> Any:
    """ "Calibration over epochs": ECE / debiased ECE / MCE, the Brier score and the NLL (one
    panel each: their scales differ) against the epoch, one point per validation run in
    ``history`` (dicts with ``epoch``, ``step`` and those keys). When an epoch holds several
    runs (``val_check_interval < 1``, a ``validate()`` before ``fit``), the x axis is the
    global step instead."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    epochs = [h["epoch"] for h in history]
    by_step = len(set(epochs)) < len(epochs)
    x, xlabel = ([h["step"] for h in history], "global step") if by_step else (epochs, "epoch")
    fig = Figure(figsize=(10.5, 3.4), dpi=90)
    panels = (
        (("ece", "ece_debiased", "mce"), "calibration error"),
        ((brier_key,), brier_key.replace("_", " ")),
        (("nll",), "NLL (nats)"),
    )
    for i, (keys, ylabel) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        for k in keys:
            ax.plot(x, [h[k] for h in history], marker="o", label=k)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def figure_rgb(fig: Any) -> Any:
    """Render a matplotlib ``Figure`` to an ``(H, W, 3)`` uint8 numpy array (Agg canvas, no
    pyplot state touched)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


# --- regression (L) ---
def pit_figure(
    counts: Sequence[int] | Any,
    *,
    levels: Sequence[float] | None = None,
    coverage: Sequence[float] | None = None,
    stderr: Sequence[float] | None = None,
    title: str = "PIT histogram",
) -> Any:
    """The PIT histogram of binned ``counts`` as densities (``count_b / N * B``; 1 = flat =
    calibrated, U-shaped = intervals too narrow, a hump = too wide, a tilt = a biased mean)
    with the band ``1 +- 2 sqrt((B - 1) / N)`` that a uniform PIT stays in about 95 % of the
    time per bin; with ``levels`` and ``coverage`` a second panel of observed against
    nominal central-interval coverage (whiskers: ``+- 2 stderr``). Returns a pyplot-free
    ``Figure`` (drawn by :class:`~torchcal.callbacks.RegressionMonitor` each epoch).

    Example:
        >>> from torchcal.plotting import pit_figure
        >>> fig = pit_figure([9, 11, 10, 10], levels=[0.5, 0.9], coverage=[0.48, 0.9])
        >>> len(fig.axes)
        2
    """
    import numpy as np
    from matplotlib.figure import Figure

    c = np.asarray(counts, dtype=float).reshape(-1)
    b, n = c.size, max(float(c.sum()), 1.0)
    panels = 2 if levels is not None and coverage is not None else 1
    fig = Figure(figsize=(4.5 * panels, 3.6), dpi=80)
    ax = fig.add_subplot(1, panels, 1)
    ax.bar(
        np.arange(b) / b,
        c / n * b,
        width=1.0 / b,
        align="edge",
        color="tab:blue",
        alpha=0.6,
        edgecolor="black",
        lw=0.6,
        label="PIT density",
    )
    band = 2.0 * np.sqrt((b - 1) / n)
    ax.axhspan(1 - band, 1 + band, color="gray", alpha=0.2, label="uniform +- 2 sd")
    ax.axhline(1.0, color="gray", ls="--", lw=1)
    ax.set_xlim(0, 1)
    ax.set_xlabel("PIT")
    ax.set_ylabel("density")
    ax.set_title(f"{title} (n={int(c.sum())})")
    ax.legend(loc="best", fontsize="x-small")
    if panels == 2:
        _coverage_panel(fig.add_subplot(1, 2, 2), levels, coverage, stderr)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.15, top=0.88, wspace=0.3)
    return fig


def _coverage_panel(
    ax: Any, levels: Sequence[float], coverage: Sequence[float], stderr: Sequence[float] | None
) -> None:
    """Observed against nominal coverage, with ``+- 2 stderr`` whiskers."""
    import numpy as np

    lv, cov = np.asarray(levels, dtype=float), np.asarray(coverage, dtype=float)
    ax.plot([0, 1], [0, 1], "--", color="gray", lw=1, label="nominal")
    err = None if stderr is None else 2.0 * np.asarray(stderr, dtype=float)
    ax.errorbar(lv, cov, yerr=err, fmt="o-", color="tab:red", capsize=3, label="observed")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("nominal coverage")
    ax.set_ylabel("observed coverage")
    ax.set_title("central intervals")
    ax.legend(loc="best", fontsize="x-small")


def plot_risk_coverage(rc: Any, ax: Any = None) -> Any:
    """The risk-coverage curve of a :class:`~torchcal.functional.RiskCoverage` (selective risk
    and generalised risk against coverage, one point per tie block, joined linearly as the
    tie-averaged values are), with AURC and AUGRC in the title; returns the axis.

    Example:
        >>> import torch
        >>> from torchcal.functional import risk_coverage_curve
        >>> from torchcal.plotting import plot_risk_coverage
        >>> rc = risk_coverage_curve(torch.tensor([0.9, 0.8, 0.8]), torch.tensor([0.0, 1.0, 0.0]))
        >>> ax = plot_risk_coverage(rc)  # doctest: +SKIP
    """
    if ax is None:
        _, ax = _pyplot().subplots(figsize=(4.5, 3.5))
    cov = [0.0, *rc.coverage.tolist()]
    risk = rc.risk.tolist()
    risk = [risk[0], *risk]
    gen = [0.0, *rc.generalized_risk.tolist()]
    ax.plot(cov, risk, marker=".", label="selective risk")
    ax.plot(cov, gen, linestyle="--", label="generalised risk")
    ax.set_xlabel("coverage")
    ax.set_ylabel("risk")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.set_title(f"AURC {float(rc.aurc):.4f}  AUGRC {float(rc.augrc):.4f}")
    ax.legend(loc="upper left")
    return ax


def risk_coverage_table(rc: Any, coverages: Sequence[float] = (0.5, 0.8, 0.9, 0.95, 1.0)) -> str:
    """A markdown table: the selective risk at each coverage, then AURC and AUGRC.

    Example:
        >>> import torch
        >>> from torchcal.functional import risk_coverage_curve
        >>> from torchcal.plotting import risk_coverage_table
        >>> rc = risk_coverage_curve(torch.tensor([0.9, 0.8, 0.8, 0.6]),
        ...                          torch.tensor([0.0, 1.0, 0.0, 1.0]))
        >>> print(risk_coverage_table(rc, (0.5, 1.0)))
        | coverage | risk |
        |---:|---:|
        | 0.5 | 0.2500 |
        | 1 | 0.5000 |
        | AURC | 0.2708 |
        | AUGRC | 0.1562 |
    """
    from torchcal.functional.selective import risk_at_coverage_of

    rows = ["| coverage | risk |", "|---:|---:|"]
    for c in coverages:
        rows.append(f"| {c:g} | {float(risk_at_coverage_of(rc, c)):.4f} |")
    rows.append(f"| AURC | {float(rc.aurc):.4f} |")
    rows.append(f"| AUGRC | {float(rc.augrc):.4f} |")
    return "\n".join(rows)
