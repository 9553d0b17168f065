"""What the processes of one host do once for the host, beside the relay: their heartbeat, and
their candidate for a stall judge.

**Heartbeats.** A process whose state does not change still writes its status every
:func:`~communicator.control.stalls.heartbeat_seconds`, so that a judge can tell a stopped
process (alive, silent) from an idle one. Where a relay serves, each process keeps its status in
a file of the host's (every :data:`KEEP_SECONDS`, no request), and whichever process finds the
host's heartbeat due writes every status of the host in one request: the store sees one
heartbeat per host, and a stopped process's status still stops growing younger, since it no
longer rewrites its file. (A changed state is still written by its process at once.)

**Candidates.** The waiting members of an operation elect a judge each term, one request each;
here only the first process of a host to ask in a term stands, so that an election costs one
request per host.

The files sit beside the relay (see :mod:`communicator.control.relay`), and go with it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from communicator.control.relay import NOFOLLOW, Relay

__all__ = ["KEEP_SECONDS", "Neighbours"]

#: How often a process rewrites its status in its host's file (a file write: no request).
KEEP_SECONDS = 1.0
_TERMS_KEPT = 2  # candidacies older than this many terms are dropped from the host's file


class Neighbours:
    """The host's shared files of one world (named after its relay); ``clock``: wall time."""

    def __init__(self, relay: Relay, clock: Callable[[], float]) -> None:
        base = relay.path.with_suffix("")
        self._base, self._clock = base, clock
        self._beats = base.with_name(base.name + ".beats")
        self._judge = base.with_name(base.name + ".judge")

    def _status_file(self, rank: int, pid: int) -> Path:
        return self._base.with_name(f"{self._base.name}.{rank}-{pid}.status")

    def keep(self, rank: int, status: str) -> bool:
        """This process's status, for the host's next heartbeat (written whole, then renamed);
        whether it was kept."""
        path = self._status_file(rank, os.getpid())
        part = path.with_name(path.name + ".part")
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o600)
            try:
                os.write(fd, status.encode())
            finally:
                os.close(fd)
            os.replace(part, path)
        except OSError:
            return False
        return True

    def beat(self, every: float, ranks: Callable[[], dict[int, int]]) -> dict[int, str] | None:
        """The statuses of the host's processes (``ranks``: world rank -> pid) when the host's
        heartbeat is due (every ``every`` seconds) and this process takes it; else nothing
        (``None``: the host's file cannot be used)."""
        with self._locked(self._beats) as fd:
            if fd == -2:
                return None
            if fd < 0 or self._clock() - os.fstat(fd).st_mtime < every:
                return {}
            now = self._clock()
            os.utime(fd, (now, now))
            found = {}
            for rank, pid in ranks().items():
                with contextlib.suppress(OSError):
                    found[rank] = self._status_file(rank, pid).read_text()
            return found

    def stand(self, key: str, term: int) -> bool:
        """Whether this process is its host's candidate for judging ``key`` in ``term``: the first
        to ask is (a host whose file cannot be used: every process stands)."""
        with self._locked(self._judge) as fd:
            if fd < 0:
                return fd == -2
            try:
                terms = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
                if not isinstance(terms, dict):
                    terms = {}
            except ValueError:
                terms = {}
            if terms.get(key, -1) >= term:
                return False
            terms = {k: t for k, t in terms.items() if isinstance(t, int) and t > term - _TERMS_KEPT}
            terms[key] = term
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(terms).encode(), 0)
            return True

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[int]:
        """``path`` open and locked (never waiting); -1: another process holds it; -2: no file."""
        try:
            made = not path.exists()
            fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
        except OSError:
            yield -2
            return
        try:
            if made:  # a new host's heartbeat: its processes wrote their first status just now
                now = self._clock()
                os.utime(fd, (now, now))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield -1
                return
            yield fd
        finally:
            os.close(fd)

    def forget(self, rank: int) -> None:
        """This process's world stopped: its status file goes, the host's files with it (made
        again by the processes still there)."""
        for path in (self._status_file(rank, os.getpid()), self._beats, self._judge):
            with contextlib.suppress(OSError):
                path.unlink()
