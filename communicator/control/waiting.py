"""Bounded waits that a peer's failure releases, and the translation of a transport's errors.

A rank blocked in an operation cannot be interrupted by its peers through the backend (gloo
offers no abort that releases a blocked wait). So a wait is cut into slices, and between slices
the waiting rank *looks* at its :class:`~communicator.control.board.FailureBoard` (one store
request when nothing happened). Slices grow fourfold from :data:`FIRST_SLICE_SECONDS` to
:data:`LOOK_SECONDS`: an operation that finishes within the first slice costs no request at all,
and a long wait costs about one request a second, whatever the size of the job.

A work's ``wait(timeout)`` takes a ``timedelta``; it returns ``False`` or raises (``TimeoutError``,
or torch's ``RuntimeError`` that says "timed out") when the slice ran out. Point-to-point
transfers are waited on whole in a helper thread (gloo treats a send's or receive's wait timeout
as the transfer's own: when it runs out, the connection closes).

A GPU collective (NCCL) is never waited on with a timeout: torch treats a timed wait that runs
out as the collective's own timeout and takes the process down (an all_reduce queued behind 20
products of 8192x8192 matrices did so when its first 50 ms slice ran out). It is
:class:`StreamOrdered`, as in torch: waiting orders the caller's CUDA stream after it, and the
CPU goes on; torch's NCCL watchdog ends a collective that outlives the group's timeout.

A transfer abandoned after a failure may never finish. Its thread must not be inside the wait when
the interpreter finalises: a wait that returns then cannot take the GIL back, and the thread's
forced exit through torch's no-throw code aborts the process ("terminate called without an active
exception"). So closing a communicator *cuts* what its thread still waits on: each transfer may
carry a ``cut`` that closes the connection it waits on (for gloo, a receive on the same
connection that times out at once), and the wait returns with an error while the interpreter runs.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from communicator.control.board import FailureBoard, backoff
from communicator.control.log import LOOK_SECONDS
from communicator.control.stalls import Stall, Watch
from communicator.errors import CommError, CommTimeoutError, PeerClosedError, PeerLostError

__all__ = [
    "FIRST_SLICE_SECONDS",
    "LOOK_SECONDS",
    "PointToPoint",
    "StreamOrdered",
    "Together",
    "TransferWaiter",
    "at_once",
    "finished",
    "translate",
    "wait",
]

#: How long a wait runs before its first look at the board.
FIRST_SLICE_SECONDS = 0.05
_FIRST = timedelta(seconds=FIRST_SLICE_SECONDS)
#: How long a receive may wait after its peer closed (whatever the peer sent has arrived by then).
CLOSED_GRACE_SECONDS = 1.0
#: How long a transport's lost connection waits for the peer's process to be seen gone, and in how many looks.
_EXITING_SECONDS, _EXITING_LOOKS = 1.0, 5
_LOST = ("Connection closed by peer", "Connection reset", "Broken pipe", "Socket closed", "ECONNRESET")


def finished(work: Any, seconds: float) -> bool:
    """Wait at most ``seconds`` for ``work``: whether it finished (see the module docstring)."""
    try:
        return work.wait(timedelta(seconds=seconds)) is not False
    except TimeoutError:
        return False
    except RuntimeError as error:
        if "timed out" in str(error).lower() and not isinstance(error, CommError):
            return False
        raise


def at_once(work: Any) -> bool:
    """Whether ``work``, one collective, finished within the first slice: the common case, with
    no look at the board and no watch. ``False`` when it did not, or when it failed: the long way
    waits on it again, which raises the same error again (a work keeps it), and translates it."""
    if isinstance(work, (PointToPoint, Together)):
        return False
    try:
        return work.wait(_FIRST) is not False
    except (TimeoutError, RuntimeError):
        return False


class PointToPoint:
    """A started send or receive (wrapped so waits can tell it from a collective); ``cut``, where
    the transport has one, ends its wait by closing its connection (see the module docstring)."""

    __slots__ = ("cut", "peer", "work")

    def __init__(self, work: Any, peer: int, cut: Callable[[], None] | None = None) -> None:
        self.work, self.peer, self.cut = work, peer, cut

    def wait(self, timeout: timedelta | None = None) -> Any:
        return self.work.wait() if timeout is None else self.work.wait(timeout)

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())


class StreamOrdered:
    """A started GPU collective: its wait, whatever the timeout, orders the caller's CUDA stream
    after it and returns at once, as torch's own ``wait()`` (see the module docstring)."""

    __slots__ = ("work",)

    def __init__(self, work: Any) -> None:
        self.work = work

    def wait(self, timeout: timedelta | None = None) -> bool:
        self.work.wait()
        return True

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())


