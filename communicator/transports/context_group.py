"""`ContextGroup`: the default subgroup, a communicator over its parent's point-to-point."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from typing_extensions import override

from communicator.base import Communicator
from communicator.control import Control
from communicator.factory import provide
from communicator.handles import Work
from communicator.ops.defaults import fold_tag, pair
from communicator.transports.nonmember import NonMemberComm

__all__ = ["ContextGroup", "create_groups"]


class ContextGroup(Communicator):
    """Ranks ``members`` of ``parent`` (in this order). Every message is one of the parent's, on a
    tag of the parent's that only this group uses (:func:`~communicator.ops.defaults.fold_tag` of its
    ``context``), so it never mixes with the parent's, a sibling's or a user's messages. Its
    collectives are the defaults over that point-to-point; with a control plane, its board is a
    child of the parent's, so a failure anywhere in the parent's world releases its waits too."""

    def __init__(self, parent: Communicator, members: Sequence[int], context: int, name: str) -> None:
        super().__init__(parent.config)
        self._parent, self._members, self._context = parent, list(members), context
        self._rank = self._members.index(parent.rank)
        self._global = tuple(parent.global_ranks[m] for m in members)
        self._name = name
        self._plane()

    @override
    def _control_plane(self) -> Control | None:
        """A child of the parent's plane: a failure anywhere in the parent's world releases this group's waits."""
        plane = self._parent._plane()
        return None if plane is None else plane.child(self._global, self._name, self._rank, self._calls, self.config)

    @property
    @override
    def rank(self) -> int:
        return self._rank

    @property
    @override
    def world_size(self) -> int:
        return len(self._members)

    @property
    @override
    def global_ranks(self) -> tuple[int, ...]:
        return self._global

    @property
    @override
    def backend(self) -> str:
        return self._parent.backend

    @property
    @override
    def device(self) -> torch.device:
        return self._parent.device

    @override
    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        return self._parent._isend(tensor, self._members[dst], fold_tag(self._context, tag))

    @override
    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        return self._parent._irecv(tensor, self._members[src], fold_tag(self._context, tag))


def create_groups(comm: Communicator, groups: list[list[int]]) -> Communicator:
    """This rank's :class:`ContextGroup` of ``groups`` (a ``NonMemberComm`` when it is in none):
    the base class's default ``_create_groups``. Every rank numbers the groups alike: its parent
    counts the calls, which every rank makes in one order."""
    comm._contexts += 1
    plane = comm._plane()
    mine: Communicator | None = None
    for index, members in enumerate(groups):
        context = pair(comm._contexts, index)  # distinct for every (call, group)
        name = f"group{comm._contexts}.{index}/"
        if comm.rank in members:
            mine = ContextGroup(comm, members, context, name)
        elif plane is not None:
            plane.board.not_a_member(name)
    return mine if mine is not None else NonMemberComm.outside(comm, groups)


provide("context_groups", create_groups)
