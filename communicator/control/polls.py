"""The pace of the control plane's polling loops, and the loops as generators of their pauses.

Every wait that polls the store starts fast, for the common case of ranks that arrive together,
and backs off quickly: each pause is :data:`GROWTH` times the one before, from
:data:`FIRST_PAUSE` to one second, so a wait makes five requests in its first second and a half
(one each), then one a second, however long it lasts and whatever the skew between ranks.

A loop that waits on the store (a refusal settling, a barrier through the store) is written as a
*poll*: a generator that does one step, yields how long to pause, and is sent the time
(``time.monotonic``) when it goes on. :func:`drive` runs one in the calling thread; the
simulation of virtual ranks (``benchmarks.control_plane``) runs thousands side by side on a
clock of its own, so what it counts is what the real loops send.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Protocol, TypeVar

__all__ = ["DIRECT_SECONDS", "FIRST_PAUSE", "GROWTH", "PACE_BURST", "Pacer", "Poll", "backoff", "drive"]

T = TypeVar("T")
#: A polling loop: yields its pauses (seconds), is sent the time it goes on at, returns its outcome.
Poll = Generator[float, float, T]
#: Store requests a polling loop makes at once before its pace (one a second) applies.
PACE_BURST = 4
#: A polling loop's first pause (seconds).
FIRST_PAUSE = 0.005
#: How much longer each pause is than the one before, up to the loop's cap.
GROWTH = 4.0
#: How long a poll reads the store itself (its first, prompt looks) before a host's relay serves it.
DIRECT_SECONDS = 1.5


def backoff(first: float, cap: float) -> Callable[[], float]:
    """Pauses that grow :data:`GROWTH`-fold from ``first`` to ``cap``: prompt for a short wait,
    about one request per ``cap`` seconds for a long one, within a few pauses."""
    pause = first / GROWTH

    def step() -> float:
        nonlocal pause
        pause = min(pause * GROWTH, cap)
        return pause

    return step


class Counted(Protocol):
    @property
    def requests(self) -> int: ...


class Pacer:
    """The pauses of a loop that polls the store: as :func:`backoff`'s from ``first`` to ``cap``,
    and long enough that once :data:`PACE_BURST` requests are spent, the requests the polling
    thread makes through ``store`` stay at about one a second, however long the wait lasts and
    however many requests a step makes. ``now``: the loop's clock (``time.monotonic`` when not
    given)."""

    def __init__(self, store: Counted, first: float = FIRST_PAUSE, cap: float = 1.0, now: float | None = None) -> None:
        self._store, self._base = store, store.requests
        self._started = time.monotonic() if now is None else now
        self._backoff = backoff(first, cap)

    def __call__(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        ahead = (self._store.requests - self._base - PACE_BURST) - (now - self._started)
        return max(self._backoff(), ahead)


def drive(poll: Poll[T]) -> T:
    """Run ``poll`` in this thread: sleep each pause it yields, then send it the time."""
    try:
        pause = next(poll)
        while True:
            time.sleep(pause)
            pause = poll.send(time.monotonic())
    except StopIteration as done:
        found: T = done.value
        return found
