"""The printed report: an aligned table of medians and ratios, the failures, the targets."""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.aligned import aligned
from benchmarks.measured import CaseRun
from benchmarks.ops import FLOOR, FLOOR_FRESH, MMENGINE, MMENGINE_GPU, OURS, OURS_SAFE, TORCH
from benchmarks.targets import Outcome

__all__ = ["format_errors", "format_table", "format_targets"]

COLUMNS = {
    OURS: "ours ms",
    OURS_SAFE: "safe ms",
    TORCH: "torch ms",
    MMENGINE: "mmengine ms",
    FLOOR: "floor ms",
    FLOOR_FRESH: "fresh floor ms",
}
# (label, numerator, denominator): above 1 means this library's default is faster, except
# safe/ours (above 1: the safe serializer is slower) and ours over a floor (above 1: slower than it).
RATIOS = (
    ("torch/ours", TORCH, OURS),
    ("mmengine/ours", MMENGINE, OURS),
    ("ours/floor", OURS, FLOOR),
    ("ours/fresh floor", OURS, FLOOR_FRESH),
    ("safe/ours", OURS_SAFE, OURS),
)
# collect_results has two mmengine modes; each gets its own row, the mmengine column showing that mode.
MMENGINE_MODES = {MMENGINE: "tmpdir", MMENGINE_GPU: "gpu"}


def _number(value: float | None, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}{suffix}" if value >= 10 else f"{value:.2f}{suffix}"


def _ratio(top: float | None, bottom: float | None) -> str:
    return _number(top / bottom, "x") if top is not None and bottom else "n/a"


def _row(run: CaseRun, label: str, op: str, mmengine_impl: str) -> list[str]:
    """One table row; the mmengine column shows ``mmengine_impl``."""
    shown = {impl: run.median_ms((op, impl if impl != MMENGINE else mmengine_impl)) for impl in COLUMNS}
    tried = [impl for impl in run.impls(op) if impl in (OURS, OURS_SAFE, TORCH, FLOOR, FLOOR_FRESH, mmengine_impl)]
    right = all(run.timings.correct[op, impl] for impl in tried)
    memory = run.peak_mib((op, OURS if OURS in run.impls(op) else TORCH))
    return [
        run.case,
        label,
        *(_number(value) for value in shown.values()),
        *(_ratio(shown[top], shown[bottom]) for _, top, bottom in RATIOS),
        _number(memory),
        "yes" if right else "NO",
    ]


def _rows(run: CaseRun, op: str) -> list[list[str]]:
    modes = [impl for impl in MMENGINE_MODES if impl in run.impls(op)]
    if len(modes) < 2:
        return [_row(run, op, op, MMENGINE)]
    return [_row(run, f"{op} ({MMENGINE_MODES[impl]})", op, impl) for impl in modes]


def format_table(runs: Sequence[CaseRun]) -> str:
    """One row per case and op (collect_results: one per mmengine mode); medians in milliseconds.

    ``peak MiB``: how far this library's call (torch's on the reference row) grew a rank's resident
    memory at its peak, the largest over the ranks (measured in the checking pass).
    """
    header = ["case", "op", *COLUMNS.values(), *(label for label, _, _ in RATIOS), "peak MiB", "correct"]
    return aligned([header, *(row for run in runs for op in run.ops() for row in _rows(run, op))], rule=True)


def format_errors(runs: Sequence[CaseRun]) -> str:
    """The calls that failed, and why (empty when none did)."""
    return "\n".join(
        f"n/a: {run.case} {op} ({impl}): {reason}" for run in runs for (op, impl), reason in run.timings.errors.items()
    )


def _measured(outcome: Outcome) -> str:
    spread = outcome.spread
    return "n/a" if spread is None else f"{spread.text()} ({spread.rounds} rounds)"


def format_targets(outcomes: Sequence[Outcome]) -> str:
    """One line per target: the verdict, the target, the median of the rounds' ratios [its interval]."""
    width = max((len(outcome.verdict) for outcome in outcomes), default=0)
    return "\n".join(
        f"{outcome.verdict:<{width}}  {outcome.target.label}: {_measured(outcome)}" for outcome in outcomes
    )
