"""Reading predictions from what ``validation_step``/``test_step`` returned (the callbacks
never run a forward pass of their own), with an error that shows how to return them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor

__all__ = ["STEP_NAME", "check_extract_fn", "check_key", "read_outputs"]

STEP_NAME = {"val": "validation_step", "test": "test_step"}
_EXAMPLE_VALUE = {"logits": "logits", "probs": "logits.softmax(-1)", "target": "y"}


def _contract_error(owner: str, stage: str, src: str, got: Any, keys: Sequence[str]
                    ) -> ValueError:
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
        f"fn(pl_module, batch, outputs) -> a tuple in the order {tuple(keys)}.")


def read_outputs(owner: str, stage: str, pl_module: Any, batch: Any, outputs: Any, *,
                 keys: Sequence[str], extract_fn: Callable[..., Any] | None) -> list[Tensor]:
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
        raise ValueError(f"extract_fn: expected a callable fn(pl_module, batch, outputs) or "
                         f"None, got {type(extract_fn).__name__}")
    return extract_fn
