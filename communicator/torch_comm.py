"""`TorchComm`: a communicator over a ``torch.distributed`` process group (gloo, nccl, mpi)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from typing_extensions import override

from communicator.base import Communicator, check_split_arguments
from communicator.config import CommConfig
from communicator.errors import CollectiveMismatchError, CommError, CommTimeoutError, NotMemberError, PeerLostError
from communicator.failures import FailureBoard
from communicator.guard import collective
from communicator.handles import Handle
from communicator.ops import WIRE_DTYPES, ReduceOpLike, check_op_dtype, parse_op, torch_op
from communicator.waiting import Job, PointToPoint, TransferWaiter

if TYPE_CHECKING:
    from communicator.subgroup import SubgroupComm

__all__ = ["Topology", "TorchComm", "restore_environ"]

# How long a blocked wait sleeps between looks at the failure board.
POLL_SECONDS = 0.05
# Larger all_gather/gather payloads go point to point: gloo's collectives copy them twice more.
P2P_MIN_BYTES = 64 * 1024
MAX_NDIM = 32
# After a failure, how long world rank 0 keeps the rendezvous store up for peers still reading it.
LINGER_SECONDS = 10.0
_DTYPE_CODES = {dt: i for i, dt in enumerate(WIRE_DTYPES)}
_CODE_DTYPES = {i: dt for dt, i in _DTYPE_CODES.items()}
# torch 2.13 renamed all_gather_into_tensor; older releases only have the old name.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this process sits: its index on the node, the node's size, the node's index, the node count."""

    local_rank: int = 0
    local_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1


