"""Seeing what a communicator does: statistics, hooks, the flight recorder (a mixin of ``Communicator``).

Every public operation is one :class:`~communicator.observe.events.Event`; the guard records it and hands
it to the statistics and hooks installed here. A subgroup's operations count in its parent's
statistics and reach its parent's hooks too, labelled with the subgroup's ranks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from communicator.config import CommConfig
from communicator.guard import CallState, Hook
from communicator.observe.events import Event
from communicator.observe.stats import Statistics

__all__ = ["HookHandle", "Observation", "Profile", "dump_all"]


class Observed(Protocol):
    """What observation uses of the communicator it is mixed into."""

    config: CommConfig
    _calls: CallState
    _stats: Statistics | None

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def global_ranks(self) -> tuple[int, ...]: ...

    def dump_trace(self, directory: str | os.PathLike[str] | None = None) -> str: ...


class HookHandle:
    """What ``add_hook`` returns: ``remove()`` takes the hook off again (twice is harmless)."""

    def __init__(self, hooks: list[Hook], hook: Hook) -> None:
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)
            CallState.observers -= 1


class Profile:
    """The statistics of the operations of one ``with comm.profile()`` block (filled as they run)."""

    def __init__(self) -> None:
        self.stats = Statistics()

    def __str__(self) -> str:
        return self.stats.table()


class Observation:
    """Statistics, hooks and the flight recorder of a communicator."""

    def _observe(self: Observed) -> Statistics | None:
        """Start what the configuration asks for: the statistics, the ``SIGUSR2`` dump; the statistics."""
        trace_on_signal(self)
        if not self.config.stats:
            return None
        stats = Statistics()
        self._calls.sinks.append(stats)
        CallState.observers += 1  # for the communicator's life
        return stats

    def _stop_observing(self: Observed) -> None:
        """At close: this communicator's statistics and hooks stop making every call in the process
        take the observed path (its statistics stay readable)."""
        calls = self._calls
        if self._stats is not None and self._stats in calls.sinks:
            calls.sinks.remove(self._stats)
            CallState.observers -= 1
        CallState.observers -= len(calls.hooks)
        calls.hooks.clear()

    def stats(self: Observed) -> Statistics:
        """Per-operation statistics since the communicator was created, its subgroups' included.

        Gathered when the configuration says ``stats=True`` (``COMMUNICATOR_STATS=1``); otherwise
        empty (``profile()`` measures one block either way). ``print(comm.stats())`` shows a table,
        ``as_dict()``/``to_json()`` give the numbers; ``comm.stats()["all_reduce"]`` is one row.

        Example:
            ```python
            comm = Communicator.create({"stats": True})
            comm.all_reduce(torch.ones(1000))
            print(comm.stats())   # group, op, calls, sent/recv MB, time, wait, (de)serialise, algbw, busbw
            ```
        """
        return self._stats if self._stats is not None else Statistics()

    @contextlib.contextmanager
    def profile(self: Observed) -> Iterator[Profile]:
        """Gather statistics of the operations run inside the block (this communicator's and its subgroups').

        Example:
            ```python
            with comm.profile() as p:
                results = evaluate(model, comm)
            print(p.stats)        # per operation: calls, bytes, time, wait, (de)serialise, bandwidth
            ```
        """
        profile = Profile()
        self._calls.sinks.append(profile.stats)
        CallState.observers += 1
        try:
            yield profile
        finally:
            self._calls.sinks.remove(profile.stats)
            CallState.observers -= 1

    def add_hook(
        self: Observed, pre: Callable[[Event], None] | None = None, post: Callable[[Event], None] | None = None
    ) -> HookHandle:
        """Call ``pre(event)`` before and ``post(event)`` after every operation (and its subgroups').

        The :class:`~communicator.observe.events.Event` says the operation, its number, group, shapes and
        dtypes; after it ran, its duration, bytes, state and error. A hook that raises does not
        reach the operation: the error becomes a ``RuntimeWarning`` and the operation runs as on
        every other rank, so ranks never disagree because of a hook.

        Example:
            ```python
            handle = comm.add_hook(post=lambda e: print(e.op, e.describe_sizes(), e.state))
            comm.all_reduce(torch.ones(4))      # prints: all_reduce float32[4] done
            handle.remove()
            ```
        """
        if pre is None and post is None:
            raise ValueError("add_hook needs a pre or a post callable")
        for name, call in (("pre", pre), ("post", post)):
            if call is not None and not callable(call):
                raise TypeError(f"add_hook: {name} must be callable, got {type(call).__name__}")
        hook = Hook(pre, post)
        self._calls.hooks.append(hook)
        CallState.observers += 1
        return HookHandle(self._calls.hooks, hook)

    def events(self: Observed) -> list[Event]:
        """The flight recorder: this communicator's last operations (``trace_events`` of them), oldest first."""
        return self._calls.recorder.events()

    def dump_trace(self: Observed, directory: str | os.PathLike[str] | None = None) -> str:
        """Write the flight recorder to ``directory`` (default: the configuration's ``trace_dir``) as
        ``<group>-rank<world rank>.json``; the file's path. ``communicator trace DIR`` reads them."""
        where = directory if directory is not None else self.config.trace_dir
        if where is None:
            raise ValueError("dump_trace needs a directory, or trace_dir in the configuration")
        calls = self._calls
        extra = {
            "rank": self.rank,
            "world_size": self.world_size,
            "global_ranks": list(self.global_ranks),
            "seq": calls.seq,
            "running": calls.op if calls.busy.locked() else None,
        }
        name = calls.group.replace(" ", "-").replace(",", "-")
        world_rank = self.global_ranks[self.rank] if self.rank >= 0 else -1
        return calls.recorder.dump(os.fspath(where), name, world_rank, extra)

    def _dump_after(self: Observed, error: BaseException) -> None:
        """Dump the flight recorder after an operation failed (a dump that fails only warns)."""
        try:
            path = self.dump_trace()
        except Exception as failure:  # noqa: BLE001 - the operation's own error is the one to raise
            warnings.warn(f"communicator: could not write the flight recorder: {failure}", RuntimeWarning, stacklevel=3)
            return
        error.add_note(f"this rank's last operations: {path} (read every rank's with `communicator trace DIR`)")


_traced: weakref.WeakSet[Any] = weakref.WeakSet()


def dump_all(*_: Any) -> None:
    """Dump the flight recorder of every communicator with a ``trace_dir`` (the ``SIGUSR2`` handler)."""
    for comm in list(_traced):
        with contextlib.suppress(Exception):
            comm.dump_trace()


def trace_on_signal(comm: Any) -> None:
    """Dump ``comm``'s recorder on ``SIGUSR2`` when it has a ``trace_dir`` and the signal is free."""
    if comm.config.trace_dir is None:
        return
    _traced.add(comm)
    with contextlib.suppress(ValueError):  # only the main thread may install handlers
        if signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGUSR2, dump_all)
