"""The scenarios of :mod:`benchmarks.control_plane`: what N virtual ranks do, on the schedule real
processes follow (waits look on their slices; polling loops run as polls, side by side, on the
simulation's clock), and whether every rank found out what it had to."""

from __future__ import annotations

import heapq
import subprocess
import time
from collections.abc import Callable, Sequence

from torch._C._distributed_c10d import Store

from benchmarks.control_plane import Clock, CountingStore, Result, news_delay, ranks
from communicator.control.plane import Control
from communicator.control.polls import Poll, backoff
from communicator.control.waiting import FIRST_SLICE_SECONDS
from communicator.errors import (
    CollectiveMismatchError,
    CommError,
    PeerLostError,
    RemoteError,
    RevokedError,
)

__all__ = ["WAIT_SECONDS", "scenario"]

#: How long the simulated waits last (and the spread of the skewed arrivals), unless asked otherwise.
WAIT_SECONDS = 10.0
#: Groups in which ranks close or fail one after another, the others looking in between.
WAVES = 10


def looks_within(seconds: float, cap: float) -> list[float]:
    """When a wait of ``seconds`` looks at its board, its pauses at most ``cap`` (see
    :func:`communicator.control.waiting.wait`)."""
    pause, now, times = backoff(FIRST_SLICE_SECONDS, cap), FIRST_SLICE_SECONDS, []
    while (now := now + pause()) <= seconds:
        times.append(now)
    return times


def _beat(controls: Sequence[Control], at: float) -> None:
    for control in controls:
        control.world.watcher.beat(at)


def _wait(controls: Sequence[Control], seconds: float, clock: Clock) -> bool:
    """Every rank waits ``seconds`` in the same operation, looking on the real schedule, its
    watcher beating once a second; whether a verdict reached every rank."""
    started, wall = time.monotonic(), clock.now
    stalls = [c.watch.begin(c.rank, "all_reduce", started, 600.0) for c in controls]
    beat = 0.0
    for at in looks_within(seconds, controls[0].board.log.look_seconds):
        clock.now = wall + at
        while beat + 1.0 <= at:
            beat += 1.0
            _beat(controls, started + beat)
        for control, stall in zip(controls, stalls, strict=True):
            control.board.check(control.rank, 0, "all_reduce")
            stall.tick(started + at)
    return all(stall.verdict is not None for stall in stalls)


def _poll(
    polls: Sequence[tuple[float, Callable[[float], Poll[None]]]], controls: Sequence[Control], clock: Clock
) -> list[CommError | None]:
    """Run the polls side by side, each from its start (seconds from now), on the simulation's
    clock, the watchers beating once a second; what each ended with (``None``: it returned)."""
    started, wall = time.monotonic(), clock.now
    heap = [(at, index, -1) for index, (at, _) in enumerate(polls)]
    heapq.heapify(heap)
    running: dict[int, Poll[None]] = {}
    ended: list[CommError | None] = [None] * len(polls)
    beat = 0.0
    while heap:
        at, index, _ = heapq.heappop(heap)
        clock.now = wall + at
        while beat + 1.0 <= at:
            beat += 1.0
            _beat(controls, started + beat)
        try:
            if index in running:
                pause = running[index].send(started + at)
            else:
                running[index] = polls[index][1](started + at)
                pause = next(running[index])
            heapq.heappush(heap, (at + pause, index, 0))
        except StopIteration:
            running.pop(index)
        except CommError as error:
            running.pop(index)
            ended[index] = error
    return ended


def _spread(controls: Sequence[Control], post: Callable[[], None], error: type[CommError], clock: Clock) -> bool:
    """``post`` on one rank, then every other rank's next look, once the hosts' relays are due to
    read the store again; whether each raised ``error``."""
    clock.now += news_delay(controls[0].world.local_size)
    post()
    knew = True
    for control in controls[1:]:
        try:
            control.board.check(control.rank, 1, "all_reduce")
            knew = False
        except error:
            pass
    return knew


def _refuse(refusing: Sequence[Control], controls: Sequence[Control], clock: Clock) -> bool:
    """Collective #1 refused by ``refusing``, started by the others: each of those finds out at its
    next look and says it left; then each refusing rank settles, going on only if every rank
    refused. Whether each did what it should."""
    for control in controls:
        control._calls.seq = 1
    for control in refusing:
        control.bad_arguments(ValueError("unknown reduce op"), "all_reduce", collective=True)
    refused = {id(c) for c in refusing}
    others = [c for c in controls if id(c) not in refused]
    knew = _spread([refusing[0], *others], lambda: None, RemoteError, clock)
    clock.now += news_delay(controls[0].world.local_size)
    for control in refusing:
        try:
            control.settle()
            knew = knew and not others
        except CommError:
            knew = knew and bool(others)
    return knew


def _skewed_refusals(controls: Sequence[Control], seconds: float, clock: Clock) -> bool:
    """Every rank refuses collective #1, arriving evenly over ``seconds``, then settles until
    every rank has refused it; whether every one went on."""
    n = len(controls)
    for control in controls:
        control._calls.seq = 1

    def refuse_then_settle(control: Control) -> Callable[[float], Poll[None]]:
        def poll(now: float) -> Poll[None]:
            control.bad_arguments(ValueError("unknown reduce op"), "all_reduce", collective=True)
            yield from control.settling(now)

        return poll

    starts = [(seconds * i / max(n - 1, 1), refuse_then_settle(c)) for i, c in enumerate(controls)]
    return not any(_poll(starts, controls, clock))


