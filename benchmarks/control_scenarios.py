"""The scenarios of :mod:`benchmarks.control_plane`: what N virtual ranks do, on the schedule real
processes follow (waits look on their slices; polling loops run as polls, side by side, on the
simulation's clock), and whether every rank found out what it had to."""

from __future__ import annotations

import gc
import heapq
import inspect
import math
import os
import pickle
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch._C._distributed_c10d import Store

from benchmarks.control_plane import Clock, CountingStore, Result, news_delay, ranks
from benchmarks.control_virtual import Processes, timed_by
from communicator.control.log import LOOK_SECONDS
from communicator.control.plane import Control
from communicator.control.polls import Poll, backoff
from communicator.control.ranks import Spans
from communicator.control.stalls import JUDGE_AFTER_SECONDS, PROBES_PER_BEAT, WATCH_SECONDS, Stall
from communicator.control.waiting import FIRST_SLICE_SECONDS
from communicator.errors import (
    CollectiveMismatchError,
    CommError,
    PeerLostError,
    RemoteError,
    RevokedError,
)
from communicator.guard import Spec

__all__ = ["WAIT_SECONDS", "forked", "scenario"]

#: How long the simulated waits last (and the spread of the skewed arrivals), unless asked otherwise.
WAIT_SECONDS = 10.0
#: When a rank raised what (simulated seconds from the start of its wait), ``None``: it did not.
Known = tuple[float, CommError] | None
#: The collective the waits wait in, and its tensor (one, shared: its shape and dtype are what a status says).
ALL_REDUCE = Spec("all_reduce", (), False, inspect.Signature(), (0, "tensor"))
TENSOR = (torch.zeros(1024),)
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


def _wait(controls: Sequence[Control], seconds: float, clock: Clock) -> tuple[list[Stall], list[Known]]:
    """Every rank waits at most ``seconds`` in the same operation, looking on the real schedule,
    its watcher beating every :data:`~communicator.control.stalls.WATCH_SECONDS`, until a look
    raises: each wait's stall, and what each rank raised (``None``: nothing) when (simulated
    seconds from the start)."""
    started = wall = clock.now  # the ranks' monotonic clocks too: nothing counted follows the real one
    for control in controls:  # in the collective, as its status says
        calls = control._calls
        calls.seq, calls.op = calls.seq + 1, ALL_REDUCE.name
        calls.start(ALL_REDUCE, SimpleNamespace(rank=control.rank, world_size=control.world.world_size), TENSOR, {})
    stalls = [c.watch.begin(c.rank, ALL_REDUCE.name, started, 600.0) for c in controls]
    known: list[Known] = [None] * len(controls)
    waiting, beat = list(range(len(controls))), 0.0
    for at in looks_within(seconds, controls[0].board.log.look_seconds):
        clock.now = wall + at
        while beat + WATCH_SECONDS <= at:
            beat += WATCH_SECONDS
            _beat(controls, started + beat)
        still = []
        for index in waiting:
            control = controls[index]
            try:
                control.board.check(control.rank, control._calls.seq, ALL_REDUCE.name)
                stalls[index].tick(started + at)
                still.append(index)
            except CommError as error:
                known[index] = (at, error)
        if not (waiting := still):
            break
    return stalls, known


def _poll(
    polls: Sequence[tuple[float, Callable[[float], Poll[Any]]]], controls: Sequence[Control], clock: Clock
) -> list[Any]:
    """Run the polls side by side, each from its start (seconds from now), on the simulation's
    clock, the watchers beating every :data:`~communicator.control.stalls.WATCH_SECONDS`; what
    each returned, or the ``CommError`` it raised."""
    started = wall = clock.now  # the ranks' monotonic clocks too: nothing counted follows the real one
    heap = [(at, index) for index, (at, _) in enumerate(polls)]
    heapq.heapify(heap)
    running: dict[int, Poll[Any]] = {}
    ended: list[Any] = [None] * len(polls)
    beat = 0.0
    while heap:
        at, index = heapq.heappop(heap)
        clock.now = wall + at
        while beat + WATCH_SECONDS <= at:
            beat += WATCH_SECONDS
            _beat(controls, started + beat)
        try:
            if index in running:
                pause = running[index].send(started + at)
            else:
                running[index] = polls[index][1](started + at)
                pause = next(running[index])
            heapq.heappush(heap, (at + pause, index))
        except StopIteration as done:
            running.pop(index, None)
            ended[index] = done.value
        except CommError as error:
            running.pop(index, None)
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
    return not any(isinstance(e, CommError) for e in _poll(starts, controls, clock))


