"""Ranks as threads of one process: a ``Communicator`` written from the primitives alone.

``ThreadComm`` passes tensors between threads through shared slots and queues, without
``torch.distributed``. It implements ``rank``, ``world_size``, ``_isend`` and ``_irecv``; every
collective (over those, by the base class's defaults), every public operation (uneven gathers,
object collectives, ``all_reduce_dict``, ``collect_results``, ...) and subgroups are the base
class's. ``run_threads`` runs a function on ``world`` thread-ranks, as ``launch`` runs one
on processes.

Run it with ``python docs/examples/thread_comm.py``.
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from communicator import CommConfig, Communicator
from communicator.handles import DONE, Work


class ThreadWorld:
    """What the ranks of one world share: a queue of messages per (src, dst, tag)."""

    def __init__(self) -> None:
        self.queues: defaultdict[tuple[int, int, int], queue.SimpleQueue[torch.Tensor]] = defaultdict(queue.SimpleQueue)
        self.lock = threading.Lock()

    def mailbox(self, src: int, dst: int, tag: int) -> queue.SimpleQueue[torch.Tensor]:
        with self.lock:
            return self.queues[src, dst, tag]


class Received:
    """A started receive: ``wait(timeout)`` blocks until the message is there and copies it in, or
    returns ``False`` when ``timeout`` ran out (the base class waits in such slices)."""

    def __init__(self, box: queue.SimpleQueue[torch.Tensor], into: torch.Tensor) -> None:
        self.box, self.into = box, into
        self.done = False

    def wait(self, timeout: timedelta | None = None) -> bool:
        if not self.done:
            try:
                self.into.copy_(self.box.get(timeout=None if timeout is None else timeout.total_seconds()))
            except queue.Empty:
                return False
            self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done or not self.box.empty()


class ThreadComm(Communicator):
    """Rank ``rank`` of the ``size`` thread-ranks that share ``world``: a send never waits (it
    queues a copy), a receive completes when its message is queued."""

    def __init__(self, world: ThreadWorld, rank: int, size: int, timeout: float = 60.0) -> None:
        super().__init__(CommConfig(timeout=timeout))
        self._world, self._rank, self._size = world, rank, size

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        self._world.mailbox(self._rank, dst, tag).put(tensor.clone())
        return DONE

    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        return Received(self._world.mailbox(src, self._rank, tag), tensor)


def run_threads(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 60.0) -> list[Any]:
    """``fn(comm, *args)`` on ``world`` thread-ranks; every rank's result in rank order (a rank's
    exception is raised here, once every rank ended: its peers' waits end at ``timeout``)."""
    shared = ThreadWorld()
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            with ThreadComm(shared, rank, world, timeout) as comm:
                results[rank] = fn(comm, *args)
        except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
            errors.append(error)

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
