"""Time the implementations of a case, round robin, and check their results once.

Every rank runs the same calls in the same order. A repetition's time for a call is the slowest
rank's, since a collective is done only when every rank is done.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from communicator.bench.ops import Context, Impl, Op

__all__ = ["Call", "Timings", "time_case"]

Call = tuple[str, str]  # (op name, implementation name)

# Calls shorter than this are repeated back to back within one sample, so that a millisecond of
# scheduling jitter on a busy machine does not decide the median of a sub-millisecond op.
MIN_SAMPLE_SECONDS = 0.05
MAX_LOOPS = 50


@dataclasses.dataclass
class Timings:
    """Seconds per call and repetition (the slowest rank's), which results were right, which calls failed."""

    seconds: dict[Call, list[float]]
    correct: dict[Call, bool]
    errors: dict[Call, str]
    loops: dict[Call, int]  # calls per timed sample after the first


def _slowest(values: Sequence[float]) -> list[float]:
    """Each value's maximum over the ranks."""
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [float(v) for v in tensor.tolist()]


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


def _loops(first_seconds: float) -> int:
    """How many calls make one sample last about ``MIN_SAMPLE_SECONDS``."""
    return max(1, min(MAX_LOOPS, round(MIN_SAMPLE_SECONDS / max(first_seconds, 1e-6))))


def _checked_repetition(context: Context, ops: Sequence[Op], inputs: Mapping[str, Any]) -> Timings:
    """The first repetition: each result is compared with the op's first one, after the clock stops.

    The first implementation of each op is this library's; if it fails, the next one that runs is
    the reference.
    """
    seconds: dict[Call, float] = {}
    correct: dict[Call, bool] = {}
    errors: dict[Call, str] = {}
    for op in ops:
        reference: tuple[Any] | None = None  # a tuple: gathers rightly return None off the destination
        for name, impl in op.impls.items():
            result, seconds[op.name, name], error = _timed(impl, context, inputs[op.name])
            if error is not None:
                errors[op.name, name] = error
                correct[op.name, name] = False
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
    slowest = dict(zip(calls, _slowest([seconds[call] for call in calls]), strict=True))
    kept = [call for call in calls if call not in errors]
    return Timings(
        {call: [slowest[call]] for call in kept},
        dict(zip(calls, _on_every_rank([correct[call] for call in calls]), strict=True)),
        errors,
        {call: _loops(slowest[call]) for call in kept},  # the same on every rank: from the slowest times
    )


def time_case(context: Context, ops: Sequence[Op], inputs: Mapping[str, Any], repeat: int) -> Timings:
    """Run every implementation ``repeat`` times, round robin; check results in the first round.

    The starting point rotates each round, so no implementation always follows the same one.
    """
    timings = _checked_repetition(context, ops, inputs)
    calls = list(timings.seconds)
    if not calls:
        return timings
    impls = {(op.name, name): impl for op in ops for name, impl in op.impls.items()}
    for repetition in range(1, repeat):
        shift = repetition % len(calls)
        order = [*calls[shift:], *calls[:shift]]
        local = []
        for op_name, impl_name in order:
            loops = timings.loops[op_name, impl_name]
            result, elapsed, error = _timed(impls[op_name, impl_name], context, inputs[op_name], loops)
            if error is not None:
                raise RuntimeError(f"{op_name} ({impl_name}) failed after succeeding once: {error}")
            del result  # freed outside the timed region
            local.append(elapsed)
        for call, seconds in zip(order, _slowest(local), strict=True):
            timings.seconds[call].append(seconds)
    return timings
