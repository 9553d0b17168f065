"""`SubgroupComm`: a communicator over some ranks of a parent; every rank it speaks of is group-local."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch.distributed as dist
from typing_extensions import override

from communicator.errors import NotMemberError
from communicator.torch_comm import TorchComm
from communicator.waiting import TransferWaiter

if TYPE_CHECKING:
    from communicator.failures import FailureBoard

__all__ = ["SubgroupComm"]


class SubgroupComm(TorchComm):
    """Ranks ``global_ranks`` of a parent communicator, numbered ``0..len-1`` in that order.

    ``rank``, ``world_size`` and every ``src``/``dst``/``peer`` count inside the subgroup;
    ``global_ranks``, ``to_global`` and ``to_local`` translate to and from world ranks; ``parent``
    is the communicator it was split from. A process that is not a member gets a ``SubgroupComm``
    whose ``is_member`` is ``False``, whose ``rank`` is ``-1``, and whose collectives raise
    :class:`~communicator.errors.NotMemberError`.
    """

    def __init__(
        self,
        parent: TorchComm,
        global_ranks: Sequence[int],
        group: dist.ProcessGroup | None,
        cpu_group: dist.ProcessGroup | None,
        board: FailureBoard | None,
    ) -> None:
        self._parent = parent
        self._member = group is not None
        if self._member:
            super().__init__(
                parent.config,
                group=group,
                global_ranks=global_ranks,
                topology=parent._topology,
                board=board,
                owner=False,
                cpu_group=cpu_group,
                reason=f"split from {type(parent).__name__} over world ranks {list(global_ranks)}",
            )
        else:
            self._init_non_member(parent, global_ranks)

    def _init_non_member(self, parent: TorchComm, global_ranks: Sequence[int]) -> None:
        from communicator.base import Communicator

        Communicator.__init__(self, parent.config)
        self._global_ranks = tuple(global_ranks)
        self._rank = -1
        self._backend = parent.backend
        self._device = parent.device
        self._topology = parent._topology
        self._owner = False
        self._reason = f"this rank (world {dist.get_rank()}) is not among world ranks {list(global_ranks)}"
        self._env_restore = {}
        self._children = []
        self._transfers = TransferWaiter()

    @property
    def is_member(self) -> bool:
        """Whether this process belongs to the subgroup."""
        return self._member

    @property
    def parent(self) -> TorchComm:
        """The communicator this subgroup was created from."""
        parent = self._parent
        assert parent is not None
        return parent

    @override
    def _enter(self, what: str) -> None:
        if not self._member:
            raise NotMemberError(
                f"{what}: world rank {dist.get_rank()} is not a member of this subgroup "
                f"(world ranks {list(self._global_ranks)})"
            )
        super()._enter(what)

    @override
    def _release(self, failed: bool, error: BaseException | None) -> None:
        if not self._member:
            self._closed = True
            return
        super()._release(failed, error)
