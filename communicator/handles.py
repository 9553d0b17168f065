"""`Handle`: what ``async_op=True`` returns; ``wait()`` finishes the operation and gives its result.

Also the two shapes of a started operation that communicators hand to each other: :class:`Work`
(anything with ``wait()`` and ``is_completed()``, such as torch's own work objects) and
:data:`DONE`, an operation that finished when it was started; and :func:`timeout_seconds`, the one
rule for every ``timeout=`` an operation or a handle's ``wait`` takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import timedelta
from numbers import Real
from typing import Any, Generic, Protocol, TypeVar

from communicator.config import Timeout
from communicator.errors import ConfigError

__all__ = ["DONE", "Handle", "Work", "timeout_seconds"]

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


def timeout_seconds(value: object, what: str) -> float | None:
    """An operation's ``timeout=`` (``what``: the operation) in seconds; ``None`` stays ``None``.

    Seconds (an ``int`` or ``float``) or a ``datetime.timedelta``, positive and finite: anything
    else is a ``TypeError``, a duration that is not positive and finite a
    :class:`~communicator.errors.ConfigError` (a ``ValueError``), both raised before the operation
    communicates.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        limit = value.total_seconds()
    elif isinstance(value, Real) and not isinstance(value, bool):
        limit = float(value)
    else:
        raise TypeError(
            f"{what}: timeout={value!r} is invalid: expected seconds (an int or float), a datetime.timedelta, "
            f"or None for the communicator's timeout, got {type(value).__name__}"
        )
    if not (limit > 0 and math.isfinite(limit)):
        raise ConfigError(f"{what}: timeout={value!r} is invalid: expected a positive, finite duration")
    return limit


class Handle(Generic[T]):
    """A started operation. ``wait()`` blocks until it is done and returns its result.

    ``wait`` honours the timeout and failure signalling of a blocking call: the operation's own
    ``timeout=`` where it was given one, else the communicator's. Under NCCL a tensor collective
    is stream-ordered, as in torch: ``wait()`` makes the current CUDA stream wait for it and
    returns without waiting for the GPU.
    """

    def __init__(
        self, works: Sequence[Work], finish: Callable[[], T], waiter: Waiter | None = None, timeout: float | None = None
    ) -> None:
        """``timeout``: the seconds of the operation's own ``timeout=``, which ``wait()`` keeps to
        when it is given none (``None``: the communicator's)."""
        self._works = list(works)
        self._finish = finish
        self._waiter = waiter
        self._timeout = timeout
        self._done = False
        self._result: T | None = None

    def wait(self, timeout: Timeout | None = None) -> T:
        """Finish the operation and return its result.

        ``timeout`` (seconds or a ``timedelta``) bounds this wait; ``None``: the operation's own
        ``timeout=``, else the communicator's.
        """
        if not self._done:
            limit = self._timeout if timeout is None else timeout_seconds(timeout, "wait")
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
