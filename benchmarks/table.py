"""The printed report: two aligned tables of medians and ratios (against the peers; against the floors
and the safe serializer), each at most 120 characters wide with what its ratios are under it; the
failures; the targets."""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.aligned import aligned
from benchmarks.measured import CaseRun
from benchmarks.ops import FLOOR, FLOOR_FRESH, MMENGINE, MMENGINE_GPU, OURS, OURS_SAFE, TORCH
from benchmarks.spread import NOT_JUDGED
from benchmarks.targets import Outcome

__all__ = ["format_errors", "format_floors", "format_table", "format_targets", "format_unjudged"]

# The medians of each table, and its ratios: (label, numerator, denominator) of those medians.
PEERS = {OURS: "ours ms", TORCH: "torch ms", MMENGINE: "mmengine ms"}
PEER_RATIOS = (("torch/ours", TORCH, OURS), ("mmengine/ours", MMENGINE, OURS))
FLOORS = {OURS: "ours ms", OURS_SAFE: "safe ms", FLOOR: "floor ms", FLOOR_FRESH: "fresh floor ms"}
FLOOR_RATIOS = (("ours/floor", OURS, FLOOR), ("ours/fresh floor", OURS, FLOOR_FRESH), ("safe/ours", OURS_SAFE, OURS))
# collect_results has two mmengine modes; each gets its own row, the mmengine column showing that mode.
MMENGINE_MODES = {MMENGINE: "tmpdir", MMENGINE_GPU: "gpu"}

PEERS_LEGEND = (
    "torch/ours, mmengine/ours: the ratio of the medians beside it (above 1: this library is faster);\n"
    "peak MiB: how far this library's call (torch's on raw_all_gather) grew a rank's resident memory at its peak,\n"
    "the largest over the ranks; correct: whether every side's result was right"
)
FLOORS_LEGEND = (
    "floor: the same bytes by plain point-to-point transfers into buffers made before the clock starts; fresh floor:\n"
    "into buffers made in the call, as a result needs; safe: this library with the safe serializer; ratios: of the\n"
    "medians beside them (ours/floor above 1: slower than the floor; safe/ours above 1: the safe serializer is slower)"
)


def _number(value: float | None, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}{suffix}" if value >= 10 else f"{value:.2f}{suffix}"


def _ratio(top: float | None, bottom: float | None) -> str:
    return _number(top / bottom, "x") if top is not None and bottom else "n/a"


def _medians(run: CaseRun, op: str, mmengine_impl: str) -> dict[str, float | None]:
    """Every implementation's median of ``op``; ``mmengine_impl``'s in the mmengine column."""
    impls = (*PEERS, *FLOORS)
    return {impl: run.median_ms((op, impl if impl != MMENGINE else mmengine_impl)) for impl in impls}


def _peer_row(run: CaseRun, label: str, op: str, mmengine_impl: str) -> list[str]:
    """One row of the peers' table; the mmengine column shows ``mmengine_impl``."""
    shown = _medians(run, op, mmengine_impl)
    tried = [impl for impl in run.impls(op) if impl in (OURS, OURS_SAFE, TORCH, FLOOR, FLOOR_FRESH, mmengine_impl)]
    right = all(run.timings.correct[op, impl] for impl in tried)
    memory = run.peak_mib((op, OURS if OURS in run.impls(op) else TORCH))
    return [
        run.case,
        label,
        *(_number(shown[impl]) for impl in PEERS),
        *(_ratio(shown[top], shown[bottom]) for _, top, bottom in PEER_RATIOS),
        _number(memory),
        "yes" if right else "NO",
    ]


def _peer_rows(run: CaseRun, op: str) -> list[list[str]]:
    modes = [impl for impl in MMENGINE_MODES if impl in run.impls(op)]
    if len(modes) < 2:
        return [_peer_row(run, op, op, MMENGINE)]
    return [_peer_row(run, f"{op} ({MMENGINE_MODES[impl]})", op, impl) for impl in modes]


def format_table(runs: Sequence[CaseRun]) -> str:
    """Against the peers: one row per case and op (collect_results: one per mmengine mode), medians
    in milliseconds and their ratios, and what they are."""
    header = ["case", "op", *PEERS.values(), *(label for label, _, _ in PEER_RATIOS), "peak MiB", "correct"]
    rows = [row for run in runs for op in run.ops() for row in _peer_rows(run, op)]
    return f"{aligned([header, *rows], rule=True)}\n{PEERS_LEGEND}"


def format_floors(runs: Sequence[CaseRun]) -> str:
    """Against the floors and the safe serializer: one row per case and op that has them (empty when none)."""
    rows = []
    for run in runs:
        for op in run.ops():
            shown = _medians(run, op, MMENGINE)
            if all(shown[impl] is None for impl in FLOORS if impl != OURS):
                continue
            rows.append(
                [
                    run.case,
                    op,
                    *(_number(shown[impl]) for impl in FLOORS),
                    *(_ratio(shown[top], shown[bottom]) for _, top, bottom in FLOOR_RATIOS),
                ]
            )
    if not rows:
        return ""
    header = ["case", "op", *FLOORS.values(), *(label for label, _, _ in FLOOR_RATIOS)]
    return f"{aligned([header, *rows], rule=True)}\n{FLOORS_LEGEND}"


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


def format_unjudged() -> str:
    """What a --quick run says of the targets, in the words its other tables use."""
    return f"targets: {NOT_JUDGED} (a --quick run is a smoke test: its payloads, rounds and blocks are too small)"
