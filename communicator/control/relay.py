"""The event log's news shared by the processes of one host, so that the store sees one reader per host.

Every waiting rank looks at the log about once a second; at 10,000 ranks that alone is 10,000
store requests a second, and a record posted once costs three requests per rank to read. So the
processes of a world on one host share a *relay* file: whichever of them looks when nobody on
the host has read the store for :func:`relay_seconds` takes the file's lock, reads the store, and
appends the new records (numbered) to the file; the others read the file, which costs no
request. The store then sees about one look per host per period, whatever the ranks per host.

A record reaches a waiting rank within one period plus one local look (:data:`LOCAL_LOOK_SECONDS`).
A process that finds the file gone or replaced reads it again from the start: records carry their
numbers, so none is taken twice. A host whose temporary directory cannot hold the file (or a
world of one rank per host) reads the store directly, as before. A process removes its relay
when its world stops; ones left by killed processes are removed after :data:`STALE_SECONDS`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["LOCAL_LOOK_SECONDS", "Relay", "Turn", "relay_seconds"]

#: How often a waiting rank reads the relay (a file read: no store request).
LOCAL_LOOK_SECONDS = 0.25
#: How long a relay nobody reads or writes stays in the temporary directory.
STALE_SECONDS = 86_400.0
_FASTEST = 0.25  # the host reads the store at most this often
_SLOWEST = 1.0  # and at least this often while one of its ranks waits
_swept = False  # whether this process removed the stale relays already
_HEAD_SIZE = 34  # a relay's first line: "#", a random name in 32 hex digits, a newline


def relay_seconds(local_size: int) -> float:
    """How long a host's read of the store stays fresh: shorter for more ranks per host, so that
    each process's share of the host's looks is at most one a second (two a second per host for
    two ranks, four a second for four or more)."""
    return min(_SLOWEST, max(_FASTEST, _SLOWEST / max(local_size, 1)))


class Relay:
    """One world's relay file on this host (see the module docstring)."""

    def __init__(self, path: Path, seconds: float, clock: Callable[[], float] = time.time) -> None:
        self.path, self.seconds, self._clock = path, seconds, clock
        self._offset = 0
        self._head = b""  # the first line of the file last read: which file it was
        self._stamp = 0.0  # when the host last read the store, as the file said at the last read

    @classmethod
    def open(cls, token: str, host: str, local_size: int, clock: Callable[[], float] = time.time) -> Relay | None:
        """The relay of the world named ``token`` on ``host``; ``None`` where none is worth it or
        the temporary directory is not this user's alone."""
        if local_size < 2:
            return None
        folder = Path(tempfile.gettempdir()) / f"communicator-{os.getuid()}"
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            state = folder.stat()
        except OSError:
            return None
        if state.st_uid != os.getuid() or state.st_mode & 0o077:
            return None
        _sweep(folder)
        return cls(folder / f"{token}-{host}.relay", relay_seconds(local_size), clock)

    def read(self) -> list[tuple[int, bytes]]:
        """The records appended since the last read, as ``(number, record)``."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return []
        try:
            return self._read(fd)
        finally:
            os.close(fd)

    def _read(self, fd: int) -> list[tuple[int, bytes]]:
        self._stamp = os.fstat(fd).st_mtime
        # A file made again after a removal may get the old one's inode: its own first line, a
        # random name its maker wrote, tells it apart.
        head = os.pread(fd, _HEAD_SIZE, 0)
        if len(head) < _HEAD_SIZE:  # its maker has not named it yet: nothing in it
            return []
        if head != self._head:  # a new file: from its start
            self._head, self._offset = head, _HEAD_SIZE
        data = os.pread(fd, 1 << 24, self._offset)
        complete = data[: data.rfind(b"\n") + 1]  # a line being appended is read next time
        self._offset += len(complete)
        records = []
        for line in complete.splitlines():
            number, _, record = line.partition(b" ")
            records.append((int(number), record))
        return records

    def due(self) -> bool:
        """Whether the host's read of the store is older than the period (as of the last read)."""
        return self._clock() - self._stamp >= self.seconds

    def turn(self) -> Turn | None:
        """This process's turn to read the store for the host, or ``None``: another process read
        it within the period, or reads it right now."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
            os.write(fd, b"#%s\n" % uuid.uuid4().hex.encode())  # its name: _HEAD_SIZE bytes
            os.utime(fd, (0, 0))  # made now: the store never read for it yet
        except FileExistsError:
            fd = -1
        except OSError:
            return Turn(self, -1, [])  # no file: this process reads the store for itself
        try:
            if fd < 0:
                fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            offset, head = self._offset, self._head
            records = self._read(fd)
            if not self.due():  # read by another process since: leave its records for the next read
                self._offset, self._head = offset, head
                os.close(fd)
                return None
            return Turn(self, fd, records)
        except OSError:  # another process holds the lock: it reads the store for the host now
            if fd >= 0:
                os.close(fd)
            return None

    def stamp(self) -> float:
        """Note that this process read the store for the host now; the time, by the relay's clock."""
        self._stamp = self._clock()
        return self._stamp

    def skip(self, size: int) -> None:
        """Bytes this process appended itself: not read back."""
        self._offset += size

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def _sweep(folder: Path) -> None:
    """Remove, once per process, the relays nobody has used for a day: their processes were killed
    (one that closes removes its own), and a relay still in use is made again at its next read."""
    global _swept
    if _swept:
        return
    _swept = True
    stale = time.time() - STALE_SECONDS
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.name.endswith(".relay") and entry.stat().st_mtime < stale:
                    os.unlink(entry.path)


class Turn:
    """A turn to read the store for the host (the relay's lock held): ``records`` were appended
    since this process last read the file; :meth:`hand` gives the host what the store said."""

    def __init__(self, relay: Relay, fd: int, records: list[tuple[int, bytes]]) -> None:
        self.relay, self._fd, self.records = relay, fd, records

    def __enter__(self) -> Turn:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # and the lock with it
            self._fd = -1

    def hand(self, records: Sequence[tuple[int, bytes]]) -> None:
        now = self.relay.stamp()
        if self._fd < 0:
            return
        lines = b"".join(b"%d %s\n" % (number, record) for number, record in records)
        with contextlib.suppress(OSError):
            if lines:
                os.write(self._fd, lines)
                self.relay.skip(len(lines))
            os.utime(self._fd, (now, now))  # the host's read is fresh from now