def _main_first(controls: Sequence[Control], seconds: float, clock: Clock) -> bool:
    """``main_process_first``: the others wait in its barrier while rank 0 runs the block
    (``seconds``); whether every rank went through."""
    starts = [(seconds if c.rank == 0 else 0.0, lambda now, c=c: c.barrier_poll(600.0, now)) for c in controls]
    return not any(_poll(starts, controls, clock))


def _waves(controls: Sequence[Control], leave: Callable[[Control], None], look: int, clock: Clock) -> bool:
    """The ranks ``leave`` in :data:`WAVES` groups; after each group, every rank still there looks
    (at operation ``look``) once its host's relay is due; whether no look raised (``look`` 1: the
    ones that left completed it) or every look did (``look`` 2)."""
    n, outcomes = len(controls), []
    for wave in range(WAVES):
        for control in controls[wave * n // WAVES : (wave + 1) * n // WAVES]:
            leave(control)
        clock.now += news_delay(controls[0].world.local_size)
        for control in controls[(wave + 1) * n // WAVES :]:
            try:
                control.board.check(control.rank, look, "barrier")
                outcomes.append(False)
            except CommError:
                outcomes.append(True)
    return all(outcomes) if look == 2 else not any(outcomes)


def _lost(controls: Sequence[Control], clock: Clock) -> bool:
    """The last rank's process exits: the ranks of its host find its process id gone at their next
    look and one of them posts it; every other rank reads it. A host of one rank has no neighbour
    to see it: there the stall judge's probe finds it, which posts the same record."""
    n, last = len(controls), controls[-1]
    if last.world.local_size < 2:
        posted = lambda: controls[0].board.post_lost(0, n - 1, "its process has exited")  # noqa: E731 - as the judge
        return _spread(controls[:-1], posted, PeerLostError, clock)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for control in controls[:-1]:
        known = control.world.hosts._local
        if known is not None and n - 1 in known:
            known[n - 1] = dead.pid  # as its process is gone, so is this process id
    host = last.world.hosts.host  # its host's ranks look first: one of them finds it and posts it
    here = [c for c in controls[:-1] if c.world.hosts.host == host]
    there = [c for c in controls[:-1] if c.world.hosts.host != host]
    if not _spread([last, *here], lambda: None, PeerLostError, clock):
        return False
    return _spread([last, *there], lambda: None, PeerLostError, clock)


def scenario(
    name: str, n: int, make_store: Callable[[], Store], real: bool, per_host: int, seconds: float = WAIT_SECONDS
) -> Result:
    """Scenario ``name`` at ``n`` virtual ranks, ``per_host`` to a host; its waits last ``seconds``."""
    counting, clock = CountingStore(make_store()), Clock()
    stall_seconds = 4.0 if name == "stall" else 600.0
    building = time.perf_counter()
    controls = ranks(counting, n, stall_seconds, clock, per_host)
    built = time.perf_counter()
    try:
        result = _play(name, controls, counting, clock, real, seconds)
    finally:
        for control in controls:
            if control.world.relay is not None:
                control.world.relay.remove()
    result.build_seconds, result.play_seconds = built - building, time.perf_counter() - built
    return result


def _play(
    name: str, controls: Sequence[Control], counting: CountingStore, clock: Clock, real: bool, waits: float
) -> Result:
    n, first = len(controls), controls[0]
    for control in controls:  # the first look
        control.board.check(control.rank, 0, "startup")
    before, seconds, knew = counting.tally(), 0.0, True
    if name == "startup":
        before = (0, 0, 0, 0.0)
    elif name in ("idle wait", "stall"):
        seconds = waits
        knew = _wait(controls, waits, clock) or name == "idle wait"
    elif name == "failure":
        knew = _spread(controls, lambda: first.failed(RuntimeError("boom"), "step"), RemoteError, clock)
    elif name == "mismatch":
        error = CollectiveMismatchError({0: "in all_reduce #1", 1: "in broadcast #1"}, "different collectives")
        knew = _spread(controls, lambda: first.board.post_mismatch(0, error), CollectiveMismatchError, clock)
    elif name == "revoke":
        knew = _spread(controls, lambda: first.board.post_revoke(0), RevokedError, clock)
    elif name == "lost peer":
        knew = _lost(controls, clock)
    elif name in ("refusal", "refused everywhere"):
        knew = _refuse(controls if name == "refused everywhere" else controls[:1], controls, clock)
    elif name == "refusals 10 s apart":
        seconds, knew = waits, _skewed_refusals(controls, waits, clock)
    elif name == "main_process_first":
        seconds, knew = waits, _main_first(controls, waits, clock)
    elif name == "cascade":  # each rank fails on its own (its own error, not an echo) and leaves
        knew = _waves(controls, lambda c: c.close(RuntimeError(f"rank {c.rank}: input file missing")), 2, clock)
    elif name == "closing":  # every rank closes after the same operation, the later ones looking meanwhile
        for control in controls:
            control._calls.seq = 1
        knew = _waves(controls, lambda c: c.close(None), 1, clock)
    else:
        raise ValueError(f"no scenario {name!r}")
    requests, keys, sent, busy = (now - then for now, then in zip(counting.tally(), before, strict=True))
    served = busy if real else None
    return Result(name, n, int(requests), seconds, knew, served, int(keys), int(sent), first.world.local_size)
