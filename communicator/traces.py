"""Reading the ranks' flight-recorder dumps together: where did they diverge?

Each rank writes ``<group>-rank<world rank>.json`` (see ``Communicator.dump_trace``): its last
operations, numbered by collective. Merged, they say for each communicator which ranks stopped at
which collective and in which operation, the first collective number at which ranks called
different operations, and which ranks left no dump (killed, or not configured to dump).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

__all__ = ["RankDump", "analyse", "read_dumps", "report"]


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
        return {int(e["seq"]): e for e in self.events if not e.get("p2p")}


def read_dumps(directory: str) -> dict[str, list[RankDump]]:
    """Every dump in ``directory``, by communicator (``world``, or a subgroup's ranks)."""
    groups: dict[str, list[RankDump]] = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(directory, "*-rank*.json"))):
        with open(path) as source:
            data = json.load(source)
        dump = RankDump(
            int(data["rank"]), int(data["world_size"]), int(data["seq"]), data.get("running"), data["events"]
        )
        groups[str(data["group"])].append(dump)
    return {name: sorted(dumps, key=lambda d: d.rank) for name, dumps in groups.items()}


def _call(event: dict[str, Any]) -> str:
    sizes = " ".join(f"{d}{s}" for d, s in zip(event.get("dtypes", []), event.get("shapes", []), strict=False))
    return f"{event['op']}{' ' + sizes if sizes else ''} at {event.get('site', 'unknown')}"


def analyse(dumps: Sequence[RankDump]) -> list[str]:
    """What one communicator's dumps say, one finding per line."""
    world = max(d.world_size for d in dumps)
    lines = []
    missing = sorted(set(range(world)) - {d.rank for d in dumps})
    if missing:
        lines.append(f"no dump from ranks {missing} (their processes were killed, or had no trace_dir)")
    for dump in dumps:
        event = dump.last()
        if event is None:
            lines.append(f"rank {dump.rank}: no operation recorded")
            continue
        state = event["state"] + (f" ({event['error']})" if event.get("error") else "")
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


def report(directory: str) -> str:
    """The merged findings of every communicator's dumps in ``directory``."""
    groups = read_dumps(directory)
    if not groups:
        return f"no flight-recorder dumps (*-rank*.json) in {directory}"
    out = []
    for name, dumps in groups.items():
        world = max(d.world_size for d in dumps)
        out.append(f"{name}: {world} ranks, dumps from ranks {[d.rank for d in dumps]}")
        out.extend(f"  {line}" for line in analyse(dumps))
    return "\n".join(out)
