"""Where an object op's time goes: serialising, moving the bytes, deserialising.

After a case's timed rounds, its object ops run ``repeat`` more rounds: a barrier, then as many
calls back to back as the case's samples took, on every rank. This library's phases come from
its own accounting: the calls go to a communicator that gathers statistics over the same group,
whose ``stats()`` sum each call's ``serialize`` and ``deserialize`` seconds (see
:class:`~communicator.observe.events.Event`). torch and mmengine do not account for theirs, so
each rank times what they do with ``pickle`` on the same payloads, apart from the call: torch's
object collectives pickle each sender's object, move sizes and padded bytes, then unpickle every
object a rank receives (its own included); mmengine's go through torch's, but its
``collect_results`` pickles to files (protocol 2) that the destination loads. The transfer is
what remains: total - serialise - deserialise, which holds the waiting and the work around the
bytes (padding, copies, checks).

Each phase is the slowest rank's in its round (the ranks that serialise are not those that
deserialise), the median over the rounds.
"""

from __future__ import annotations

import dataclasses
import pickle
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.aligned import aligned
from benchmarks.cases import LIST_OPS
from benchmarks.floor import DST, SRC
from benchmarks.ops import MMENGINE, MMENGINE_GPU, OURS, TORCH, Context, Op
from benchmarks.timing import Call
from communicator.base import Communicator

__all__ = ["PHASED", "Phases", "format_phases", "time_phases"]

#: The implementations split into phases, in the order the table shows them.
PHASED = (OURS, TORCH, MMENGINE, MMENGINE_GPU)
LABELS = {MMENGINE: "mmengine (tmpdir)", MMENGINE_GPU: "mmengine (gpu)"}  # collect_results' two modes


@dataclasses.dataclass(frozen=True)
class Phases:
    """One call's phases in milliseconds: each the slowest rank's, the median over ``rounds``."""

    op: str
    impl: str
    serialise_ms: float
    deserialise_ms: float
    total_ms: float
    rounds: int

    @property
    def transfer_ms(self) -> float:
        """What remains of the total (0 where timing the pickling apart from the call exceeds it)."""
        return max(0.0, self.total_ms - self.serialise_ms - self.deserialise_ms)


def _pickles(op: str, rank: int) -> bool:
    """Whether a peer pickles this rank's own object for the op."""
    return op != "broadcast_object" or rank == SRC


def _unpickles(op: str, impl: str, rank: int, world: int) -> list[int]:
    """The ranks whose objects a peer unpickles on this rank."""
    if op == "broadcast_object":
        return [] if rank == SRC else [SRC]
    if op == "all_gather_object" or impl == MMENGINE_GPU:  # the gpu mode is an all_gather_object
        return list(range(world))
    return list(range(world)) if rank == DST else []  # gather_object, collect_results to the destination


def _protocol(op: str, impl: str) -> int:
    return 2 if (op, impl) == ("collect_results", MMENGINE) else pickle.DEFAULT_PROTOCOL


def _pickling(op: str, impl: str, payloads: Sequence[Any]) -> Callable[[int], tuple[float, float]]:
    """What a peer's pickling costs on this rank: (serialise, deserialise) seconds per call, timed
    over as many calls as asked when called."""
    rank, protocol = dist.get_rank(), _protocol(op, impl)
    own, frames = payloads[rank], [pickle.dumps(payload, protocol=protocol) for payload in payloads]
    decoded = [frames[sender] for sender in _unpickles(op, impl, rank, len(payloads))]
    encodes = _pickles(op, rank)

    def timed(loops: int) -> tuple[float, float]:
        start = time.perf_counter()
        for _ in range(loops if encodes else 0):
            pickle.dumps(own, protocol=protocol)
        middle = time.perf_counter()
        for _ in range(loops):
            for frame in decoded:
                pickle.loads(frame)
        return (middle - start) / loops, (time.perf_counter() - middle) / loops

    return timed


