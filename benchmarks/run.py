"""Start the ranks once and run every selected case inside them."""

from __future__ import annotations

import dataclasses
import functools
import gc
import pickle
import shutil
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.cases import CASES, Case
from benchmarks.measured import CaseRun
from benchmarks.ops import Context, Op, build_ops, load_mmengine
from benchmarks.payloads import Sizes
from benchmarks.phases import time_phases
from benchmarks.spread import Progress
from benchmarks.targets import straddling
from benchmarks.timing import time_case
from communicator.base import Communicator
from communicator.testing.spawn import launch

__all__ = ["Plan", "run_benchmark"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to run: the cases, how big, how often, on how many ranks."""

    world_size: int
    repeat: int
    cases: tuple[str, ...]
    sizes: Sizes
    min_sample_seconds: float  # shorter calls are repeated within a sample
    stats: bool = False  # this library's communicator gathers statistics (``comm.stats()``)
    max_repeat: int = 0  # the calls of targets within noise run up to this many rounds (0: no more)


def _progress(message: str) -> None:
    if dist.get_rank() == 0:
        print(f"[bench] {message}", file=sys.stderr, flush=True)


def _pickled_lengths(payload: Any) -> list[int]:
    own = torch.tensor([len(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))], dtype=torch.int64)
    everyone = [torch.empty_like(own) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, own)
    return [int(t.item()) for t in everyone]


def _run_case(context: Context, ops: dict[str, Op], case: Case, plan: Plan) -> CaseRun:
    payload = case.build(dist.get_rank(), dist.get_world_size(), plan.sizes)
    lengths = _pickled_lengths(payload)
    selected = [ops[name] for name in case.ops]
    inputs = {(op.name, impl): op.input_for(impl, payload, lengths) for op in selected for impl in op.impls}
    calls = sum(len(op.impls) for op in selected)
    _progress(
        f"{case.name}: {case.describe}, {max(lengths) / 2**20:.2f} MiB per rank at most; "
        f"{calls} calls, checked once, then {plan.repeat} timed rounds"
        + (f" (up to {plan.max_repeat} where a target is within noise)" if plan.max_repeat > plan.repeat else "")
    )
    progress = Progress(f"{case.name}, world size {dist.get_world_size()}: ", enabled=dist.get_rank() == 0)
    timings = time_case(
        context,
        selected,
        inputs,
        plan.repeat,
        plan.min_sample_seconds,
        more=functools.partial(straddling, case.name) if plan.max_repeat > plan.repeat else None,
        max_repeat=plan.max_repeat,
        progress=functools.partial(progress.say, force=True),  # a round of a case takes seconds: say each
    )
    phases = []
    if case.phases:
        _progress(f"{case.name}: serialise, transfer and deserialise apart, {plan.repeat} rounds")
        payloads = [case.build(rank, dist.get_world_size(), plan.sizes) for rank in range(dist.get_world_size())]
        phases = time_phases(context, selected, inputs, payloads, plan.repeat, timings.loops)
    return CaseRun(case.name, case.describe, lengths, timings, phases)


def _bench_rank(comm: Communicator, plan: Plan, scratch: str) -> tuple[list[CaseRun], str | None] | None:
    ops = build_ops(load_mmengine())
    runs = []
    with Communicator.create({"backend": "gloo", "serializer": "safe"}) as safe:
        context = Context(comm, safe, scratch)
        for case in CASES:
            if case.name in plan.cases:
                runs.append(_run_case(context, ops, case, plan))
                gc.collect()  # the last case's payloads and results go before the next is built
    return (runs, comm.stats().table() if plan.stats else None) if comm.rank == 0 else None


def run_benchmark(plan: Plan, timeout: float) -> tuple[list[CaseRun], str | None]:
    """Run the plan on ``plan.world_size`` local gloo ranks: rank 0's report of every case, and its
    statistics table when the plan asks for statistics."""
    scratch = tempfile.mkdtemp(prefix="communicator-bench-")
    try:
        config = {"backend": "gloo", "stats": plan.stats}
        results = launch(_bench_rank, plan.world_size, config, (plan, scratch), timeout=timeout)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report: tuple[list[CaseRun], str | None] = results[0]
    return report
