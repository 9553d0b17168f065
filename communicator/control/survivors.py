"""What the live members of a communicator settle through the store after a loss: the answer of
an agreement, and who forms the shrunk communicator.

Both follow one pattern. Each caller adds its entry to one key with ``append`` (one request),
then reads that key until every member has an entry or is gone (its process exited, or it was
reported lost), or the timeout passed. The first caller to get there proposes the outcome with
``compare_set`` on the outcome key, which keeps the first proposal: every caller returns that one,
so all survivors get the same answer even when a member dies during the call (its entry counts
if the proposal saw it). A member that is alive but never calls is left out once the timeout
passes; one that calls after the outcome was fixed reads it. Each look is one request (the
outcome, a count of the entries and the log's count; the log is read when its count moved), at
the pace of :class:`~communicator.control.polls.Pacer`: about one store request a second once a
wait lasts. The entries themselves are read only when at most :data:`PROBED` members can still be
missing without having been reported lost, and only those are looked for (their process ids, or
probes): a look costs the same bytes and requests at any number of members.

A shrink has a second step: before the new group forms, every chosen member says it is ready.
A chosen member that dies before that, or is not ready by the shrink's timeout (given at least
:data:`READY_SECONDS` after the choice), moves every caller to the next *round*, which chooses
again among the members chosen before, without the dead or late ones (the first caller to see
them late names them for all); forming a group with a dead or stalled member would wait out the
group's timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

from communicator.control.board import FailureBoard, Pacer
from communicator.control.log import StoreHandle, guarded_store
from communicator.control.polls import Poll, drive
from communicator.control.ranks import Spans, listed, spans_text, spans_within
from communicator.errors import CommError, ExcludedError

__all__ = ["READY_SECONDS", "Survivors"]

#: How long the chosen members of a shrink have to get ready at least, whatever the timeout left.
READY_SECONDS = 5.0
#: How many members may still be missing, not reported lost, for a look to read which they are and
#: look for their processes (members that died are otherwise found by the watchers, which post them).
PROBED = 4


class Survivors:
    """The agreement and shrink protocols of one communicator (``rank`` is its own rank there)."""

    def __init__(self, board: FailureBoard, rank: int) -> None:
        self._board, self._rank = board, rank
        self._store, self._prefix = board.keys, board.name
        self._size = len(board.members)
        self._round_key = f"{board.name}shrink/round"  # the shrink round in progress
        self._agreements = 0

    def _ranks(self, text: bytes) -> set[int]:
        """The members named by entries ``rank;`` or ``rank:value;`` (others are skipped)."""
        return listed(text.decode(errors="replace"), self._size, ";")

    def _chosen(self, text: str) -> Spans:
        """The members of a shrink's outcome, written as spans (``"0-6,8-15"``: the outcome every
        member reads costs bytes by the gaps in it, not by the members), read without listing
        them (each member reads it: listing would cost every rank N)."""
        return spans_within(text, self._size)

    def _lost(self, events: bytes | None = None) -> set[int]:
        """The members (local) reported lost; the log is read when its count ``events``, as the
        store holds it, moved."""
        board = self._board
        board.refresh(look=not events or not events.isdigit() or board.log.behind(int(events)))
        return set(board.lost())

    def _found_gone(self, rank: int) -> bool:
        """Whether ``rank``'s process is found gone here (a process id, or a probe)."""
        return bool(self._board.hosts.gone(self._board.members[rank]))

    def _gone(self, ranks: set[int]) -> set[int]:
        """Those of ``ranks`` (local) whose process is gone: reported lost, or found so here."""
        lost = self._lost()
        return {r for r in ranks if r in lost or self._found_gone(r)}

    def _waiting_on_none(self, missing: set[int]) -> bool:
        """Whether none of ``missing`` (not reported lost) is worth waiting for: at most
        :data:`PROBED` of them, each found gone (the first one alive ends the search)."""
        return len(missing) <= PROBED and all(self._found_gone(r) for r in sorted(missing))

    def _settle(
        self,
        entries: str,
        outcome: str,
        mine: str,
        limit: float,
        propose: Callable[[set[int]], str],
        now: float,
        candidates: Collection[int] | None = None,
    ) -> Poll[str]:
        """Add ``mine`` to key ``entries``; return the outcome fixed under key ``outcome``, chosen
        among ``candidates`` (default: every member). What a wait holds between its looks is
        O(1) (a range, or the spans of a shrink's earlier choice): only a look that reads who is
        missing makes sets of the members, and lets them go before it pauses."""
        store = self._store
        everyone = range(self._size) if candidates is None else candidates
        fixed = _made(store, outcome)  # empty until proposed
        guarded_store(lambda: store.add("events", 0))  # made: one request reads it with the others
        if fixed:
            return fixed.decode(errors="replace")
        guarded_store(lambda: store.append(entries, mine))
        count = f"{entries}/count"
        guarded_store(lambda: store.add(count, 1))
        deadline, pause = now + limit, Pacer(store, now=now)
        while True:
            fixed, counted, events = guarded_store(lambda: store.multi_get([outcome, count, "events"]))
            if fixed:
                return fixed.decode(errors="replace")
            lost, late = {r for r in self._lost(events) if r in everyone}, now > deadline
            # Who is missing is read only when few can be: a look costs O(1) bytes, not O(members).
            if late or int(counted or b"0") + len(lost) + PROBED >= len(everyone):
                present = {r for r in self._ranks(guarded_store(lambda: store.get(entries))) if r in everyone}
                if late or self._waiting_on_none({r for r in everyone if r not in present and r not in lost}):
                    joined = present - self._gone(present - {self._rank})
                    chosen = propose(joined)
                    return store.compare_set(outcome, "", chosen).decode(errors="replace")
            now = yield min(pause(now), max(deadline - now, 0.001))

    def agree(self, flag: bool, limit: float) -> bool:
        """The logical AND of ``flag`` over the members that took part (see the module docstring)."""
        return drive(self.agreeing(flag, limit, time.monotonic()))

    def agreeing(self, flag: bool, limit: float, now: float) -> Poll[bool]:
        """:meth:`agree` as a poll (see :mod:`communicator.control.polls`)."""
        self._agreements += 1
        key = f"{self._prefix}agree{self._agreements}"
        entries = f"{key}/votes"

        def propose(joined: set[int]) -> str:
            text = guarded_store(lambda: self._store.get(entries)).decode(errors="replace")
            votes = dict(entry.partition(":")[::2] for entry in text.split(";") if entry)
            return "1" if all(votes.get(str(r)) == "1" for r in joined) else "0"

        mine = f"{self._rank}:{int(flag)};"
        return (yield from self._settle(entries, f"{key}/result", mine, limit, propose, now)) == "1"

    def shrink(self, limit: float, patience: float) -> tuple[int, list[int]]:
        """The round that formed and the members (local ranks, in order) of the shrunk
        communicator, once every one of them is ready; ``ExcludedError`` for a rank left out.
        Members are waited for ``limit`` seconds; the chosen ones get ready by then, or within
        :data:`READY_SECONDS` (``patience``, if shorter) of the choice."""
        number, members = drive(self.shrinking(limit, patience, time.monotonic()))
        return number, list(members)

    def shrinking(self, limit: float, patience: float, now: float) -> Poll[tuple[int, Spans]]:
        """:meth:`shrink` as a poll (see :mod:`communicator.control.polls`); the members as spans
        (what each rank holds while it waits is O(1), not the list of members)."""
        deadline = now + limit
        store, round_key = self._store, self._round_key
        while True:
            number = guarded_store(lambda: store.add(round_key, 0))
            key = f"{self._prefix}shrink{number}"
            candidates = self._candidates(number)
            left = max(deadline - now, 0.0 if candidates is None else min(READY_SECONDS, patience))
            joined, members = f"{key}/joined", f"{key}/members"
            settled = yield from self._settle(joined, members, f"{self._rank};", left, _listed, now, candidates)
            now = yield 0.0  # the time it goes on at
            chosen = self._chosen(settled)
            if self._rank not in chosen:
                raise ExcludedError(
                    f"shrink() on rank {self._rank}: the survivors formed their communicator without this rank "
                    "(it did not call shrink() in time, was not ready in time, or was found gone)"
                )
            ready_by = max(deadline, now + min(READY_SECONDS, patience))
            if (yield from self._ready(key, number, chosen, ready_by, now)):
                return number, chosen
            now = yield 0.0

    def _candidates(self, number: int) -> Spans | None:
        """Who round ``number`` chooses among: every member in the first round; after a round
        that did not form, the members it chose but those that were late (the dead ones are found
        gone anyway). One request in a later round, two after a round with late members."""
        if number == 0:
            return None
        before = f"{self._prefix}shrink{number - 1}"
        chosen = guarded_store(lambda: self._store.peek(f"{before}/members"))
        if not chosen:  # none, or none proposed yet
            return None
        late = guarded_store(lambda: self._store.peek(f"{before}/late"))
        left_out = self._ranks(late or b"")
        return Spans(spans_text(r for r in self._chosen(chosen.decode(errors="replace")) if r not in left_out))

    def abandon(self, number: int) -> None:
        """Round ``number`` could not form its communicator: the next ``shrink()`` chooses again."""
        guarded_store(lambda: self._store.compare_set(self._round_key, str(number), str(number + 1)))

    def _ready(self, key: str, number: int, chosen: Sequence[int], deadline: float, now: float) -> Poll[bool]:
        """Wait until every chosen member is ready; ``False`` when one died first, or was not
        ready by ``deadline`` (next round, without it). The store's handle raises ``PeerLostError``
        for a store that is gone, as each request here does."""
        store = self._store
        guarded_store(lambda: store.append(f"{key}/ready", f"{self._rank};"))
        count = f"{key}/ready/count"
        guarded_store(lambda: store.add(count, 1))
        pause = Pacer(store, now=now)
        while True:
            round_now, counted, events = store.multi_get([self._round_key, count, "events"])
            if round_now != str(number).encode():  # given up (a member was late or died), ready or not
                return False
            if int(counted or b"0") >= len(chosen):
                return True
            lost, late = {r for r in self._lost(events) if r in chosen}, now > deadline
            if lost or late or int(counted or b"0") + PROBED >= len(chosen):  # which are not ready?
                ready = self._ranks(store.get(f"{key}/ready"))
                waiting = {r for r in chosen if r not in ready}
                if not waiting:
                    return True
                if waiting & lost or (len(waiting) <= PROBED and any(self._found_gone(r) for r in sorted(waiting))):
                    self.abandon(number)
                    return False
                if late:
                    named = "".join(f"{r};" for r in sorted(waiting))
                    store.compare_set(f"{key}/late", "", named)  # the first to see them late names them for all
                    self.abandon(number)
                    return False
            now = yield pause(now)


def _listed(ranks: set[int]) -> str:
    if not ranks:
        raise CommError("shrink(): no member is left")
    return spans_text(sorted(ranks))


def _made(store: StoreHandle, key: str) -> bytes:
    """The value of ``key``, made empty if there is none (one request that never blocks): then
    one ``multi_get`` reads it with other keys."""
    return guarded_store(lambda: store.compare_set(key, "", ""))