class Together:
    """Several started works that finish as one operation."""

    __slots__ = ("works",)

    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self, timeout: timedelta | None = None) -> None:
        for work in self.works:
            work.wait() if timeout is None else work.wait(timeout)

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


class _Job:
    """Transfers handed to the waiter, done when they finished or one failed."""

    __slots__ = ("_pending", "cuts", "error", "limit", "works")

    def __init__(self, works: Sequence[PointToPoint], limit: float) -> None:
        self.works: list[Any] = [w.work for w in works]
        self.cuts = [w.cut for w in works if w.cut is not None]
        self.limit = limit
        self.error: BaseException | None = None
        # Held until the waiter thread is done: a bare lock, released and taken in C, where an
        # Event runs a condition and its lock in Python on both sides (measured slower per transfer).
        self._pending = threading.Lock()
        self._pending.acquire()

    def done(self, seconds: float) -> bool:
        """Whether the job is done, waiting at most ``seconds`` for it."""
        if self._pending.acquire(timeout=seconds):
            self._pending.release()  # asked again (by closing), it answers at once
            return True
        return False

    def finish(self) -> None:
        self._pending.release()


class TransferWaiter:
    """One thread per communicator, started on first use, waiting on transfers in order."""

    #: How long closing waits for the thread, cuts included, before leaving it to the process.
    STOP_SECONDS = 2.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._current: _Job | None = None

    def start(self, works: Sequence[PointToPoint], limit: float) -> _Job:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="communicator-transfers", daemon=True)
            self._thread.start()
        job = _Job(works, limit)
        self._jobs.put(job)
        return job

    def stop(self) -> None:
        """End the thread: transfers it still waits on (abandoned ones) are cut first."""
        thread = self._thread
        if thread is None:
            return
        self._jobs.put(None)
        was_cut: _Job | None = None
        deadline = time.monotonic() + self.STOP_SECONDS
        while thread.is_alive() and time.monotonic() < deadline:
            job = self._current
            if job is not None and job is not was_cut and not job.done(FIRST_SLICE_SECONDS):
                was_cut = job
                for cut in job.cuts:
                    with contextlib.suppress(Exception):  # closing never raises
                        cut()
            thread.join(FIRST_SLICE_SECONDS)
        self._thread = None

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._current = job
            try:
                for work in job.works:
                    work.wait(timedelta(seconds=job.limit))
            except BaseException as error:  # noqa: BLE001 - handed to the waiting caller
                job.error = error
            finally:
                job.works, job.cuts = [], []  # the transfers' tensors (received frames) must not outlive the operation
                job.finish()
                self._current = None
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
    collective: bool = False,
) -> None:
    """Wait for ``works`` (operation number ``seq``, ``what``); raise promptly if a peer failed,
    refused its part, died or closed, and ``CommTimeoutError`` after ``limit`` seconds. A wait
    that lasts has its stall diagnosed (``watch``, see :mod:`communicator.control.stalls`).
    ``collective``: the works are collective ``seq``'s, which a failure posted by a rank that
    completed it does not end (see :meth:`FailureBoard.raise_known`)."""
    if any(isinstance(work, Together) for work in works):
        works = [part for work in works for part in (work.works if isinstance(work, Together) else (work,))]
    started = time.monotonic()
    deadline = started + limit
    p2p = [w for w in works if isinstance(w, PointToPoint)]
    job = transfers.start(p2p, limit) if p2p else None
    pause = backoff(FIRST_SLICE_SECONDS, board.log.look_seconds)
    if job is not None and len(p2p) == len(works) and job.done(pause()) and job.error is None:
        return  # transfers done within the first slice: no look, and no watch to set up
    peers = [w.peer for w in p2p]  # a point-to-point operation's stall is judged among them
    stall: Stall | None = watch.begin(rank, what, started, limit, peers) if watch is not None else None
    for work in works:
        if job is not None and isinstance(work, PointToPoint):
            continue
        while True:
            try:
                if finished(work, min(pause(), max(deadline - time.monotonic(), 0.001))):
                    break
            except RuntimeError as error:  # the operation's own error; a finished work returns at once next time
                raise translate(error, board, rank, seq, what, stall, limit) from error
            _look(board, rank, seq, what, stall, collective)
            if time.monotonic() > deadline:
                raise _timed_out(what, rank, limit, stall)
    if job is not None:
        _wait_for_transfers(job, p2p, board, rank, seq, what, deadline, stall, limit, pause, collective)


