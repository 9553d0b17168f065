"""Why a wait takes long: every process says what its communicators are doing, and one waiting
rank per operation compares what the members say.

**Statuses.** Each process runs one watcher thread per world. Every :data:`BEAT_SECONDS` it
looks at what its communicators are doing (the number of collectives entered, the operation
running or the last one, the call site: what the guard keeps anyway, so a call costs nothing
more) and writes it to the store only when it has settled (unchanged for :func:`settle_seconds`)
and differs from what it wrote last, or when :func:`heartbeat_seconds` have passed: a process
that makes progress writes nothing, one that stopped somewhere writes once, and the job's
heartbeat traffic stays under :data:`HEARTBEATS_PER_SECOND` however many ranks it has. Where a
relay serves, the host writes one heartbeat for all its processes (see
:mod:`communicator.control.neighbours`).

**Diagnosis.** A rank whose wait in one operation has lasted :data:`JUDGE_AFTER_SECONDS` asks
to *judge* it; the first member to ask does (one request each; where a relay serves, only the
first waiting process of each host asks). A judge serves a term of :data:`JUDGE_TERM_SECONDS`;
the waiting members elect one again each term (the judge asks first, so it stays while it
waits), so that one that left or died is replaced. A point-to-point
operation has no number the group shares: each waiting rank judges its own, reading and probing
its peers only. Once per beat the judge checks that the members it waits on are alive (see
:mod:`communicator.control.liveness`), and after ``stall_seconds`` (or half the timeout, if
shorter) it also reads every member's status in one request, judges (:func:`judge`) and posts
its verdict for the other waiting members, who read it with the log they look at anyway:

- ranks in *different collectives at the same point* (the same number, different operations; or
  every rank inside a collective and not all in the same one), or in the same collective with
  dtypes (or, where they must agree, shapes) that differ: a mismatch, which can never finish.
  Every member raises :class:`~communicator.errors.CollectiveMismatchError` naming each rank's
  call: at once when ranks made different calls at one number, or the same call with different
  dtypes or shapes; once two looks a second apart agree when they wait at different numbers, or
  one is still in the argument check of a call another has passed (a status may be a beat old);
- a member whose process is gone: :class:`~communicator.errors.PeerLostError` on every member;
- otherwise some ranks are elsewhere (a long section of rank 0's, say, or a process that is
  stopped), or every rank is in the same collective and the transport has not finished it: one
  warning on the ``communicator`` logger names who is awaited and what it last did, and the wait
  goes on until the timeout.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from communicator.control.board import FailureBoard
from communicator.control.liveness import Hosts
from communicator.control.neighbours import KEEP_SECONDS, Neighbours
from communicator.control.ranks import Spans, spans_text
from communicator.control.records import parse_status
from communicator.crosscheck import CHECKING
from communicator.errors import CollectiveMismatchError
from communicator.guard import CallState

__all__ = [
    "BEAT_SECONDS",
    "HEARTBEATS_PER_SECOND",
    "JUDGE_AFTER_SECONDS",
    "JUDGE_TERM_SECONDS",
    "Report",
    "Stall",
    "Verdict",
    "Watch",
    "WATCH_SECONDS",
    "Watcher",
    "heartbeat_seconds",
    "judge",
    "judge_term",
    "settle_seconds",
]

#: How often a judge looks at the members' statuses.
BEAT_SECONDS = 1.0
#: How often a process looks at its own state (writing it only when needed, see above).
WATCH_SECONDS = 0.5
#: The job's status writes per second when nothing changes, whatever its size.
HEARTBEATS_PER_SECOND = 500.0
#: How long a wait lasts before a member judges it (checks liveness; diagnoses after ``stall_seconds``).
JUDGE_AFTER_SECONDS = 2.0
#: How long a judge serves before the waiting members elect one again (see :func:`judge_term`).
JUDGE_TERM_SECONDS = 5.0
#: How much later than the judge the other waiting members see a term begin.
TAKEOVER_SECONDS = 1.5
#: Remote members probed per beat by a judge (local ones are checked by process id, for free).
PROBES_PER_BEAT = 64
#: Ranks a message names one by one (the rest are counted).
NAMED = 16
#: Operations whose tensors must have the same shape on every rank.
EQUAL_SHAPES = frozenset({"all_reduce", "reduce", "broadcast"})

logger = logging.getLogger("communicator")
_GROWING = re.compile(r"\bfor (\d+) s\b")  # a duration a side names, which grows while nothing changes
_CAUSE = (
    "; likely causes: a long section on those ranks (raise the timeout), a collective that only some ranks"
    " call, or a hang in their code"
)


def judge_term(now: float, judging: bool) -> int:
    """The judge's term at wall time ``now``, as a rank sees it: the judge sees a term begin
    :data:`TAKEOVER_SECONDS` before the others do, so that it is elected again while it waits, and
    a judge that left or died is replaced within a term and that margin."""
    return int((now + (0.0 if judging else -TAKEOVER_SECONDS)) // JUDGE_TERM_SECONDS)


def heartbeat_seconds(world_size: int) -> float:
    """How often a process writes its status when nothing changed: every 5 s, less often past
    2,500 ranks, so that the job writes at most :data:`HEARTBEATS_PER_SECOND`."""
    return max(5.0, world_size / HEARTBEATS_PER_SECOND)


def settle_seconds(stall_seconds: float) -> float:
    """How long a state must last before a process writes it (a judge's beat less than half the
    stall threshold, at least one look of the process's own)."""
    return max(WATCH_SECONDS, min(3.0, stall_seconds / 2 - BEAT_SECONDS))


def status_of(calls: CallState) -> dict[str, Any]:
    """What one communicator is doing, as its status says it (read from another thread: one read
    of each field, so a change in between only makes the status a beat old)."""
    running, last = calls.event, calls.recorder.last()
    entry: dict[str, Any] = {"group": calls.group, "seq": calls.seq, "op": ""}
    if running is not None:  # its number and operation from one record: they always belong together
        entry.update(seq=running.seq, op=running.op, p2p=running.p2p, sizes=running.describe_sizes())
        entry.update(site=running.site)
        entry.update(dtypes=[str(d) for d in running.dtypes], seconds=running.since())
    elif last is not None:
        entry.update(last=f"{last.op} #{last.seq}", site=last.site, seconds=last.since())
    return entry


class Watcher:
    """The thread that publishes this process's status for one world, and the communicators it covers."""

    def __init__(
        self,
        board: FailureBoard,
        hosts: Hosts,
        world_rank: int,
        world_size: int,
        stall_seconds: float,
        thread: bool = True,
        clock: Callable[[], float] = time.time,
        neighbours: Neighbours | None = None,
        local_size: int = 1,
    ) -> None:
        self.board, self.hosts, self.world_rank = board, hosts, world_rank
        self.neighbours, self._local_size = neighbours, local_size
        self._kept = -KEEP_SECONDS  # when this process last kept its status for its host's heartbeat
        self._covered = False  # whether it could
        self.clock = clock  # wall time, which the judges compare a status's age against
        self.heartbeat, self._settle = heartbeat_seconds(world_size), settle_seconds(stall_seconds)
        self._comms: dict[str, CallState] = {}
        self._stopped = threading.Event()
        self._beat = 0
        self._state = ""  # the state seen at the last beat, and since when
        self._since = 0.0
        self._written = ("", 0.0)  # the state last written, and when
        self.board.publish(world_rank, json.dumps(self.status()))  # every member has a status to read
        self._thread: threading.Thread | None = None  # without one, the caller beats (virtual ranks)
        if thread:
            self._thread = threading.Thread(target=self._run, name="communicator-watcher", daemon=True)
            self._thread.start()

    def watch(self, name: str, calls: CallState) -> None:
        self._comms[name] = calls

    def forget(self, name: str) -> None:
        self._comms.pop(name, None)

    def stop(self) -> None:
        self._stopped.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=2 * BEAT_SECONDS)

    def status(self) -> dict[str, Any]:
        comms = {name: status_of(calls) for name, calls in list(self._comms.items())}
        at = self.clock()
        return {"host": socket.gethostname(), "pid": os.getpid(), "beat": self._beat, "at": at, "comms": comms}

    def beat(self, now: float) -> bool:
        """Look at this process's state; write it when it settled on something new, or when the
        heartbeat is due. Whether it wrote."""
        status = self.status()
        state = json.dumps({n: {k: v for k, v in e.items() if k != "seconds"} for n, e in status["comms"].items()})
        if state != self._state:
            self._state, self._since = state, now
        settled = now - self._since >= self._settle and state != self._written[0]
        covered = self.neighbours is not None and self._share(now, status, settled)
        if not (settled or (now - self._written[1] >= self.heartbeat and not covered)):
            return False
        self._beat += 1
        status["beat"] = self._beat
        self.board.publish(self.world_rank, json.dumps(status))
        self._written = (state, now)
        return True

    def _share(self, now: float, status: dict[str, Any], settled: bool) -> bool:
        """Keep this process's status for its host's heartbeat (a state about to be written: at
        once, so the host never writes an older one after it), and write the host's heartbeat
        when it is due and this process takes it; whether the host's heartbeat covers this
        process (else it writes its own: the host's files cannot be used)."""
        assert self.neighbours is not None
        if settled or now - self._kept >= KEEP_SECONDS:
            self._kept = now
            self._covered = self.neighbours.keep(self.world_rank, json.dumps(status))
        statuses = self.neighbours.beat(self.heartbeat, lambda: self.hosts.local(self._local_size, now))
        if statuses:
            self.board.publish_host(statuses)
        return self._covered and statuses is not None

    def _run(self) -> None:
        failures = 0
        self._written = (self._state, time.monotonic())
        while not self._stopped.wait(WATCH_SECONDS) and failures < 10:  # a store gone for good ends the thread
            self.hosts.drain()
            try:
                self.beat(time.monotonic())
                failures = 0
            except Exception:  # noqa: BLE001 - the waiting ranks report what they lack
                failures += 1


