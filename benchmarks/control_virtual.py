"""The processes of the simulation's virtual ranks: each has a process id and a probe socket of its
own, in a table that says whether it still runs, so that a lost rank is found the way a real one
is (its host's ranks by its process id, a stall judge elsewhere by its probe) and nothing is
posted for it by hand. The control plane's liveness checks read this table while it is installed
(:func:`installed`), never ``/proc`` or the network.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import communicator.control.board as board_module
import communicator.control.liveness as liveness_module
from communicator.control.liveness import Hosts

__all__ = ["FIRST_PID", "Processes"]

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
        """While rank ``rank``'s world is made: its process id is its own, and its probe listens
        at ``address``:``port`` (a virtual socket, which the watcher never has to drain)."""
        self._making = (rank, address, port)
        getpid = os.getpid
        os.getpid = lambda: self.pid(rank)
        try:
            yield
        finally:
            os.getpid, self._making = getpid, None

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
        """The control plane's liveness checks ask this table; virtual ranks announce probes."""
        probe = SimpleNamespace(create_connection=self._connect, gethostname=socket.gethostname)
        announce = Hosts.announce

        def announced(hosts: Hosts, rank: int, listen: bool = True) -> None:
            announce(hosts, rank, True)  # with its (virtual) probe socket

        patches: list[tuple[object, str, object]] = [(board_module, "alive", self.alive)]
        patches += [(liveness_module, "alive", self.alive), (liveness_module, "socket", probe)]
        patches += [(Hosts, "_listen", self._listen), (Hosts, "announce", announced)]
        saved = [(where, name, getattr(where, name)) for where, name, _ in patches]
        for where, name, value in patches:
            setattr(where, name, value)
        try:
            yield
        finally:
            for where, name, value in saved:
                setattr(where, name, value)
