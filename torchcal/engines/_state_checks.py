"""The rules a state keeps, applied when one is read (docs/design.md section 6f): a header that
is what it says (every field of its type and range), cells that the rows could have produced
(the metrics' state rules: counts are whole and positive, ``0 <= sum_y <= n``, ``sum_c`` inside
its bin's range, finite sums, ...) and a size bound checked before anything is allocated.
Each failure is one ``ValueError`` naming the file and the field or the cell.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

#: the most bins a state (and an audit) holds (torchcal.audit.state.MAX_BINS)
MAX_BINS = 10_000
#: the most (group, slot, bin) cells a dense state holds: 2^24 cells of ~9 float64 arrays are
#: ~1.2 GB, the bound on what a state file (or an engine's result) may make us allocate
MAX_CELLS = 1 << 24
#: the largest count read exactly by the float64 estimators
MAX_COUNT = 1 << 53
READINGS = ("binary", "confidence", "top_label", "classwise")
INPUTS = ("probs", "logits")
#: relative slack of the cell bounds (float64 sums of up to 2^53 terms, compensated or not)
REL = 1e-9


def check_cells(groups: int, slots: int, n_bins: int, where: str) -> None:
    """``ValueError`` naming ``where`` unless ``groups * slots * n_bins <= MAX_CELLS``."""
    cells = int(groups) * int(slots) * int(n_bins)
    if cells > MAX_CELLS:
        raise ValueError(
            f"{where}: {groups:,} groups x {slots:,} slots x {n_bins:,} bins = {cells:,} cells, "
            f"more than the {MAX_CELLS:,} a state may hold (~1.2 GB; docs/design.md section "
            f"6f): use fewer bins or groups"
        )


def parse_header(raw: bytes, where: str) -> dict[str, Any]:
    """The header JSON as a dict (``ValueError`` naming ``where`` when it is not one)."""
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: the state header is not JSON ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{where}: the state header is a JSON {type(d).__name__}, not an object")
    return d


def _int(d: dict[str, Any], key: str, where: str, lo: int, hi: int) -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(
            f"{where}: header field {key} must be an integer in [{lo}, {hi}], got {v!r}"
        )
    return v


def _str(d: dict[str, Any], key: str, where: str, choices: Any = None, null: bool = False) -> None:
    v = d[key]
    if v is None and null:
        return
    if not isinstance(v, str) or (choices is not None and v not in choices):
        want = f"one of {tuple(choices)}" if choices is not None else "a string"
        raise ValueError(f"{where}: header field {key} must be {want}, got {v!r}")


def check_header(d: dict[str, Any], where: str, expect: dict[str, Any]) -> None:
    """Every field of a header dict of its type and range; ``expect`` the fixed ones
    (``schema_version``, ``kind``, ``bin_rule``)."""
    for key, want in expect.items():
        v = d[key]
        if type(v) is not type(want) or v != want:
            raise ValueError(
                f"{where}: {key} is {v!r}, this torchcal reads {want!r} (a header field)"
            )
    _int(d, "n_bins", where, 1, MAX_BINS)
    _str(d, "reading", where, READINGS)
    _str(d, "input", where, INPUTS)
    _int(d, "num_classes", where, 0, MAX_CELLS)
    if d["reading"] in ("top_label", "classwise") and d["num_classes"] < 1:
        raise ValueError(f"{where}: header field num_classes must be >= 1 for {d['reading']}")
    _str(d, "group", where, null=True)
    _str(d, "weight", where, null=True)
    if not isinstance(d.get("columns") or {}, dict):
        raise ValueError(f"{where}: header field columns must be an object")
    _int(d, "rows_seen", where, 0, MAX_COUNT)
    rej = d["rows_rejected"]
    if not isinstance(rej, dict):
        raise ValueError(f"{where}: header field rows_rejected must be an object")
    for k in rej:
        _int(rej, k, f"{where}: rows_rejected", 0, MAX_COUNT)
    if "rows_saturated" in d:
        _int(d, "rows_saturated", where, 0, MAX_COUNT)
    if "producer" in d:
        _str(d, "producer", where)


def check_reasons(rejected: dict[str, int], reasons: tuple[str, ...], where: str) -> None:
    """Every rejection reason a known one."""
    unknown = sorted(set(rejected) - set(reasons))
    if unknown:
        raise ValueError(
            f"{where}: header field rows_rejected names unknown reasons {unknown} (known: "
            f"{', '.join(reasons)})"
        )


def _whole(v: np.ndarray, name: str, where: str) -> np.ndarray:
    """An integer column (a float one must hold whole numbers), as int64."""
    if np.issubdtype(v.dtype, np.integer):
        return v.astype(np.int64)
    f = np.asarray(v, dtype=np.float64)
    bad = ~np.isfinite(f) | (f != np.floor(f)) | (np.abs(f) > MAX_COUNT)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{where}: cell {i}: {name} must be a whole number, got {f[i].item()!r}")
    return f.astype(np.int64)


def cell_indices(d: dict[str, np.ndarray], where: str) -> tuple[np.ndarray, ...]:
    """``n``, ``slot``, ``bin`` as int64 (whole numbers), groups as strings (no null)."""
    for i, g in enumerate(d["group"].tolist()):
        if not isinstance(g, str):
            raise ValueError(f"{where}: cell {i}: group must be a string, got {g!r}")
    n, slot, b = (_whole(d[c], c, where) for c in ("n", "slot", "bin"))
    return n, slot, b


def _fail(where: str, mask: np.ndarray, msg: str, d: dict[str, np.ndarray]) -> None:
    if mask.any():
        i = int(np.flatnonzero(mask)[0])
        cell = f"cell {i} (group {d['group'][i]!r}, slot {d['slot'][i]}, bin {d['bin'][i]})"
        raise ValueError(f"{where}: {cell}: {msg}")


def check_cell_values(
    d: dict[str, np.ndarray], n: np.ndarray, b: np.ndarray, B: int, weighted: bool, where: str
) -> None:
    """The metrics' state rules on every cell (``d`` the columns as numpy arrays)."""
    _fail(
        where,
        (n < 1) | (n > MAX_COUNT),
        f"n must be in [1, 2^53], got {_first(n, (n < 1) | (n > MAX_COUNT))}",
        d,
    )
    if int(n.astype(object).sum()) > MAX_COUNT:
        raise ValueError(f"{where}: the cells' n add up to more than 2^53 rows")
    sums = ("sum_c", "sum_y", "sum_c2", "sum_cy") + (("sum_w",) if weighted else ())
    f = {c: np.asarray(d[c], dtype=np.float64) for c in sums}
    for name in sums:
        bad = ~np.isfinite(f[name])
        _fail(where, bad, f"{name} must be finite, got {_first(f[name], bad)}", d)
    m = f["sum_w"] if weighted else n.astype(np.float64)  # each cell's mass
    _fail(where, m < 0, f"sum_w must be >= 0, got {_first(m, m < 0)}", d)
    tol = REL * m
    lo, hi = b / B, (b + 1) / B
    y, c = f["sum_y"], f["sum_c"]
    _fail(where, (y < -tol) | (y > m + tol), "sum_y must lie in [0, n] (weighted: [0, sum_w])", d)
    _fail(where, (c < m * lo - tol) | (c > m * hi + tol),
          f"sum_c must lie in its bin's range [n * bin / {B}, n * (bin + 1) / {B}] "
          f"(weighted: sum_w for n; a lying n_bins?)", d)  # fmt: skip
    c2 = f["sum_c2"]
    _fail(where, (c2 < m * lo * lo - tol) | (c2 > m * hi * hi + tol),
          "sum_c2 must lie in its bin's range [n (bin / B)^2, n ((bin + 1) / B)^2]", d)  # fmt: skip
    cy = f["sum_cy"]
    _fail(where, (cy < y * lo - tol) | (cy > y * hi + tol),
          "sum_cy must lie in [sum_y * bin / B, sum_y * (bin + 1) / B]", d)  # fmt: skip
    if weighted and "sum_w2" in d:
        w2 = np.asarray(d["sum_w2"], dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            low, high = m * m / n, m * m
        bad = ~np.isfinite(w2) | (w2 < low * (1 - REL)) | (w2 > high * (1 + REL))
        _fail(where, bad, "sum_w2 must be finite and in [sum_w^2 / n, sum_w^2]", d)
    _check_optional(d, m, tol, where)


def _first(v: np.ndarray, mask: np.ndarray) -> Any:
    i = np.flatnonzero(mask)
    return v[i[0]].item() if len(i) else None


def _check_optional(d: dict[str, np.ndarray], m: np.ndarray, tol: np.ndarray, where: str) -> None:
    """``nll`` (null, or >= 0: +inf where a label had probability 0) and ``right`` (null, or
    in [0, n]) are either null in every cell or in none."""
    for name in ("nll", "right"):
        v = np.asarray(d[name], dtype=np.float64)
        null = np.isnan(v)
        if null.all():
            continue
        _fail(where, null, f"{name} is null in some cells but not in others", d)
        bad = v < 0 if name == "nll" else ~np.isfinite(v) | (v < -tol) | (v > m + tol)
        rng = ">= 0" if name == "nll" else "in [0, n] (weighted: [0, sum_w])"
        _fail(where, bad, f"{name} must be {rng}, got {_first(v, bad)}", d)
    if "nll_inf" in d:  # rows of the cell: whole, in [0, n]; then nll is finite
        v = np.asarray(d["nll_inf"], dtype=np.float64)
        n = np.asarray(d["n"], dtype=np.float64)
        bad = ~np.isfinite(v) | (v < 0) | (v > n) | (v != np.floor(v))
        _fail(where, bad, f"nll_inf must be a whole number in [0, n], got {_first(v, bad)}", d)
        nll = np.asarray(d["nll"], dtype=np.float64)
        _fail(where, np.isinf(nll), "nll must be finite where nll_inf counts the rest", d)


def check_rows(header: Any, kept: int, where: str) -> None:
    """The header's row counts agree with the cells: ``rows_seen`` = kept + rejected, and
    ``rows_saturated`` <= kept."""
    rejected = sum(header.rows_rejected.values())
    if header.rows_seen != kept + rejected:
        raise ValueError(
            f"{where}: header field rows_seen is {header.rows_seen}, but the cells hold {kept} "
            f"rows and rows_rejected {rejected} (they must add up)"
        )
    if header.rows_saturated > kept:
        raise ValueError(
            f"{where}: header field rows_saturated is {header.rows_saturated}, more than the "
            f"{kept} rows the cells hold"
        )
