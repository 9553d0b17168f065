"""`Communicator`: the one object distributed code talks through, and the specification of every
communicator.

A subclass implements point-to-point (see the table); everything public is written once, on top
of it, here and in the mixins the class is made of (:mod:`communicator.ops.tensors`,
:mod:`communicator.ops.objects`, ...): argument checks, the guard (closed and non-member
communicators, sequence numbers, failure signalling, debug fingerprints, use from two threads),
device and inference-mode handling, the finishing step (mean division, write-back), uneven gathers,
object collectives, dict reduction, result collection, seed synchronisation and subgroups.

=====================  ====================================================================
**must**               ``rank``, ``world_size`` (properties); ``_isend(tensor, dst, tag)`` and
                       ``_irecv(tensor, src, tag)``: start a transfer and return at once a
                       *work*, whose ``wait(timeout)`` (a ``timedelta``) returns ``False`` or
                       raises ``TimeoutError`` when the slice ran out, without failing the
                       transfer (torch gloo's point-to-point works fail it: wrap them in
                       ``communicator.control.waiting.PointToPoint``, waited whole in a
                       helper thread), and ``is_completed()``. ``_isend`` never waits for
                       the receiver (it may copy and return ``DONE``); the tensor it gets may
                       be read until its work completes. Several works may be outstanding,
                       waited in any order; messages from one rank to another with one tag
                       are received in the order they were sent (tags are any ``int``s,
                       negative and large ones included). An empty tensor is a message too.
                       A failed transfer raises ``RuntimeError`` at start or in ``wait``
                       (text about a closed connection: the peer is lost).
**may** (fast paths)   ``_barrier``, ``_broadcast``, ``_all_reduce``, ``_reduce``,
                       ``_all_gather`` (equal shapes), ``_gather`` (1-D, sizes may
                       differ), ``_reduce_scatter``,
                       ``_create_groups``: defaults over the point-to-point
                       (:mod:`communicator.ops.defaults`) that finish before they return;
                       ``_object_channel``; ``backend``, ``device``, ``global_ranks`` and the
                       topology; ``from_config``. An override gets contiguous tensors on
                       ``self.device`` and never a complex product
**hooks**              ``_control_store()``: a store shared by the ranks (torch's
                       ``TCPStore``), asked once: failures, closings and stalls reach every
                       rank. ``_teardown(error)``: release the transport, no communication
                       after an error. The control plane's, rarely overridden:
                       ``_start_failed(error)`` (the ``CommError`` for a primitive that
                       refused to start), ``_announce_bad_arguments``, ``_announce_failure``
                       (tell peers; never raise), ``_timed_barrier(timeout)`` (raises
                       ``CommTimeoutError`` naming late ranks), ``_patient_barrier(timeout)``
``self.config``        the :class:`~communicator.config.CommConfig` passed to ``__init__``
                       (timeout, serializer, debug, ``options`` for a subclass's own settings)
derived (written once) every public method
=====================  ====================================================================
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import functools
import json
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeVar, final, overload

import torch
from torch.distributed.distributed_c10d import PrefixStore

import communicator.objects.protocol as protocol
import communicator.ops.defaults as derived
from communicator.config import CommConfig, ConfigLike
from communicator.control import Control
from communicator.control.log import Store
from communicator.control.recovery import Recovery, unusable
from communicator.control.waiting import FIRST_SLICE_SECONDS, at_once, finished
from communicator.errors import CommError, CommTimeoutError, ConfigError
from communicator.factory import REGISTRY, SINGLE, build, decide, provided
from communicator.fingerprints import check_fingerprints, fingerprint
from communicator.guard import CallState, Spec, guarded
from communicator.handles import DONE, Handle, Work
from communicator.objects import make_codec
from communicator.objects.channel import Channel, PrimitiveChannel
from communicator.objects.codec import Codec
from communicator.ops.coordination import Coordination
from communicator.ops.objects import ObjectOperations
from communicator.ops.observation import Observation
from communicator.ops.p2p import PointToPoint
from communicator.ops.ranks import RankQueries
from communicator.ops.records import ShapeRecords
from communicator.ops.splits import Splitting
from communicator.ops.staging import editing, stage, while_editing
from communicator.ops.tensors import TensorOperations

__all__ = ["Communicator"]

T = TypeVar("T")
CommT = TypeVar("CommT", bound="Communicator")
Tensor = torch.Tensor


class Communicator(
    RankQueries,
    TensorOperations,
    ShapeRecords,
    PointToPoint,
    ObjectOperations,
    Coordination,
    Splitting["Communicator"],
    Recovery["Communicator"],
    Observation,
    abc.ABC,
):
    """One object for every distributed operation, the same in one process and in a job of many.

    **The rule.** *Tensor methods* (``all_reduce``, ``broadcast``, ``reduce``, ``all_gather``,
    ``gather``, ``scatter``, ``reduce_scatter``, ``all_to_all``, ``send``, ``recv``, ``isend``,
    ``irecv``) move tensors without pickling; in-place ones also return the tensor, gathers return
    new tensors, and ``async_op=True`` returns a :class:`~communicator.handles.Handle`.
    *Object methods* end in ``_object``, carry any serialisable value and **return** the result.
    Gathers return a list on the destination and ``None`` elsewhere. Every rank argument (``src``,
    ``dst``, ``peer``) and ``rank`` itself count inside this communicator.

    **Timeouts.** Every operation takes ``timeout=`` (keyword-only; ``barrier``'s may be
    positional): seconds (an ``int`` or ``float``) or a ``datetime.timedelta``, for this call in
    place of the communicator's (``CommConfig.timeout``, what ``None``, the default, means). It
    bounds each wait of the call, as the communicator's does (an uneven gather waits for the
    shapes, then the data; an object collective for the headers, then the frames), and the
    ``wait()`` of the :class:`~communicator.handles.Handle` an ``async_op=True`` call returns,
    unless that ``wait`` is given its own. When it runs out the call raises
    :class:`~communicator.errors.CommTimeoutError`, naming the ranks that did not arrive where
    that is known, and a communicator with a control plane is unusable after, as after any
    abandoned operation. ``main_process_first`` and ``wait_for_main`` wait however long rank 0
    takes unless given one. A value that is not a positive, finite duration is refused like any
    bad argument, before anything is sent: ``TypeError`` for another type,
    :class:`~communicator.errors.ConfigError` (a ``ValueError``) for a duration. Ranks may pass
    different timeouts (debug mode does not compare them). A longer timeout than the
    communicator's may still end early where the transport's own operations time out (torch's
    gloo and NCCL collectives, at the communicator's timeout): configure the longest you need.

    A communicator's operations are issued by one thread at a time; a second thread calling while
    an operation runs gets a :class:`~communicator.errors.CommError` at once.

    Create one with :meth:`create` (which picks the class) and use it as a context manager:

    ```python
    with Communicator.create() as comm:
        total = comm.all_reduce(torch.tensor([1.0]))
    ```
    """

    _active: ClassVar[list[Communicator]] = []  # communicators whose ``with`` block is open, innermost last
    _specs: ClassVar[dict[str, Spec]] = {}  # every guarded public operation, by name
    _open: ClassVar[weakref.WeakSet[Communicator]] = weakref.WeakSet()  # closed at exit if still open
    _exiting: ClassVar[bool] = False  # set while the interpreter closes what was left open
    _planes: ClassVar[int] = 0  # control planes built from _control_store() in this process
    #: Whether this class's point-to-point works are waited on whole, so that the argument check
    #: (:mod:`communicator.crosscheck`) may run over them without debug mode: ``TorchComm``'s are; a
    #: subclass's own ``_isend``/``_irecv`` (a gloo transfer waited in slices may time out) are not,
    #: unless the class says so.
    whole_transfer_waits: ClassVar[bool] = False

    def __init__(self, config: CommConfig | None = None) -> None:
        self.config: CommConfig = config if config is not None else CommConfig()
        self._codec: Codec = make_codec(self.config.serializer, self.config.trusted, self.config.safe_max_expansion)
        self._reason = ""
        self._calls = CallState(self.config.trace_events)  # the guard's: see communicator.guard
        self._stats = self._observe()  # see communicator.ops.observation
        self._closed = False
        self._children: list[Communicator] = []
        self._local: Communicator | None = None
        self._port: protocol.Port | None = None
        self._gather_capacities: dict[tuple[int, int], int] = {}  # (sender, dst): see ShapeRecords._gather_to
        self._seeds_drawn = 0
        self._control: Control | None = None  # built on first use from _control_store()
        self._contexts = 0  # calls of the default _create_groups: every rank numbers its groups alike
        self._shrinks = 0  # shrink() calls without a control plane (a world of one)
        self._creator = os.getpid()  # a forked child inherits this object but must not use it
        self._inherited = False
        Communicator._open.add(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Guard a subclass's overrides of public operations too: it cannot forget the guard. The
        machinery every operation shares (``MACHINERY``) cannot be overridden: a subclass that
        defines one of its names would lose failure signalling silently."""
        super().__init_subclass__(**kwargs)
        clashes = sorted(MACHINERY & cls.__dict__.keys())
        if clashes:
            raise TypeError(
                f"{cls.__qualname__} defines {', '.join(clashes)}: the machinery every operation shares "
                "(waits, launches, the control plane) is the base class's; override the hooks instead "
                "(the primitives, the fast paths, _control_store, _teardown: see docs/custom.md)"
            )
        if ("_isend" in cls.__dict__ or "_irecv" in cls.__dict__) and "whole_transfer_waits" not in cls.__dict__:
            cls.whole_transfer_waits = False
        for name, spec in Communicator._specs.items():
            method = cls.__dict__.get(name)
            if callable(method) and not hasattr(method, "__collective__"):
                setattr(cls, name, guarded(method, spec))

    # -- creation and lifecycle ------------------------------------------------------------

    @classmethod
    def create(cls, cfg: ConfigLike = None) -> Communicator:
        """Build the right communicator for this process.

        ``cfg`` is a :class:`~communicator.config.CommConfig`, a mapping of its fields (mmengine's
        ``port`` is accepted) or ``None`` (read ``COMMUNICATOR_*`` variables). The choice, which
        ``describe()`` and ``communicator info`` explain: a registered ``type`` builds that class;
        ``launcher="none"`` gives a :class:`~communicator.transports.nondist.NonDistComm`; an initialised
        ``torch.distributed`` is adopted (not destroyed on close); launcher variables (torchrun,
        MPI, Slurm) start and own a group; otherwise a single process.
        """
        config = CommConfig.of(cfg)
        decision = decide(config, REGISTRY)
        comm: Communicator = REGISTRY[decision.type].from_config(config)
        if decision.type == SINGLE:
            comm._reason = decision.reason
        return comm

    @classmethod
    def register(cls, name: str) -> Callable[[type[CommT]], type[CommT]]:
        """Class decorator: ``Communicator.create({"type": name, ...})`` then builds the class
        with its ``from_config(config)``. Registering a name again replaces the earlier class."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"register() needs a non-empty name, got {name!r}")

        def decorate(subclass: type[CommT]) -> type[CommT]:
            if not (isinstance(subclass, type) and issubclass(subclass, Communicator)):
                raise TypeError(f"only Communicator subclasses can be registered, got {subclass!r}")
            REGISTRY[name] = subclass
            return subclass

        return decorate

    @classmethod
    def registered(cls) -> dict[str, type[Communicator]]:
        """The registered communicator classes by name."""
        return dict(REGISTRY)

    @classmethod
    def from_config(cls, config: CommConfig) -> Communicator:
        """Build an instance for ``create({"type": ...})``: by default ``cls(config)``, or, where the
        class defines the hook ``@classmethod from_launcher(cls, config, launcher)``, that hook with
        the launcher's view of this process (see :class:`~communicator.factory.FromLauncher`).

        ``TorchComm`` and ``NonDistComm`` override it, so that their subclasses are built the way
        ``create`` builds them; override it to read ``config.options``.
        """
        return build(cls, config)

    def __enter__(self: CommT) -> CommT:
        if self._closed:
            raise _closed_error("__enter__")
        self._plane()  # a subclass's control plane joins now: peers may wait for this rank's status
        Communicator._active.append(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._close(exc)

    @classmethod
    def current(cls) -> Communicator | None:
        """The communicator of the innermost open ``with`` block, or ``None``."""
        return Communicator._active[-1] if Communicator._active else None

    def close(self) -> None:
        """Release what this communicator created, its subgroups first. Safe to call twice."""
        self._close(None)

    @final
    def _close(self, error: BaseException | None) -> None:
        if self in Communicator._active:
            Communicator._active.remove(self)
        if self._closed:
            return
        self._closed = True
        Communicator._open.discard(self)
        if self._inherited:  # the parent's sockets and store entries are the parent's to close
            return
        self._calls.refusal = _closed_error
        try:
            for child in reversed(self._children):
                child._close(error)
        finally:
            self._stop_observing()
            control = self._control
            try:
                if control is not None:
                    control.close(error)
                self._teardown(error)
            finally:
                if control is not None:
                    control.release()
                self._port = None  # its channel holds the transport (a torch group: freed with the last reference)

    def _teardown(self, error: BaseException | None) -> None:
        """Release what this object created; after ``error`` (leaving a block on an exception),
        without any collective, since a peer may be gone."""

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has run (then every operation raises ``CommError``)."""
        return self._closed

    def as_process_group(self) -> torch.distributed.ProcessGroup:
        """A ``torch.distributed.ProcessGroup`` whose every operation runs through this communicator.

        Pass it where torch takes a group: ``DistributedDataParallel(process_group=...)``,
        ``DeviceMesh.from_group(...)`` (then FSDP2's ``fully_shard(mesh=...)``), or any
        ``torch.distributed.<op>(..., group=...)``. The job's own traffic then gets what this
        communicator gives its calls: a failing rank named on every rank, stalls explained,
        timeouts, statistics and hooks (see :mod:`communicator.transports.process_group`). Made
        once per communicator; its ranks are this communicator's.

        Example:
            ```python
            model = DistributedDataParallel(model, process_group=comm.as_process_group())
            ```
        """
        made: torch.distributed.ProcessGroup = provided("process_group")(self)
        return made

    def describe(self) -> str:
        """What this communicator is and why ``create`` chose it."""
        head = (
            f"{type(self).__name__}: rank {self.rank} of {self.world_size}, "
            f"backend {self.backend}, device {self.device}"
        )
        return f"{head}\n  why: {self._reason}" if self._reason else head

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank={self.rank} world_size={self.world_size} backend={self.backend}>"

    # -- primitives: what a communicator implements (see the module docstring's table) --------

    @abc.abstractmethod
    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        """Start sending ``tensor`` to rank ``dst`` and return at once, without waiting for the
        receiver; messages between two ranks with one tag are received in the order they were sent."""

    @abc.abstractmethod
    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        """Start receiving into ``tensor`` (its size is known) from rank ``src`` and return at once."""

    # -- defaults over the point-to-point (:mod:`communicator.ops.defaults`), fast paths to override --

    def _barrier(self) -> Work:
        """Start a barrier across every rank."""
        return derived.barrier(self)

    def _all_reduce(self, tensor: torch.Tensor, op: str) -> Work:
        """Start reducing ``tensor`` in place with ``op`` (sum, product, min, max, band, bor, bxor).

        ``tensor`` is contiguous, on ``self.device``; the mean is a sum divided afterwards, and a
        complex product never comes here (the base computes it with the default, see ``_reduction``).
        """
        return derived.all_reduce(self, tensor, op)

    def _broadcast(self, tensor: torch.Tensor, src: int) -> Work:
        """Start copying rank ``src``'s ``tensor`` into every rank's ``tensor``."""
        return derived.broadcast(self, tensor, src)

    def _all_gather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> Work:
        """Start filling ``outputs[r]`` with rank ``r``'s ``tensor``; every rank's has the same shape."""
        return derived.all_gather(self, outputs, tensor)

    def _gather(self, output: torch.Tensor, counts: Sequence[int], tensor: torch.Tensor, dst: int) -> Work:
        """Start sending every rank's 1-D ``tensor`` (of sizes that may differ) to ``dst``, which
        receives rank ``r``'s ``counts[r]`` elements into ``output`` after those of the ranks
        before it (``counts[dst]``: its own ``tensor``'s). Elsewhere ``output`` is empty and
        ``counts`` unused."""
        return derived.gather(self, output, counts, tensor, dst)

    def _create_groups(self, groups: list[list[int]]) -> Communicator:
        """Create a communicator for each group (lists of this communicator's ranks, in the new
        ranks' order; every rank passes the same lists) and return this rank's; a rank in none of
        them gets ``NonMemberComm.outside(self, groups)``. Default: groups over this
        communicator's point-to-point, each on tags of its own (:mod:`communicator.transports.context_group`)."""
        made: Communicator = provided("context_groups")(self, groups)
        return made

    def _shrunk(self, members: list[int], name: str) -> Communicator:
        """A new communicator over ``members`` (this one's ranks, in order), with transport
        connections and a control plane of its own (``name`` is the same on every member): what
        ``shrink()`` returns once the members are settled. Default: a transport cannot shrink."""
        raise CommError(f"shrink(): {type(self).__name__} cannot form a communicator of the survivors")

    def _reduce(self, tensor: torch.Tensor, dst: int, op: str) -> Work:
        """Start reducing into ``tensor`` on ``dst``; other ranks' ``tensor`` is scratch."""
        return derived.reduce(self, tensor, dst, op)

    def _reduce_scatter(self, output: torch.Tensor, inputs: list[torch.Tensor], op: str) -> Work:
        """Reduce ``inputs[r]`` across ranks into rank ``r``'s ``output`` (equal shapes per index).

        Default: one all-reduce of every input, waited on here.
        """
        flat = torch.cat([t.reshape(-1) for t in inputs])
        self._await([self._all_reduce(flat, op)])
        start = sum(t.numel() for t in inputs[: self.rank])
        output.copy_(flat[start : start + output.numel()].reshape(output.shape))
        return DONE

    def _object_channel(self) -> Channel:
        """How object bytes travel (default: over the tensor primitives, as uint8 CPU tensors,
        each started by ``_start``, so that a start that fails is explained like any other)."""
        primitives = (self._all_gather, self._broadcast, self._isend, self._irecv)
        gather, broadcast, send, receive = (functools.partial(self._start, primitive) for primitive in primitives)
        return PrimitiveChannel(self.rank, self.world_size, gather, broadcast, send, receive, self._await)

    def _control_store(self) -> Store | None:
        """The key-value store of this communicator's world, shared by its ranks, for the control
        plane (see :mod:`communicator.control`); ``None`` (the default): waits are bounded by the
        timeout, but a peer's failure is not signalled."""
        return None

    def _control_plane(self) -> Control | None:
        """Build this communicator's control plane (asked once, on first use): by default over
        ``_control_store()``, in a namespace of the store of its own (ranks create communicators in
        the same order, so a count of them names it alike everywhere). A communicator inside
        another's world (a subgroup) returns a child of its parent's plane instead."""
        store = self._control_store()
        if store is None:
            return None
        Communicator._planes += 1
        own = PrefixStore(f"communicator/plane{Communicator._planes}/", store)
        return Control.for_world(own, self.rank, self.world_size, self._calls, self.config, self.local_size)

    @final
    def _plane(self) -> Control | None:
        """The control plane (see ``_control_plane``), built on first use."""
        if self._control is None and not self._closed:
            self._control = self._control_plane()
        return self._control

    @final
    def _wait(self, works: Sequence[Work], timeout: float | None = None) -> None:
        """Finish ``works`` within ``timeout`` seconds (else the running call's ``timeout=``, else
        the communicator's timeout), released early by a peer's failure, refusal or closing when
        there is a control plane."""
        if timeout is None:
            timeout = self._calls.timeout  # the running call's own (see communicator.guard), if any
        if (timeout is None or timeout >= FIRST_SLICE_SECONDS) and len(works) == 1 and at_once(works[0]):
            return  # the common case, at once
        control = self._plane()
        if control is not None:
            try:
                control.wait(works, timeout)
            finally:
                self._heed(control)
            return
        limit = timeout or self.config.timeout.total_seconds()
        deadline = time.monotonic() + limit
        for work in works:
            while not finished(work, min(1.0, max(deadline - time.monotonic(), 0.001))):
                if time.monotonic() > deadline:
                    raise CommTimeoutError(f"{self._calls.op} did not finish within {limit:g} s on rank {self.rank}")

    @final
    def _heed(self, control: Control) -> None:
        """After an abandoned operation every later one is refused, and the transport lets go of it."""
        if control.broken is not None and self._calls.refusal is None:
            broken = control.broken
            self._calls.refusal = lambda what: unusable(what, broken)
            self._abandoned(broken)

    def _abandoned(self, cause: BaseException) -> None:
        """Hook: an operation was abandoned for ``cause`` (a peer failed, was lost or closed; a wait
        timed out), and the communicator is unusable from now on. Release what the transport still
        has in flight; no communication. ``TorchComm`` aborts an NCCL group here, so kernels already
        queued do not hold the GPU until the watchdog's timeout."""

    @final
    def _await(self, works: Sequence[Work], timeout: float | None = None) -> None:
        """``_wait``, its time counted as the running operation's wait (see :mod:`communicator.observe.stats`)."""
        event = self._calls.event if CallState.observers else None  # waits are timed for statistics and hooks
        if event is None:
            return self._wait(works, timeout)
        started = time.perf_counter()
        try:
            self._wait(works, timeout)
        finally:
            event.wait += time.perf_counter() - started

    def _start_failed(self, error: RuntimeError) -> CommError:
        """The error to raise when a primitive refuses to start."""
        control = self._plane()
        if control is not None:
            failure = control.launch_failed(error)
            self._heed(control)
            return failure
        text = str(error).splitlines()
        return CommError(f"{self._calls.op} failed on rank {self.rank}: {text[0] if text else type(error).__name__}")

    def _timed_barrier(self, timeout: float) -> None:
        """A barrier of at most ``timeout`` seconds that names, on every rank, the ranks that did not arrive."""
        control = self._plane()
        if control is not None:
            control.barrier(timeout)
        elif type(self)._barrier is Communicator._barrier:  # the default waits step by step: bound each step
            derived.barrier(self, timeout)
        else:
            self._await([self._barrier()], timeout)

    def _announce_bad_arguments(self, error: BaseException, what: str, collective: bool) -> None:
        """Tell the other ranks that this rank refused its arguments (peers may already be waiting);
        after a collective, this rank's next operation first settles what the others did."""
        control = self._plane()
        if control is not None:
            control.bad_arguments(error, what, collective)
            self._calls.unsettled = collective

    @final
    def _settle(self) -> None:
        """Go on only if every rank refused the collective this rank refused (see ``Control.settle``)."""
        self._calls.unsettled = False
        control = self._plane()
        if control is not None:
            try:
                control.settle()
            finally:
                self._heed(control)

    def _announce_failure(self, error: BaseException, where: str) -> None:
        """Tell the other ranks that this rank failed for good (the communicator is then unusable)."""
        control = self._plane()
        if control is not None:
            control.failed(error, where)
            self._heed(control)

    def _patient_barrier(self, timeout: float | None) -> None:
        """A barrier that may wait ``timeout`` seconds (``None``: forever) instead of the comm's timeout."""
        self._timed_barrier(float("inf") if timeout is None else timeout)

    # -- the machinery every operation shares ---------------------------------------------------

    @final
    def _stage(self, tensor: torch.Tensor) -> torch.Tensor:
        return stage(tensor, self.device)

    @final
    def _start_into(self, tensor: Tensor, start: Callable[..., Work], *args: Any) -> Work:
        """``_start`` of a primitive that writes into ``tensor``: where autograd does not record when it
        is a leaf that requires grad, and in inference mode when it is an inference tensor."""
        if tensor.requires_grad or tensor.is_inference():
            with editing(tensor):
                return while_editing(self._start(start, tensor, *args), tensor)  # a transport may write at wait
        return self._start(start, tensor, *args)

    @final
    def _start(self, start: Callable[..., Work], *args: Any) -> Work:
        """Start a primitive; from here on, peers may be waiting in this operation."""
        self._calls.started = True
        try:
            return start(*args)
        except CommError:
            raise
        except RuntimeError as error:
            raise self._start_failed(error) from error

    @overload
    def _complete(self, works: Sequence[Work], finish: Callable[[], T], async_op: Literal[False]) -> T: ...

    @overload
    def _complete(self, works: Sequence[Work], finish: Callable[[], T], async_op: bool) -> T | Handle[T]: ...

    @final
    def _complete(self, works: Sequence[Work], finish: Callable[[], T], async_op: bool) -> T | Handle[T]:
        if async_op:
            return Handle(works, finish, self._wait, self._calls.timeout)  # its wait keeps to the call's timeout
        self._await(works)
        return finish()

    @final
    def _objects(self) -> protocol.Port:
        """The object protocol's view of this communicator; using it starts communicating."""
        self._calls.started = True
        if self._port is None:
            receive = self.device if self.device.type != "cpu" else None
            self._port = protocol.Port(self._object_channel(), self._codec, receive, self.config.object_buffer_bytes)
        self._port.event = self._calls.event if CallState.observers else None  # as _await's timing
        return self._port

    def _object_collectives(self) -> protocol.Collectives:
        """What runs an object collective once its arguments are checked: the object
        protocol over :meth:`_objects` (``NonDistComm``: the identity, nothing serialised)."""
        return self._objects()

    @final
    def _compare_fingerprints(self, op: str, arguments: Mapping[str, Any], site: str) -> None:
        """Debug mode: every rank shows its call; any difference raises on every rank."""
        mine = json.dumps(fingerprint(op, self._calls.seq, arguments, site)).encode()
        check_fingerprints([json.loads(side) for side in protocol.all_gather_bytes(self._objects().channel, mine)])
        self._calls.started = False  # the operation itself has not started


#: What every operation runs through, written once here: a subclass cannot define these names.
MACHINERY = frozenset(name for name, member in vars(Communicator).items() if getattr(member, "__final__", False))


def _closed_error(what: str) -> CommError:
    return CommError(f"{what}: this communicator is closed")


def _inherited_error(creator: int, what: str) -> CommError:
    return CommError(
        f"{what}: this communicator belongs to process {creator}, which created it; process {os.getpid()} is a "
        "fork of it (a DataLoader worker, say) and cannot use it, since its connections are the creator's: "
        "communicate from the creator, or pass the worker's results back to it"
    )


def _disown_inherited() -> None:
    """In a forked child: every communicator inherited from the parent refuses its operations, and
    closing it (``close()``, a ``with`` block's end, the interpreter's exit) leaves the parent's
    connections and store entries alone."""
    for comm in list(Communicator._open):
        comm._inherited = True
        comm._calls.busy = threading.Lock()  # a call the parent was making in another thread is not the child's
        comm._calls.refusal = functools.partial(_inherited_error, comm._creator)


os.register_at_fork(after_in_child=_disown_inherited)


@atexit.register
def _close_left_open() -> None:
    """Close what a program left open before the interpreter finalises: torch's groups and stores
    torn down during finalisation (their threads still running) can abort the process."""
    Communicator._exiting = True
    for comm in list(Communicator._open):
        with contextlib.suppress(Exception):
            comm.close()


Communicator._specs = {
    name: method.__collective__
    for klass in reversed(Communicator.__mro__)
    for name, method in vars(klass).items()
    if hasattr(method, "__collective__")
}
