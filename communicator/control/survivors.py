"""What the live members of a communicator settle through the store after a loss: the answer of
an agreement, and who forms the shrunk communicator.

Both follow one pattern. Each caller adds its entry to one key with ``append`` (one request),
then reads that key until every member has an entry or is gone (its process exited, or it was
reported lost), or the timeout passed. The first caller to get there proposes the outcome with
``compare_set`` on the outcome key, which keeps the first proposal: every caller returns that one,
so all survivors get the same answer even when a member dies during the call (its entry counts
if the proposal saw it). A member that is alive but never calls is left out once the timeout
passes; one that calls after the outcome was fixed reads it.

A shrink has a second step: before the new group forms, every chosen member says it is ready.
A chosen member that dies before that moves every caller to the next *round*, which chooses
again without it; forming a group with a dead member would wait out the group's timeout.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from communicator.control.board import FailureBoard, backoff
from communicator.control.log import guarded_store
from communicator.errors import CommError, CommTimeoutError, ExcludedError

__all__ = ["Survivors"]


def _ranks(text: str) -> set[int]:
    """The ranks of entries ``rank;`` or ``rank:value;``."""
    return {int(entry.split(":")[0]) for entry in text.split(";") if entry}


class Survivors:
    """The agreement and shrink protocols of one communicator (``rank`` is its own rank there)."""

    def __init__(self, board: FailureBoard, rank: int) -> None:
        self._board, self._rank = board, rank
        self._store, self._prefix = board.keys, board.name
        self._round_key = f"{board.name}shrink/round"  # the shrink round in progress
        self._agreements = 0

    def _gone(self, ranks: set[int]) -> set[int]:
        """Those of ``ranks`` (local) whose process is gone: reported lost, or found so here."""
        self._board.refresh()
        lost = set(self._board.lost())
        hosts, members = self._board.hosts, self._board.members
        return {r for r in ranks if r in lost or hosts.gone(members[r])}

    def _settle(self, entries: str, outcome: str, mine: str, limit: float, propose: Callable[[set[int]], str]) -> str:
        """Add ``mine`` to key ``entries``; return the outcome fixed under key ``outcome``."""
        store, everyone = self._store, set(range(len(self._board.members)))
        if guarded_store(lambda: store.check([outcome])):
            return guarded_store(lambda: store.get(outcome)).decode()
        guarded_store(lambda: store.append(entries, mine))
        deadline, pause = time.monotonic() + limit, backoff(0.005, 0.5)
        while True:
            if guarded_store(lambda: store.check([outcome])):
                return guarded_store(lambda: store.get(outcome)).decode()
            present = _ranks(guarded_store(lambda: store.get(entries)).decode())
            missing = everyone - present
            if not missing - self._gone(missing) or time.monotonic() > deadline:
                joined = present - self._gone(present - {self._rank})
                return guarded_store(functools.partial(store.compare_set, outcome, "", propose(joined))).decode()
            time.sleep(pause())

    def agree(self, flag: bool, limit: float) -> bool:
        """The logical AND of ``flag`` over the members that took part (see the module docstring)."""
        self._agreements += 1
        key = f"{self._prefix}agree{self._agreements}"
        entries = f"{key}/votes"

        def propose(joined: set[int]) -> str:
            text = guarded_store(lambda: self._store.get(entries)).decode()
            votes = dict(entry.split(":") for entry in text.split(";") if entry)
            return "1" if all(votes[str(r)] == "1" for r in joined) else "0"

        return self._settle(entries, f"{key}/result", f"{self._rank}:{int(flag)};", limit, propose) == "1"

    def shrink(self, limit: float, patience: float) -> tuple[int, list[int]]:
        """The round that formed and the members (local ranks, in order) of the shrunk
        communicator, once every one of them is ready; ``ExcludedError`` for a rank left out.
        Members are waited for ``limit`` seconds; the chosen ones (all inside ``shrink()``)
        get ready within ``patience``."""
        deadline = time.monotonic() + limit
        store, round_key = self._store, self._round_key
        while True:
            number = guarded_store(lambda: store.add(round_key, 0))
            key = f"{self._prefix}shrink{number}"
            left = max(deadline - time.monotonic(), 0.0)
            settled = self._settle(f"{key}/joined", f"{key}/members", f"{self._rank};", left, _listed)
            chosen = sorted(_ranks(settled))
            if self._rank not in chosen:
                raise ExcludedError(
                    f"shrink() on rank {self._rank}: the survivors formed their communicator without this rank "
                    "(it did not call shrink() in time, or was found gone)"
                )
            if self._ready(key, number, set(chosen), time.monotonic() + patience):
                return number, chosen

    def abandon(self, number: int) -> None:
        """Round ``number`` could not form its communicator: the next ``shrink()`` chooses again."""
        guarded_store(lambda: self._store.compare_set(self._round_key, str(number), str(number + 1)))

    def _ready(self, key: str, number: int, chosen: set[int], deadline: float) -> bool:
        """Wait until every chosen member is ready; ``False`` when one died first (next round)."""
        store = self._store
        guarded_store(lambda: store.append(f"{key}/ready", f"{self._rank};"))
        pause = backoff(0.005, 0.5)
        while True:
            ready = _ranks(guarded_store(lambda: store.get(f"{key}/ready")).decode())
            if chosen <= ready:
                return True
            if guarded_store(lambda: store.add(self._round_key, 0)) != number:
                return False
            if self._gone(chosen - ready):
                self.abandon(number)
                return False
            if time.monotonic() > deadline:
                late = sorted(chosen - ready)
                raise CommTimeoutError(f"shrink() on rank {self._rank}: ranks {late} were chosen but never got ready")
            time.sleep(pause())


def _listed(ranks: set[int]) -> str:
    if not ranks:
        raise CommError("shrink(): no member is left")
    return "".join(f"{r};" for r in sorted(ranks))
