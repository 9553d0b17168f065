"""Why a wait takes long: every process says what its communicators are doing, and a rank that has
waited long enough compares what the members say.

**Statuses.** Each process runs one watcher thread per world communicator. Every
:data:`BEAT_SECONDS` it writes a status to the failure board: a heartbeat count, and for each of
its communicators the number of collectives entered, the operation running (or the last one, and
for how long the communicator has been idle) and the call site. Operations write nothing: the
thread reads what the guard keeps anyway, so a call costs nothing more.

**Diagnosis.** A rank whose wait in one operation has lasted ``stall_seconds`` (or half the
timeout, if shorter) reads the members' statuses every beat and judges (:func:`judge`):

- ranks in *different collectives at the same point* (the same number, different operations; or
  every rank inside a collective and not all in the same one), or in the same collective with
  dtypes (or, where they must agree, shapes) that differ: a mismatch, which can never finish.
  Once two looks agree, every member raises :class:`~communicator.errors.CollectiveMismatchError`
  naming each rank's call (the first to know posts it on the board for the others);
- a member whose heartbeat has stopped for :data:`LOST_SECONDS`: its process is gone (killed, or
  its host unreachable): :class:`~communicator.errors.PeerLostError`;
- otherwise some ranks are elsewhere (a long section of rank 0's, say), or every rank is in the
  same collective and the transport has not finished it: one warning on the ``communicator``
  logger names who is awaited and what it last did, and the wait goes on until the timeout.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from communicator.errors import CollectiveMismatchError, PeerLostError
from communicator.guard import CallState

__all__ = ["BEAT_SECONDS", "LOST_SECONDS", "Report", "Stall", "Verdict", "Watch", "Watcher", "judge"]

#: How often a process writes its status.
BEAT_SECONDS = 1.0
#: A member whose heartbeat has not moved for this long, seen by a waiting rank, is lost.
LOST_SECONDS = 15.0
#: Operations whose tensors must have the same shape on every rank.
EQUAL_SHAPES = frozenset({"all_reduce", "reduce", "broadcast"})

logger = logging.getLogger("communicator")
_CAUSE = (
    "; likely causes: a long section on those ranks (raise the timeout), a collective that only some ranks"
    " call, or a hang in their code"
)


class Board(Protocol):
    """Where statuses and mismatches are posted (a :class:`~communicator.faults.FailureBoard`)."""

    def publish(self, rank: int, status: str) -> None: ...

    def statuses(self, ranks: Sequence[int]) -> dict[int, str]: ...


def describe(calls: CallState) -> dict[str, Any]:
    """What one communicator is doing, as its status says it (read from another thread: one read
    of each field, so a change in between only makes the status a beat old)."""
    running, last = calls.event, calls.recorder.last()
    entry: dict[str, Any] = {"group": calls.group, "seq": calls.seq, "op": ""}
    if running is not None:
        entry.update(op=running.op, p2p=running.p2p, sizes=running.describe_sizes(), site=running.site)
        entry.update(dtypes=[str(d) for d in running.dtypes], seconds=running.since())
    elif last is not None:
        entry.update(last=f"{last.op} #{last.seq}", site=last.site, seconds=last.since())
    return entry


class Watcher:
    """The thread that publishes this process's status for one world, and the communicators it covers."""

    def __init__(self, board: Board, world_rank: int) -> None:
        self.board, self.world_rank = board, world_rank
        self._comms: dict[str, CallState] = {}
        self._stopped = threading.Event()
        self._beat = 0
        self._thread = threading.Thread(target=self._run, name="communicator-watcher", daemon=True)
        self._thread.start()

    def watch(self, name: str, calls: CallState) -> None:
        self._comms[name] = calls

    def forget(self, name: str) -> None:
        self._comms.pop(name, None)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * BEAT_SECONDS)

    def status(self) -> dict[str, Any]:
        comms = {name: describe(calls) for name, calls in list(self._comms.items())}
        return {"host": socket.gethostname(), "pid": os.getpid(), "beat": self._beat, "comms": comms}

    def _run(self) -> None:
        failures = 0
        while not self._stopped.is_set() and failures < 5:  # a store gone for good ends the thread
            self._beat += 1
            try:
                self.board.publish(self.world_rank, json.dumps(self.status()))
                failures = 0
            except Exception:  # noqa: BLE001 - the waiting ranks report what they lack
                failures += 1
            self._stopped.wait(BEAT_SECONDS)


