"""Griffe extension: read torchcal's docstrings (Google style with a few reST habits) as the
API pages render them, without changing the source.

* ``Example:`` (singular) is read as the ``Examples:`` section, so its doctest renders as code
  (and brackets in its output are not read as Markdown links);
* the reST roles ``:func:`~a.b.c``` / ``:class:`a.b.C``` become code spans `` `c` ``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|obj|exc):`~?([^`]+)`")
EXAMPLE = re.compile(r"^(\s*)Example:\s*$", flags=re.M)


def _short(match: re.Match[str]) -> str:
    target = match[1]
    return f"``{target.rsplit('.', 1)[-1] if match[0].count('~') else target}``"


class TorchcalDocstrings(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = ROLE.sub(_short, text)
