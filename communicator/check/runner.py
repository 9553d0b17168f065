"""Running the checks on every rank: each check once per size, a barrier after each, the report on rank 0."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from communicator.base import Communicator
from communicator.check.catalogue import CHECKS, DEFAULT_SIZES, SIZES, Check
from communicator.check.report import Outcome, render
from communicator.check.values import Skip, take_delay
from communicator.errors import CommTimeoutError, ConfigError, PeerLostError, RemoteError

__all__ = ["FATAL", "Aborted", "check_job", "run_checks"]

#: The errors after which the communicator cannot be trusted: the run stops.
FATAL: tuple[type[BaseException], ...] = (RemoteError, PeerLostError, CommTimeoutError)


class Aborted(Exception):
    """The communicator broke during a check: ``outcomes`` ran before, ``error`` is what broke it."""

    def __init__(self, outcomes: Sequence[Outcome], error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.outcomes = list(outcomes)
        self.error = error


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _outcome(check: Check, size: str, status: str, start: float, message: str) -> Outcome:
    """The check's outcome on this rank; a deliberate delay (``arrive_late``) is not the op's time."""
    slept, asked = take_delay()
    return Outcome(check.name, size, status, time.perf_counter() - start - slept, message, asked)


def run_checks(
    comm: Communicator, checks: Sequence[Check] = CHECKS, sizes: Sequence[str] = DEFAULT_SIZES
) -> list[Outcome]:
    """Run every check on every size on this rank (every rank calls it); this rank's outcomes.

    A check that raises is a ``FAIL`` and the next one runs. After each check the ranks meet at a
    barrier bounded by the communicator's timeout, so a check that left a rank behind cannot
    pair one rank's next collective with another's previous one.

    Raises:
        Aborted: the communicator broke: a check raised ``RemoteError``, ``PeerLostError`` or
            ``CommTimeoutError``, or the barrier after a check failed.
    """
    unknown = [size for size in sizes if size not in SIZES]
    if unknown:
        raise ConfigError(f"unknown sizes {unknown}: expected some of {', '.join(SIZES)}")
    limit = comm.config.timeout.total_seconds()
    outcomes: list[Outcome] = []
    for check in checks:
        for size in sizes if check.sized else ("-",):
            take_delay()  # from 0: only this check's deliberate delay is left out of its time
            start = time.perf_counter()
            status, message = "pass", ""
            try:
                check.run(comm, SIZES[size] if check.sized else 0)
            except Skip as skip:
                status, message = "skip", str(skip)
            except FATAL as error:
                outcomes.append(_outcome(check, size, "FAIL", start, _first_line(error)))
                raise Aborted(outcomes, error) from error
            except Exception as error:  # noqa: BLE001 - one failing op must not stop the others
                status, message = "FAIL", _first_line(error)
            outcomes.append(_outcome(check, size, status, start, message))
            try:
                comm.barrier(timeout=limit)
            except Exception as error:  # ranks that cannot meet cannot go on
                raise Aborted(outcomes, error) from error
    return outcomes


def _emit(line: str) -> None:
    print(line, flush=True)


def check_job(
    comm: Communicator,
    checks: Sequence[Check] = CHECKS,
    sizes: Sequence[str] = DEFAULT_SIZES,
    emit: Callable[[str], None] = _emit,
) -> int:
    """Run the checks on every rank, ``emit`` the report on rank 0; the exit status, the same on every rank.

    Raises:
        Aborted: the communicator broke (its ``error`` says how), after this rank ``emit``-ted
            where it stopped (rank 0: its table so far). Leaving the ``with`` block with it
            releases the other ranks.
    """
    start = time.perf_counter()
    try:
        outcomes = run_checks(comm, checks, sizes)
    except Aborted as aborted:
        if comm.rank == 0:
            lines, _ = render(comm, {0: aborted.outcomes}, sizes, time.perf_counter() - start)
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
        lines, status = render(comm, per_rank, sizes, time.perf_counter() - start)
        for line in lines:
            emit(line)
    agreed: int = comm.broadcast_object(status, src=0)
    return agreed