class Report(NamedTuple):
    """What one member said: its status for this communicator (``None``: it reported none), what
    it runs on other communicators, and whether it has reported at all."""

    entry: dict[str, Any] | None
    elsewhere: list[dict[str, Any]]
    heard: bool

    @property
    def collective(self) -> tuple[int, str] | None:
        """(number, operation) of the collective it is in on this communicator."""
        entry = self.entry
        if entry is None or not entry["op"] or entry.get("p2p"):
            return None
        return int(entry["seq"]), str(entry["op"])

    def describe(self) -> str:
        if not self.heard:
            return "has not reported its status (its process may be stopped, or busy outside Python)"
        entry = self.entry
        if entry is None:
            return "has no such communicator open (it closed it, or never made it)"
        if entry["op"]:
            kind = " (point-to-point)" if entry.get("p2p") else f" #{entry['seq']}"
            sizes = f" {entry['sizes']}" if entry.get("sizes") else ""
            return f"is in {entry['op']}{kind}{sizes} at {entry['site']} for {entry['seconds']:.0f} s"
        busy = [f"{e['op']} on {e['group']} at {e['site']}" for e in self.elsewhere]
        if busy:
            return "is in " + "; ".join(busy)
        if "last" not in entry:
            return "is outside any collective, before its first operation"
        return f"is outside any collective for {entry['seconds']:.0f} s; its last: {entry['last']} at {entry['site']}"


class Verdict(NamedTuple):
    """``kind``: ``mismatch``, ``stuck`` (every rank in the same collective) or ``waiting``."""

    kind: str
    headline: str
    sides: dict[int, str]  # rank -> what it is doing
    awaited: list[int]  # the ranks that are not in this collective


def judge(me: int, reports: Sequence[Report]) -> Verdict:
    """The verdict on a wait of rank ``me``, from every member's report (see the module docstring)."""
    sides = {rank: report.describe().removeprefix("is ") for rank, report in enumerate(reports)}
    inside = {rank: c for rank, report in enumerate(reports) if (c := report.collective) is not None}
    awaited = [rank for rank in range(len(reports)) if rank not in inside]
    ops_at: dict[int, set[str]] = defaultdict(set)
    for seq, op in inside.values():
        ops_at[seq].add(op)
    if any(len(ops) > 1 for ops in ops_at.values()):
        return Verdict(
            "mismatch", "ranks are in different collectives at the same point (none can finish)", sides, awaited
        )
    if awaited:
        return Verdict("waiting", "", sides, awaited)
    if len(set(inside.values())) > 1:
        return Verdict("mismatch", "every rank waits, each in a different collective", sides, awaited)
    entries = [report.entry for report in reports if report.entry is not None]
    if len({str(e.get("dtypes")) for e in entries}) > 1:
        return Verdict("mismatch", "ranks passed tensors of different dtypes to the same collective", sides, [])
    if inside[me][1] in EQUAL_SHAPES and len({e.get("sizes") for e in entries}) > 1:
        return Verdict("mismatch", "ranks passed tensors of different shapes to the same collective", sides, [])
    return Verdict("stuck", "every rank is in this collective, with the same arguments", sides, [])


class Watch:
    """One communicator's side of the diagnosis: its members' world ranks and where they report."""

    def __init__(self, watcher: Watcher, name: str, calls: CallState, members: Sequence[int], threshold: float) -> None:
        self.watcher, self.name, self.calls, self.members, self.threshold = watcher, name, calls, members, threshold
        watcher.watch(name, calls)

    def begin(self, rank: int, what: str, started: float, limit: float) -> Stall:
        """A wait of ``what`` on ``rank`` that began at ``started`` (``time.monotonic``), allowed ``limit`` seconds."""
        return Stall(self, rank, what, started, min(self.threshold, limit / 2))


