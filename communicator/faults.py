"""Failures that reach every rank: the failure board, bounded waits, and error translation.

A rank blocked in an operation cannot be interrupted by its peers through the backend (gloo
offers no abort that releases a blocked wait). So every wait is cut into short slices, and
between slices the waiting rank looks at the *failure board*: keys in the rendezvous store where
a rank posts that it failed, that it refused its arguments to operation number ``n``, or that it
closed its communicator after ``n`` operations. One counter in the store changes with every post,
so a look costs one store round trip; nothing is read while an operation finishes within a slice.

Point-to-point transfers are waited on whole in a helper thread (gloo treats a send's or
receive's wait timeout as the transfer's own: when it runs out, the connection closes).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from torch.distributed.distributed_c10d import PrefixStore, Store

from communicator.errors import (
    CollectiveMismatchError,
    CommError,
    CommTimeoutError,
    PeerClosedError,
    PeerLostError,
    RemoteError,
    RemoteFailure,
)
from communicator.stalls import Stall, Watch

__all__ = ["POLL_SECONDS", "FailureBoard", "PointToPoint", "TransferWaiter", "translate", "wait"]

#: How long a blocked wait runs before it looks at the failure board.
POLL_SECONDS = 0.05
_SLICE = timedelta(seconds=POLL_SECONDS)
#: How long a receive may wait after its peer closed (whatever the peer sent has arrived by then).
CLOSED_GRACE_SECONDS = 1.0
_LOST = ("Connection closed by peer", "Connection reset", "Broken pipe", "Socket closed", "ECONNRESET")


class FailureBoard:
    """Keys in the rendezvous store, one namespace per communicator (see the module docstring)."""

    def __init__(
        self, store: Store | _ClosedStore, world_size: int, name: str, parent: FailureBoard | None = None
    ) -> None:
        #: The namespace's path in the store; unique in the job.
        self.name = name
        self._parent = parent  # a subgroup's waiters also heed failures posted on the boards above
        self._above = [0] * self._depth()  # the event count of each board above at the last look
        self._store = store
        self._world_size = world_size
        self._barriers = 0
        self._children = 0
        self._seen = 0  # the event count at the last look
        self._processes: dict[int, int] | None = None

    def _depth(self) -> int:
        board, depth = self._parent, 0
        while board is not None:
            board, depth = board._parent, depth + 1
        return depth

    @classmethod
    def in_store(cls, store: Store, prefix: str, world_size: int, name: str) -> FailureBoard:
        return cls(PrefixStore(prefix + name, store), world_size, name)

    def release(self) -> None:
        """Drop the store: a store still referenced when the interpreter exits is torn down too late
        (rank 0's server thread then aborts the process)."""
        self._store = _ClosedStore()

    def next_child(self) -> int:
        """A number for the next batch of subgroups; every member asks in the same order, so numbers agree."""
        self._children += 1
        return self._children

    def child(self, world_size: int, name: str) -> FailureBoard:
        """A namespace for a subgroup, inside this one."""
        if isinstance(self._store, _ClosedStore):
            raise CommError("the communicator is closed: no new subgroups")
        return FailureBoard(PrefixStore(name, self._store), world_size, self.name + name, self)

    # -- posting ---------------------------------------------------------------------------

    def post(self, failure: RemoteFailure) -> None:
        """Announce that ``failure.rank`` failed for good; never raises (the store may be gone)."""
        self._post(f"fail/{failure.rank}", failure.to_json())

    def post_input(self, seq: int, failure: RemoteFailure) -> None:
        """Announce that ``failure.rank`` refused its arguments to operation number ``seq``."""
        self._post(f"input/{seq}/{failure.rank}", failure.to_json())

    def post_mismatch(self, error: CollectiveMismatchError) -> None:
        """Announce a mismatch found by a stalled rank, so that every member raises the same error."""
        self._post("mismatch", json.dumps({"what": error.what, "sides": error.sides}).encode())

    def publish(self, rank: int, status: str) -> None:
        """Write process ``rank``'s status (see :mod:`communicator.stalls`); raises if the store is gone."""
        self._store.set(f"status/{rank}", status)

    def statuses(self, ranks: Sequence[int]) -> dict[int, str]:
        """The statuses that ``ranks`` have written, by rank."""
        found = {}
        for rank in ranks:
            key = f"status/{rank}"
            if self._store.check([key]):
                found[rank] = self._store.get(key).decode()
        return found

    def post_closed(self, rank: int, seq: int, last: str) -> None:
        """Announce that ``rank`` closed its communicator after ``seq`` collectives, the last ``last``."""
        self._post(f"closed/{rank}", json.dumps({"seq": seq, "last": last}).encode())
        with contextlib.suppress(Exception):  # leaving must never fail
            self._store.add("closing", 1)

    def _post(self, key: str, value: bytes) -> None:
        try:
            if not self._store.check([key]):  # a rank's first report is the one worth keeping
                self._store.set(key, value.decode())
                self._store.add("events", 1)
        except Exception:  # noqa: BLE001 - a dead store must not hide the original error
            pass

    # -- looking ---------------------------------------------------------------------------

    def check(self, rank: int, seq: int, what: str) -> None:
        """Raise when a peer failed, refused its part of operation ``seq``, died, or closed before
        reaching it; ``what`` names what this rank waits in. One store round trip when nothing changed."""
        try:
            board, level = self._parent, 0
            while board is not None:  # a failure for good above explains anything seen here (a peer closing)
                self._above[level], failures = board.failures_since(self._above[level])
                if failures:
                    context = f"{what} on rank {rank} abandoned (ranks of the communicator it was split from)"
                    raise RemoteError(_first_causes(failures), context=context)
                board, level = board._parent, level + 1
            events = self._store.add("events", 0)
            if events != self._seen:
                self._seen = events
                self._raise_reported(rank, seq, what)
            for peer, pid in self._processes_on_host(rank).items():
                # A peer that closed first and then exited is judged by what it completed (above), not lost.
                if not _alive(pid) and not self._store.check([f"closed/{peer}"]):
                    raise PeerLostError(f"{what} on rank {rank}: rank {peer} (pid {pid}) has exited; a peer was lost")
        except CommError:
            raise
        except Exception:  # noqa: BLE001 - the store lives on world rank 0: unreachable means it is gone
            raise PeerLostError(
                f"{what} on rank {rank}: the rendezvous store (hosted by world rank 0) is unreachable"
            ) from None

    def failures_since(self, seen: int) -> tuple[int, list[RemoteFailure]]:
        """(the event count, the failures for good posted here if it moved past ``seen``): one store
        round trip when nothing changed."""
        events = self._store.add("events", 0)
        return events, self._read("fail/") if events != seen else []

    def _raise_reported(self, rank: int, seq: int, what: str) -> None:
        if self._store.check(["mismatch"]):  # what every rank raises, whoever found it first
            found = json.loads(self._store.get("mismatch"))
            raise CollectiveMismatchError({int(r): side for r, side in found["sides"].items()}, found["what"])
        failures = [f for f in self._read("fail/") if f.rank != rank]
        seen = {f.rank for f in failures}
        failures += [f for f in self._read(f"input/{seq}/") if f.rank not in seen and f.rank != rank]
        if failures:
            raise RemoteError(_first_causes(failures), context=f"{what} on rank {rank} abandoned")
        for peer, (done, last) in self.closed().items():
            if peer != rank and done < seq:
                raise PeerClosedError(peer, done, last, f"{what} on rank {rank}")

    def _read(self, prefix: str) -> list[RemoteFailure]:
        found = []
        for rank in range(self._world_size):
            key = f"{prefix}{rank}"
            if self._store.check([key]):
                found.append(RemoteFailure.from_json(self._store.get(key)))
        return found

    def has_closed_peers(self) -> bool:
        """Whether any rank posted that it closed (one store round trip)."""
        return bool(self._store.add("closing", 0))

    def closed(self) -> dict[int, tuple[int, str]]:
        """Peers that closed: ``rank -> (collectives completed, the last one)``."""
        found = {}
        for rank in range(self._world_size):
            key = f"closed/{rank}"
            if self._store.check([key]):
                info = json.loads(self._store.get(key))
                found[rank] = (int(info["seq"]), str(info["last"]))
        return found

    # -- processes ----------------------------------------------------------------------------

    def announce_process(self, rank: int) -> None:
        """Record this rank's host and process id, so peers on the same host can tell when it dies."""
        self._store.set(f"process/{rank}", f"{socket.gethostname()} {os.getpid()}")

    def _processes_on_host(self, rank: int) -> dict[int, int]:
        if self._processes is None:
            host = socket.gethostname()
            self._processes = {}
            for peer in range(self._world_size):
                key = f"process/{peer}"
                if peer != rank and self._store.check([key]):
                    peer_host, pid = self._store.get(key).decode().split()
                    if peer_host == host:
                        self._processes[peer] = int(pid)
        return self._processes

    def depart(self, rank: int, hosts_store: bool, linger: float) -> None:
        """Leave: a rank that hosts the store waits (at most ``linger`` seconds) until every other
        rank has closed or died, since they may still read the board. Never raises."""
        if not hosts_store:
            return
        try:
            processes = self._processes_on_host(rank)
            deadline = time.monotonic() + linger
            for peer in range(self._world_size):
                while peer != rank and not self._store.check([f"closed/{peer}"]) and time.monotonic() < deadline:
                    pid = processes.get(peer)
                    if pid is not None and not _alive(pid):
                        break
                    time.sleep(0.02)
        except Exception:  # noqa: BLE001 - leaving must never fail
            pass

    def barrier(self, rank: int, seq: int, timeout: float, what: str = "barrier", watch: Watch | None = None) -> None:
        """A barrier through the store that names, on every rank, the ranks that did not arrive."""
        self._barriers += 1
        prefix = f"barrier{self._barriers}/"
        self._store.set(f"{prefix}{rank}", "1")
        keys = [f"{prefix}{r}" for r in range(self._world_size)]
        started = time.monotonic()
        stall = watch.begin(rank, what, started, timeout) if watch is not None else None
        pause = 0.001
        # check() and a sleep, not wait(): a timed-out wait() logs a warning in c10d every time.
        while not self._store.check(keys):  # completion first: a peer may finish, then fail, while we sleep
            self.check(rank, seq, what)
            now = time.monotonic()
            if stall is not None:
                stall.tick(now)
            if now - started > timeout:
                missing = [r for r, key in enumerate(keys) if not self._store.check([key])]
                found = f": {stall.who(missing)}" if stall is not None and stall.who(missing) else ""
                raise CommTimeoutError(
                    f"{what} timed out after {timeout:g} s on rank {rank}: ranks {missing} did not arrive{found}",
                    missing_ranks=missing,
                )
            time.sleep(pause)
            pause = min(pause * 2, POLL_SECONDS)


# Failures that only report another rank's: a rank released by a peer's failure posts one too.
_ECHOES = ("RemoteError", "PeerClosedError")


def _first_causes(failures: list[RemoteFailure]) -> list[RemoteFailure]:
    """The failures that are not echoes of another rank's (all of them, if every one is)."""
    causes = [f for f in failures if f.error_type not in _ECHOES]
    return causes or failures


def _alive(pid: int) -> bool:
    """Whether process ``pid`` is running (a zombie, dead but not yet reaped, counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class _ClosedStore:
    """Stands in for the store after ``release()``: reads find nothing, writes go nowhere."""

    def check(self, keys: list[str]) -> bool:
        return False

    def add(self, key: str, value: int) -> int:
        return 0

    def set(self, key: str, value: str | bytes) -> None:
        return None

    def get(self, key: str) -> bytes:
        raise KeyError(key)


# -- waiting --------------------------------------------------------------------------------------


class PointToPoint:
    """A started send or receive (wrapped so waits can tell it from a collective)."""

    __slots__ = ("peer", "work")

    def __init__(self, work: Any, peer: int) -> None:
        self.work, self.peer = work, peer

    def wait(self) -> Any:
        return self.work.wait()

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())


class _Job:
    """Transfers handed to the waiter; ``done`` is set when they finished or one failed."""

    __slots__ = ("done", "error", "limit", "works")

    def __init__(self, works: Sequence[Any], limit: float) -> None:
        self.works, self.limit = works, limit
        self.done = threading.Event()
        self.error: BaseException | None = None


class TransferWaiter:
    """One thread per communicator, started on first use, waiting on transfers in order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self, works: Sequence[PointToPoint], limit: float) -> _Job:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="communicator-transfers", daemon=True)
            self._thread.start()
        job = _Job([w.work for w in works], limit)
        self._jobs.put(job)
        return job

    def stop(self) -> None:
        """Let the thread end once it is idle (one stuck on an abandoned transfer ends with the process)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=1.0)
            self._thread = None

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                for work in job.works:
                    work.wait(timedelta(seconds=job.limit))
            except BaseException as error:  # noqa: BLE001 - handed to the waiting caller
                job.error = error
            finally:
                job.works = []  # the transfers' tensors (received frames) must not outlive the operation
                job.done.set()
            job = work = None  # nor wait here for the next job


def wait(
    works: Sequence[Any],
    board: FailureBoard,
    transfers: TransferWaiter,
    rank: int,
    seq: int,
    what: str,
    limit: float,
    watch: Watch | None = None,
) -> None:
    """Wait for ``works`` (operation number ``seq``, ``what``); raise promptly if a peer failed,
    refused its part, died or closed, and ``CommTimeoutError`` after ``limit`` seconds. A wait
    that lasts has its stall diagnosed (``watch``, see :mod:`communicator.stalls`)."""
    if len(works) == 1 and not isinstance(works[0], PointToPoint):  # the common case: one collective
        try:
            works[0].wait(_SLICE)
            return
        except RuntimeError as error:  # as below: a slice that ran out means wait on and look around
            if "Operation timed out" not in str(error):
                raise translate(error, board, rank, seq, what, None, limit) from error
    started = time.monotonic()
    deadline = started + limit
    stall: Stall | None = None
    p2p = [w for w in works if isinstance(w, PointToPoint)]
    job = transfers.start(p2p, limit) if p2p else None
    for work in works:
        if job is not None and isinstance(work, PointToPoint):
            continue
        while True:
            try:
                work.wait(_SLICE)
                break
            except RuntimeError as error:
                # The slice ran out ("Operation timed out!"): look around, then wait again. Any other
                # error is the operation's own; a finished work returns at once next time.
                if "Operation timed out" not in str(error):
                    raise translate(error, board, rank, seq, what, stall, limit) from error
            board.check(rank, seq, what)
            now = time.monotonic()
            if watch is not None:
                stall = stall or watch.begin(rank, what, started, limit)
                stall.tick(now)
            if now > deadline:
                raise _timed_out(what, rank, limit, stall)
    if job is not None:
        stall = stall or (watch.begin(rank, what, started, limit) if watch is not None else None)
        _wait_for_transfers(job, p2p, board, rank, seq, what, deadline, stall, limit)


def _timed_out(what: str, rank: int, limit: float | None, stall: Stall | None, detail: str = "") -> CommTimeoutError:
    found = stall.explain() if stall is not None else ""
    missing = stall.verdict.awaited if stall is not None and stall.verdict is not None else None
    within = f"within {limit:g} s " if limit is not None else "in time "
    message = f"{what} did not finish {within}on rank {rank}" + (f": {found}" if found else "")
    return CommTimeoutError(message + (f" (the backend said: {detail})" if detail else ""), missing_ranks=missing)


def _wait_for_transfers(
    job: _Job,
    p2p: Sequence[PointToPoint],
    board: FailureBoard,
    rank: int,
    seq: int,
    what: str,
    deadline: float,
    stall: Stall | None,
    limit: float,
) -> None:
    # The transfers time out on their own at the deadline; the grace covers a stuck thread.
    noticed: dict[int, float] = {}  # when this rank first saw a peer of an unfinished transfer closed
    while not job.done.wait(POLL_SECONDS):
        board.check(rank, seq, what)
        now = time.monotonic()
        if stall is not None:
            stall.tick(now)
        closed = board.closed() if board.has_closed_peers() else {}
        for transfer in p2p:
            if transfer.peer in closed and not transfer.is_completed():
                since = noticed.setdefault(transfer.peer, now)
                if now - since > CLOSED_GRACE_SECONDS:
                    done, last = closed[transfer.peer]
                    raise PeerClosedError(transfer.peer, done, last, f"{what} on rank {rank}")
        if now > deadline + POLL_SECONDS * 20:
            raise _timed_out(what, rank, limit, stall)
    failure = job.error
    if failure is not None:
        if not isinstance(failure, RuntimeError):
            raise failure
        raise translate(failure, board, rank, seq, what, stall, limit) from failure


def translate(
    error: RuntimeError,
    board: FailureBoard,
    rank: int,
    seq: int,
    what: str,
    stall: Stall | None = None,
    limit: float | None = None,
) -> CommError:
    """The library's error for a backend's: a peer that failed first explains any transport error;
    the backend's own text is kept as the detail."""
    if isinstance(error, CommError):
        return error
    try:
        board.check(rank, seq, what)
    except CommError as known:
        return known
    text = str(error)
    first_line = text.splitlines()[0] if text else type(error).__name__
    if any(marker in text for marker in _LOST):
        return PeerLostError(
            f"{what} on rank {rank}: a peer was lost (its process died or closed the connection): {first_line}"
        )
    if "timed out" in text.lower():
        return _timed_out(what, rank, limit, stall, first_line)
    return CommError(f"{what} failed on rank {rank}: {first_line}")
