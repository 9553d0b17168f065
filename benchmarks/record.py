"""The JSON record of a run: per world size, every median, raw time, ratio, cost per byte, check
and target."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Sequence
from typing import Any

import torch

from benchmarks.floor import FLOOR, FLOOR_FRESH
from benchmarks.measured import CaseRun, all_correct
from benchmarks.ops import IMPLS, OURS
from benchmarks.scaling import bytes_moved, oversubscribed, us_per_mib
from benchmarks.targets import RAW, Outcome, evaluate

__all__ = ["call_record", "cases_record", "environment", "targets_record", "world_record"]


def call_record(run: CaseRun, op: str, impl: str) -> dict[str, Any]:
    """One call's medians, raw times, check and peak memory (or why it failed)."""
    call = (op, impl)
    if call in run.timings.errors:
        return {"error": run.timings.errors[call], "correct": False}
    record = {
        "median_ms": run.median_ms(call),
        "times_ms": [t * 1000 for t in run.timings.seconds[call]],
        "loops": run.timings.loops[call],
        "correct": run.timings.correct[call],
        # how far each rank's resident memory grew at its peak during the checked call
        "peak_mib_per_rank": [b / 2**20 for b in run.timings.peak_bytes[call]],
    }
    if bytes_moved(op, run.bytes_per_rank) is not None:
        record["us_per_mib"] = us_per_mib(run, op, impl)  # the median over the bytes the op moves
    return record


def _ratios(run: CaseRun, op: str) -> dict[str, float]:
    """Each other implementation's median over this library's default; the floors' the other way
    round (``ours/floor`` above 1: slower than the floor)."""
    ours = run.median_ms((op, OURS))
    ratios = {}
    for impl in run.impls(op):
        theirs = run.median_ms((op, impl))
        if impl in (FLOOR, FLOOR_FRESH):
            if theirs and ours is not None:
                ratios[f"{OURS}/{impl}"] = ours / theirs
        elif impl != OURS and theirs is not None and ours:
            ratios[f"{impl}/{OURS}"] = theirs / ours
    raw = run.median_ms(RAW)
    if op != RAW[0] and raw is not None and ours:
        ratios[f"{RAW[0]}/{OURS}"] = raw / ours
    return ratios


def _op_record(run: CaseRun, op: str) -> dict[str, Any]:
    record: dict[str, Any] = {
        "impls": {impl: call_record(run, op, impl) for impl in IMPLS if impl in run.impls(op)},
        "ratios": _ratios(run, op),
    }
    moved = bytes_moved(op, run.bytes_per_rank)
    if moved is not None:
        record["bytes_moved"] = moved
    phases = [phase for phase in run.phases if phase.op == op]
    if phases:
        record["phases"] = {
            phase.impl: {
                "serialise_ms": phase.serialise_ms,
                "transfer_ms": phase.transfer_ms,
                "deserialise_ms": phase.deserialise_ms,
                "total_ms": phase.total_ms,
                "rounds": phase.rounds,
            }
            for phase in phases
        }
    return record


def _case_record(run: CaseRun) -> dict[str, Any]:
    ops = {op: _op_record(run, op) for op in run.ops()}
    return {"describe": run.describe, "bytes_per_rank": run.bytes_per_rank, "ops": ops}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "mmengine": _version("mmengine"),
        "ignite": _version("pytorch-ignite"),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


def world_record(world_size: int) -> dict[str, Any]:
    """The head of one world size's record: whether its ranks outnumber the cores."""
    return {"world_size": world_size, "cores": os.cpu_count(), "oversubscribed": oversubscribed(world_size) is not None}


def cases_record(runs: Sequence[CaseRun], quick: bool) -> dict[str, Any]:
    """The cases of one world size."""
    return {
        "all_correct": all_correct(runs),
        "cases": {run.case: _case_record(run) for run in runs},
        # Targets are set for the full payloads; a quick run does not judge them.
        "targets": [] if quick else targets_record(evaluate(runs)),
    }


def targets_record(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Each target with its ratio (the median of the rounds' ratios), interval and verdict."""
    return [
        {
            "case": o.target.case,
            "target": o.target.label,
            "ratio": o.ratio,
            "interval": None if o.spread is None else [o.spread.low, o.spread.high],
            "confidence": None if o.spread is None else o.spread.confidence,
            "rounds": None if o.spread is None else o.spread.rounds,
            "verdict": o.verdict,
        }
        for o in outcomes
    ]
