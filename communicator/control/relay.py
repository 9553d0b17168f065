"""The event log's news shared by the processes of one host, so that the store sees one reader per host.

Every waiting rank looks at the log about once a second; at 10,000 ranks that alone is 10,000
store requests a second, and a record posted once costs three requests per rank to read. So the
processes of a world on one host share a *relay* file: whichever of them looks when nobody on
the host has read the store for :func:`relay_seconds` takes the file's lock (never waiting for
it), reads the store, and appends the new records (numbered, checked: one JSON object a line) to
the file; the others read the file, which costs no request. The store then sees about one look
per host per period, whatever the ranks per host.

A process takes the host's turn only while its own share of reads allows (one a second past a
burst, see :class:`~communicator.control.log.EventLog`), so a record reaches a waiting rank within
one period plus two local looks (:data:`LOCAL_LOOK_SECONDS`) where another process of the host
waits too, or a second and a local look where it waits alone.
A process that finds the file gone or replaced reads it again from the start: records carry their
numbers, so none is taken twice. A line that is not ``<number> <record>`` is skipped (warned of
once per file) and never read again. When the file has not been refreshed for
:meth:`Relay.stuck` (its lock holder is stopped, in a debugger, or gone), the others read the
store themselves. A host whose temporary directory cannot hold the file (or a world of one rank
per host) reads the store directly, as before.

The files live in ``communicator-<uid>`` in the temporary directory, used only when it is a real
directory (not a symbolic link) of this user's with mode 0700; files are opened without following
links. A process removes its relay when its world stops, and the folder when it is empty then.
A relay whose maker's process is gone is removed by the next process of this user that opens or
closes one; one with no readable maker, after :data:`STALE_SECONDS`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from communicator.control.processes import alive

__all__ = ["LOCAL_LOOK_SECONDS", "NOFOLLOW", "Relay", "Turn", "relay_seconds"]

#: How often a waiting rank reads the relay (a file read: no store request).
LOCAL_LOOK_SECONDS = 0.25
#: How long a relay whose maker is unknown stays in the temporary directory unused.
STALE_SECONDS = 86_400.0
#: How long a relay may go without a read of the store before its readers read the store themselves.
STUCK_SECONDS = 2.0
_FASTEST = 0.5  # the host reads the store at most this often
_SLOWEST = 1.0  # and at least this often while one of its ranks waits
_swept = False  # whether this process removed the relays unused for a day already
_HEAD = re.compile(rb"#[0-9a-f]{32} (\d{10})\n")  # a relay's first line: a random name, its maker's pid
_HEAD_SIZE = 45
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK  # never a link; never waits (a FIFO in its place)

logger = logging.getLogger("communicator")


def relay_seconds(local_size: int) -> float:
    """How long a host's read of the store stays fresh: shorter for more ranks per host, so that
    the host's looks, shared by its processes, are one a second for each of them at most, and a
    host looks at most twice a second however many ranks it runs (its share of the job's load,
    with its heartbeat and its candidate for a stall judge, stays under three requests a
    second)."""
    return min(_SLOWEST, max(_FASTEST, _SLOWEST / max(local_size, 1)))


def folder() -> Path | None:
    """This user's folder for relays, made if needed; ``None`` unless it is a real directory of
    this user's with mode 0700 (a symbolic link, or one that others may write in, is not used)."""
    path = Path(tempfile.gettempdir()) / f"communicator-{os.getuid()}"
    with contextlib.suppress(FileExistsError, OSError):
        os.mkdir(path, 0o700)
    try:
        state = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(state.st_mode) or state.st_uid != os.getuid() or stat.S_IMODE(state.st_mode) != 0o700:
        return None
    return path


def _maker(head: bytes) -> int | None:
    """The process id a relay's first line names; ``None`` for a line that is not a relay's."""
    found = _HEAD.fullmatch(head)
    return int(found.group(1)) if found else None


