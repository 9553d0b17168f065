"""Whether a silent peer is alive: by its process id on this host, by a connection to its probe
socket on another.

A process that is stopped, or holds the GIL in one long C call, writes nothing, and yet it is
alive: its process id still exists, and the kernel still completes TCP connections to a socket
it listens on. So each process listens on a *probe socket* that it never has to serve (the kernel
queues connections; the watcher thread drains them when it runs), and announces where, with one
request of its own at startup. A peer is *lost* only when its process is gone (same host: no
such process id; another host: the probe connection is refused, or its host does not answer);
a silent process is only named in a warning, never declared lost before the operation's timeout.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time

from communicator.control.log import StoreHandle, guarded_store
from communicator.control.processes import alive
from communicator.control.records import Seal

__all__ = ["LOCAL_SECONDS", "PROBE_SECONDS", "Hosts"]

#: How long a connection to another host's probe socket may take before that host counts as gone.
PROBE_SECONDS = 3.0
#: How often the ranks of this host are read again while some have not announced themselves.
LOCAL_SECONDS = 1.0
_BACKLOG = 1024


_NOWHERE = ("", 0, "", 0)  # a rank whose record is not one: on no host, with no probe


def _place(fields: list[str]) -> tuple[str, int, str, int] | None:
    """A ``where/`` record's fields, ``host pid address port``; ``None`` for anything else."""
    if len(fields) != 4 or not (fields[1].isdigit() and fields[3].isdigit()) or len(fields[1]) > 9:
        return None
    port = int(fields[3])
    return (fields[0], int(fields[1]), fields[2], port) if port < 65536 else None


class Hosts:
    """Where the ranks of one world run, learnt lazily: one key per host lists its ranks' process
    ids, one key per rank says its host, process id and probe address."""

    def __init__(self, store: StoreHandle, host: str = "", address: str = "", seal: Seal | None = None) -> None:
        self._store = store
        self._seal = seal if seal is not None else Seal()
        self.host = host or socket.gethostname()
        self._address = address
        self._probe: socket.socket | None = None
        self._local: dict[int, int] | None = None  # world rank -> pid, for the ranks on this host
        self._local_read = -LOCAL_SECONDS  # when the host's key was last read (time.monotonic)
        self._where: dict[int, tuple[str, int, str, int]] = {}  # world rank -> (host, pid, address, port)

    def announce(self, world_rank: int, listen: bool = True) -> None:
        """Say where this process runs and listens: two requests, once per world."""
        probe = self._listen() if listen else None
        port = probe.getsockname()[1] if probe is not None else 0
        pid, here, there = os.getpid(), f"host/{self.host}", f"where/{world_rank}"
        guarded_store(lambda: self._store.append(here, self._seal.seal(here, f"{world_rank}:{pid}") + ";"))
        record = f"{self.host} {pid} {self._address or self.host} {port}"
        guarded_store(lambda: self._store.set(there, self._seal.seal(there, record)))

    def _listen(self) -> socket.socket | None:
        if self._probe is None:
            # Without SO_REUSEADDR (which create_server sets): a port it picks is then never one
            # that another socket (a gloo listener between its bind and its listen) holds too.
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                probe.bind(("", 0))
                probe.listen(_BACKLOG)
                probe.setblocking(False)
            except OSError:
                probe.close()
                return None
            self._probe = probe
        return self._probe

    def drain(self) -> None:
        """Close the probe connections queued since the last drain (from the watcher thread)."""
        probe = self._probe
        if probe is None:
            return
        with contextlib.suppress(OSError):
            while True:
                connection, _ = probe.accept()
                connection.close()

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def local(self, expected: int, now: float | None = None) -> dict[int, int]:
        """The ranks known to run on this host, with their process ids (one request, repeated at
        most every :data:`LOCAL_SECONDS` while fewer than ``expected`` have announced themselves:
        each look of a wait asks, and a process started late on a loaded host may take seconds);
        ``now``: the caller's clock, if it has one."""
        now = time.monotonic() if now is None else now
        if self._local is None or (len(self._local) < expected and now - self._local_read >= LOCAL_SECONDS):
            self._local_read = now
            key = f"host/{self.host}"
            found = {}
            for entry in filter(None, guarded_store(lambda: self._store.get(key)).split(b";")):
                rank, _, pid = (self._seal.open(key, entry) or "").partition(":")
                if rank.isdigit() and pid.isdigit() and len(rank) < 10 and len(pid) < 10:
                    found[int(rank)] = int(pid)
            self._local = found
        return self._local

    def where(self, ranks: list[int]) -> dict[int, tuple[str, int, str, int]]:
        """``rank -> (host, pid, probe address, probe port)``; one request for those not yet known."""
        unknown = [rank for rank in ranks if rank not in self._where]
        if unknown:
            keys = [f"where/{rank}" for rank in unknown]
            values = guarded_store(lambda: self._store.multi_get(keys))
            for rank, key, value in zip(unknown, keys, values, strict=True):
                place = _place((self._seal.open(key, value) or "").split())
                if place is not None:  # else not known: never declared lost by its record
                    self._where[rank] = place
        return {rank: self._where.get(rank, _NOWHERE) for rank in ranks}

    def gone(self, rank: int) -> str:
        """Why ``rank``'s process is gone, or "" while it is alive (stopped and busy count as alive)."""
        host, pid, address, port = self.where([rank])[rank]
        if host == self.host:
            return "" if alive(pid) else f"its process (pid {pid}) has exited"
        if port == 0:
            return ""  # it could not listen: nothing tells, so it is not declared lost
        try:
            with socket.create_connection((address, port), timeout=PROBE_SECONDS):
                return ""
        except ConnectionRefusedError:
            return f"its process on {host} (pid {pid}) has exited"
        except OSError as error:
            if error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN) or isinstance(
                error, TimeoutError
            ):
                return f"its host {host} does not answer"
            return ""
