"""The ``overhead`` case: what one small call costs, ours against ``torch.distributed``'s and its
wrappers' (``mmengine.dist``, ``ignite.distributed``), in one run.

On every rank, for each operation and each peer, blocks of ``calls`` calls (1,000 by default)
alternate between this library and the peer (which one goes first alternates with the round),
after a warm-up; a block's time per call is the slowest rank's (the ranks' times are reduced after
the clock stops), and a row reports the medians over the rounds and the median of the rounds'
ratios ours/theirs with its confidence interval (:mod:`.spread`), judged against the target.
While the interval straddles the target, more rounds run, up to a cap: every rank holds the same
reduced times, so every rank decides the same. A peer that is not installed, or fails, gives a
row of n/a. Two more rows price the observation machinery: the same one-element ``all_reduce`` on
a communicator that gathers statistics (``stats=True``) against one that does not, and what
recording one call costs (the event, the flight recorder, the checks for hooks, statistics and
the profiler), timed in-process without communication.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import statistics
import time
import timeit
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.aligned import aligned
from benchmarks.ops import MMENGINE, TORCH, load_mmengine
from benchmarks.scaling import oversubscribed
from benchmarks.spread import CONFIDENCE, MIN_ROUNDS, NOT_JUDGED, WITHIN_NOISE, Progress, Spread, judge, spread_of
from communicator.base import Communicator
from communicator.guard import CallState
from communicator.testing.spawn import launch

__all__ = ["CALLS", "IGNITE", "RECORDING_TARGET_US", "OverheadRow", "Recording", "format_overhead", "run_overhead"]

CALLS = 1000  # calls per timed block: a call's cost averaged over many, rounds alternating to share the noise
WARMUP = 50
RECORDING_CALLS = 20_000  # per timed run: short runs, so that the noise shows as spread between them
RECORDING_RUNS = 7
RECORDING_TARGET_US = 1.0
IGNITE = "ignite"
OFF = "ours, off"
PACKAGES = {MMENGINE: "mmengine", IGNITE: "pytorch-ignite"}  # what pip installs, per peer


@dataclasses.dataclass(frozen=True)
class OverheadRow:
    """One comparison: medians in microseconds per call; ``spread``, the median over the rounds of
    ours over theirs in the same round (adjacent blocks share the machine's state) and its interval;
    the target. Without a baseline (``missing`` says why) the times and the spread are ``None``."""

    name: str
    baseline: str
    baseline_us: float | None
    ours_us: float | None
    spread: Spread | None
    target: float | None
    missing: str | None = None
    judged: bool = True  # False in a --quick run

    @property
    def ratio(self) -> float | None:
        return None if self.spread is None else self.spread.median

    @property
    def verdict(self) -> str | None:
        """``met``, ``missed``, ``within noise``, ``not judged``, ``n/a`` without a baseline, or
        ``None`` without a target."""
        if self.spread is None:
            return "n/a"
        if self.target is None:
            return None
        return judge(self.spread, at_most=self.target) if self.judged else NOT_JUDGED


@dataclasses.dataclass(frozen=True)
class Recording:
    """Microseconds to record one call, over timed runs; the target is below ``RECORDING_TARGET_US``."""

    spread: Spread
    judged: bool = True  # False in a --quick run

    @property
    def verdict(self) -> str:
        return judge(self.spread, at_most=RECORDING_TARGET_US) if self.judged else NOT_JUDGED


def load_ignite() -> ModuleType | None:
    """``ignite.distributed`` when it is installed, synchronised once with the process group that
    exists now (so its calls go to it, not to a world of one)."""
    try:
        idist = importlib.import_module("ignite.distributed")
    except ImportError:
        return None
    idist.sync()
    return idist


def _block(fn: Callable[[], Any], calls: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    mine = torch.tensor([(time.perf_counter() - start) / calls])
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank's, after the clock stopped
    return float(mine.item()) * 1e6


def _failure(fn: Callable[[], Any]) -> str | None:
    """Why one call of a peer failed on some rank, agreed on every rank; ``None`` when it ran everywhere."""
    try:
        fn()
        error = None
    except Exception as failed:  # noqa: BLE001 - reported as n/a with the reason, as the cases report a peer
        error = f"{type(failed).__name__}: {failed}".splitlines()[0]
    anywhere = torch.tensor([0.0 if error is None else 1.0])
    dist.all_reduce(anywhere, op=dist.ReduceOp.MAX)
    return error or ("failed on another rank" if anywhere.item() else None)


def _more(planned: int, rounds: int, cap: int) -> int:
    """The next number of rounds: half as many again (at least enough for an interval), up to the cap."""
    return min(cap, planned + max(rounds // 2, MIN_ROUNDS))


def _compare(
    rounds: int,
    cap: int,
    calls: int,
    theirs: Callable[[], Any],
    ours: Callable[[], Any],
    target: float | None,
    progress: Progress,
) -> tuple[float, float, Spread]:
    """(their median, our median, the rounds' ratios), in microseconds per call."""
    for fn in (theirs, ours):
        for _ in range(WARMUP):
            fn()
    times: tuple[list[float], list[float]] = ([], [])
    planned = rounds
    while True:
        for round_ in range(len(times[0]), planned):
            order = ((0, theirs), (1, ours)) if round_ % 2 == 0 else ((1, ours), (0, theirs))
            for index, fn in order:
                times[index].append(_block(fn, calls))
            progress.say(f"round {round_ + 1} of {planned}", force=round_ + 1 == planned)
        spread = spread_of([mine / base for base, mine in zip(*times, strict=True)])
        if target is None or planned >= cap or judge(spread, at_most=target) != WITHIN_NOISE:
            return statistics.median(times[0]), statistics.median(times[1]), spread
        planned = _more(planned, rounds, cap)
        progress.say(f"{spread.text()} straddles {target:.2f}: up to {planned} rounds", force=True)


def _recording(comm: Communicator, cap: int, progress: Progress) -> Spread:
    """Microseconds to record one call with nothing observing, per timed run."""
    calls = CallState(comm.config.trace_events)
    spec, args = Communicator._specs["all_reduce"], (torch.ones(1),)
    # As the guard does; compiled by timeit outside this package, so the call's site is found at
    # once, as it is for a call from user code.
    timer = timeit.Timer("calls.end(calls.start(spec, comm, args, {}), None)", globals=locals())
    runs: list[float] = []
    planned = RECORDING_RUNS
    while True:
        runs += [t / RECORDING_CALLS * 1e6 for t in timer.repeat(number=RECORDING_CALLS, repeat=planned - len(runs))]
        spread = spread_of(runs)
        if planned >= cap or judge(spread, at_most=RECORDING_TARGET_US) != WITHIN_NOISE:
            return spread
        planned = _more(planned, RECORDING_RUNS, cap)
        progress.say(f"recording one call: {spread.text(' us')} straddles 1 us: up to {planned} runs", force=True)


def _overhead_rank(comm: Communicator, rounds: int, cap: int, calls: int) -> tuple[list[OverheadRow], Recording]:
    one = torch.zeros(1)  # reduced in place again and again: zeros stay finite (ones would reach inf)
    outputs = [torch.empty(1) for _ in range(comm.world_size)]
    mm, idist = load_mmengine(), load_ignite()

    def progress(name: str, baseline: str | None = None) -> Progress:
        against = "" if baseline is None else f" ({baseline})"
        return Progress(f"overhead, world size {comm.world_size}: {name}{against}: ", enabled=comm.rank == 0)

    def all_reduce() -> None:
        comm.all_reduce(one)

    def broadcast() -> None:
        comm.broadcast(one, 0)

    # (operation, baseline, their call or None where the peer is not installed, ours, target)
    pairs: list[tuple[str, str, Callable[[], Any] | None, Callable[[], Any], float | None]] = [
        ("all_reduce, 1 element", TORCH, lambda: dist.all_reduce(one), all_reduce, 1.05),
        ("all_reduce, 1 element", MMENGINE, None if mm is None else lambda: mm.all_reduce(one), all_reduce, 1.0),
        ("all_reduce, 1 element", IGNITE, None if idist is None else lambda: idist.all_reduce(one), all_reduce, 1.0),
        ("broadcast, 1 element", TORCH, lambda: dist.broadcast(one, 0), broadcast, 1.05),
        ("broadcast, 1 element", MMENGINE, None if mm is None else lambda: mm.broadcast(one, 0), broadcast, 1.0),
        (
            "broadcast, 1 element",
            IGNITE,
            None if idist is None else lambda: idist.broadcast(one, src=0),
            broadcast,
            1.0,
        ),
        ("barrier", TORCH, dist.barrier, comm.barrier, 1.10),
        (
            "all_gather, 1 element, same_shape=True",
            TORCH,
            lambda: dist.all_gather(outputs, one),
            lambda: comm.all_gather(one, same_shape=True),
            1.20,
        ),
        (
            "all_gather, 1 element, shapes may differ",
            TORCH,
            lambda: dist.all_gather(outputs, one),
            lambda: comm.all_gather(one),
            None,
        ),
    ]
    rows = []
    for name, baseline, theirs, ours, target in pairs:
        missing = f"not installed (pip install {PACKAGES[baseline]})" if theirs is None else _failure(theirs)
        if theirs is None or missing is not None:
            rows.append(OverheadRow(name, baseline, None, None, None, target, missing))
        else:
            compared = _compare(rounds, cap, calls, theirs, ours, target, progress(name, baseline))
            rows.append(OverheadRow(name, baseline, *compared, target))
    # Last, since a communicator gathering statistics makes every call in the process look for observers.
    with Communicator.create({"backend": "gloo", "stats": True}) as counted:  # the same group, adopted
        name = "all_reduce, 1 element, statistics on"
        compared = _compare(rounds, cap, calls, all_reduce, lambda: counted.all_reduce(one), 1.05, progress(name, OFF))
        rows.append(OverheadRow(name, OFF, *compared, 1.05))
    recording = None
    if comm.rank == 0:  # the other ranks wait, off the cores
        recording = _recording(comm, max(RECORDING_RUNS, cap * RECORDING_RUNS // rounds), progress("recording"))
    comm.barrier()
    return rows, Recording(recording or spread_of([0.0]))


def run_overhead(
    world_size: int, rounds: int, cap: int, timeout: float, calls: int = CALLS
) -> tuple[list[OverheadRow], Recording]:
    """The rows (the slowest rank's medians of blocks of ``calls`` calls; up to ``cap`` rounds where
    a ratio straddles its target) and the recording cost measured on rank 0."""
    config = {"backend": "gloo"}
    results = launch(_overhead_rank, world_size, config, (rounds, max(cap, rounds), calls), timeout=timeout)
    rows, recording = results[0]
    return rows, recording


def _load() -> str:
    try:
        return f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:  # not every platform has one
        return ""


def _cells(row: OverheadRow) -> tuple[str, str, str, str]:
    if row.spread is None or row.baseline_us is None or row.ours_us is None:
        return "n/a", "n/a", "n/a", "n/a"
    return f"{row.baseline_us:.1f}", f"{row.ours_us:.1f}", row.spread.text(digits=3), str(row.spread.rounds)


def format_overhead(rows: Sequence[OverheadRow], recording: Recording, world_size: int, calls: int = CALLS) -> str:
    """The table: each ratio with its interval, and a verdict only where the interval allows one."""
    header = ("operation", "against", "theirs", "ours", "ratio [interval]", "rounds", "target", "verdict")
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        target = "-" if row.target is None else f"<= {row.target:.2f}"
        lines.append((row.name, row.baseline, *_cells(row), target, row.verdict or ""))
    table = aligned(lines, left=(0, 1, len(header) - 1))
    missing = "".join(f"\nn/a: {row.name} against {row.baseline}: {row.missing}" for row in rows if row.missing)
    spread, crowded = recording.spread, oversubscribed(world_size)
    return (
        f"overhead: world size {world_size}{', ' + crowded if crowded else ''}, rounds of {calls} calls,"
        f" slowest rank per round{_load()}\n"
        f"{table}{missing}\n"
        f"recording a call, no hooks or statistics: {spread.text(' us')} (median of {spread.rounds} runs of"
        f" {RECORDING_CALLS}), target < {RECORDING_TARGET_US:g} us: {recording.verdict}\n"
        "theirs, ours: microseconds per call, the median of the rounds; ratio: ours/theirs, the median of the rounds'\n"
        "ratios (each round: ours over theirs in adjacent blocks), not the ratio of the medians beside it;\n"
        f"[interval]: {CONFIDENCE * 100:.0f} % confidence interval of that median\n"
        + (
            "a verdict only where the interval lies on one side of the target, else 'within noise'"
            if recording.judged
            else f"verdicts: {NOT_JUDGED} (a --quick run is a smoke test)"
        )
    )
