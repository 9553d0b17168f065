"""The speed this library aims for against its peers, and whether a run meets it.

A target's ratio is the median of its per-round ratios (a round runs every call of a case once,
interleaved, so both sides of a round share the machine's state), with the confidence interval
of :mod:`.spread`; the verdict is ``met``, ``missed`` or ``within noise`` (``n/a`` when a side did not
run). A ``--quick`` run judges none: the report says ``not judged``, as its other tables do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from benchmarks.cases import LIST_OPS, OBJECT_OPS
from benchmarks.measured import CaseRun
from benchmarks.ops import FLOOR, FLOOR_FRESH, MMENGINE, MMENGINE_GPU, OURS, OURS_SAFE, TORCH
from benchmarks.spread import WITHIN_NOISE, Spread, judge, spread_of
from benchmarks.timing import Call

__all__ = ["RAW", "TARGETS", "Outcome", "Target", "evaluate", "straddling", "target_spread"]

RAW = ("raw_all_gather", TORCH)


@dataclasses.dataclass(frozen=True)
class Target:
    """``slower / faster`` (each round's times, summed over several ops) must reach ``at_least``, or
    stay under ``at_most``; ``faster`` is measured in ``faster_case`` when one is named (else in
    ``case``: then the two sides ran in the same rounds)."""

    case: str
    what: str
    slower: tuple[Call, ...]
    faster: tuple[Call, ...]
    at_least: float | None = None
    at_most: float | None = None
    faster_case: str | None = None

    @property
    def label(self) -> str:
        bound = f">= {self.at_least:g}" if self.at_least is not None else f"<= {self.at_most:g}"
        return f"{self.case} {self.what} {bound}"

    def judge(self, spread: Spread) -> str:
        return judge(spread, at_most=self.at_most, at_least=self.at_least)


@dataclasses.dataclass(frozen=True)
class Outcome:
    target: Target
    spread: Spread | None  # None when a side did not run

    @property
    def ratio(self) -> float | None:
        return None if self.spread is None else self.spread.median

    @property
    def verdict(self) -> str:
        """``met``, ``missed``, ``within noise``, or ``n/a`` when a side did not run."""
        return "n/a" if self.spread is None else self.target.judge(self.spread)


def _faster_than(case: str, op: str, peer: str, factor: float) -> Target:
    return Target(case, f"{op} {peer}/ours", ((op, peer),), ((op, OURS),), at_least=factor)


def _than_raw(case: str, op: str) -> Target:
    return Target(case, f"{op} raw_all_gather/ours", (RAW,), ((op, OURS),), at_least=1.0)


def _near_floor(case: str, op: str, factor: float, floor: str = FLOOR) -> Target:
    return Target(case, f"{op} ours/{floor}", ((op, OURS),), ((op, floor),), at_most=factor)


def _arrays_like_tensors(ops: Sequence[str]) -> Target:
    """NumPy arrays as fast as the same bytes as tensors: arrays' total over tensors' (10 % of noise)."""
    calls = tuple((op, OURS) for op in ops)
    return Target("arrays", "object ops ours / tensors' ours", calls, calls, at_most=1.10, faster_case="tensors")


def _safe_close(case: str, ops: Sequence[str]) -> Target:
    """The safe serializer's total time over a case's object ops, against the default's."""
    safe, default = tuple((op, OURS_SAFE) for op in ops), tuple((op, OURS) for op in ops)
    return Target(case, "object ops safe/ours", safe, default, at_most=1.10)


TARGETS: tuple[Target, ...] = (
    *(
        target
        for op in ("all_gather_object", "gather_object")
        for target in (
            _faster_than("arrays", op, TORCH, 3),
            _faster_than("arrays", op, MMENGINE, 3),
            _than_raw("arrays", op),
            _faster_than("tensors", op, TORCH, 5),
            _faster_than("unequal", op, TORCH, 6),
        )
    ),
    _faster_than("arrays", "broadcast_object", TORCH, 2),
    _faster_than("tensors", "broadcast_object", TORCH, 2),
    *(_faster_than(case, "collect_results", MMENGINE, 2) for case in ("records", "arrays")),
    *(_faster_than(case, "collect_results", MMENGINE_GPU, 5) for case in ("records", "arrays")),
    *(_faster_than("small", op, TORCH, 1.5) for op in OBJECT_OPS),
    *(_faster_than("records", op, TORCH, 1.0) for op in OBJECT_OPS),
    *(_near_floor(case, op, 1.5) for case in ("arrays", "tensors") for op in LIST_OPS),
    # 1 MiB or more per rank: within 1.3 times the same transfers into new memory, as a result needs.
    *(_near_floor(case, op, 1.3, FLOOR_FRESH) for case in ("arrays", "tensors", "unequal") for op in LIST_OPS),
    _arrays_like_tensors(LIST_OPS),
    _than_raw("tensors", "all_gather_object"),
    _than_raw("small", "all_gather_object"),
    _faster_than("dict100", "all_reduce_dict", MMENGINE, 1.2),
    _safe_close("small", OBJECT_OPS),
    *(_safe_close(case, LIST_OPS) for case in ("records", "arrays", "tensors", "unequal")),
)


Seconds = Mapping[Call, Sequence[float]]  # per call, the slowest rank's time of each round


def _totals(seconds: Seconds, calls: tuple[Call, ...]) -> list[float] | None:
    """Each round's total over ``calls``, over the rounds every call ran; None if one never ran."""
    times = [seconds.get(call) for call in calls]
    if any(not t for t in times):
        return None
    return [sum(round_) for round_ in zip(*(t for t in times if t), strict=False)]


def target_spread(target: Target, slower: Seconds, faster: Seconds) -> Spread | None:
    """The target's per-round ratios (round k of one side over round k of the other)."""
    top, bottom = _totals(slower, target.slower), _totals(faster, target.faster)
    if top is None or bottom is None:
        return None
    ratios = [a / b for a, b in zip(top, bottom, strict=False) if b > 0]
    return spread_of(ratios) if ratios else None


def straddling(case: str, seconds: Seconds, among: Sequence[Target] = TARGETS) -> set[Call]:
    """The calls of the case's own targets (of ``among``) whose interval straddles the bound (or
    has too few rounds for one): timing them again can decide the verdict."""
    calls: set[Call] = set()
    for target in among:
        if target.case != case or (target.faster_case or case) != case:
            continue
        spread = target_spread(target, seconds, seconds)
        if spread is not None and target.judge(spread) == WITHIN_NOISE:
            calls.update(target.slower + target.faster)
    return calls


def evaluate(runs: Sequence[CaseRun]) -> list[Outcome]:
    """Every target whose case ran, with its measured ratio and interval."""
    by_case = {run.case: run for run in runs}
    outcomes = []
    for target in TARGETS:
        run, other = by_case.get(target.case), by_case.get(target.faster_case or target.case)
        if run is None or other is None:
            continue
        outcomes.append(Outcome(target, target_spread(target, run.timings.seconds, other.timings.seconds)))
    return outcomes
