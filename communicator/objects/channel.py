"""The byte channel: how an object collective's bytes travel between the ranks of one communicator.

A :class:`Channel` moves fixed-size headers (in collectives, or point to point where a channel finds
that faster) and exact-size payloads point to point. A communicator supplies its own
(``Communicator._object_channel``); :class:`PrimitiveChannel` builds one from any communicator's
tensor primitives. The object protocol (:mod:`communicator.objects.protocol`) runs over it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from communicator.arguments import TRANSFER_TAG
from communicator.objects.frames import Moves, Pending

__all__ = ["Answer", "Answering", "Channel", "PrimitiveChannel", "gather_answer", "gather_then_broadcast"]


class Channel(Protocol):
    """How object bytes travel between the ranks of one communicator (ranks are local to it). A
    channel may also be :class:`Answering`."""

    rank: int
    world_size: int

    def all_gather(self, header: np.ndarray) -> list[np.ndarray]:
        """Every rank's header (same length everywhere), in rank order."""
        ...

    def gather(self, header: np.ndarray, dst: int) -> list[np.ndarray] | None:
        """Every rank's header on ``dst`` (rank order), ``None`` elsewhere."""
        ...

    def broadcast(self, header: np.ndarray, src: int) -> np.ndarray:
        """``src``'s header on every rank."""
        ...

    def scatter(self, headers: Sequence[np.ndarray] | None, src: int, size: int) -> np.ndarray:
        """Rank ``i`` gets ``headers[i]`` (``size`` bytes each) from ``src``; the others pass ``None``."""
        ...

    def exchange(self, sends: Mapping[int, np.ndarray], recvs: Mapping[int, np.ndarray]) -> None:
        """Send ``sends[r]`` to rank ``r`` and fill ``recvs[r]`` from rank ``r``; every length is known."""
        ...

    def post(self, sends: Moves, recvs: Moves) -> Pending:
        """Start the sends and receives of ``(peer, array)`` pairs; the returned function finishes them."""
        ...


Answer = Callable[[list[np.ndarray]], np.ndarray]


@runtime_checkable
class Answering(Protocol):
    """A :class:`Channel` that runs :func:`gather_answer` a way of its own (optional)."""

    def gather_answer(
        self, header: np.ndarray, dst: int, answer: Answer, size: int
    ) -> tuple[list[np.ndarray] | None, np.ndarray]: ...


def gather_answer(
    channel: Channel, header: np.ndarray, dst: int, answer: Answer, size: int
) -> tuple[list[np.ndarray] | None, np.ndarray]:
    """Every rank's header to ``dst``, and what ``answer`` makes of them there (``size`` bytes) back
    to every rank: (the headers on ``dst``, else ``None``; the answer). The channel's own way where
    it has one (:class:`Answering`), else :func:`gather_then_broadcast`."""
    if isinstance(channel, Answering):
        return channel.gather_answer(header, dst, answer, size)
    return gather_then_broadcast(channel, header, dst, answer, size)


def gather_then_broadcast(
    channel: Channel, header: np.ndarray, dst: int, answer: Answer, size: int
) -> tuple[list[np.ndarray] | None, np.ndarray]:
    """:func:`gather_answer` as the channel's gather, then its broadcast of the answer."""
    rows = channel.gather(header, dst)
    reply = answer(rows) if rows is not None else np.empty(size, dtype=np.uint8)
    return rows, channel.broadcast(reply, dst)


Work = Any
Waiter = Callable[[Sequence[Work]], None]


class PrimitiveChannel:
    """A :class:`Channel` over a communicator's tensor primitives (uint8 CPU tensors).

    ``all_gather(outputs, tensor)``, ``broadcast(tensor, src)``, ``isend(tensor, dst, tag)`` and
    ``irecv(tensor, src, tag)`` start operations; ``wait(works)`` finishes them.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        all_gather: Callable[[list[torch.Tensor], torch.Tensor], Work],
        broadcast: Callable[[torch.Tensor, int], Work],
        isend: Callable[[torch.Tensor, int, int], Work],
        irecv: Callable[[torch.Tensor, int, int], Work],
        wait: Waiter,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self._all_gather, self._broadcast, self._isend, self._irecv, self._wait = (
            all_gather,
            broadcast,
            isend,
            irecv,
            wait,
        )

    def all_gather(self, header: np.ndarray) -> list[np.ndarray]:
        outputs = [torch.empty(header.size, dtype=torch.uint8) for _ in range(self.world_size)]
        self._wait([self._all_gather(outputs, torch.from_numpy(header))])
        return [output.numpy() for output in outputs]

    def gather(self, header: np.ndarray, dst: int) -> list[np.ndarray] | None:
        rows = self.all_gather(header)
        return rows if self.rank == dst else None

    def broadcast(self, header: np.ndarray, src: int) -> np.ndarray:
        tensor = torch.from_numpy(header.copy())
        self._wait([self._broadcast(tensor, src)])
        return tensor.numpy()

    def scatter(self, headers: Sequence[np.ndarray] | None, src: int, size: int) -> np.ndarray:
        if self.rank != src:
            received = np.empty(size, dtype=np.uint8)
            self.exchange({}, {src: received})
            return received
        assert headers is not None
        self.exchange({r: headers[r] for r in range(self.world_size) if r != src}, {})
        return headers[src]

    def exchange(self, sends: Mapping[int, np.ndarray], recvs: Mapping[int, np.ndarray]) -> None:
        if sends or recvs:
            self.post(list(sends.items()), list(recvs.items()))()

    def post(self, sends: Moves, recvs: Moves) -> Pending:
        # receives first, so no send waits for a receive that was never posted
        works = [self._irecv(torch.from_numpy(a), r, TRANSFER_TAG) for r, a in recvs]
        works += [self._isend(torch.from_numpy(a), r, TRANSFER_TAG) for r, a in sends]
        return lambda: self._wait(works)
