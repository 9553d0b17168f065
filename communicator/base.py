"""`Communicator`: the one object distributed code talks through, and the specification of every
communicator.

A subclass implements point-to-point (see the table); everything public is written here once, on
top of it: argument checks, the guard (closed and non-member communicators, sequence numbers, failure
signalling, debug fingerprints, use from two threads), device and inference-mode handling, the
finishing step (mean division, write-back), uneven gathers, object collectives, dict reduction,
result collection, seed synchronisation and subgroups.

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
                       ``_all_gather`` (equal shapes), ``_reduce_scatter``,
                       ``_create_groups``: defaults over the point-to-point
                       (:mod:`communicator.derived`) that finish before they return;
                       ``_object_channel``; ``backend``, ``device``, ``global_ranks`` and the
                       topology; ``from_config``. An override gets contiguous tensors on
                       ``self.device`` and never a complex product
**hooks**              ``_control_store()``: a store shared by the ranks (torch's
                       ``TCPStore``), asked once: failures, closings and stalls reach every
                       rank. ``_teardown(error)``: release the transport, no communication
                       after an error. The control plane's, rarely overridden:
                       ``_launch_failed(error)`` (the ``CommError`` for a primitive that
                       refused to start), ``_announce_bad_arguments``, ``_announce_failure``
                       (tell peers; never raise), ``_timed_barrier(timeout)`` (raises
                       ``CommTimeoutError`` naming late ranks), ``_patient_barrier(timeout)``
``self.config``        the :class:`~communicator.config.CommConfig` passed to ``__init__``
                       (timeout, serializer, debug, ``options`` for a subclass's own settings)
derived (written here) every public method
=====================  ====================================================================
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import functools
import json
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, ParamSpec, TypeVar, overload

import numpy as np
import torch
from torch.distributed.distributed_c10d import PrefixStore

import communicator.derived as derived
import communicator.dicts as dicts
import communicator.objects.protocol as protocol
import communicator.shapes as shapes
from communicator.agreement import agree, key
from communicator.arguments import (
    TRANSFER_TAG,
    check_output,
    check_peer,
    check_rank,
    check_tag,
    check_tensor,
    check_tensors,
)
from communicator.config import CommConfig, ConfigLike, Timeout, seconds
from communicator.control import Control
from communicator.control.log import Store
from communicator.control.waiting import finished
from communicator.coordination import Coordination
from communicator.errors import CommError, CommTimeoutError, ConfigError
from communicator.factory import SINGLE, build, decide
from communicator.fingerprints import check_fingerprints, fingerprint
from communicator.guard import CallState, Spec, collective, guarded
from communicator.handles import DONE, Handle, Work
from communicator.objects import make_codec
from communicator.objects.codec import Codec
from communicator.observe.observation import Observation
from communicator.ops import ReduceOpLike, check_op_dtype, divide_exactly, is_floating, parse_op
from communicator.ranks import RankQueries
from communicator.recovery import Recovery, unusable
from communicator.results import check_arguments, merge_parts
from communicator.splits import Splitting
from communicator.staging import editing, stage, while_editing, write_back

__all__ = ["Communicator"]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
CommT = TypeVar("CommT", bound="Communicator")
Tensor = torch.Tensor


class Communicator(
    RankQueries, Coordination, Splitting["Communicator"], Recovery["Communicator"], Observation, abc.ABC
):
    """One object for every distributed operation, the same in one process and in a job of many.

    **The rule.** *Tensor methods* (``all_reduce``, ``broadcast``, ``reduce``, ``all_gather``,
    ``gather``, ``scatter``, ``reduce_scatter``, ``all_to_all``, ``send``, ``recv``, ``isend``,
    ``irecv``) move tensors without pickling; in-place ones also return the tensor, gathers return
    new tensors, and ``async_op=True`` returns a :class:`~communicator.handles.Handle`.
    *Object methods* end in ``_object``, carry any serialisable value and **return** the result.
    Gathers return a list on the destination and ``None`` elsewhere. Every rank argument (``src``,
    ``dst``, ``peer``) and ``rank`` itself count inside this communicator.

    A communicator's operations are issued by one thread at a time; a second thread calling while
    an operation runs gets a :class:`~communicator.errors.CommError` at once.

    Create one with :meth:`create` (which picks the class) and use it as a context manager:

    ```python
    with Communicator.create() as comm:
        total = comm.all_reduce(torch.tensor([1.0]))
    ```
    """

    _registry: ClassVar[dict[str, type[Communicator]]] = {}
    _active: ClassVar[list[Communicator]] = []  # communicators whose ``with`` block is open, innermost last
    _specs: ClassVar[dict[str, Spec]] = {}  # every guarded public operation, by name
    _open: ClassVar[weakref.WeakSet[Communicator]] = weakref.WeakSet()  # closed at exit if still open
    _exiting: ClassVar[bool] = False  # set while the interpreter closes what was left open
    _planes: ClassVar[int] = 0  # control planes built from _control_store() in this process
    #: The default subgroups (set by :mod:`communicator.context_group`, a subclass this module cannot import).
    context_groups: ClassVar[Callable[[Communicator, list[list[int]]], Communicator]]

    def __init__(self, config: CommConfig | None = None) -> None:
        self.config: CommConfig = config if config is not None else CommConfig()
        self._codec: Codec = make_codec(self.config.serializer, self.config.trusted, self.config.safe_max_expansion)
        self._reason = ""
        self._calls = CallState(self.config.trace_events)  # the guard's: see communicator.guard
        self._stats = self._observe()  # see communicator.observe.observation
        self._closed = False
        self._children: list[Communicator] = []
        self._local: Communicator | None = None
        self._port: protocol.Port | None = None
        self._seeds_drawn = 0
        self._control: Control | None = None  # built on first use from _control_store()
        self._contexts = 0  # calls of the default _create_groups: every rank numbers its groups alike
        self._shrinks = 0  # shrink() calls without a control plane (a world of one)
        Communicator._open.add(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Guard a subclass's overrides of public operations too: it cannot forget the guard."""
        super().__init_subclass__(**kwargs)
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
        ``launcher="none"`` gives a :class:`~communicator.nondist.NonDistComm`; an initialised
        ``torch.distributed`` is adopted (not destroyed on close); launcher variables (torchrun,
        MPI, Slurm) start and own a group; otherwise a single process.
        """
        config = CommConfig.of(cfg)
        decision = decide(config, Communicator._registry)
        comm = Communicator._registry[decision.type].from_config(config)
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
            Communicator._registry[name] = subclass
            return subclass

        return decorate

    @classmethod
    def registered(cls) -> dict[str, type[Communicator]]:
        """The registered communicator classes by name."""
        return dict(Communicator._registry)

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

    def _close(self, error: BaseException | None) -> None:
        if self in Communicator._active:
            Communicator._active.remove(self)
        if self._closed:
            return
        self._closed = True
        Communicator._open.discard(self)
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

    # -- defaults over the point-to-point (:mod:`communicator.derived`), fast paths to override --

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

    def _create_groups(self, groups: list[list[int]]) -> Communicator:
        """Create a communicator for each group (lists of this communicator's ranks, in the new
        ranks' order; every rank passes the same lists) and return this rank's; a rank in none of
        them gets ``NonMemberComm.outside(self, groups)``. Default: groups over this
        communicator's point-to-point, each on tags of its own (:mod:`communicator.context_group`)."""
        return Communicator.context_groups(self, groups)

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

    def _object_channel(self) -> protocol.Channel:
        """How object bytes travel (default: over the tensor primitives, as uint8 CPU tensors)."""
        return protocol.PrimitiveChannel(
            self.rank, self.world_size, self._all_gather, self._broadcast, self._isend, self._irecv, self._await
        )

    def _control_store(self) -> Store | None:
        """The key-value store of this communicator's world, shared by its ranks, for the control
        plane (see :mod:`communicator.control`); ``None`` (the default): waits are bounded by the
        timeout, but a peer's failure is not signalled."""
        return None

    def _plane(self) -> Control | None:
        """The control plane, built on first use, in a namespace of the store of its own (ranks
        create communicators in the same order, so a count of them names it alike everywhere)."""
        if self._control is None and not self._closed:
            store = self._control_store()
            if store is not None:
                Communicator._planes += 1
                own = PrefixStore(f"communicator/plane{Communicator._planes}/", store)
                self._control = Control.for_world(
                    own, self.rank, self.world_size, self._calls, self.config, self.local_size
                )
        return self._control

    def _wait(self, works: Sequence[Work], timeout: float | None = None) -> None:
        """Finish ``works`` within ``timeout`` seconds (else the communicator's timeout), released
        early by a peer's failure, refusal or closing when there is a control plane."""
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

    def _heed(self, control: Control) -> None:
        """After an abandoned operation every later one is refused."""
        if control.broken is not None and self._calls.refusal is None:
            broken = control.broken
            self._calls.refusal = lambda what: unusable(what, broken)

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

    def _launch_failed(self, error: RuntimeError) -> CommError:
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

    def _announce_bad_arguments(self, error: BaseException, what: str) -> None:
        """Tell the other ranks that this rank refused its arguments (peers may already be waiting)."""
        control = self._plane()
        if control is not None:
            control.bad_arguments(error, what)

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

    def _stage(self, tensor: torch.Tensor) -> torch.Tensor:
        return stage(tensor, self.device)

    def _launch_into(self, tensor: Tensor, start: Callable[..., Work], *args: Any) -> Work:
        """``_launch`` of a primitive that writes into ``tensor``: where autograd does not record when it
        is a leaf that requires grad, and in inference mode when it is an inference tensor."""
        if tensor.requires_grad or tensor.is_inference():
            with editing(tensor):
                return while_editing(self._launch(start, tensor, *args), tensor)  # a transport may write at wait
        return self._launch(start, tensor, *args)

    def _launch(self, start: Callable[..., Work], *args: Any) -> Work:
        """Start a primitive; from here on, peers may be waiting in this operation."""
        self._calls.launched = True
        try:
            return start(*args)
        except CommError:
            raise
        except RuntimeError as error:
            raise self._launch_failed(error) from error

    @overload
    def _complete(self, works: Sequence[Work], finish: Callable[[], T], async_op: Literal[False]) -> T: ...

    @overload
    def _complete(self, works: Sequence[Work], finish: Callable[[], T], async_op: bool) -> T | Handle[T]: ...

    def _complete(self, works: Sequence[Work], finish: Callable[[], T], async_op: bool) -> T | Handle[T]:
        if async_op:
            return Handle(works, finish, self._wait)
        self._await(works)
        return finish()

    def _objects(self) -> protocol.Port:
        """The object protocol's view of this communicator; using it starts communicating."""
        self._calls.launched = True
        if self._port is None:
            receive = self.device if self.device.type != "cpu" else None
            self._port = protocol.Port(self._object_channel(), self._codec, receive, self.config.object_buffer_bytes)
        self._port.event = self._calls.event if CallState.observers else None  # as _await's timing
        return self._port

    def _object_collectives(self) -> protocol.Collectives:
        """What runs an object collective once the base has checked its arguments: the object
        protocol over :meth:`_objects` (``NonDistComm``: the identity, nothing serialised)."""
        return self._objects()

    def _compare_fingerprints(self, op: str, arguments: Mapping[str, Any], site: str) -> None:
        """Debug mode: every rank shows its call; any difference raises on every rank."""
        mine = json.dumps(fingerprint(op, self._calls.seq, arguments, site)).encode()
        check_fingerprints([json.loads(side) for side in protocol.all_gather_bytes(self._objects().channel, mine)])
        self._calls.launched = False  # the operation itself has not started

    def _metas(self, record: np.ndarray) -> list[shapes.Meta]:
        """Every rank's tensor record (see :mod:`communicator.shapes`), in rank order."""
        metas = [shapes.read(row) for row in self._objects().channel.all_gather(record)]
        shapes.agree(metas, self._calls.op)
        return metas

    def _transfers(self, sends: Mapping[int, torch.Tensor], recvs: Mapping[int, torch.Tensor]) -> list[Work]:
        """Point-to-point transfers of the library's own (receives first, on the library's tag)."""
        works = [self._launch(self._irecv, t, r, TRANSFER_TAG) for r, t in recvs.items()]
        return works + [self._launch(self._isend, t, r, TRANSFER_TAG) for r, t in sends.items()]

    # -- barrier and tensor collectives --------------------------------------------------------

    @collective()
    def barrier(self, timeout: Timeout | None = None) -> None:
        """Wait until every rank arrives; ``timeout`` (seconds or a ``timedelta``) overrides the comm's.

        Raises:
            CommTimeoutError: naming the ranks that did not arrive, where the backend can tell.
        """
        limit = seconds(timeout)
        if limit is None:
            self._await([self._launch(self._barrier)])
        else:
            self._calls.launched = True
            self._timed_barrier(limit)

    def _reducer(self, name: str, dtype: torch.dtype) -> Callable[[Tensor, str], Work]:
        """``_all_reduce``, or the default over point-to-point for what a backend computes wrongly."""
        return functools.partial(derived.all_reduce, self) if _over_p2p(name, dtype) else self._all_reduce

    def _reduction(self, tensor: Tensor, op: ReduceOpLike, dst: int | None, async_op: bool) -> Tensor | Handle[Tensor]:
        """``all_reduce`` (``dst=None``) and ``reduce``: one path, so both finish the same way."""
        tensor = check_output("tensor", tensor)
        name = parse_op(op)
        check_op_dtype(name, tensor.dtype)
        if dst is None:
            agree(self, key("all_reduce", tensor, name), ("op",))
        else:
            agree(self, key("reduce", tensor, name, dst), ("op", "dst"))
        staged = self._stage(tensor)
        if dst is not None and self.rank != dst and staged is tensor:
            with editing(tensor):
                staged = tensor.clone()  # a backend may leave partial results on other ranks
        exact = name == "mean" and not is_floating(tensor.dtype)  # every rank sees the sum, so all decide alike
        keep = staged.clone() if exact else staged
        wire_op = "sum" if name == "mean" else name
        everywhere = dst is None or exact
        if everywhere:
            work = self._launch_into(staged, self._reducer(name, staged.dtype), wire_op)
        elif _over_p2p(name, staged.dtype):
            work = self._launch_into(staged, functools.partial(derived.reduce, self), dst, wire_op)
        else:
            work = self._launch_into(staged, self._reduce, dst, wire_op)
        world, receives, n = self.world_size, dst is None or self.rank == dst, tensor.nbytes
        self._calls.count(0 if dst == self.rank else n, n if receives else 0, n)

        def finish() -> Tensor:
            if name == "mean" and (receives or exact):
                with editing(tensor, staged):
                    divide_exactly(staged, world, keep)
            if receives:
                write_back(tensor, staged)
            return tensor

        return self._complete([work], finish, async_op)

    @overload
    def all_reduce(self, tensor: Tensor, op: ReduceOpLike = ..., async_op: Literal[False] = ...) -> Tensor: ...
    @overload
    def all_reduce(self, tensor: Tensor, op: ReduceOpLike = ..., *, async_op: Literal[True]) -> Handle[Tensor]: ...
    @overload
    def all_reduce(self, tensor: Tensor, op: ReduceOpLike, async_op: bool) -> Tensor | Handle[Tensor]: ...
    @collective("tensor", "op")
    def all_reduce(self, tensor: Tensor, op: ReduceOpLike = "sum", async_op: bool = False) -> Tensor | Handle[Tensor]:
        """Reduce ``tensor`` across ranks in place and return it.

        ``op``: sum, mean, product, min, max, band, bor, bxor (any case) or a ``ReduceOp``. The
        ``mean`` of an integer tensor is exact or an error: when the sum divides by the world size
        (identical counters always do) the tensor holds the mean, otherwise ``ValueError`` is raised
        on every rank and the tensor keeps its values.

        Example:
            ```python
            # rank 0: t = tensor([1., 2.])      rank 1: t = tensor([3., 4.])
            comm.all_reduce(t)                  # both ranks: tensor([4., 6.])
            comm.all_reduce(t, op="mean")       # both ranks: tensor([4., 6.]) (the mean of equal values)
            # one process: t unchanged
            ```
        """
        return self._reduction(tensor, op, None, async_op)

    @overload
    def reduce(
        self, tensor: Tensor, dst: int = ..., op: ReduceOpLike = ..., async_op: Literal[False] = ...
    ) -> Tensor: ...
    @overload
    def reduce(
        self, tensor: Tensor, dst: int = ..., op: ReduceOpLike = ..., *, async_op: Literal[True]
    ) -> Handle[Tensor]: ...
    @overload
    def reduce(self, tensor: Tensor, dst: int, op: ReduceOpLike, async_op: bool) -> Tensor | Handle[Tensor]: ...
    @collective("tensor", "dst", "op")
    def reduce(
        self, tensor: Tensor, dst: int = 0, op: ReduceOpLike = "sum", async_op: bool = False
    ) -> Tensor | Handle[Tensor]:
        """Reduce into ``tensor`` on ``dst`` (in place); other ranks' tensors are left as they were.

        Example:
            ```python
            # rank 0: tensor([1.])              rank 1: tensor([2.])
            comm.reduce(t, dst=0)               # rank 0: tensor([3.])   rank 1: tensor([2.])
            ```
        """
        return self._reduction(tensor, op, check_rank("dst", dst, self.world_size), async_op)

    @overload
    def broadcast(self, tensor: Tensor, src: int = ..., async_op: Literal[False] = ...) -> Tensor: ...
    @overload
    def broadcast(self, tensor: Tensor, src: int = ..., *, async_op: Literal[True]) -> Handle[Tensor]: ...
    @overload
    def broadcast(self, tensor: Tensor, src: int, async_op: bool) -> Tensor | Handle[Tensor]: ...
    @collective("tensor", "src")
    def broadcast(self, tensor: Tensor, src: int = 0, async_op: bool = False) -> Tensor | Handle[Tensor]:
        """Copy ``src``'s tensor into ``tensor`` on every rank, in place, and return it.

        Example:
            ```python
            # rank 0: tensor([7])               rank 1: tensor([0])
            comm.broadcast(t, src=0)            # both: tensor([7])
            ```
        """
        tensor = check_output("tensor", tensor)
        src = check_rank("src", src, self.world_size)
        agree(self, key("broadcast", tensor, src), ("src",))
        staged = self._stage(tensor)
        work = self._launch_into(staged, self._broadcast, src)
        n = tensor.nbytes
        sent = n if src == self.rank else 0
        self._calls.count(sent, n - sent, n)

        def finish() -> Tensor:
            write_back(tensor, staged)
            return tensor

        return self._complete([work], finish, async_op)

    @overload
    def all_gather(self, tensor: Tensor, async_op: Literal[False] = ..., *, same_shape: bool = ...) -> list[Tensor]: ...
    @overload
    def all_gather(
        self, tensor: Tensor, *, async_op: Literal[True], same_shape: bool = ...
    ) -> Handle[list[Tensor]]: ...
    @overload
    def all_gather(
        self, tensor: Tensor, async_op: bool, *, same_shape: bool = ...
    ) -> list[Tensor] | Handle[list[Tensor]]: ...
    @collective("tensor:dtype", "same_shape")
    def all_gather(
        self, tensor: Tensor, async_op: bool = False, *, same_shape: bool = False
    ) -> list[Tensor] | Handle[list[Tensor]]:
        """Every rank's tensor, in rank order; shapes may differ (same ndim and dtype).

        Small CPU tensors travel inside the one record every rank sends first; larger ones follow
        in one more collective (equal shapes) or point to point. ``same_shape=True`` says that
        every rank passes the same shape: one collective, as ``torch.distributed.all_gather``,
        without the records (debug mode checks the promise; a broken one fails in the backend).

        Example:
            ```python
            # rank 0: tensor([1])               rank 1: tensor([2, 3])
            comm.all_gather(t)                  # both: [tensor([1]), tensor([2, 3])]
            # rank 0: tensor([1])               rank 1: tensor([2])
            comm.all_gather(t, same_shape=True) # both: [tensor([1]), tensor([2])]
            # one process: [a copy of t]
            ```
        """
        source = self._stage(check_tensor("tensor", tensor))
        if same_shape and not self.config.debug:
            agree(self, key("all_gather", source, True), ("same_shape",))
            outputs = [torch.empty_like(source) for _ in range(self.world_size)]
            outputs[self.rank].copy_(source)
            self._calls.count(source.nbytes, source.nbytes * (self.world_size - 1), source.nbytes * self.world_size)
            works = [self._launch(self._all_gather, outputs, source)] if self.world_size > 1 else []
            return self._complete(works, lambda: outputs, async_op)
        agree(self, ("all_gather", source.dtype, source.dim(), bool(same_shape)), ("dtype", "ndim", "same_shape"))
        metas = self._metas(shapes.describe(source))
        if same_shape:
            shapes.same_shape(metas, "all_gather")
        outputs = shapes.outputs(metas, source, self.rank, self.device)
        waiting = {r: outputs[r] for r, m in enumerate(metas) if m.data is None and r != self.rank}
        mine_inline = metas[self.rank].data is not None
        total = sum(m.nbytes for m in metas)
        self._calls.count(source.nbytes, total - source.nbytes, total)
        if all(m.data is None and m.shape == source.shape for m in metas) and self.world_size > 1:
            works = [self._launch(self._all_gather, outputs, source)]
        else:  # what did not travel inline goes point to point, whoever else did or did not
            others = [r for r in range(self.world_size) if r != self.rank]
            works = self._transfers({} if mine_inline else dict.fromkeys(others, source), waiting)
        return self._complete(works, lambda: outputs, async_op)

    @overload
    def gather(self, tensor: Tensor, dst: int = ..., async_op: Literal[False] = ...) -> list[Tensor] | None: ...
    @overload
    def gather(self, tensor: Tensor, dst: int = ..., *, async_op: Literal[True]) -> Handle[list[Tensor] | None]: ...
    @overload
    def gather(self, tensor: Tensor, dst: int, async_op: bool) -> list[Tensor] | Handle[list[Tensor] | None] | None: ...
    @collective("tensor:dtype", "dst")
    def gather(
        self, tensor: Tensor, dst: int = 0, async_op: bool = False
    ) -> list[Tensor] | Handle[list[Tensor] | None] | None:
        """Every rank's tensor on ``dst`` (a list in rank order), ``None`` elsewhere; shapes may differ.

        Example:
            ```python
            # rank 0: tensor([1])               rank 1: tensor([2])
            comm.gather(t, dst=1)               # rank 0: None   rank 1: [tensor([1]), tensor([2])]
            ```
        """
        source = self._stage(check_tensor("tensor", tensor))
        dst = check_rank("dst", dst, self.world_size)
        agree(self, ("gather", source.dtype, source.dim(), dst), ("dtype", "ndim", "dst"))
        metas = self._metas(shapes.describe(source))
        total, mine = sum(m.nbytes for m in metas), source.nbytes
        if self.rank != dst:
            self._calls.count(mine, 0, total)
            works = self._transfers({dst: source} if metas[self.rank].data is None else {}, {})
            return self._complete(works, lambda: None, async_op)
        self._calls.count(0, total - mine, total)
        outputs = shapes.outputs(metas, source, dst, self.device)
        waiting = {r: outputs[r] for r, m in enumerate(metas) if m.data is None and r != dst}
        return self._complete(self._transfers({}, waiting), lambda: outputs, async_op)

    @overload
    def scatter(self, tensors: Sequence[Tensor] | None, src: int = ..., async_op: Literal[False] = ...) -> Tensor: ...
    @overload
    def scatter(
        self, tensors: Sequence[Tensor] | None, src: int = ..., *, async_op: Literal[True]
    ) -> Handle[Tensor]: ...
    @overload
    def scatter(self, tensors: Sequence[Tensor] | None, src: int, async_op: bool) -> Tensor | Handle[Tensor]: ...
    @collective("src")
    def scatter(
        self, tensors: Sequence[Tensor] | None, src: int = 0, async_op: bool = False
    ) -> Tensor | Handle[Tensor]:
        """Rank ``i`` receives ``tensors[i]`` from ``src``; the others pass ``None``.

        Shapes may differ per destination (same ndim and dtype).

        Example:
            ```python
            # rank 0 (src): [tensor([1]), tensor([2])]    rank 1: None
            comm.scatter(ts, src=0)             # rank 0: tensor([1])   rank 1: tensor([2])
            ```
        """
        src = check_rank("src", src, self.world_size)
        agree(self, ("scatter", src), ("src",))
        sources = (
            [self._stage(t) for t in check_tensors("tensors", tensors, self.world_size)] if self.rank == src else []
        )
        records = [shapes.describe(t) for t in sources] if sources else None
        meta = shapes.read(self._objects().channel.scatter(records, src, shapes.GATHER_RECORD_BYTES))
        if self.rank == src:
            total = sum(t.nbytes for t in sources)
            self._calls.count(total - sources[src].nbytes, 0, total)
            own = shapes.outputs([meta], sources[src], 0, self.device)[0]
            assert records is not None
            sends = {r: t for r, t in enumerate(sources) if r != src and shapes.read(records[r]).data is None}
            return self._complete(self._transfers(sends, {}), lambda: own, async_op)
        received = shapes.outputs([meta], None, -1, self.device)[0]
        self._calls.count(0, meta.nbytes, meta.nbytes * self.world_size)  # the others' parts are unknown here
        works = self._transfers({}, {src: received}) if meta.data is None else []
        return self._complete(works, lambda: received, async_op)

    @overload
    def reduce_scatter(
        self, tensors: Sequence[Tensor], op: ReduceOpLike = ..., async_op: Literal[False] = ...
    ) -> Tensor: ...
    @overload
    def reduce_scatter(
        self, tensors: Sequence[Tensor], op: ReduceOpLike = ..., *, async_op: Literal[True]
    ) -> Handle[Tensor]: ...
    @overload
    def reduce_scatter(
        self, tensors: Sequence[Tensor], op: ReduceOpLike, async_op: bool
    ) -> Tensor | Handle[Tensor]: ...
    @collective("tensors", "op")
    def reduce_scatter(
        self, tensors: Sequence[Tensor], op: ReduceOpLike = "sum", async_op: bool = False
    ) -> Tensor | Handle[Tensor]:
        """Reduce ``tensors[i]`` across ranks and return the result on rank ``i``.

        Example:
            ```python
            # rank 0: [tensor([1]), tensor([2])]    rank 1: [tensor([10]), tensor([20])]
            comm.reduce_scatter(ts)             # rank 0: tensor([11])   rank 1: tensor([22])
            ```
        """
        inputs = [self._stage(t) for t in check_tensors("tensors", tensors, self.world_size)]
        name = parse_op(op)
        check_op_dtype(name, inputs[0].dtype)
        arguments = ("reduce_scatter", inputs[0].dtype, tuple(t.shape for t in inputs), name)
        agree(self, arguments, ("dtype", "shapes", "op"))
        output = torch.empty_like(inputs[self.rank])
        total = sum(t.nbytes for t in inputs)
        self._calls.count(total - output.nbytes, output.nbytes, total)
        world = self.world_size
        exact_mean = name == "mean" and not is_floating(output.dtype)  # every rank sees every sum: all decide alike
        if exact_mean or _over_p2p(name, output.dtype):
            flat = torch.cat([t.reshape(-1) for t in inputs])
            start, keep = sum(t.numel() for t in inputs[: self.rank]), flat.clone()
            work = self._launch(self._reducer(name, flat.dtype), flat, "sum" if exact_mean else name)

            def exact() -> Tensor:
                if exact_mean:
                    divide_exactly(flat, world, keep)
                return output.copy_(flat[start : start + output.numel()].reshape(output.shape))

            return self._complete([work], exact, async_op)
        work = self._launch(self._reduce_scatter, output, inputs, "sum" if name == "mean" else name)

        def finish() -> Tensor:
            if name == "mean":
                divide_exactly(output, world, output)
            return output

        return self._complete([work], finish, async_op)

    @overload
    def all_to_all(self, tensors: Sequence[Tensor], async_op: Literal[False] = ...) -> list[Tensor]: ...
    @overload
    def all_to_all(self, tensors: Sequence[Tensor], *, async_op: Literal[True]) -> Handle[list[Tensor]]: ...
    @overload
    def all_to_all(self, tensors: Sequence[Tensor], async_op: bool) -> list[Tensor] | Handle[list[Tensor]]: ...
    @collective("tensors:len")
    def all_to_all(self, tensors: Sequence[Tensor], async_op: bool = False) -> list[Tensor] | Handle[list[Tensor]]:
        """Send ``tensors[j]`` to rank ``j``; return what each rank sent here, in rank order.

        Example:
            ```python
            # rank 0: [a0, a1]                  rank 1: [b0, b1]
            comm.all_to_all(ts)                 # rank 0: [a0, b0]   rank 1: [a1, b1]
            ```
        """
        inputs = [self._stage(t) for t in check_tensors("tensors", tensors, self.world_size)]
        record = np.concatenate([shapes.describe(t, shapes.META_BYTES) for t in inputs])
        incoming = shapes.addressed_to(self._objects().channel.all_gather(record), self.rank, "all_to_all")
        outputs = shapes.outputs(incoming, inputs[self.rank], self.rank, self.device)
        others = [r for r in range(self.world_size) if r != self.rank]
        sent = sum(inputs[r].nbytes for r in others)
        self._calls.count(sent, sum(outputs[r].nbytes for r in others), sent + inputs[self.rank].nbytes)
        works = self._transfers({r: inputs[r] for r in others}, {r: outputs[r] for r in others})
        return self._complete(works, lambda: outputs, async_op)

    # -- point to point ------------------------------------------------------------------------

    @collective(p2p=True)
    def isend(self, tensor: Tensor, dst: int, tag: int = 0) -> Handle[None]:
        """Start sending ``tensor`` to rank ``dst``; ``wait()`` the handle before reusing the tensor."""
        tensor = check_tensor("tensor", tensor)
        dst, tag = check_peer("dst", dst, self.rank, self.world_size), check_tag(tag)
        work = self._launch(self._isend, self._stage(tensor).detach(), dst, tag)
        self._calls.count(tensor.nbytes, 0, tensor.nbytes)
        return Handle([work], lambda: None, self._wait)

    @collective(p2p=True)
    def irecv(self, tensor: Tensor, src: int, tag: int = 0) -> Handle[Tensor]:
        """Start receiving into ``tensor`` from rank ``src``; ``wait()`` returns the filled tensor."""
        tensor = check_output("tensor", tensor)
        src, tag = check_peer("src", src, self.rank, self.world_size), check_tag(tag)
        staged = self._stage(tensor)
        work = self._launch_into(staged, self._irecv, src, tag)
        self._calls.count(0, tensor.nbytes, tensor.nbytes)

        def finish() -> torch.Tensor:
            write_back(tensor, staged)
            return tensor

        return Handle([work], finish, self._wait)

    @collective(p2p=True)
    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to rank ``dst`` (blocking). The receiver needs the same shape and dtype."""
        self.isend(tensor, dst, tag).wait()

    @collective(p2p=True)
    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> torch.Tensor:
        """Receive into ``tensor`` from rank ``src`` (blocking) and return it."""
        return self.irecv(tensor, src, tag).wait()

    # -- object collectives: checked here, run by _object_collectives (the object protocol) -----

    @collective()
    def all_gather_object(self, obj: T) -> list[T]:
        """Every rank's object, in rank order, on every rank.

        One collective when every object fits in a record (about 2 KiB), else one more
        point-to-point exchange of the exact bytes. A rank that cannot serialise its object raises
        its error; every other rank raises :class:`~communicator.errors.RemoteError` naming it.

        Example:
            ```python
            # rank 0: {"a": 1}                  rank 1: [2, 3]
            comm.all_gather_object(obj)         # both: [{"a": 1}, [2, 3]]
            # one process: [obj]
            ```
        """
        return self._object_collectives().all_gather_object(obj)

    @collective("dst")
    def gather_object(self, obj: T, dst: int = 0) -> list[T] | None:
        """Every rank's object on ``dst`` (a list in rank order); ``None`` elsewhere. Only ``dst``
        receives the payloads.

        Example:
            ```python
            # rank 0: "a"                       rank 1: "b"
            comm.gather_object(obj, dst=1)      # rank 0: None   rank 1: ["a", "b"]
            # one process: [obj]
            ```
        """
        dst = check_rank("dst", dst, self.world_size)
        return self._object_collectives().gather_object(obj, dst)

    @collective("src")
    def broadcast_object(self, obj: T, src: int = 0) -> T:
        """``src``'s object, on every rank (other ranks' ``obj`` is ignored; pass ``None``).

        Example:
            ```python
            # rank 0: {"lr": 0.1}               rank 1: None
            comm.broadcast_object(obj, src=0)   # both: {"lr": 0.1}
            # one process: obj
            ```
        """
        src = check_rank("src", src, self.world_size)
        return self._object_collectives().broadcast_object(obj, src)

    @collective("objects:len", "src")
    def broadcast_object_list(self, objects: list[Any], src: int = 0) -> list[Any]:
        """torch-compatible: replace the items of ``objects`` in place with ``src``'s; also return it.

        Every rank passes a list of the same length.

        Example:
            ```python
            # rank 0: [1, "a"]                  rank 1: [None, None]
            comm.broadcast_object_list(objs)    # both: [1, "a"]
            ```
        """
        if not isinstance(objects, list):
            raise TypeError(f"broadcast_object_list needs a list, got {type(objects).__name__}")
        src = check_rank("src", src, self.world_size)
        received: list[Any] = self._object_collectives().broadcast_object(objects if self.rank == src else [], src)
        if len(received) != len(objects):
            raise ValueError(
                f"broadcast_object_list: rank {self.rank} has {len(objects)} items, src {src} sent {len(received)}"
            )
        objects[:] = received
        return objects

    @collective("src")
    def scatter_object(self, objects: Sequence[T] | None, src: int = 0) -> T:
        """Rank ``i`` receives ``objects[i]`` from ``src``; the others pass ``None``.

        Example:
            ```python
            # rank 0 (src): ["a", "b"]          rank 1: None
            comm.scatter_object(objs, src=0)    # rank 0: "a"   rank 1: "b"
            # one process: objects[0]
            ```
        """
        src = check_rank("src", src, self.world_size)
        return self._object_collectives().scatter_object(objects, src)

    @collective(p2p=True)
    def send_object(self, obj: Any, dst: int) -> None:
        """Send ``obj`` to rank ``dst``, which calls ``recv_object(src=<this rank>)``.

        If ``obj`` cannot be serialised, this rank raises and the receiver gets a ``RemoteError``.
        """
        dst = check_peer("dst", dst, self.rank, self.world_size)
        self._objects().send_object(obj, dst)

    @collective(p2p=True)
    def recv_object(self, src: int) -> Any:
        """Receive the object rank ``src`` sends with ``send_object``.

        Example:
            ```python
            # rank 0: comm.send_object({"x": 1}, dst=1)
            # rank 1: comm.recv_object(src=0)   # -> {"x": 1}
            ```
        """
        src = check_peer("src", src, self.rank, self.world_size)
        return self._objects().recv_object(src)

    # -- derived operations --------------------------------------------------------------------

    @collective("data:keys", "op")
    def all_reduce_dict(self, data: Mapping[str, Any], op: ReduceOpLike = "sum") -> dict[str, Any]:
        """Reduce every value of a (nested) dict across ranks; return a new dict, same structure.

        Values are tensors or Python/NumPy numbers. Dtypes are kept (an integer ``mean`` becomes
        float64 rather than truncating). Keys, shapes and dtypes are checked across ranks: a
        mismatch raises :class:`~communicator.errors.CollectiveMismatchError` on every rank,
        naming the keys. Small dicts travel in one collective; larger ones in one check plus one
        collective per dtype and device.

        Example:
            ```python
            # rank 0: {"loss": tensor(1.), "n": 2}     rank 1: {"loss": tensor(3.), "n": 4}
            comm.all_reduce_dict(d, op="mean")        # both: {"loss": tensor(2.), "n": 3.0}
            # one process: the same values (integer means as floats)
            ```
        """
        return dicts.all_reduce_dict(self, self._objects().channel, data, op, self._calls.count)

    @collective("dst", "order")
    def collect_results(
        self,
        results: Sequence[T],
        size: int,
        *,
        dst: int = 0,
        order: Literal["interleave", "contiguous"] = "interleave",
        device: str = "cpu",
    ) -> list[T] | None:
        """The first ``size`` results of all ranks on ``dst``, in dataset order; ``None`` elsewhere.

        ``order="interleave"`` matches ``DistributedSampler`` (rank ``r`` holds items ``r, r+W, ...``),
        ``"contiguous"`` concatenates parts in rank order. ``None`` items are kept; the padding a
        sampler adds is dropped by ``size``; no shared filesystem is used and only ``dst`` receives.
        ``device`` is accepted for compatibility; results always travel on the object channel.
        A ``size`` larger than the number of results held returns them all with a ``UserWarning``.

        Example:
            ```python
            # rank 0: ["a", "c"]                rank 1: ["b", "d"]
            comm.collect_results(part, size=4)  # rank 0: ["a", "b", "c", "d"]   rank 1: None
            # one process: results[:size]
            ```
        """
        check_arguments(results, size, order, device)
        dst = check_rank("dst", dst, self.world_size)
        parts = self.gather_object(list(results), dst=dst)
        return None if parts is None else merge_parts(parts, size, order)


def _over_p2p(name: str, dtype: torch.dtype) -> bool:
    """A complex product: backends multiply real and imaginary parts apart (a product of pairs,
    not of complex numbers), so it runs over the point-to-point, where it is ``torch.mul``."""
    return name == "product" and dtype.is_complex


def _closed_error(what: str) -> CommError:
    return CommError(f"{what}: this communicator is closed")


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