class Relay:
    """One world's relay file on this host (see the module docstring)."""

    def __init__(self, path: Path, seconds: float, clock: Callable[[], float] = time.time) -> None:
        self.path, self.seconds, self._clock = path, seconds, clock
        self._offset = 0
        self._head = b""  # the first line of the file last read: which file it was
        self._stamp = 0.0  # when the host last read the store, as the file said at the last read
        self._warned = b""  # the file whose bad lines were warned of

    @classmethod
    def open(cls, token: str, host: str, local_size: int, clock: Callable[[], float] = time.time) -> Relay | None:
        """The relay of the world named ``token`` on ``host``; ``None`` where none is worth it or
        the temporary directory's folder is not this user's alone."""
        if local_size < 2:
            return None
        where = folder()
        if where is None:
            return None
        _sweep(where)
        return cls(where / f"{token}-{host}.relay", relay_seconds(local_size), clock)

    def read(self) -> list[tuple[int, bytes]]:
        """The records appended since the last read, as ``(number, record)``."""
        try:
            fd = os.open(self.path, os.O_RDONLY | NOFOLLOW)
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
        if _maker(head) is None:  # not a relay's first line: made again by the next turn
            self._warn(head, "its first line is not a relay's")
            self.remove()
            return []
        if head != self._head:  # a new file: from its start
            self._head, self._offset = head, _HEAD_SIZE
        data = os.pread(fd, 1 << 24, self._offset)
        complete = data[: data.rfind(b"\n") + 1]  # a line being appended is read next time
        self._offset += len(complete)
        records = []
        for line in complete.splitlines():
            number, _, record = line.partition(b" ")
            if not (number.isdigit() and len(number) < 20 and record):
                self._warn(head, "a line is not <number> <record>")
                continue
            records.append((int(number), record))
        return records

    def _warn(self, head: bytes, why: str) -> None:
        if self._warned != head:
            self._warned = head
            logger.warning("communicator: the relay %s is damaged (%s): skipped, read from the store", self.path, why)

    def due(self) -> bool:
        """Whether the host's read of the store is older than the period (as of the last read)."""
        return self._clock() - self._stamp >= self.seconds

    def stuck(self) -> bool:
        """Whether nobody has read the store for the host for long (as of the last read): the
        process whose turn it is may be stopped; the readers read the store themselves."""
        return self._clock() - self._stamp >= max(STUCK_SECONDS, 4 * self.seconds)

    def turn(self) -> Turn | None:
        """This process's turn to read the store for the host, or ``None``: another process read
        it within the period, or holds the turn now (the lock is never waited for)."""
        try:
            fd = self._make()
        except FileExistsError:
            fd = -1
        except OSError:
            return Turn(self, -1, [])  # no file: this process reads the store for itself
        try:
            if fd < 0:
                fd = os.open(self.path, os.O_RDWR | os.O_APPEND | NOFOLLOW)
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

    def _make(self) -> int:
        """A new relay file, named (its first line) by this process; ``FileExistsError`` if there is one."""
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | NOFOLLOW
        try:
            fd = os.open(self.path, flags, 0o600)
        except FileNotFoundError:  # the folder was removed when it was empty: made again
            if folder() != self.path.parent:
                raise
            fd = os.open(self.path, flags, 0o600)
        os.write(fd, b"#%s %010d\n" % (uuid.uuid4().hex.encode(), os.getpid()))  # _HEAD_SIZE bytes
        os.utime(fd, (0, 0))  # made now: the store never read for it yet
        return fd

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

    def close(self) -> None:
        """This process's world stopped: its relay goes, those of processes that are gone too, and
        the folder when nothing is left in it."""
        self.remove()
        _sweep(self.path.parent)
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()


def _sweep(where: Path) -> None:
    """Remove the relays whose maker's process is gone (one still in use is made again at its next
    turn), and, once per process, those with no readable maker unused for :data:`STALE_SECONDS`;
    and the statuses kept for a host's heartbeat (:mod:`communicator.control.neighbours`) of
    processes that are gone."""
    global _swept
    old, _swept = (None if _swept else time.time() - STALE_SECONDS), True
    with contextlib.suppress(OSError), os.scandir(where) as entries:
        for entry in entries:
            if entry.name.endswith(".status"):  # a process's status for its host's heartbeat: pid last
                pid = entry.name.removesuffix(".status").rpartition("-")[2]
                if pid.isdigit() and len(pid) < 10 and not alive(int(pid)):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                continue
            if not entry.name.endswith(".relay"):
                continue
            with contextlib.suppress(OSError):
                fd = os.open(entry.path, os.O_RDONLY | NOFOLLOW)
                try:
                    maker, made = _maker(os.pread(fd, _HEAD_SIZE, 0)), os.fstat(fd).st_mtime
                finally:
                    os.close(fd)
                if (maker is not None and not alive(maker)) or (maker is None and old is not None and made < old):
                    os.unlink(entry.path)
    _sweep_host_files(where)


def _sweep_host_files(where: Path) -> None:
    """Remove a host's heartbeat and candidacy files (:mod:`communicator.control.neighbours`)
    whose relay is gone: a job killed before it closed leaves them, and nothing else would."""
    with contextlib.suppress(OSError), os.scandir(where) as entries:
        for entry in entries:
            base, dot, kind = entry.name.rpartition(".")
            if dot and kind in ("beats", "judge") and not os.path.lexists(os.path.join(where, f"{base}.relay")):
                with contextlib.suppress(OSError):
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
        """Append ``records`` (checked: one line each, which a line break would split, is not handed)."""
        now = self.relay.stamp()
        if self._fd < 0:
            return
        lines = b"".join(b"%d %s\n" % (n, r) for n, r in records if b"\n" not in r and b"\r" not in r)
        with contextlib.suppress(OSError):
            if lines:
                os.write(self._fd, lines)
                self.relay.skip(len(lines))
            os.utime(self._fd, (now, now))  # the host's read is fresh from now
