"""The ``torchcal audit`` options of the segments (docs/design.md section 6g.1), kept out of
``torchcal/cli.py`` and free of torch imports (the parser answers ``--help`` without torch)."""

from __future__ import annotations

import argparse
from typing import Any


def add_segment_arguments(p: argparse.ArgumentParser, count: Any) -> None:
    """Add ``--segments``, ``--segment-bins``, ``--depth`` and ``--min-segment`` to ``p``
    (``count`` parses a positive integer)."""
    p.add_argument(
        "--segments", nargs="+", metavar="COL", default=(),
        help="also judge every cross of these columns up to --depth (categorical as they are, "
        "numeric in quantile buckets): a segment can FAIL the audit (Holm with the groups)",
    )  # fmt: skip
    p.add_argument("--segment-bins", type=count, default=4, metavar="K",
                   help="quantile buckets of a numeric segment column")  # fmt: skip
    p.add_argument("--depth", type=count, default=2, metavar="D",
                   help="most segment columns crossed")  # fmt: skip
    p.add_argument("--min-segment", type=count, default=200, metavar="N",
                   help="segments with fewer rows are skipped (and counted)")  # fmt: skip


def segment_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The segment fields of ``AuditSettings`` from the parsed arguments."""
    return {
        "segments": tuple(getattr(args, "segments", None) or ()),
        "segment_bins": getattr(args, "segment_bins", 4),
        "depth": getattr(args, "depth", 2),
        "min_segment": getattr(args, "min_segment", 200),
    }
