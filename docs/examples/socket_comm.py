"""Ranks as processes talking over TCP sockets: a ``Communicator`` from point-to-point alone.

``SocketComm`` moves tensors as framed bytes between processes, without ``torch.distributed``
for data. It implements ``rank``, ``world_size``, ``_isend``, ``_irecv`` and ``_control_store``
(a ``torch.distributed.TCPStore``, through which the base class signals failures, closings and
stalls); every collective, object operation and subgroup is the base class's. Registered as
``"socket"`` with the hook ``from_launcher``, it is what ``Communicator.create({"type": "socket"})``
builds under ``launch()``, torchrun, srun or mpirun: rank 0 serves the store at the launcher's
master address and port (under torchrun, whose agent serves one there, every rank joins that).
Its ranks listen on 127.0.0.1, so they must share one machine.

Run it with ``python docs/examples/socket_comm.py`` (``launch`` starts four ranks), or as one rank
of a launcher's job: ``torchrun --nproc-per-node 3 docs/examples/socket_comm.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import socket
import threading
import time
from collections import defaultdict
from datetime import timedelta
from typing import Any, Self

import torch
from torch.distributed import PrefixStore, Store, TCPStore

from communicator import CommConfig, Communicator, launch
from communicator.handles import DONE, Work
from communicator.launchers import LauncherEnv

_CLOSED = "Connection closed by peer"  # the text the base class reads as a lost peer
_BUILT = itertools.count()  # every rank builds its communicators in the same order: one store prefix each


class Received:
    """A started receive: ``wait(timeout)`` copies the message in, returns ``False`` when
    ``timeout`` ran out, and raises once the peer's connection closed with nothing left to read."""

    def __init__(self, comm: SocketComm, key: tuple[int, int], into: torch.Tensor) -> None:
        self.comm, self.key, self.into, self.done = comm, key, into, False

    def wait(self, timeout: timedelta | None = None) -> bool:
        box = self.comm._mailbox(*self.key)
        while not self.done:
            try:
                data = box.get(timeout=1.0 if timeout is None else min(timeout.total_seconds(), 1.0))
            except queue.Empty:
                if self.key[0] in self.comm._gone and box.empty():
                    raise RuntimeError(f"{_CLOSED}: rank {self.key[0]}") from None
                if timeout is not None:
                    return False
                continue
            self.into.view(-1).view(torch.uint8).copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done or not self.comm._mailbox(*self.key).empty()


@Communicator.register("socket")
class SocketComm(Communicator):
    """Rank ``rank`` of ``size`` processes; ``store`` is a store they all reach (``hosts``: served here)."""

    def __init__(
        self, store: Store, rank: int, size: int, config: CommConfig | None = None, hosts: bool = False
    ) -> None:
        super().__init__(config)
        self._store, self._rank, self._size, self._hosts = store, rank, size, hosts
        self._boxes: defaultdict[tuple[int, int], queue.SimpleQueue[bytes]] = defaultdict(queue.SimpleQueue)
        self._lock, self._gone = threading.Lock(), set[int]()  # peers whose connection closed
        listener = socket.create_server(("127.0.0.1", 0))
        store.set(f"address/{rank}", str(listener.getsockname()[1]))
        self._peers: dict[int, socket.socket] = {}
        for peer in range(rank):  # connect to the lower ranks, accept the higher ones
            self._peers[peer] = socket.create_connection(("127.0.0.1", int(store.get(f"address/{peer}"))))
            self._peers[peer].sendall(rank.to_bytes(4, "big"))
        for _ in range(rank + 1, size):
            connection, _ = listener.accept()
            self._peers[int.from_bytes(_read(connection, 4), "big")] = connection
        listener.close()
        self._send_locks = {peer: threading.Lock() for peer in self._peers}
        for peer, connection in self._peers.items():
            threading.Thread(target=self._read_from, args=(peer, connection), daemon=True).start()

    @classmethod
    def from_launcher(cls, config: CommConfig, launcher: LauncherEnv) -> Self:
        """What ``create({"type": "socket"})`` calls, with the launcher's view of this process."""
        hosts = launcher.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        store = TCPStore(launcher.master_addr, launcher.master_port, launcher.world_size, hosts, timeout=config.timeout)
        return cls(PrefixStore(f"socket{next(_BUILT)}/", store), launcher.rank, launcher.world_size, config, hosts)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    def _control_store(self) -> Store:
        return self._store

    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        data = tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        header = f"{tag} {len(data)}\n".encode()
        with self._send_locks[dst]:  # the peer's reader drains its socket: sendall never waits on a receive
            self._peers[dst].sendall(header + data)
        return DONE

    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        return Received(self, (src, tag), tensor)

    def _teardown(self, error: BaseException | None) -> None:
        for connection in self._peers.values():
            connection.close()
        with contextlib.suppress(Exception):  # the store's process may be gone
            self._store.add("left", 1)
            # Serving the store, this process stays until the others, which may still read it, left.
            deadline = time.monotonic() + (5.0 if error else self.config.timeout.total_seconds())
            while self._hosts and self._store.add("left", 0) < self._size and time.monotonic() < deadline:
                time.sleep(0.05)

    def _mailbox(self, src: int, tag: int) -> queue.SimpleQueue[bytes]:
        with self._lock:
            return self._boxes[src, tag]

    def _read_from(self, peer: int, connection: socket.socket) -> None:
        stream = connection.makefile("rb")
        try:
            while header := stream.readline():
                tag, size = map(int, header.split())
                self._mailbox(peer, tag).put(stream.read(size))
        except (OSError, ValueError):
            pass  # closed here or there
        self._gone.add(peer)


def _read(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += connection.recv(size - len(data))
    return data


def demo(comm: Communicator) -> tuple[Any, ...]:
    total = comm.all_reduce(torch.tensor([float(comm.rank)]))
    pair = comm.split(color=comm.rank // 2)
    return type(comm).__name__, total.item(), comm.all_gather_object(comm.rank), pair.all_gather_object(comm.rank)


def expected(rank: int, world: int) -> tuple[Any, ...]:
    """What ``demo`` returns on ``rank`` of ``world``, from the rank numbers alone."""
    first = rank // 2 * 2
    return "SocketComm", float(sum(range(world))), list(range(world)), list(range(first, min(first + 2, world)))


def report(rank: int, world: int, result: tuple[Any, ...]) -> None:
    assert result == expected(rank, world), (rank, world, result)
    print(f"rank {rank} of {world}: {result}")


def main() -> None:
    # Under torchrun, srun or mpirun this process is one rank; as a plain script it is a world of one,
    # and launch() starts four ranks instead.
    with Communicator.create({"type": "socket"}) as comm:
        launched = comm.is_distributed
        if launched:
            report(comm.rank, comm.world_size, demo(comm))
    if not launched:
        for rank, result in enumerate(launch(demo, 4, {"type": "socket"})):
            report(rank, 4, result)


if __name__ == "__main__":
    main()
