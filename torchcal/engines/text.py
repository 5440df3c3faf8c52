"""How a text value reads as a number, a stated confidence or a label: the one definition
(docs/design.md section 6c.1) that the audit's readers (CSV, Parquet string columns), the
in-process engine and the SQL of every dialect (:func:`torchcal.engines.sql.text_value_sql`,
written from the same patterns) apply.

* **number**: ASCII decimal digits with an optional sign, fraction and exponent (``1``,
  ``-0.5``, ``.5``, ``5.``, ``1e-3``, ``1E+3``), or ``nan``/``inf``/``infinity`` in any ASCII
  case with an optional sign, ``nan`` also with a payload (``nan(1)``, as pyarrow and DuckDB
  read it); these read, then the row rules reject them. Not numbers: digit separators
  (``0_8``), non-ASCII digits or letters (``ınf``), hex, an empty field.
* **stated** (a confidence column): a number, or a percent: a plain decimal (sign, digits,
  fraction; no exponent) then ``%``, white space allowed before the ``%``: ``85%`` and
  `` 85 % `` = 0.85, the decimal divided by 100 exactly and rounded once.
* **label**: a number, or ``True``/``False`` in any case (1/0, as pandas writes booleans).

White space around a value is Python's ``str.strip()`` (``str.isspace``: the 29 code points of
:data:`~torchcal.engines.rules.WHITE_SPACE`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal

import numpy as np

#: how a column's text values read (see the module docstring)
NUMBER, STATED, LABEL = "number", "stated", "label"
TEXT_KINDS = (NUMBER, STATED, LABEL)

#: the patterns, on the stripped text (``\s``: white space, :func:`~torchcal.engines.sql.
#: text_value_sql` writes it as the explicit class for RE2 and Java): a number whose text
#: a ``CAST(... AS DOUBLE)`` and Python's ``float`` read alike, ``nan`` with a payload (read
#: as NaN), a percent
NUMBER_RE = r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(?i:inf(?:inity)?|nan))"
NAN_PAYLOAD_RE = r"[+-]?(?i:nan)\([0-9A-Za-z_]*\)"
PERCENT_RE = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*%"

# re.ASCII: a case-insensitive ``inf`` must not match ``ınf`` (U+0131), which float() rejects
_NUMBER = re.compile(NUMBER_RE, re.ASCII)
_NAN_PAYLOAD = re.compile(NAN_PAYLOAD_RE, re.ASCII)
_PERCENT = re.compile(PERCENT_RE)
_BOOLS = {"true": 1.0, "false": 0.0}


def parse_number(text: str) -> float | None:
    """``text`` as a float by the number syntax, or None.

    Example:
        >>> [parse_number(t) for t in ["0.5", " .5 ", "1e-3", "-inf", "0_8", "", "٣"]]
        [0.5, 0.5, 0.001, -inf, None, None, None]
    """
    t = text.strip()
    if _NUMBER.fullmatch(t):
        return float(t)
    if _NAN_PAYLOAD.fullmatch(t):
        return float("nan")
    return None


def parse_value(text: str, kind: str) -> float | None:
    """A text field as a float for a column of ``kind`` (``"number"``, ``"stated"``: also a
    percent, ``"label"``: also ``True``/``False``), or None when it does not parse.

    Example:
        >>> parse_value(" 85 % ", "stated"), parse_value("85%", "number")
        (0.85, None)
        >>> parse_value("True", "label"), parse_value("yes", "label")
        (1.0, None)
    """
    v = parse_number(text)
    if v is not None or kind == NUMBER:
        return v
    t = text.strip()
    if kind == LABEL:
        return _BOOLS.get(t.lower())
    if kind == STATED and _PERCENT.fullmatch(t):
        return float(Decimal(t[:-1].rstrip()).scaleb(-2))  # exact decimal / 100, rounded once
    return None


def parse_text(values: Sequence[str | None], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """``values`` (text, ``None`` = NULL) as float64 by :func:`parse_value` (NaN where
    missing or unparsed), and the mask of unparsed values: the in-process twin of the SQL.

    Example:
        >>> v, bad = parse_text(["85%", " .5 ", "high", None, "0_8"], "stated")
        >>> v.tolist()[:2], bad.tolist()
        ([0.85, 0.5], [False, False, True, False, True])
    """
    if kind not in TEXT_KINDS:
        raise ValueError(f"kind: expected one of {TEXT_KINDS}, got {kind!r}")
    out = np.full(len(values), np.nan)
    bad = np.zeros(len(values), bool)
    for i, raw in enumerate(values):
        if raw is None:
            continue
        v = parse_value(raw, kind)
        if v is None:
            bad[i] = True
        else:
            out[i] = v
    return out, bad
