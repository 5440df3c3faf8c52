"""The checkpoint state the torchcal callbacks share: their ``history`` list."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback
from typing_extensions import override

__all__ = ["HistoryCallback"]


class HistoryCallback(Callback):
    """A callback whose checkpoint state is :attr:`history` (one plain dict per record), so a
    resumed run keeps it."""

    history: list[dict[str, Any]]

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"history": [dict(h) for h in self.history]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [dict(h) for h in state_dict.get("history", [])]
