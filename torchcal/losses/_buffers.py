"""The base of every loss: floating buffers keep their dtype under ``.to(dtype)``.

A quantile level 0.9 must not become 0.898 in bfloat16: every loss keeps its floating
buffers (class ``weight``, quantile levels, ``alpha``) in the dtype they were given under
``.to(dtype)``, ``.half()``, ``.bfloat16()``, ``.double()`` and Lightning's true-precision
plugins (which call ``module.to(dtype)``). ``.to(device)`` still moves them; state dicts are
unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn


class KeepBufferDtype(nn.Module):
    """A module whose floating buffers follow device moves but never dtype casts."""

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> nn.Module:
        before = {
            name: buf
            for name, buf in self._buffers.items()
            if buf is not None and buf.is_floating_point()
        }
        super()._apply(fn, recurse)
        for name, old in before.items():
            new = self._buffers[name]
            if new is not None and new.dtype != old.dtype:
                self._buffers[name] = old.to(device=new.device)
        return self
