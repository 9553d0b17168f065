"""Ranks as threads of one process: a ``Communicator`` written from the primitives alone.

``ThreadComm`` passes tensors between threads through shared slots and queues, without
``torch.distributed``. It implements the nine primitives; every public operation (uneven
gathers, object collectives, ``all_reduce_dict``, ``collect_results``, subgroups, ...) is the
base class's. ``run_threads`` runs a function on ``world`` thread-ranks, as ``launch`` runs one
on processes.

Run it with ``python docs/examples/thread_comm.py``.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from communicator import Communicator, NonMemberComm
from communicator.handles import DONE, Work

_REDUCE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum,
    "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor,
}  # fmt: skip


class ThreadWorld:
    """What the ranks of one group share: a barrier, a slot per rank, a queue per (src, dst, tag).

    A rank that never arrives breaks the barrier after ``timeout`` seconds: the others raise
    ``BrokenBarrierError`` instead of waiting forever.
    """

    def __init__(self, size: int, timeout: float = 60.0) -> None:
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.slots: list[Any] = [None] * size
        self.queues: defaultdict[tuple[int, int, int], queue.SimpleQueue[torch.Tensor]] = defaultdict(queue.SimpleQueue)
        self.lock = threading.Lock()

    def exchange(self, rank: int, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order: a collective, every rank calls it."""
        self.slots[rank] = value
        self.barrier.wait()
        values = list(self.slots)
        self.barrier.wait()  # no rank writes its next value before every rank has read this one
        return values

    def mailbox(self, src: int, dst: int, tag: int) -> queue.SimpleQueue[torch.Tensor]:
        with self.lock:
            return self.queues[src, dst, tag]


class Received:
    """A started receive: ``wait(timeout)`` blocks until the message is there and copies it in, or
    returns ``False`` when ``timeout`` ran out (the base class waits in such slices)."""

    def __init__(self, box: queue.SimpleQueue[torch.Tensor], into: torch.Tensor) -> None:
        self.box, self.into = box, into

    def wait(self, timeout: timedelta | None = None) -> bool:
        try:
            self.into.copy_(self.box.get(timeout=None if timeout is None else timeout.total_seconds()))
        except queue.Empty:
            return False
        return True

    def is_completed(self) -> bool:
        return not self.box.empty()


class ThreadComm(Communicator):
    """Rank ``rank`` of the thread-ranks that share ``world``."""

    def __init__(self, world: ThreadWorld, rank: int, size: int) -> None:
        super().__init__()
        self._world, self._rank, self._size = world, rank, size

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    def _barrier(self) -> Work:
        self._world.barrier.wait()
        return DONE

    def _all_reduce(self, tensor: torch.Tensor, op: str) -> Work:
        tensor.copy_(functools.reduce(_REDUCE[op], self._world.exchange(self._rank, tensor.clone())))
        return DONE

    def _broadcast(self, tensor: torch.Tensor, src: int) -> Work:
        tensor.copy_(self._world.exchange(self._rank, tensor.clone())[src])
        return DONE

    def _all_gather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> Work:
        for output, value in zip(outputs, self._world.exchange(self._rank, tensor.clone()), strict=True):
            output.copy_(value)
        return DONE

    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        self._world.mailbox(self._rank, dst, tag).put(tensor.clone())
        return DONE

    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        return Received(self._world.mailbox(src, self._rank, tag), tensor)

    def _create_groups(self, groups: list[list[int]]) -> Communicator:
        worlds = self._world.exchange(self._rank, [ThreadWorld(len(group)) for group in groups])[0]  # rank 0's
        for group, world in zip(groups, worlds, strict=True):
            if self._rank in group:
                return ThreadComm(world, group.index(self._rank), len(group))
        return NonMemberComm.outside(self, groups)


def run_threads(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """``fn(comm, *args)`` on ``world`` thread-ranks; every rank's result in rank order (a rank's
    exception is raised here)."""
    shared = ThreadWorld(world)
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            with ThreadComm(shared, rank, world) as comm:
                results[rank] = fn(comm, *args)
        except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
            errors.append(error)
            shared.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def demo(comm: Communicator) -> tuple[Any, ...]:
    uneven = comm.all_gather(torch.arange(comm.rank + 1))  # shapes differ per rank: the base class handles it
    totals = comm.all_reduce_dict({"loss": torch.tensor(float(comm.rank)), "count": 1}, op="mean")
    ordered = comm.collect_results([f"sample {i}" for i in range(comm.rank, 6, comm.world_size)], size=6)
    pair = comm.split(color=comm.rank // 2)
    return [t.tolist() for t in uneven], totals, ordered, pair.all_gather_object(comm.rank)


def main() -> list[Any]:
    results = run_threads(demo, 4)
    assert results[0][2] == [f"sample {i}" for i in range(6)]  # collect_results: dataset order on rank 0
    assert all(r[0] == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]] for r in results)
    for rank, result in enumerate(results):
        print(f"rank {rank}: {result}")
    return results


if __name__ == "__main__":
    main()
