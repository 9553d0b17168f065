"""Running the checks on every rank: each check once per size, a barrier after each, the report on rank 0."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from communicator.base import Communicator
from communicator.check.catalogue import CHECKS, DEFAULT_SIZES, SIZES, Check
from communicator.check.report import Outcome, render
from communicator.check.values import Skip, take_delay
from communicator.errors import CommTimeoutError, ConfigError, PeerLostError, RemoteError

__all__ = ["FATAL", "TIMED_RUNS", "Aborted", "check_job", "run_checks"]

#: The errors after which the communicator cannot be trusted: the run stops.
FATAL: tuple[type[BaseException], ...] = (RemoteError, PeerLostError, CommTimeoutError)


class Aborted(Exception):
    """The communicator broke during a check: ``outcomes`` ran before, ``error`` is what broke it."""

    def __init__(self, outcomes: Sequence[Outcome], error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.outcomes = list(outcomes)
        self.error = error


#: Runs of each op after the checked one, timed: the op's time is their median, so a first call's
#: connections and warm-up, and one run a busy machine delays, do not make it.
TIMED_RUNS = 3


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _run(comm: Communicator, check: Check, n: int) -> tuple[Exception | None, float, float]:
    """Run ``check`` once: what it raised, the seconds this rank spent inside the communicator's calls
    (not in the check of their result, nor in a deliberate delay), the delay asked (``arrive_late``)."""
    take_delay()  # from 0: only this run's deliberate delay is counted
    raised = None
    with comm.profile() as profile:
        try:
            check.run(comm, n)
        except Exception as error:  # noqa: BLE001 - sorted by the caller: skip, fatal or a failed check
            raised = error
    _, asked = take_delay()
    return raised, sum(row.time for row in profile.stats.rows.values()), asked


def run_checks(
    comm: Communicator, checks: Sequence[Check] = CHECKS, sizes: Sequence[str] = DEFAULT_SIZES, repeat: int = 0
) -> list[Outcome]:
    """Run every check on every size on this rank (every rank calls it); this rank's outcomes.

    Each check runs once and ``repeat`` more times (every rank runs it as often, whatever it
    found); the outcome's time is the median of the repeated runs' time inside the communicator's
    calls (the first run's with ``repeat=0``). A run that raises makes the check a ``FAIL`` (the
    first error is kept) and the next one runs. After each run the ranks meet at a barrier bounded
    by the communicator's timeout, so a run that left a rank behind cannot pair one rank's next
    collective with another's previous one.

    Raises:
        Aborted: the communicator broke: a check raised ``RemoteError``, ``PeerLostError`` or
            ``CommTimeoutError``, or the barrier after a run failed.
    """
    unknown = [size for size in sizes if size not in SIZES]
    if unknown:
        raise ConfigError(f"unknown sizes {unknown}: expected some of {', '.join(SIZES)}")
    limit = comm.config.timeout.total_seconds()
    outcomes: list[Outcome] = []
    for check in checks:
        for size in sizes if check.sized else ("-",):
            status, message, delay = "pass", "", 0.0
            times: list[float] = []
            for run in range(1 + repeat):
                raised, seconds, asked = _run(comm, check, SIZES[size] if check.sized else 0)
                times.append(seconds)
                delay = max(delay, asked)
                if isinstance(raised, Skip):  # the same on every rank: no run follows
                    status, message = "skip", str(raised)
                elif isinstance(raised, FATAL):
                    outcomes.append(Outcome(check.name, size, "FAIL", seconds, _first_line(raised), delay))
                    raise Aborted(outcomes, raised) from raised
                elif raised is not None and status == "pass":
                    status, message = "FAIL", _first_line(raised) + (f" (timed run {run} of {repeat})" if run else "")
                try:
                    comm.barrier(timeout=limit)
                except Exception as error:  # ranks that cannot meet cannot go on
                    outcomes.append(Outcome(check.name, size, status, seconds, message, delay))
                    raise Aborted(outcomes, error) from error
                if status == "skip":
                    break
            timed = times[1:] or times
            outcomes.append(Outcome(check.name, size, status, statistics.median(timed), message, delay))
    return outcomes


def _emit(line: str) -> None:
    print(line, flush=True)


def check_job(
    comm: Communicator,
    checks: Sequence[Check] = CHECKS,
    sizes: Sequence[str] = DEFAULT_SIZES,
    emit: Callable[[str], None] = _emit,
    repeat: int = TIMED_RUNS,
) -> int:
    """Run the checks on every rank (each once, then ``repeat`` timed runs: see :func:`run_checks`),
    ``emit`` the report on rank 0; the exit status, the same on every rank.

    Raises:
        Aborted: the communicator broke (its ``error`` says how), after this rank ``emit``-ted
            where it stopped (rank 0: its table so far). Leaving the ``with`` block with it
            releases the other ranks.
    """
    start = time.perf_counter()
    try:
        outcomes = run_checks(comm, checks, sizes, repeat)
    except Aborted as aborted:
        if comm.rank == 0:
            lines, _ = render(comm, {0: aborted.outcomes}, sizes, time.perf_counter() - start, repeat)
            for line in lines[:-1]:
                emit(line)
        last = aborted.outcomes[-1] if aborted.outcomes else None
        where = "" if last is None else f" {'at' if last.status == 'FAIL' else 'after'} {last.op} ({last.size})"
        emit(f"check STOPPED on rank {comm.rank}{where}: the communicator broke: {aborted}")
        raise
    records = [tuple(outcome) for outcome in outcomes]  # plain tuples: any serializer carries them
    everyone = comm.gather_object(records, dst=0)
    status = 0
    if everyone is not None:
        per_rank = {rank: [Outcome._make(record) for record in records] for rank, records in enumerate(everyone)}
        lines, status = render(comm, per_rank, sizes, time.perf_counter() - start, repeat)
        for line in lines:
            emit(line)
    agreed: int = comm.broadcast_object(status, src=0)
    return agreed
