"""Where a process sits: its rank in a communicator, the world size, its node, and the translation
between a communicator's ranks and the world's (a base of ``Communicator``).

``rank`` and ``world_size`` are what every communicator implements; the rest has defaults for one
node, which communicators that know better override.
"""

from __future__ import annotations

import abc

import torch

from communicator.arguments import check_rank

__all__ = ["RankQueries"]


class RankQueries(abc.ABC):
    """The rank queries of a communicator."""

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process's rank in the communicator (0-based)."""

    @property
    @abc.abstractmethod
    def world_size(self) -> int:
        """The number of ranks in the communicator."""

    @property
    def local_rank(self) -> int:
        """This process's index among the processes of its node (default: one node, the rank)."""
        return self.rank

    @property
    def local_size(self) -> int:
        """The number of processes on this node (default: one node, the world size)."""
        return self.world_size

    @property
    def node_rank(self) -> int:
        """The index of this process's node (default: 0)."""
        return 0

    @property
    def num_nodes(self) -> int:
        """The number of nodes in the job (default: 1)."""
        return 1

    @property
    def backend(self) -> str:
        """The transport's name (``"gloo"``, ``"nccl"``, ``"mpi"``, ``"none"`` for one process)."""
        return type(self).__name__.lower()

    @property
    def device(self) -> torch.device:
        """The device tensors are moved to for communication (default: the CPU)."""
        return torch.device("cpu")

    @property
    def global_ranks(self) -> tuple[int, ...]:
        """The world rank of each rank of this communicator, in this communicator's order."""
        return tuple(range(self.world_size))

    @property
    def is_member(self) -> bool:
        """Whether this process belongs to the communicator
        (see :class:`~communicator.transports.nonmember.NonMemberComm`)."""
        return True

    def to_global(self, rank: int) -> int:
        """The world rank of this communicator's ``rank``; e.g. ``new_group([3, 1]).to_global(0) == 3``."""
        return self.global_ranks[check_rank("rank", rank, self.world_size)]

    def to_local(self, global_rank: int) -> int:
        """This communicator's rank for world rank ``global_rank``; ``ValueError`` if not a member."""
        if global_rank not in self.global_ranks:
            raise ValueError(
                f"world rank {global_rank} is out of range: not a member of this communicator "
                f"(world ranks {list(self.global_ranks)})"
            )
        return self.global_ranks.index(global_rank)

    @property
    def is_distributed(self) -> bool:
        """Whether the communicator has more than one rank (``False`` for a world of one, a
        ``TorchComm`` of one process included: its collectives are the identity too)."""
        return self.world_size > 1

    @property
    def is_main_process(self) -> bool:
        """Whether this is rank 0."""
        return self.rank == 0

    @property
    def dist_info(self) -> tuple[int, int]:
        """``(rank, world_size)``."""
        return self.rank, self.world_size
