"""Turn the ranks' timings into the printed table and the JSON record."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
from collections.abc import Sequence
from typing import Any

import torch

from communicator.bench.ops import IMPLS, MMENGINE, MMENGINE_GPU, OURS, OURS_SAFE, TORCH
from communicator.bench.run import CaseRun, Plan
from communicator.bench.targets import Outcome, evaluate

__all__ = ["all_correct", "format_errors", "format_table", "format_targets", "to_json"]

# Ratios shown per row: (label, numerator implementation, denominator implementation).
RATIOS = (("torch/ours", TORCH, OURS), ("mmengine/ours", MMENGINE, OURS), ("safe/ours", OURS_SAFE, OURS))
# collect_results has two mmengine modes; each gets its own row, the mmengine column showing that mode.
MMENGINE_MODES = {MMENGINE: "tmpdir", MMENGINE_GPU: "gpu"}


def _median_ms(seconds: Sequence[float]) -> float:
    return statistics.median(seconds) * 1000


def _medians(run: CaseRun, op: str) -> dict[str, float]:
    return {impl: _median_ms(times) for (name, impl), times in run.seconds.items() if name == op}


def _ops(run: CaseRun) -> list[str]:
    return list(dict.fromkeys(op for op, _ in run.correct))


def all_correct(runs: Sequence[CaseRun]) -> bool:
    """Whether this library ran every call and every implementation that ran gave the right result."""
    return all(
        ok or (call in run.errors and call[1] != OURS) for run in runs for call, ok in run.correct.items()
    )


# -- the table --------------------------------------------------------------------------------


def _cell(value: float | None, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}{suffix}" if value >= 10 else f"{value:.2f}{suffix}"


def _ratio(top: float | None, bottom: float | None) -> str:
    return _cell(top / bottom, "x") if top is not None and bottom else "n/a"


def _row(run: CaseRun, label: str, op: str, mmengine_impl: str) -> list[str]:
    """The mmengine column shows ``mmengine_impl`` (collect_results has two modes)."""
    medians = _medians(run, op)
    shown = {impl: medians.get(impl) for impl in (OURS, OURS_SAFE, TORCH)} | {MMENGINE: medians.get(mmengine_impl)}
    checked = [run.correct[op, impl] for impl in (OURS, OURS_SAFE, TORCH, mmengine_impl) if (op, impl) in run.correct]
    return [
        run.case,
        label,
        *(_cell(value) for value in shown.values()),
        *(_ratio(shown[top], shown[bottom]) for _, top, bottom in RATIOS),
        "yes" if all(checked) else "NO",
    ]


def _rows(run: CaseRun, op: str) -> list[list[str]]:
    modes = [impl for impl in MMENGINE_MODES if (op, impl) in run.correct]
    if len(modes) < 2:
        return [_row(run, op, op, MMENGINE)]
    return [_row(run, f"{op} ({MMENGINE_MODES[impl]})", op, impl) for impl in modes]


def format_table(runs: Sequence[CaseRun]) -> str:
    """One row per case and op (collect_results: one per mmengine mode); medians in milliseconds."""
    header = ["case", "op", "ours ms", "safe ms", "torch ms", "mmengine ms", *(label for label, _, _ in RATIOS)]
    rows = [[*header, "correct"], *(row for run in runs for op in _ops(run) for row in _rows(run, op))]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(_align(i, cell, width) for i, (cell, width) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _align(column: int, cell: str, width: int) -> str:
    """Names to the left, numbers to the right."""
    return cell.ljust(width) if column < 2 else cell.rjust(width)


def format_errors(runs: Sequence[CaseRun]) -> str:
    """The calls that failed, and why (empty when none did)."""
    return "\n".join(
        f"n/a: {run.case} {op} ({impl}): {reason}" for run in runs for (op, impl), reason in run.errors.items()
    )


def format_targets(outcomes: Sequence[Outcome]) -> str:
    return "\n".join(
        f"{'met   ' if outcome.met else 'MISSED'}  {outcome.target.label}: "
        f"{'n/a' if outcome.ratio is None else f'{outcome.ratio:.2f}'}"
        for outcome in outcomes
    )


# -- the JSON record --------------------------------------------------------------------------


def _impl_record(run: CaseRun, op: str, impl: str) -> dict[str, Any]:
    call = (op, impl)
    if call in run.errors:
        return {"error": run.errors[call], "correct": False}
    times = run.seconds[call]
    return {"median_ms": _median_ms(times), "times_ms": [t * 1000 for t in times], "correct": run.correct[call]}


def _case_record(run: CaseRun) -> dict[str, Any]:
    ops: dict[str, Any] = {}
    for op in _ops(run):
        impls = [impl for impl in IMPLS if (op, impl) in run.correct]
        medians = _medians(run, op)
        ops[op] = {
            "impls": {impl: _impl_record(run, op, impl) for impl in impls},
            "ratios": {
                f"{impl}/{OURS}": medians[impl] / medians[OURS]
                for impl in impls
                if impl != OURS and impl in medians and OURS in medians
            },
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
    """Every median, raw time, ratio, check and target of the run."""
    return {
        "world_size": plan.world_size,
        "repeat": plan.repeat,
        "quick": quick,
        "environment": _environment(),
        "all_correct": all_correct(runs),
        "cases": {run.case: _case_record(run) for run in runs},
        "targets": [
            {"case": o.target.case, "target": o.target.label, "ratio": o.ratio, "met": o.met} for o in evaluate(runs)
        ],
    }
