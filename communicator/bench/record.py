"""The JSON record of a run: every median, raw time, ratio, check and target."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Sequence
from typing import Any

import torch

from communicator.bench.measured import CaseRun, all_correct
from communicator.bench.ops import FLOOR, IMPLS, OURS
from communicator.bench.run import Plan
from communicator.bench.targets import RAW, evaluate

__all__ = ["to_json"]


def _call_record(run: CaseRun, op: str, impl: str) -> dict[str, Any]:
    call = (op, impl)
    if call in run.timings.errors:
        return {"error": run.timings.errors[call], "correct": False}
    return {
        "median_ms": run.median_ms(call),
        "times_ms": [t * 1000 for t in run.timings.seconds[call]],
        "loops": run.timings.loops[call],
        "correct": run.timings.correct[call],
        # how far each rank's resident memory grew at its peak during the checked call
        "peak_mib_per_rank": [b / 2**20 for b in run.timings.peak_bytes[call]],
    }


def _ratios(run: CaseRun, op: str) -> dict[str, float]:
    """Each other implementation's median over this library's default; the floor's the other way
    round (``ours/floor`` above 1: slower than the floor)."""
    ours = run.median_ms((op, OURS))
    ratios = {}
    for impl in run.impls(op):
        theirs = run.median_ms((op, impl))
        if impl == FLOOR and theirs and ours is not None:
            ratios[f"{OURS}/{FLOOR}"] = ours / theirs
        elif impl != OURS and theirs is not None and ours:
            ratios[f"{impl}/{OURS}"] = theirs / ours
    raw = run.median_ms(RAW)
    if op != RAW[0] and raw is not None and ours:
        ratios[f"{RAW[0]}/{OURS}"] = raw / ours
    return ratios


def _case_record(run: CaseRun) -> dict[str, Any]:
    ops = {
        op: {
            "impls": {impl: _call_record(run, op, impl) for impl in IMPLS if impl in run.impls(op)},
            "ratios": _ratios(run, op),
        }
        for op in run.ops()
    }
    return {"describe": run.describe, "bytes_per_rank": run.bytes_per_rank, "ops": ops}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "mmengine": _version("mmengine"),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


def to_json(plan: Plan, runs: Sequence[CaseRun], quick: bool) -> dict[str, Any]:
    return {
        "world_size": plan.world_size,
        "repeat": plan.repeat,
        "max_repeat": plan.max_repeat,
        "quick": quick,
        "environment": _environment(),
        "all_correct": all_correct(runs),
        "cases": {run.case: _case_record(run) for run in runs},
        # Targets are set for the full payloads; a quick run does not judge them.
        "targets": []
        if quick
        else [
            {
                "case": o.target.case,
                "target": o.target.label,
                "ratio": o.ratio,  # the median of the rounds' ratios
                "interval": None if o.spread is None else [o.spread.low, o.spread.high],
                "confidence": None if o.spread is None else o.spread.confidence,
                "rounds": None if o.spread is None else o.spread.rounds,
                "verdict": o.verdict,
            }
            for o in evaluate(runs)
        ],
    }
