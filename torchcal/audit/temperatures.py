"""The temperatures of ``torchcal fit-temperature``: :func:`fit_temperature_file` fits them
on all rows (pooled, and per group), :func:`load_temperatures` reads a saved file back."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_option
from torchcal.functional.calibration.readings import INPUTS

__all__ = ["fit_temperature_file", "load_temperatures"]

#: the ``format`` entry of a file written by ``torchcal fit-temperature -o``
TEMPERATURE_FORMAT = "torchcal.temperatures/1"


def fit_temperature_file(
    preds: Tensor,
    target: Tensor,
    groups: Tensor | None = None,
    group_names: list[str] | None = None,
    *,
    input: str = "probs",
) -> dict[str, Any]:
    """Fit a temperature on all rows (pooled, and per group with ``groups``), as
    ``torchcal fit-temperature`` does; returns the dict it saves: ``format``
    (:data:`TEMPERATURE_FORMAT`), ``input``, ``n``, ``pooled`` (T), ``temperatures``
    (``{group name: T}``; ``{"pooled": T}`` without groups), ``clamped`` (probabilities of
    exactly 0 or 1 given logits +-36.74) and ``state_dict`` (the scaler's).

    Example:
        >>> import torch
        >>> z = torch.randn(400, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> y = (torch.rand(400, generator=torch.Generator().manual_seed(1)) < torch.sigmoid(z)).long()
        >>> fit = fit_temperature_file(z * 3, y, input="logits")
        >>> sorted(fit["temperatures"]), 2 < fit["pooled"] < 5
        (['pooled'], True)
    """
    from torchcal.functional.decision import probs_to_logits
    from torchcal.scaling.group import GroupTemperatureScaler
    from torchcal.scaling.temperature import TemperatureScaler

    check_option("input", input, INPUTS)
    z, clamped = preds, 0
    if input == "probs":
        z, clamped = probs_to_logits(preds, binary=preds.dim() == 1)
    pooled = TemperatureScaler(method="newton")
    pooled.fit(z, target)
    out: dict[str, Any] = {
        "format": TEMPERATURE_FORMAT,
        "input": input,
        "n": int(target.numel()),
        "pooled": float(pooled.temperature),
        "temperatures": {"pooled": float(pooled.temperature)},
        "clamped": clamped,
        "state_dict": pooled.state_dict(),
    }
    if groups is not None:
        names = (
            list(group_names)
            if group_names is not None
            else [str(i) for i in range(int(groups.max()) + 1)]
        )
        per = GroupTemperatureScaler(len(names))
        per.fit(z, target, groups)
        out["temperatures"] = dict(zip(names, (float(t) for t in per.temperatures), strict=True))
        out["state_dict"] = per.state_dict()
    return out


def load_temperatures(path: Any) -> dict[str, float]:
    """The ``{group name: T}`` of a file written by ``torchcal fit-temperature -o`` (or
    ``{"pooled": T}``); ``ValueError`` for any other file.

    Example:
        >>> import tempfile, torch
        >>> z = torch.randn(300, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> y = (torch.rand(300, generator=torch.Generator().manual_seed(1)) < torch.sigmoid(z)).long()
        >>> g = torch.arange(300) % 2
        >>> path = tempfile.mkdtemp() + "/t.pt"
        >>> torch.save(fit_temperature_file(z, y, g, ["a/b", "c"], input="logits"), path)
        >>> sorted(load_temperatures(path))
        ['a/b', 'c']
    """
    try:
        d = torch.load(path, weights_only=True)
    except Exception as e:
        raise ValueError(
            f"{path}: not a temperature file of torchcal fit-temperature ({e})"
        ) from None
    if not isinstance(d, dict) or d.get("format") != TEMPERATURE_FORMAT:
        raise ValueError(f"{path}: not a temperature file of torchcal fit-temperature")
    return {str(k): float(v) for k, v in d["temperatures"].items()}
