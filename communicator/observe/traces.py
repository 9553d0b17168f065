"""Reading the ranks' flight-recorder dumps together: where did they diverge?

Each rank writes ``<group>-rank<world rank>.json`` (see ``Communicator.dump_trace``): its last
operations, numbered by collective. Merged, they say for each communicator which ranks stopped at
which collective and in which operation, the first collective number at which ranks called
different operations, and which ranks left no dump (killed, or not configured to dump).

A dump is read only if it is a regular file of at most :data:`MAX_DUMP_BYTES` whose every field
has the type and range a rank writes; any other is named with the reason and left out. Strings
from a dump are shown with their control characters escaped, so that none can forge a line of the
report or reach the terminal.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import stat
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

__all__ = ["MAX_DUMP_BYTES", "RankDump", "analyse", "read_dumps", "report"]

#: The largest dump read (a rank's 256 events take about 150 KB).
MAX_DUMP_BYTES = 32 << 20
_MAX_RANKS = 2**31 - 1  # torch numbers ranks with 32-bit ints
_MAX_TEXT = 300  # characters of one string shown


class _Unreadable(Exception):
    """Why a dump was left out."""


@dataclasses.dataclass
class RankDump:
    """One rank's dump of one communicator."""

    rank: int
    world_size: int
    seq: int
    running: str | None
    events: list[dict[str, Any]]

    def last(self) -> dict[str, Any] | None:
        return self.events[-1] if self.events else None

    def collectives(self) -> dict[int, dict[str, Any]]:
        """Its recorded collectives by number (point-to-point operations carry no number of their own)."""
        return {int(e["seq"]): e for e in self.events if not e["p2p"]}


def clean(text: str) -> str:
    """``text`` with control and other unprintable characters escaped, cut to a few hundred characters."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + "..."


def _check(value: Any, kind: type, what: str) -> Any:
    if type(value) is not kind:  # exactly: a bool is no rank
        shown = "missing" if value is None else f"a {type(value).__name__}"
        raise _Unreadable(f"{what} is {shown}, not a {kind.__name__}")
    return value


def _count(value: Any, what: str, low: int = 0, high: int = _MAX_RANKS) -> int:
    number: int = _check(value, int, what)
    if not low <= number <= high:
        raise _Unreadable(f"{what} is {number}, outside {low}..{high}")
    return number


def _text(value: Any, what: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    return clean(_check(value, str, what))


def _event(raw: Any, index: int) -> dict[str, Any]:
    """A recorded operation, its fields checked and its strings cleaned."""
    what = f"event {index}"
    fields: dict[str, Any] = _check(raw, dict, what)
    shapes = _check(fields.get("shapes", []), list, f"{what}'s shapes")
    dtypes = _check(fields.get("dtypes", []), list, f"{what}'s dtypes")
    return {
        "op": _text(fields.get("op"), f"{what}'s op"),
        "seq": _count(fields.get("seq"), f"{what}'s seq", high=2**63 - 1),
        "p2p": _check(fields.get("p2p", False), bool, f"{what}'s p2p"),
        "state": _text(fields.get("state"), f"{what}'s state"),
        "error": _text(fields.get("error"), f"{what}'s error", optional=True),
        "site": _text(fields.get("site", "unknown"), f"{what}'s site"),
        "dtypes": [_text(d, f"{what}'s dtype") for d in dtypes],
        "shapes": [
            [_count(n, f"{what}'s dim", high=2**63 - 1) for n in _check(s, list, f"{what}'s shape")] for s in shapes
        ],
    }


def _read(path: str) -> bytes:
    """The bytes of a regular file of at most MAX_DUMP_BYTES (a FIFO is opened without blocking)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise _Unreadable(error.strerror or str(error)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Unreadable("not a regular file")
        if info.st_size > MAX_DUMP_BYTES:
            raise _Unreadable(f"{info.st_size} bytes, more than a dump's {MAX_DUMP_BYTES}")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):  # the file may grow while it is read
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_DUMP_BYTES:
                raise _Unreadable(f"more than a dump's {MAX_DUMP_BYTES} bytes")
    except OSError as error:
        raise _Unreadable(error.strerror or str(error)) from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _parse(path: str) -> tuple[str, RankDump]:
    data = _read(path)
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as error:  # invalid, truncated, binary, nested too deep
        raise _Unreadable(f"not a JSON dump ({clean(str(error))})") from None
    fields: dict[str, Any] = _check(raw, dict, "the dump")
    world = _count(fields.get("world_size"), "world_size", low=1)
    rank = _count(fields.get("rank"), "rank", high=world - 1)
    events = _check(fields.get("events"), list, "events")
    dump = RankDump(
        rank,
        world,
        _count(fields.get("seq"), "seq", high=2**63 - 1),
        _text(fields.get("running"), "running", optional=True),
        [_event(event, i) for i, event in enumerate(events)],
    )
    return str(_text(fields.get("group"), "group")), dump


