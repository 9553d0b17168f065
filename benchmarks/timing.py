"""Check the implementations of a case once, then time them round robin.

Every rank runs the same calls in the same order. A round's time for a call is the slowest
rank's, since a collective is done only when every rank is done. The checking pass also measures
each call's peak resident memory on every rank (:mod:`.memory`).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.memory import peak_growth_since, peak_growth_start
from benchmarks.ops import Context, Impl, Op
from benchmarks.spread import MIN_ROUNDS

__all__ = ["Call", "Timings", "time_case"]

Call = tuple[str, str]  # (op name, implementation name)

MAX_LOOPS = 100


@dataclasses.dataclass
class Timings:
    """Seconds per call and round (the slowest rank's), which results were right, which calls failed."""

    seconds: dict[Call, list[float]]
    correct: dict[Call, bool]
    errors: dict[Call, str]
    loops: dict[Call, int]  # calls per timed sample
    peak_bytes: dict[Call, list[int]]  # per rank: how far the resident set grew during the checked call


def _slowest(values: Sequence[float]) -> list[float]:
    """Each value's maximum over the ranks."""
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [float(v) for v in tensor.tolist()]


def _per_rank(values: Sequence[int]) -> list[list[int]]:
    """Each value as every rank has it: ``[call][rank]``."""
    mine = torch.tensor(values, dtype=torch.int64)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [[int(rank[i]) for rank in everyone] for i in range(len(values))]


def _on_every_rank(flags: Sequence[bool]) -> list[bool]:
    """True where the flag is true on all ranks."""
    return [value == 0 for value in _slowest([0.0 if flag else 1.0 for flag in flags])]


def _timed(impl: Impl, context: Context, data: Any, loops: int = 1) -> tuple[Any, float, str | None]:
    """(last result, seconds per call, error); a failing peer library is a finding to report, not a crash."""
    dist.barrier()
    start = time.perf_counter()
    try:
        for _ in range(loops):
            result = impl(context, data)
    except Exception as error:  # noqa: BLE001 - reported in the table as n/a with the reason
        return None, 0.0, f"{type(error).__name__}: {error}".splitlines()[0]
    return result, (time.perf_counter() - start) / loops, None


def _loops(first_seconds: float, min_sample_seconds: float) -> int:
    """How many calls make one sample last about ``min_sample_seconds``."""
    return max(1, min(MAX_LOOPS, round(min_sample_seconds / max(first_seconds, 1e-6))))


def _check_once(
    context: Context, ops: Sequence[Op], inputs: Mapping[Call, Any]
) -> tuple[dict[Call, bool], dict[Call, str], dict[Call, float], dict[Call, list[int]]]:
    """Run every call once, untimed for the report: (right on every rank, why failed, slowest
    seconds, peak memory growth per rank).

    Each result is compared with the op's first one after the clock stops; the first is this
    library's, or if it failed, the next that ran (an implementation with a check of its own, the
    floor, is checked by it instead). The pass also warms every path up, and its times only size
    the later samples.
    """
    seconds: dict[Call, float] = {}
    correct: dict[Call, bool] = {}
    errors: dict[Call, str] = {}
    peaks: dict[Call, int] = {}
    for op in ops:
        reference: tuple[Any] | None = None  # a tuple: gathers rightly return None off the destination
        for name, impl in op.impls.items():
            start = peak_growth_start()
            result, seconds[op.name, name], error = _timed(impl, context, inputs[op.name, name])
            peaks[op.name, name] = peak_growth_since(start)
            if error is not None:
                errors[op.name, name] = error
                correct[op.name, name] = False
            elif name in op.own_checks:
                correct[op.name, name] = op.own_checks[name](result)
            elif reference is None:
                reference = (result,)
                correct[op.name, name] = True
            else:
                correct[op.name, name] = op.same(reference[0], result)
            del result
        del reference
    calls = list(seconds)
    for call, ran_everywhere in zip(calls, _on_every_rank([call not in errors for call in calls]), strict=True):
        if not ran_everywhere:
            errors.setdefault(call, "failed on another rank")
    agreed = dict(zip(calls, _on_every_rank([correct[call] for call in calls]), strict=True))
    slowest = dict(zip(calls, _slowest([seconds[call] for call in calls]), strict=True))
    return agreed, errors, slowest, dict(zip(calls, _per_rank([peaks[call] for call in calls]), strict=True))


def _no_progress(message: str) -> None:
    pass


def time_case(
    context: Context,
    ops: Sequence[Op],
    inputs: Mapping[Call, Any],
    repeat: int,
    min_sample_seconds: float,
    more: Callable[[Mapping[Call, list[float]]], set[Call]] | None = None,
    max_repeat: int = 0,
    progress: Callable[[str], None] = _no_progress,
) -> Timings:
    """Check every call once, then time each ``repeat`` times, round robin.

    After those rounds, while ``more`` names calls whose verdict is still open, those calls run
    more rounds, up to ``max_repeat`` in all. Every rank holds the same (reduced) times, so every
    rank asks for the same calls.

    A call shorter than ``min_sample_seconds`` runs back to back within each sample, so that a few
    milliseconds of scheduling jitter on a busy machine do not decide the median of a short op.

    Every round runs the calls in a fresh random order, the same on every rank, so no
    implementation always follows the same one (the one before can leave the allocator or the
    sockets warm or cold).
    """
    correct, errors, first, peaks = _check_once(context, ops, inputs)
    calls = [call for call in first if call not in errors]
    loops = {call: _loops(first[call], min_sample_seconds) for call in calls}
    seconds: dict[Call, list[float]] = {call: [] for call in calls}
    impls = {(op.name, name): impl for op in ops for name, impl in op.impls.items()}
    rounds = random.Random(0)  # the same seed, so the same orders, on every rank
    planned, active, start_at = repeat, calls, 1
    while True:
        for done in range(start_at, planned + 1):
            order = rounds.sample(active, len(active))
            local = []
            for call in order:
                result, elapsed, error = _timed(impls[call], context, inputs[call], loops[call])
                if error is not None:
                    raise RuntimeError(f"{call[0]} ({call[1]}) failed after succeeding once: {error}")
                del result  # freed outside the timed region
                local.append(elapsed)
            for call, slowest in zip(order, _slowest(local), strict=True):
                seconds[call].append(slowest)
            progress(f"round {done} of {planned}" + ("" if active is calls else f" ({len(active)} calls)"))
        wanted = set() if more is None or planned >= max_repeat else more(seconds)
        active = [call for call in calls if call in wanted]
        if not active:
            return Timings(seconds, correct, errors, loops, peaks)
        start_at = planned + 1
        # Enough rounds for an interval first, then half as many again each time, up to the cap.
        planned = min(max_repeat, max(MIN_ROUNDS, planned + max(1, repeat // 2)))
        progress(f"{len(active)} calls of targets within noise: up to {planned} rounds")
