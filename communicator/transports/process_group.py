"""A communicator as a ``torch.distributed`` process group: torch's calls run through the communicator.

:func:`process_group_of` gives any communicator (a ``TorchComm``, a ``SubgroupComm``, a user's own
transport) a :class:`CommProcessGroup`: a ``torch.distributed.ProcessGroup`` whose every operation
is the communicator's, so ``DistributedDataParallel``, ``fully_shard`` over a ``DeviceMesh`` of it
and any ``torch.distributed`` call taking ``group=`` get the communicator's guard and control
plane: a rank's failure raises ``RemoteError`` naming it on every rank, waits are bounded, stalls
are diagnosed. Ranks are the communicator's own (``pg.rank() == comm.rank``).

A collective finishes before the call returns: its work is complete and its future holds the
output tensors, so DDP's comm hooks chain on it as usual. ``send`` and ``recv`` start and return a
work that finishes in ``wait()``. An error is raised by the call that meets it, as the
communicator raises it. :mod:`communicator.transports.backend` registers the class as torch's
``"communicator"`` backend.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)
from torch.futures import Future

from communicator.base import Communicator
from communicator.errors import CommError, NotMemberError
from communicator.factory import provide

__all__ = ["BACKEND", "CommProcessGroup", "CommWork", "adopt_group", "communicator_of", "process_group_of"]

#: The backend name torch reports for these groups (``dist.get_backend(pg)``, ``pg.name()``).
BACKEND = "communicator"
Tensor = torch.Tensor
_OP_NAMES = {
    ReduceOp.SUM: "sum",
    ReduceOp.AVG: "mean",
    ReduceOp.PRODUCT: "product",
    ReduceOp.MIN: "min",
    ReduceOp.MAX: "max",
    ReduceOp.BAND: "band",
    ReduceOp.BOR: "bor",
    ReduceOp.BXOR: "bxor",
    ReduceOp.PREMUL_SUM: "sum",  # after multiplying by the op's factor
}


class CommWork(dist.Work):
    """A torch work over a communicator operation: ``wait(timeout)``, ``is_completed()``,
    ``exception()``, ``result()`` and ``get_future()`` (whose value is the output tensors).

    A collective's work is complete when it is returned. A point-to-point work finishes in
    ``wait``, whose ``timeout`` bounds that wait (``CommTimeoutError`` when it runs out); its
    future completes then too.
    """

    def __init__(self, result: list[Tensor], pending: Any = None) -> None:
        super().__init__()
        self._result = result
        self._pending = pending  # a communicator Handle still to wait on
        self._error: BaseException | None = None
        self._future: Future[list[Tensor]] = Future()
        if pending is None:
            self._future.set_result(result)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        pending, self._pending = self._pending, None
        if pending is not None:
            limit = timeout.total_seconds()
            try:
                pending.wait(limit if limit > 0 else None)
            except BaseException as error:
                self._error = error
                self._future.set_exception(cast(Any, error))
                raise
            self._future.set_result(self._result)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        pending = self._pending
        if pending is not None and pending.is_completed():
            self.wait()  # writes the result back where the communicator staged it
        return self._pending is None

    def is_success(self) -> bool:
        return self._pending is None and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[Tensor]:
        return self._result

    def get_future(self) -> Future[list[Tensor]]:
        return self._future

    def synchronize(self) -> None:
        self.wait()


class CommProcessGroup(dist.ProcessGroup):
    """A ``torch.distributed.ProcessGroup`` whose operations are ``comm``'s (see the module docstring).

    Build one with :func:`process_group_of`; ``comm`` is the communicator behind it.
    """

    def __init__(self, comm: Communicator, owns: bool = False) -> None:
        cast(Any, super()).__init__(comm.rank, comm.world_size)
        self._comm = comm
        self._owns = owns  # made by the backend: destroying the group closes the communicator
        self._name = ""
        self._desc = ""

    @property
    def comm(self) -> Communicator:
        """The communicator every operation runs through."""
        return self._comm

    # torch's C++ side asks for these by their C++ names
    def getBackendName(self) -> str:
        return BACKEND

    def getGroupName(self) -> str:
        return self._name

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupDesc(self) -> str:
        return self._desc

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def __repr__(self) -> str:
        return f"CommProcessGroup({self._comm!r})"

    def _call(self, opts: Any, method: Callable[..., Any], *args: Any) -> Any:
        """Run a communicator operation; with a timeout in torch's options, wait at most that long."""
        limit = _limit(opts)
        if limit is None:
            return method(*args)
        return method(*args, async_op=True).wait(limit)

    # -- reductions ------------------------------------------------------------------------------

    def allreduce(self, tensors: Any, opts: Any = None) -> CommWork:  # type: ignore[override]
        opts = _options(opts, AllreduceOptions)
        tensor = _one("allreduce", tensors)
        name = _premultiply(opts, [tensor], in_place=True)[1]
        self._call(opts, self._comm.all_reduce, tensor, name)
        return CommWork([tensor])

    def allreduce_coalesced(self, tensors: list[Tensor], opts: Any = None) -> CommWork:
        """One all-reduce of the tensors flattened together (one per dtype and device)."""
        opts = _options(opts, AllreduceCoalescedOptions)
        single = AllreduceOptions()
        single.reduceOp, single.timeout = opts.reduceOp, opts.timeout
        for kind in dict.fromkeys((t.dtype, t.device) for t in tensors):
            alike = [t for t in tensors if (t.dtype, t.device) == kind]
            flat = torch.cat([t.detach().reshape(-1) for t in alike])
            self.allreduce([flat], single)
            for tensor, part in zip(alike, torch.split(flat, [t.numel() for t in alike]), strict=True):
                _fill(tensor, part)
        return CommWork(list(tensors))

    def reduce(self, tensors: Any, opts: Any = None) -> CommWork:  # type: ignore[override]
        opts = _options(opts, ReduceOptions)
        tensor = _one("reduce", tensors)
        name = _premultiply(opts, [tensor], in_place=True)[1]
        self._call(opts, self._comm.reduce, tensor, opts.rootRank, name)
        return CommWork([tensor])

    def reduce_scatter(  # type: ignore[override]
        self, output_tensors: Any, input_tensors: list[list[Tensor]], opts: Any = None
    ) -> CommWork:
        opts = _options(opts, ReduceScatterOptions)
        output = _one("reduce_scatter", output_tensors)
        inputs, name = _premultiply(opts, list(_one("reduce_scatter", input_tensors)), in_place=False)
        _fill(output, self._call(opts, self._comm.reduce_scatter, inputs, name))
        return CommWork([output])

    def _reduce_scatter_base(self, output: Tensor, tensor: Tensor, opts: Any = None) -> CommWork:
        world = self._comm.world_size
        if tensor.numel() != output.numel() * world:
            raise CommError(f"reduce_scatter_tensor: an input of {tensor.numel()} elements for {world} x {output}")
        self.reduce_scatter([output], [list(tensor.reshape(world, *output.shape).unbind(0))], opts)
        return CommWork([output])

    def reduce_scatter_single(self, output: Tensor, tensor: Tensor, opts: Any = None) -> CommWork:
        return self._reduce_scatter_base(output, tensor, opts)

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None
    ) -> CommWork:
        for output, tensor in zip(outputs, inputs, strict=True):
            self._reduce_scatter_base(output, tensor, opts)
        return CommWork(list(outputs))

    def reduce_scatter_single_coalesced(
        self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None
    ) -> CommWork:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    # -- copies ----------------------------------------------------------------------------------

    def broadcast(self, tensors: Any, opts: Any = None) -> CommWork:  # type: ignore[override]
        opts = _options(opts, BroadcastOptions)
        tensor = _one("broadcast", tensors)
        self._call(opts, self._comm.broadcast, tensor, opts.rootRank)
        return CommWork([tensor])

    def allgather(  # type: ignore[override]
        self, output_tensors: list[list[Tensor]], input_tensors: Any, opts: Any = None
    ) -> CommWork:
        opts = _options(opts, AllgatherOptions)
        outputs, tensor = _one("allgather", output_tensors), _one("allgather", input_tensors)
        if len(outputs) != self._comm.world_size:
            raise CommError(f"allgather: {len(outputs)} output tensors for {self._comm.world_size} ranks")
        same = all(o.shape == tensor.shape for o in outputs)  # every rank passes the same output shapes

        def gather(*args: Any, **kwargs: Any) -> Any:
            return self._comm.all_gather(*args, same_shape=same, **kwargs)

        for output, value in zip(outputs, self._call(opts, gather, tensor), strict=True):
            _fill(output, value)
        return CommWork(outputs)

    def allgather_coalesced(
        self, output_lists: list[list[Tensor]], input_list: list[Tensor], opts: Any = None
    ) -> CommWork:
        for outputs, tensor in zip(output_lists, input_list, strict=True):
            self.allgather([outputs], [tensor], opts)
        return CommWork([t for outputs in output_lists for t in outputs])

    def _allgather_base(self, output: Tensor, tensor: Tensor, opts: Any = None) -> CommWork:
        world = self._comm.world_size
        if output.numel() != tensor.numel() * world:
            raise CommError(f"all_gather_into_tensor: an output of {output.numel()} elements for {world} x {tensor}")
        self.allgather([list(output.view(world, *tensor.shape).unbind(0))], [tensor], opts)
        return CommWork([output])

    def all_gather_single(self, output: Tensor, tensor: Tensor, opts: Any = None) -> CommWork:
        return self._allgather_base(output, tensor, opts)

    def allgather_into_tensor_coalesced(
        self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None
    ) -> CommWork:
        for output, tensor in zip(outputs, inputs, strict=True):
            self._allgather_base(output, tensor, opts)
        return CommWork(list(outputs))

    def all_gather_single_coalesced(self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None) -> CommWork:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def gather(  # type: ignore[override]
        self, output_tensors: list[list[Tensor]], input_tensors: Any, opts: Any = None
    ) -> CommWork:
        opts = _options(opts, GatherOptions)
        gathered = self._call(opts, self._comm.gather, _one("gather", input_tensors), opts.rootRank)
        if gathered is None:  # not the destination
            return CommWork([])
        outputs = _one("gather", output_tensors)
        for output, value in zip(outputs, gathered, strict=True):
            _fill(output, value)
        return CommWork(outputs)

    def scatter(  # type: ignore[override]
        self, output_tensors: Any, input_tensors: list[list[Tensor]], opts: Any = None
    ) -> CommWork:
        opts = _options(opts, ScatterOptions)
        output, root = _one("scatter", output_tensors), opts.rootRank
        parts = _one("scatter", input_tensors) if self._comm.rank == root else None
        _fill(output, self._call(opts, self._comm.scatter, parts, root))
        return CommWork([output])

    def alltoall(self, output_tensors: list[Tensor], input_tensors: list[Tensor], opts: Any = None) -> CommWork:
        opts = _options(opts, AllToAllOptions)
        received = self._call(opts, self._comm.all_to_all, list(input_tensors))
        for output, value in zip(output_tensors, received, strict=True):
            _fill(output, value)
        return CommWork(list(output_tensors))

    def alltoall_base(
        self,
        output: Tensor,
        tensor: Tensor,
        output_split_sizes: list[int] | None,
        input_split_sizes: list[int] | None,
        opts: Any = None,
    ) -> CommWork:
        world = self._comm.world_size
        outputs = list(torch.split(output, _splits(output, output_split_sizes, world, "output")))
        inputs = list(torch.split(tensor, _splits(tensor, input_split_sizes, world, "input")))
        self.alltoall(outputs, inputs, opts)
        return CommWork([output])

    def all_to_all_single(
        self,
        output: Tensor,
        tensor: Tensor,
        output_split_sizes: list[int] | None,
        input_split_sizes: list[int] | None,
        opts: Any = None,
    ) -> CommWork:
        return self.alltoall_base(output, tensor, output_split_sizes, input_split_sizes, opts)

    # -- barriers and point to point -------------------------------------------------------------

    def barrier(self, opts: Any = None) -> CommWork:
        self._comm.barrier(_limit(opts) if isinstance(opts, BarrierOptions) else None)
        return CommWork([])

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """A barrier of at most ``timeout`` (else the communicator's timeout) that raises
        ``CommTimeoutError`` naming every rank that did not arrive (``missing_ranks``)."""
        self._comm.barrier(timeout)

    def send(self, tensors: list[Tensor], dst: int, tag: int = 0) -> CommWork:
        tensor = _one("send", tensors)
        return CommWork([tensor], self._comm.isend(tensor, dst, tag))

    def recv(self, tensors: list[Tensor], src: int, tag: int = 0) -> CommWork:
        tensor = _one("recv", tensors)
        return CommWork([tensor], self._comm.irecv(tensor, src, tag))

    def recv_anysource(self, tensors: list[Tensor], tag: int = 0) -> CommWork:
        raise CommError("recv from any source is not supported by the communicator process group: name the source")

    # -- the rest of torch's interface -------------------------------------------------------------

    def _start_coalescing(self, device: torch.device) -> None:
        """Each operation of a coalescing block runs when it is called."""

    def _end_coalescing(self, device: torch.device) -> CommWork:
        return CommWork([])

    def split_group(  # type: ignore[override]
        self,
        ranks: list[int],
        timeout: timedelta | None = None,
        opts: Any = None,
        group_name: str | None = None,
        group_desc: str | None = None,
        **_: Any,
    ) -> CommProcessGroup | None:
        """torch's split (``ProcessGroup.split_group``), by ``comm.split``: every rank of this group
        calls with the ranks (of this group) of the part it joins; a rank outside ``ranks`` gets ``None``."""
        members = sorted(ranks)
        mine = self._comm.rank in members
        sub = self._comm.split(members[0] if mine else None, self._comm.rank)
        return process_group_of(sub, group_name) if mine else None

    def shutdown(self) -> None:
        """torch's ``destroy_process_group``: closes the communicator when the backend made it."""
        if self._owns and not self._comm.closed:
            self._comm.close()

    def abort(self) -> None:
        """Make every member's pending and later operations raise (``comm.revoke()``)."""
        if not self._comm.closed:
            self._comm.revoke()


