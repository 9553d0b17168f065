"""Per-operation statistics, summed from the :class:`~communicator.observe.events.Event` of every call.

What each column means, per rank:

- ``calls``, and how many of them failed;
- ``time``: from entering the public method to its return (for ``async_op=True``, to the
  handle's return: the wait on the handle is the caller's);
- ``wait``: the part of ``time`` spent blocked until the backend finished the transfers (late
  peers and the transfer itself); ``time - wait - serialize - deserialize`` is this rank's own
  work (checks, staging, copies);
- ``serialize`` / ``deserialize``: object operations' encoding of this rank's objects and
  decoding of the others';
- ``sent`` / ``received``: the payload this rank contributed and got, in bytes. For a tensor
  operation that is the data the operation is defined to move, not what an algorithm puts on the
  wire: all_reduce sends and receives the tensor; reduce sends it (``dst`` receives it);
  broadcast's ``src`` sends it and the others receive it; all_gather and gather send this rank's
  tensor and receive the others'; scatter's ``src`` sends the others' parts; reduce_scatter
  sends the parts for the others and receives its own; all_to_all sends and receives the parts
  of the others; send/recv the tensor. The records that describe shapes are not counted; in a
  world of one nothing is sent or received. all_reduce_dict counts its values as all_reduce
  counts a tensor. For an object operation: the bytes of the objects this rank encoded and
  decoded;
- ``algbw``: ``size`` over ``time``, and ``busbw`` that times a factor of the world size, as
  NCCL's performance tests define them: ``2(n-1)/n`` for all_reduce and all_reduce_dict,
  ``(n-1)/n`` for all_gather, gather, scatter, reduce_scatter and all_to_all, ``1`` for
  broadcast, reduce and point-to-point. ``size`` is the tensor's bytes for all_reduce,
  broadcast, reduce and point-to-point, and all the data for the others (off scatter's ``src``,
  and the ranks other than gather's ``dst``, which see only their own part: that times the world
  size). Object operations have no bandwidth.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from communicator.observe.events import Event

__all__ = ["BUS_FACTORS", "Row", "Statistics"]

#: The bus bandwidth factor of each tensor operation, a function of the world size.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    **dict.fromkeys(("all_reduce", "all_reduce_dict"), lambda n: 2 * (n - 1) / n),
    **dict.fromkeys(("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"), lambda n: (n - 1) / n),
    **dict.fromkeys(("broadcast", "reduce", "send", "recv", "isend", "irecv"), lambda n: 1.0),
}
_COUNTED = ("calls", "errors", "sent", "received", "size", "time", "wait", "serialize", "deserialize")


def _bytes(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def _rate(per_second: float | None) -> str:
    return "-" if per_second is None else f"{_bytes(round(per_second))}/s"


class Row:
    """The sums of one operation on one group."""

    __slots__ = ("calls", "deserialize", "errors", "group", "op", "received", "sent", "serialize", "size", "time",
                 "wait", "world_size")  # fmt: skip

    def __init__(self, group: str, op: str, world_size: int) -> None:
        self.group, self.op, self.world_size = group, op, world_size
        self.calls = self.errors = self.sent = self.received = self.size = 0
        self.time = self.wait = self.serialize = self.deserialize = 0.0

    def add(self, event: Event) -> None:
        self.calls += 1
        self.errors += event.error is not None
        self.sent += event.sent
        self.received += event.received
        self.size += event.size
        self.time += event.duration
        self.wait += event.wait
        self.serialize += event.serialize
        self.deserialize += event.deserialize

    def merge(self, other: Row) -> None:
        for name in _COUNTED:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def algbw(self) -> float | None:
        """Bytes per second of ``size`` (tensor operations only)."""
        return self.size / self.time if self.op in BUS_FACTORS and self.time > 0 else None

    @property
    def busbw(self) -> float | None:
        algbw = self.algbw
        return None if algbw is None else algbw * BUS_FACTORS[self.op](self.world_size)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ("group", "op", *_COUNTED)} | {
            "algbw": self.algbw,
            "busbw": self.busbw,
        }


class Statistics:
    """Rows keyed by (group, operation), in the order operations first ran."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Row] = {}

    def add(self, event: Event) -> None:
        key = (event.group, event.op)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = Row(event.group, event.op, event.world)
        row.add(event)

    def __getitem__(self, op: str) -> Row:
        """The row of ``op``, its groups summed (``KeyError`` if it never ran)."""
        rows = [row for (_, name), row in self.rows.items() if name == op]
        if not rows:
            raise KeyError(op)
        total = Row("all", op, rows[0].world_size)
        for row in rows:
            total.merge(row)
        return total

    def as_dict(self) -> list[dict[str, Any]]:
        """One dict per row: the sums, and ``algbw``/``busbw`` in bytes per second (``None`` for objects)."""
        return [row.as_dict() for row in self.rows.values()]

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1)

    def table(self) -> str:
        """An aligned table: bytes in B/kB/MB/GB (powers of 1000), times in milliseconds."""
        header = ("group", "op", "calls", "sent", "received", "time ms", "wait ms", "ser ms", "deser ms",
                  "algbw", "busbw")  # fmt: skip
        lines = [header]
        for row in self.rows.values():
            lines.append((
                row.group, row.op, str(row.calls) + (f" ({row.errors} failed)" if row.errors else ""),
                _bytes(row.sent), _bytes(row.received), f"{row.time * 1e3:.2f}", f"{row.wait * 1e3:.2f}",
                f"{row.serialize * 1e3:.2f}", f"{row.deserialize * 1e3:.2f}", _rate(row.algbw), _rate(row.busbw),
            ))  # fmt: skip
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        return "\n".join(
            "  ".join(cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i]) for i, cell in enumerate(line))
            for line in lines
        )

    def __str__(self) -> str:
        return self.table()
