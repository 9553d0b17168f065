"""`Communicator`: the one object distributed code talks through.

The abstract class declares the primitives (rank queries, barrier, tensor collectives, raw byte
exchange) and writes everything else once on top of them: object collectives, dict reduction,
result collection, seed synchronisation and the helpers for rank-0-only work.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, ParamSpec, TypeVar

import numpy as np
import torch

from communicator.config import CommConfig, ConfigLike
from communicator.dicts import all_reduce_dict
from communicator.errors import CollectiveMismatchError, CommError, ConfigError, RemoteError, RemoteFailure
from communicator.guard import collective, fingerprint
from communicator.ops import ReduceOpLike
from communicator.records import (
    RECORD_BYTES,
    Record,
    check_records,
    empty_record,
    failure_record,
    forwarded_record,
    frame_record,
)
from communicator.results import collect_results
from communicator.serialization import Codec, make_codec, pack_frame, receive_device, unpack_frame

if TYPE_CHECKING:
    from communicator.handles import Handle

__all__ = ["Communicator"]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
CommT = TypeVar("CommT", bound="Communicator")


class Communicator(abc.ABC):
    """One object for every distributed operation, the same in one process and in a job of many.

    **The rule.** *Tensor methods* (``all_reduce``, ``broadcast``, ``reduce``, ``all_gather``,
    ``gather``, ``scatter``, ``reduce_scatter``, ``all_to_all``, ``send``, ``recv``, ``isend``,
    ``irecv``) move tensors without pickling; in-place ones also return the tensor, gathers return
    new tensors, and ``async_op=True`` returns a :class:`~communicator.handles.Handle`.
    *Object methods* end in ``_object``, carry any serialisable value and **return** the result.
    Gathers return a list on the destination and ``None`` elsewhere. Every rank argument (``src``,
    ``dst``, ``peer``) and ``rank`` itself count inside this communicator.

    Create one with :meth:`create` (which picks the class) and use it as a context manager::

        with Communicator.create() as comm:
            total = comm.all_reduce(torch.tensor([1.0]))
    """

    _registry: ClassVar[dict[str, type[Communicator]]] = {}
    # Communicators whose ``with`` block is open, innermost last (see ``current()``).
    _active: ClassVar[list[Communicator]] = []

    def __init__(self, config: CommConfig | None = None) -> None:
        self.config: CommConfig = config if config is not None else CommConfig()
        self._codec: Codec = make_codec(self.config.serializer, self.config.trusted, self.config.safe_max_expansion)
        self._reason: str = ""
        self._closed = False
        self._seq = 0  # collectives entered so far; the same on every rank of a correct program
        self._depth = 0  # > 0 while inside a collective (nested public calls are not counted)
        self._launched = False  # whether the current collective has started communicating

    # -- creation and lifecycle ------------------------------------------------------------

    @classmethod
    def create(cls, cfg: ConfigLike = None) -> Communicator:
        """Build the right communicator for this process.

        ``cfg`` is a :class:`~communicator.config.CommConfig`, a mapping of its fields (mmengine's
        ``port`` is accepted) or ``None`` (read ``COMMUNICATOR_*`` variables). The choice:
        a registered ``type`` builds that class; ``launcher="none"`` gives a
        :class:`~communicator.nondist.NonDistComm`; an initialised ``torch.distributed`` is adopted
        (not destroyed on close); launcher variables (torchrun, MPI, Slurm) start and own a group;
        otherwise a single process. ``describe()`` says which and why.
        """
        from communicator.factory import create

        return create(cfg)

    @classmethod
    def register(cls, name: str) -> Callable[[type[CommT]], type[CommT]]:
        """Class decorator: ``Communicator.create({"type": name, ...})`` then builds the class.

        The class is built with ``from_config(config)``, by default ``cls(config)``. Registering a
        name again replaces the earlier class.
        """
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
        """Build an instance for ``create({"type": ...})``; override to read ``config.options``."""
        return cls(config)

    def __enter__(self: CommT) -> CommT:
        Communicator._active.append(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self in Communicator._active:
            Communicator._active.remove(self)
        self._release(failed=exc is not None, error=exc)

    @classmethod
    def current(cls) -> Communicator | None:
        """The communicator of the innermost open ``with`` block, or ``None``."""
        return Communicator._active[-1] if Communicator._active else None

    def close(self) -> None:
        """Release what this communicator created. Safe to call twice."""
        if self in Communicator._active:
            Communicator._active.remove(self)
        self._release(failed=False, error=None)

    def _release(self, failed: bool, error: BaseException | None) -> None:
        """Tear down what this object created; when ``failed``, without any collective."""
        self._closed = True

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has run (then every collective raises ``CommError``)."""
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

    # -- rank queries ----------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process's rank in the communicator (0-based)."""

    @property
    @abc.abstractmethod
    def world_size(self) -> int:
        """The number of ranks in the communicator."""

    @property
    @abc.abstractmethod
    def local_rank(self) -> int:
        """This process's index among the processes of its node."""

    @property
    @abc.abstractmethod
    def local_size(self) -> int:
        """The number of processes on this node."""

    @property
    @abc.abstractmethod
    def node_rank(self) -> int:
        """The index of this process's node."""

    @property
    @abc.abstractmethod
    def num_nodes(self) -> int:
        """The number of nodes in the job."""

    @property
    @abc.abstractmethod
    def backend(self) -> str:
        """The backend name (``"gloo"``, ``"nccl"``, ``"mpi"``, or ``"none"`` for one process)."""

    @property
    @abc.abstractmethod
    def device(self) -> torch.device:
        """The device tensors use for communication."""

    @property
    @abc.abstractmethod
    def global_ranks(self) -> tuple[int, ...]:
        """The world rank of each rank of this communicator, in this communicator's order."""

    def to_global(self, rank: int) -> int:
        """The world rank of this communicator's ``rank``.

        Example::

            # sub = comm.new_group([3, 1]) on 4 ranks
            sub.to_global(0)                    # 3
        """
        return self.global_ranks[self._check_rank("rank", rank)]

    def to_local(self, global_rank: int) -> int:
        """This communicator's rank for world rank ``global_rank`` (``ValueError`` if not a member).

        Example::

            # sub = comm.new_group([3, 1]) on 4 ranks
            sub.to_local(1)                     # 1
        """
        if global_rank not in self.global_ranks:
            raise ValueError(
                f"world rank {global_rank} is out of range: not a member of this communicator "
                f"(world ranks {list(self.global_ranks)})"
            )
        return self.global_ranks.index(global_rank)

    @property
    def is_distributed(self) -> bool:
        """Whether the communicator is backed by a ``torch.distributed`` group."""
        return True

    @property
    def is_main_process(self) -> bool:
        """Whether this is rank 0."""
        return self.rank == 0

    @property
    def dist_info(self) -> tuple[int, int]:
        """``(rank, world_size)``."""
        return self.rank, self.world_size

    # -- primitives: barrier and tensor collectives ----------------------------------------

    @abc.abstractmethod
    def barrier(self, timeout: float | None = None) -> None:
        """Wait until every rank arrives. ``timeout`` (seconds) overrides the communicator's.

        With a ``timeout`` the barrier goes through the rendezvous store, so that every rank can
        name the ranks that did not arrive.

        Raises:
            CommTimeoutError: naming the ranks that did not arrive, where the backend can tell.
        """

    @abc.abstractmethod
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOpLike = "sum", async_op: bool = False) -> Any:
        """Reduce ``tensor`` across ranks in place and return it.

        ``op``: sum, mean, product, min, max, band, bor, bxor (any case) or a ``ReduceOp``.
        ``mean`` of an integer tensor raises ``TypeError`` (it would truncate).

        Example::

            # rank 0: t = tensor([1., 2.])      rank 1: t = tensor([3., 4.])
            comm.all_reduce(t)                  # both ranks: tensor([4., 6.])
            # one process: t unchanged
        """

    @abc.abstractmethod
    def all_gather(self, tensor: torch.Tensor, async_op: bool = False) -> Any:
        """Every rank's tensor, in rank order; shapes may differ (same ndim and dtype).

        Example::

            # rank 0: tensor([1])               rank 1: tensor([2, 3])
            comm.all_gather(t)                  # both: [tensor([1]), tensor([2, 3])]
            # one process: [t]
        """

    @abc.abstractmethod
    def gather(self, tensor: torch.Tensor, dst: int = 0, async_op: bool = False) -> Any:
        """Every rank's tensor on ``dst`` (a list in rank order), ``None`` elsewhere; shapes may differ.

        Example::

            # rank 0: tensor([1])               rank 1: tensor([2])
            comm.gather(t, dst=1)               # rank 0: None   rank 1: [tensor([1]), tensor([2])]
        """

    @abc.abstractmethod
    def broadcast(self, tensor: torch.Tensor, src: int = 0, async_op: bool = False) -> Any:
        """Copy ``src``'s tensor into ``tensor`` on every rank, in place, and return it.

        Example::

            # rank 0: tensor([7])               rank 1: tensor([0])
            comm.broadcast(t, src=0)            # both: tensor([7])
        """

    @abc.abstractmethod
    def reduce(self, tensor: torch.Tensor, dst: int = 0, op: ReduceOpLike = "sum", async_op: bool = False) -> Any:
        """Reduce into ``tensor`` on ``dst`` (in place); other ranks' tensors are left as they were.

        Example::

            # rank 0: tensor([1.])              rank 1: tensor([2.])
            comm.reduce(t, dst=0)               # rank 0: tensor([3.])   rank 1: tensor([2.])
        """

    @abc.abstractmethod
    def scatter(self, tensors: Sequence[torch.Tensor] | None, src: int = 0, async_op: bool = False) -> Any:
        """Rank ``i`` receives ``tensors[i]`` from ``src``; the others pass ``None``.

        Shapes may differ per destination (same ndim and dtype).

        Example::

            # rank 0 (src): [tensor([1]), tensor([2])]    rank 1: None
            comm.scatter(ts, src=0)             # rank 0: tensor([1])   rank 1: tensor([2])
        """

    @abc.abstractmethod
    def reduce_scatter(self, tensors: Sequence[torch.Tensor], op: ReduceOpLike = "sum", async_op: bool = False) -> Any:
        """Reduce ``tensors[i]`` across ranks and return the result on rank ``i``.

        Example::

            # rank 0: [tensor([1]), tensor([2])]    rank 1: [tensor([10]), tensor([20])]
            comm.reduce_scatter(ts)             # rank 0: tensor([11])   rank 1: tensor([22])
        """

    @abc.abstractmethod
    def all_to_all(self, tensors: Sequence[torch.Tensor], async_op: bool = False) -> Any:
        """Send ``tensors[j]`` to rank ``j``; return what each rank sent here, in rank order.

        Example::

            # rank 0: [a0, a1]                  rank 1: [b0, b1]
            comm.all_to_all(ts)                 # rank 0: [a0, b0]   rank 1: [a1, b1]
        """

    @abc.abstractmethod
    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to rank ``dst`` (blocking). The receiver needs the same shape and dtype."""

    @abc.abstractmethod
    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> torch.Tensor:
        """Receive into ``tensor`` from rank ``src`` (blocking) and return it."""

    @abc.abstractmethod
    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Handle[None]:
        """Start sending ``tensor`` to ``dst``; the handle's ``wait()`` finishes it."""

    @abc.abstractmethod
    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Handle[torch.Tensor]:
        """Start receiving into ``tensor`` from ``src``; ``wait()`` returns the tensor."""

    # -- groups ---------------------------------------------------------------------------------

    @abc.abstractmethod
    def new_group(self, ranks: Sequence[int]) -> Communicator:
        """A communicator over ``ranks`` of this one (in the order given); every rank calls it.

        Ranks outside ``ranks`` get a communicator whose collectives raise ``NotMemberError``.
        Groups are created once and cached; closing this communicator closes them.

        Example::

            # 4 ranks
            pair = comm.new_group([3, 1])       # world rank 3 is pair.rank 0, world rank 1 is pair.rank 1
        """

    @abc.abstractmethod
    def split(self, color: int | None, key: int | None = None) -> Communicator:
        """MPI ``Comm_Split``: ranks with the same ``color`` form a group, ordered by ``key`` then rank.

        ``color=None`` joins no group (the result's collectives raise ``NotMemberError``).

        Example::

            # ranks 0..3
            half = comm.split(color=comm.rank // 2)   # ranks 0,1 -> group A; 2,3 -> group B
            half.rank                                 # rank 0: 0, rank 1: 1, rank 2: 0, rank 3: 1
        """

    @property
    @abc.abstractmethod
    def local_comm(self) -> Communicator:
        """The ranks on this node. Every rank creates every node's group, so the first access is a
        collective: make it on every rank."""

    @collective("shape")
    def grid(self, shape: tuple[int, int]) -> tuple[Communicator, Communicator]:
        """Split a ``rows x cols`` layout into ``(row, col)`` communicators.

        Rank ``r`` sits at row ``r // cols``, column ``r % cols``; ``row`` holds the ``cols`` ranks of
        its row (e.g. tensor parallel), ``col`` the ``rows`` ranks of its column (data parallel).

        Example::

            # 4 ranks, shape (2, 2)
            row, col = comm.grid((2, 2))  # rank 3: row over ranks [2, 3], col over ranks [1, 3]
        """
        if (
            not isinstance(shape, tuple)
            or len(shape) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
        ):
            raise TypeError(f"grid needs a (rows, cols) tuple of positive ints, got {shape!r}")
        rows, cols = shape
        if rows * cols != self.world_size:
            raise ValueError(
                f"grid {rows}x{cols} has {rows * cols} places but the communicator has {self.world_size} ranks"
            )
        return self.split(color=self.rank // cols), self.split(color=self.rank % cols)

    # -- primitives: raw bytes for object traffic ---------------------------------------------

    @abc.abstractmethod
    def _gather_records(self, record: np.ndarray) -> list[np.ndarray]:
        """All-gather one fixed-size uint8 record per rank (same length everywhere), in rank order."""

    def _gather_records_to(self, record: np.ndarray, dst: int) -> list[np.ndarray] | None:
        """Gather fixed-size records on ``dst`` (rank order), ``None`` elsewhere.

        By default an all-gather; a backend with a cheaper gather overrides it.
        """
        rows = self._gather_records(record)
        return rows if self.rank == dst else None

    @abc.abstractmethod
    def _broadcast_record(self, record: np.ndarray, src: int) -> np.ndarray:
        """Broadcast a fixed-size uint8 record from ``src``."""

    @abc.abstractmethod
    def _scatter_records(self, records: Sequence[np.ndarray] | None, src: int) -> np.ndarray:
        """Scatter fixed-size uint8 records from ``src``; rank ``i`` gets ``records[i]``."""

    @abc.abstractmethod
    def _exchange(self, sends: Mapping[int, np.ndarray], recvs: Mapping[int, np.ndarray]) -> None:
        """Point-to-point byte exchange: send ``sends[r]`` to ``r`` and fill ``recvs[r]`` from ``r``.

        Every receive length is known in advance, so nothing is padded.
        """

    # -- validation shared by every implementation -------------------------------------------

    def _enter(self, what: str) -> None:
        """Called first by every collective: refuse a closed (or, in subclasses, unusable) communicator."""
        if self._closed:
            raise CommError(f"{what}: this communicator is closed")
        self._seq += 1

    def _announce_bad_arguments(self, error: BaseException, what: str) -> None:  # noqa: B027 - optional hook
        """Tell the other ranks that this rank refused its arguments (peers may already be waiting)."""

    def _announce_failure(self, error: BaseException, where: str) -> None:  # noqa: B027 - optional hook
        """Tell the other ranks that this rank failed for good (the communicator is then unusable)."""

    def _compare_fingerprints(self, op: str, arguments: Mapping[str, Any]) -> None:
        """Debug mode: every rank shows its call; any difference raises on every rank."""
        import json

        mine = fingerprint(op, self._seq, arguments)
        data = json.dumps(mine).encode()[: RECORD_BYTES - 8]
        record = np.zeros(RECORD_BYTES, dtype=np.uint8)
        record[:8] = np.frombuffer(len(data).to_bytes(8, "little"), dtype=np.uint8)
        record[8 : 8 + len(data)] = np.frombuffer(data, dtype=np.uint8)
        sides = []
        for row in self._gather_records(record):
            length = int.from_bytes(row[:8].tobytes(), "little")
            try:
                sides.append(json.loads(row[8 : 8 + length].tobytes().decode(errors="replace")))
            except ValueError:
                sides.append({"op": "(unreadable fingerprint)"})
        keys = ("op", "seq", "args")
        if any(any(side.get(k) != mine.get(k) for k in keys) for side in sides):
            raise CollectiveMismatchError(
                {
                    r: f"#{side.get('seq')} {side.get('op')}({side.get('args')}) at {side.get('site')}"
                    for r, side in enumerate(sides)
                },
                "debug mode: ranks called different collectives",
            )

    def _check_rank(self, name: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int rank of this communicator, got {type(value).__name__}")
        if not 0 <= int(value) < self.world_size:
            raise ValueError(
                f"{name}={value} is out of range: expected a rank in 0..{self.world_size - 1} of this communicator"
            )
        return int(value)

    # -- object collectives ------------------------------------------------------------------

    def _encode(self, obj: Any, where: str) -> tuple[np.ndarray | None, np.ndarray, BaseException | None]:
        """(frame, record, error): a failing encoder becomes a failure record, not a hang."""
        try:
            frame = pack_frame(self._codec.encode(obj))
        except Exception as error:  # noqa: BLE001 - every encoding failure must reach the peers
            return None, failure_record(error, where), error
        return frame, frame_record(frame), None

    def _decode(self, data: memoryview, sender: int) -> Any:
        token = receive_device.set(self.device if self.device.type != "cpu" else None)
        try:
            stream, buffers = unpack_frame(data)
            return self._codec.decode(stream, buffers)
        except Exception as error:
            error.add_note(f"while decoding the object sent by rank {sender}")
            raise
        finally:
            receive_device.reset(token)

    def _decode_all(self, records: Sequence[Record], frames: Mapping[int, np.ndarray], own: T) -> list[T]:
        """Every rank's object; this rank's own is the object itself (as in one process), not a copy."""
        return [
            own if r == self.rank else self._decode(frames[r].data if rec.is_large else rec.inline, r)
            for r, rec in enumerate(records)
        ]

    @collective()
    def all_gather_object(self, obj: T) -> list[T]:
        """Every rank's object, in rank order, on every rank.

        One collective when every object fits in a record (about 2 KiB), else one more
        point-to-point exchange of the exact bytes. A rank that cannot serialise its object raises
        its error; every other rank raises :class:`~communicator.errors.RemoteError` naming it.

        Example::

            # rank 0: {"a": 1}                  rank 1: [2, 3]
            comm.all_gather_object(obj)         # both: [{"a": 1}, [2, 3]]
            # one process: [obj]
        """
        where = "all_gather_object"
        frame, record, error = self._encode(obj, where)
        records = check_records(self._gather_records(record), range(self.world_size), self.rank, error, where)
        assert frame is not None
        frames = {
            r: np.empty(rec.length, dtype=np.uint8) for r, rec in enumerate(records) if rec.is_large and r != self.rank
        }
        sends = {r: frame for r in range(self.world_size) if r != self.rank} if records[self.rank].is_large else {}
        self._exchange(sends, frames)
        return self._decode_all(records, frames, own=obj)

    @collective("dst")
    def gather_object(self, obj: T, dst: int = 0) -> list[T] | None:
        """Every rank's object on ``dst`` (a list in rank order); ``None`` elsewhere.

        Only ``dst`` receives the payloads. Example::

            # rank 0: "a"                       rank 1: "b"
            comm.gather_object(obj, dst=1)      # rank 0: None   rank 1: ["a", "b"]
            # one process: [obj]
        """
        dst = self._check_rank("dst", dst)
        where = "gather_object"
        frame, record, error = self._encode(obj, where)
        rows = self._gather_records_to(record, dst)
        # Only dst saw every record: it tells everyone whether a rank failed, so every rank raises.
        status = empty_record()
        records = [Record(row) for row in rows] if rows is not None else []
        failures = [f for r, rec in enumerate(records) if (f := rec.failure(r)) is not None]
        if failures:
            status = forwarded_record(failures[0])
        check_records([self._broadcast_record(status, dst)], [dst], self.rank, error, where)
        assert frame is not None
        if self.rank != dst:
            self._exchange({dst: frame} if Record(record).is_large else {}, {})
            return None
        frames = {r: np.empty(rec.length, dtype=np.uint8) for r, rec in enumerate(records) if rec.is_large and r != dst}
        self._exchange({}, frames)
        return self._decode_all(records, frames, own=obj)

    @collective("src")
    def broadcast_object(self, obj: T, src: int = 0) -> T:
        """``src``'s object, on every rank (other ranks' ``obj`` is ignored; pass ``None``).

        Example::

            # rank 0: {"lr": 0.1}               rank 1: None
            comm.broadcast_object(obj, src=0)   # both: {"lr": 0.1}
            # one process: obj
        """
        src = self._check_rank("src", src)
        where = "broadcast_object"
        frame: np.ndarray | None = None
        error: BaseException | None = None
        record = empty_record()
        if self.rank == src:
            frame, record, error = self._encode(obj, where)
        received = self._broadcast_record(record, src)
        rec = check_records([received], [src], self.rank, error, where)[0]
        if self.rank == src:
            if rec.is_large:
                assert frame is not None
                self._exchange({r: frame for r in range(self.world_size) if r != src}, {})
            return obj
        if not rec.is_large:
            return self._decode(rec.inline, src)  # type: ignore[no-any-return]
        data = np.empty(rec.length, dtype=np.uint8)
        self._exchange({}, {src: data})
        return self._decode(data.data, src)  # type: ignore[no-any-return]

    @collective("objects:len", "src")
    def broadcast_object_list(self, objects: list[Any], src: int = 0) -> list[Any]:
        """torch-compatible: replace the items of ``objects`` in place with ``src``'s; also return it.

        Every rank passes a list of the same length. Example::

            # rank 0: [1, "a"]                  rank 1: [None, None]
            comm.broadcast_object_list(objs)    # both: [1, "a"]
        """
        if not isinstance(objects, list):
            raise TypeError(f"broadcast_object_list needs a list, got {type(objects).__name__}")
        received: list[Any] = self.broadcast_object(objects if self.rank == src else [], src)
        if len(received) != len(objects):
            raise ValueError(
                f"broadcast_object_list: rank {self.rank} passed {len(objects)} items, src {src} sent {len(received)}"
            )
        objects[:] = received
        return objects

    @collective("src")
    def scatter_object(self, objects: Sequence[T] | None, src: int = 0) -> T:
        """Rank ``i`` receives ``objects[i]`` from ``src``; the others pass ``None``.

        Example::

            # rank 0 (src): ["a", "b"]          rank 1: None
            comm.scatter_object(objs, src=0)    # rank 0: "a"   rank 1: "b"
            # one process: objects[0]
        """
        src = self._check_rank("src", src)
        where = "scatter_object"
        frames: list[np.ndarray] = []
        rows: list[np.ndarray] | None = None
        error: BaseException | None = None
        if self.rank == src:
            frames, rows, error = self._encode_each(objects, where)
        rec = check_records([self._scatter_records(rows, src)], [src], self.rank, error, where)[0]
        if self.rank == src:
            assert rows is not None
            large = {r: frames[r] for r in range(self.world_size) if r != src and Record(rows[r]).is_large}
            self._exchange(large, {})
            assert objects is not None
            return objects[src]
        if not rec.is_large:
            return self._decode(rec.inline, src)  # type: ignore[no-any-return]
        data = np.empty(rec.length, dtype=np.uint8)
        self._exchange({}, {src: data})
        return self._decode(data.data, src)  # type: ignore[no-any-return]

    def _encode_each(
        self, objects: Sequence[Any] | None, where: str
    ) -> tuple[list[np.ndarray], list[np.ndarray], BaseException | None]:
        """Frames and records for a scatter; on any failure, a failure record for every rank."""
        if objects is None or isinstance(objects, (str, bytes)) or len(objects) != self.world_size:
            got = "None" if objects is None else f"{type(objects).__name__} of length {len(objects)}"
            error = ValueError(f"{where}: src must pass a sequence of {self.world_size} objects, got {got}")
            return [], [failure_record(error, where)] * self.world_size, error
        frames, rows = [], []
        for item in objects:
            frame, record, item_error = self._encode(item, where)
            if item_error is not None:
                return [], [record] * self.world_size, item_error
            assert frame is not None
            frames.append(frame)
            rows.append(record)
        return frames, rows, None

    @collective(p2p=True)
    def send_object(self, obj: Any, dst: int) -> None:
        """Send ``obj`` to rank ``dst``, which calls ``recv_object(src=<this rank>)``.

        If ``obj`` cannot be serialised, this rank raises and the receiver gets a ``RemoteError``.
        """
        dst = self._check_rank("dst", dst)
        if dst == self.rank:
            raise ValueError(f"send_object: dst={dst} is this rank; a rank cannot send to itself")
        frame, record, error = self._encode(obj, "send_object")
        self._exchange({dst: record}, {})
        if error is not None:
            raise error
        assert frame is not None
        if Record(record).is_large:
            self._exchange({dst: frame}, {})

    @collective(p2p=True)
    def recv_object(self, src: int) -> Any:
        """Receive the object rank ``src`` sends with ``send_object``.

        Example::

            # rank 0: comm.send_object({"x": 1}, dst=1)
            # rank 1: comm.recv_object(src=0)   # -> {"x": 1}
        """
        src = self._check_rank("src", src)
        if src == self.rank:
            raise ValueError(f"recv_object: src={src} is this rank; a rank cannot receive from itself")
        raw = np.empty(RECORD_BYTES, dtype=np.uint8)
        self._exchange({}, {src: raw})
        rec = check_records([raw], [src], self.rank, None, "send_object")[0]
        if not rec.is_large:
            return self._decode(rec.inline, src)
        data = np.empty(rec.length, dtype=np.uint8)
        self._exchange({}, {src: data})
        return self._decode(data.data, src)

    # -- derived operations --------------------------------------------------------------------

    @collective("data:keys", "op")
    def all_reduce_dict(self, data: Mapping[str, Any], op: ReduceOpLike = "sum") -> dict[str, Any]:
        """Reduce every value of a (nested) dict across ranks; return a new dict, same structure.

        Values are tensors or Python/NumPy numbers. Dtypes are kept (an integer ``mean`` becomes
        float64 rather than truncating). Keys, shapes and dtypes are checked across ranks: a
        mismatch raises :class:`~communicator.errors.CollectiveMismatchError` on every rank,
        naming the keys. Small dicts travel in one collective; larger ones in one check plus one
        collective per dtype and device.

        Example::

            # rank 0: {"loss": tensor(1.), "n": 2}     rank 1: {"loss": tensor(3.), "n": 4}
            comm.all_reduce_dict(d, op="mean")        # both: {"loss": tensor(2.), "n": 3.0}
            # one process: the same values (integer means as floats)
        """
        return all_reduce_dict(self, data, op)

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

        Example::

            # rank 0: ["a", "c"]                rank 1: ["b", "d"]
            comm.collect_results(part, size=4)  # rank 0: ["a", "b", "c", "d"]   rank 1: None
            # one process: results[:size]
        """
        return collect_results(self, results, size, dst, order, device)

    @collective()
    def sync_random_seed(self, seed: int | None = None) -> int:
        """One seed, drawn on rank 0 (or ``seed`` from rank 0), returned on every rank.

        The global Python, NumPy and torch random states are not touched.

        Example::

            # rank 0 draws 1234                 rank 1 passes nothing
            comm.sync_random_seed()             # both: 1234
        """
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        drawn = random.SystemRandom().randrange(2**31) if seed is None else seed
        chosen: int = self.broadcast_object(drawn if self.is_main_process else 0, src=0)
        return chosen

    @collective()
    def check_random_states(self) -> bool:
        """Whether the Python, NumPy and torch global RNG states agree on every rank."""
        digest = _rng_digest()
        return len(set(self.all_gather_object(digest))) == 1

    def main_only(self, fn: Callable[P, R]) -> Callable[P, R | None]:
        """Decorator: run ``fn`` on rank 0 only; other ranks get ``None``. No communication."""

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            return fn(*args, **kwargs) if self.is_main_process else None

        return wrapper

    #: mmengine's name for :meth:`main_only`.
    master_only = main_only

    @contextlib.contextmanager
    def fail_together(self, name: str = "block") -> Iterator[None]:
        """If any rank raises inside the block, every rank raises :class:`RemoteError` naming it.

        Ranks blocked in a collective inside the block are released within a fraction of a second
        (they watch the failure board), not at the timeout. When no rank raises, leaving the block
        costs one small collective. On the failing rank the ``RemoteError`` is chained to its own
        exception. After a failure the communicator is unusable: leave its ``with`` block.

        Example::

            with comm.fail_together("evaluation"):
                results = evaluate(model)        # rank 1 raises ValueError
            # every rank: RemoteError("evaluation: rank 1 raised ValueError: ...")
        """
        try:
            yield
        except RemoteError:
            raise
        except BaseException as error:
            self._announce_failure(error, name)
            raise RemoteError([_failure_of(self.rank, error, name)], context=name) from error
        records = self._gather_records(empty_record())
        check_records(records, range(self.world_size), self.rank, None, name)

    @contextlib.contextmanager
    def wait_for_main(self, timeout: float | None = None) -> Iterator[bool]:
        """A block that rank 0 may take long over while the others wait at its end, without
        tripping the collective timeout (``timeout`` seconds, default: no limit).

        Yields ``is_main_process``; if rank 0 raises, the others raise ``RemoteError`` at once.

        Example::

            with comm.wait_for_main() as main:
                if main:
                    build_cache()                # rank 0, an hour
            # every rank continues once rank 0 is done
        """
        try:
            yield self.is_main_process
        except BaseException as error:
            self._announce_failure(error, "wait_for_main")
            raise
        self._patient_barrier(timeout)

    def _patient_barrier(self, timeout: float | None) -> None:
        """A barrier that may wait ``timeout`` seconds (``None``: forever) instead of the comm's timeout."""
        self.barrier(timeout)

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Rank 0 runs the block first (e.g. to download or cache), then the others run it."""
        if not self.is_main_process:
            self.barrier()
        try:
            yield
        finally:
            if self.is_main_process:
                self.barrier()


def check_split_arguments(color: object, key: object) -> None:
    """``split``'s argument checks, shared by every implementation."""
    for name, value in (("color", color), ("key", key)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"split: {name} must be an int or None, got {type(value).__name__}")
    if isinstance(color, int) and color < 0:
        raise ValueError(f"split: color must be >= 0 (or None to join no group), got {color}")


def _failure_of(rank: int, error: BaseException, where: str) -> RemoteFailure:
    import traceback

    return RemoteFailure(rank, type(error).__name__, str(error), "".join(traceback.format_exception(error)), where)


def _rng_digest() -> str:
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    h.update(repr(random.getstate()).encode())
    h.update(repr(np.random.get_state(legacy=True)).encode())
    h.update(torch.get_rng_state().numpy().tobytes())
    return h.hexdigest()
