"""Aligned plain-text tables: the form every table of the report takes."""

from __future__ import annotations

from collections.abc import Container, Sequence

__all__ = ["aligned"]


def aligned(rows: Sequence[Sequence[str]], left: Container[int] = (0, 1), rule: bool = False) -> str:
    """``rows`` (the header first) in columns two spaces apart: the columns in ``left`` (names) to
    the left, the others (numbers) to the right; ``rule``: a line of dashes under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(widths[i]) if i in left else cell.rjust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in rows
    ]
    if rule:
        lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
