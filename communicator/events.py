"""What a communicator records of each operation: one :class:`Event` per public call, the last
of them in a ring (the flight recorder), dumped as JSON when something goes wrong or when asked.

Every outermost public call gets an event from the guard; the operation itself adds what only it
knows (bytes, serialisation and wait time). Hooks and statistics read the same events.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import time
from typing import Any

import torch

__all__ = ["Event", "FlightRecorder", "locate"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def locate(frame: Any) -> tuple[str, int] | None:
    """(file, line) of ``frame``, or of the first frame above it outside this package."""
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    return None if frame is None else (frame.f_code.co_filename, frame.f_lineno)


_EPOCH = time.time() - time.perf_counter()  # turns the monotonic clock into wall-clock time
_FIELDS = ("op", "seq", "group", "rank", "world", "p2p", "shapes", "dtypes", "site", "started", "state", "error",
           "duration", "wait", "serialize", "deserialize", "sent", "received", "size")  # fmt: skip


class Event:
    """One public operation, as this rank ran it: what hooks receive and the flight recorder keeps.

    Set when the operation starts:

    - ``op``: the public method (``"all_reduce"``, ``"gather_object"``, ...);
    - ``seq``: the collective's number on its communicator, the same on every rank of a correct
      program (point-to-point operations carry the number of the last collective before them);
    - ``group``: ``"world"``, or ``"ranks 0,2"`` (the world ranks of a subgroup);
    - ``rank`` in the group and its size ``world``; ``p2p``: whether it is point-to-point;
    - ``shapes`` and ``dtypes`` (``"float32"``, ...) of the tensor arguments;
    - ``site``: ``file:line`` of the call; ``started``: seconds since the epoch.

    Set when it has finished (hooks' ``post`` see them): ``state`` (``"running"``, ``"done"``,
    ``"failed"``), ``error`` (the first line of the error, or ``None``), and the accounting the
    statistics sum (:mod:`communicator.stats` defines each): ``duration``, ``wait``,
    ``serialize``, ``deserialize`` (seconds), ``sent``, ``received``, ``size`` (bytes).
    """

    # What a call has not set yet reads from the class: creating an event, on every call, sets five fields.
    shapes: tuple[torch.Size, ...] = ()
    dtypes: tuple[torch.dtype, ...] = ()
    state = "running"
    error: str | None = None
    duration = wait = serialize = deserialize = 0.0
    sent = received = size = 0
    _site: tuple[str, int] | None = None

    def __init__(
        self,
        op: str,
        p2p: bool,
        seq: int,
        home: tuple[str, int, int],
        frame: Any,
        shapes: tuple[torch.Size, ...] = (),
        dtypes: tuple[torch.dtype, ...] = (),
    ) -> None:
        self.op, self.p2p, self.seq, self._home, self._frame = op, p2p, seq, home, frame  # the frame: while it runs
        self.shapes, self.dtypes, self._clock = shapes, dtypes, time.perf_counter()

    @property
    def group(self) -> str:
        return self._home[0]

    @property
    def rank(self) -> int:
        return self._home[1]

    @property
    def world(self) -> int:
        return self._home[2]

    @property
    def site(self) -> str:
        """``file:line`` of the call (``"unknown"`` if it came from no file outside this package)."""
        where = self._site or locate(self._frame)
        return "unknown" if where is None else f"{where[0]}:{where[1]}"

    @property
    def started(self) -> float:
        """When the operation started, in seconds since the epoch."""
        return _EPOCH + self._clock

    def since(self) -> float:
        """Seconds since it started, while it runs; since it ended, after."""
        now = time.perf_counter()
        return now - self._clock if self.state == "running" else now - self._clock - self.duration

    def finish(self, error: BaseException | None) -> None:
        """Record the end (and ``error``); keep the call's site and drop the caller's frame."""
        self.duration = time.perf_counter() - self._clock
        frame, self._frame = self._frame, None
        while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):  # as locate(), inlined
            frame = frame.f_back
        self._site = None if frame is None else (frame.f_code.co_filename, frame.f_lineno)
        if error is None:
            self.state = "done"
        else:
            self.state, self.error = "failed", f"{type(error).__name__}: {error}".splitlines()[0][:300].rstrip(":")

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


class FlightRecorder(collections.deque[Event]):
    """The last ``maxlen`` events of one communicator, oldest first (``append`` is deque's own, in C)."""

    def last(self) -> Event | None:
        try:
            return self[-1]
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
            "events": [event.as_dict() for event in list(self)],
        }
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as out:
            json.dump(record, out, indent=1, default=str)
        os.replace(temporary, path)  # a reader never sees half a file
        return path