class Stall:
    """One long wait: looks at the members' statuses once per beat after the threshold."""

    def __init__(self, watch: Watch, rank: int, what: str, started: float, threshold: float) -> None:
        self._watch, self._rank, self._what = watch, rank, what
        self._next = started + threshold
        self._started = started
        self._heard: dict[int, tuple[int, float]] = {}  # rank -> (beat, when it last moved)
        self._suspect: tuple[Any, ...] | None = None  # a mismatch seen once, with the beats it was seen at
        self._logged = ""
        self._said: dict[int, str] = {}
        self.verdict: Verdict | None = None

    def tick(self, now: float) -> None:
        """Called while waiting; looks when a beat has passed since the last look (past the threshold)."""
        if now < self._next:
            return
        self._next = now + BEAT_SECONDS
        reports, beats = self._gather(now)
        verdict = self.verdict = judge(self._rank, reports)
        self._said = {rank: report.describe() for rank, report in enumerate(reports)}
        if verdict.kind == "mismatch":
            key = tuple(r.collective for r in reports)
            if self._suspect is not None and self._suspect[0] == key and self._fresh(self._suspect[1], beats):
                raise CollectiveMismatchError(verdict.sides, verdict.headline)
            self._suspect = (key, beats) if self._suspect is None or self._suspect[0] != key else self._suspect
            return
        self._suspect = None
        self._log(verdict, reports, now)

    def explain(self) -> str:
        """What the last look found, for an error message ("" before any look)."""
        verdict = self.verdict
        if verdict is None:
            return ""
        if verdict.awaited:
            return f"ranks {verdict.awaited} did not arrive: {self.who(verdict.awaited)}{_CAUSE}"
        return f"{verdict.headline}, and the backend has not completed it"

    def who(self, ranks: Sequence[int]) -> str:
        """What the last look found ``ranks`` doing ("" before any look)."""
        if self.verdict is None:
            return ""
        return "; ".join(f"rank {r} {self._said[r]}" for r in ranks if r in self._said)

    def _gather(self, now: float) -> tuple[list[Report], dict[int, int]]:
        watch = self._watch
        raw = watch.watcher.board.statuses([m for i, m in enumerate(watch.members) if i != self._rank])
        reports: list[Report] = []
        beats: dict[int, int] = {}
        for rank, world_rank in enumerate(watch.members):
            if rank == self._rank:  # this rank's own state, live
                reports.append(Report(describe(watch.calls), [], True))
                continue
            status = json.loads(raw[world_rank]) if world_rank in raw else None
            beat = int(status["beat"]) if status is not None else -1
            beats[rank] = beat
            seen, moved = self._heard.get(rank, (beat, now))
            self._heard[rank] = (beat, now if beat != seen else moved)
            if now - self._heard[rank][1] > LOST_SECONDS:
                where = f" on {status['host']} (pid {status['pid']})" if status is not None else ""
                raise PeerLostError(
                    f"{self._what} on rank {self._rank}: rank {rank}{where} has not been heard from for "
                    f"{now - self._heard[rank][1]:.0f} s: its process was lost (killed, or its host unreachable)"
                )
            if status is None:
                reports.append(Report(None, [], False))
                continue
            comms = status["comms"]
            others = [e for name, e in comms.items() if name != watch.name and e["op"]]
            reports.append(Report(comms.get(watch.name), others, True))
        return reports, beats

    @staticmethod
    def _fresh(before: dict[int, int], now: dict[int, int]) -> bool:
        """Whether every member has written a new status since ``before``."""
        return all(now.get(rank, -1) > beat for rank, beat in before.items())

    def _log(self, verdict: Verdict, reports: Sequence[Report], now: float) -> None:
        """Warn once per state of the awaited ranks (their durations aside)."""
        states = [(r, {k: v for k, v in (reports[r].entry or {}).items() if k != "seconds"}) for r in verdict.awaited]
        key = json.dumps(states, sort_keys=True, default=str) if verdict.awaited else verdict.kind
        if key == self._logged:
            return
        self._logged = key
        mine = reports[self._rank].entry or {}
        call = f"{self._what} #{mine.get('seq')} at {mine.get('site', 'unknown')}"
        found = self.explain().removesuffix(_CAUSE)
        logger.warning(
            "communicator: rank %d has waited %.0f s in %s: %s; waiting on until the timeout",
            self._rank,
            now - self._started,
            call,
            found,
        )