def _limit(opts: Any) -> float | None:
    """The seconds torch's options give an operation (torch leaves ``timeout`` negative when unset)."""
    timeout = getattr(opts, "timeout", None)
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else -1.0
    return seconds if seconds > 0 else None


def _fill(output: Tensor, value: Tensor) -> None:
    """Copy ``value`` into a caller's output tensor, out of autograd's sight."""
    with torch.no_grad(), torch.inference_mode(output.is_inference()):
        output.copy_(value.reshape(output.shape))


def _one(what: str, tensors: Any) -> Any:
    """The one tensor (or list) of torch's list argument: one per process, as torch has it now."""
    items: Sequence[Any] = [tensors] if isinstance(tensors, Tensor) else tensors
    if len(items) != 1:
        raise CommError(f"{what}: the communicator process group takes one tensor (list) per call, got {len(items)}")
    return items[0]


def _options(opts: Any, kind: Callable[[], Any]) -> Any:
    """``opts`` as an options object of class ``kind`` (a bare ``ReduceOp`` is its ``reduceOp``)."""
    if opts is None or isinstance(opts, (ReduceOp, ReduceOp.RedOpType)):
        made = kind()
        if opts is not None:
            made.reduceOp = opts if isinstance(opts, ReduceOp) else ReduceOp(opts)
        return made
    return opts


