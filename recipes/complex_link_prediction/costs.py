"""The time and memory of one fit: wall seconds and the peak resident memory it added.

Peak memory is read from Linux's ``VmHWM`` (the process's resident high-water mark), which
``/proc/self/clear_refs`` resets to the current resident size just before the fit: the peak
during the fit minus the resident size before it is what the fit added (tensors included,
which ``tracemalloc`` does not see). Where that interface is missing (not Linux) the
``tracemalloc`` peak of Python allocations is reported instead and ``memory_source`` says so.
Both are timing-like numbers: they vary between runs and live under the report's timing keys.
"""

from __future__ import annotations

import contextlib
import time
import tracemalloc
from collections.abc import Iterator

__all__ = ["measure"]

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _status_kb(field: str) -> int | None:
    try:
        with open(_STATUS, encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open(_CLEAR_REFS, "w", encoding="ascii") as fh:
            fh.write("5")  # reset VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        return False
    return _status_kb("VmHWM") is not None


@contextlib.contextmanager
def measure(out: dict[str, dict[str, object]], name: str) -> Iterator[None]:
    """Time the block and record its added peak memory as ``out[name] = {"seconds": ...,
    "peak_mb": ..., "process_peak_mb": ..., "memory_source": "rss" | "tracemalloc"}``
    (``peak_mb``: what the block added to the resident peak; ``process_peak_mb``: the whole
    process's resident peak during the block, ``None`` without ``VmHWM``). Memory that the
    allocator reuses from earlier, freed allocations is already resident and adds nothing, so
    ``peak_mb`` is a lower bound of the block's working memory.

    Example:
        >>> costs = {}
        >>> with measure(costs, "nothing"):
        ...     pass
        >>> sorted(costs["nothing"]), costs["nothing"]["peak_mb"] >= 0
        (['memory_source', 'peak_mb', 'process_peak_mb', 'seconds'], True)
    """
    rss = _reset_peak()
    before = _status_kb("VmRSS") if rss else None
    if before is None:
        rss = False
        tracemalloc.start()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        seconds = time.perf_counter() - t0
        process_mb: float | None = None
        if rss and before is not None:
            peak = _status_kb("VmHWM") or before
            added_mb = max(0, peak - before) / 1024
            process_mb = peak / 1024
            source = "rss"
        else:
            _, peak_b = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            added_mb = peak_b / 2**20
            source = "tracemalloc"
        out[name] = {
            "seconds": seconds,
            "peak_mb": added_mb,
            "process_peak_mb": process_mb,
            "memory_source": source,
        }
