"""The event log: what every rank of a world must hear of, as one numbered sequence in the store.

A rank that fails, refuses its arguments, finds a mismatch, finds a peer lost, judges a stall or
closes *posts* a record: one ``add`` that numbers it and one ``set`` of ``event/<n>``. A rank
that waits *looks*: one ``add(events, 0)``; when the count moved, a read of the new records (one
request for one: a ``compare_set`` that changes nothing; for more, ``check`` and ``multi_get``).
So a post reaches every looking rank with O(1) requests each, O(N) in all, and a look when
nothing happened is a single request. A process keeps the records it read by board (each
communicator of the world has one), until that board closes; records of boards it is not a
member of are dropped as they are read. The processes of a host share what they read through a
relay (see :mod:`communicator.control.relay`), so that the store sees one reader per host.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

from torch._C._distributed_c10d import Store as _Store

from communicator.control.records import Seal, parse_record
from communicator.control.relay import LOCAL_LOOK_SECONDS, Relay
from communicator.errors import CommError, PeerLostError

__all__ = ["EventLog", "Record", "Store", "StoreHandle", "guarded_store"]

#: The longest pause between a waiting rank's looks at the store (see :mod:`communicator.control.waiting`).
LOOK_SECONDS = 1.0
#: How long a record whose number was taken may stay unwritten before readers skip it (its
#: poster died between the two requests).
MISSING_SECONDS = 2.0
#: The most records one look reads from the store (the rest at the next looks).
MAX_BATCH = 1024
#: The most records whose keys one look checks one by one while a poster is between its requests.
MAX_SINGLE = 16
#: The reads of the store a process may make for its host at once; past them, one a second.
SHARE_BURST = 2.0
#: Where a store runs when nothing says otherwise.
RANK_ZERO = "hosted by world rank 0"
_ABSENT = "\x00absent"  # never a value the control plane writes

T = TypeVar("T")
Record = dict[str, Any]
_SKIPPED: Record = {"kind": "skipped"}  # in place of a value that is not a record: its number is read


#: The key-value store the control plane uses: torch's (``TCPStore``, ``PrefixStore`` over it,
#: ``FileStore``, ``HashStore``), which a custom transport can start for its ranks.
Store: TypeAlias = _Store


class StoreHandle:
    """The store as the control plane holds it: released when the last communicator of its world
    closes, so that nothing keeps the store (on rank 0, its server thread) alive after that.
    ``where`` says where it runs, for the error that says it is gone."""

    def __init__(self, store: Store, where: str = RANK_ZERO) -> None:
        self._store: Store | None = store
        self.where = where
        self._made = threading.local()  # requests made by each thread (the pace of its polling loops)

    def release(self) -> None:
        self._store = None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise CommError("the communicator is closed: its control plane is released")
        return self._store

    @property
    def requests(self) -> int:
        """The requests the calling thread made so far."""
        return int(getattr(self._made, "count", 0))

    def _call(self, call: Callable[[], T]) -> T:
        self._made.count = self.requests + 1
        try:
            return call()
        except CommError:
            raise
        except Exception as error:  # noqa: BLE001 - torch raises DistNetworkError, DistStoreError, RuntimeError
            raise PeerLostError(f"the rendezvous store ({self.where}) is unreachable: {type(error).__name__}") from None

    def set(self, key: str, value: str) -> None:
        self._call(lambda: self.store.set(key, value))

    def get(self, key: str) -> bytes:
        return self._call(lambda: self.store.get(key))

    def add(self, key: str, value: int) -> int:
        return self._call(lambda: self.store.add(key, value))

    def check(self, keys: list[str]) -> bool:
        return self._call(lambda: self.store.check(keys))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._call(lambda: self.store.multi_get(keys))

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        # every torch store has multi_set (one request to a server); its stubs do not
        self._call(lambda: self.store.multi_set(keys, values))  # type: ignore[attr-defined]

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self._call(lambda: self.store.compare_set(key, expected, desired))

    def counters(self, keys: list[str]) -> list[int]:
        """The values of counters (keys that ``add`` made: each must exist) in one request; one
        that does not read as a number counts as 0."""
        values = self.multi_get(keys)
        return [int(value) if value.isdigit() and len(value) < 19 else 0 for value in values]

    def peek(self, key: str) -> bytes | None:
        """The value of ``key``, ``None`` while there is none: one request that never blocks."""
        value = self.compare_set(key, _ABSENT, _ABSENT)  # a missing key is not made: the expected comes back
        return None if value == _ABSENT.encode() else value

    def append(self, key: str, value: str) -> None:
        # every torch store has append; its stubs do not
        self._call(lambda: self.store.append(key, value))  # type: ignore[attr-defined]


def guarded_store(call: Callable[[], T]) -> T:
    """Run one store request; a store that is gone is a lost peer (a :class:`StoreHandle`'s
    requests say where it ran)."""
    try:
        return call()
    except CommError:
        raise
    except Exception as error:  # noqa: BLE001 - torch raises DistNetworkError, DistStoreError, RuntimeError
        raise PeerLostError(f"the rendezvous store is unreachable: {type(error).__name__}") from None


class EventLog:
    """The records posted in one world, as far as this process has read them."""

    def __init__(
        self,
        store: StoreHandle,
        relay: Relay | None = None,
        clock: Callable[[], float] = time.monotonic,
        seal: Seal | None = None,
    ) -> None:
        self.store, self.relay = store, relay
        self.seal = seal if seal is not None else Seal()
        self._boards: dict[str, list[Record]] = {}  # records read so far, by board, in posting order
        self._forgotten: set[str] = set()  # boards this process will never read (closed, or not a member)
        self._lock = threading.Lock()  # the waiting thread and a judge's probes both look
        self._read = 0  # records numbered 1.._read are read (or skipped)
        self._clock = clock
        self._missing_since: float | None = None
        self._share, self._filled = SHARE_BURST, clock()  # reads it may make for its host, as of when

    def now(self) -> float:
        """The log's clock (the monotonic one, or a simulation's)."""
        return self._clock()

    def post(self, record: Record) -> None:
        """Append ``record`` for every rank; never raises (the store may be gone, and the error
        being reported matters more)."""
        try:
            number = self.store.add("events", 1)
            key = f"event/{number}"
            self.store.set(key, self.seal.seal(key, json.dumps(record)))
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
            # This process's share of the host's reads: one a second once its burst is spent,
            # however many of the host's turns fall due at its looks (or however late they run).
            mine = self._refill() >= 1
            turn = relay.turn() if mine and relay.due() else None
            if turn is None:
                if mine and relay.stuck():  # its turn's holder is stopped: the store itself
                    self.spend()
                    return self._take(self._from_store()) or taken
                return taken
            self.spend()
            with turn:
                taken = self._take(turn.records) or taken
                found = self._from_store()
                turn.hand(found)
            return self._take(found) or taken

    def spend(self) -> None:
        """This process read the store for news (for its host, or for itself: a barrier's
        counters): one read of its share."""
        self._share = max(self._refill() - 1, 0.0)

    def _refill(self) -> float:
        """The reads this process may make for its host now: one more each second, up to
        :data:`SHARE_BURST`."""
        now = self._clock()
        self._share = min(SHARE_BURST, self._share + max(now - self._filled, 0.0) / LOOK_SECONDS)
        self._filled = now
        return self._share

    def behind(self, count: int | None) -> bool:
        """Whether a look may find something, given the store's count of records (``None``: not known)."""
        return count is None or count > self._read

    @property
    def look_seconds(self) -> float:
        """The longest pause between a waiting rank's looks: a relay is read for free, so more often."""
        return LOOK_SECONDS if self.relay is None else LOCAL_LOOK_SECONDS

    def _from_store(self) -> list[tuple[int, bytes]]:
        """The records posted since the last one read, :data:`MAX_BATCH` at most, checked: one that
        is not a signed record is there as a skipped one that says why (each process of the host
        counts it as it takes it, so its warning is given in every process, rank 0's too)."""
        count = self.store.add("events", 0)
        if count <= self._read:
            return []
        keys = [f"event/{n}" for n in range(self._read + 1, min(count, self._read + MAX_BATCH) + 1)]
        values: list[bytes | None]
        if len(keys) == 1 and (value := self.store.peek(keys[0])) is not None:  # the usual news: one request
            values = [value]
        elif self.store.check(keys):
            values = [*self.store.multi_get(keys)]
        else:  # while a poster is between its two requests: what is there
            values = self._written(keys[:MAX_SINGLE])
        found = []
        for key, number, value in zip(keys, range(self._read + 1, count + 1), values, strict=False):
            checked = _SKIPPED if value is None else self.seal.checked(key, value)
            record = {**_SKIPPED, "why": checked} if isinstance(checked, str) else checked
            found.append((number, json.dumps(record).encode()))
        return found

    def _take(self, records: list[tuple[int, bytes]]) -> bool:
        """Keep the records that follow the last one taken (records are numbered from 1); whether
        there were any. One that is not a record (a damaged relay) is not taken: the store's is."""
        taken = self._read
        for number, value in records:
            if number != self._read + 1:
                continue
            try:
                record = parse_record(value.decode())
            except UnicodeDecodeError:
                record = None
            if record is None:
                self.seal.tally.note("damaged lines of the host's relay")
                continue
            if record["kind"] == "skipped" and isinstance(record.get("why"), str):
                self.seal.tally.note(record["why"])
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

    def _written(self, keys: list[str]) -> list[bytes | None]:
        """The values of ``keys`` up to the first that is missing (``None``: one missing too long,
        its poster died between its two requests)."""
        values: list[bytes | None] = []
        for key in keys:
            if self.store.check([key]):
                values.append(self.store.get(key))
                self._missing_since = None
                continue
            now = self._clock()
            self._missing_since = self._missing_since or now
            if now - self._missing_since < MISSING_SECONDS:
                break
            values.append(None)  # its poster died mid-post: skip it
            self._missing_since = None
        return values
