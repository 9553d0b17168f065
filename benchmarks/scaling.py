"""Several world sizes in one run: which are oversubscribed, the bytes each object op moves, its
cost per byte, and the summary table across world sizes."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from benchmarks.aligned import aligned
from benchmarks.cases import LIST_OPS
from benchmarks.floor import DST, SRC
from benchmarks.measured import CaseRun
from benchmarks.ops import FLOOR, OURS

__all__ = ["bytes_moved", "format_scaling", "oversubscribed", "us_per_mib"]

MiB = 2**20


def oversubscribed(world_size: int, cores: int | None = None) -> str | None:
    """``oversubscribed (N ranks on M cores)`` when the ranks outnumber the cores (default: this
    machine's), else ``None``: such ranks take turns on the cores, and every time grows with that."""
    cores = os.cpu_count() if cores is None else cores
    if cores is None or world_size <= cores:
        return None
    return f"oversubscribed ({world_size} ranks on {cores} core{'s' if cores > 1 else ''})"


def bytes_moved(op: str, lengths: Sequence[int]) -> int | None:
    """The bytes an object op moves between ranks (each rank's pickled payload, every copy that
    leaves its rank counted once): what the floor moves. ``None`` for other ops."""
    if op == "all_gather_object":
        return sum(lengths) * (len(lengths) - 1)
    if op == "broadcast_object":
        return lengths[SRC] * (len(lengths) - 1)
    if op in LIST_OPS:  # gather_object, collect_results: every rank's to the destination
        return sum(lengths) - lengths[DST]
    return None


def us_per_mib(run: CaseRun, op: str, impl: str) -> float | None:
    """The call's median over the bytes its op moves: microseconds per MiB."""
    median, moved = run.median_ms((op, impl)), bytes_moved(op, run.bytes_per_rank)
    return None if median is None or not moved else median * 1000 / (moved / MiB)


def _cell(run: CaseRun | None, op: str) -> tuple[str, str]:
    if run is None or op not in run.ops():
        return "", ""
    ours, floor, cost = run.median_ms((op, OURS)), run.median_ms((op, FLOOR)), us_per_mib(run, op, OURS)
    ratio = f"{ours / floor:.2f}x" if ours is not None and floor else "n/a"
    return ratio, "n/a" if cost is None else f"{cost:,.0f}" if cost >= 100 else f"{cost:.1f}"


def format_scaling(runs: Mapping[int, Sequence[CaseRun]]) -> str:
    """Rows op x case, per world size: ours/floor and this library's microseconds per MiB moved
    (empty when no object op ran)."""
    sizes = list(runs)
    by_case = {size: {run.case: run for run in runs[size]} for size in sizes}
    cases = list(dict.fromkeys(run.case for size in sizes for run in runs[size]))
    header = ["case", "op"]
    for size in sizes:
        mark = "*" if oversubscribed(size) else ""
        header += [f"w{size}{mark} ours/floor", f"w{size}{mark} us/MiB"]
    rows = [header]
    for case in cases:
        for op in LIST_OPS:
            cells = [cell for size in sizes for cell in _cell(by_case[size].get(case), op)]
            if any(cells):
                rows.append([case, op, *cells])
    if len(rows) == 1:
        return ""
    marked = [str(size) for size in sizes if oversubscribed(size)]
    return (
        "scaling: per world size w, this library's median over the floor's (ours/floor) and over the bytes the op"
        " moves (us/MiB: microseconds per MiB)"
        + (f"; * oversubscribed: more ranks than the {os.cpu_count()} cores (w{', w'.join(marked)})" if marked else "")
        + "\n"
        + aligned(rows, rule=True)
    )
