"""What a communicator records of each operation: one record per public call, the last of them
in a ring (the flight recorder), dumped as JSON when something goes wrong or when asked.

Every outermost public call gets a record from the guard; the operation itself adds what only it
knows (bytes, serialisation and wait time). A record is a plain list, the cheapest object Python
makes, since every call makes one; :class:`Event` is its named view, which hooks, statistics and
readers of the recorder receive.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import time
from typing import Any, Generic, TypeVar, overload

import torch

__all__ = ["Event", "FlightRecorder", "finish", "locate"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def locate(frame: Any) -> tuple[str, int] | None:
    """(file, line) of ``frame``, or of the first frame above it outside this package."""
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    return None if frame is None else (frame.f_code.co_filename, frame.f_lineno)


_clock = time.perf_counter
_EPOCH = time.time() - _clock()  # turns the monotonic clock into wall-clock time
_FIELDS = ("op", "seq", "group", "rank", "world", "p2p", "shapes", "dtypes", "site", "started", "state", "error",
           "duration", "wait", "serialize", "deserialize", "sent", "received", "size")  # fmt: skip

# A record's positions (the guard builds records, in CallState.start). WHERE holds the caller's
# frame while the call runs, its (code, offset) after.
OP, P2P, SEQ, HOME, WHERE, SHAPES, DTYPES, CLOCK, STATE, ERROR = range(10)
DURATION, WAIT, SERIALIZE, DESERIALIZE, SENT, RECEIVED, SIZE = range(10, 17)
RUNNING, DONE, FAILED = "running", "done", "failed"


def _line(finished: tuple[Any, int] | None) -> tuple[str, int] | None:
    """(file, line) of a finished call's (code, instruction offset)."""
    if finished is None:
        return None
    code, offset = finished
    line = next((line for start, end, line in code.co_lines() if start <= offset < end), None)
    return code.co_filename, code.co_firstlineno if line is None else line


def finish(record: list[Any], error: BaseException | None) -> None:
    """Record the end of a call (and ``error``); keep the call's site, let go of the caller's frame.

    The site is kept as (code, instruction offset): its line is looked up only when asked for.
    """
    record[DURATION] = _clock() - record[CLOCK]
    frame = record[WHERE]
    code = frame.f_code
    while code.co_filename.startswith(_PACKAGE):  # as locate(), inlined
        frame = frame.f_back
        if frame is None:
            break
        code = frame.f_code
    record[WHERE] = None if frame is None else (code, frame.f_lasti)
    if error is None:
        record[STATE] = DONE
    else:
        record[STATE], record[ERROR] = FAILED, f"{type(error).__name__}: {error}".splitlines()[0][:300].rstrip(":")


T = TypeVar("T")


class _Field(Generic[T]):
    """One position of the record, read and written by name."""

    def __init__(self, index: int) -> None:
        self.index = index

    @overload
    def __get__(self, event: None, owner: type[Event]) -> _Field[T]: ...
    @overload
    def __get__(self, event: Event, owner: type[Event]) -> T: ...
    def __get__(self, event: Event | None, owner: type[Event]) -> T | _Field[T]:
        return self if event is None else event._record[self.index]

    def __set__(self, event: Event, value: T) -> None:
        event._record[self.index] = value


