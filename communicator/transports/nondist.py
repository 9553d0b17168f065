"""`NonDistComm`: the communicator of a single process. Every collective is the identity."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch
from typing_extensions import override

from communicator.base import Communicator
from communicator.config import CommConfig
from communicator.factory import SINGLE
from communicator.handles import DONE, Work
from communicator.objects.protocol import Collectives, check_scatter_list
from communicator.transports.nonmember import NonMemberComm

__all__ = ["NonDistComm"]

T = TypeVar("T")


@Communicator.register(SINGLE)
class NonDistComm(Communicator):
    """A world of one: rank 0 of 1, no ``torch.distributed`` needed.

    Every public operation is the base class's own, over primitives that have nothing to
    exchange, so arguments are checked exactly as a distributed communicator checks them (a bad
    op, an out-of-range rank or a sparse tensor raises the same error) and results have the same
    types: code tested with it behaves the same under a launcher. Object methods, checked by the
    base too, return their input without serialising it.
    """

    def __init__(self, config: CommConfig | None = None, reason: str = "") -> None:
        super().__init__(config)
        self._reason = reason
        self._device = torch.device(self.config.device or "cpu")

    @classmethod
    @override
    def from_config(cls, config: CommConfig) -> NonDistComm:
        return cls(config, reason=f"built as {cls.__name__} from the configuration")

    @property
    @override
    def rank(self) -> int:
        return 0

    @property
    @override
    def world_size(self) -> int:
        return 1

    @property
    @override
    def backend(self) -> str:
        return "none"

    @property
    @override
    def device(self) -> torch.device:
        return self._device

    # -- primitives: a world of one has nothing to exchange ------------------------------------

    @override
    def _barrier(self) -> Work:
        return DONE

    @override
    def _all_reduce(self, tensor: torch.Tensor, op: str) -> Work:
        return DONE

    @override
    def _broadcast(self, tensor: torch.Tensor, src: int) -> Work:
        return DONE

    @override
    def _all_gather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> Work:
        outputs[0].copy_(tensor)
        return DONE

    @override
    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        raise ValueError(f"dst={dst} is this rank; a single process has no peer to talk to")

    @override
    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        raise ValueError(f"src={src} is this rank; a single process has no peer to talk to")

    @override
    def _shrunk(self, members: list[int], name: str) -> Communicator:
        return NonDistComm(self.config, "shrink() of a world of one")

    @override
    def _create_groups(self, groups: list[list[int]]) -> Communicator:
        if not groups:  # split(color=None): this process joined no group
            return NonMemberComm.outside(self, groups)
        return NonDistComm(self.config, reason="a subgroup of a single process")

    @property
    @override
    def local_comm(self) -> Communicator:
        """A single process is its own node."""
        return self

    # -- object collectives: the identity, without serialising ---------------------------------

    @override
    def _object_collectives(self) -> Collectives:
        """The base checks the arguments as for any communicator; the objects stay as they are."""
        return _IDENTITY


class _Identity:
    """The object collectives of a world of one: every result is the caller's own object (not a
    copy), so nothing is serialised and an object that cannot be pickled works too."""

    def all_gather_object(self, obj: T) -> list[T]:
        return [obj]

    def gather_object(self, obj: T, dst: int) -> list[T] | None:
        return [obj]

    def broadcast_object(self, obj: T, src: int) -> T:
        return obj

    def scatter_object(self, objects: Sequence[T] | None, src: int) -> T:
        return check_scatter_list(objects, 1)[0]


_IDENTITY = _Identity()
