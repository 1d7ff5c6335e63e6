"""Integer helpers every layer uses (sizes, grids, alignments)."""
from __future__ import annotations

__all__ = ["ceil_div", "round_up"]


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, b > 0 (exact for any size, unlike float division)."""
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    """``a`` rounded up to a multiple of ``b`` (b > 0)."""
    return -(-a // b) * b