class Event:
    """One public operation, as this rank ran it: what hooks receive and the flight recorder keeps.

    Set when the operation starts:

    - ``op``: the public method (``"all_reduce"``, ``"gather_object"``, ...);
    - ``seq``: the collective's number on its communicator, the same on every rank of a correct
      program (point-to-point operations carry the number of the last collective before them);
    - ``group``: ``"world"``, or ``"ranks 0,2"`` (the world ranks of a subgroup);
    - ``rank`` in the group and its size ``world``; ``p2p``: whether it is point-to-point;
    - ``shapes`` and ``dtypes`` (``torch.float32``, ...; names such as ``"float32"`` in
      :meth:`as_dict`) of the tensor arguments;
    - ``site``: ``file:line`` of the call; ``started``: seconds since the epoch.

    Set when it has finished (hooks' ``post`` see them): ``state`` (``"running"``, ``"done"``,
    ``"failed"``), ``error`` (the first line of the error, or ``None``), and the accounting the
    statistics sum (:mod:`communicator.observe.stats` defines each): ``duration``, ``wait``,
    ``serialize``, ``deserialize`` (seconds), ``sent``, ``received``, ``size`` (bytes).

    An event is a view of the call's record: every view of one call reads and writes the same
    fields, and views of one call compare equal.
    """

    __slots__ = ("_record",)

    op: _Field[str] = _Field(OP)
    p2p: _Field[bool] = _Field(P2P)
    seq: _Field[int] = _Field(SEQ)
    shapes: _Field[tuple[torch.Size, ...]] = _Field(SHAPES)
    dtypes: _Field[tuple[torch.dtype, ...]] = _Field(DTYPES)
    state: _Field[str] = _Field(STATE)
    error: _Field[str | None] = _Field(ERROR)
    duration: _Field[float] = _Field(DURATION)
    wait: _Field[float] = _Field(WAIT)
    serialize: _Field[float] = _Field(SERIALIZE)
    deserialize: _Field[float] = _Field(DESERIALIZE)
    sent: _Field[int] = _Field(SENT)
    received: _Field[int] = _Field(RECEIVED)
    size: _Field[int] = _Field(SIZE)

    def __init__(self, record: list[Any]) -> None:
        self._record = record

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Event) and other._record is self._record  # views of one call are one event

    def __hash__(self) -> int:
        return id(self._record)

    @property
    def group(self) -> str:
        return str(self._record[HOME][0])

    @property
    def rank(self) -> int:
        return int(self._record[HOME][1])

    @property
    def world(self) -> int:
        return int(self._record[HOME][2])

    @property
    def site(self) -> str:
        """``file:line`` of the call (``"unknown"`` if it came from no file outside this package)."""
        record = self._record
        where = locate(record[WHERE]) if record[STATE] == RUNNING else _line(record[WHERE])
        return "unknown" if where is None else f"{where[0]}:{where[1]}"

    @property
    def started(self) -> float:
        """When the operation started, in seconds since the epoch."""
        return _EPOCH + float(self._record[CLOCK])

    def since(self) -> float:
        """Seconds since it started, while it runs; since it ended, after."""
        record = self._record
        passed = time.perf_counter() - record[CLOCK]
        return float(passed if record[STATE] == RUNNING else passed - record[DURATION])

    def describe_sizes(self) -> str:
        """The tensor arguments as ``dtype[shape]``, e.g. ``float32[1024, 3]``."""
        return ", ".join(
            f"{str(d).removeprefix('torch.')}{list(s)}" for d, s in zip(self.dtypes, self.shapes, strict=True)
        )

    def as_dict(self) -> dict[str, Any]:
        """The fields, JSON-ready: shapes as lists, dtypes as names (``"float32"``)."""
        record = {name: getattr(self, name) for name in _FIELDS}
        record["shapes"] = [list(shape) for shape in self.shapes]
        record["dtypes"] = [str(dtype).removeprefix("torch.") for dtype in self.dtypes]
        return record

    def __repr__(self) -> str:
        return f"<Event #{self.seq} {self.op} {self.state} on rank {self.rank} of {self.group}>"


class FlightRecorder(collections.deque[list[Any]]):
    """The records of the last ``maxlen`` calls of one communicator, oldest first (``append`` is
    deque's own, in C)."""

    def events(self) -> list[Event]:
        return [Event(record) for record in list(self)]

    def last(self) -> Event | None:
        try:
            return Event(self[-1])
        except IndexError:
            return None

    def dump(self, directory: str, name: str, world_rank: int, extra: dict[str, Any]) -> str:
        """Write the events to ``directory/<name>-rank<world_rank>.json``; the file's path."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"{name}-rank{world_rank}.json")
        record = {
            "group": name,
            "world_rank": world_rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "dumped": time.time(),
            **extra,
            "events": [event.as_dict() for event in self.events()],
        }
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as out:
            json.dump(record, out, indent=1, default=str)
        os.replace(temporary, path)  # a reader never sees half a file
        return path
