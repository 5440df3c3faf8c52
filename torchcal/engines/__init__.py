"""Audits where the data lives: the binned state as a portable table (docs/design.md 6f).

* :mod:`.state`: :class:`BinnedState` (the long-format Arrow/Parquet table and its header),
  :func:`read_state`, :func:`write_state`, :func:`merge_states`;
* :mod:`.sql`: :func:`state_sql`, the one query per dialect (DuckDB, Spark, BigQuery,
  Snowflake) generated from the bin rule;
* :mod:`.duck`: :func:`state_from_duckdb` (Parquet/CSV paths and globs, DuckDB tables);
* :mod:`.spark`: :func:`state_from_spark` (a Spark DataFrame);
* :mod:`.memory`: :func:`state_from_arrays`, :func:`state_from_files` (pyarrow, in process),
  :func:`state_from_metric` (a torchcal metric's local statistics, e.g. one DDP rank's).

DuckDB and PySpark are optional and imported only when used.
"""

from torchcal.engines.duck import state_from_duckdb
from torchcal.engines.memory import state_from_arrays, state_from_files, state_from_metric
from torchcal.engines.spark import state_from_spark
from torchcal.engines.sql import DIALECTS, state_sql
from torchcal.engines.state import (
    BinnedState,
    StateHeader,
    merge_states,
    read_state,
    read_states,
    write_state,
)

__all__ = [
    "DIALECTS",
    "BinnedState",
    "StateHeader",
    "merge_states",
    "read_state",
    "read_states",
    "state_from_arrays",
    "state_from_duckdb",
    "state_from_files",
    "state_from_metric",
    "state_from_spark",
    "state_sql",
    "write_state",
]
