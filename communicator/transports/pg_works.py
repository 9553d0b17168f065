"""The works a :class:`~communicator.transports.process_group.CommProcessGroup` returns, and the
thread that finishes them.

A collective that torch starts asynchronously (``opts.asyncOp``, which DDP's and FSDP's calls
leave set) is started as the communicator's ``async_op=True`` operation, and its
:class:`CommWork` goes to the group's :class:`Completer`: one thread that waits the started
operations in the order they were issued, writes each one's outputs, then completes its work and
its future. So DDP's ``.then()`` chains run without anyone calling ``wait()``, and a later bucket's
all-reduce is issued while an earlier one is in flight, as over gloo's own group. The completer
is the only thread that finishes such a work; ``wait()`` on any other thread only waits for it.

The completer waits through the communicator's control plane (``Handle.wait``) while the issuing
thread issues the next operations, and may wait in one of its own meanwhile. What the two waits
share is made for it: the event log is read under a lock, torch's store client serialises its
requests, transfers queue for the plane's one transfer thread (the plane and that thread are
started by the issuing thread before the completer's first wait), and two looks at the board at
once at worst keep a record twice (an error may name a cause twice). A handle is waited with a
limit of its own, never the running call's.

An error of the operation (``RemoteError``, ``PeerLostError``, ``CommTimeoutError``, ...) is the
work's ``exception()``, raised as it is by ``wait()``, and fails its future: torch passes a
future's error on as a ``RuntimeError`` that carries its text (a callback's error, or a C++
waiter's), since a future set with an exception from Python would hand C++ waiters the exception
as its value. The group waits, at the end of a backward pass, for the works issued in it, so that
DDP's ``backward()`` raises the error itself (see ``CommProcessGroup``).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from datetime import timedelta
from queue import SimpleQueue
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.futures import Future

from communicator.errors import CommTimeoutError
from communicator.guard import CallState

__all__ = ["CommWork", "Completer"]

Tensor = torch.Tensor
#: How long the interpreter's exit waits for a completer still finishing a work.
STOP_SECONDS = 2.0


class CommWork(dist.Work):
    """A torch work over a communicator operation: ``wait(timeout)``, ``is_completed()``,
    ``exception()``, ``result()`` and ``get_future()`` (whose value is the output tensors).

    ``finish``: what completes the operation (waits it and writes its outputs), run once by the
    group's completer, or by the first ``wait()`` for a work that has no completer (a send or a
    receive); without it the work is complete already.
    """

    # A blocking call makes one complete work a call: it sets only its result (class defaults stand for the rest)
    _finish: Callable[[], None] | None = None
    _ready: Callable[[], bool] | None = None
    _shown: tuple[CallState, list[Any]] | None = None
    _issuer = 0
    _what = ""
    _error: BaseException | None = None
    _done = True  # its outputs are written (or its error known)
    _settled = True  # and its future is complete too
    _future: Future[list[Tensor]] | None = None
    _source: Future[list[Tensor]] | None = None  # what the completer settles
    _released: threading.Lock  # held until it is settled (a bare lock: released in C); pending works only
    _completed_by: Completer | None = None

    def __init__(
        self,
        result: list[Tensor],
        finish: Callable[[], None] | None = None,
        what: str = "",
        ready: Callable[[], bool] | None = None,
        shown: tuple[CallState, list[Any]] | None = None,
    ) -> None:
        """``ready``: whether a work without a completer could finish at once (its transfer is done);
        ``shown``: the communicator's call state and the operation's record (see ``wait``)."""
        super().__init__()
        self._result = result
        if finish is not None:
            self._finish, self._ready, self._shown, self._what = finish, ready, shown, what
            self._issuer = threading.get_ident()
            self._done = self._settled = False
            self._released = threading.Lock()
            self._released.acquire()

    def complete(self) -> None:
        """Run ``finish``, then settle the future, then release the waiters (once; the completer's call)."""
        finish, self._finish = self._finish, None  # its handle and tensors are not kept past this
        if finish is None:
            return
        try:
            finish()
        except BaseException as error:  # noqa: BLE001 - the work's error, raised by wait() and the future
            self._error = error
        self._done = True
        try:
            if self._source is not None:
                _settle(self._source, self._result, self._error)
        finally:
            self._settled = True
            self._released.release()

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if not self._settled:
            completer = self._completed_by
            if completer is None or threading.current_thread() is completer.thread:
                # A send or a receive finishes in its first wait; the completer, in a future's
                # callback, would wait for itself: it finishes the work now, out of turn.
                self.complete()
            else:
                with self._showing():
                    limit = timeout.total_seconds()
                    if not self._released.acquire(timeout=limit if limit > 0 else -1):
                        raise CommTimeoutError(
                            f"{self._what}: the work did not complete within {limit:g} s; the operation goes on,"
                            " bounded by its own timeout"
                        )
                    self._released.release()
        if self._error is not None:
            raise self._error
        return True

    @contextlib.contextmanager
    def _showing(self) -> Iterator[None]:
        """While the issuing thread waits here, its communicator shows the operation as running.

        The control plane says what a rank is doing (in its status, and to the judge of a stall)
        from the running call's record; a started operation that the completer waits on has none
        after its call returned, so a rank waiting for it would read "outside any collective" and
        be named among the late ranks. Only the issuing thread, outside any call, writes the
        record: the guard writes it in that thread alone, so the two never race.
        """
        shown = self._shown
        if shown is None or threading.get_ident() != self._issuer or shown[0].running is not None:
            yield
            return
        calls, record = shown
        calls.running = record
        try:
            yield
        finally:
            if calls.running is record:
                calls.running = None

    def is_completed(self) -> bool:
        if not self._settled and self._completed_by is None and self._ready is not None and self._ready():
            self.wait()  # writes the result back where the communicator staged it
        return self._settled or (self._done and self._completed_by is not None and _in(self._completed_by))

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error if self._done else None

    def result(self) -> list[Tensor]:
        return self._result

    def get_future(self) -> Future[list[Tensor]]:
        """The output tensors, once the work is complete; its error's text where it failed."""
        if self._future is None:
            source: Future[list[Tensor]] = Future()
            if self._done:
                _settle(source, self._result, self._error)
            else:  # made before the work is handed to the completer, which settles it
                self._source = source
            # A future set with an exception from Python holds it as its value, which a C++ waiter
            # (DDP's reducer) would take for the tensors; a callback that raises fails the future.
            self._future = source.then(_unwrap)
        return self._future

    def synchronize(self) -> None:
        self.wait()


def _in(completer: Completer) -> bool:
    return threading.current_thread() is completer.thread


def _settle(future: Future[list[Tensor]], result: list[Tensor], error: BaseException | None) -> None:
    if error is None:
        future.set_result(result)
    else:  # torch's futures take an Exception; a KeyboardInterrupt in the completer is wrapped
        failure = error if isinstance(error, Exception) else RuntimeError(f"{type(error).__name__}: {error}")
        future.set_exception(cast(Any, failure))


def _unwrap(future: Future[list[Tensor]]) -> list[Tensor]:
    return future.wait()


class Completer:
    """One thread per process group that completes its started works in the order they were issued.

    ``submit`` hands it a work (with its future made first, so that the completer settles it);
    ``drain`` waits until every work handed over is complete (a blocking operation issued after
    them waits for them first, so works complete in issue order); ``stop`` ends the thread after
    the works already handed over.
    """

    def __init__(self, name: str) -> None:
        self._queue: SimpleQueue[CommWork | None] = SimpleQueue()
        self._last: CommWork | None = None
        self._thread = threading.Thread(
            target=_run, args=(self._queue,), name=f"communicator-works-{name}", daemon=True
        )
        self._thread.start()
        _running.add(self)

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def submit(self, work: CommWork) -> CommWork:
        work._completed_by = self
        work.get_future()
        self._last = work
        self._queue.put(work)
        return work

    def drain(self) -> None:
        last = self._last
        if last is not None and not last._settled and threading.current_thread() is not self._thread:
            with last._showing(), last._released:  # held until it is complete
                pass
            if self._last is last:
                self._last = None

    def stop(self, join: float = 0.0) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            if join > 0 and self._thread is not threading.current_thread():
                self._thread.join(join)
        _running.discard(self)


def _run(queue: SimpleQueue[CommWork | None]) -> None:
    """The completer's loop: it holds the queue only, so that the group can be collected meanwhile."""
    while (work := queue.get()) is not None:
        work.complete()
        work = None  # nor keep the last work's tensors while waiting for the next


_running: weakref.WeakSet[Completer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """Let a completer finish before the interpreter finalises: a thread that comes back from a
    transport's wait during finalisation can abort the process (see communicator.control.waiting)."""
    for completer in list(_running):
        completer.stop(STOP_SECONDS)
