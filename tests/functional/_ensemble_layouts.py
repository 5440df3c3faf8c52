"""The layouts of one ensemble shared by several targets, for the CRPS and PIT ensemble tests."""

from __future__ import annotations


def shared_layouts(m: int) -> list[tuple[tuple[int, ...], int, tuple[int, ...]]]:
    """``(samples shape, ensemble_dim, target shape)`` of ``m`` members that broadcast against
    a larger target: plain, with a leading or trailing 1, and over two batch dimensions."""
    return [
        ((m,), -1, (300,)),
        ((1, m), -1, (300,)),
        ((m, 1), 0, (300,)),
        ((4, 1, m), -1, (4, 75)),
        ((1, 5, m), -1, (60, 5)),
        ((m,), -1, (6, 50)),
    ]
