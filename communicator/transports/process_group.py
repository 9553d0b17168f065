"""A communicator as a ``torch.distributed`` process group: torch's calls run through the communicator.

:func:`process_group_of` gives any communicator (a ``TorchComm``, a ``SubgroupComm``, a user's own
transport) a :class:`CommProcessGroup`: a ``torch.distributed.ProcessGroup`` whose every operation
is the communicator's, so ``DistributedDataParallel``, ``fully_shard`` over a ``DeviceMesh`` of it
and any ``torch.distributed`` call taking ``group=`` get the communicator's guard and control
plane: a rank's failure raises ``RemoteError`` naming it on every rank, waits are bounded, stalls
are diagnosed. Ranks are the communicator's own (``pg.rank() == comm.rank``).

A collective that torch starts asynchronously (DDP's bucket all-reduces, FSDP's all-gathers and
reduce-scatters, any call with ``async_op=True``) is started and returned at once; the group's
completer thread finishes the works in issue order and completes their futures, outputs written
first (see :mod:`communicator.transports.pg_works`), so DDP overlaps its all-reduces with the rest
of backward as over gloo's own group. A blocking call (``async_op=False``) and a barrier run to
their end in the calling thread, after the works issued before them. ``send`` and ``recv`` start
and return a work that finishes in ``wait()``. An error that an operation meets before it starts
(a bad argument, a refusal) is raised by the call; one met while it runs is its work's, raised by
``wait()`` and by a wait on its future, as the communicator raises it.
:mod:`communicator.transports.backend` registers the class as torch's ``"communicator"`` backend.
"""

from __future__ import annotations

import contextlib
import functools
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

from communicator.base import Communicator
from communicator.errors import CommError, NotMemberError
from communicator.factory import provide
from communicator.guard import CallState
from communicator.handles import Handle
from communicator.observe.events import OP, RUNNING, STATE
from communicator.transports.pg_works import CommWork, Completer

__all__ = ["BACKEND", "CommProcessGroup", "CommWork", "adopt_group", "communicator_of", "process_group_of"]