class Report(NamedTuple):
    """What one member said: its status for this communicator (``None``: it reported none), what
    it runs on other communicators, and whether it has reported at all."""

    entry: dict[str, Any] | None
    elsewhere: list[dict[str, Any]]
    heard: bool
    silent: float = 0.0  # seconds since it last wrote its status (-1: it never wrote one)

    @property
    def collective(self) -> tuple[int, str] | None:
        """(number, operation) of the collective it is in on this communicator."""
        entry = self.entry
        if entry is None or not entry["op"] or entry.get("p2p"):
            return None
        return int(entry["seq"]), str(entry["op"])

    def describe(self) -> str:
        if not self.heard and self.silent < 0:
            return "has published no status yet (it has not joined this communicator's control plane)"
        if not self.heard:
            return (
                f"has not been heard from for {self.silent:.0f} s (it may be stopped, or blocked outside Python;"
                " its process is alive)"
            )
        entry = self.entry
        if entry is None:
            return "has not shown this communicator in its status (it has not used it yet, or closed it)"
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
    sides: dict[int, str]  # rank -> what it is doing (as posted: only the ranks a message names)
    awaited: Sequence[int]  # the ranks that are not in this collective
    certain: bool = False  # a mismatch that no status a beat old can explain: one look is enough
    at: float = 0.0  # when it was judged (wall time): the durations it names are as of then

    def record(self) -> dict[str, Any]:
        """The verdict as a record: O(1) in the job's size, so every waiting rank can read it."""
        named = {str(r): self.sides[r] for r in self.awaited[:NAMED] if r in self.sides}
        awaited = spans_text(self.awaited)
        return {"kind": self.kind, "headline": self.headline, "sides": named, "awaited": awaited, "at": self.at}

    @classmethod
    def of_record(cls, found: dict[str, Any]) -> Verdict | None:
        """The verdict a record holds; ``None`` for one that is not a verdict."""
        try:
            sides = {int(r): str(side) for r, side in found["sides"].items()}
            at = float(found.get("at", 0.0))
            return cls(str(found["kind"]), str(found["headline"]), sides, Spans(str(found["awaited"])), False, at)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def sides_at(self, now: float) -> dict[int, str]:
        """The sides as of wall time ``now``: each duration they name grown by the verdict's age,
        so that every rank says the same of an awaited rank, whoever judged and when."""
        age = round(max(now - self.at, 0.0)) if self.at else 0
        if not age:
            return self.sides

        def grown(found: re.Match[str]) -> str:
            return f"for {int(found.group(1)) + age} s"

        return {rank: _GROWING.sub(grown, side) for rank, side in self.sides.items()}


