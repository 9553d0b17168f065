"""`NonMemberComm`: what a rank gets for a group it is not in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from communicator.base import Communicator
from communicator.errors import CommError, NotMemberError
from communicator.handles import Work

__all__ = ["NonMemberComm"]


class NonMemberComm(Communicator):
    """A null object: its ``rank`` is ``-1``, its ``world_size`` and ``global_ranks`` describe the
    group (empty for ``split(color=None)``), and every operation raises
    :class:`~communicator.errors.NotMemberError` at once, before any communication.
    ``TorchComm`` registers it as a virtual ``SubgroupComm``.
    """

    def __init__(self, parent: Communicator, global_ranks: Sequence[int]) -> None:
        super().__init__(parent.config)
        self._parent = parent
        self._ranks = tuple(global_ranks)
        self._reason = f"this rank is not among world ranks {list(self._ranks)}"
        self._calls.refusal = self._outsider

    @classmethod
    def outside(cls, parent: Communicator, groups: list[list[int]]) -> NonMemberComm:
        """The null object for a rank of ``parent`` in none of ``groups`` (``_create_groups``' argument):
        it describes the group when there is one (``new_group``), else no group."""
        return cls(parent, [parent.global_ranks[r] for r in groups[0]] if len(groups) == 1 else [])

    def _outsider(self, what: str) -> CommError:
        return NotMemberError(f"{what}: this rank is not a member of this subgroup (world ranks {list(self._ranks)})")

    def _refuse(self, *args: Any) -> Work:
        raise self._outsider(self._calls.op or "operation")

    _barrier = _all_reduce = _broadcast = _all_gather = _gather = _isend = _irecv = _refuse  # type: ignore[assignment]

    @override
    def _create_groups(self, groups: list[list[int]]) -> Communicator:
        raise self._outsider("split")

    @property
    @override
    def rank(self) -> int:
        return -1

    @property
    @override
    def world_size(self) -> int:
        return len(self._ranks)

    @property
    @override
    def global_ranks(self) -> tuple[int, ...]:
        return self._ranks

    @property
    @override
    def is_member(self) -> bool:
        return False

    @property
    @override
    def backend(self) -> str:
        return self._parent.backend

    @property
    @override
    def device(self) -> torch.device:
        return self._parent.device

    @property
    def parent(self) -> Communicator:
        """The communicator this group was created from."""
        return self._parent
