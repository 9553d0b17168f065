"""Coordination: operations that line ranks up rather than move data, written once over a
communicator's public operations and two of its hooks (a mixin of ``Communicator``)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import ParamSpec, Protocol, TypeVar

from communicator.config import Timeout
from communicator.errors import CollectiveMismatchError, RemoteError, RemoteFailure
from communicator.guard import CallState, collective
from communicator.handles import timeout_seconds
from communicator.objects.protocol import EMPTY, Port, check_headers, empty_header
from communicator.ops.seeds import draw_seed, rng_digest

__all__ = ["Coordinated", "Coordination"]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


class Coordinated(Protocol):
    """What the coordination operations use of the communicator they are mixed into."""

    _seeds_drawn: int
    _calls: CallState

    @property
    def rank(self) -> int: ...

    @property
    def is_main_process(self) -> bool: ...

    def broadcast_object(self, obj: T, src: int = 0) -> T: ...

    def all_gather_object(self, obj: T) -> list[T]: ...

    def _objects(self) -> Port: ...

    def _announce_failure(self, error: BaseException, where: str) -> None: ...

    def _patient_barrier(self, timeout: float | None) -> None: ...

    def _leave_together(self, name: str, *, timeout: float | None = None) -> None: ...

    def _main_done(self, limit: float | None) -> None: ...

    def _main_first(self, limit: float | None) -> None: ...


class Coordination:
    """Seeds every rank agrees on, rank-0-only work, and failing together."""

    @collective()
    def sync_random_seed(self: Coordinated, seed: int | None = None, *, timeout: Timeout | None = None) -> int:
        """One seed, returned on every rank: ``seed`` from rank 0, or drawn on rank 0.

        A drawn seed comes from a copy of rank 0's global NumPy random state and the number of
        seeds this communicator drew before: no global random state (Python, NumPy, torch) moves,
        a run seeded with ``np.random.seed(s)`` gets the same sequence of seeds every time, and
        successive calls give different seeds.

        Example:
            ```python
            # rank 0 draws 1234                 rank 1 passes nothing
            comm.sync_random_seed()             # both: 1234
            ```
        """
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        drawn = self._seeds_drawn
        self._seeds_drawn += 1
        if self.rank == 0 and seed is None:
            seed = draw_seed(drawn)
        return int(self.broadcast_object(seed if self.rank == 0 else None, src=0))  # type: ignore[arg-type]

    @collective()
    def check_random_states(self: Coordinated, *, timeout: Timeout | None = None) -> bool:
        """Whether the Python, NumPy and torch global RNG states agree on every rank."""
        return len(set(self.all_gather_object(rng_digest()))) == 1

    def main_only(self: Coordinated, fn: Callable[P, R]) -> Callable[P, R | None]:
        """Decorator: run ``fn`` on rank 0 only; other ranks get ``None``. No communication."""

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            return fn(*args, **kwargs) if self.is_main_process else None

        return wrapper

    #: mmengine's name for :meth:`main_only`.
    master_only = main_only

    @contextlib.contextmanager
    def fail_together(self: Coordinated, name: str = "block", *, timeout: Timeout | None = None) -> Iterator[None]:
        """If any rank raises inside the block, every rank raises :class:`RemoteError` naming it.

        Ranks blocked in a collective inside the block are released within a fraction of a second
        (they watch the failure board), not at the timeout. When no rank raises, leaving the block
        costs one small collective. On the failing rank the ``RemoteError`` is chained to its own
        exception. After a failure the communicator is unusable: leave its ``with`` block.
        ``timeout`` bounds that collective (checked on entering the block).

        Example:
            ```python
            with comm.fail_together("evaluation"):
                results = evaluate(model)        # rank 1 raises ValueError
            # every rank: RemoteError("evaluation: rank 1 raised ValueError: ...")
            ```
        """
        limit = timeout_seconds(timeout, "fail_together")
        try:
            yield
        except RemoteError:
            raise
        except BaseException as error:
            self._announce_failure(error, name)
            raise RemoteError([RemoteFailure.of(self.rank, error, name)], context=name) from error
        self._leave_together(name, timeout=limit)

    @collective(name="fail_together")
    def _leave_together(self: Coordinated, name: str, *, timeout: float | None = None) -> None:
        """The end of a ``fail_together`` block: every rank says it succeeded, or names its failure."""
        headers = check_headers(self._objects().channel.all_gather(empty_header()), None, name)
        others = {
            r: "sent an object (it is in an object collective)" for r, rec in enumerate(headers) if rec.kind != EMPTY
        }
        if others:
            raise CollectiveMismatchError(
                {**others, self.rank: f"the end of fail_together({name!r})"}, "ranks are in different collectives"
            )

    @contextlib.contextmanager
    def wait_for_main(self: Coordinated, timeout: Timeout | None = None) -> Iterator[bool]:
        """A block that rank 0 may take long over while the others wait at its end, without
        tripping the collective timeout (``timeout``, seconds or a ``timedelta``: default no limit).

        Yields ``is_main_process``; if rank 0 raises, the others raise ``RemoteError`` at once.

        Example:
            ```python
            with comm.wait_for_main() as main:
                if main:
                    build_cache()                # rank 0, an hour
            # every rank continues once rank 0 is done
            ```
        """
        limit = timeout_seconds(timeout, "wait_for_main")
        _refuse(self, "wait_for_main")
        try:
            yield self.is_main_process
        except BaseException as error:
            self._announce_failure(error, "wait_for_main")
            raise
        self._main_done(limit)

    @collective(name="wait_for_main")
    def _main_done(self: Coordinated, limit: float | None) -> None:
        """The end of a ``wait_for_main`` block, where the others wait for rank 0 (an operation of its own,
        so that a stall names it)."""
        self._patient_barrier(limit)

    @contextlib.contextmanager
    def main_process_first(self: Coordinated, *, timeout: Timeout | None = None) -> Iterator[None]:
        """Rank 0 runs the block first (e.g. to download or cache), then the others run it.

        The others wait for rank 0 however long it takes (not bound by the collective timeout;
        ``timeout``, seconds or a ``timedelta``, bounds it), and raise :class:`RemoteError` if rank
        0's block raises.
        """
        limit = timeout_seconds(timeout, "main_process_first")
        _refuse(self, "main_process_first")
        if not self.is_main_process:
            self._main_first(limit)
            yield
            return
        try:
            yield
        except BaseException as error:
            self._announce_failure(error, "main_process_first")
            raise
        self._main_first(limit)

    @collective(name="main_process_first")
    def _main_first(self: Coordinated, limit: float | None) -> None:
        """Where rank 0 ends its ``main_process_first`` block and the others start theirs."""
        self._patient_barrier(limit)


def _refuse(comm: Coordinated, name: str) -> None:
    """Refuse a block on a communicator the guard refuses (closed, unusable, not a member) before
    the block runs: rank 0 would run it alone, and leaving it would post a failure."""
    refusal = comm._calls.refusal
    if refusal is not None:
        raise refusal(name)
