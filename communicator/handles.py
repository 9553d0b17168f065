"""`Handle`: what ``async_op=True`` returns; ``wait()`` finishes the operation and gives its result."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Handle"]

T = TypeVar("T")


class _Work(Protocol):
    def is_completed(self) -> bool: ...


class Handle(Generic[T]):
    """A started operation. ``wait()`` blocks until it is done and returns its result.

    ``wait`` honours the communicator's timeout and failure signalling, like a blocking call.
    """

    def __init__(
        self,
        works: Sequence[Any],
        finish: Callable[[], T],
        waiter: Callable[[Sequence[Any], float | None], None] | None = None,
    ) -> None:
        self._works = list(works)
        self._finish = finish
        self._waiter = waiter
        self._done = False
        self._result: T | None = None

    def wait(self, timeout: float | None = None) -> T:
        """Finish the operation (``timeout`` in seconds overrides the communicator's) and return its result."""
        if not self._done:
            if self._waiter is not None and self._works:
                self._waiter(self._works, timeout)
            self._result = self._finish()
            self._done = True
            self._works.clear()
        return self._result  # type: ignore[return-value]

    def is_completed(self) -> bool:
        """Whether ``wait()`` would return without blocking."""
        return self._done or all(w.is_completed() for w in self._works)

    @classmethod
    def done(cls, result: T) -> Handle[T]:
        """A handle for an operation that has already finished."""
        return cls([], lambda: result)