def _premultiply(opts: Any, tensors: list[Tensor], in_place: bool) -> tuple[list[Tensor], str]:
    """The communicator's name of ``opts.reduceOp``; for PREMUL_SUM, ``tensors`` multiplied by its
    factor (in place, or new tensors), to be summed."""
    op = opts.reduceOp
    kind = getattr(op, "op", op)
    if kind not in _OP_NAMES:
        raise CommError(f"reduce op {kind} is not supported by the communicator process group")
    if kind != ReduceOp.PREMUL_SUM:
        return tensors, _OP_NAMES[kind]
    factor = getattr(op, "factor", None)
    if factor is None:
        raise CommError("PREMUL_SUM needs a factor (torch.distributed._make_nccl_premul_sum(factor))")
    if not in_place:
        return [t * factor for t in tensors], "sum"
    with torch.no_grad():
        for tensor in tensors:
            tensor.mul_(factor)
    return tensors, "sum"


def _splits(tensor: Tensor, sizes: list[int] | None, world: int, what: str) -> list[int]:
    """All-to-all split sizes along dim 0: ``sizes``, or equal parts."""
    rows = tensor.shape[0] if tensor.dim() else 0
    if sizes:
        if len(sizes) != world or sum(sizes) != rows:
            raise CommError(f"all_to_all_single: {what} split sizes {list(sizes)} for {world} ranks and {rows} rows")
        return list(sizes)
    if rows % world:
        raise CommError(f"all_to_all_single: {rows} {what} rows do not split evenly over {world} ranks")
    return [rows // world] * world


# -- one process group per communicator, known to torch ---------------------------------------------

_made: weakref.WeakKeyDictionary[Communicator, CommProcessGroup] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_numbers = itertools.count()


def process_group_of(comm: Communicator, name: str | None = None) -> CommProcessGroup:
    """The ``torch.distributed`` process group whose operations are ``comm``'s (one per communicator).

    torch knows it as a group of ``comm.global_ranks`` (``dist.get_rank(pg)``,
    ``get_process_group_ranks``, ``DeviceMesh.from_group``, the functional collectives); pass it
    as ``process_group=`` to DDP, or as ``group=`` to any ``torch.distributed`` call.

    Raises:
        NotMemberError: ``comm`` is a non-member's view of a subgroup.
        CommError: ``comm`` is closed.
    """
    if not comm.is_member:
        raise NotMemberError("process_group_of(): this rank is not a member of the communicator's group")
    if comm.closed:
        raise CommError("process_group_of(): the communicator is closed")
    with _lock:
        made = _made.get(comm)
        if made is None or made not in dist.distributed_c10d._world.pg_map:  # new, or destroyed by torch
            made = _made[comm] = CommProcessGroup(comm)
            _enroll(made, name or f"{BACKEND}{next(_numbers)}:" + ",".join(map(str, comm.global_ranks)))
        return made


def adopt_group(comm: Communicator, group: CommProcessGroup) -> None:
    """Make ``group`` (made by the backend, registered by torch) the one ``process_group_of(comm)`` gives."""
    with _lock:
        _made[comm] = group


def communicator_of(group: dist.ProcessGroup | None) -> Communicator | None:
    """The communicator behind ``group`` (``None``: torch's default group), or ``None`` when its
    operations are not a communicator's."""
    if group is None:
        if not dist.is_initialized():
            return None
        group = dist.distributed_c10d._get_default_group()
    return group.comm if isinstance(group, CommProcessGroup) else None


def _enroll(group: CommProcessGroup, name: str) -> None:
    """Record ``group`` where torch records the groups ``new_group`` makes (not under the default tag)."""
    c10d = dist.distributed_c10d
    group_name = c10d.GroupName(name)
    group.setGroupName(group_name)
    ranks = {g: r for r, g in enumerate(group.comm.global_ranks)}
    c10d._register_pg_in_world(group, BACKEND, cast(Any, None), group_name, f"cpu:{BACKEND}", rank_mapping=ranks)


provide("process_group", process_group_of)  # Communicator.as_process_group
