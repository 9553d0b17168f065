"""A drop-in for ``mmengine.dist`` (0.10): the same 31 functions, backed by a communicator.

Replace ``import mmengine.dist as dist`` with ``import communicator.dist as dist``. Every function
keeps mmengine's signature, return convention and single-process answer, and runs on:

1. the ``group`` argument, when it is a :class:`~communicator.base.Communicator`;
2. otherwise the communicator of the innermost open ``with Communicator.create(...)`` block, or
   the one :func:`init_dist` opened (until :func:`close_dist`);
3. otherwise the initialised default ``torch.distributed`` group, adopted (not owned) the first
   time a collective runs on it and adopted again when the default group is replaced;
4. otherwise a single process (:class:`~communicator.transports.nondist.NonDistComm`).

A torch ``ProcessGroup`` as ``group`` selects the communicator over that group. ``src`` and ``dst``
are **global** ranks, as in mmengine and torch; they default to the group's first rank (global
rank 0 for the default group). Where mmengine is wrong this module is right; the differences
are listed in the migration guide (``docs/migration.md``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

import torch
import torch.distributed as torch_dist

from communicator.base import Communicator
from communicator.compat.backing import (
    GroupLike,
    comm_for,
    local_comm,
    local_rank_of,
    open_comm,
    query_comm,
    set_local_comm,
    take_opened_comm,
    torch_initialised,
)
from communicator.compat.buckets import all_reduce_coalesced, make_buckets
from communicator.compat.devices import cast_data_device, get_data_device
from communicator.compat.filed_results import collect_through_directory
from communicator.compat.switch import use_for_mmengine
from communicator.errors import CommError, ConfigError
from communicator.launchers import LAUNCHERS, launcher_names
from communicator.launchers.mpi import MPIEnv
from communicator.reductions import ReduceOpLike
from communicator.transports.torch_comm import TorchComm

__all__ = [
    "all_gather",
    "all_gather_object",
    "all_reduce",
    "all_reduce_dict",
    "all_reduce_params",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "cast_data_device",
    "close_dist",
    "collect_results",
    "collect_results_cpu",
    "collect_results_gpu",
    "gather",
    "gather_object",
    "get_backend",
    "get_comm",
    "get_comm_device",
    "get_data_device",
    "get_default_group",
    "get_dist_info",
    "get_local_group",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "infer_launcher",
    "init_dist",
    "init_local_group",
    "is_distributed",
    "is_main_process",
    "master_only",
    "sync_random_seed",
    "use_for_mmengine",
]

P = ParamSpec("P")
R = TypeVar("R")

#: The launcher names ``init_dist`` accepts: every launcher's (mmengine's three, and each MPI implementation).
INIT_LAUNCHERS = tuple(name for name in launcher_names() if name not in ("auto", "none"))
_NO_LOCAL_GROUP = (
    "Local process group is not created, please use `init_local_group` to setup local process group "
    "(or open a communicator, e.g. with init_dist, whose launcher knows the node layout)."
)


# -- initialisation --------------------------------------------------------------------------------


def infer_launcher() -> str:
    """The launcher that started this process: ``'pytorch'``, ``'mpi'``, ``'slurm'`` or ``'none'``.

    MPI's variables win over Slurm's (``mpirun`` inside an allocation leaves Slurm's behind).

    Examples:
        >>> infer_launcher()  # under torchrun; 'none' in a plain process
        'pytorch'
    """
    for launcher in LAUNCHERS:
        if launcher.detect(os.environ):
            return "mpi" if issubclass(launcher, MPIEnv) else launcher.name
    return "none"


def init_dist(launcher: str, backend: str = "nccl", init_backend: str = "torch", **kwargs: Any) -> None:
    """Start the job's process group and open a communicator that later calls use.

    The communicator stays open (and active) until :func:`close_dist`, which posts that this rank
    closed, waits (on the rank serving the store) until every peer has closed or exited, destroys
    the process group and restores the environment variables it set (``RANK``,
    ``LOCAL_RANK``, ... are set under every launcher, MPI included). Without ``close_dist`` the
    group lives until the process exits, as after mmengine's ``init_dist``. The global
    multiprocessing start method is left alone, and CUDA is touched only for ``'nccl'``.

    Args:
        launcher (str): ``'pytorch'`` (torchrun), ``'slurm'``, ``'mpi'`` (any MPI), or one MPI
            implementation: ``'openmpi'``, ``'mpich'``, ``'mvapich'``.
        backend (str): ``'nccl'``, ``'gloo'``, ``'mpi'`` or ``'auto'`` (nccl with CUDA, else
            gloo). Defaults to ``'nccl'``, which needs CUDA: on a CPU-only machine pass ``'gloo'``.
        init_backend (str): only ``'torch'``; initialise DeepSpeed or ColossalAI yourself and
            the functions adopt the default group they create.
        **kwargs: :class:`~communicator.config.CommConfig` fields: ``timeout`` (seconds or a
            ``timedelta``), ``init_method``, ``master_addr``, ``master_port`` (or mmengine's
            ``port``), ``serializer``, ``debug``, ...

    Raises:
        ConfigError: an unknown launcher, backend or keyword, a backend this machine cannot run
            (``'nccl'`` without CUDA), or the launcher's variables are missing or malformed.
        CommError: ``torch.distributed`` is already initialised.

    Examples:
        >>> # every rank, under torchrun / srun / mpirun
        >>> init_dist("pytorch", backend="gloo", timeout=600)
        >>> get_dist_info()
        (0, 2)  # rank 0
        (1, 2)  # rank 1
        >>> close_dist()
    """
    if launcher not in INIT_LAUNCHERS:
        raise ConfigError(f"Invalid launcher type: {launcher!r}; expected one of {', '.join(INIT_LAUNCHERS)}")
    if init_backend != "torch":
        raise ConfigError(
            f"init_backend={init_backend!r} is not supported: initialise it yourself; "
            "communicator.dist then adopts the default group it creates"
        )
    if torch_initialised():
        raise CommError(
            "init_dist: torch.distributed is already initialised; communicator.dist uses the existing default group"
        )
    close_dist()  # a communicator left open after its group was destroyed elsewhere
    open_comm(Communicator.create({**kwargs, "launcher": launcher, "backend": backend}))


def close_dist() -> None:
    """Close the communicator :func:`init_dist` opened and destroy its group (no collective runs).

    Every rank calls it. Does nothing when ``init_dist`` opened none.
    """
    opened = take_opened_comm()
    if opened is not None:
        opened.__exit__(None, None, None)


def get_comm(group: GroupLike = None) -> Communicator:
    """The communicator the functions of this module use for ``group``.

    The first call on an adopted default group creates its communicator, which is a collective:
    call it on every rank of the group.

    Examples:
        >>> comm = get_comm()            # hand it to code written against Communicator
        >>> comm.all_reduce_dict({"loss": loss}, op="mean")
    """
    return comm_for(group)


# -- rank queries: no communication ----------------------------------------------------------------


def is_distributed() -> bool:
    """Whether the calls of this module run on more than a single process's communicator.

    Examples:
        >>> is_distributed()  # a plain process
        False
    """
    comm = query_comm(None)
    return _initialised(comm) if comm is not None else True


def _initialised(comm: Communicator) -> bool:
    """mmengine's ``is_distributed``: a process group is there, a world of one included (unlike
    ``comm.is_distributed``, which asks for more than one rank)."""
    return comm.backend != "none"


def get_default_group() -> torch_dist.ProcessGroup | None:
    """torch's default process group, or ``None`` when ``torch.distributed`` is not initialised."""
    return torch_dist.group.WORLD if torch_initialised() else None