def _sample(impl: Callable[[Context, Any], Any], context: Context, data: Any, loops: int) -> float:
    """Seconds per call, over ``loops`` calls back to back (as the case's samples were timed)."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(loops):
        impl(context, data)
    return (time.perf_counter() - start) / loops


def _accounted(comm: Communicator, op: str) -> tuple[float, float]:
    """The seconds ``comm`` has spent serialising and deserialising in ``op``, every call so far."""
    row = comm.stats()[op]
    return row.serialize, row.deserialize


def time_phases(
    context: Context,
    ops: Sequence[Op],
    inputs: Mapping[Call, Any],
    payloads: Sequence[Any],
    repeat: int,
    loops: Mapping[Call, int],
) -> list[Phases]:
    """The phases of every object op per implementation of :data:`PHASED` that ran in the case
    (those in ``loops``, each sample that many calls); ``payloads``: every rank's, as each built
    its own. Run on every rank alike."""
    calls = [(op, impl) for op in ops if op.name in LIST_OPS for impl in PHASED if (op.name, impl) in loops]
    pickling = {(op.name, impl): _pickling(op.name, impl, payloads) for op, impl in calls if impl != OURS}
    samples: list[list[tuple[float, float, float]]] = [[] for _ in calls]  # per call: (total, ser, deser)
    with Communicator.create({"backend": "gloo", "stats": True}) as counted:  # the same group, adopted
        accounted = dataclasses.replace(context, comm=counted)
        for op, impl in calls:  # once untimed: the new communicator's first calls set up what later ones reuse
            _sample(op.impls[impl], accounted if impl == OURS else context, inputs[op.name, impl], 1)
        for round_ in range(repeat):
            local = []
            for index in range(len(calls)):  # each round starts one call later: none always follows another
                op, impl = calls[(index + round_) % len(calls)]
                count = loops[op.name, impl]
                if impl == OURS:
                    before = _accounted(counted, op.name)
                    total = _sample(op.impls[impl], accounted, inputs[op.name, impl], count)
                    after = _accounted(counted, op.name)
                    local.append((total, (after[0] - before[0]) / count, (after[1] - before[1]) / count))
                else:
                    total = _sample(op.impls[impl], context, inputs[op.name, impl], count)
                    local.append((total, *pickling[op.name, impl](count)))
            slowest = torch.tensor(local, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # each phase the slowest rank's
            for index, values in enumerate(slowest.tolist()):
                samples[(index + round_) % len(calls)].append((values[0], values[1], values[2]))
    return [
        Phases(
            op.name,
            impl,
            statistics.median(s[1] for s in rounds) * 1000,
            statistics.median(s[2] for s in rounds) * 1000,
            statistics.median(s[0] for s in rounds) * 1000,
            len(rounds),
        )
        for (op, impl), rounds in zip(calls, samples, strict=True)
    ]


def format_phases(case: str, phases: Sequence[Phases], world_size: int) -> str:
    """The table, after a case's: op, implementation, each phase and the total, in milliseconds."""
    header = ["op", "impl", "serialise ms", "transfer ms", "deserialise ms", "total ms"]
    rows = [header]
    for row in phases:
        label = LABELS.get(row.impl, row.impl) if row.op == "collect_results" else row.impl
        numbers = (row.serialise_ms, row.transfer_ms, row.deserialise_ms, row.total_ms)
        rows.append([row.op, label, *(f"{value:.3f}" for value in numbers)])
    rounds = phases[0].rounds if phases else 0
    return (
        f"{case}, phases, world size {world_size}: each phase the slowest rank's, median of {rounds} rounds\n"
        f"{aligned(rows)}\n"
        "ours: its own accounting (stats=True); torch, mmengine: pickle.dumps/loads of the same payloads timed\n"
        "on each rank apart from the call; transfer = total - serialise - deserialise"
    )
