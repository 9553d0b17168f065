"""The report rank 0 prints: one row per operation and size, the slowest rank's time, a summary."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from communicator.base import Communicator
from communicator.check.catalogue import SIZES

__all__ = ["Outcome", "render"]


class Outcome(NamedTuple):
    """What one rank saw for one (op, size): ``status`` is pass, FAIL, skip or not run; ``seconds``
    is the op's time inside the communicator's calls (see :func:`~communicator.check.run_checks`);
    ``delay`` is how late this rank arrived on purpose (the time it slept is not in ``seconds``)."""

    op: str
    size: str
    status: str
    seconds: float
    error: str = ""
    delay: float = 0.0


def _ranks_text(ranks: Sequence[int], world: int) -> str:
    if len(ranks) == world:
        return "every rank"
    return ("ranks " if len(ranks) > 1 else "rank ") + ", ".join(map(str, ranks))


def _merge(per_rank: Mapping[int, Sequence[Outcome]], world: int) -> list[tuple[str, str, str, float, str]]:
    """One row per (op, size): FAIL if any rank failed, skip if every rank skipped, the slowest time."""
    ranks = list(per_rank)
    rows = []
    for column in itertools.zip_longest(*per_rank.values()):
        ran = [(rank, outcome) for rank, outcome in zip(ranks, column, strict=True) if outcome is not None]
        first = ran[0][1]
        failed = [(rank, o.error) for rank, o in ran if o.status == "FAIL"]
        if failed:
            status = "FAIL"
            same = [rank for rank, error in failed if error == failed[0][1]]
            others = len(failed) - len(same)
            error = f"{_ranks_text(same, world)}: {failed[0][1]}" + (
                f" (and {others} other rank(s) with other errors)" if others else ""
            )
        elif len(ran) < len(ranks):
            missing = [rank for rank, outcome in zip(ranks, column, strict=True) if outcome is None]
            status, error = "not run", f"{_ranks_text(missing, world)} did not run it"
        elif all(o.status == "skip" for _, o in ran):
            status, error = "skip", first.error
        else:
            status, error = "pass", ""
        late = [(rank, o) for rank, o in ran if o.delay > 0]
        if late and status == "pass":
            error = _late_note(late)
        # Where ranks arrived late on purpose, the others' time is mostly waiting for them: the
        # late ranks' own time from their arrival is the operation's.
        rows.append((first.op, first.size, status, max(o.seconds for _, o in late or ran), error))
    return rows


def _late_note(late: Sequence[tuple[int, Outcome]]) -> str:
    ranks = ", ".join(str(rank) for rank, _ in late)
    whose = f"rank {ranks}" if len(late) == 1 else f"ranks {ranks}"
    delay = max(o.delay for _, o in late)
    return f"ms from when the late {whose} arrived ({delay:.2f} s deliberate delay not counted)"


def _legend(repeat: int) -> list[str]:
    """What the time column shows."""
    runs = {0: "in its one run", 1: "in the run after the checked one"}
    which = runs.get(repeat, f"the median of the {repeat} runs after the checked one")
    return [
        f"{'median ms' if repeat else 'ms'}: time inside the communicator's calls (not the check of the result),"
        " the slowest rank's,",
        f"{which}; async_op rows: until the call returned (not the wait on its handle)",
    ]


def render(
    comm: Communicator,
    per_rank: Mapping[int, Sequence[Outcome]],
    sizes: Sequence[str],
    seconds: float,
    repeat: int = 0,
) -> tuple[list[str], int]:
    """The report rank 0 prints and the exit status (1 when any rank failed or missed a check, else 0).

    ``per_rank`` maps ranks to their outcomes: every rank's after a run, only this rank's after
    the run stopped; ``repeat``: the timed runs after the checked one (their median is the time).
    The report is a header from ``describe()``, one row per op and size, what the time is, a summary.
    """
    rows = _merge(per_rank, comm.world_size)
    width = max([len("op"), *(len(row[0]) for row in rows)])
    size_names = ", ".join(f"{size} ({SIZES[size]} elements)" for size in sizes)
    whose = "" if len(per_rank) == comm.world_size else f" (as seen by {_ranks_text(list(per_rank), comm.world_size)})"
    lines = [
        f"communicator check: {comm.world_size} rank(s), sizes {size_names}",
        *comm.describe().splitlines(),
        "",
        f"{'op':<{width}}  {'size':<6}  {'result':<7}  {'median ms' if repeat else 'ms':>9}  error",
    ]
    for op, size, result, elapsed, error in rows:
        lines.append(f"{op:<{width}}  {size:<6}  {result:<7}  {elapsed * 1000:9.2f}  {error}".rstrip())
    counts = {status: sum(row[2] == status for row in rows) for status in ("pass", "FAIL", "skip", "not run")}
    lines += ["", *_legend(repeat)]
    lines.append(
        f"{counts['pass']} passed, {counts['FAIL']} failed, {counts['skip']} skipped"
        + (f", {counts['not run']} not run" if counts["not run"] else "")
        + f" on {comm.world_size} rank(s){whose} in {seconds:.2f} s"
    )
    status = 1 if counts["FAIL"] or counts["not run"] else 0
    lines.append("check passed" if status == 0 else "check FAILED")
    return lines, status