def get_backend(group: GroupLike = None) -> str | None:
    """The backend of ``group`` in lower case (``'gloo'``, ``'nccl'``...); ``None`` in one process.

    Examples:
        >>> get_backend()
        'gloo'  # every rank of a gloo job
        None    # a plain process
    """
    comm = query_comm(group)
    if comm is None:
        return str(torch_dist.get_backend(group))  # type: ignore[arg-type]
    return comm.backend if _initialised(comm) else None


def get_world_size(group: GroupLike = None) -> int:
    """The number of ranks in ``group``; 1 in one process (-1 on a non-member of a torch group).

    Examples:
        >>> get_world_size()
        2  # every rank of a 2-rank job
        1  # a plain process
    """
    comm = query_comm(group)
    return comm.world_size if comm is not None else torch_dist.get_world_size(group)  # type: ignore[arg-type]


def get_rank(group: GroupLike = None) -> int:
    """This process's rank in ``group``; 0 in one process (-1 on a non-member of a torch group).

    Examples:
        >>> get_rank()
        0  # rank 0
        1  # rank 1
    """
    comm = query_comm(group)
    return comm.rank if comm is not None else torch_dist.get_rank(group)  # type: ignore[arg-type]


def get_dist_info(group: GroupLike = None) -> tuple[int, int]:
    """``(rank, world_size)`` of ``group``; ``(0, 1)`` in one process.

    Examples:
        >>> get_dist_info()
        (0, 2)  # rank 0
        (1, 2)  # rank 1
    """
    return get_rank(group), get_world_size(group)


