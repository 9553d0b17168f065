"""The floors: the bytes an object op moves, moved by exact-size point-to-point transfers.

Each object op gets two implementations that move as many bytes per rank as that rank's pickled
payload (the lengths differ per rank, nothing is padded), with plain ``torch.distributed`` sends
and receives in the fastest schedule we measured on gloo (127.0.0.1, 2 cores, 4 ranks):

- all_gather: a ring. At step ``s`` rank ``r`` sends the block of rank ``r - s`` to ``r + 1`` and
  receives the block of ``r - s - 1`` from ``r - 1``: one send and one receive per rank at a
  time, each block crossing each link once. (Every pair at once and a pairwise exchange measured
  as fast or slower; gloo's own all_gather 3 to 4 times slower.)
- gather (and collect_results): every sender at once into the destination (one sender at a time
  measured 1.6 times slower).
- broadcast: the source sends to every rank at once (a pipelined chain measured the same).

``floor`` receives into buffers allocated and touched before the clock starts: the transfers
alone. ``floor_fresh`` allocates its receive buffers inside the timed call (``torch.empty`` of
the exact sizes), as a real result needs new memory: the kernel maps and zeroes those pages
during the receive, and that counts. A rank's own block is made before the clock in both.

Each result is checked by itself: every block must hold its sender's fill byte. The fill depends
on a salt, new for each input the fresh floor gets (the ranks prepare inputs in lockstep, so they
agree on it): a fresh buffer that reuses the memory of an earlier result never passes for one.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["FLOOR", "FLOOR_FRESH", "FLOOR_IMPLS", "Blocks", "floor_valid"]

FLOOR = "floor"
FLOOR_FRESH = "floor_fresh"
DST = SRC = 0

_salts = itertools.count()


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Every rank's block as this rank holds it: a tensor, the length of one to receive into a
    fresh buffer, or ``None`` where this rank has no part in it; ``salt`` picks the fill bytes."""

    blocks: list[Any]
    salt: int


def _fill(rank: int, salt: int) -> int:
    return (rank + salt) % 255 + 1  # never 0, the value a preallocated receive buffer starts with


def _holds_all(me: int, rank: int) -> bool:
    return True


def _holds_gathered(me: int, rank: int) -> bool:
    return me in (rank, DST)


def _holds_broadcast(me: int, rank: int) -> bool:
    return rank == SRC


def _prepare(holds: Callable[[int, int], bool], fresh: bool) -> Callable[[Any, Sequence[int]], Blocks]:
    """How to make the input of an op whose blocks this rank holds where ``holds(me, rank)``."""

    def prepare(payload: Any, lengths: Sequence[int]) -> Blocks:
        me, salt = dist.get_rank(), next(_salts) % 254 + 1 if fresh else 0
        blocks: list[Any] = []
        for rank, length in enumerate(lengths):
            if not holds(me, rank):
                blocks.append(None)
            elif rank == me:
                blocks.append(torch.full((length,), _fill(rank, salt), dtype=torch.uint8))
            else:
                blocks.append(length if fresh else torch.zeros(length, dtype=torch.uint8))
        return Blocks(blocks, salt)

    return prepare


def _wait(works: Sequence[Any]) -> None:
    for work in works:
        work.wait()


def _ring_all_gather(context: Any, held: Blocks) -> Blocks:
    blocks, rank, world = held.blocks, dist.get_rank(), len(held.blocks)
    for step in range(world - 1):
        passing, arriving = (rank - step) % world, (rank - step - 1) % world
        _wait([dist.irecv(blocks[arriving], (rank - 1) % world), dist.isend(blocks[passing], (rank + 1) % world)])
    return held


def _gather(context: Any, held: Blocks) -> Blocks | None:
    blocks, rank = held.blocks, dist.get_rank()
    if rank != DST:
        _wait([dist.isend(blocks[rank], DST)])
        return None
    _wait([dist.irecv(block, peer) for peer, block in enumerate(blocks) if peer != DST and block is not None])
    return held


def _broadcast(context: Any, held: Blocks) -> Blocks:
    blocks = held.blocks
    if dist.get_rank() == SRC:
        _wait([dist.isend(blocks[SRC], peer) for peer in range(len(blocks)) if peer != SRC])
    else:
        _wait([dist.irecv(blocks[SRC], SRC)])
    return held


def _fresh(schedule: Callable[[Any, Blocks], Blocks | None]) -> Callable[[Any, Blocks], Blocks | None]:
    """``schedule`` into receive buffers allocated inside the call."""

    def fresh(context: Any, held: Blocks) -> Blocks | None:
        blocks = [torch.empty(b, dtype=torch.uint8) if isinstance(b, int) else b for b in held.blocks]
        return schedule(context, Blocks(blocks, held.salt))

    return fresh


def floor_valid(result: Blocks | None) -> bool:
    """Whether every block holds its sender's fill byte (first, middle and last byte)."""
    if result is None:
        return True
    return all(
        block is None
        or block.numel() == 0
        or all(int(block[i]) == _fill(rank, result.salt) for i in (0, block.numel() // 2, -1))
        for rank, block in enumerate(result.blocks)
    )


_SCHEDULES = {
    "all_gather_object": (_ring_all_gather, _holds_all),
    "gather_object": (_gather, _holds_gathered),
    "collect_results": (_gather, _holds_gathered),
    "broadcast_object": (_broadcast, _holds_broadcast),
}

#: op name -> floor name -> (implementation, how to build its input from the payload and every rank's length)
FLOOR_IMPLS: dict[str, dict[str, tuple[Any, Any]]] = {
    op: {FLOOR: (schedule, _prepare(holds, False)), FLOOR_FRESH: (_fresh(schedule), _prepare(holds, True))}
    for op, (schedule, holds) in _SCHEDULES.items()
}
