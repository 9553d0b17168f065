"""Waiting on point-to-point transfers without giving up on failure signalling.

gloo treats the timeout given to a send's or receive's ``wait`` as the transfer's own: when it
runs out the transfer fails and the connection closes. So these transfers are waited on whole, in
a helper thread, while the caller keeps watching the failure board.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

__all__ = ["PointToPoint", "TransferWaiter"]


class PointToPoint:
    """A started send or receive (wrapped so waits can tell it from a collective)."""

    __slots__ = ("work",)

    def __init__(self, work: Any) -> None:
        self.work = work

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())


class Job:
    """Transfers handed to the waiter; ``done`` is set when they finished or one failed."""

    __slots__ = ("done", "error", "limit", "works")

    def __init__(self, works: Sequence[Any], limit: float) -> None:
        self.works = works
        self.limit = limit
        self.done = threading.Event()
        self.error: BaseException | None = None


class TransferWaiter:
    """One daemon thread per communicator, started on first use, waiting on jobs in order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self, works: Sequence[PointToPoint], limit: float) -> Job:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="communicator-transfers", daemon=True)
            self._thread.start()
        job = Job([w.work for w in works], limit)
        self._jobs.put(job)
        return job

    def stop(self) -> None:
        """Let the thread end once it is idle (one stuck on an abandoned transfer ends with it)."""
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
                job.done.set()
