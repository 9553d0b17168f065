"""Ranks as processes talking over TCP sockets: a ``Communicator`` from point-to-point alone.

``SocketComm`` moves tensors as framed bytes between processes, without ``torch.distributed``
for data. It implements ``rank``, ``world_size``, ``_isend``, ``_irecv`` and ``_control_store``
(a ``torch.distributed.TCPStore``, through which the base class signals failures, closings and
stalls); every collective, object operation and subgroup is the base class's. ``run_processes``
runs a function on ``world`` local processes, as ``launch`` runs one on gloo ranks.

Run it with ``python docs/examples/socket_comm.py``.
"""

from __future__ import annotations

import multiprocessing
import queue
import socket
import threading
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import TCPStore

from communicator import CommConfig, Communicator
from communicator.handles import DONE, Work

_CLOSED = "Connection closed by peer"  # the text the base class reads as a lost peer


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
                if self.key[0] in self.comm._closed and box.empty():
                    raise RuntimeError(f"{_CLOSED}: rank {self.key[0]}") from None
                if timeout is not None:
                    return False
                continue
            self.into.view(-1).view(torch.uint8).copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done or not self.comm._mailbox(*self.key).empty()


class SocketComm(Communicator):
    """Rank ``rank`` of ``size`` processes; ``store`` is a ``TCPStore`` they all reach."""

    def __init__(self, store: TCPStore, rank: int, size: int, config: CommConfig | None = None) -> None:
        super().__init__(config)
        self._store, self._rank, self._size = store, rank, size
        self._boxes: defaultdict[tuple[int, int], queue.SimpleQueue[bytes]] = defaultdict(queue.SimpleQueue)
        self._lock, self._closed = threading.Lock(), set[int]()
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

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    def _control_store(self) -> TCPStore:
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
        self._closed.add(peer)


def _read(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += connection.recv(size - len(data))
    return data


def _rank_main(fn: Callable[..., Any], rank: int, world: int, port: int, timeout: float, args: Any, out: Any) -> None:
    store = TCPStore("127.0.0.1", port, world, False, timeout=timedelta(seconds=timeout))
    try:
        with SocketComm(store, rank, world, CommConfig(timeout=timeout)) as comm:
            out.put((rank, True, fn(comm, *args)))
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        out.put((rank, False, f"{type(error).__name__}: {error}"))


def run_processes(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 60.0) -> list[Any]:
    """``fn(comm, *args)`` on ``world`` local processes (``fn`` importable); results in rank order.
    A rank's exception is raised here as a ``RuntimeError`` naming it."""
    store = TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False)  # held here: it outlives any rank
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    ranks = [
        context.Process(target=_rank_main, args=(fn, r, world, store.port, timeout, args, out)) for r in range(world)
    ]
    for process in ranks:
        process.start()
    try:
        reports = sorted(out.get(timeout=timeout * 2 + 30) for _ in ranks)
    finally:
        for process in ranks:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    failed = [f"rank {rank}: {value}" for rank, ok, value in reports if not ok]
    if failed:
        raise RuntimeError("; ".join(failed))
    return [value for _, _, value in reports]


def demo(comm: Communicator) -> tuple[Any, ...]:
    total = comm.all_reduce(torch.tensor([float(comm.rank)]))
    pair = comm.split(color=comm.rank // 2)
    return total.item(), comm.all_gather_object(comm.rank), pair.all_gather_object(comm.rank)


def main() -> list[Any]:
    results = run_processes(demo, 4)
    assert results[0] == (6.0, [0, 1, 2, 3], [0, 1])
    for rank, result in enumerate(results):
        print(f"rank {rank}: {result}")
    return results


if __name__ == "__main__":
    main()