_graph_task: Callable[[], int] = torch._C._current_graph_task_id  # -1 outside a backward pass
_engine: Any = torch.autograd.Variable._execution_engine
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
    ReduceOp.PREMUL_SUM: "premul_sum",  # a sum after multiplying by the op's factor
}
_BY_CODE = {int(cast(Any, op)): name for op, name in _OP_NAMES.items()}  # hashing torch's enum costs more than an int


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
        self._completer: Completer | None = None  # started with the first asynchronous operation
        self._coalesced: list[CommWork] | None = None  # the works of a coalescing block, while one is open
        self._task, self._task_works = -1, list[CommWork]()  # the backward pass issuing works, and its works

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

    # -- starting an operation -------------------------------------------------------------------

    def _start(
        self,
        opts: Any,
        result: list[Tensor],
        method: Callable[..., Any],
        *args: Any,
        fill: Callable[[Any], None] | None = None,
        **kwargs: Any,
    ) -> CommWork:
        """Run ``method``, a communicator operation that takes ``async_op``: started, its work
        completed by the completer, where torch starts it asynchronously; else to its end here.
        ``fill`` writes its value into the caller's outputs; ``result`` is the work's."""
        limit = _limit(opts)
        completer = self._completer_for(opts)
        if completer is None:
            value = method(*args, **kwargs) if limit is None else method(*args, async_op=True, **kwargs).wait(limit)
            if fill is not None:
                fill(value)
            return CommWork(result)
        handle = method(*args, async_op=True, **kwargs)
        # Always a limit of its own: without one, a handle's wait takes the running call's, which
        # is whatever the issuing thread runs by then.
        seconds = limit if limit is not None else self._comm.config.timeout.total_seconds()
        device = self._comm.device

        def finish() -> None:
            # A thread starts on the first GPU: a stream-ordered wait must order the communicator's
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                value = handle.wait(seconds)
                if fill is not None:
                    fill(value)

        name = str(getattr(method, "__name__", None) or getattr(getattr(method, "func", None), "__name__", ""))
        work = completer.submit(CommWork(result, finish, name, shown=_shown(self._comm, name)))
        if self._coalesced is not None:
            self._coalesced.append(work)
        self._settle_in_backward(work)
        return work

    def _settle_in_backward(self, work: CommWork) -> None:
        """Issued inside a backward pass (DDP's bucket all-reduces, FSDP's reduce-scatters): the
        pass waits for it at its end, so that its error comes out of ``backward()`` as it was
        raised. DDP waits on the future in C++, where torch keeps only the error's text."""
        task = _graph_task()
        if task < 0:
            return
        if task != self._task:
            self._task, self._task_works = task, []
            _engine.queue_callback(functools.partial(_wait_all, self._task_works))  # before DDP's own, queued later
        self._task_works.append(work)

    def _completer_for(self, opts: Any) -> Completer | None:
        """The completer for an operation torch starts asynchronously; ``None`` where it runs here:
        a blocking call (after the works before it, so works complete in issue order), or a call
        from the completer's own thread (a future's callback), which must not wait for itself."""
        completer = self._completer
        if completer is not None and threading.current_thread() is completer.thread:
            return None
        if not getattr(opts, "asyncOp", True):
            if completer is not None:
                completer.drain()
            return None
        if completer is None:
            completer = self._completer = self._new_completer()
        return completer

    def _new_completer(self) -> Completer:
        # Built here, in the issuing thread: the control plane is built on first use, and two
        # threads must not both build it (nor start its transfer thread) at once.
        control = self._comm._plane()
        if control is not None:
            control.transfers.start([], 0.0)
        completer = Completer(self._name or "group")
        weakref.finalize(self, completer.stop)
        return completer

    def _drain(self) -> None:
        if self._completer is not None:
            self._completer.drain()

    def _joined(self, parts: Sequence[CommWork], result: list[Tensor]) -> CommWork:
        """One work for several started together: complete when the last is, failed where one failed."""
        completer = self._completer
        if completer is None or all(part.is_completed() and part.exception() is None for part in parts):
            return CommWork(result)  # ran here: an error was raised by the call

        def finish() -> None:  # the completer reaches this after the parts, in issue order
            for part in parts:
                part.wait()

        return completer.submit(CommWork(result, finish, "coalesced"))

    # -- reductions ------------------------------------------------------------------------------

    def allreduce(self, tensors: Any, opts: Any = None) -> CommWork:  # type: ignore[override]
        opts = _options(opts, AllreduceOptions)
        tensor = _one("allreduce", tensors)
        name = _premultiply(opts, [tensor], in_place=True)[1]
        return self._start(opts, [tensor], self._comm.all_reduce, tensor, name)

    def allreduce_coalesced(self, tensors: list[Tensor], opts: Any = None) -> CommWork:
        """One all-reduce of the tensors flattened together (one per dtype and device)."""
        opts = _options(opts, AllreduceCoalescedOptions)
        single = AllreduceOptions()
        single.reduceOp, single.timeout, single.asyncOp = opts.reduceOp, opts.timeout, opts.asyncOp
        parts = []
        for kind in dict.fromkeys((t.dtype, t.device) for t in tensors):
            alike = [t for t in tensors if (t.dtype, t.device) == kind]
            flat = torch.cat([t.detach().reshape(-1) for t in alike])
            name = _premultiply(single, [flat], in_place=True)[1]

            def split(value: Tensor, alike: list[Tensor] = alike) -> None:
                for tensor, part in zip(alike, torch.split(value, [t.numel() for t in alike]), strict=True):
                    _fill(tensor, part)

            parts.append(self._start(single, alike, self._comm.all_reduce, flat, name, fill=split))
        return self._joined(parts, list(tensors))

    def reduce(self, tensors: Any, opts: Any = None) -> CommWork:  # type: ignore[override]
        opts = _options(opts, ReduceOptions)
        tensor = _one("reduce", tensors)
        name = _premultiply(opts, [tensor], in_place=True)[1]
        return self._start(opts, [tensor], self._comm.reduce, tensor, opts.rootRank, name)

    def reduce_scatter(  # type: ignore[override]
        self, output_tensors: Any, input_tensors: list[list[Tensor]], opts: Any = None
    ) -> CommWork:
        opts = _options(opts, ReduceScatterOptions)
        output = _one("reduce_scatter", output_tensors)
        inputs, name = _premultiply(opts, list(_one("reduce_scatter", input_tensors)), in_place=False)
        fill = functools.partial(_fill, output)
        return self._start(opts, [output], self._comm.reduce_scatter, inputs, name, fill=fill)

    def _reduce_scatter_base(self, output: Tensor, tensor: Tensor, opts: Any = None) -> CommWork:
        world = self._comm.world_size
        if tensor.numel() != output.numel() * world:
            raise CommError(f"reduce_scatter_tensor: an input of {tensor.numel()} elements for {world} x {output}")
        return self.reduce_scatter([output], [list(tensor.reshape(world, *output.shape).unbind(0))], opts)

    def reduce_scatter_single(self, output: Tensor, tensor: Tensor, opts: Any = None) -> CommWork:
        return self._reduce_scatter_base(output, tensor, opts)

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None
    ) -> CommWork:
        parts = [self._reduce_scatter_base(o, t, opts) for o, t in zip(outputs, inputs, strict=True)]
        return self._joined(parts, list(outputs))

    def reduce_scatter_single_coalesced(
        self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None
    ) -> CommWork:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    # -- copies ----------------------------------------------------------------------------------

    def broadcast(self, tensors: Any, opts: Any = None) -> CommWork:  # type: ignore[override]
        opts = _options(opts, BroadcastOptions)
        tensor = _one("broadcast", tensors)
        return self._start(opts, [tensor], self._comm.broadcast, tensor, opts.rootRank)

    def allgather(  # type: ignore[override]
        self, output_tensors: list[list[Tensor]], input_tensors: Any, opts: Any = None
    ) -> CommWork:
        opts = _options(opts, AllgatherOptions)
        outputs, tensor = _one("allgather", output_tensors), _one("allgather", input_tensors)
        return self._allgather(outputs, tensor, opts, list(outputs))

    def _allgather(self, outputs: list[Tensor], tensor: Tensor, opts: Any, result: list[Tensor]) -> CommWork:
        if len(outputs) != self._comm.world_size:
            raise CommError(f"allgather: {len(outputs)} output tensors for {self._comm.world_size} ranks")
        same = all(o.shape == tensor.shape for o in outputs)  # every rank passes the same output shapes
        gather = functools.partial(self._comm.all_gather, same_shape=same)
        return self._start(opts, result, gather, tensor, fill=functools.partial(_fill_all, outputs))

    def allgather_coalesced(
        self, output_lists: list[list[Tensor]], input_list: list[Tensor], opts: Any = None
    ) -> CommWork:
        """``output_lists[r][i]`` receives rank ``r``'s ``input_list[i]``, as torch lays it out."""
        parts = [self.allgather([[row[i] for row in output_lists]], [t], opts) for i, t in enumerate(input_list)]
        return self._joined(parts, [t for outputs in output_lists for t in outputs])

    def _allgather_base(self, output: Tensor, tensor: Tensor, opts: Any = None) -> CommWork:
        world = self._comm.world_size
        if output.numel() != tensor.numel() * world:
            raise CommError(f"all_gather_into_tensor: an output of {output.numel()} elements for {world} x {tensor}")
        views = list(output.view(world, *tensor.shape).unbind(0))
        return self._allgather(views, tensor, _options(opts, AllgatherOptions), [output])

    def all_gather_single(self, output: Tensor, tensor: Tensor, opts: Any = None) -> CommWork:
        return self._allgather_base(output, tensor, opts)

    def allgather_into_tensor_coalesced(
        self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None
    ) -> CommWork:
        parts = [self._allgather_base(o, t, opts) for o, t in zip(outputs, inputs, strict=True)]
        return self._joined(parts, list(outputs))

    def all_gather_single_coalesced(self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None) -> CommWork:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def gather(  # type: ignore[override]
        self, output_tensors: list[list[Tensor]], input_tensors: Any, opts: Any = None
    ) -> CommWork:
        opts = _options(opts, GatherOptions)
        root = opts.rootRank
        outputs = _one("gather", output_tensors) if self._comm.rank == root else []

        def fill(gathered: list[Tensor] | None) -> None:
            if gathered is not None:  # the destination
                _fill_all(outputs, gathered)

        return self._start(opts, outputs, self._comm.gather, _one("gather", input_tensors), root, fill=fill)

    def scatter(  # type: ignore[override]
        self, output_tensors: Any, input_tensors: list[list[Tensor]], opts: Any = None
    ) -> CommWork:
        opts = _options(opts, ScatterOptions)
        output, root = _one("scatter", output_tensors), opts.rootRank
        parts = _one("scatter", input_tensors) if self._comm.rank == root else None
        return self._start(opts, [output], self._comm.scatter, parts, root, fill=functools.partial(_fill, output))

    def alltoall(self, output_tensors: list[Tensor], input_tensors: list[Tensor], opts: Any = None) -> CommWork:
        return self._alltoall(output_tensors, input_tensors, opts, list(output_tensors))

    def _alltoall(self, outputs: list[Tensor], inputs: list[Tensor], opts: Any, result: list[Tensor]) -> CommWork:
        opts = _options(opts, AllToAllOptions)
        fill = functools.partial(_fill_all, outputs)
        return self._start(opts, result, self._comm.all_to_all, list(inputs), fill=fill)

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
        return self._alltoall(outputs, inputs, opts, [output])

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
        self._drain()  # the communicator's barrier has no asynchronous form: it runs here, in order
        self._comm.barrier(_limit(opts) if isinstance(opts, BarrierOptions) else None)
        return CommWork([])

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """A barrier of at most ``timeout`` (else the communicator's timeout) that raises
        ``CommTimeoutError`` naming every rank that did not arrive (``missing_ranks``)."""
        self._drain()
        self._comm.barrier(timeout)

    def send(self, tensors: list[Tensor], dst: int, tag: int = 0) -> CommWork:
        tensor = _one("send", tensors)
        return _transfer([tensor], self._comm.isend(tensor, dst, tag))

    def recv(self, tensors: list[Tensor], src: int, tag: int = 0) -> CommWork:
        tensor = _one("recv", tensors)
        return _transfer([tensor], self._comm.irecv(tensor, src, tag))

    def recv_anysource(self, tensors: list[Tensor], tag: int = 0) -> CommWork:
        raise CommError("recv from any source is not supported by the communicator process group: name the source")

    # -- the rest of torch's interface -------------------------------------------------------------

    def _start_coalescing(self, device: torch.device) -> None:
        """Each operation of a coalescing block starts when it is called."""
        self._coalesced = []

    def _end_coalescing(self, device: torch.device) -> CommWork:
        """One work for the block's operations."""
        parts, self._coalesced = self._coalesced or [], None
        return self._joined(parts, [])

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
        if self._completer is not None:
            self._completer.stop()  # after the works it holds; a later operation starts another
            self._completer = None
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