class TorchComm(Communicator):
    """A communicator over a ``torch.distributed`` group.

    Build it with :meth:`Communicator.create`; ``TorchComm.adopt()`` wraps an already initialised
    default group without taking ownership.
    """

    _parent: TorchComm | None = None

    def __init__(
        self,
        config: CommConfig,
        *,
        group: dist.ProcessGroup | None = None,
        global_ranks: Sequence[int] | None = None,
        topology: Topology = Topology(),
        board: FailureBoard | None = None,
        owner: bool = False,
        reason: str = "",
        cpu_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(config)
        self._group: dist.ProcessGroup = group if group is not None else dist.group.WORLD  # type: ignore[assignment]
        self._backend = str(dist.get_backend(self._group))
        self._global_ranks = tuple(global_ranks) if global_ranks is not None else tuple(range(dist.get_world_size()))
        ordered = sorted(self._global_ranks)
        # torch numbers a group's ranks by global rank; this communicator may order them otherwise (split keys).
        self._group_rank_of = [ordered.index(g) for g in self._global_ranks]
        self._local_of_group = [self._global_ranks.index(g) for g in ordered]
        self._rank = self._global_ranks.index(dist.get_rank())
        self._topology = topology
        self._owner = owner
        self._reason = reason
        self._timeout: timedelta = config.timeout
        self._device = self._pick_device()
        self._cpu_group = cpu_group if cpu_group is not None else self._make_cpu_group()
        self._board = board if board is not None else FailureBoard.for_group(self)
        self._board.announce_process(self._rank)
        self._env_restore: dict[str, str | None] = {}
        self._broken: BaseException | None = None
        self._transfers = TransferWaiter()
        self._children: list[SubgroupComm] = []
        self._local: Communicator | None = None
        # Torch groups this communicator created, by (sorted world ranks, created by members only).
        self._groups: dict[tuple[tuple[int, ...], bool], tuple[Any, Any]] = {}

    # -- construction helpers ----------------------------------------------------------------

    @classmethod
    def adopt(cls, config: CommConfig | None = None, reason: str = "") -> TorchComm:
        """Wrap the initialised default group; closing the communicator leaves it initialised."""
        if not (dist.is_available() and dist.is_initialized()):
            raise CommError("TorchComm.adopt() needs torch.distributed to be initialised")
        return cls(
            config or CommConfig(),
            topology=_topology_from_env(),
            reason=reason or "adopted the initialised default group",
        )

    def _pick_device(self) -> torch.device:
        if self.config.device is not None:
            return torch.device(self.config.device)
        if self._backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _make_cpu_group(self) -> dist.ProcessGroup:
        if self._backend == "gloo":
            return self._group
        group: dist.ProcessGroup = dist.new_group(
            list(range(dist.get_world_size())), backend="gloo", timeout=self._timeout
        )
        return group

    # -- lifecycle ---------------------------------------------------------------------------

    @override
    def _enter(self, what: str) -> None:
        if self._broken is not None:
            raise CommError(
                f"{what}: this communicator is unusable since an earlier collective was abandoned "
                f"({self._broken}); leave its block and create a new one"
            )
        super()._enter(what)

    @override
    def _announce_bad_arguments(self, error: BaseException, what: str) -> None:
        self._board.post_input(self.rank, self._seq, error, what)

    @override
    def _announce_failure(self, error: BaseException, where: str) -> None:
        self._board.post(self.rank, error, where)
        if self._broken is None:
            self._broken = error  # the peers abandon their collectives: this group is done

    @override
    def _patient_barrier(self, timeout: float | None) -> None:
        self._board.barrier(self, float("inf") if timeout is None else timeout)

    @override
    def _release(self, failed: bool, error: BaseException | None) -> None:
        if self._closed:
            return
        failed = failed or self._broken is not None
        try:
            if failed and error is not None:
                self._board.post(self.rank, error, "the communicator's block")
            elif not failed and self._owner and dist.is_initialized():
                # Nobody tears down the store (rank 0 hosts it) while a peer still needs it. A peer's
                # failure is that peer's to report: this rank's block succeeded, so closing stays quiet.
                try:
                    self.barrier()
                except CommError:
                    failed = True
        finally:
            self._closed = True
            self._transfers.stop()
            for child in self._children:
                child._release(failed, None)
            if self._owner and dist.is_initialized():
                # World rank 0 hosts the store: it leaves last, since peers may still read the board.
                self._board.depart(self, LINGER_SECONDS)
                if failed:
                    with contextlib.suppress(Exception):
                        self._group.abort()
                dist.destroy_process_group()
            elif dist.is_initialized():
                for created in self._created_groups():
                    with contextlib.suppress(Exception):
                        dist.destroy_process_group(created)
            restore_environ(self._env_restore)
            self._env_restore = {}
            self._board.release()

    def _created_groups(self) -> list[dist.ProcessGroup]:
        unique = {id(g): g for pair in self._groups.values() for g in pair if isinstance(g, dist.ProcessGroup)}
        return list(unique.values())

    # -- rank queries --------------------------------------------------------------------------

    @property
    @override
    def rank(self) -> int:
        return self._rank

    @property
    @override
    def world_size(self) -> int:
        return len(self._global_ranks)

    @property
    @override
    def local_rank(self) -> int:
        return self._topology.local_rank

    @property
    @override
    def local_size(self) -> int:
        return self._topology.local_size

    @property
    @override
    def node_rank(self) -> int:
        return self._topology.node_rank

    @property
    @override
    def num_nodes(self) -> int:
        return self._topology.num_nodes

    @property
    @override
    def backend(self) -> str:
        return self._backend

    @property
    @override
    def device(self) -> torch.device:
        return self._device

    @property
    def group(self) -> dist.ProcessGroup:
        """The torch process group, for code that calls ``torch.distributed`` directly."""
        return self._group

    @property
    @override
    def global_ranks(self) -> tuple[int, ...]:
        return self._global_ranks

    # -- subgroups ------------------------------------------------------------------------------

    def _members(self, ranks: object) -> list[int]:
        if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Sequence) or not ranks:
            raise TypeError(f"ranks must be a non-empty sequence of ranks of this communicator, got {ranks!r}")
        members = [self._check_rank(f"ranks[{i}]", r) for i, r in enumerate(ranks)]
        if len(set(members)) != len(members):
            raise ValueError(f"ranks {members} repeat a rank; each rank may appear once")
        return members

    @override
    @collective("ranks")
    def new_group(self, ranks: Sequence[int]) -> SubgroupComm:
        members = self._members(ranks)
        everyone = self.all_gather_object(members)
        if any(other != members for other in everyone):
            raise CollectiveMismatchError(
                {r: f"new_group({other})" for r, other in enumerate(everyone)},
                "new_group: ranks passed different member lists",
            )
        return self._create_subgroups([members])

    @override
    @collective()
    def split(self, color: int | None, key: int | None = None) -> SubgroupComm:
        check_split_arguments(color, key)
        pairs = self.all_gather_object((color, self.rank if key is None else key))
        colors = sorted({c for c, _ in pairs if c is not None})
        groups = [[r for _, r in sorted((k, r) for r, (c, k) in enumerate(pairs) if c == each)] for each in colors]
        return self._create_subgroups(groups)

    @property
    @override
    def local_comm(self) -> Communicator:
        if self._local is None:
            nodes = self.all_gather_object(self.node_rank)
            self._local = self._create_subgroups(
                [[r for r, n in enumerate(nodes) if n == node] for node in sorted(set(nodes))]
            )
        return self._local

    def for_torch_group(self, group: dist.ProcessGroup) -> TorchComm:
        """A communicator over an existing torch group (created elsewhere), e.g. from ``dist.new_group``.

        Ranks are local to that group, as torch numbers them. No collective: members name the
        failure board after the group's own name.
        """
        from communicator.subgroup import SubgroupComm

        if group is None or group is dist.group.WORLD:
            return self._root()
        if group is dist.GroupMember.NON_GROUP_MEMBER:  # type: ignore[comparison-overlap]
            raise NotMemberError(f"world rank {dist.get_rank()} is not a member of this torch group")
        if not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group must be a torch ProcessGroup, got {type(group).__name__}")
        world_ranks = dist.get_process_group_ranks(group)
        root = self._root()
        name = f"torch-group-{group.group_name}/"
        cpu_group = group
        if dist.get_backend(group) != "gloo":  # objects travel on a gloo companion, made by the members
            key = (tuple(sorted(world_ranks)), False)
            if key not in root._groups:
                companion = _new_group(key[0], self._timeout, "gloo", f"communicator/{root._board.name}{name}cpu")
                root._groups[key] = (group, companion)
            cpu_group = root._groups[key][1]
        return SubgroupComm(root, world_ranks, group, cpu_group, root._board.child(len(world_ranks), name))

    def _root(self) -> TorchComm:
        comm: TorchComm = self
        while comm._parent is not None:
            comm = comm._parent
        return comm

    def _torch_groups(self, world_ranks: tuple[int, ...], name: str | None) -> tuple[Any, Any]:
        """The torch group (and its gloo companion) for these world ranks, created once.

        ``name=None``: every world rank takes part (torch's rule). Otherwise only the members
        create it, under ``name``, which they all derived the same way.
        """
        shared = (world_ranks, True)
        if name is not None and shared in self._groups:
            return self._groups[shared]  # every world rank created this one: the members have it
        key = (world_ranks, name is None)
        if key not in self._groups:
            group = _new_group(world_ranks, self._timeout, None, name)
            cpu_group = group
            if self._backend != "gloo":
                cpu_group = _new_group(world_ranks, self._timeout, "gloo", None if name is None else f"{name}cpu")
            self._groups[key] = (group, cpu_group)
        return self._groups[key]

    def _create_subgroups(self, groups: list[list[int]]) -> SubgroupComm:
        """Create ``groups`` (lists of this communicator's ranks) and return the one holding this rank.

        From the world communicator every rank creates every group, in the same order (torch's
        rule, so it works across nodes); inside a subgroup only the members of each new group
        create it, since the other ranks of the job never call this.
        """
        from communicator.subgroup import SubgroupComm

        root = self._root()
        everyone_creates = self is root
        number = self._board.next_child()
        mine: SubgroupComm | None = None
        for index, members in enumerate(groups):
            world_ranks = [self._global_ranks[r] for r in members]
            if everyone_creates or self.rank in members:
                name = f"sub{number}.{index}/"
                group, cpu_group = root._torch_groups(
                    tuple(sorted(world_ranks)), None if everyone_creates else f"communicator/{self._board.name}{name}"
                )
                if self.rank in members:
                    board = self._board.child(len(members), name)
                    mine = SubgroupComm(self, world_ranks, group, cpu_group, board)
        if mine is None:
            outside = [self._global_ranks[r] for r in groups[0]] if len(groups) == 1 else []
            mine = SubgroupComm(self, outside, None, None, None)
        self._children.append(mine)
        return mine

    # -- waiting: timeouts, lost peers and failures of other ranks ------------------------------

    def _wait(self, works: Sequence[Any], timeout: float | None = None, what: str = "collective") -> None:
        """Wait for ``works``; raise promptly if another rank failed, a peer died, or time ran out."""
        limit = self._timeout.total_seconds() if timeout is None else timeout
        deadline = time.monotonic() + limit
        poll = timedelta(seconds=POLL_SECONDS)
        transfers = [w for w in works if isinstance(w, PointToPoint)]
        job = self._transfers.start(transfers, limit) if transfers else None
        for work in works:
            if isinstance(work, PointToPoint):
                continue
            # gloo raises "timed out" after each slice; NCCL returns at once (the GPU stream waits).
            while True:
                try:
                    work.wait(poll)
                    break
                except RuntimeError as error:
                    # The poll slice ran out ("Operation timed out!"): look around, then wait again.
                    # Any other error is the operation's own; a finished work returns at once next time.
                    if "Operation timed out" not in str(error):
                        raise self._abandon(self._translated(error, what), what) from error
                try:
                    self._board.raise_if_failed(self, what)
                    self._board.raise_if_peer_died(self, what)
                except CommError as error:
                    raise self._abandon(error, what) from None
                if time.monotonic() > deadline:
                    raise self._abandon(
                        CommTimeoutError(f"{what} did not finish within {limit:g} s on rank {self.rank}"), what
                    )
        if job is not None:
            self._wait_for_transfers(job, deadline, what)

    def _wait_for_transfers(self, job: Job, deadline: float, what: str) -> None:
        # The transfers time out on their own at the deadline; the grace covers a stuck thread.
        while not job.done.wait(POLL_SECONDS):
            try:
                self._board.raise_if_failed(self, what)
                self._board.raise_if_peer_died(self, what)
            except CommError as known:
                raise self._abandon(known, what) from None
            if time.monotonic() > deadline + POLL_SECONDS * 20:
                raise self._abandon(CommTimeoutError(f"{what} did not finish in time on rank {self.rank}"), what)
        failure = job.error
        if failure is not None:
            if not isinstance(failure, RuntimeError):
                raise failure
            raise self._abandon(self._translated(failure, what), what) from failure

    def _abandon(self, error: CommError, what: str) -> CommError:
        """This rank leaves a collective unfinished: the group can no longer be trusted, and the
        other ranks must hear of it (they may be waiting in the same collective)."""
        if self._broken is None:
            self._broken = error
            self._board.post(self.rank, error, what)
        return error

    @contextlib.contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        self._launched = True
        try:
            yield
        except RuntimeError as error:
            if isinstance(error, CommError):
                raise
            raise self._translated(error, what) from error

    def _translated(self, error: RuntimeError, what: str) -> CommError:
        try:
            self._board.raise_if_failed(self, what)  # a peer that failed first explains any transport error
        except CommError as known:
            return known
        text = str(error)
        first_line = text.splitlines()[0] if text else type(error).__name__
        lost = ("Connection closed by peer", "Connection reset", "Broken pipe", "Socket closed", "ECONNRESET")
        if any(marker in text for marker in lost):
            return PeerLostError(f"{what}: a peer was lost (its process died or closed the connection): {first_line}")
        if "timed out" in text.lower():
            return CommTimeoutError(f"{what} timed out on rank {self.rank}: {first_line}")
        return CommError(f"{what} failed on rank {self.rank}: {first_line}")

    # -- tensor preparation ----------------------------------------------------------------

    def _check_tensor(self, name: str, tensor: object) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.layout != torch.strided:
            raise TypeError(f"{name} must be a dense (strided) tensor, got layout {tensor.layout}")
        return tensor

    def _on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous tensor on the communication device (the tensor itself when it already is)."""
        if self._backend == "nccl" and tensor.device != self._device:
            return tensor.to(self._device).contiguous()
        if self._backend != "nccl" and tensor.device.type != "cpu":
            return tensor.cpu().contiguous()
        return tensor.contiguous()

    @staticmethod
    def _mode(*tensors: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
        """In-place work on inference tensors must happen in inference mode."""
        if not torch.is_inference_mode_enabled() and any(t.is_inference() for t in tensors):
            return torch.inference_mode()
        return contextlib.nullcontext()

    def _in_place(
        self,
        tensor: torch.Tensor,
        start: Callable[[torch.Tensor], Any],
        after: Callable[[torch.Tensor], None] | None,
        async_op: bool,
        what: str,
    ) -> Any:
        """Run an in-place collective on a contiguous device copy when needed, then write back."""
        work_tensor = self._on_device(tensor)
        with self._mode(tensor, work_tensor), self._translate(what):
            work = start(work_tensor)

        def finish() -> torch.Tensor:
            with self._mode(tensor, work_tensor):
                if after is not None:
                    after(work_tensor)
                if work_tensor is not tensor:
                    tensor.copy_(work_tensor)
            return tensor

        handle = Handle([work], finish, self._waiter(what))
        return handle if async_op else handle.wait()

    def _waiter(self, what: str) -> Callable[[Sequence[Any], float | None], None]:
        return lambda works, timeout: self._wait(works, timeout, what)

    # -- barrier and tensor collectives --------------------------------------------------------

    @override
    @collective()
    def barrier(self, timeout: float | None = None) -> None:
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
                raise ValueError(f"barrier timeout must be a positive number of seconds, got {timeout!r}")
            self._board.barrier(self, float(timeout))
            return
        with self._translate("barrier"):
            work = dist.barrier(group=self._cpu_group, async_op=True)
        self._wait([work], None, "barrier")

    @override
    @collective("tensor", "op")
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOpLike = "sum", async_op: bool = False) -> Any:
        tensor = self._check_tensor("tensor", tensor)
        name = parse_op(op)
        check_op_dtype(name, tensor.dtype)
        world = self.world_size
        return self._in_place(
            tensor,
            lambda t: dist.all_reduce(t, op=torch_op(name), group=self._group, async_op=True),
            (lambda t: _divide(t, world)) if name == "mean" else None,
            async_op,
            "all_reduce",
        )

    @override
    @collective("tensor", "src")
    def broadcast(self, tensor: torch.Tensor, src: int = 0, async_op: bool = False) -> Any:
        tensor = self._check_tensor("tensor", tensor)
        src = self._check_rank("src", src)
        return self._in_place(
            tensor,
            lambda t: dist.broadcast(t, group=self._group, group_src=self._group_rank_of[src], async_op=True),
            None,
            async_op,
            "broadcast",
        )

    @override
    @collective("tensor", "dst", "op")
    def reduce(self, tensor: torch.Tensor, dst: int = 0, op: ReduceOpLike = "sum", async_op: bool = False) -> Any:
        tensor = self._check_tensor("tensor", tensor)
        dst = self._check_rank("dst", dst)
        name = parse_op(op)
        check_op_dtype(name, tensor.dtype)
        world = self.world_size
        original = tensor.clone() if self.rank != dst else None

        def after(t: torch.Tensor) -> None:
            if original is not None:
                t.copy_(original)  # torch may leave partial sums on non-destination ranks
            elif name == "mean":
                t.div_(world)

        return self._in_place(
            tensor,
            lambda t: dist.reduce(
                t, group=self._group, group_dst=self._group_rank_of[dst], op=torch_op(name), async_op=True
            ),
            after,
            async_op,
            "reduce",
        )

    def _meta(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() > MAX_NDIM:
            raise ValueError(f"tensors of more than {MAX_NDIM} dimensions are not supported, got {tensor.dim()}")
        meta = torch.zeros(2 + MAX_NDIM, dtype=torch.int64)
        meta[0] = _DTYPE_CODES.get(tensor.dtype, -1)
        meta[1] = tensor.dim()
        meta[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        return meta

    def _gather_metas(self, meta: torch.Tensor, what: str) -> list[tuple[torch.dtype, tuple[int, ...]]]:
        """Every rank's (dtype, shape); a dtype or ndim mismatch is an error on every rank."""
        out = torch.empty(self.world_size * meta.numel(), dtype=torch.int64)
        with self._translate(what):
            work = _all_gather_single(out, meta, group=self._cpu_group, async_op=True)
        self._wait([work], None, what)
        rows = out.view(self.world_size, -1)[self._group_rank_of].tolist()
        return self._check_metas(rows, what)

    def _check_metas(self, rows: list[list[int]], what: str) -> list[tuple[torch.dtype, tuple[int, ...]]]:
        first = rows[0]
        if any(row[0] != first[0] or row[1] != first[1] for row in rows):
            sides = {
                r: f"{what}({_CODE_DTYPES.get(row[0], 'unsupported dtype')}, shape {tuple(row[2 : 2 + row[1]])})"
                for r, row in enumerate(rows)
            }
            raise CollectiveMismatchError(sides, f"{what}: tensors must have the same dtype and number of dimensions")
        if first[0] not in _CODE_DTYPES:
            raise TypeError(f"{what}: unsupported tensor dtype")
        return [(_CODE_DTYPES[row[0]], tuple(row[2 : 2 + row[1]])) for row in rows]

    def _p2p(
        self, sends: Mapping[int, torch.Tensor], recvs: Mapping[int, torch.Tensor], group: dist.ProcessGroup
    ) -> list[Any]:
        """Start point-to-point transfers (ranks local); receives are posted first."""
        works = []
        for peer, tensor in recvs.items():
            works.append(PointToPoint(dist.irecv(tensor, group=group, group_src=self._group_rank_of[peer])))
        for peer, tensor in sends.items():
            works.append(PointToPoint(dist.isend(tensor, group=group, group_dst=self._group_rank_of[peer])))
        return works

    @override
    @collective("tensor:dtype")
    def all_gather(self, tensor: torch.Tensor, async_op: bool = False) -> Any:
        tensor = self._check_tensor("tensor", tensor)
        metas = self._gather_metas(self._meta(tensor), "all_gather")
        source = self._on_device(tensor)
        with self._mode(tensor):
            outputs = [torch.empty(shape, dtype=dtype, device=self._device) for dtype, shape in metas]
            outputs[self.rank].copy_(source)
        uniform = all(shape == metas[0][1] for _, shape in metas)
        with self._mode(tensor, *outputs), self._translate("all_gather"):
            if uniform and (self._backend == "nccl" or source.numel() * source.element_size() < P2P_MIN_BYTES):
                flat = torch.empty(self.world_size * source.numel(), dtype=source.dtype, device=self._device)
                works = [_all_gather_single(flat, source.reshape(-1), group=self._group, async_op=True)]

                def finish() -> list[torch.Tensor]:
                    rows = flat.view(self.world_size, *source.shape)
                    return [rows[self._group_rank_of[r]].clone() for r in range(self.world_size)]
            else:
                others = {r: out for r, out in enumerate(outputs) if r != self.rank}
                works = self._p2p(dict.fromkeys(others, source), others, self._group)

                def finish() -> list[torch.Tensor]:
                    return outputs

        handle = Handle(works, finish, self._waiter("all_gather"))
        return handle if async_op else handle.wait()

    @override
    @collective("tensor:dtype", "dst")
    def gather(self, tensor: torch.Tensor, dst: int = 0, async_op: bool = False) -> Any:
        tensor = self._check_tensor("tensor", tensor)
        dst = self._check_rank("dst", dst)
        metas = self._gather_metas(self._meta(tensor), "gather")
        source = self._on_device(tensor)
        if self.rank != dst:
            with self._mode(tensor), self._translate("gather"):
                works = self._p2p({dst: source}, {}, self._group)
            handle: Handle[Any] = Handle(works, lambda: None, self._waiter("gather"))
            return handle if async_op else handle.wait()
        with self._mode(tensor):
            outputs = [torch.empty(shape, dtype=dtype, device=self._device) for dtype, shape in metas]
            outputs[dst].copy_(source)
        with self._mode(*outputs), self._translate("gather"):
            works = self._p2p({}, {r: out for r, out in enumerate(outputs) if r != dst}, self._group)
        handle = Handle(works, lambda: outputs, self._waiter("gather"))
        return handle if async_op else handle.wait()

    @override
    @collective("src")
    def scatter(self, tensors: Sequence[torch.Tensor] | None, src: int = 0, async_op: bool = False) -> Any:
        src = self._check_rank("src", src)
        metas = torch.zeros(self.world_size, 2 + MAX_NDIM, dtype=torch.int64)
        sources: list[torch.Tensor] = []
        if self.rank == src:
            if tensors is None or isinstance(tensors, torch.Tensor) or len(tensors) != self.world_size:
                raise ValueError(f"scatter: src must pass a sequence of {self.world_size} tensors (one per rank)")
            sources = [self._on_device(self._check_tensor(f"tensors[{i}]", t)) for i, t in enumerate(tensors)]
            for r, t in enumerate(sources):
                metas[r] = self._meta(t)
        with self._translate("scatter"):
            work = dist.broadcast(metas, group=self._cpu_group, group_src=self._group_rank_of[src], async_op=True)
        self._wait([work], None, "scatter")
        ((dtype, shape),) = self._check_metas([metas[self.rank].tolist()], "scatter")
        if self.rank == src:
            self._check_metas(metas.tolist(), "scatter")
            result = sources[src].clone()
            with self._translate("scatter"):
                works = self._p2p({r: t for r, t in enumerate(sources) if r != src}, {}, self._group)
        else:
            result = torch.empty(shape, dtype=dtype, device=self._device)
            with self._translate("scatter"):
                works = self._p2p({}, {src: result}, self._group)
        handle = Handle(works, lambda: result, self._waiter("scatter"))
        return handle if async_op else handle.wait()

    @override
    @collective("tensors", "op")
    def reduce_scatter(self, tensors: Sequence[torch.Tensor], op: ReduceOpLike = "sum", async_op: bool = False) -> Any:
        if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence) or len(tensors) != self.world_size:
            raise ValueError(f"reduce_scatter needs a sequence of {self.world_size} tensors (one per rank)")
        inputs = [self._on_device(self._check_tensor(f"tensors[{i}]", t)) for i, t in enumerate(tensors)]
        name = parse_op(op)
        check_op_dtype(name, inputs[0].dtype)
        ordered = [inputs[self._local_of_group[g]] for g in range(self.world_size)]
        output = torch.empty_like(ordered[self._group_rank_of[self.rank]])
        world = self.world_size
        with self._mode(*inputs), self._translate("reduce_scatter"):
            work = dist.reduce_scatter(output, ordered, op=torch_op(name), group=self._group, async_op=True)

        def finish() -> torch.Tensor:
            return output.div_(world) if name == "mean" else output

        handle = Handle([work], finish, self._waiter("reduce_scatter"))
        return handle if async_op else handle.wait()

    @override
    @collective("tensors:len")
    def all_to_all(self, tensors: Sequence[torch.Tensor], async_op: bool = False) -> Any:
        if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence) or len(tensors) != self.world_size:
            raise ValueError(f"all_to_all needs a sequence of {self.world_size} tensors (one per rank)")
        inputs = [self._on_device(self._check_tensor(f"tensors[{i}]", t)) for i, t in enumerate(tensors)]
        metas = torch.stack([self._meta(t) for t in inputs])
        everyone = torch.empty(self.world_size * metas.numel(), dtype=torch.int64)
        with self._translate("all_to_all"):
            work = _all_gather_single(everyone, metas.reshape(-1), group=self._cpu_group, async_op=True)
        self._wait([work], None, "all_to_all")
        everyone = everyone.view(self.world_size, *metas.shape)
        incoming = [everyone[self._group_rank_of[r], self.rank].tolist() for r in range(self.world_size)]
        shapes = self._check_metas(incoming, "all_to_all")
        outputs = [torch.empty(shape, dtype=dtype, device=self._device) for dtype, shape in shapes]
        outputs[self.rank].copy_(inputs[self.rank])
        with self._mode(*inputs), self._translate("all_to_all"):
            works = self._p2p(
                {r: t for r, t in enumerate(inputs) if r != self.rank},
                {r: t for r, t in enumerate(outputs) if r != self.rank},
                self._group,
            )
        handle = Handle(works, lambda: outputs, self._waiter("all_to_all"))
        return handle if async_op else handle.wait()

    def _peer(self, name: str, peer: int) -> int:
        peer = self._check_rank(name, peer)
        if peer == self.rank:
            raise ValueError(f"{name}={peer} is this rank; point-to-point needs another rank")
        return peer

    @override
    @collective(p2p=True)
    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        self.isend(tensor, dst, tag).wait()

    @override
    @collective(p2p=True)
    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> torch.Tensor:
        result: torch.Tensor = self.irecv(tensor, src, tag).wait()
        return result

    @override
    @collective(p2p=True)
    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Handle[None]:
        tensor = self._check_tensor("tensor", tensor)
        dst = self._peer("dst", dst)
        source = self._on_device(tensor)
        with self._mode(tensor), self._translate("send"):
            work = PointToPoint(dist.isend(source, group=self._group, group_dst=self._group_rank_of[dst], tag=tag))
        return Handle([work], lambda: None, self._waiter("send"))

    @override
    @collective(p2p=True)
    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Handle[torch.Tensor]:
        tensor = self._check_tensor("tensor", tensor)
        src = self._peer("src", src)
        target = self._on_device(tensor)
        with self._mode(tensor), self._translate("recv"):
            work = PointToPoint(dist.irecv(target, group=self._group, group_src=self._group_rank_of[src], tag=tag))

        def finish() -> torch.Tensor:
            if target is not tensor:
                with self._mode(tensor):
                    tensor.copy_(target)
            return tensor

        return Handle([work], finish, self._waiter("recv"))

    # -- raw byte primitives for object traffic (always on the CPU group) ---------------------------

    @override
    def _gather_records(self, record: np.ndarray) -> list[np.ndarray]:
        source = torch.from_numpy(record)
        out = torch.empty(self.world_size * record.size, dtype=torch.uint8)
        with self._translate("object exchange"):
            work = _all_gather_single(out, source, group=self._cpu_group, async_op=True)
        self._wait([work], None, "object exchange")
        rows = out.numpy().reshape(self.world_size, record.size)
        return [rows[g] for g in self._group_rank_of]

    @override
    def _gather_records_to(self, record: np.ndarray, dst: int) -> list[np.ndarray] | None:
        source = torch.from_numpy(record)
        outputs = [torch.empty_like(source) for _ in range(self.world_size)] if self.rank == dst else None
        with self._translate("object gather"):
            work = dist.gather(
                source, outputs, group=self._cpu_group, group_dst=self._group_rank_of[dst], async_op=True
            )
        self._wait([work], None, "object gather")
        if outputs is None:
            return None
        return [outputs[g].numpy() for g in self._group_rank_of]

    @override
    def _broadcast_record(self, record: np.ndarray, src: int) -> np.ndarray:
        tensor = torch.from_numpy(record.copy())
        with self._translate("object broadcast"):
            work = dist.broadcast(tensor, group=self._cpu_group, group_src=self._group_rank_of[src], async_op=True)
        self._wait([work], None, "object broadcast")
        return tensor.numpy()

    @override
    def _scatter_records(self, records: Sequence[np.ndarray] | None, src: int) -> np.ndarray:
        from communicator.records import RECORD_BYTES

        out = torch.empty(RECORD_BYTES, dtype=torch.uint8)
        scatter_list = None
        if records is not None:
            scatter_list = [torch.from_numpy(records[self._local_of_group[g]]) for g in range(self.world_size)]
        with self._translate("object scatter"):
            work = dist.scatter(
                out, scatter_list, group=self._cpu_group, group_src=self._group_rank_of[src], async_op=True
            )
        self._wait([work], None, "object scatter")
        return out.numpy()

    @override
    def _exchange(self, sends: Mapping[int, np.ndarray], recvs: Mapping[int, np.ndarray]) -> None:
        if not sends and not recvs:
            return
        with self._translate("object transfer"):
            works = self._p2p(
                {r: torch.from_numpy(a) for r, a in sends.items()},
                {r: torch.from_numpy(a) for r, a in recvs.items()},
                self._cpu_group,
            )
        self._wait(works, None, "object transfer")


