"""How a communicator splits into groups: ``new_group``, ``split``, ``grid`` and ``local_comm``
(a mixin of ``Communicator``), and the rules by which ranks form the groups.

Pure functions of rank numbers, so that every rank computes the same groups from the same inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar, cast

from communicator.arguments import check_grid, check_members, check_split
from communicator.config import Timeout
from communicator.errors import CollectiveMismatchError
from communicator.guard import CallState, collective

__all__ = ["Splittable", "Splitting", "groups_of", "same_members"]


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


T = TypeVar("T")
C = TypeVar("C")  # the communicator class this is mixed into: what the operations return


class Splittable(Protocol):
    """What the split operations use of the communicator they are mixed into."""

    _children: list[Any]
    _local: Any
    _calls: CallState

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def local_rank(self) -> int: ...

    @property
    def node_rank(self) -> int: ...

    def all_gather_object(self, obj: T) -> list[T]: ...

    def split(self, color: int | None, key: int | None = None) -> Any: ...

    def _create_groups(self, groups: list[list[int]]) -> Any: ...

    def _subgroup(self, groups: list[list[int]]) -> Any: ...


class Splitting(Generic[C]):
    """Subgroups, written once over the ``_create_groups`` primitive; ``C`` is the class mixed into."""

    def _subgroup(self: Splittable, groups: list[list[int]]) -> Any:
        comm = self._create_groups(groups)
        self._children.append(comm)
        calls: CallState = comm._calls
        calls.up = self._calls  # its operations reach this communicator's statistics and hooks
        calls.group = "ranks " + ",".join(map(str, comm.global_ranks)) if comm.is_member else "outside"
        return comm

    @collective("ranks")
    def new_group(self: Splittable, ranks: Sequence[int], *, timeout: Timeout | None = None) -> C:
        """A communicator over ``ranks`` (ranks of this communicator, in the new ranks' order).

        Every rank calls it with the same list; the others get a
        :class:`~communicator.transports.nonmember.NonMemberComm`.

        Example:
            ```python
            # 4 ranks
            sub = comm.new_group([3, 1])        # ranks 3 and 1: rank 0 and 1 of sub
            ```
        """
        members = check_members(ranks, self.world_size)
        same_members(self.all_gather_object(members))
        return cast(C, self._subgroup([members]))

    @collective()
    def split(self: Splittable, color: int | None, key: int | None = None, *, timeout: Timeout | None = None) -> C:
        """MPI's split: ranks passing the same ``color`` form a communicator, ordered by ``key``
        (default: their rank); ``color=None`` joins none (a :class:`~communicator.transports.nonmember.NonMemberComm`).

        Example:
            ```python
            # 4 ranks
            half = comm.split(color=comm.rank // 2)   # ranks 0,1 and ranks 2,3
            ```
        """
        check_split(color, key)
        return cast(C, self._subgroup(groups_of(self.all_gather_object((color, self.rank if key is None else key)))))

    @collective("shape")
    def grid(self: Splittable, shape: tuple[int, int], *, timeout: Timeout | None = None) -> tuple[C, C]:
        """Split a ``rows x cols`` layout into ``(row, col)`` communicators.

        Rank ``r`` sits at row ``r // cols``, column ``r % cols``; ``row`` holds the ``cols`` ranks of
        its row (e.g. tensor parallel), ``col`` the ``rows`` ranks of its column (data parallel).

        Example:
            ```python
            # 4 ranks, shape (2, 2)
            row, col = comm.grid((2, 2))  # rank 3: row over ranks [2, 3], col over ranks [1, 3]
            ```
        """
        _, cols = check_grid(shape, self.world_size)
        return self.split(color=self.rank // cols), self.split(color=self.rank % cols)

    @property
    def local_comm(self: Splittable) -> C:
        """The ranks on this node, as a subgroup ordered by local rank. The first access is a
        collective (every rank creates every node's group): make it on every rank."""
        if self._local is None or self._local.closed:
            self._local = self.split(color=self.node_rank, key=self.local_rank)
        return cast(C, self._local)
