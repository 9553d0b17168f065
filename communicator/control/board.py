"""One communicator's namespace in the control plane: what it posts, what its waiters look for.

Every communicator of a world (the world's and each subgroup's) has a *board*, named by its
path in the store (``board3/``, ``board3/sub1.0/``). Its records go to the world's
:class:`~communicator.control.log.EventLog`; a board heeds the records of its own namespace,
and failures for good posted on the boards above it (a subgroup's waiters are released when a
rank of the world fails). Counters that only its members touch (barrier arrivals, closings, the
stall judge's election) are keys under its name.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import time
from collections.abc import Sequence
from typing import Any

from communicator.control.liveness import Hosts
from communicator.control.log import EventLog, Record, StoreHandle, guarded_store
from communicator.control.polls import DIRECT_SECONDS, PACE_BURST, Pacer, Poll, backoff, drive
from communicator.control.processes import alive
from communicator.control.ranks import Spans, listed, spans_text
from communicator.errors import (
    CollectiveMismatchError,
    CommError,
    PeerClosedError,
    PeerLostError,
    RemoteError,
    RemoteFailure,
    RevokedError,
)

__all__ = ["ECHOES", "NAMED_RECORDS", "PACE_BURST", "FailureBoard", "Pacer", "backoff"]

#: Failures that only report another rank's (a rank released by a peer's failure): not posted
#: again, since every waiter of the board reads the original.
ECHOES = ("RemoteError", "PeerClosedError")
#: Records of one kind that a board's log carries for one event every member may post (failures,
#: refusals of one operation, closings): the rest are counted, and their details kept in keys of
#: their own, so that each reader reads O(1) records however many ranks post.
NAMED_RECORDS = 16
#: How long a rank lingering on closing reads the closings' count itself (its first three looks,
#: for members that close together) before its host's relay serves it: every rank of a job may
#: linger, and the relay's news is a second late at most, on a wait of a few seconds.
LINGER_DIRECT_SECONDS = 0.1


class FailureBoard:
    """See the module docstring. ``members`` are the world ranks of the communicator, in its order."""

    def __init__(
        self,
        log: EventLog,
        hosts: Hosts,
        store: StoreHandle,
        name: str,
        members: Sequence[int],
        local_size: int,
        parent: FailureBoard | None = None,
    ) -> None:
        # A range stays one (the world's board, of every virtual rank of the simulation: O(1) each)
        self.members: Sequence[int] = members if isinstance(members, range) else tuple(members)
        self.log, self.hosts, self.name = log, hosts, name
        self._index: dict[int, int] | None = None  # world rank -> rank here, made when first asked
        self._store, self._local_size, self._parent = store, local_size, parent
        self._names = self._lineage()
        self._taken = dict.fromkeys(self._names, 0)  # records of each heeded board already taken
        self._failures: dict[int, RemoteFailure] = {}  # local rank -> its first failure for good
        self._done_first: dict[int, int] = {}  # local rank -> collectives it completed before that failure
        self._above: list[RemoteFailure] = []  # failures for good posted on the boards above
        self._inputs: dict[int, dict[int, RemoteFailure]] = {}  # seq -> local rank -> refusal
        self._refusals: dict[int, set[int]] = {}  # seq -> local ranks that refused that collective
        self._counted: set[int] = set()  # refused collectives whose counters this rank made
        self._left = False  # whether this rank left an operation because of a refusal
        self._closed: dict[int, tuple[int, str]] = {}  # local rank -> (collectives completed, last)
        self._refused_then_closed: dict[int, int] = {}  # local rank -> the collective it refused before closing
        self._lost: dict[int, str] = {}  # local rank -> why its process is gone
        self._mismatch: CollectiveMismatchError | None = None
        self.verdicts: dict[int, Record] = {}  # seq -> the stall judge's latest verdict
        self.barriers = 0  # barriers through the store so far (see :mod:`communicator.control.barrier`)
        self.arrived = 0  # the last of them that every member reached, as the log said
        self._refused_by_all: set[int] = set()  # collectives every member refused, as the log said
        self._someone_left = False  # whether the log said a rank left an operation after a refusal
        self._everyone_closed = False  # whether the log said the last member closed
        self._statuses_complete = False  # whether every member has published a status
        self._children = 0
        self._released = False
        self._mismatch_raised = False
        self._revoked_by: int | None = None

    def _lineage(self) -> dict[str, bool]:
        """The names this board heeds: its own (every record) and its ancestors' (failures only)."""
        names, board = {self.name: True}, self._parent
        while board is not None:
            names[board.name] = False
            board = board._parent
        return names

    def next_child(self) -> int:
        """A number for the next batch of subgroups; every member asks in the same order, so numbers agree."""
        self._children += 1
        return self._children

    def not_a_member(self, name: str) -> None:
        """A subgroup ``name`` of this board that this rank is not in: its records are dropped."""
        self.log.forget(self.name + name)

    def child(self, members: Sequence[int], name: str) -> FailureBoard:
        """The board of a subgroup over world ranks ``members``, inside this one."""
        if self._released:
            raise CommError("the communicator is closed: no new subgroups")
        return FailureBoard(self.log, self.hosts, self._store, self.name + name, members, self._local_size, self)

    def release(self) -> None:
        """Nothing is posted or read after this (the communicator closed)."""
        self._released = True
        if self._parent is not None:  # the world's board lives as long as the log
            self.log.forget(self.name)

    # -- posting ---------------------------------------------------------------------------

    def _post(self, kind: str, rank: int, **fields: Any) -> None:
        if not self._released:
            self.log.post({"kind": kind, "board": self.name, "rank": rank, **fields})

    def _count(self, counter: str) -> int:
        """Count one more post of a kind under ``counter``: how many there are now (recorded in
        the log too while there are at most :data:`NAMED_RECORDS`); 0 when the store is gone."""
        try:
            return self._store.add(f"{self.name}{counter}", 1)
        except Exception:  # noqa: BLE001 - the store may be gone: the post says what it can
            return 0

    def _named(self, counter: str) -> bool:
        return self._count(counter) <= NAMED_RECORDS

    def post(self, failure: RemoteFailure, done: int = -1) -> None:
        """Announce that local rank ``failure.rank`` failed for good after completing ``done``
        collectives (-1: not known; echoes are not posted again); the first failures are enough
        for every reader: past :data:`NAMED_RECORDS` a failure is counted and kept under a key of
        its own, not recorded."""
        if failure.error_type in ECHOES or self._released:
            return
        text = failure.to_json().decode()
        if self._named("failures"):
            self._post("fail", failure.rank, failure=text, done=done)
        else:
            with contextlib.suppress(Exception):
                self._store.set(f"{self.name}failure/{failure.rank}", text)

    def post_input(self, seq: int, failure: RemoteFailure, collective: bool) -> None:
        """Announce that ``failure.rank`` refused its arguments to operation number ``seq`` (the
        collective of that number, or a point-to-point operation after it)."""
        if collective:  # known here at once: the log may show the others' before this rank's own
            self._refusals.setdefault(seq, set()).add(failure.rank)
        # the refusals of a collective are counted (settling ranks read the count); the first are recorded
        count = self._count(f"refused{seq}" if collective else f"inputs{seq}")
        if count <= NAMED_RECORDS:
            self._post("input", failure.rank, seq=seq, collective=collective, failure=failure.to_json().decode())
        if collective and count >= len(self.members):  # refused again at the same number: still every member's
            self._refused_by_all.add(seq)
            if count == len(self.members):  # the last: settling ranks that read a relay learn it so
                self._post("refused", failure.rank, seq=seq)

    def _leave(self, rank: int) -> None:
        """Count (once) that ``rank`` left an operation unfinished because of a refusal: the ranks
        that refused one wait to see whether any did before they communicate again."""
        if not self._left:
            self._left = True
            with contextlib.suppress(Exception):
                self._store.append(f"{self.name}left/who", f"{rank},")
                if self._store.add(f"{self.name}left", 1) == 1:  # the first: as the count, for a relay's readers
                    self._post("left", rank)

    def post_mismatch(self, rank: int, error: CollectiveMismatchError) -> None:
        """Announce a mismatch, so that every member raises the same error."""
        self._mismatch = self._mismatch or error  # known here: not posted again, nor counted as read
        self._mismatch_raised = True
        alike: dict[str, list[int]] = {}  # ranks that say the same, durations aside: a record of O(sides)
        for r, side in sorted(error.sides.items()):
            alike.setdefault(_without_seconds(side), []).append(r)
        self._post("mismatch", rank, what=error.what, sides={side: spans_text(r) for side, r in alike.items()})

    def knows_mismatch(self) -> bool:
        """Whether a mismatch was read from the board (then it is not posted again)."""
        return self._mismatch is not None

    def linger(self, limit: float = 3.0) -> None:
        """On closing after a mismatch was raised here: wait (at most ``limit`` seconds) until the
        other members closed too (having raised it, as a rule), since a launcher that stops the
        job when this rank exits (torchrun) must not stop them before they report it. Called once
        this rank's own closing is posted; never raises (see :meth:`lingering`)."""
        drive(self.lingering(time.monotonic(), limit))

    def lingering(self, now: float, limit: float = 3.0) -> Poll[None]:
        """:meth:`linger` as a poll from ``now`` (see :mod:`communicator.control.polls`): one
        request a poll (the closings' count) for its first looks (:data:`LINGER_DIRECT_SECONDS`), then,
        where a host's relay serves, the log alone through it (the last member to close says so
        there): the host's reads, about one a second for all its lingering ranks."""
        if not self._mismatch_raised:
            return
        started, pause = now, Pacer(self._store, now=now)
        relayed_from = now + LINGER_DIRECT_SECONDS if self.log.relay is not None else math.inf
        with contextlib.suppress(Exception):
            while True:
                if now >= relayed_from:
                    self.refresh()
                    if self._everyone_closed:
                        return
                    step = self.log.look_seconds
                else:
                    if self._store.add(f"{self.name}closing", 0) >= len(self.members):
                        return
                    step = min(pause(now), relayed_from - now)
                if now - started > limit:
                    return
                now = yield min(step, max(limit - (now - started), 0.001))

    def post_revoke(self, rank: int) -> None:
        """Announce that ``rank`` revoked the communicator: every member's operations raise."""
        self._revoked_by = rank if self._revoked_by is None else self._revoked_by
        self._post("revoke", rank)

    def post_lost(self, rank: int, peer: int, why: str) -> None:
        """Announce that local rank ``peer``'s process is gone (found by ``rank``): once, by the
        first rank to find it (each rank of its host may)."""
        with contextlib.suppress(Exception):
            if self._store.add(f"{self.name}lost/{peer}", 1) > 1:
                return
        self._post("lost", rank, peer=peer, why=why)

    def post_arrived(self, rank: int, barrier: int) -> None:
        """Announce that every member reached barrier number ``barrier`` (``rank`` came last)."""
        self.arrived = max(self.arrived, barrier)
        self._post("arrived", rank, barrier=barrier)

    def post_verdict(self, rank: int, seq: int, verdict: dict[str, Any]) -> None:
        """The stall judge's verdict on operation ``seq``, for the other waiting members."""
        self._post("verdict", rank, seq=seq, verdict=verdict)

    def post_closed(self, rank: int, seq: int, last: str, refused: int = -1) -> None:
        """Announce that ``rank`` closed its communicator after ``seq`` collectives, the last
        ``last`` (``refused``: the collective it refused before, if any). Every closing is counted
        and kept under a key of its own; the first :data:`NAMED_RECORDS` are recorded, which is
        what a waiting member needs: in a program whose members make the same collectives, a
        later closer has completed no fewer than the first ones."""
        if self._released:
            return
        with contextlib.suppress(Exception):  # leaving must never fail
            self._store.set(f"{self.name}closed/{rank}", f"{seq} {refused} {last}")
        count = self._count("closing")
        if count <= NAMED_RECORDS:
            self._post("closed", rank, seq=seq, last=last, refused=refused)
        if count == len(self.members):  # the last: lingering ranks that read a relay learn it so
            self._post("everyone closed", rank)

    # -- looking ---------------------------------------------------------------------------

    def refresh(self, direct: bool = False, look: bool = True) -> None:
        """Read the log (one request when nothing happened; ``direct``: from the store, not the
        host's relay; not ``look``: take only what it read already) and take in this board's new
        records; nothing but a ``CommError`` leaves it."""
        try:
            if look:
                self.log.look(direct)
        except CommError:
            raise
        except Exception as error:
            raise CommError(f"the control plane could not read its records: {type(error).__name__}: {error}") from error
        for name, start in self._taken.items():
            records = self.log.of_board(name, start)
            self._taken[name] = start + len(records)
            for record in records:
                self._take(record)

    def _take(self, record: Record) -> None:
        """Take in one record; one whose fields do not fit its kind is skipped (and counted)."""
        try:
            self._take_fields(record)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            self.log.seal.tally.note("records whose fields do not fit their kind")

    def _take_fields(self, record: Record) -> None:
        own = self._names.get(str(record.get("board", "")))
        if own is None or (not own and record["kind"] != "fail"):
            return
        kind, rank = record["kind"], int(record.get("rank", -1))
        if kind == "fail":
            failure = _failure(record["failure"])
            if own:
                self._failures.setdefault(rank, failure)
                self._done_first.setdefault(rank, int(record.get("done", -1)))
            else:
                self._above.append(failure)
        elif kind == "input":
            self._inputs.setdefault(int(record["seq"]), {}).setdefault(rank, _failure(record["failure"]))
            if record.get("collective"):
                self._refusals.setdefault(int(record["seq"]), set()).add(rank)
        elif kind == "mismatch" and self._mismatch is None:
            named = [(Spans(str(ranks)), str(side)) for side, ranks in record["sides"].items()]
            if any(s[-1] >= len(self.members) or s[0] < 0 for s, _ in named if s):
                raise ValueError("ranks out of range")
            sides = {r: side for ranks, side in named for r in ranks}
            self._mismatch = CollectiveMismatchError(dict(sorted(sides.items())), str(record["what"]))
        elif kind == "revoke" and self._revoked_by is None:
            self._revoked_by = rank
        elif kind == "lost":
            self._lost.setdefault(int(record["peer"]), str(record["why"]))
        elif kind == "closed":
            self._closed[rank] = (int(record["seq"]), str(record["last"]))
            self._refused_then_closed[rank] = int(record.get("refused", -1))
        elif kind == "verdict" and isinstance(record["verdict"], dict):
            self.verdicts[int(record["seq"])] = record["verdict"]
        elif kind == "refused":
            self._refused_by_all.add(int(record["seq"]))
        elif kind == "left":
            self._someone_left = True
        elif kind == "everyone closed":
            self._everyone_closed = True
        elif kind == "arrived":
            self.arrived = max(self.arrived, int(record["barrier"]))

    def check(
        self, rank: int, seq: int, what: str, look: bool = True, *, direct: bool = False, completing: bool = False
    ) -> None:
        """Raise when a peer failed, refused its part of operation ``seq``, was lost, or closed
        before reaching it; ``what`` names what this rank waits in (``look``, ``direct``: see
        :meth:`refresh`; ``completing``: see :meth:`raise_known`)."""
        self.refresh(direct, look)
        self.raise_known(rank, seq, what, completing)
        for peer, pid in self._dead_here(rank).items():
            self.lose(rank, peer, f"its process (pid {pid}) has exited", seq, what)

    def lose(self, rank: int, peer: int, why: str, seq: int, what: str) -> None:
        """Raise, and tell the others, that ``peer``'s process is gone, unless what it posted
        before it went explains it (read from the store itself: the host's relay may lag)."""
        self.refresh(direct=True)
        self.raise_known(rank, seq, what)
        if peer not in self._closed and self._closed_past_named(peer):
            self.raise_known(rank, seq, what)
        if peer not in self._closed:
            self.post_lost(rank, peer, why)
            raise PeerLostError(f"{what} on rank {rank}: rank {peer}: {why}; a peer was lost")

    def _closed_past_named(self, peer: int) -> bool:
        """Whether ``peer`` closed (its key, for a closing past the recorded ones); one request."""
        found = guarded_store(lambda: self._store.peek(f"{self.name}closed/{peer}"))
        done, refused, last = [*found.decode(errors="replace").split(" ", 2), "", ""][:3] if found else ("", "", "")
        if not done.isdigit() or not refused.lstrip("-").isdigit():
            return False
        self._closed[peer], self._refused_then_closed[peer] = (int(done), last), int(refused)
        return True

    def local_rank(self, world: int) -> int | None:
        """The rank here of world rank ``world`` (``None``: not a member); O(1) for a range."""
        members = self.members
        if isinstance(members, range):
            return members.index(world) if world in members else None
        if self._index is None:
            self._index = {w: rank for rank, w in enumerate(members)}
        return self._index.get(world)

    def raise_known(self, rank: int, seq: int, what: str, completing: bool = False) -> None:
        """Raise what the records read so far say (no request, but the two that count this rank
        out of an operation after a refusal). ``completing``: this rank waits for collective
        ``seq`` to finish, and a failure posted by a rank that had completed it does not end the
        wait (every rank reached it: it may finish still; the next collective raises)."""
        if self._revoked_by is not None:
            raise RevokedError(f"{what} on rank {rank}: rank {self._revoked_by} revoked the communicator")
        if self._mismatch is not None:
            self._mismatch_raised = True  # closing lingers until the others read it
            raise self._mismatch
        if self._above:  # a failure for good above explains anything seen here (a peer closing)
            context = f"{what} on rank {rank} abandoned (ranks of the communicator it was split from)"
            raise RemoteError(_first_causes(self._above), context=context)
        failures = [
            f
            for r, f in self._failures.items()
            if r != rank and not (completing and self._done_first.get(r, -1) >= seq)
        ]
        seen = {f.rank for f in failures}
        refusals = [f for r, f in self._inputs.get(seq, {}).items() if r != rank and f.rank not in seen]
        # A collective this rank went through although a peer refused its arguments to it (its part
        # did not need the peer's): the peer's later data would meet this rank's later operations.
        # (A rank released by a refusal has said so already.)
        skipped = [s for s, ranks in self._refusals.items() if not self._left and s < seq and rank not in ranks]
        refusals += [f for s in skipped for r, f in self._inputs.get(s, {}).items() if r != rank and r not in seen]
        if refusals:
            self._leave(rank)
        if failures or refusals:
            context = f"{what} on rank {rank} abandoned"
            if skipped:
                context += f" (operation #{min(skipped)} ran on this rank without the ranks that refused it)"
            raise RemoteError(_first_causes(failures + refusals), context=context)
        for peer, why in self._lost.items():
            if peer != rank and peer not in self._closed:
                raise PeerLostError(f"{what} on rank {rank}: rank {peer}: {why}; a peer was lost")
        for peer, (done, last) in self._closed.items():
            if peer != rank and done < seq:
                raise PeerClosedError(peer, done, last, f"{what} on rank {rank}")

    def _dead_here(self, rank: int) -> dict[int, int]:
        """Members on this host whose process is gone and that did not close first: ``rank -> pid``
        (no request once every rank of this host has announced itself; the host's ranks only)."""
        dead = {}
        for world, pid in self.hosts.local(self._local_size, self.log.now()).items():
            peer = self.local_rank(world)
            if peer is not None and peer != rank and peer not in self._closed and not alive(pid):
                dead[peer] = pid
        return dead

    def refused_by_all(self, rank: int, refused: int, what: str, look: bool, relayed: bool = False) -> bool:
        """Whether every member refused its arguments to collective ``refused``, as this rank did
        (the group is intact); raise when a member left an operation because of a refusal (it had
        started one without the refusing ranks), or (``look``: read the log too) failed, closed or
        is gone: the group can no longer be trusted. Two requests the first time (counters, whatever
        the size), then one (the two and the log's count: this rank's refusal was posted), and the
        log's read only when its count moved. ``relayed``: the log alone, through the host's relay
        (the last rank to refuse and the first to leave say so there)."""
        names, events = [f"{self.name}refused{refused}", f"{self.name}left"], None
        if relayed:
            self.refresh()
            count, left = len(self.members) if refused in self._refused_by_all else 0, int(self._someone_left)
        elif refused in self._counted:
            count, left, events = self._store.counters([*names, "events"])
        else:  # made by the first read
            count, left = (self._store.add(name, 0) for name in names)
            self._counted.add(refused)
        if count >= len(self.members):
            return True
        if left:
            who = guarded_store(lambda: self._store.get(f"{self.name}left/who")).decode(errors="replace")
            started = spans_text(sorted(listed(who, len(self.members))))
            raise CommError(
                f"{what} on rank {rank}: ranks {started} started operation #{refused} (or a later one) without "
                "the ranks that refused their arguments to it, and left it: its data would meet later "
                "operations, so the communicator is unusable"
            )
        if look:
            self.refresh(look=self.log.behind(events) and not relayed)
            self.raise_known(rank, 0, what)  # revoked, a mismatch, failures for good, lost ranks
            refusers = self._refusals.get(refused, set())
            closed = sorted(
                r
                for r in self._closed
                if r not in refusers and self._refused_then_closed.get(r) != refused and r != rank
            )
            if closed:
                raise PeerClosedError(closed[0], *self._closed[closed[0]], f"{what} on rank {rank}")
        for peer, pid in self._dead_here(rank).items():
            self.lose(rank, peer, f"its process (pid {pid}) has exited", 0, what)
        return False

    @property
    def keys(self) -> StoreHandle:
        """The store this board's keys live in (each under :attr:`name`)."""
        return self._store

    def lost(self) -> dict[int, str]:
        """Peers reported lost, as read so far: ``rank -> why``."""
        return dict(self._lost)

    def closed(self) -> dict[int, tuple[int, str]]:
        """Peers that closed, as read so far: ``rank -> (collectives completed, the last one)``."""
        return dict(self._closed)

    # -- coordination through the store -------------------------------------------------------

    def depart(self, rank: int, hosts_store: bool, linger: float) -> None:
        """Leave: a rank that hosts the store waits (at most ``linger`` seconds) until every other
        rank has closed or is gone, since they may still read the board. Never raises (see
        :meth:`departing`)."""
        if hosts_store:
            drive(self.departing(rank, linger, time.monotonic()))

    def departing(self, rank: int, linger: float, now: float) -> Poll[None]:
        """:meth:`depart` of the rank that hosts the store, as a poll from ``now`` (see
        :mod:`communicator.control.polls`): one request a poll (the closings and the log's count,
        the log read when its count moved) for its first looks (:data:`DIRECT_SECONDS`), then,
        where a host's relay serves, the log alone through it (the last member to close says so
        there, and the lost ones are posted): the host's reads, about one a second. Its world
        stopped already, which removed the relay: a look that made it again removes it at the end."""
        relay = self.log.relay
        try:
            deadline = now + linger
            pause = Pacer(self._store, now=now)
            relayed_from = now + DIRECT_SECONDS if relay is not None else math.inf
            everyone = len(self.members)  # this rank posted its closing already
            keys = [f"{self.name}closing", "events"]
            closing, events = (self._store.add(key, 0) for key in keys)  # made: then one request reads both
            while closing < everyone and now < deadline:
                relayed = now >= relayed_from
                self.refresh(look=relayed or self.log.behind(events))
                gone = {r for r in self._lost if r not in self._closed} | set(self._dead_here(rank))
                if self._everyone_closed or len(self._closed) + len(gone) >= everyone:
                    return
                if relayed:
                    now = yield self.log.look_seconds
                else:
                    now = yield min(pause(now), relayed_from - now)
                    closing, events = self._store.counters(keys)
        except Exception:  # noqa: BLE001 - leaving must never fail
            pass
        finally:
            if relay is not None:
                relay.close()

    def elect(self, seq: int, term: int) -> bool:
        """Whether this rank judges the stall of operation ``seq`` for ``term`` (the first to ask does)."""
        return bool(guarded_store(lambda: self._store.add(f"{self.name}judge/{seq}/{term}", 1)) == 1)

    def statuses(self, ranks: Sequence[int]) -> list[str | None]:
        """The statuses that world ranks ``ranks`` published, in order (``None``: none yet): one
        request once every rank has published one (a rank's first is written when it joins)."""
        keys = [f"status/{r}" for r in ranks]
        if not self._statuses_complete:
            self._statuses_complete = guarded_store(lambda: self._store.check(keys))
        seal = self.log.seal
        if self._statuses_complete:
            values = guarded_store(lambda: self._store.multi_get(keys))
            return [seal.open(key, value) for key, value in zip(keys, values, strict=True)]
        found: list[str | None] = []
        for key in keys:  # a rank that has not joined yet: read key by key, without blocking
            there = guarded_store(functools.partial(self._store.check, [key]))
            found.append(seal.open(key, guarded_store(functools.partial(self._store.get, key))) if there else None)
        return found

    def publish(self, world_rank: int, status: str) -> None:
        """Write a process's status (see :mod:`communicator.control.stalls`), signed."""
        key = f"status/{world_rank}"
        guarded_store(lambda: self._store.set(key, self.log.seal.seal(key, status)))

    def publish_host(self, statuses: dict[int, str]) -> None:
        """Write the statuses of a host's processes (world rank -> status), signed: one request."""
        keys = [f"status/{rank}" for rank in statuses]
        values = [self.log.seal.seal(key, status) for key, status in zip(keys, statuses.values(), strict=True)]
        guarded_store(lambda: self._store.multi_set(keys, values))


def _failure(text: object) -> RemoteFailure:
    """A failure as a record carries it (``ValueError`` and the like when it is not one)."""
    if not isinstance(text, str):
        raise TypeError("a failure is JSON text")
    failure = RemoteFailure.from_json(text)
    if not all(isinstance(v, str) for v in (failure.error_type, failure.message, failure.traceback, failure.where)):
        raise TypeError("a failure's fields are text")
    return failure


def _without_seconds(side: str) -> str:
    """A rank's side without how long it has been there (each rank's differs)."""
    return re.sub(r" for \d+ s\b", "", side)


def _first_causes(failures: list[RemoteFailure]) -> list[RemoteFailure]:
    """The failures that are not echoes of another rank's (all of them, if every one is)."""
    causes = [f for f in failures if f.error_type not in ECHOES]
    return causes or failures