def _fill_all(outputs: Sequence[Tensor], values: Sequence[Tensor]) -> None:
    for output, value in zip(outputs, values, strict=True):
        _fill(output, value)


def _shown(comm: Communicator, name: str) -> tuple[CallState, list[Any]] | None:
    """The communicator's call state and the record of its call ``name`` that just returned."""
    calls = comm._calls
    record = calls.recorder[-1] if calls.recorder else None
    return None if record is None or record[OP] != name or record[STATE] == RUNNING else (calls, record)


def _wait_all(works: list[CommWork]) -> None:
    try:
        for work in works:
            work.wait()
    finally:
        works.clear()  # nor keep their tensors until the next backward pass


def _transfer(result: list[Tensor], handle: Handle[Any]) -> CommWork:
    """A send's or receive's work: it finishes in its first ``wait()``, as torch's gloo transfers do."""

    def finish() -> None:
        handle.wait()

    return CommWork(result, finish, "transfer", ready=handle.is_completed)


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
    name = _BY_CODE.get(int(kind))
    if name is None:
        raise CommError(f"reduce op {kind} is not supported by the communicator process group")
    if name != "premul_sum":
        return tensors, name
    factor = getattr(op, "factor", None)
    if factor is None:
        raise CommError(
            "PREMUL_SUM needs a factor (torch.distributed._make_nccl_premul_sum(factor)), which torch "
            f"shows from 2.13 on (this is {torch.__version__})"
        )
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
    group_name: Any = getattr(c10d, "GroupName", str)(name)  # a str before torch 2.13
    group.setGroupName(group_name)
    ranks = {g: r for r, g in enumerate(group.comm.global_ranks)}
    if hasattr(c10d, "_register_pg_in_world"):
        c10d._register_pg_in_world(group, BACKEND, cast(Any, None), group_name, f"cpu:{BACKEND}", rank_mapping=ranks)
        return
    # torch before 2.13 keeps the same records without a helper to write them
    world = c10d._world
    world.pg_map[group] = (BACKEND, cast(Any, None))
    world.pg_names[group] = group_name
    world.pg_backend_config[group] = f"cpu:{BACKEND}"
    world.pg_group_ranks[group] = ranks
    world.tags_to_pg.setdefault(f"ptd:{group_name}", []).append(group)
    world.pg_to_tag[group] = f"ptd:{group_name}"
    torch._C._distributed_c10d._register_process_group(group_name, group)


provide("process_group", process_group_of)  # Communicator.as_process_group
