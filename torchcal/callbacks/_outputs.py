"""Reading predictions from what ``validation_step``/``test_step`` returned (the callbacks
never run a forward pass of their own), with an error that shows how to return them."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_binary_target, check_class_target, check_finite
from torchcal.scaling._base import check_logits_target

STEP_NAME = {"val": "validation_step", "test": "test_step"}
_EXAMPLE_VALUE = {"logits": "logits", "probs": "logits.softmax(-1)", "target": "y"}


def _contract_error(owner: str, stage: str, src: str, got: Any, keys: Sequence[str]) -> ValueError:
    if isinstance(got, Mapping):
        what = f"a dict with keys {sorted(map(str, got))}"
    elif got is None:
        what = "None"
    else:
        what = f"a {type(got).__name__}"
    ret = ", ".join(f'"{k}": {_EXAMPLE_VALUE.get(k, k)}' for k in keys)
    return ValueError(
        f"outputs: {owner} reads the predictions from what {src} returns (it never runs a "
        f"second forward pass) and needs the keys {', '.join(repr(k) for k in keys)}, but "
        f"{src} returned {what}. Return them, e.g.\n"
        f"    def {STEP_NAME[stage]}(self, batch, batch_idx):\n"
        f"        x, y = batch\n"
        f"        logits = self(x)\n"
        f"        ...\n"
        f"        return {{{ret}}}\n"
        f"or tell the callback your keys ({owner}(..._key=...)), or pass extract_fn=fn with "
        f"fn(pl_module, batch, outputs) -> a tuple in the order {tuple(keys)}."
    )


def read_outputs(
    owner: str,
    stage: str,
    pl_module: Any,
    batch: Any,
    outputs: Any,
    *,
    keys: Sequence[str],
    extract_fn: Callable[..., Any] | None,
) -> list[Tensor]:
    """The tensors under ``keys`` (detached), from ``outputs`` or from
    ``extract_fn(pl_module, batch, outputs)`` (a dict with ``keys`` or a tuple in their
    order)."""
    src = "extract_fn" if extract_fn is not None else STEP_NAME[stage]
    got = outputs if extract_fn is None else extract_fn(pl_module, batch, outputs)
    if isinstance(got, Mapping):
        if any(k not in got for k in keys):
            raise _contract_error(owner, stage, src, got, keys)
        vals = [got[k] for k in keys]
    elif extract_fn is not None and isinstance(got, (tuple, list)) and len(got) == len(keys):
        vals = list(got)
    else:
        raise _contract_error(owner, stage, src, got, keys)
    for k, v in zip(keys, vals):
        if not isinstance(v, Tensor):
            raise ValueError(f"{k}: expected a torch.Tensor from {src}, got {type(v).__name__}")
    return [v.detach() for v in vals]


def check_key(arg: str, value: Any) -> str:
    """A dict key of the step's output: a non-empty string."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{arg}: expected a non-empty string, got {value!r}")
    return value


def check_extract_fn(extract_fn: Any) -> Callable[..., Any] | None:
    """``None`` or a callable ``fn(pl_module, batch, outputs)``."""
    if extract_fn is not None and not callable(extract_fn):
        raise ValueError(
            f"extract_fn: expected a callable fn(pl_module, batch, outputs) or "
            f"None, got {type(extract_fn).__name__}"
        )
    return extract_fn


#: A multiclass row whose entries all lie in [0, 1] and sum to 1 within this tolerance looks
#: like a probability vector (float32 softmax rows sum to 1 within ~1e-6 * C).
PROBS_SUM_TOL = 1e-3


def check_logits_batch(owner: str, logits: Tensor, target: Tensor, *, values: bool) -> bool:
    """Check one batch of ``(logits, target)`` for a temperature fit; returns ``True`` for
    binary ``(B,)`` logits.

    Shapes and dtypes always (no host sync); with ``values=True`` (the first batch of an
    epoch, sanity check included) also NaN/``+inf`` logits, rows of only ``-inf``, label
    values, and a warning when every multiclass row lies in [0, 1] and sums to 1
    (probabilities passed as logits)."""
    binary = check_logits_target(logits, target)
    if not values:
        return binary
    check_finite("logits", logits, allow_neg_inf=True)
    if binary:
        check_binary_target("target", target)
        return binary
    check_class_target("target", target, int(logits.shape[1]))
    masked = torch.isneginf(logits).all(-1)
    if bool(masked.any()):
        raise ValueError(
            f"logits: expected at least one finite logit per row, row "
            f"{int(masked.nonzero()[0, 0])} is entirely -inf"
        )
    in_unit = bool(((logits >= 0) & (logits <= 1)).all())
    if in_unit and bool(((logits.double().sum(-1) - 1).abs() <= PROBS_SUM_TOL).all()):
        warnings.warn(
            f"logits: every row of the first validation batch lies in [0, 1] and sums to 1; "
            f"these look like probabilities, but {owner} needs the logits (before softmax): "
            f"return them from validation_step",
            UserWarning,
            stacklevel=3,
        )
    return binary
