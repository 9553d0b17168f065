"""The object channel of a :class:`~communicator.transports.torch_comm.TorchComm`: fixed-size headers (point
to point from 3 to ``POINT_TO_POINT_RANKS`` ranks, and at 2 where every rank has CPUs to spare,
else in gloo collectives), exact-size frames point to point (see
:mod:`communicator.objects.protocol`), and the cut that ends a transfer's wait when a communicator
closes."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from communicator.arguments import CUT_TAG, RECORD_TAG, TRANSFER_TAG
from communicator.control.waiting import PointToPoint, finished
from communicator.handles import Work
from communicator.objects.channel import Answer, gather_then_broadcast
from communicator.objects.frames import Moves, Pending
from communicator.transports.torch_options import broadcast_options, gather_options, scatter_options

__all__ = ["GATHER_BROADCAST_RANKS", "POINT_TO_POINT_CPUS", "POINT_TO_POINT_RANKS", "TorchChannel", "cut"]

# From 3 up to this many ranks, headers from one rank to the others (broadcast, scatter) or from
# the others to one rank (gather) go point to point, every transfer at once, which beat gloo's
# collectives for small objects; beyond, a rank would post a transfer per rank.
POINT_TO_POINT_RANKS = 8
# At 2 ranks, headers go point to point where every rank has this many CPUs or more per rank of
# its host, else in gloo's collectives: a transfer's wait costs a thread hand-off (see
# communicator.control.waiting), which needs a CPU to wake on (docs/decisions.md has the runs).
POINT_TO_POINT_CPUS = 2.0
# Up to this many ranks, headers are all-gathered by a gather and a broadcast: gloo's ring
# all_gather takes a step per rank; beyond, the broadcast of every header from one rank would
# outweigh the steps (the measurements behind all three: docs/objects.md).
GATHER_BROADCAST_RANKS = 16


def cut(group: dist.ProcessGroup, group_peer: int) -> None:
    """Close gloo's connection to ``group_peer`` in ``group``, so that every transfer waiting on it
    returns with an error: a receive whose wait times out closes its connection (see
    :mod:`communicator.control.waiting`). For closing only: the group is unusable after."""
    with contextlib.suppress(RuntimeError):
        work = dist.irecv(torch.empty(1, dtype=torch.uint8), group=group, group_src=group_peer, tag=CUT_TAG)
        finished(work, 0.001)


class TorchChannel:
    """The object channel of a ``TorchComm``: its gloo group (the companion under NCCL), so
    that object bytes never touch a GPU."""

    def __init__(
        self,
        rank: int,
        group: dist.ProcessGroup,
        group_rank_of: list[int],
        start: Callable[..., Work],
        wait: Callable[[Sequence[Work]], None],
        local_size: int = 1,
    ) -> None:
        """``start(primitive, *args)`` starts a transfer or collective (explaining a start that fails,
        as a peer that closed makes it), ``wait(works)`` finishes them; ``local_size``: the ranks
        of the job on this rank's host. Made by every rank of the group at once (its first object
        operation): at 2 ranks they agree there how headers travel."""
        self.rank, self.world_size = rank, len(group_rank_of)
        self._group, self._group_rank_of, self._begin, self._wait = group, group_rank_of, start, wait
        world = self.world_size
        # Whether headers go point to point (see POINT_TO_POINT_RANKS and POINT_TO_POINT_CPUS)
        self._point_to_point = 2 < world <= POINT_TO_POINT_RANKS or (world == 2 and self._cpus_to_spare(local_size))

    def _cpus_to_spare(self, local_size: int) -> bool:
        """Whether both of 2 ranks have ``POINT_TO_POINT_CPUS`` per rank of their host. Each tells
        the other what its host offers, so that both decide alike whatever their hosts, on the
        headers' own tag, so that this exchange never pairs with a collective of the user's."""
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        mine = np.array([cpus / max(local_size, 1) >= POINT_TO_POINT_CPUS], dtype=np.uint8)
        theirs = np.zeros(1, dtype=np.uint8)
        peer = 1 - self.rank
        self._records([(peer, mine)], [(peer, theirs)])
        return bool(mine[0] and theirs[0])

    def all_gather(self, header: np.ndarray) -> list[np.ndarray]:
        """Up to ``GATHER_BROADCAST_RANKS`` ranks, rank 0 gathers the headers and broadcasts them
        all (two steps whatever the number of ranks, point to point where headers go so);
        beyond, gloo's ring."""
        world, size = self.world_size, header.size
        if 1 < world <= GATHER_BROADCAST_RANKS:
            every = self.gather_answer(header, 0, np.concatenate, size * world)[1]
            return [every[r * size : (r + 1) * size] for r in range(world)]
        rows = [torch.empty(header.size, dtype=torch.uint8) for _ in range(world)]
        ordered = [rows[self._group_rank_of.index(g)] for g in range(world)]  # torch's rank order
        # gloo's list form: faster than all_gather_into_tensor for small headers
        self._wait([self._begin(self._group.allgather, [ordered], [torch.from_numpy(header)])])
        return [row.numpy() for row in rows]

    def gather_answer(
        self, header: np.ndarray, dst: int, answer: Answer, size: int
    ) -> tuple[list[np.ndarray] | None, np.ndarray]:
        """See :func:`~communicator.objects.protocol.gather_answer`. Point to point, a rank other
        than ``dst`` posts its header and the receive of the answer at once, and waits once."""
        if self._point_to_point and self.rank != dst:
            reply = np.empty(size, dtype=np.uint8)
            self._records([(dst, header)], [(dst, reply)])
            return None, reply
        return gather_then_broadcast(self, header, dst, answer, size)

    def gather(self, header: np.ndarray, dst: int) -> list[np.ndarray] | None:
        world, me = self.world_size, self.rank
        if self._point_to_point:
            if me != dst:
                self._records([(dst, header)], [])
                return None
            rows = [header if r == me else np.empty_like(header) for r in range(world)]
            self._records([], [(r, rows[r]) for r in range(world) if r != me])
            return rows
        source = torch.from_numpy(header)
        outputs = [torch.empty_like(source) for _ in range(world)] if me == dst else None
        root = gather_options(self._group_rank_of[dst])
        self._collective(self._group.gather, [] if outputs is None else [outputs], [source], root)
        return None if outputs is None else [outputs[g].numpy() for g in self._group_rank_of]

    def broadcast(self, header: np.ndarray, src: int) -> np.ndarray:
        if self._point_to_point:  # src's one header to every rank: a scatter of it
            return self.scatter([header] * self.world_size if self.rank == src else None, src, header.size)
        tensor = torch.from_numpy(header.copy())
        self._collective(self._group.broadcast, [tensor], broadcast_options(self._group_rank_of[src]))
        return tensor.numpy()

    def scatter(self, headers: Sequence[np.ndarray] | None, src: int, size: int) -> np.ndarray:
        if self._point_to_point:
            if headers is not None:  # src
                self._records([(r, headers[r]) for r in range(self.world_size) if r != src], [])
                return headers[src]
            received = np.empty(size, dtype=np.uint8)
            self._records([], [(src, received)])
            return received
        out = torch.empty(size, dtype=torch.uint8)
        parts = []
        if headers is not None:
            parts = [[torch.from_numpy(headers[self._group_rank_of.index(g)]) for g in range(self.world_size)]]
        self._collective(self._group.scatter, [out], parts, scatter_options(self._group_rank_of[src]))
        return out.numpy()

    def exchange(self, sends: Mapping[int, np.ndarray], recvs: Mapping[int, np.ndarray]) -> None:
        if sends or recvs:
            self.post(list(sends.items()), list(recvs.items()))()

    def post(self, sends: Moves, recvs: Moves) -> Pending:
        works = self._start(sends, recvs, TRANSFER_TAG)
        return lambda: self._wait(works)

    def _collective(self, start: Callable[..., Work], *arguments: Any) -> None:
        """Start one of the group's own collectives (see :mod:`~communicator.transports.torch_options`), and wait."""
        self._wait([self._begin(start, *arguments)])

    def _records(self, sends: Moves, recvs: Moves) -> None:
        self._wait(self._start(sends, recvs, RECORD_TAG))

    def _start(self, sends: Moves, recvs: Moves, tag: int) -> list[Work]:
        works: list[Work] = []
        group = self._group  # its own methods: torch's module functions check again what is known
        for peer, array in recvs:  # receives first: no send waits for one never posted
            group_peer = self._group_rank_of[peer]
            work = self._begin(group.recv, [torch.from_numpy(array)], group_peer, tag)
            works.append(PointToPoint(work, peer, self._cut(group_peer)))
        for peer, array in sends:
            group_peer = self._group_rank_of[peer]
            work = self._begin(group.send, [torch.from_numpy(array)], group_peer, tag)
            works.append(PointToPoint(work, peer, self._cut(group_peer)))
        return works

    def _cut(self, group_peer: int) -> Callable[[], None]:
        return functools.partial(cut, self._group, group_peer)
