"""``barrier(timeout=...)`` through the store: every rank that arrived names the ones that did not.

Each rank appends its rank to the barrier's list, counts itself in and reads the log's count
(three requests), then polls (see :mod:`communicator.control.polls`): one request a look reads
the arrivals and the log's count; the log itself is read only when its count moved; looks back
off to one a second within five. The last rank to arrive says so in the log: where a host's
relay serves, a wait that lasts past its first looks reads the log alone, through the relay.
On timeout, the first rank to time out lists the late ranks (as spans) for every other, so that a
reader gets O(1) bytes however many arrived.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from communicator.control.board import FailureBoard
from communicator.control.log import LOOK_SECONDS, guarded_store
from communicator.control.polls import DIRECT_SECONDS, FIRST_PAUSE, Poll, backoff
from communicator.control.ranks import Spans, listed, spans_text
from communicator.errors import CommError, CommTimeoutError

__all__ = ["barrier_poll"]

_SPANS = re.compile(r"\d{1,9}(-\d{1,9})?(,\d{1,9}(-\d{1,9})?)*")


def barrier_poll(
    board: FailureBoard,
    rank: int,
    seq: int,
    timeout: float,
    what: str,
    tick: Callable[[float], None],
    explain: Callable[[list[int]], str],
    now: float,
) -> Poll[None]:
    """The barrier of ``board``'s rank ``rank`` as a poll, from ``now`` (``time.monotonic``); ``tick``
    is called each look (the stall watch), ``explain`` names what late ranks are doing."""
    store, size = board.keys, len(board.members)
    board.barriers += 1
    number = board.barriers
    key = f"{board.name}barrier{number}"
    guarded_store(lambda: store.append(f"{key}/who", f"{rank},"))
    arrived = guarded_store(lambda: store.add(key, 1))
    if arrived == size:
        board.post_arrived(rank, number)
    events = guarded_store(lambda: store.add("events", 0))  # made: one request reads both counters
    started = now
    relayed_from = now + DIRECT_SECONDS if board.log.relay is not None else math.inf
    # Not paced by this thread's other requests (a judge's): a rank that saw the last arrival
    # seconds late would be judged to be in another collective by the ranks already past it.
    # Each of its own looks is a request: one a second at most; the relay's cost none.
    pause = backoff(FIRST_PAUSE, LOOK_SECONDS)
    while arrived < size and board.arrived < number:
        relayed = now >= relayed_from
        try:
            board.check(rank, seq, what, look=relayed or board.log.behind(events), completing=True)
            if board.arrived >= number:
                return
        except CommError:
            # The last ones may have arrived, left and failed later since this rank counted.
            if guarded_store(lambda: store.add(key, 0)) >= size:
                return
            raise
        tick(now)
        if now - started > timeout:
            if guarded_store(lambda: store.add(key, 0)) >= size:  # the last one's word may be late
                return
            missing = _late(board, key)
            found = explain(missing)
            raise CommTimeoutError(
                f"{what} timed out after {timeout:g} s on rank {rank}: ranks {missing} did not arrive"
                + (f": {found}" if found else ""),
                missing_ranks=missing,
            )
        step = board.log.look_seconds if relayed else min(pause(), relayed_from - now)
        now = yield min(step, max(timeout - (now - started), 0.001))
        if now < relayed_from:
            arrived, events = store.counters([key, "events"])
            board.log.spend()


def _late(board: FailureBoard, key: str) -> list[int]:
    """The ranks that did not arrive at barrier ``key``: listed by the first rank to ask, from the
    arrivals, for every other (two requests, three for the first)."""
    store, size = board.keys, len(board.members)
    found = guarded_store(lambda: store.peek(f"{key}/late"))
    if found is None:
        text = guarded_store(lambda: store.get(f"{key}/who")).decode(errors="replace")
        present = listed(text, size)
        late = spans_text(r for r in range(size) if r not in present) or "-"
        found = guarded_store(lambda: store.compare_set(f"{key}/late", "", late))
    text = found.decode(errors="replace")
    if not _SPANS.fullmatch(text):  # "-": none (they arrived meanwhile), or not a list of ours
        return []
    return [r for r in Spans(text) if r < size]
