"""The tensor operations: the barrier, the tensor collectives and point to point (a mixin of
``Communicator``), written once over the primitives of :mod:`communicator.base`'s table: argument
checks, staging on the device, uneven shapes, the finishing step (mean division, write-back)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar, overload

import numpy as np
import torch

import communicator.ops.defaults as derived
import communicator.ops.shapes as shapes
from communicator.arguments import (
    TRANSFER_TAG,
    check_output,
    check_rank,
    check_tensor,
    check_tensors,
)
from communicator.config import CommConfig, Timeout
from communicator.crosscheck import check_arguments, key
from communicator.guard import CallState, collective
from communicator.handles import Handle, Work, timeout_seconds
from communicator.objects.protocol import Port
from communicator.ops.staging import editing, empty, homed, write_back
from communicator.reductions import ReduceOpLike, check_op_dtype, divide_exactly, is_floating, parse_op

__all__ = ["TensorHost", "TensorOperations"]

T = TypeVar("T")
Tensor = torch.Tensor


class TensorHost(Protocol):
    """What the tensor operations use of the communicator they are mixed into."""

    config: CommConfig
    _calls: CallState
    _capacity: int
    _gather_capacities: dict[tuple[int, int], int]

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def device(self) -> torch.device: ...

    # the primitives
    def _isend(self, tensor: Tensor, dst: int, tag: int) -> Work: ...
    def _irecv(self, tensor: Tensor, src: int, tag: int) -> Work: ...
    def _barrier(self) -> Work: ...
    def _all_reduce(self, tensor: Tensor, op: str) -> Work: ...
    def _broadcast(self, tensor: Tensor, src: int) -> Work: ...
    def _all_gather(self, outputs: list[Tensor], tensor: Tensor) -> Work: ...
    def _gather(self, output: Tensor, counts: Sequence[int], tensor: Tensor, dst: int) -> Work: ...
    def _reduce(self, tensor: Tensor, dst: int, op: str) -> Work: ...
    def _reduce_scatter(self, output: Tensor, inputs: list[Tensor], op: str) -> Work: ...

    # the machinery every operation shares
    def _wait(self, works: Sequence[Work], timeout: float | None = None) -> None: ...
    def _await(self, works: Sequence[Work], timeout: float | None = None) -> None: ...
    def _timed_barrier(self, timeout: float) -> None: ...
    def _stage(self, tensor: Tensor) -> Tensor: ...
    def _start(self, start: Callable[..., Work], *args: Any) -> Work: ...
    def _start_into(self, tensor: Tensor, start: Callable[..., Work], *args: Any) -> Work: ...
    @overload
    def _complete(self, works: Sequence[Work], finish: Callable[[], T], async_op: Literal[False]) -> T: ...
    @overload
    def _complete(self, works: Sequence[Work], finish: Callable[[], T], async_op: bool) -> T | Handle[T]: ...
    def _objects(self) -> Port: ...

    # this mixin's own
    def _reducer(self, name: str, dtype: torch.dtype) -> Callable[[Tensor, str], Work]: ...
    def _reduction(
        self, tensor: Tensor, op: ReduceOpLike, dst: int | None, async_op: bool
    ) -> Tensor | Handle[Tensor]: ...
    def _metas(self, source: Tensor) -> list[shapes.Meta]: ...
    def _gather_to(
        self, tensor: Tensor, source: Tensor, dst: int, async_op: bool
    ) -> list[Tensor] | Handle[list[Tensor] | None] | None: ...
    def _gather_capacity(self, sender: int, dst: int) -> int: ...
    def _transfers(self, sends: Mapping[int, Tensor], recvs: Mapping[int, Tensor]) -> list[Work]: ...
    def isend(self, tensor: Tensor, dst: int, tag: int = 0) -> Handle[None]: ...
    def irecv(self, tensor: Tensor, src: int, tag: int = 0) -> Handle[Tensor]: ...


class TensorOperations:
    """The operations that move tensors without pickling."""

    #: What the records of this communicator's next all_gather and gather of unknown shapes
    #: carry (see ``_metas`` and ``_gather_to``).
    _capacity: int = shapes.INLINE_BYTES

    @collective()
    def barrier(self: TensorHost, timeout: Timeout | None = None) -> None:
        """Wait until every rank arrives; ``timeout`` (seconds or a ``timedelta``, also positional
        here) overrides the comm's.

        It orders the ranks' CPUs (under NCCL on the gloo companion group), not GPU work queued
        before it: call ``torch.cuda.synchronize()`` first where that matters.

        Raises:
            CommTimeoutError: naming the ranks that did not arrive, where the backend can tell.
        """
        limit = timeout_seconds(timeout, "barrier")
        if limit is None:
            self._await([self._start(self._barrier)])
        else:
            self._calls.started = True
            self._timed_barrier(limit)

    def _reducer(self: TensorHost, name: str, dtype: torch.dtype) -> Callable[[Tensor, str], Work]:
        """``_all_reduce``, or the default over point-to-point for what a backend computes wrongly."""
        return functools.partial(derived.all_reduce, self) if _over_p2p(name, dtype) else self._all_reduce

    def _reduction(
        self: TensorHost, tensor: Tensor, op: ReduceOpLike, dst: int | None, async_op: bool
    ) -> Tensor | Handle[Tensor]:
        """``all_reduce`` (``dst=None``) and ``reduce``: one path, so both finish the same way."""
        tensor = check_output("tensor", tensor)
        name = parse_op(op)
        dtype = tensor.dtype
        check_op_dtype(name, dtype)
        if dst is None:
            check_arguments(self, key("all_reduce", tensor, name), ("op",))
        else:
            check_arguments(self, key("reduce", tensor, name, dst), ("op", "dst"))
        staged = self._stage(tensor)
        if dst is not None and self.rank != dst and staged is tensor:
            with editing(tensor):
                staged = tensor.clone()  # a backend may leave partial results on other ranks
        mean = name == "mean"
        exact = mean and not is_floating(dtype)  # every rank sees the sum, so all decide alike
        keep = staged.clone() if exact else staged
        wire_op = "sum" if mean else name
        if dst is None or exact:
            work = self._start_into(staged, self._reducer(name, dtype), wire_op)
        elif _over_p2p(name, dtype):
            work = self._start_into(staged, functools.partial(derived.reduce, self), dst, wire_op)
        else:
            work = self._start_into(staged, self._reduce, dst, wire_op)
        receives = dst is None or self.rank == dst
        if CallState.observers:  # bytes are for statistics and hooks
            n = tensor.nbytes
            self._calls.count(0 if dst == self.rank else n, n if receives else 0, n)
        if not mean and staged is tensor:  # the common case: the result is in place already
            return self._complete([work], lambda: tensor, async_op)
        world = self.world_size

        def finish() -> Tensor:
            if mean and (receives or exact):
                with editing(tensor, staged):
                    divide_exactly(staged, world, keep)
            if receives:
                write_back(tensor, staged)
            return tensor

        return self._complete([work], finish, async_op)

    @overload
    def all_reduce(
        self: TensorHost,
        tensor: Tensor,
        op: ReduceOpLike = ...,
        async_op: Literal[False] = ...,
        *,
        timeout: Timeout | None = ...,
    ) -> Tensor: ...
    @overload
    def all_reduce(
        self: TensorHost,
        tensor: Tensor,
        op: ReduceOpLike = ...,
        *,
        async_op: Literal[True],
        timeout: Timeout | None = ...,
    ) -> Handle[Tensor]: ...
    @overload
    def all_reduce(
        self: TensorHost, tensor: Tensor, op: ReduceOpLike, async_op: bool, *, timeout: Timeout | None = ...
    ) -> Tensor | Handle[Tensor]: ...
    @collective("tensor", "op")
    def all_reduce(
        self: TensorHost,
        tensor: Tensor,
        op: ReduceOpLike = "sum",
        async_op: bool = False,
        *,
        timeout: Timeout | None = None,
    ) -> Tensor | Handle[Tensor]:
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
        self: TensorHost,
        tensor: Tensor,
        dst: int = ...,
        op: ReduceOpLike = ...,
        async_op: Literal[False] = ...,
        *,
        timeout: Timeout | None = ...,
    ) -> Tensor: ...
    @overload
    def reduce(
        self: TensorHost,
        tensor: Tensor,
        dst: int = ...,
        op: ReduceOpLike = ...,
        *,
        async_op: Literal[True],
        timeout: Timeout | None = ...,
    ) -> Handle[Tensor]: ...
    @overload
    def reduce(
        self: TensorHost, tensor: Tensor, dst: int, op: ReduceOpLike, async_op: bool, *, timeout: Timeout | None = ...
    ) -> Tensor | Handle[Tensor]: ...
    @collective("tensor", "dst", "op")
    def reduce(
        self: TensorHost,
        tensor: Tensor,
        dst: int = 0,
        op: ReduceOpLike = "sum",
        async_op: bool = False,
        *,
        timeout: Timeout | None = None,
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
    def broadcast(
        self: TensorHost,
        tensor: Tensor,
        src: int = ...,
        async_op: Literal[False] = ...,
        *,
        timeout: Timeout | None = ...,
    ) -> Tensor: ...
    @overload
    def broadcast(
        self: TensorHost, tensor: Tensor, src: int = ..., *, async_op: Literal[True], timeout: Timeout | None = ...
    ) -> Handle[Tensor]: ...
    @overload
    def broadcast(
        self: TensorHost, tensor: Tensor, src: int, async_op: bool, *, timeout: Timeout | None = ...
    ) -> Tensor | Handle[Tensor]: ...
    @collective("tensor", "src")
    def broadcast(
        self: TensorHost, tensor: Tensor, src: int = 0, async_op: bool = False, *, timeout: Timeout | None = None
    ) -> Tensor | Handle[Tensor]:
        """Copy ``src``'s tensor into ``tensor`` on every rank, in place, and return it.

        Example:
            ```python
            # rank 0: tensor([7])               rank 1: tensor([0])
            comm.broadcast(t, src=0)            # both: tensor([7])
            ```
        """
        tensor = check_output("tensor", tensor)
        src = check_rank("src", src, self.world_size)
        check_arguments(self, key("broadcast", tensor, src), ("src",))
        staged = self._stage(tensor)
        work = self._start_into(staged, self._broadcast, src)
        if CallState.observers:  # bytes are for statistics and hooks
            n = tensor.nbytes
            sent = n if src == self.rank else 0
            self._calls.count(sent, n - sent, n)
        if staged is tensor:
            return self._complete([work], lambda: tensor, async_op)

        def finish() -> Tensor:
            write_back(tensor, staged)
            return tensor

        return self._complete([work], finish, async_op)

    @overload
    def all_gather(
        self: TensorHost,
        tensor: Tensor,
        async_op: Literal[False] = ...,
        *,
        same_shape: bool = ...,
        timeout: Timeout | None = ...,
    ) -> list[Tensor]: ...
    @overload
    def all_gather(
        self: TensorHost,
        tensor: Tensor,
        *,
        async_op: Literal[True],
        same_shape: bool = ...,
        timeout: Timeout | None = ...,
    ) -> Handle[list[Tensor]]: ...
    @overload
    def all_gather(
        self: TensorHost, tensor: Tensor, async_op: bool, *, same_shape: bool = ..., timeout: Timeout | None = ...
    ) -> list[Tensor] | Handle[list[Tensor]]: ...
    @collective("tensor:dtype", "same_shape")
    def all_gather(
        self: TensorHost,
        tensor: Tensor,
        async_op: bool = False,
        *,
        same_shape: bool = False,
        timeout: Timeout | None = None,
    ) -> list[Tensor] | Handle[list[Tensor]]:
        """Every rank's tensor, in rank order; shapes may differ (same ndim and dtype).

        Every rank first sends a record of its tensor's shape, in one collective; a CPU tensor
        travels inside it when it fits: up to 752 bytes, or the previous all_gather's largest
        tensor rounded up to a power of two (1 MiB at most), so a gather that repeats its
        sizes is that one collective. Other tensors follow in one more collective (equal
        shapes) or point to point. ``same_shape=True`` says that every rank passes the same
        shape: one collective, as ``torch.distributed.all_gather``, without the records (debug
        mode checks the promise; a broken one fails in the backend).

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
            check_arguments(self, key("all_gather", source, True), ("same_shape",))
            outputs = [empty(source.shape, source.dtype, source.device, fault_in=True) for _ in range(self.world_size)]
            outputs[self.rank].copy_(source)
            self._calls.count(source.nbytes, source.nbytes * (self.world_size - 1), source.nbytes * self.world_size)
            works = [self._start(self._all_gather, outputs, source)] if self.world_size > 1 else []
            return _finished(self, works, homed(lambda: outputs, tensor, self.device), async_op)
        arguments = ("all_gather", source.dtype, source.dim(), bool(same_shape))
        check_arguments(self, arguments, ("dtype", "ndim", "same_shape"))
        metas = self._metas(source)
        if same_shape:
            shapes.same_shape(metas, "all_gather")
        # it sends as it receives; the records are new in this call (see _metas): the data may stay in them
        outputs = shapes.outputs(metas, source, self.rank, self.device, fault_in=True, views=True)
        waiting = {r: outputs[r] for r, m in enumerate(metas) if m.data is None and r != self.rank}
        mine_inline = metas[self.rank].data is not None
        total = sum(m.nbytes for m in metas)
        self._calls.count(source.nbytes, total - source.nbytes, total)
        if all(m.data is None and m.shape == source.shape for m in metas) and self.world_size > 1:
            works = [self._start(self._all_gather, outputs, source)]
        else:  # what did not travel inline goes point to point, whoever else did or did not
            others = [r for r in range(self.world_size) if r != self.rank]
            works = self._transfers({} if mine_inline else dict.fromkeys(others, source), waiting)
        return _finished(self, works, homed(lambda: outputs, tensor, self.device), async_op)

    @overload
    def gather(
        self: TensorHost,
        tensor: Tensor,
        dst: int = ...,
        async_op: Literal[False] = ...,
        *,
        timeout: Timeout | None = ...,
    ) -> list[Tensor] | None: ...
    @overload
    def gather(
        self: TensorHost, tensor: Tensor, dst: int = ..., *, async_op: Literal[True], timeout: Timeout | None = ...
    ) -> Handle[list[Tensor] | None]: ...
    @overload
    def gather(
        self: TensorHost, tensor: Tensor, dst: int, async_op: bool, *, timeout: Timeout | None = ...
    ) -> list[Tensor] | Handle[list[Tensor] | None] | None: ...
    @collective("tensor:dtype", "dst")
    def gather(
        self: TensorHost, tensor: Tensor, dst: int = 0, async_op: bool = False, *, timeout: Timeout | None = None
    ) -> list[Tensor] | Handle[list[Tensor] | None] | None:
        """Every rank's tensor on ``dst`` (a list in rank order), ``None`` elsewhere; shapes may differ.

        Every other rank sends ``dst`` a record of its tensor's shape, point to point, and
        ``dst`` alone reads them: a CPU tensor travels inside its record when it fits (up to 752
        bytes, or the size of the tensor the same rank sent ``dst`` in their previous gather,
        rounded up to a power of two, 1 MiB at most), so a gather that repeats its sizes sends
        one message a rank; a larger one follows its record at once.

        Example:
            ```python
            # rank 0: tensor([1])               rank 1: tensor([2])
            comm.gather(t, dst=1)               # rank 0: None   rank 1: [tensor([1]), tensor([2])]
            # rank 0: tensor([1])               rank 1: tensor([2, 3])
            comm.gather(t, dst=0)               # rank 0: [tensor([1]), tensor([2, 3])]   rank 1: None
            ```
        """
        source = self._stage(check_tensor("tensor", tensor))
        dst = check_rank("dst", dst, self.world_size)
        shapes.check_supported(source, "gather")
        check_arguments(self, ("gather", source.dtype, source.dim(), dst), ("dtype", "ndim", "dst"))
        if self.world_size > 1:
            return self._gather_to(tensor, source, dst, async_op)
        self._calls.count(0, 0, source.nbytes)
        own = shapes.outputs([shapes.described(source)], source, 0, self.device, fault_in=False)
        return _finished(self, [], homed(lambda: own, tensor, self.device), async_op)

    @overload
    def scatter(
        self: TensorHost,
        tensors: Sequence[Tensor] | None,
        src: int = ...,
        async_op: Literal[False] = ...,
        *,
        timeout: Timeout | None = ...,
    ) -> Tensor: ...
    @overload
    def scatter(
        self: TensorHost,
        tensors: Sequence[Tensor] | None,
        src: int = ...,
        *,
        async_op: Literal[True],
        timeout: Timeout | None = ...,
    ) -> Handle[Tensor]: ...
    @overload
    def scatter(
        self: TensorHost, tensors: Sequence[Tensor] | None, src: int, async_op: bool, *, timeout: Timeout | None = ...
    ) -> Tensor | Handle[Tensor]: ...
    @collective("src")
    def scatter(
        self: TensorHost,
        tensors: Sequence[Tensor] | None,
        src: int = 0,
        async_op: bool = False,
        *,
        timeout: Timeout | None = None,
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
        check_arguments(self, ("scatter", src), ("src",))
        given = check_tensors("tensors", tensors, self.world_size) if self.rank == src else []
        sources = [self._stage(t) for t in given]
        metas = [shapes.pack_meta(t) for t in sources] if sources else None
        meta = shapes.read(self._objects().channel.scatter(metas, src, shapes.GATHER_META_BYTES))
        if self.rank == src:
            total = sum(t.nbytes for t in sources)
            self._calls.count(total - sources[src].nbytes, 0, total)
            own = shapes.outputs([meta], sources[src], 0, self.device, fault_in=False)[0]
            assert metas is not None
            sends = {r: t for r, t in enumerate(sources) if r != src and shapes.read(metas[r]).data is None}
            return _finished(self, self._transfers(sends, {}), homed(lambda: own, given[src], self.device), async_op)
        received = shapes.outputs([meta], None, -1, self.device, fault_in=False)[0]
        self._calls.count(0, meta.nbytes, meta.nbytes * self.world_size)  # the others' parts are unknown here
        works = self._transfers({}, {src: received}) if meta.data is None else []
        return _finished(self, works, lambda: received, async_op)

    @overload
    def reduce_scatter(
        self: TensorHost,
        tensors: Sequence[Tensor],
        op: ReduceOpLike = ...,
        async_op: Literal[False] = ...,
        *,
        timeout: Timeout | None = ...,
    ) -> Tensor: ...
    @overload
    def reduce_scatter(
        self: TensorHost,
        tensors: Sequence[Tensor],
        op: ReduceOpLike = ...,
        *,
        async_op: Literal[True],
        timeout: Timeout | None = ...,
    ) -> Handle[Tensor]: ...
    @overload
    def reduce_scatter(
        self: TensorHost, tensors: Sequence[Tensor], op: ReduceOpLike, async_op: bool, *, timeout: Timeout | None = ...
    ) -> Tensor | Handle[Tensor]: ...
    @collective("tensors", "op")
    def reduce_scatter(
        self: TensorHost,
        tensors: Sequence[Tensor],
        op: ReduceOpLike = "sum",
        async_op: bool = False,
        *,
        timeout: Timeout | None = None,
    ) -> Tensor | Handle[Tensor]:
        """Reduce ``tensors[i]`` across ranks and return the result on rank ``i``.

        Example:
            ```python
            # rank 0: [tensor([1]), tensor([2])]    rank 1: [tensor([10]), tensor([20])]
            comm.reduce_scatter(ts)             # rank 0: tensor([11])   rank 1: tensor([22])
            ```
        """
        given = check_tensors("tensors", tensors, self.world_size)
        inputs = [self._stage(t) for t in given]
        name = parse_op(op)
        check_op_dtype(name, inputs[0].dtype)
        arguments = ("reduce_scatter", inputs[0].dtype, tuple(t.shape for t in inputs), name)
        check_arguments(self, arguments, ("dtype", "shapes", "op"))
        output = torch.empty_like(inputs[self.rank])
        total = sum(t.nbytes for t in inputs)
        self._calls.count(total - output.nbytes, output.nbytes, total)
        world = self.world_size
        exact_mean = name == "mean" and not is_floating(output.dtype)  # every rank sees every sum: all decide alike
        if exact_mean or _over_p2p(name, output.dtype):
            flat = torch.cat([t.detach().reshape(-1) for t in inputs])  # written in place: no autograd
            start, keep = sum(t.numel() for t in inputs[: self.rank]), flat.clone()
            work = self._start(self._reducer(name, flat.dtype), flat, "sum" if exact_mean else name)

            def exact() -> Tensor:
                if exact_mean:
                    divide_exactly(flat, world, keep)
                return output.copy_(flat[start : start + output.numel()].reshape(output.shape))

            return self._complete([work], homed(exact, given[self.rank], self.device), async_op)
        work = self._start(self._reduce_scatter, output, inputs, "sum" if name == "mean" else name)

        def finish() -> Tensor:
            if name == "mean":
                divide_exactly(output, world, output)
            return output

        return self._complete([work], homed(finish, given[self.rank], self.device), async_op)

    @overload
    def all_to_all(
        self: TensorHost, tensors: Sequence[Tensor], async_op: Literal[False] = ..., *, timeout: Timeout | None = ...
    ) -> list[Tensor]: ...
    @overload
    def all_to_all(
        self: TensorHost, tensors: Sequence[Tensor], *, async_op: Literal[True], timeout: Timeout | None = ...
    ) -> Handle[list[Tensor]]: ...
    @overload
    def all_to_all(
        self: TensorHost, tensors: Sequence[Tensor], async_op: bool, *, timeout: Timeout | None = ...
    ) -> list[Tensor] | Handle[list[Tensor]]: ...
    @collective("tensors:len")
    def all_to_all(
        self: TensorHost, tensors: Sequence[Tensor], async_op: bool = False, *, timeout: Timeout | None = None
    ) -> list[Tensor] | Handle[list[Tensor]]:
        """Send ``tensors[j]`` to rank ``j``; return what each rank sent here, in rank order.

        Example:
            ```python
            # rank 0: [a0, a1]                  rank 1: [b0, b1]
            comm.all_to_all(ts)                 # rank 0: [a0, b0]   rank 1: [a1, b1]
            ```
        """
        given = check_tensors("tensors", tensors, self.world_size)
        inputs = [self._stage(t) for t in given]
        meta = np.concatenate([shapes.pack_meta(t, shapes.META_BYTES) for t in inputs])
        incoming = shapes.addressed_to(self._objects().channel.all_gather(meta), self.rank, "all_to_all")
        outputs = shapes.outputs(incoming, inputs[self.rank], self.rank, self.device, fault_in=True)
        others = [r for r in range(self.world_size) if r != self.rank]
        sent = sum(inputs[r].nbytes for r in others)
        self._calls.count(sent, sum(outputs[r].nbytes for r in others), sent + inputs[self.rank].nbytes)
        works = self._transfers({r: inputs[r] for r in others}, {r: outputs[r] for r in others})
        return _finished(self, works, homed(lambda: outputs, given[self.rank], self.device), async_op)

    def _transfers(
        self: TensorHost, sends: Mapping[int, torch.Tensor], recvs: Mapping[int, torch.Tensor]
    ) -> list[Work]:
        """Point-to-point transfers of the library's own (receives first, on the library's tag)."""
        works = [self._start(self._irecv, t, r, TRANSFER_TAG) for r, t in recvs.items()]
        return works + [self._start(self._isend, t, r, TRANSFER_TAG) for r, t in sends.items()]


def _finished(host: TensorHost, works: Sequence[Work], finish: Callable[[], T], async_op: bool) -> T | Handle[T]:
    """``_complete``; a blocking call with nothing left to wait for finishes at once (a wait, even
    on nothing, sets up the control plane's watch)."""
    return host._complete(works, finish, async_op) if works or async_op else finish()


def _over_p2p(name: str, dtype: torch.dtype) -> bool:
    """A complex product: backends multiply real and imaginary parts apart (a product of pairs,
    not of complex numbers), so it runs over the point-to-point, where it is ``torch.mul``."""
    return name == "product" and dtype.is_complex
