"""What one case measured, as rank 0 reports it, and the questions the reports ask of it."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from benchmarks.ops import OURS
from benchmarks.phases import Phases
from benchmarks.timing import Call, Timings

__all__ = ["CaseRun", "all_correct"]


@dataclasses.dataclass
class CaseRun:
    case: str
    describe: str
    bytes_per_rank: list[int]  # each rank's pickled payload
    timings: Timings
    phases: list[Phases] = dataclasses.field(default_factory=list)  # for a case with phases

    def ops(self) -> list[str]:
        """The ops of the case, in the order they ran."""
        return list(dict.fromkeys(op for op, _ in self.timings.correct))

    def impls(self, op: str) -> list[str]:
        """The implementations of ``op`` that were tried, failed ones included."""
        return [impl for name, impl in self.timings.correct if name == op]

    def peak_mib(self, call: Call) -> float | None:
        """The call's peak resident memory growth, the largest over the ranks (MiB)."""
        peaks = self.timings.peak_bytes.get(call)
        return max(peaks) / 2**20 if peaks and call not in self.timings.errors else None

    def median_ms(self, call: Call) -> float | None:
        """The call's median over the rounds; ``None`` when it failed or does not exist."""
        times = self.timings.seconds.get(call)
        return statistics.median(times) * 1000 if times else None


def all_correct(runs: Sequence[CaseRun]) -> bool:
    """Whether this library ran every call and every call that ran gave the right result.

    A peer library failing (reported as n/a) does not count against the run.
    """
    return all(
        ok or (call in run.timings.errors and call[1] != OURS)
        for run in runs
        for call, ok in run.timings.correct.items()
    )
