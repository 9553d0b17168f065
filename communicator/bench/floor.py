"""The floor: the bytes an object op moves, moved by preallocated, exact-size point-to-point transfers.

Each object op gets a ``floor`` implementation that moves as many bytes per rank as that rank's
pickled payload (the lengths differ per rank, nothing is padded), between buffers allocated before
the clock starts, with plain ``torch.distributed`` sends and receives in the fastest schedule we
measured on gloo (127.0.0.1, 2 cores, 4 ranks):

- all_gather: a ring. At step ``s`` rank ``r`` sends the block of rank ``r - s`` to ``r + 1`` and
  receives the block of ``r - s - 1`` from ``r - 1``: one send and one receive per rank at a
  time, each block crossing each link once. (Every pair at once and a pairwise exchange measured
  as fast or slower; gloo's own all_gather 3 to 4 times slower.)
- gather (and collect_results): every sender at once into the destination (one sender at a time
  measured 1.6 times slower).
- broadcast: the source sends to every rank at once (a pipelined chain measured the same).

Its result is checked by itself: every block must hold its sender's fill byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["FLOOR", "FLOOR_IMPLS", "floor_valid"]

FLOOR = "floor"
DST = SRC = 0


def _fill(rank: int) -> int:
    return rank % 255 + 1  # never 0, the value a receive buffer starts with


def _block(rank: int, length: int) -> torch.Tensor:
    fill = _fill(rank) if rank == dist.get_rank() else 0
    return torch.full((length,), fill, dtype=torch.uint8)


def _wait(works: Sequence[Any]) -> None:
    for work in works:
        work.wait()


def _every_block(payload: Any, lengths: Sequence[int]) -> list[torch.Tensor | None]:
    return [_block(rank, length) for rank, length in enumerate(lengths)]


def _gather_blocks(payload: Any, lengths: Sequence[int]) -> list[torch.Tensor | None]:
    me = dist.get_rank()
    return [_block(rank, length) if me in (rank, DST) else None for rank, length in enumerate(lengths)]


def _broadcast_block(payload: Any, lengths: Sequence[int]) -> list[torch.Tensor | None]:
    return [_block(SRC, lengths[SRC]) if rank == SRC else None for rank in range(len(lengths))]


def _ring_all_gather(context: Any, blocks: list[torch.Tensor]) -> list[torch.Tensor]:
    rank, world = dist.get_rank(), len(blocks)
    for step in range(world - 1):
        passing, arriving = (rank - step) % world, (rank - step - 1) % world
        _wait([dist.irecv(blocks[arriving], (rank - 1) % world), dist.isend(blocks[passing], (rank + 1) % world)])
    return blocks


def _gather(context: Any, blocks: list[torch.Tensor | None]) -> list[torch.Tensor | None] | None:
    rank = dist.get_rank()
    if rank != DST:
        own = blocks[rank]
        assert own is not None
        _wait([dist.isend(own, DST)])
        return None
    _wait([dist.irecv(block, peer) for peer, block in enumerate(blocks) if peer != DST and block is not None])
    return blocks


def _broadcast(context: Any, blocks: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    block = blocks[SRC]
    assert block is not None
    if dist.get_rank() == SRC:
        _wait([dist.isend(block, peer) for peer in range(len(blocks)) if peer != SRC])
    else:
        _wait([dist.irecv(block, SRC)])
    return blocks


def floor_valid(result: Any) -> bool:
    """Whether every block holds its sender's fill byte (first, middle and last byte)."""
    if result is None:
        return True
    return all(
        block is None or block.numel() == 0 or all(int(block[i]) == _fill(rank) for i in (0, block.numel() // 2, -1))
        for rank, block in enumerate(result)
    )


#: op name -> (implementation, how to build its input from the payload and every rank's length)
FLOOR_IMPLS: dict[str, tuple[Any, Any]] = {
    "all_gather_object": (_ring_all_gather, _every_block),
    "gather_object": (_gather, _gather_blocks),
    "collect_results": (_gather, _gather_blocks),
    "broadcast_object": (_broadcast, _broadcast_block),
}
