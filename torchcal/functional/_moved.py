"""Names that moved: served from their old path for one release, with a ``FutureWarning``.

A module that lost names sets ``__getattr__ = moved(__name__, {name: (module, new_path)})``
(PEP 562): ``module`` defines the name, ``new_path`` is where users import it from now.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping


def moved(old: str, names: Mapping[str, tuple[str, str]]) -> Callable[[str], object]:
    """A module ``__getattr__`` that serves each moved name with a ``FutureWarning``.

    Example:
        >>> import warnings
        >>> getter = moved("old.place", {"sqrt": ("math", "math")})
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     getter("sqrt")(4.0)
        2.0
        >>> str(seen[0].message)
        'old.place.sqrt moved: import it from math (the old path goes in the next release)'
    """

    def __getattr__(name: str) -> object:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        module, new_path = names[name]
        warnings.warn(
            f"{old}.{name} moved: import it from {new_path} (the old path goes in the next "
            "release)",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), name)

    __getattr__.moved = dict(names)  # type: ignore[attr-defined]  # what it serves, for tests
    return __getattr__
