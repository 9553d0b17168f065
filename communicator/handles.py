"""`Handle`: what ``async_op=True`` returns; ``wait()`` finishes the operation and gives its result.

Also the two shapes of a started operation that communicators hand to each other: :class:`Work`
(anything with ``wait()`` and ``is_completed()``, such as torch's own work objects) and
:data:`DONE`, an operation that finished when it was started.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Generic, Protocol, TypeVar

from communicator.config import Timeout, seconds

__all__ = ["DONE", "Handle", "Work"]

T = TypeVar("T")


class Work(Protocol):
    """A started operation: a primitive returns one, the communicator's ``_wait`` finishes it.

    ``wait(timeout)`` waits at most ``timeout`` (a ``timedelta``; ``None``: until done) and returns
    ``False``, or raises ``TimeoutError`` (torch's works: a ``RuntimeError`` that says "timed
    out"), when it ran out; the control plane waits in such slices (see :mod:`communicator.control`).
    """

    def wait(self, timeout: timedelta = ...) -> Any: ...

    def is_completed(self) -> bool: ...


class _Done:
    """An operation that completed when it was started (transports that work synchronously)."""

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


#: The work of an operation that is already complete.
DONE: Work = _Done()

Waiter = Callable[[Sequence[Work], "float | None"], None]


class Handle(Generic[T]):
    """A started operation. ``wait()`` blocks until it is done and returns its result.

    ``wait`` honours the communicator's timeout and failure signalling, like a blocking call.
    Under NCCL a tensor collective is stream-ordered, as in torch: ``wait()`` makes the current
    CUDA stream wait for it and returns without waiting for the GPU.
    """

    def __init__(self, works: Sequence[Work], finish: Callable[[], T], waiter: Waiter | None = None) -> None:
        self._works = list(works)
        self._finish = finish
        self._waiter = waiter
        self._done = False
        self._result: T | None = None

    def wait(self, timeout: Timeout | None = None) -> T:
        """Finish the operation and return its result.

        ``timeout`` (seconds or a ``timedelta``) overrides the communicator's for this wait.
        """
        if not self._done:
            limit = seconds(timeout)
            if self._waiter is not None and self._works:
                self._waiter(self._works, limit)
            self._result = self._finish()
            self._done = True
            self._works.clear()
        return self._result  # type: ignore[return-value]

    def is_completed(self) -> bool:
        """Whether the operation has finished (under NCCL: on the GPU). gloo's sends and receives
        (``isend``, ``irecv``) say so only once waited on, as torch's own works do: do not loop
        on it for them."""
        return self._done or all(w.is_completed() for w in self._works)

    @classmethod
    def done(cls, result: T) -> Handle[T]:
        """A handle for an operation that has already finished."""
        return cls([], lambda: result)
