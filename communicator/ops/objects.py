"""The object operations: the collectives and point to point of Python objects, and the dict
reduction and result collection over them (a mixin of ``Communicator``). Checked here, run by the
communicator's ``_object_collectives`` (the object protocol, :mod:`communicator.objects.protocol`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

import torch

import communicator.ops.dicts as dicts
from communicator.arguments import check_peer, check_rank
from communicator.config import Timeout
from communicator.crosscheck import check_arguments
from communicator.guard import CallState, collective
from communicator.objects.protocol import Collectives, Port
from communicator.ops.results import check_parts, merge_parts
from communicator.reductions import ReduceOpLike

__all__ = ["ObjectHost", "ObjectOperations"]

T = TypeVar("T")


class ObjectHost(Protocol):
    """What the object operations use of the communicator they are mixed into."""

    _calls: CallState

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOpLike = "sum") -> Any: ...

    def all_gather_object(self, obj: T) -> list[T]: ...

    def gather_object(self, obj: T, dst: int = 0) -> list[T] | None: ...

    def _objects(self) -> Port: ...

    def _object_collectives(self) -> Collectives: ...


class ObjectOperations:
    """The operations that carry any serialisable value (their names end in ``_object``) and
    return the result."""

    @collective()
    def all_gather_object(self: ObjectHost, obj: T, *, timeout: Timeout | None = None) -> list[T]:
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
    def gather_object(self: ObjectHost, obj: T, dst: int = 0, *, timeout: Timeout | None = None) -> list[T] | None:
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
        check_arguments(self, ("gather_object", dst), ("dst",))  # a root that differs would wait forever
        return self._object_collectives().gather_object(obj, dst)

    @collective("src")
    def broadcast_object(self: ObjectHost, obj: T, src: int = 0, *, timeout: Timeout | None = None) -> T:
        """``src``'s object, on every rank (other ranks' ``obj`` is ignored; pass ``None``).

        Example:
            ```python
            # rank 0: {"lr": 0.1}               rank 1: None
            comm.broadcast_object(obj, src=0)   # both: {"lr": 0.1}
            # one process: obj
            ```
        """
        src = check_rank("src", src, self.world_size)
        check_arguments(self, ("broadcast_object", src), ("src",))
        return self._object_collectives().broadcast_object(obj, src)

    @collective("objects:len", "src")
    def broadcast_object_list(
        self: ObjectHost, objects: list[Any], src: int = 0, *, timeout: Timeout | None = None
    ) -> list[Any]:
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
        check_arguments(self, ("broadcast_object_list", len(objects), src), ("len(objects)", "src"))
        received: list[Any] = self._object_collectives().broadcast_object(objects if self.rank == src else [], src)
        if len(received) != len(objects):
            raise ValueError(
                f"broadcast_object_list: rank {self.rank} has {len(objects)} items, src {src} sent {len(received)}"
            )
        objects[:] = received
        return objects

    @collective("src")
    def scatter_object(
        self: ObjectHost, objects: Sequence[T] | None, src: int = 0, *, timeout: Timeout | None = None
    ) -> T:
        """Rank ``i`` receives ``objects[i]`` from ``src``; the others pass ``None``.

        Example:
            ```python
            # rank 0 (src): ["a", "b"]          rank 1: None
            comm.scatter_object(objs, src=0)    # rank 0: "a"   rank 1: "b"
            # one process: objects[0]
            ```
        """
        src = check_rank("src", src, self.world_size)
        check_arguments(self, ("scatter_object", src), ("src",))
        return self._object_collectives().scatter_object(objects, src)

    @collective(p2p=True)
    def send_object(self: ObjectHost, obj: Any, dst: int, *, timeout: Timeout | None = None) -> None:
        """Send ``obj`` to rank ``dst``, which calls ``recv_object(src=<this rank>)``.

        If ``obj`` cannot be serialised, this rank raises and the receiver gets a ``RemoteError``.
        """
        dst = check_peer("dst", dst, self.rank, self.world_size)
        self._objects().send_object(obj, dst)

    @collective(p2p=True)
    def recv_object(self: ObjectHost, src: int, *, timeout: Timeout | None = None) -> Any:
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
    def all_reduce_dict(
        self: ObjectHost, data: Mapping[str, Any], op: ReduceOpLike = "sum", *, timeout: Timeout | None = None
    ) -> dict[str, Any]:
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
        self: ObjectHost,
        results: Sequence[T],
        size: int,
        *,
        dst: int = 0,
        order: Literal["interleave", "contiguous"] = "interleave",
        device: str = "cpu",
        timeout: Timeout | None = None,
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
        check_parts(results, size, order, device)
        dst = check_rank("dst", dst, self.world_size)
        parts = self.gather_object(list(results), dst=dst)
        return None if parts is None else merge_parts(parts, size, order)