def _new_group(world_ranks: tuple[int, ...], timeout: timedelta, backend: str | None, name: str | None) -> Any:
    if name is None:
        return dist.new_group(list(world_ranks), timeout=timeout, backend=backend)
    # torch names members-only groups after the number of groups this process knows, which
    # differs between ranks that were members of earlier groups and ranks that were not; the
    # members would then rendezvous under different names and hang. They share ``name`` instead.
    c10d = dist.distributed_c10d
    derive_name = c10d._process_group_name
    c10d._process_group_name = lambda ranks, use_hashed_name: c10d.GroupName(name)
    try:
        return dist.new_group(list(world_ranks), timeout=timeout, backend=backend, use_local_synchronization=True)
    finally:
        c10d._process_group_name = derive_name


def _divide(tensor: torch.Tensor, by: int) -> None:
    tensor.div_(by)


def restore_environ(saved: Mapping[str, str | None]) -> None:
    """Put back environment variables as they were (``None``: it was unset)."""
    import os

    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _topology_from_env() -> Topology:
    import os

    world = int(os.environ.get("WORLD_SIZE", dist.get_world_size()))
    rank = dist.get_rank()
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    local_rank = int(os.environ.get("LOCAL_RANK", rank % max(local_size, 1)))
    node_rank = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", rank // max(local_size, 1))))
    return Topology(local_rank, local_size, node_rank, max(1, -(-world // max(local_size, 1))))
