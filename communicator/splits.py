"""How ranks form groups: the rules of ``new_group`` and ``split``.

Pure functions of rank numbers, so that every rank computes the same groups from the same inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

from communicator.errors import CollectiveMismatchError

__all__ = ["groups_of", "same_members"]


def same_members(everyone: Sequence[list[int]]) -> None:
    """Every rank raises the same error when the ranks passed different member lists."""
    if any(other != everyone[0] for other in everyone):
        sides = {r: f"new_group({other})" for r, other in enumerate(everyone)}
        raise CollectiveMismatchError(sides, "new_group: ranks passed different member lists")


def groups_of(pairs: Sequence[tuple[int | None, int]]) -> list[list[int]]:
    """The groups of a split: rank ``r`` passed ``pairs[r] = (color, key)``; each colour makes a
    group, ordered by key then rank; ``None`` joins none. Groups come in the order of their colours."""
    colors = sorted({color for color, _ in pairs if color is not None})
    return [[r for _, r in sorted((key, r) for r, (c, key) in enumerate(pairs) if c == each)] for each in colors]