def judge(me: int, reports: Sequence[Report]) -> Verdict:
    """The verdict on a wait of rank ``me``, from every member's report (see the module docstring)."""
    sides = {rank: report.describe().removeprefix("is ") for rank, report in enumerate(reports)}
    inside = {rank: c for rank, report in enumerate(reports) if (c := report.collective) is not None}
    awaited = [rank for rank in range(len(reports)) if rank not in inside]
    ops_at: dict[int, set[str]] = defaultdict(set)
    for seq, op in inside.values():
        ops_at[seq].add(op)
    if any(len(ops) > 1 for ops in ops_at.values()):
        # Different calls at one number cannot come from a status a beat old, unless one rank is
        # still in the argument check another has passed: then a second look must agree.
        certain = any(len({op.removesuffix(CHECKING) for op in ops}) > 1 for ops in ops_at.values())
        headline = "ranks are in different collectives at the same point (none can finish)"
        return Verdict("mismatch", headline, sides, awaited, certain)
    if awaited:
        return Verdict("waiting", "", sides, awaited)
    if len(set(inside.values())) > 1:
        return Verdict("mismatch", "every rank waits, each in a different collective", sides, awaited)
    entries = [report.entry for report in reports if report.entry is not None]
    if len({str(e.get("dtypes")) for e in entries}) > 1:
        return Verdict("mismatch", "ranks passed tensors of different dtypes to the same collective", sides, [], True)
    if inside[me][1] in EQUAL_SHAPES and len({e.get("sizes") for e in entries}) > 1:
        return Verdict("mismatch", "ranks passed tensors of different shapes to the same collective", sides, [], True)
    return Verdict("stuck", "every rank is in this collective, with the same arguments", sides, [])


