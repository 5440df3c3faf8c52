"""The temperature fit's data checks, with global positions (docs/design.md section 4).

Labels are checked on every chunk (cheap); logits only when a pass's float64 sums come out
non-finite (:func:`check_stats`), which then scans the data again to name the position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from torchcal.functional._checks import first_bad_position, values_checked
from torchcal.functional.temperature.chunks import Chunk


def _where(bad: Tensor, offset: int) -> str:
    pos = first_bad_position(bad)
    if bad.dim() <= 1:
        return str(int(pos) + offset)
    first, rest = pos[1:-1].split(",", 1)
    return f"({int(first) + offset},{rest})"


def validate_labels(chunk: Chunk, binary: bool, num_classes: int | None) -> None:
    """Labels in range; cheap (O(rows)), run on every chunk of every streamed pass (group ids
    are checked once, up front, by :class:`~torchcal.scaling.GroupTemperatureScaler`)."""
    y = chunk.target
    if binary:
        if values_checked():
            bad = (y != 0) & (y != 1)
            if bool(bad.any()):
                val = y[bad][0].item()
                raise ValueError(
                    f"target: expected binary labels in {{0, 1}}, got {val!r} at "
                    f"position {_where(bad, chunk.offset)}"
                )
    else:
        assert num_classes is not None
        bad = (y < 0) | (y >= num_classes)
        if bool(bad.any()):  # always checked: gather would fail with an opaque index error
            val = int(y[bad][0])
            raise ValueError(
                f"target: expected class indices in [0, {num_classes - 1}], got "
                f"{val} at position {_where(bad, chunk.offset)}"
            )


def validate_logits(chunk: Chunk, binary: bool) -> None:
    """NaN/+Inf logits and masked targets, with global positions.

    The passes do not run this (it would cost a sixth of a pass): a bad value makes the
    float64 sums non-finite, and only then is the data scanned again with this check to
    name the position (see :func:`check_stats`).
    """
    x, y = chunk.logits, chunk.target
    bad = torch.isnan(x) | torch.isposinf(x)
    if bool(bad.any()):
        raise ValueError(
            f"logits: expected finite values or -inf masks, found NaN or +Inf at "
            f"position {_where(bad, chunk.offset)}"
        )
    if binary:
        bad = torch.isneginf(x) & (y == 1)
        if bool(bad.any()):
            raise ValueError(
                f"logits: a -inf (masked) logit has target 1 at position "
                f"{_where(bad, chunk.offset)}; its likelihood is 0"
            )
    else:
        validate_masked_target(chunk)


def validate_masked_target(chunk: Chunk) -> None:
    """Multiclass: no row's target class may be masked (``-inf``: its likelihood is 0)."""
    zy = chunk.logits.gather(1, chunk.target.unsqueeze(1)).squeeze(1)
    bad = torch.isneginf(zy)
    if bool(bad.any()):
        raise ValueError(
            f"logits: the target class is masked (-inf) at row "
            f"{_where(bad, chunk.offset)}; its likelihood is 0"
        )


def check_stats(stats: Tensor, chunks: Callable[[], Iterable[Chunk]], binary: bool) -> None:
    """Raise a positioned error if a pass produced non-finite sums (NaN/+Inf/masked target)."""
    if bool(torch.isfinite(stats).all()):
        return
    for chunk in chunks():
        validate_logits(chunk, binary)
    raise ValueError(
        "logits: the NLL is not finite: NaN or +Inf logits on another rank, or "
        "logits whose differences overflow float64"
    )
