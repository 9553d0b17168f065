"""The event log: what every rank of a world must hear of, as one numbered sequence in the store.

A rank that fails, refuses its arguments, finds a mismatch, finds a peer lost, judges a stall or
closes *posts* a record: one ``add`` that numbers it and one ``set`` of ``event/<n>``. A rank
that waits *looks*: one ``add(events, 0)``; when the count moved, one ``multi_get`` of the new
records. So a post reaches every looking rank with O(1) requests each, O(N) in all, and a look
when nothing happened is a single request. A process keeps the records it read by board (each
communicator of the world has one), until that board closes; records of boards it is not a
member of are dropped as they are read. The processes of a host share what they read through a
relay (see :mod:`communicator.control.relay`), so that the store sees one reader per host.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

from torch._C._distributed_c10d import Store as _Store

from communicator.control.relay import LOCAL_LOOK_SECONDS, Relay
from communicator.errors import CommError, PeerLostError

__all__ = ["EventLog", "Record", "Store", "StoreHandle", "guarded_store"]

#: The longest pause between a waiting rank's looks at the store (see :mod:`communicator.control.waiting`).
LOOK_SECONDS = 1.0
#: How long a record whose number was taken may stay unwritten before readers skip it (its
#: poster died between the two requests).
MISSING_SECONDS = 2.0

T = TypeVar("T")
Record = dict[str, Any]


#: The key-value store the control plane uses: torch's (``TCPStore``, ``PrefixStore`` over it,
#: ``FileStore``, ``HashStore``), which a custom transport can start for its ranks.
Store: TypeAlias = _Store


class StoreHandle:
    """The store as the control plane holds it: released when the last communicator of its world
    closes, so that nothing keeps the store (on rank 0, its server thread) alive after that."""

    def __init__(self, store: Store) -> None:
        self._store: Store | None = store

    def release(self) -> None:
        self._store = None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise CommError("the communicator is closed: its control plane is released")
        return self._store

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def add(self, key: str, value: int) -> int:
        return self.store.add(key, value)

    def check(self, keys: list[str]) -> bool:
        return self.store.check(keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self.store.multi_get(keys)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self.store.compare_set(key, expected, desired)

    def append(self, key: str, value: str) -> None:
        self.store.append(key, value)  # type: ignore[attr-defined]  # every torch store has it; its stubs do not


def guarded_store(call: Callable[[], T]) -> T:
    """Run one store request; a store that is gone (it lives on world rank 0) is a lost peer."""
    try:
        return call()
    except CommError:
        raise
    except Exception as error:  # noqa: BLE001 - torch raises DistNetworkError, DistStoreError, RuntimeError
        raise PeerLostError(
            f"the rendezvous store (hosted by world rank 0) is unreachable: {type(error).__name__}"
        ) from None


class EventLog:
    """The records posted in one world, as far as this process has read them."""

    def __init__(
        self, store: StoreHandle, relay: Relay | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store, self.relay = store, relay
        self._boards: dict[str, list[Record]] = {}  # records read so far, by board, in posting order
        self._forgotten: set[str] = set()  # boards this process will never read (closed, or not a member)
        self._lock = threading.Lock()  # the waiting thread and a judge's probes both look
        self._read = 0  # records numbered 1.._read are read (or skipped)
        self._clock = clock
        self._missing_since: float | None = None

    def post(self, record: Record) -> None:
        """Append ``record`` for every rank; never raises (the store may be gone, and the error
        being reported matters more)."""
        try:
            number = self.store.add("events", 1)
            self.store.set(f"event/{number}", json.dumps(record))
        except Exception:  # noqa: BLE001 - see above
            pass

    def look(self, direct: bool = False) -> bool:
        """Read what was posted since the last look; whether anything was. One request when
        nothing was (none while the host's relay is fresh; ``direct``: from the store whatever
        the relay says); raises ``PeerLostError`` when the store is gone."""
        with self._lock:
            relay = self.relay
            if relay is None or direct:
                return self._take(self._from_store())
            relayed = relay.read()
            taken = self._take(relayed)
            if relayed and relayed[-1][0] > self._read:  # the file began after this process's last
                return self._take(self._from_store()) or taken  # record (it was replaced): fill the gap
            turn = relay.turn() if relay.due() else None
            if turn is None:
                return taken
            with turn:
                taken = self._take(turn.records) or taken
                found = self._from_store()
                turn.hand(found)
            return self._take(found) or taken

    @property
    def look_seconds(self) -> float:
        """The longest pause between a waiting rank's looks: a relay is read for free, so more often."""
        return LOOK_SECONDS if self.relay is None else LOCAL_LOOK_SECONDS

    def _from_store(self) -> list[tuple[int, bytes]]:
        count = guarded_store(lambda: self.store.add("events", 0))
        if count <= self._read:
            return []
        keys = [f"event/{n}" for n in range(self._read + 1, count + 1)]
        if guarded_store(lambda: self.store.check(keys)):
            values = guarded_store(lambda: self.store.multi_get(keys))
        else:  # a poster is between its two requests: read what is there
            values = self._written(keys)
        return list(enumerate(values, start=self._read + 1))

    def _take(self, records: list[tuple[int, bytes]]) -> bool:
        """Keep the records that follow the last one taken (records are numbered from 1); whether
        there were any."""
        taken = self._read
        for number, value in records:
            if number != self._read + 1:
                continue
            record = json.loads(value)
            board = str(record.get("board", ""))
            if board not in self._forgotten:
                self._boards.setdefault(board, []).append(record)
            self._read = number
        return self._read > taken

    def of_board(self, name: str, start: int) -> list[Record]:
        """The records of board ``name`` from its ``start``-th on."""
        return self._boards.get(name, [])[start:]

    def forget(self, name: str) -> None:
        """Board ``name`` is not read in this process from now on: drop its records, now and to come."""
        self._forgotten.add(name)
        self._boards.pop(name, None)

    def _written(self, keys: list[str]) -> list[bytes]:
        values = []
        for key in keys:
            if guarded_store(functools.partial(self.store.check, [key])):
                values.append(guarded_store(functools.partial(self.store.get, key)))
                self._missing_since = None
                continue
            now = self._clock()
            self._missing_since = self._missing_since or now
            if now - self._missing_since < MISSING_SECONDS:
                break
            values.append(b'{"kind": "lost-record"}')  # its poster died mid-post: skip it
            self._missing_since = None
        return values
