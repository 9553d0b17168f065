"""The processes of the simulation's virtual ranks: each has a process id and a probe socket of its
own, in a table that says whether it still runs, so that a lost rank is found the way a real one
is (its host's ranks by its process id, a stall judge elsewhere by its probe) and nothing is
posted for it by hand. The control plane's liveness checks read this table while it is installed
(:meth:`Processes.installed`), never ``/proc`` or the network.

The records of the operations the virtual ranks run (what a status says of how long one has run)
follow the simulation's clock (:func:`timed_by`), as every other time they publish does.

What N real processes would each parse of the same record, the virtual ranks share
(:func:`shared_records`): one parsed record or failure per text, never changed once parsed.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import communicator.control.board as board_module
import communicator.control.liveness as liveness_module
import communicator.control.log as log_module
import communicator.control.stalls as stalls_module
import communicator.guard as guard_module
import communicator.observe.events as events_module
from communicator.control.liveness import Hosts
from communicator.control.neighbours import Neighbours

__all__ = ["FIRST_PID", "Processes", "shared_records", "timed_by"]

#: The process id of virtual rank 0; rank ``r``'s is ``FIRST_PID + r`` (7 digits, as a busy host's are).
FIRST_PID = 1_000_000


class Processes:
    """Virtual ranks' processes: which are gone, and where their probe sockets listen."""

    def __init__(self) -> None:
        self.gone: set[int] = set()  # process ids that have exited
        self._probes: dict[tuple[str, int], int] = {}  # (address, port) -> process id
        self._making: tuple[int, str, int] | None = None  # the rank whose world is being made

    def pid(self, rank: int) -> int:
        return FIRST_PID + rank

    def exit(self, rank: int) -> None:
        """Rank ``rank``'s process exits: its process id is gone, its probe refuses connections."""
        self.gone.add(self.pid(rank))

    def alive(self, pid: int) -> bool:
        return pid not in self.gone

    @contextlib.contextmanager
    def making(self, rank: int, address: str, port: int) -> Iterator[None]:
        """While rank ``rank``'s world is made: its process id is its own (as it announces it), and its probe listens
        at ``address``:``port`` (a virtual socket, which the watcher never has to drain)."""
        self._making = (rank, address, port)
        try:
            yield
        finally:
            self._making = None

    def _getpid(self) -> int:
        """The process id of the rank being made; outside, one as long (what a status names)."""
        return FIRST_PID if self._making is None else self.pid(self._making[0])

    def _listen(self) -> Any:
        assert self._making is not None
        rank, address, port = self._making
        self._probes[(address, port)] = self.pid(rank)
        return SimpleNamespace(getsockname=lambda: (address, port))

    def _connect(self, where: tuple[str, int], timeout: float | None = None) -> contextlib.nullcontext[None]:
        if self._probes.get(where, -1) in self.gone:
            raise ConnectionRefusedError(f"no process listens at {where}")
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The control plane's liveness checks ask this table; virtual ranks announce probes, and
        keep their statuses for their host's heartbeat under their own process ids."""
        probe = SimpleNamespace(create_connection=self._connect, gethostname=socket.gethostname)
        announce = Hosts.announce

        def announced(hosts: Hosts, rank: int, listen: bool = True) -> None:
            announce(hosts, rank, True)  # with its (virtual) probe socket

        patches: list[tuple[object, str, object]] = [(board_module, "alive", self.alive)]
        patches += [(liveness_module, "alive", self.alive), (liveness_module, "socket", probe)]
        process = SimpleNamespace(getpid=self._getpid)
        patches += [(liveness_module, "os", process), (stalls_module, "os", process)]
        patches += [(Hosts, "_listen", self._listen), (Hosts, "announce", announced)]
        status_file = Neighbours._status_file

        def named(neighbours: Neighbours, rank: int, pid: int) -> Path:
            return status_file(neighbours, rank, self.pid(rank))  # the file of its process, virtual or not

        patches.append((Neighbours, "_status_file", named))
        with _patched(patches):
            yield


@contextlib.contextmanager
def shared_records() -> Iterator[None]:
    """Records and failures parsed once per text for every virtual rank (a rank's copy would only
    be read: N copies of each would hold the memory of N processes)."""
    parse, failure = getattr(log_module, "parse_record"), getattr(board_module, "_failure")  # noqa: B009
    records: dict[str, Any] = {}
    failures: dict[object, Any] = {}

    def parsed(text: str) -> Any:
        if text not in records:
            records[text] = parse(text)
        return records[text]

    def failed(text: object) -> Any:
        if not isinstance(text, str):
            return failure(text)  # raises as it would
        if text not in failures:
            failures[text] = failure(text)
        return failures[text]

    with _patched([(log_module, "parse_record", parsed), (board_module, "_failure", failed)]):
        yield


@contextlib.contextmanager
def timed_by(clock: Callable[[], float]) -> Iterator[None]:
    """Operations start and run (their records' clock) on ``clock``, not the real one."""
    events_time = SimpleNamespace(perf_counter=clock, time=time.time)
    with _patched(
        [(guard_module, "_clock", clock), (events_module, "_clock", clock), (events_module, "time", events_time)]
    ):
        yield


@contextlib.contextmanager
def _patched(patches: list[tuple[object, str, object]]) -> Iterator[None]:
    """Each ``(where, name, value)``: ``where.name`` is ``value`` inside, as it was after."""
    saved = [(where, name, getattr(where, name)) for where, name, _ in patches]
    for where, name, value in patches:
        setattr(where, name, value)
    try:
        yield
    finally:
        for where, name, value in saved:
            setattr(where, name, value)