class Watch:
    """One communicator's side of the diagnosis: its board, its members' world ranks, and the threshold."""

    def __init__(
        self,
        watcher: Watcher,
        board: FailureBoard,
        calls: CallState,
        threshold: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.watcher, self.board, self.calls, self.threshold = watcher, board, calls, threshold
        self.clock = clock  # wall time: the judges' terms follow it on every rank
        watcher.watch(board.name, calls)

    def begin(self, rank: int, what: str, started: float, limit: float, peers: Sequence[int] = ()) -> Stall:
        """A wait of ``what`` on ``rank`` that began at ``started`` (``time.monotonic``), allowed
        ``limit`` seconds; ``peers``: the ranks a point-to-point wait waits on (only they are judged)."""
        return Stall(self, rank, what, started, min(self.threshold, limit / 2), peers)


class Stall:
    """One long wait: judged by one member (see the module docstring), followed by the others."""

    def __init__(
        self, watch: Watch, rank: int, what: str, started: float, threshold: float, peers: Sequence[int] = ()
    ) -> None:
        self._watch, self._rank, self._what = watch, rank, what
        # who is judged: every member, or for a point-to-point operation this rank and its peers (O(1) a beat)
        event = watch.calls.event
        self._peers = sorted(set(peers) - {rank}) if peers and event is not None and event.p2p else []
        self._judged: Sequence[int] = sorted({rank, *self._peers}) if self._peers else range(len(watch.board.members))
        self._started, self._diagnose_at = started, started + threshold
        self._next = started + min(JUDGE_AFTER_SECONDS, threshold)
        self._judging = False
        self._term = -1  # the judge's term this rank last took part in electing
        self._probed = 0  # where the next round of liveness probes starts
        self._suspect: tuple[Any, ...] | None = None  # a mismatch seen once
        self._logged = ""
        self.verdict: Verdict | None = None

    @property
    def judging(self) -> bool:
        """Whether this rank judges the wait in the current term."""
        return self._judging

    def tick(self, now: float) -> None:
        """Called while waiting; acts once per beat past the judging threshold."""
        if now < self._next:
            return
        self._next = now + BEAT_SECONDS
        calls, board = self._watch.calls, self._watch.board
        p2p = calls.event is not None and calls.event.p2p  # numbered with no one: each waiter judges its own
        term = judge_term(self._watch.clock(), self._judging)
        if term != self._term:
            self._term = term
            neighbours = self._watch.watcher.neighbours
            stands = neighbours is None or neighbours.stand(f"{board.name}#{calls.seq}", term)
            self._judging = p2p or (stands and board.elect(calls.seq, term))
        if self._judging:
            self._judge(now, calls.seq, publish=not p2p)
            return
        found = board.verdicts.get(calls.seq)
        verdict = Verdict.of_record(found) if found is not None and now >= self._diagnose_at else None
        if verdict is not None:
            self.verdict = verdict  # a verdict is posted when it says something new,
            self._log(verdict, now)  # and again by a new judge: warned of once

    def _judge(self, now: float, seq: int, publish: bool) -> None:
        self._check_alive()
        if now < self._diagnose_at:  # the statuses are read only once they are judged
            return
        reports = self._gather(now)
        if self._peers:  # a transfer: what its peers are doing, whatever it is
            sides = {r: report.describe().removeprefix("is ") for r, report in zip(self._judged, reports, strict=True)}
            verdict = Verdict("waiting", "", sides, self._peers)
        else:
            verdict = judge(self._rank, reports)
        verdict = self.verdict = verdict._replace(at=self._watch.clock())
        if verdict.kind == "mismatch":
            key = tuple(r.collective for r in reports)
            if self._suspect == key or verdict.certain:  # otherwise a second look must agree
                error = CollectiveMismatchError(verdict.sides, verdict.headline)
                self._watch.board.post_mismatch(self._rank, error)
                raise error
            self._suspect = key
            return
        self._suspect = None
        if self._log(verdict, now) and publish:
            self._watch.board.post_verdict(self._rank, seq, verdict.record())

    def explain(self) -> str:
        """What the last look found, for an error message ("" before any look)."""
        verdict = self.verdict
        if verdict is None:
            return ""
        if verdict.awaited:
            return f"ranks {_few(verdict.awaited)} did not arrive: {self.who(verdict.awaited)}{_CAUSE}"
        return f"{verdict.headline}, and the backend has not completed it"

    def who(self, ranks: Sequence[int]) -> str:
        """What the last look found ``ranks`` doing ("" before any look)."""
        if self.verdict is None:
            return ""
        sides = self.verdict.sides_at(self._watch.clock())
        named = [f"rank {r} {_as_said(sides[r])}" for r in ranks[:NAMED] if r in sides]
        return "; ".join(named + ([f"and {len(ranks) - NAMED} more"] if len(ranks) > NAMED else []))

    def _gather(self, now: float) -> list[Report]:
        """The judged ranks' reports, in the order of :attr:`_judged`."""
        watch = self._watch
        members = watch.board.members
        others = [members[r] for r in self._judged if r != self._rank]
        raw = iter(watch.board.statuses(others))
        silent_after = 3 * watch.watcher.heartbeat
        reports: list[Report] = []
        for rank in self._judged:
            if rank == self._rank:  # this rank's own state, live
                reports.append(Report(status_of(watch.calls), [], True))
                continue
            text = next(raw)
            if text is None:
                reports.append(Report(None, [], False, -1.0))
                continue
            status = parse_status(text)
            if status is None:
                watch.board.log.seal.tally.note("statuses that are not one")
                reports.append(Report(None, [], False, -1.0))
                continue
            age = max(watch.clock() - float(status["at"]), 0.0)
            comms = status["comms"]
            entry = comms.get(watch.board.name)
            if entry is not None and "seconds" in entry:
                entry["seconds"] = float(entry["seconds"]) + age
            others_busy = [e for name, e in comms.items() if name != watch.board.name and e["op"]]
            reports.append(Report(entry, others_busy, age <= silent_after, age))
        return reports

    def _check_alive(self) -> None:
        """Raise (and tell the others) when a member's process is gone (by process id on this host,
        by its probe socket on another), :data:`PROBES_PER_BEAT` members a beat."""
        board = self._watch.board
        members = board.members
        closed = board.closed()
        peers = [r for r in self._judged if r != self._rank and r not in closed]
        if not peers:
            return
        start = self._probed % len(peers)
        chosen = (peers[start:] + peers[:start])[:PROBES_PER_BEAT]
        self._probed = start + len(chosen)
        board.hosts.where([members[rank] for rank in chosen])  # where they run: one request for all
        for rank in chosen:
            why = board.hosts.gone(members[rank])
            if why:
                board.lose(self._rank, rank, why, self._watch.calls.seq, self._what)

    def _log(self, verdict: Verdict, now: float) -> bool:
        """Warn once per state of the awaited ranks (their durations aside); whether it warned."""
        states = [(r, _without_durations(verdict.sides.get(r, ""))) for r in verdict.awaited]
        key = json.dumps(states) if verdict.awaited else verdict.kind
        if key == self._logged:
            return False
        self._logged = key
        self._warn(verdict, now)
        return True

    def _warn(self, verdict: Verdict, now: float) -> None:
        mine = status_of(self._watch.calls)
        call = f"{self._what} #{mine.get('seq')} at {mine.get('site', 'unknown')}"
        found = self.explain().removesuffix(_CAUSE)
        logger.warning(
            "communicator: rank %d has waited %.0f s in %s: %s; waiting on until the timeout",
            self._rank,
            now - self._started,
            call,
            found,
        )


def _few(ranks: Sequence[int]) -> str:
    """A list of ranks as a message shows it: the first :data:`NAMED`, then how many in all."""
    if len(ranks) <= NAMED:
        return str(list(ranks))
    return f"{str(ranks[:NAMED])[:-1]}, ...] ({len(ranks)} ranks)"


def _as_said(side: str) -> str:
    """A side as a sentence about its rank (sides drop the leading "is")."""
    return side if side.startswith("has ") else f"is {side}"


def _without_durations(side: str) -> str:
    """A side as it stays while nothing changes (the seconds it mentions grow)."""
    return " ".join(word for word in side.split() if not word.replace(".", "").isdigit())