def is_main_process(group: GroupLike = None) -> bool:
    """Whether this process is rank 0 of ``group``; always ``True`` in one process."""
    return get_rank(group) == 0


def master_only(func: Callable[P, R]) -> Callable[P, R | None]:
    """Decorator: run ``func`` on rank 0 only; the other ranks get ``None``.

    Examples:
        >>> @master_only
        ... def save(path): ...
        >>> save("ckpt.pth")  # rank 0 saves; rank 1 returns None
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
        return func(*args, **kwargs) if is_main_process() else None

    return wrapper


def get_comm_device(group: GroupLike = None) -> torch.device:
    """The device tensors travel on in ``group``: the current CUDA device under NCCL, else the CPU."""
    comm = query_comm(group)
    if comm is not None:
        return comm.device
    if get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# -- the node's ranks ------------------------------------------------------------------------------


def init_local_group(node_rank: int, num_gpus_per_node: int) -> None:
    """Create the group of every node's ranks; each rank keeps its own node's group.

    Node ``n`` holds ranks ``n * num_gpus_per_node`` to ``(n + 1) * num_gpus_per_node - 1``.
    Every rank creates every node's group in the same order (torch's rule), so this works on
    any number of nodes. Every rank calls it, with its own ``node_rank``.

    Raises:
        ConfigError: a rank's ``node_rank`` does not hold that rank, or the ranks disagree on
            ``num_gpus_per_node`` (raised on every rank).
        CommError: the local group was already created.

    Examples:
        >>> # 4 ranks on 2 nodes of 2 GPUs
        >>> init_local_group(node_rank=get_rank() // 2, num_gpus_per_node=2)
        >>> get_local_rank(), get_local_size()
        (0, 2)  # ranks 0 and 2
        (1, 2)  # ranks 1 and 3
    """
    for name, value, minimum in (("node_rank", node_rank, 0), ("num_gpus_per_node", num_gpus_per_node, 1)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
    comm = comm_for(None)
    if not _initialised(comm):
        return
    if local_comm() is not None:
        raise CommError("init_local_group: the local process group was already created")
    claims: list[tuple[int, int]] = comm.all_gather_object((node_rank, num_gpus_per_node))
    wrong = {rank: claim for rank, claim in enumerate(claims) if claim != (rank // claims[0][1], claims[0][1])}
    if wrong:
        raise ConfigError(
            "init_local_group: ranks must be placed on nodes in blocks of num_gpus_per_node; "
            f"got (node_rank, num_gpus_per_node) = {wrong} by rank"
        )
    set_local_comm(comm.split(color=node_rank))


def _node_comm() -> Communicator:
    """What answers local queries when ``init_local_group`` was not called."""
    comm = query_comm(None)
    if comm is None:
        raise RuntimeError(_NO_LOCAL_GROUP)
    return comm


def get_local_group() -> torch_dist.ProcessGroup | None:
    """The torch group of this node's ranks (see :func:`init_local_group`); ``None`` in one process.

    Raises:
        RuntimeError: distributed, but ``init_local_group`` was not called.
    """
    if not is_distributed():
        return None
    local = local_comm()
    if local is None:
        raise RuntimeError(_NO_LOCAL_GROUP)
    return local.group if isinstance(local, TorchComm) else None


def get_local_size() -> int:
    """The number of ranks on this node; 1 in one process.

    Comes from :func:`init_local_group`, else from the launcher of the open communicator.

    Raises:
        RuntimeError: ``torch.distributed`` was initialised directly and ``init_local_group`` was not called.
    """
    local = local_comm()
    return local.world_size if local is not None else _node_comm().local_size


def get_local_rank() -> int:
    """This process's rank among the ranks of its node; 0 in one process.

    Comes from :func:`init_local_group`, else from the launcher of the open communicator.

    Raises:
        RuntimeError: ``torch.distributed`` was initialised directly and ``init_local_group`` was not called.
    """
    local = local_comm()
    return local.rank if local is not None else _node_comm().local_rank


# -- tensor collectives ----------------------------------------------------------------------------


def barrier(group: GroupLike = None) -> None:
    """Wait until every rank of ``group`` arrives; nothing to wait for in one process."""
    comm_for(group).barrier()


def all_reduce(data: torch.Tensor, op: ReduceOpLike = "sum", group: GroupLike = None) -> None:
    """Reduce ``data`` across ``group`` in place.

    Args:
        data (Tensor): input and output, on any device.
        op (str): ``'sum'``, ``'mean'``, ``'product'``, ``'min'``, ``'max'``, ``'band'``,
            ``'bor'``, ``'bxor'`` (any case) or a ``torch.distributed.ReduceOp``.
        group: a torch ``ProcessGroup``, a ``Communicator`` or ``None`` (the default).

    Raises:
        ValueError: ``op='mean'`` of an integer tensor whose sum does not divide by the world size
            (an integer cannot hold the fraction; mmengine truncates it); ``data`` keeps its values.
            An exact integer mean (identical counters) works in place.

    Examples:
        >>> data = torch.tensor([1.0, 2.0]) + 2 * get_rank()
        >>> data
        tensor([1., 2.])  # rank 0
        tensor([3., 4.])  # rank 1
        >>> all_reduce(data)
        >>> data
        tensor([4., 6.])  # rank 0
        tensor([4., 6.])  # rank 1
    """
    comm_for(group).all_reduce(data, op=op)


def all_gather(data: torch.Tensor, group: GroupLike = None) -> list[torch.Tensor]:
    """Every rank's ``data``, in rank order, on ``data``'s device; shapes may differ per rank.

    Examples:
        >>> data = torch.arange(get_rank() + 1)
        >>> all_gather(data)
        [tensor([0]), tensor([0, 1])]  # rank 0
        [tensor([0]), tensor([0, 1])]  # rank 1
        >>> all_gather(data)  # one process: a list of a copy of data
        [tensor([0])]
    """
    gathered: list[torch.Tensor] = comm_for(group).all_gather(data)
    return [tensor.to(data.device) for tensor in gathered]


def gather(data: torch.Tensor, dst: int | None = None, group: GroupLike = None) -> list[torch.Tensor]:
    """Every rank's ``data`` on ``dst``, in rank order; ``[]`` on the other ranks.

    Args:
        data (Tensor): this rank's tensor; shapes may differ per rank.
        dst (int, optional): the global rank that receives. Defaults to the group's first rank.
        group: a torch ``ProcessGroup``, a ``Communicator`` or ``None`` (the default).

    Examples:
        >>> data = torch.tensor([get_rank()])
        >>> gather(data, dst=1)
        []                              # rank 0
        [tensor([0]), tensor([1])]      # rank 1
        >>> # ranks 2 and 3 in group = torch.distributed.new_group([2, 3])
        >>> gather(data, group=group)
        [tensor([2]), tensor([3])]      # rank 2 (the group's first rank)
        []                              # rank 3
    """
    comm = comm_for(group)
    gathered: list[torch.Tensor] | None = comm.gather(data, dst=local_rank_of(comm, dst))
    return [] if gathered is None else [tensor.to(data.device) for tensor in gathered]


def broadcast(data: torch.Tensor, src: int | None = None, group: GroupLike = None) -> None:
    """Copy ``src``'s ``data`` into ``data`` on every rank of ``group``, in place.

    ``src`` is a global rank; it defaults to the group's first rank.

    Examples:
        >>> data = torch.tensor([get_rank() + 1])
        >>> broadcast(data, src=1)
        >>> data
        tensor([2])  # rank 0
        tensor([2])  # rank 1
    """
    comm = comm_for(group)
    comm.broadcast(data, src=local_rank_of(comm, src))


def all_reduce_params(
    params: Iterable[torch.Tensor],
    coalesce: bool = True,
    bucket_size_mb: int = -1,
    op: ReduceOpLike = "sum",
    group: GroupLike = None,
) -> None:
    """Reduce parameters or buffers of a model in place.

    With ``coalesce`` the tensors are grouped by device and dtype (and into buckets of at most
    ``bucket_size_mb`` megabytes when it is positive): one all-reduce per bucket, of the
    bucket's concatenation, copied back into each tensor. Without it, one all-reduce per tensor.
    An integer ``'mean'`` is exact or an error, as in :func:`all_reduce`: BatchNorm's
    ``num_batches_tracked``, the same counter on every rank, averages to itself.

    Examples:
        >>> params = [torch.tensor([1.0, 2.0]) + get_rank(), torch.tensor([3.0]) + get_rank()]
        >>> params
        [tensor([1., 2.]), tensor([3.])]  # rank 0
        [tensor([2., 3.]), tensor([4.])]  # rank 1
        >>> all_reduce_params(params)
        >>> params
        [tensor([3., 5.]), tensor([7.])]  # rank 0
        [tensor([3., 5.]), tensor([7.])]  # rank 1
    """
    comm = comm_for(group)
    tensors = []
    for index, param in enumerate(params):
        if not isinstance(param, torch.Tensor):
            raise TypeError(f"all_reduce_params: params must hold tensors, item {index} is a {type(param).__name__}")
        tensors.append(param.data)
    if not coalesce:
        for tensor in tensors:
            comm.all_reduce(tensor, op=op)
        return
    for bucket in make_buckets(tensors, bucket_size_mb):
        all_reduce_coalesced(comm, bucket, op)


# -- objects and derived operations ----------------------------------------------------------------


def sync_random_seed(group: GroupLike = None) -> int:
    """A random seed drawn on the group's first rank and returned on every rank of ``group``.

    The global NumPy, torch and Python random states are left untouched.

    Examples:
        >>> sync_random_seed()
        587791752  # rank 0
        587791752  # rank 1
    """
    return comm_for(group).sync_random_seed()


def broadcast_object_list(data: list[Any], src: int | None = None, group: GroupLike = None) -> None:
    """Replace the items of ``data`` in place with those of ``src``'s list (a global rank).

    Every rank passes a list of the same length; ``src`` defaults to the group's first rank.

    Examples:
        >>> data = ["foo", 12, {1: 2}] if get_rank() == 0 else [None, None, None]
        >>> broadcast_object_list(data)
        >>> data
        ['foo', 12, {1: 2}]  # rank 0
        ['foo', 12, {1: 2}]  # rank 1
    """
    if not isinstance(data, list):
        raise TypeError(f"broadcast_object_list needs a list, got {type(data).__name__}")
    comm = comm_for(group)
    comm.broadcast_object_list(data, src=local_rank_of(comm, src))


def _update_in_place(target: dict[Any, Any], reduced: dict[Any, Any]) -> None:
    """Write ``reduced`` into ``target``, keeping ``target``'s nested dicts the same objects."""
    for key, value in reduced.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _update_in_place(target[key], value)
        else:
            target[key] = value


def all_reduce_dict(data: dict[str, Any], op: ReduceOpLike = "sum", group: GroupLike = None) -> None:
    """Reduce every value of ``data`` across ``group``, replacing the values in place.

    Values are tensors or numbers, possibly in nested dicts. Each keeps its dtype (an integer
    ``'mean'`` becomes a float64 tensor instead of being truncated). The ranks' keys, shapes and
    dtypes are checked first.

    Raises:
        CollectiveMismatchError: the ranks passed different keys, shapes or dtypes (on every rank).

    Examples:
        >>> data = {"loss": torch.tensor(1.0 + 2 * get_rank()), "count": torch.tensor(2)}
        >>> all_reduce_dict(data, op="mean")
        >>> data
        {'loss': tensor(2.), 'count': tensor(2., dtype=torch.float64)}  # rank 0 and rank 1
    """
    if not isinstance(data, dict):
        raise TypeError(f"all_reduce_dict needs a dict, got {type(data).__name__}")
    _update_in_place(data, comm_for(group).all_reduce_dict(data, op=op))


def all_gather_object(data: Any, group: GroupLike = None) -> list[Any]:
    """Every rank's object, in rank order, on every rank of ``group``.

    Examples:
        >>> all_gather_object(["foo", 12, {1: 2}][get_rank()])
        ['foo', 12, {1: 2}]  # each of 3 ranks
        >>> all_gather_object("foo")  # one process
        ['foo']
    """
    return comm_for(group).all_gather_object(data)


def gather_object(data: Any, dst: int | None = None, group: GroupLike = None) -> list[Any] | None:
    """Every rank's object on ``dst`` (a global rank), in rank order; ``None`` on the other ranks.

    ``dst`` defaults to the group's first rank.

    Examples:
        >>> gather_object(["foo", 12, {1: 2}][get_rank()], dst=0)
        ['foo', 12, {1: 2}]  # rank 0
        None                 # rank 1
        None                 # rank 2
    """
    comm = comm_for(group)
    return comm.gather_object(data, dst=local_rank_of(comm, dst))


def collect_results(results: list[Any], size: int, device: str = "cpu", tmpdir: str | None = None) -> list[Any] | None:
    """The first ``size`` results of all ranks on rank 0, in dataset order; ``None`` elsewhere.

    Rank ``r`` holds items ``r, r + world_size, ...`` (``DistributedSampler``'s order); the
    padding a sampler adds is dropped by ``size``, and ``None`` results are kept. No shared
    filesystem is needed; with ``tmpdir`` the parts travel through that directory instead.

    Args:
        results (list): this rank's results.
        size (int): the dataset's length.
        device (str): ``'cpu'``, ``'gpu'`` or ``'npu'``; the results travel the same way.
        tmpdir (str, optional): a directory every rank can see, for ``device='cpu'`` only.

    Examples:
        >>> data = ["foo", {1: 2}] if get_rank() == 0 else [24, None]
        >>> collect_results(data, size=4)
        ['foo', 24, {1: 2}, None]  # rank 0
        None                       # rank 1
    """
    if device not in ("cpu", "gpu", "npu"):
        raise NotImplementedError(f"device must be 'cpu' , 'gpu' or 'npu', but got {device}")
    if device == "cpu":
        return collect_results_cpu(results, size, tmpdir)
    if tmpdir is not None:
        raise ValueError(f"tmpdir should be None when device is {device}")
    return collect_results_gpu(results, size)


def collect_results_cpu(result_part: list[Any], size: int, tmpdir: str | None = None) -> list[Any] | None:
    """:func:`collect_results` with ``device='cpu'``.

    With ``tmpdir``, each rank writes its part to a file of its own there and rank 0 reads them
    back; the part files are then removed, and the directory too when this call created it and
    nothing else was put in it. Other files in ``tmpdir`` are never touched.

    Raises:
        FileNotFoundError: on every rank, when rank 0 cannot see another rank's part in ``tmpdir``.

    Examples:
        >>> collect_results_cpu([get_rank()], size=2, tmpdir="/shared/eval")
        [0, 1]  # rank 0
        None    # rank 1
    """
    comm = comm_for(None)
    if tmpdir is None or comm.world_size == 1:
        return comm.collect_results(result_part, size)
    return collect_through_directory(comm, result_part, size, tmpdir)


def collect_results_gpu(result_part: list[Any], size: int) -> list[Any] | None:
    """:func:`collect_results` with ``device='gpu'``: the same order and answers.

    Examples:
        >>> collect_results_gpu([get_rank()], size=2)
        [0, 1]  # rank 0
        None    # rank 1
    """
    return comm_for(None).collect_results(result_part, size, device="gpu")
