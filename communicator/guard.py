"""The guard every public operation runs through, applied in one place.

``@collective`` marks a public method of :class:`~communicator.base.Communicator`, and
``Communicator.__init_subclass__`` applies the same guard to a subclass's overrides, so a subclass
cannot lose it. For each outermost call the guard

- refuses a communicator that is closed, unusable after an abandoned operation, or of which this
  rank is not a member (``CallState.refusal``);
- refuses a second thread while an operation runs (ranks must see operations in one order);
- numbers collectives (``seq``; point-to-point operations take two ranks, so they do not count);
- takes the call's ``timeout=`` (every public operation has one), checked before anything else
  of the call communicates, and keeps it in ``CallState.timeout`` for every wait of the call
  (``Communicator._wait``); a call without one costs a check of its keyword arguments;
- in debug mode, compares a fingerprint of the call across ranks before any data moves;
- tells the peers when this rank refuses its arguments before communicating, so that ranks
  already waiting in the operation are released, and after it refused a collective, settles
  what the others did before this rank communicates again (``Communicator._settle``);
- records the call as an :class:`~communicator.observe.events.Event` in the flight recorder, and hands
  it to the statistics, the hooks and torch's profiler when they are on (each costs one check
  when it is off);
- refuses an operation issued by a hook on a communicator whose operations that hook observes:
  it would run on the ranks whose hook issued it only, and pair with another operation on the others.

Operations called by other operations (``sync_random_seed`` broadcasting an object, say) run
unguarded: the outer call is the one that counts, its ``timeout`` included.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, TypeVar

import torch

from communicator.crosscheck import CheckedArguments
from communicator.errors import CommError
from communicator.fingerprints import summarise_arguments
from communicator.handles import timeout_seconds
from communicator.observe.events import RECEIVED, RUNNING, SENT, SIZE, Event, FlightRecorder, finish
from communicator.observe.stats import Statistics

__all__ = ["CallState", "Hook", "Spec", "collective", "guarded"]

_clock = time.perf_counter
_profiling = torch._C._autograd._profiler_enabled  # one C call: whether a torch.profiler is recording
_enter_range = torch._C._autograd._record_function_with_args_enter
_exit_range = torch._C._autograd._record_function_with_args_exit

F = TypeVar("F", bound=Callable[..., Any])
#: torch.distributed's errors (DistNetworkError, DistStoreError, ...): never raised by user code,
#: so one escaping an operation is the transport's, and becomes the matching CommError.
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (torch.distributed.DistError,)


class Spec(NamedTuple):
    """A guarded operation: its name, the arguments debug mode compares, whether it is point-to-point,
    and where its tensor argument is (position after ``self``, name), if it has one."""

    name: str
    match: tuple[str, ...]
    p2p: bool
    signature: inspect.Signature
    payload: tuple[int, str] | None


class Hook(NamedTuple):
    """Callables run with each operation's :class:`~communicator.observe.events.Event`: ``pre`` before it
    runs, ``post`` after it finished (or failed)."""

    pre: Callable[[Event], None] | None
    post: Callable[[Event], None] | None


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any], payload: tuple[int, str] | None) -> list[torch.Tensor]:
    if payload is None:
        return []
    value = args[payload[0]] if len(args) > payload[0] else kwargs.get(payload[1])
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for t in value if isinstance(t, torch.Tensor)] if isinstance(value, (list, tuple)) else []


def _open_ranges(name: str, event: Event, tensors: list[torch.Tensor]) -> tuple[Any, ...]:
    """A profiler range named ``name`` over the call; its inputs are the tensors, so that a trace
    recorded with ``record_shapes=True`` shows their dims and types like any torch op's. Inside
    it, when there are tensors, a range whose name says their sizes (``communicator.all_reduce
    float32[1024]``), which every trace viewer shows without asking."""
    outer = _enter_range(name, *tensors)
    return (outer, _enter_range(f"{name} {event.describe_sizes()}")) if tensors else (outer,)


def _run(state: CallState, stage: str, event: Event) -> None:
    """Run ``state``'s hooks of ``stage``, marked as running so that they cannot issue operations
    on what they observe; an exception other than an ``Exception`` (``KeyboardInterrupt``) escapes."""
    state.hooking, CallState.hooks_running = threading.get_ident(), CallState.hooks_running + 1
    try:
        for hook in list(state.hooks):  # a hook may remove itself
            call = hook.pre if stage == "pre" else hook.post
            if call is None:
                continue
            try:
                call(event)
            except Exception as error:  # noqa: BLE001 - a hook must not break the operation
                warnings.warn(
                    f"communicator: a {stage} hook {getattr(call, '__qualname__', call)!r} raised on {event.op} "
                    f"#{event.seq}: {type(error).__name__}: {error}; the operation went on unaffected",
                    RuntimeWarning,
                    stacklevel=4,
                )
    finally:
        state.hooking, CallState.hooks_running = 0, CallState.hooks_running - 1


class CallState:
    """What the guard keeps for one communicator."""

    observers: ClassVar[int] = 0  # hooks and statistics being gathered, in the whole process
    hooks_running: ClassVar[int] = 0  # hook lists running now, in the whole process
    __slots__ = (
        "busy",
        "checked_arguments",
        "group",
        "home",
        "hooking",
        "hooks",
        "op",
        "ranges",
        "recorder",
        "refusal",
        "running",
        "seq",
        "sinks",
        "started",
        "thread",
        "timeout",
        "unsettled",
        "up",
    )  # fmt: skip

    def __init__(self, events: int = 256) -> None:
        self.busy = threading.Lock()  # held while an operation runs
        self.thread = 0  # the thread running it
        self.op = ""  # the public operation running, or that ran last
        self.seq = 0  # collectives entered so far: the same on every rank of a correct program
        self.started = False  # whether the running operation has started communicating
        self.timeout: float | None = None  # the running call's timeout= in seconds; None: the communicator's
        self.refusal: Callable[[str], CommError] | None = None  # why operations are refused, when they are
        self.unsettled = False  # this rank refused its arguments to a collective the others may have started
        self.running: list[Any] | None = None  # the running operation's record (see communicator.observe.events)
        self.recorder = FlightRecorder(maxlen=events)
        self.group = "world"  # the communicator's name in events: "world", or its world ranks
        self.sinks: list[Statistics] = []  # statistics being gathered (the configuration's, open profiles)
        self.hooks: list[Hook] = []
        self.hooking = 0  # the thread running its hooks, while they run
        self.up: CallState | None = None  # the parent communicator's: its statistics and hooks see ours too
        self.ranges: tuple[Any, ...] = ()  # the profiler ranges of the running operation
        self.home: tuple[str, int, int] = ("", 0, 0)  # its (group, rank, size), once an operation has asked
        self.checked_arguments = CheckedArguments()  # argument sets checked across ranks (see communicator.crosscheck)

    def hook_refusal(self, name: str) -> CommError | None:
        """Why ``name`` is refused when a hook that observes this communicator (its own, or a
        parent's) runs in this thread; ``None`` when none does."""
        me = threading.get_ident()
        state: CallState | None = self
        while state is not None:
            if state.hooking == me:
                return CommError(
                    f"{name}: a hook cannot issue operations on a communicator whose operations it observes: "
                    "it would run on the ranks whose hook issued it only, and pair with another operation on "
                    "the others (nothing was sent)"
                )
            state = state.up
        return None

    @property
    def event(self) -> Event | None:
        """The running operation's event, or ``None``."""
        running = self.running
        return None if running is None else Event(running)

    def start(self, spec: Spec, comm: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The record of a call that starts now (``sys._getframe(2)``: the guard's caller)."""
        home = self.home
        if not home[2]:  # a communicator's name, rank and size never change: asked once
            home = self.home = (self.group, comm.rank, comm.world_size)
        payload = spec.payload
        value = None if payload is None else args[payload[0]] if len(args) > payload[0] else kwargs.get(payload[1])
        shapes: tuple[torch.Size, ...] = ()
        dtypes: tuple[torch.dtype, ...] = ()
        if isinstance(value, torch.Tensor):  # the common case, kept cheap
            shapes, dtypes = (value.shape,), (value.dtype,)
        elif isinstance(value, (list, tuple)):
            tensors = [t for t in value if isinstance(t, torch.Tensor)]
            shapes, dtypes = tuple([t.shape for t in tensors]), tuple([t.dtype for t in tensors])
        # A record, laid out as communicator.observe.events numbers its positions
        record = [spec.name, spec.p2p, self.seq, home, sys._getframe(2), shapes, dtypes, _clock(), RUNNING,
                  None, 0.0, 0.0, 0.0, 0.0, 0, 0, 0]  # fmt: skip
        self.running = record
        self.recorder.append(record)
        if _profiling():
            self.ranges = _open_ranges(f"communicator.{spec.name}", Event(record), _tensors(args, kwargs, payload))
        if CallState.observers:  # any hook or statistics anywhere: see whether they are ours
            state: CallState | None = self
            try:
                while state is not None:
                    if state.hooks:
                        _run(state, "pre", Event(record))
                    state = state.up
            except BaseException as error:  # a KeyboardInterrupt in a hook: the call ends here, recorded
                self.end(record, error)
                raise
        return record

    def count(self, sent: int, received: int, size: int) -> None:
        """Add bytes to the running operation's record (``size``: see :mod:`communicator.observe.stats`)."""
        record = self.running
        if record is not None and CallState.observers:  # bytes are for statistics and hooks
            if self.home[2] > 1:  # in a world of one, nothing moves
                record[SENT] += sent
                record[RECEIVED] += received
            record[SIZE] += size

    def end(self, record: list[Any], error: BaseException | None) -> None:
        finish(record, error)
        self.running = None  # a handle waited on later adds nothing to a finished operation
        if self.ranges:
            for handle in reversed(self.ranges):
                _exit_range(handle)
            self.ranges = ()
        if CallState.observers:
            event = Event(record)
            state: CallState | None = self
            while state is not None:  # every statistic first: a hook may raise a KeyboardInterrupt
                for sink in state.sinks:
                    sink.add(event)
                state = state.up
            state = self
            while state is not None:
                if state.hooks:
                    _run(state, "post", event)
                state = state.up


def collective(*match: str, p2p: bool = False, name: str | None = None) -> Callable[[F], F]:
    """Mark a public method as an operation every call of which goes through the guard.

    ``match`` names the arguments debug mode compares across ranks (see
    :func:`~communicator.fingerprints.summarise_arguments`); ``name`` is the operation's name in
    events and messages (default: the method's), for a private method that is part of a public one.
    """

    def decorate(method: F) -> F:
        signature = inspect.signature(method)
        names = list(signature.parameters)[1:]  # after self
        payload = next(((names.index(n), n) for n in ("tensor", "tensors") if n in names), None)
        return guarded(method, Spec(name or method.__name__, match, p2p, signature, payload))

    return decorate


def guarded(method: F, spec: Spec) -> F:
    """``method`` behind the guard of ``spec``."""
    name = spec.name

    @functools.wraps(method)
    def guard(self: Any, *args: Any, **kwargs: Any) -> Any:  # self: a Communicator
        calls = self._calls
        if CallState.hooks_running:  # a hook runs somewhere: is it one that observes this communicator?
            refusal = calls.hook_refusal(name)
            if refusal is not None:
                raise refusal
        if not calls.busy.acquire(False):
            if calls.thread == threading.get_ident():  # called by another operation: the outer call counts
                return method(self, *args, **kwargs)
            raise CommError(
                f"{name}: this communicator is running {calls.op} in another thread; a communicator's "
                "operations must be issued by one thread at a time (ranks must see them in one order)"
            )
        try:
            if calls.refusal is not None:
                raise calls.refusal(name)
            calls.thread, calls.op, calls.started = threading.get_ident(), name, False
            if not spec.p2p:
                calls.seq += 1
            record = calls.start(spec, self, args, kwargs)  # after the refusal: rank and size are known
            try:
                if calls.unsettled:  # before communicating again (see Communicator._settle)
                    self._settle()
                if kwargs and "timeout" in kwargs:  # the call's own, for its every wait (a TypeError or
                    calls.timeout = timeout_seconds(kwargs["timeout"], name)  # ValueError: refused below)
                if self.config.debug and not spec.p2p:
                    arguments = summarise_arguments(spec.signature, self, args, kwargs, spec.match)
                    self._compare_fingerprints(name, arguments, Event(record).site)
                result = method(self, *args, **kwargs)
            except _TRANSPORT_ERRORS as raw:  # torch's own, from a store or transport that is gone
                if isinstance(raw, CommError):
                    raise
                error = self._start_failed(raw)
                calls.end(record, error)
                raise error from raw
            except BaseException as error:
                calls.end(record, error)
                if self.config.trace_dir is not None and (calls.started or isinstance(error, CommError)):
                    self._dump_after(error)
                raise
            calls.end(record, None)
            return result
        except (TypeError, ValueError) as error:
            if not calls.started:  # peers may already wait in this operation: release them
                self._announce_bad_arguments(error, name, not spec.p2p)
            raise
        finally:
            calls.thread, calls.timeout = 0, None
            calls.busy.release()

    guard.__collective__ = spec  # type: ignore[attr-defined]
    return guard  # type: ignore[return-value]