def _look(board: FailureBoard, rank: int, seq: int, what: str, stall: Stall | None, collective: bool) -> None:
    """Look at the board and judge the stall; only a ``CommError`` leaves it (whatever the store held)."""
    try:
        board.check(rank, seq, what, completing=collective)
        if stall is not None:
            stall.tick(time.monotonic())
    except CommError:
        raise
    except Exception as error:
        raise CommError(f"{what} on rank {rank}: the control plane failed: {type(error).__name__}: {error}") from error


def _timed_out(what: str, rank: int, limit: float | None, stall: Stall | None, detail: str = "") -> CommTimeoutError:
    found = stall.explain() if stall is not None else ""
    missing = list(stall.verdict.awaited) if stall is not None and stall.verdict is not None else None
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
    pause: Callable[[], float],
    collective: bool,
) -> None:
    # The transfers time out on their own at the deadline; the grace covers a stuck thread.
    noticed: dict[int, float] = {}  # when this rank first saw a peer of an unfinished transfer closed
    while not job.done(pause()):
        _look(board, rank, seq, what, stall, collective)
        now = time.monotonic()
        closed = board.closed()
        for transfer in p2p:
            if transfer.peer in closed and not transfer.is_completed():
                since = noticed.setdefault(transfer.peer, now)
                if now - since > CLOSED_GRACE_SECONDS:
                    done, last = closed[transfer.peer]
                    raise PeerClosedError(transfer.peer, done, last, f"{what} on rank {rank}")
        if now > deadline + LOOK_SECONDS * 2:
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
    except CommError as known:  # the store gone included: a peer was lost
        return known
    text = str(error)
    first_line = text.splitlines()[0] if text else type(error).__name__
    if any(marker in text for marker in _LOST):
        # A peer closes its connections once it posted why it left (its failure, its refusal),
        # or as its process exits, a moment before it is gone. What it posted is read from the
        # store itself: the host's relay may not have read it yet.
        try:
            board.check(rank, seq, what, direct=True)
            for _ in range(_EXITING_LOOKS):
                time.sleep(_EXITING_SECONDS / _EXITING_LOOKS)
                board.check(rank, seq, what, direct=True)
        except CommError as known:
            return known
        # the transport's own words (gloo's "[.../pair.cc:...] Connection closed by peer ...") stay the cause
        return PeerLostError(
            f"{what} on rank {rank}: a peer was lost: its process died or closed its connection to this rank "
            "(the transport's error is the cause)"
        )
    if "timed out" in text.lower():
        return _timed_out(what, rank, limit, stall, first_line)
    return CommError(f"{what} failed on rank {rank}: {first_line}")