def _main_first(controls: Sequence[Control], seconds: float, clock: Clock) -> bool:
    """``main_process_first``: the others wait in its barrier while rank 0 runs the block
    (``seconds``); whether every rank went through."""
    starts = [(seconds if c.rank == 0 else 0.0, lambda now, c=c: c.barrier_poll(600.0, now)) for c in controls]
    return not any(isinstance(e, CommError) for e in _poll(starts, controls, clock))


class _Running:
    """Polls started one by one at the simulation's clock, each going on when its pause is over
    as the clock is moved on (:meth:`until`), and each one's end (simulated time)."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self._heap, self.ended = clock, list[tuple[float, int, Poll[Any]]](), dict[int, float]()
        self._started = 0

    def start(self, poll: Poll[Any]) -> int:
        """``poll`` from now (its first step at once); its number."""
        number, self._started = self._started, self._started + 1
        self._step(number, poll, lambda: next(poll))
        return number

    def _step(self, number: int, poll: Poll[Any], step: Callable[[], float]) -> None:
        try:
            heapq.heappush(self._heap, (self.clock.now + step(), number, poll))
        except StopIteration:
            self.ended[number] = self.clock.now

    def until(self, at: float) -> None:
        """Every step due by ``at``, in order; the clock at ``at`` then (all of them: ``inf``)."""
        while self._heap and self._heap[0][0] <= at:
            due, number, poll = heapq.heappop(self._heap)
            self.clock.now = max(self.clock.now, due)
            self._step(number, poll, lambda poll=poll, due=due: poll.send(due))  # type: ignore[misc]
        if at != math.inf:
            self.clock.now = max(self.clock.now, at)


def _waves(
    controls: Sequence[Control], leave: Callable[[Control], Poll[Any]], look: int, clock: Clock
) -> tuple[bool, _Running]:
    """The ranks ``leave`` (a poll each: closing lingers where it must) in :data:`WAVES` groups;
    after each group, every rank still there looks (at operation ``look``) once its host's relay
    is due; whether no look raised (``look`` 1: the ones that left completed it) or every look
    did (``look`` 2), and the leavings (run to their ends)."""
    n, outcomes, leaving = len(controls), [], _Running(clock)
    for wave in range(WAVES):
        for control in controls[wave * n // WAVES : (wave + 1) * n // WAVES]:
            leaving.start(leave(control))
        leaving.until(clock.now + news_delay(controls[0].world.local_size))
        for control in controls[(wave + 1) * n // WAVES :]:
            try:
                control.board.check(control.rank, look, "barrier")
                outcomes.append(False)
            except CommError:
                outcomes.append(True)
    leaving.until(math.inf)
    return (all(outcomes) if look == 2 else not any(outcomes)), leaving


def _closing(controls: Sequence[Control], clock: Clock) -> tuple[bool, float]:
    """Every rank closes after the same operation (see :func:`_waves`); rank 0 hosts the store
    (as in a job that torch's launchers start) and, once it closed, departs: it waits until every
    other rank closed. Whether no rank's look raised and rank 0 left once the last closed, and
    when (simulated seconds from the start)."""
    first, started = controls[0], clock.now
    for control in controls:
        control._calls.seq = 1

    def leave(control: Control) -> Poll[None]:
        yield from control.closing(None, clock.now)
        if control is first:
            yield from first.board.departing(first.rank, 600.0, clock.now)

    closed, leaving = _waves(controls, leave, 1, clock)
    last = started + WAVES * news_delay(first.world.local_size)  # the last wave closed by then
    departed = leaving.ended[0]
    return closed and departed <= last + LOOK_SECONDS + news_delay(first.world.local_size), departed - started


def _lost(controls: Sequence[Control], processes: Processes, clock: Clock) -> tuple[bool, float, float]:
    """Every rank waits in a collective that the last rank's process never joins: it exited. The
    ranks of its host find its process id gone at their next look and one of them posts it; a
    host of one rank has no neighbour to see it: there the stall judge's probes find it, a few
    members a beat. Whether every other rank raised ``PeerLostError``, when the first and the last did."""
    n = len(controls)
    processes.exit(controls[-1].rank)
    longest = JUDGE_AFTER_SECONDS + n / PROBES_PER_BEAT + WAIT_SECONDS  # the judge probes every member
    _, known = _wait(controls[:-1], longest, clock)
    knew = all(k is not None and isinstance(k[1], PeerLostError) for k in known)
    times = [k[0] for k in known if k is not None] or [longest]
    return knew, min(times), max(times)


def _survivors(name: str, controls: Sequence[Control], processes: Processes, clock: Clock) -> Callable[[], bool]:
    """After the last rank was lost and every other rank heard of it (not counted), how the
    survivors call ``agree(True)`` or ``shrink()`` together: whether each got the same answer
    (true; the survivors, in order)."""
    knew, _, _ = _lost(controls, processes, clock)
    assert knew, "the survivors did not hear of the lost rank"
    survivors = controls[:-1]

    def play() -> bool:
        if name == "agree":
            polls = [(0.0, lambda now, c=c: c.survivors.agreeing(True, 600.0, now)) for c in survivors]
            return all(found is True for found in _poll(polls, survivors, clock))
        polls = [(0.0, lambda now, c=c: c.survivors.shrinking(600.0, 600.0, now)) for c in survivors]
        formed = (0, Spans(f"0-{len(survivors) - 1}"))  # compared run by run, not rank by rank
        return all(found == formed for found in _poll(polls, survivors, clock))

    return play


def scenario(
    name: str, n: int, make_store: Callable[[], Store], real: bool, per_host: int, seconds: float = WAIT_SECONDS
) -> Result:
    """Scenario ``name`` at ``n`` virtual ranks, ``per_host`` to a host; its waits last ``seconds``."""
    counting, clock, processes = CountingStore(make_store(), real), Clock(), Processes()
    with processes.installed(), timed_by(clock):
        building = time.perf_counter()
        controls = ranks(counting, n, _stall_seconds(name), clock, processes, per_host)
        built = time.perf_counter()
        try:
            result = _play(name, controls, counting, clock, processes, real, seconds)
        finally:
            _remove_files(controls)
    result.build_seconds, result.play_seconds = built - building, time.perf_counter() - built
    return result


def forked(
    names: Sequence[str], n: int, make_store: Callable[[], Store], per_host: int, seconds: float = WAIT_SECONDS
) -> Iterator[Result]:
    """The scenarios ``names`` against a counting store in this process, their ranks made once
    (twice with ``stall``, whose threshold differs) and each scenario played in a child process
    that starts from them (``fork``: the same objects and store, copied as the child writes them);
    ``peak_mib`` is then what the parent and the child hold together at the child's end."""
    for stall_seconds in sorted({_stall_seconds(name) for name in names}):
        group = [name for name in names if _stall_seconds(name) == stall_seconds]
        yield from _made_once(group, n, make_store, per_host, stall_seconds, seconds)


def _made_once(
    names: Sequence[str], n: int, make_store: Callable[[], Store], per_host: int, stall_seconds: float, seconds: float
) -> Iterator[Result]:
    counting, clock, processes = CountingStore(make_store()), Clock(), Processes()
    with processes.installed(), timed_by(clock):
        building = time.perf_counter()
        controls = ranks(counting, n, stall_seconds, clock, processes, per_host)
        built = time.perf_counter() - building
        gc.collect()
        gc.freeze()  # a child's collections would copy every object it never writes
        try:
            for name in names:

                def play(name: str = name) -> Result:
                    try:
                        return _play(name, controls, counting, clock, processes, False, seconds)
                    finally:
                        _remove_files(controls)  # made at the first look: the next child makes its own

                result = _in_child(play)
                result.build_seconds = built
                yield result
        finally:
            gc.unfreeze()


def _in_child(play: Callable[[], Result]) -> Result:
    """``play()`` in a child process; its result, with the memory both processes hold at its end."""
    readable, writable = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into the caller's code
        status = 1
        try:
            os.close(readable)
            started = time.perf_counter()
            played = play()
            played.play_seconds = time.perf_counter() - started
            played.peak_mib = _private_mib()
            with os.fdopen(writable, "wb") as out:
                pickle.dump(played, out)
            status = 0
        finally:
            os._exit(status)
    os.close(writable)
    with os.fdopen(readable, "rb") as found:
        data = found.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        raise RuntimeError(f"the scenario's process ended with status {status}")
    result: Result = pickle.loads(data)
    result.peak_mib += resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def _private_mib() -> float:
    """This process's own memory (not shared with its parent), in MiB."""
    with open("/proc/self/smaps_rollup") as rollup:
        fields = dict(line.split(":", 1) for line in rollup if ":" in line)
    return sum(int(fields.get(f, "0 kB").split()[0]) for f in ("Private_Clean", "Private_Dirty")) / 1024


def _stall_seconds(name: str) -> float:
    return 4.0 if name == "stall" else 600.0


def _remove_files(controls: Sequence[Control]) -> None:
    """The hosts' relays and their files beside them, as the ranks' worlds stop."""
    for control in controls:
        world = control.world
        if world.neighbours is not None:
            world.neighbours.forget(world.world_rank)
        if world.relay is not None:
            world.relay.remove()


def _play(
    name: str,
    controls: Sequence[Control],
    counting: CountingStore,
    clock: Clock,
    processes: Processes,
    real: bool,
    waits: float,
) -> Result:
    n, first, started = len(controls), controls[0], clock.now
    for control in controls:  # the first look, as the watcher's thread starts: no heartbeat is due
        control.world.watcher._written = ("", started)
        control.board.check(control.rank, 0, "startup")
    survivors = _survivors(name, controls, processes, clock) if name in ("agree", "shrink") else None
    before, seconds, knew, found, after = counting.tally(), 0.0, True, 0.0, None
    delay = news_delay(first.world.local_size)  # a record is read within it (see _spread)
    if name == "startup":
        before = (0, 0, 0, 0.0)
    elif name in ("idle wait", "stall"):
        seconds = waits
        stalls, _ = _wait(controls, waits, clock)
        knew = name == "idle wait" or all(stall.verdict is not None for stall in stalls)
    elif name == "failure":
        knew, after = _spread(controls, lambda: first.failed(RuntimeError("boom"), "step"), RemoteError, clock), delay
    elif name == "mismatch":
        error = CollectiveMismatchError({0: "in all_reduce #1", 1: "in broadcast #1"}, "different collectives")
        post = lambda: first.board.post_mismatch(0, error)  # noqa: E731
        knew, after = _spread(controls, post, CollectiveMismatchError, clock), delay
    elif name == "revoke":
        knew, after = _spread(controls, lambda: first.board.post_revoke(0), RevokedError, clock), delay
    elif name == "lost peer":
        knew, found, after = _lost(controls, processes, clock)
    elif survivors is not None:
        knew = survivors()
    elif name in ("refusal", "refused everywhere"):
        knew = _refuse(controls if name == "refused everywhere" else controls[:1], controls, clock)
    elif name == "refusals 10 s apart":
        seconds, knew = waits, _skewed_refusals(controls, waits, clock)
    elif name == "main_process_first":
        seconds, knew = waits, _main_first(controls, waits, clock)
    elif name == "cascade":  # each rank fails on its own (its own error, not an echo) and leaves
        leave = lambda c: c.closing(RuntimeError(f"rank {c.rank}: input file missing"), clock.now)  # noqa: E731
        knew = _waves(controls, leave, 2, clock)[0]
    elif name == "closing":  # every rank closes after the same operation, the later ones looking meanwhile
        knew, after = _closing(controls, clock)
    else:
        raise ValueError(f"no scenario {name!r}")
    requests, keys, sent, busy = (now - then for now, then in zip(counting.tally(), before, strict=True))
    served = busy if real else None
    result = Result(name, n, int(requests), seconds, knew, served, int(keys), int(sent), first.world.local_size)
    result.found_after, result.knew_after = found, after
    return result