def read_dumps(directory: str) -> tuple[dict[str, list[RankDump]], list[str]]:
    """Every readable dump in ``directory``, by communicator (``world``, or a subgroup's ranks);
    and for each dump left out, its name and why."""
    groups: dict[str, list[RankDump]] = defaultdict(list)
    unreadable = []
    for path in sorted(glob.glob(os.path.join(glob.escape(directory), "*-rank*.json"))):
        try:
            name, dump = _parse(path)
            if any(other.rank == dump.rank for other in groups[name]):
                raise _Unreadable(f"a second dump of rank {dump.rank} of {name}")
        except _Unreadable as why:
            unreadable.append(f"{clean(path)}: {why}")
            continue
        groups[name].append(dump)
    dumps = {name: sorted(dumps, key=lambda d: d.rank) for name, dumps in groups.items() if dumps}
    return dumps, unreadable


def _call(event: dict[str, Any]) -> str:
    sizes = " ".join(f"{d}{s}" for d, s in zip(event["dtypes"], event["shapes"], strict=False))
    return f"{event['op']}{' ' + sizes if sizes else ''} at {event['site']}"


def _missing(world: int, present: list[int]) -> str:
    """The ranks below ``world`` not in ``present`` (sorted), as spans: never one per rank."""
    gaps, start = [], 0
    for rank in [*present, world]:
        if rank > start:
            gaps.append(str(start) if rank == start + 1 else f"{start}-{rank - 1}")
        start = rank + 1
    return ", ".join(gaps)


def analyse(dumps: Sequence[RankDump]) -> list[str]:
    """What one communicator's dumps say, one finding per line."""
    world = max(d.world_size for d in dumps)
    lines = []
    missing = _missing(world, [d.rank for d in dumps])
    if missing:
        lines.append(f"no dump from ranks [{missing}] (their processes were killed, or had no trace_dir)")
    for dump in dumps:
        event = dump.last()
        if event is None:
            lines.append(f"rank {dump.rank}: no operation recorded")
            continue
        state = event["state"] + (f" ({event['error']})" if event["error"] else "")
        lines.append(f"rank {dump.rank}: #{dump.seq} {_call(event)}: {state}")
    calls = {d.rank: d.collectives() for d in dumps}
    common = sorted(set().union(*(c.keys() for c in calls.values())))
    for seq in common:
        ops = {rank: c[seq] for rank, c in calls.items() if seq in c}
        if len({e["op"] for e in ops.values()}) > 1:
            sides = "; ".join(f"rank {rank} {_call(e)}" for rank, e in sorted(ops.items()))
            lines.append(f"diverged at #{seq}: {sides}")
            break
    reached = max(d.seq for d in dumps)
    behind = [d for d in dumps if d.seq < reached]
    if behind:
        ahead = [d.rank for d in dumps if d.seq == reached]
        for dump in behind:
            lines.append(f"behind: rank {dump.rank} entered {dump.seq} collectives; ranks {ahead} entered {reached}")
    return lines


def report(directory: str) -> tuple[str, list[str], bool]:
    """The merged findings of every communicator's readable dumps in ``directory``, a line naming
    each dump left out and why, and whether any dump was read."""
    groups, unreadable = read_dumps(directory)
    if not groups:
        readable = " that could be read" if unreadable else ""
        return f"no flight-recorder dumps (*-rank*.json){readable} in {clean(directory)}", unreadable, False
    out = []
    for name, dumps in groups.items():
        world = max(d.world_size for d in dumps)
        out.append(f"{name}: {world} ranks, dumps from ranks {[d.rank for d in dumps]}")
        out.extend(f"  {line}" for line in analyse(dumps))
    return "\n".join(out), unreadable, True
