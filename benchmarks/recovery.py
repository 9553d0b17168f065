"""``bench --cases recovery``: how long the survivors of a lost rank take to go on.

Each round starts ``world_size`` local gloo ranks with ``launch(..., on_failure="continue")``.
After a barrier every rank notes the time, and the last rank kills itself (SIGKILL) as the
others enter an ``all_reduce``. Each survivor notes when that call raised, when ``shrink()``
returned, and when the first ``all_reduce`` on the shrunk communicator finished, all counted
from the death. The comparison is what a restart costs at least: the time to start ``world_size
- 1`` ranks in fresh interpreters (``spawn``: torch imported anew, as a launcher's restart does)
and run their first ``all_reduce``, without reloading any state.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import statistics
import time
from collections.abc import Sequence

import torch

from communicator.base import Communicator
from communicator.errors import PeerLostError, RemoteError, RemoteFailure
from communicator.testing.spawn import launch

__all__ = ["Recovery", "format_table", "run"]

_CFG = {"backend": "gloo", "timeout": 120}


@dataclasses.dataclass(frozen=True)
class Recovery:
    """Medians over rounds of the slowest survivor, in seconds from the death."""

    world_size: int
    rounds: int
    detected: float
    shrunk: float
    first_collective: float
    fresh_start: float  # starting world_size - 1 new ranks up to their first all_reduce


def _lose_last(comm: Communicator) -> tuple[float, float, float] | None:
    comm.barrier()
    died = time.time()  # one host: every rank reads the same clock
    if comm.rank == comm.world_size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(torch.ones(1))
        return None
    except (PeerLostError, RemoteError):
        detected = time.time()
    shrunk = comm.shrink()
    done = time.time()
    shrunk.all_reduce(torch.ones(1))
    return detected - died, done - died, time.time() - died


def _first_all_reduce(comm: Communicator) -> None:
    comm.all_reduce(torch.ones(1))


def run(world_size: int, rounds: int, timeout: float) -> Recovery:
    """``rounds`` deaths and recoveries of ``world_size`` ranks, and as many fresh starts."""
    samples: list[tuple[float, float, float]] = []
    fresh: list[float] = []
    for _ in range(rounds):
        results = launch(_lose_last, world_size, _CFG, timeout=timeout, on_failure="continue")
        times = [r for r in results if r is not None and not isinstance(r, RemoteFailure)]
        if len(times) != world_size - 1:
            raise RuntimeError(f"expected {world_size - 1} survivors, got {results}")
        samples.append((max(t[0] for t in times), max(t[1] for t in times), max(t[2] for t in times)))
        started = time.perf_counter()
        launch(_first_all_reduce, world_size - 1, _CFG, timeout=timeout, start_method="spawn")
        fresh.append(time.perf_counter() - started)
    return Recovery(
        world_size,
        rounds,
        statistics.median(s[0] for s in samples),
        statistics.median(s[1] for s in samples),
        statistics.median(s[2] for s in samples),
        statistics.median(fresh),
    )


def format_table(results: Sequence[Recovery]) -> str:
    lines = [
        "| world size | rounds | lost rank known | shrink() returned | first all_reduce done "
        "| fresh start of the survivors' count | fresh / shrink |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.world_size} | {r.rounds} | {r.detected:.3f} s | {r.shrunk:.3f} s | {r.first_collective:.3f} s "
            f"| {r.fresh_start:.3f} s | {r.fresh_start / r.first_collective:.1f}x |"
        )
    return "\n".join(lines)
