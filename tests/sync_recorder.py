"""Record the torch functions and tensor methods a call uses (``TorchFunctionMode``), to prove
on the CPU that a device code path never synchronises the host.

Import as ``from sync_recorder import Recorder, SYNC_NAMES`` from any test directory
(``tests/`` is on ``sys.path`` through ``tests/conftest.py``).
"""

from __future__ import annotations

from typing import Any

from torch.overrides import TorchFunctionMode

#: methods / functions that read a device value on the host (a host-device synchronisation)
SYNC_NAMES = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy"}
SYNC_NAMES |= {"nonzero", "argwhere", "masked_select", "unique", "__len__"}
#: ops whose CUDA kernels read a value on the host to size their output
SIZING_NAMES = {"bincount", "histc", "repeat_interleave"}


class Recorder(TorchFunctionMode):
    """Records the name of every torch function / tensor method called from Python."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))

    def syncs(self, extra: set[str] = SIZING_NAMES) -> list[str]:
        """The recorded names that synchronise a device (``SYNC_NAMES`` and ``extra``)."""
        return [n for n in self.names if n in SYNC_NAMES | extra]
