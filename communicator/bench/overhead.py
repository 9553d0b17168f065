"""The ``overhead`` case: what one small call costs, ours against ``torch.distributed``'s, in one run.

On every rank, for each operation, blocks of ``CALLS`` calls alternate between this library and
torch (which one goes first alternates with the round), after a warm-up; a block's time per
call is the slowest rank's (the ranks' times are reduced after the clock stops), and a row reports
the median over the rounds and the ratio ours/torch, judged against the target. Two more rows
price the observation machinery: the same one-element ``all_reduce`` on a communicator that
gathers statistics (``stats=True``) against one that does not, and what recording one call costs (the event, the flight
recorder, the checks for hooks, statistics and the profiler), timed in-process without
communication.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import timeit
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from communicator.base import Communicator
from communicator.guard import CallState
from communicator.spawn import launch

__all__ = ["OverheadRow", "format_overhead", "run_overhead"]

CALLS = 20  # calls per timed block: short blocks, alternating often, share the machine's noise
WARMUP = 50
RECORDING_CALLS = 100_000


@dataclasses.dataclass(frozen=True)
class OverheadRow:
    """One comparison: medians in microseconds per call; ``ratio``, the median over the rounds of
    ours over theirs in the same round (adjacent blocks share the machine's state); the target."""

    name: str
    baseline: str
    baseline_us: float
    ours_us: float
    ratio: float
    target: float | None

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.ratio <= self.target


def _block(fn: Callable[[], Any]) -> float:
    dist.barrier()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    mine = torch.tensor([(time.perf_counter() - start) / CALLS])
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank's, after the clock stopped
    return float(mine.item()) * 1e6


def _compare(rounds: int, theirs: Callable[[], Any], ours: Callable[[], Any]) -> tuple[float, float, float]:
    """(their median, our median, the median of the rounds' ratios), in microseconds per call."""
    for fn in (theirs, ours):
        for _ in range(WARMUP):
            fn()
    times: tuple[list[float], list[float]] = ([], [])
    for round_ in range(rounds):
        order = ((0, theirs), (1, ours)) if round_ % 2 == 0 else ((1, ours), (0, theirs))
        for index, fn in order:
            times[index].append(_block(fn))
    ratios = [mine / base for base, mine in zip(*times, strict=True)]
    return statistics.median(times[0]), statistics.median(times[1]), statistics.median(ratios)


def _recording_us(comm: Communicator) -> float:
    """Microseconds to record one call with nothing observing (best of five runs)."""
    calls = CallState(comm.config.trace_events)
    spec, args = Communicator._specs["all_reduce"], (torch.ones(1),)
    # As the guard does; compiled by timeit outside this package, so the call's site is found at
    # once, as it is for a call from user code.
    timer = timeit.Timer("calls.end(calls.start(spec, comm, args, {}), None)", globals=locals())
    return min(timer.repeat(number=RECORDING_CALLS, repeat=5)) / RECORDING_CALLS * 1e6


def _overhead_rank(comm: Communicator, rounds: int) -> tuple[list[OverheadRow], float]:
    one = torch.ones(1)
    outputs = [torch.empty(1) for _ in range(comm.world_size)]

    pairs: list[tuple[str, str, Callable[[], Any], Callable[[], Any], float | None]] = [
        ("all_reduce, 1 element", "torch", lambda: dist.all_reduce(one), lambda: comm.all_reduce(one), 1.10),
        ("broadcast, 1 element", "torch", lambda: dist.broadcast(one, 0), lambda: comm.broadcast(one, 0), 1.10),
        ("barrier", "torch", dist.barrier, comm.barrier, 1.10),
        (
            "all_gather, 1 element, same_shape=True",
            "torch",
            lambda: dist.all_gather(outputs, one),
            lambda: comm.all_gather(one, same_shape=True),
            1.20,
        ),
        (
            "all_gather, 1 element, shapes may differ",
            "torch",
            lambda: dist.all_gather(outputs, one),
            lambda: comm.all_gather(one),
            None,
        ),
    ]
    rows = [
        OverheadRow(name, baseline, *_compare(rounds, theirs, ours), target)
        for name, baseline, theirs, ours, target in pairs
    ]
    # Last, since a communicator gathering statistics makes every call in the process look for observers.
    with Communicator.create({"backend": "gloo", "stats": True}) as counted:  # the same group, adopted
        compared = _compare(rounds, lambda: comm.all_reduce(one), lambda: counted.all_reduce(one))
        rows.append(OverheadRow("all_reduce, 1 element, statistics on", "ours, off", *compared, 1.05))
    recording = _recording_us(comm) if comm.rank == 0 else 0.0  # the other ranks wait, off the cores
    comm.barrier()
    return rows, recording


def run_overhead(world_size: int, rounds: int, timeout: float) -> tuple[list[OverheadRow], float]:
    """The rows (the slowest rank's medians) and the recording cost measured on rank 0."""
    results = launch(_overhead_rank, world_size, {"backend": "gloo"}, (rounds,), timeout=timeout)
    rows, recording = results[0]
    return rows, recording


def format_overhead(
    rows: Sequence[OverheadRow], recording_us: float, world_size: int, rounds: int, judged: bool = True
) -> str:
    """The table; ``judged=False`` (a smoke test's few rounds) leaves the targets unjudged."""
    header = ("operation", "against", "theirs us", "ours us", "ours/theirs", "target", "")
    lines = [header]
    for row in rows:
        target = "-" if row.target is None else f"<= {row.target:.2f}"
        verdict = "" if row.met is None or not judged else ("met" if row.met else "MISSED")
        lines.append(
            (
                row.name,
                row.baseline,
                f"{row.baseline_us:.1f}",
                f"{row.ours_us:.1f}",
                f"{row.ratio:.3f}",
                target,
                verdict,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    table = "\n".join(
        "  ".join(cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i]) for i, cell in enumerate(line)).rstrip()
        for line in lines
    )
    verdict = ("met" if recording_us < 1.0 else "MISSED") if judged else "not judged"
    return (
        f"overhead: world size {world_size}, median of {rounds} rounds of {CALLS} calls, slowest rank per round\n"
        f"{table}\n"
        f"recording one call (no hooks, statistics off): {recording_us:.2f} us, target < 1 us: {verdict}"
        + ("" if judged else "\ntargets: not judged in a --quick run (a few rounds are noise)")
    )
