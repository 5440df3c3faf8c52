"""The binned state computed by Spark from a DataFrame: the query of
:func:`~torchcal.engines.sql.state_sql` in the Spark dialect on a temporary view, so the
binning and the sums run on the executors; only the O(groups x bins) result is collected
(docs/design.md section 6f)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from torchcal.engines._names import locate_columns
from torchcal.engines.collect import EngineAudit, collect
from torchcal.engines.fine_sql import attach_fine, fine_query
from torchcal.engines.segments import with_segments
from torchcal.engines.sql import header_for, state_from_rows, state_sql
from torchcal.engines.state import BinnedState

__all__ = ["state_from_spark"]


#: the Spark types whose text is a group name (docs/design.md section 6c.2: strings as
#: written, integers as their decimal digits, on every engine); other types are refused
GROUP_TYPES = ("string", "tinyint", "smallint", "int", "bigint")


def checked_frame(df: Any, columns: Sequence[str | None], group: str | None) -> Any:
    """``df`` with each used column found by its exact name, once (Spark matches names
    without case: other columns whose names differ from a used one only in case are renamed
    by position, so ``P`` is never read as ``p``); a group column must hold strings or
    integers."""
    used = list(dict.fromkeys(c for c in columns if c))
    names = list(df.columns)
    locate_columns("the DataFrame", names, used)
    folded: dict[str, str] = {}
    for c in used:
        if folded.setdefault(c.lower(), c) != c:
            raise ValueError(
                f"{c}: the columns {folded[c.lower()]!r} and {c!r} differ only in case, which "
                f"Spark SQL cannot tell apart; rename one"
            )
    if any(n not in used and n.lower() in folded for n in names):
        df = df.toDF(*[n if n in used else f"_torchcal_column_{i}" for i, n in enumerate(names)])
    types = dict(df.dtypes)
    if group and types[group] not in GROUP_TYPES:
        raise ValueError(
            f"{group}: expected group names (strings or integers), got {types[group]} (a "
            f"group's text must not depend on the engine: docs/design.md section 6c.2)"
        )
    return df


def _text_columns(df: Any, columns: list[str | None]) -> list[str]:
    """The ``columns`` Spark holds as strings (parsed by the readers' rule in SQL)."""
    types = dict(df.dtypes)
    return [c for c in dict.fromkeys(columns) if c and types[c] == "string"]


def audit_spark(
    df: Any,
    *,
    preds: str | Sequence[str],
    label: str,
    group: str | None = None,
    weight: str | None = None,
    n_bins: int | None = None,
    sample_size: int = 20000,
    seed: int = 0,
    segments: dict[str, Any] | None = None,
) -> EngineAudit:
    """The audit's state, value grid, sample and text log (:func:`~torchcal.engines.collect
    .collect`) of a PySpark DataFrame, every query in the Spark dialect on a temporary view;
    string columns are parsed by the readers' rule (percents, ``True``/``False``)."""
    import pyspark

    cols = [preds] if isinstance(preds, str) else list(preds)
    df = checked_frame(df, [*cols, label, group, weight], group)
    text = _text_columns(df, [*cols, label, weight])
    view = f"torchcal_state_{uuid.uuid4().hex}"
    df.createOrReplaceTempView(view)

    def run(q: str) -> list[Any]:
        return [tuple(r) for r in df.sparkSession.sql(q).collect()]

    try:
        result = collect(
            run, view, preds=preds, label=label, group=group, weight=weight, n_bins=n_bins,
            dialect="spark", text=text, sample_size=sample_size, seed=seed,
            producer=f"spark {pyspark.__version__}",
        )  # fmt: skip
        kw = {"preds": preds, "label": label, "group": group, "weight": weight, "text": text}
        opts = segments and {**segments, "kw": {**kw, "dialect": "spark", "n_bins": n_bins or 10}}
        return with_segments(result, run, view, opts)
    finally:
        df.sparkSession.catalog.dropTempView(view)


def state_from_spark(
    df: Any,
    *,
    preds: str | Sequence[str],
    label: str,
    group: str | None = None,
    weight: str | None = None,
    n_bins: int = 10,
) -> BinnedState:
    """The binned state (binary reading, ``preds`` = P(y = 1)) of a PySpark DataFrame, with
    the column semantics of :func:`~torchcal.engines.duck.state_from_duckdb`; write it with
    :func:`~torchcal.engines.state.write_state` and audit it anywhere with
    ``torchcal audit --state FILE``.

    Spark sums doubles in the order its tasks finish: the last bits of a sum may differ from
    run to run (counts never do); merging states is exact (``math.fsum``).
    """
    import pyspark

    cols = [preds] if isinstance(preds, str) else list(preds)
    df = checked_frame(df, [*cols, label, group, weight], group)
    view = f"torchcal_state_{uuid.uuid4().hex}"
    df.createOrReplaceTempView(view)
    try:
        sql = state_sql(
            view,
            preds=preds,
            label=label,
            group=group,
            weight=weight,
            n_bins=n_bins,
            dialect="spark",
            text=_text_columns(df, [*cols, label, weight]),
        )
        rows = [tuple(r) for r in df.sparkSession.sql(sql).collect()]
        fine = fine_query(view, preds=preds, label=label, group=group, weight=weight,
                          dialect="spark", text=_text_columns(df, [*cols, label, weight]))  # fmt: skip
        fine_rows = [tuple(r) for r in df.sparkSession.sql(fine).collect()]  # ECCE, AUROC
    finally:
        df.sparkSession.catalog.dropTempView(view)
    header = header_for(
        preds,
        label,
        group=group,
        weight=weight,
        n_bins=n_bins,
        producer=f"spark {pyspark.__version__}",
    )
    return attach_fine(state_from_rows(rows, header), fine_rows)
