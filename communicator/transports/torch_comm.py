"""`TorchComm`: a communicator over a ``torch.distributed`` process group (gloo, nccl, mpi), and
`SubgroupComm`, one over some of its ranks."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore
from typing_extensions import override

import communicator.ops.defaults as derived
import communicator.startup as startup
import communicator.transports.gloo_dtypes as wire
from communicator.arguments import TRANSFER_TAG
from communicator.base import Communicator
from communicator.config import CommConfig
from communicator.control import Control
from communicator.control.log import Store
from communicator.control.waiting import PointToPoint, StreamOrdered, Together
from communicator.errors import CommError, NotMemberError
from communicator.factory import TORCH
from communicator.handles import Work
from communicator.launchers import Topology, detect_launcher
from communicator.transports.groups import GroupPair, Groups
from communicator.transports.nonmember import NonMemberComm
from communicator.transports.process_group import communicator_of
from communicator.transports.torch_channel import TorchChannel, cut
from communicator.transports.torch_options import all_reduce_options, broadcast_options

__all__ = ["GroupScope", "SubgroupComm", "TorchComm"]

# Larger equal-shape gathers go point to point: gloo's collectives copy them twice more. Below,
# the wait on sends and receives costs more than the copies: 4.3 ms against gloo's 1.3 ms for
# 64 KiB at 2 ranks on 2 cores; at 1 MiB 3.5 against 2.9 at 2 ranks, 7.8 against 10.9 at 4.
P2P_MIN_BYTES = 1024 * 1024
# After a failure, how long the rank serving the store keeps it up for peers still reading the board.
LINGER_SECONDS = 10.0
_TORCH_OPS = {
    "sum": dist.ReduceOp.SUM,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}


#: Reductions NCCL does not have: they run over point to point (``communicator.ops.defaults``).
_NCCL_LACKS = frozenset({"band", "bor", "bxor"})
_ALL_REDUCE = {name: all_reduce_options(op) for name, op in _TORCH_OPS.items()}
_BARRIER = dist.BarrierOptions()
_ALL_TO_ALL = dist.AllToAllOptions()


@dataclasses.dataclass
class GroupScope:
    """Which torch group a communicator speaks over, and what it shares with the rest of its world."""

    group: dist.ProcessGroup
    companion: dist.ProcessGroup  # the gloo group objects travel on (``group`` itself under gloo)
    global_ranks: tuple[int, ...]  # world rank of each of the communicator's ranks, in its order
    topology: Topology
    groups: Groups  # the torch groups the world created, shared by its subgroups
    namespace: str  # the world communicator's name in the rendezvous store, the same on every rank
    store: Store | None = None  # that namespace of the store (a world communicator's)
    board: str = ""  # the subgroup's namespace inside its parent's (a subgroup's)
    parent: TorchComm | None = None

    @classmethod
    def world(cls, config: CommConfig, topology: Topology | None = None) -> GroupScope:
        """The initialised default group, with a fresh namespace in the store (no communication:
        ranks create communicators in the same order, so the count of them names one namespace everywhere)."""
        if not (dist.is_available() and dist.is_initialized()):
            raise CommError("TorchComm needs torch.distributed to be initialised (or build it with create())")
        world = dist.distributed_c10d._get_default_group()
        backend = str(dist.get_backend(world))
        groups = Groups(backend, config.timeout)
        size = dist.get_world_size()
        companion = (
            world if backend == "gloo" else dist.new_group(list(range(size)), backend="gloo", timeout=config.timeout)
        )
        cls._boards += 1
        namespace = f"{world.group_name}/board{cls._boards}/"
        store = PrefixStore(f"communicator/{namespace}", dist.distributed_c10d._get_default_store())
        layout = topology or Topology.from_environ(dist.get_rank(), size)
        return cls(world, companion, tuple(range(size)), layout, groups, namespace, store)

    _boards = 0  # world communicators made in this process

    def release(self) -> None:
        """Drop the references to the torch groups (their communicator closed)."""
        for name in ("group", "companion", "store"):
            vars(self).pop(name, None)


@Communicator.register(TORCH)
class TorchComm(Communicator):
    """A communicator over a ``torch.distributed`` group.

    Build it with :meth:`Communicator.create` (or a registered subclass's ``from_config``);
    ``TorchComm(config)`` and ``TorchComm.adopt()`` wrap an already initialised default group
    without taking ownership.
    """

    whole_transfer_waits = True  # the control plane waits on torch's point-to-point works whole

    def __init__(self, config: CommConfig | None = None, scope: GroupScope | None = None) -> None:
        super().__init__(config)
        scope = scope or GroupScope.world(self.config)
        self._scope = scope
        self._group = scope.group
        self._backend = str(dist.get_backend(scope.group))
        ordered = sorted(scope.global_ranks)
        # torch numbers a group's ranks by world rank; this communicator may order them otherwise (split keys).
        self._group_rank_of = [ordered.index(g) for g in scope.global_ranks]
        self._local_of_group = [scope.global_ranks.index(g) for g in ordered]
        self._in_group_order = self._local_of_group == list(range(len(ordered)))
        self._rank = scope.global_ranks.index(dist.get_rank())
        self._limit = self.config.timeout.total_seconds()
        self._device = self._pick_device()
        self._controlled()  # at once: peers may wait for this rank's status
        self._owned: startup.Started | None = None
        self._reason = "adopted the initialised default group (not owned)"

    # -- construction ----------------------------------------------------------------------

    @classmethod
    @override
    def from_config(cls, config: CommConfig) -> TorchComm:
        """Adopt an initialised default group, or start and own one as the launcher says (a world
        of one without a launcher): what ``create`` does, for this class and its subclasses."""
        if dist.is_available() and dist.is_initialized():
            behind = communicator_of(None)
            if behind is not None:  # the "communicator" backend's default group: a view of its communicator
                view = behind.split(0)  # every rank: closing the view leaves torch's default group working
                assert isinstance(view, TorchComm)  # the backend's communicator is a TorchComm
                view._reason = "a view of the communicator behind torch.distributed's 'communicator' default group"
                return view
            return cls.adopt(config, "torch.distributed was already initialised: adopted its default group (not owned)")
        env = None
        if config.launcher != "none":
            env = detect_launcher(config.launcher, master_addr=config.master_addr, master_port=config.master_port)
        started = startup.start(config, env if env is not None else startup.world_of_one())
        try:
            comm = cls(config)  # the layout is in the variables the start set: a subclass needs only (config)
        except BaseException:
            dist.destroy_process_group()
            started.environment.restore()
            raise
        comm._owned, comm._reason = started, started.reason
        return comm

    @classmethod
    def adopt(cls, config: CommConfig | None = None, reason: str = "") -> TorchComm:
        """Wrap the initialised default group; closing the communicator leaves it initialised."""
        comm = cls(config)
        comm._reason = reason or comm._reason
        return comm

    def _pick_device(self) -> torch.device:
        if self.config.device is not None:
            return torch.device(self.config.device)
        if self._backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    # -- rank queries --------------------------------------------------------------------------

    @property
    @override
    def rank(self) -> int:
        return self._rank

    @property
    @override
    def world_size(self) -> int:
        return len(self._scope.global_ranks)

    @property
    @override
    def local_rank(self) -> int:
        return self._scope.topology.local_rank

    @property
    @override
    def local_size(self) -> int:
        return self._scope.topology.local_size

    @property
    @override
    def node_rank(self) -> int:
        return self._scope.topology.node_rank

    @property
    @override
    def num_nodes(self) -> int:
        return self._scope.topology.num_nodes

    @property
    @override
    def backend(self) -> str:
        return self._backend

    @property
    @override
    def device(self) -> torch.device:
        return self._device

    @property
    @override
    def global_ranks(self) -> tuple[int, ...]:
        return self._scope.global_ranks

    @property
    def group(self) -> dist.ProcessGroup:
        """The torch process group, for code that calls ``torch.distributed`` directly (while open)."""
        refusal = self._calls.refusal
        if self.closed and refusal is not None:  # its groups are released
            raise refusal("group")
        return self._group

    # -- primitives: torch calls -----------------------------------------------------------------

    # The hot primitives call the process group's own methods: torch's module-level wrappers check
    # again what the base class has checked, and cost more than a small collective's margin.

    @override
    def _barrier(self) -> Work:
        work: Work = self._scope.companion.barrier(_BARRIER)  # on the gloo companion: never stream-ordered
        return work

    @override
    def _all_reduce(self, tensor: torch.Tensor, op: str) -> Work:
        if op in _NCCL_LACKS and self._backend == "nccl":
            return derived.all_reduce(self, tensor, op)
        carried, back = wire.for_reduction(tensor, op)
        work = self._queued(self._group.allreduce([carried], _ALL_REDUCE[op]))
        return work if back is None else wire.Converted(work, back)

    @override
    def _reduce(self, tensor: torch.Tensor, dst: int, op: str) -> Work:
        if op in _NCCL_LACKS and self._backend == "nccl":
            return derived.reduce(self, tensor, dst, op)
        carried, back = wire.for_reduction(tensor, op)
        root = self._group_rank_of[dst]
        work = self._queued(dist.reduce(carried, group=self._group, group_dst=root, op=_TORCH_OPS[op], async_op=True))
        return work if back is None else wire.Converted(work, back)

    @override
    def _reduce_scatter(self, output: torch.Tensor, inputs: list[torch.Tensor], op: str) -> Work:
        if op in _NCCL_LACKS and self._backend == "nccl":
            return Communicator._reduce_scatter(self, output, inputs, op)
        ordered = [inputs[self._local_of_group[g]] for g in range(self.world_size)]
        if output.dtype in wire.UNSUPPORTED:
            wide = [wire.for_reduction(t, op)[0] for t in ordered]
            carried, back = wire.for_reduction(output, op)
            work = self._queued(dist.reduce_scatter(carried, wide, op=_TORCH_OPS[op], group=self._group, async_op=True))
            return work if back is None else wire.Converted(work, back)
        return self._queued(dist.reduce_scatter(output, ordered, op=_TORCH_OPS[op], group=self._group, async_op=True))

    @override
    def _broadcast(self, tensor: torch.Tensor, src: int) -> Work:
        options = broadcast_options(self._group_rank_of[src])
        return self._queued(self._group.broadcast([wire.as_bytes(tensor)], options))

    @override
    def _all_gather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> Work:
        if self._backend == "gloo" and tensor.numel() * tensor.element_size() >= P2P_MIN_BYTES:
            others = [r for r in range(self.world_size) if r != self._rank]
            works = [self._irecv(outputs[r], r, TRANSFER_TAG) for r in others]
            return Together(works + [self._isend(tensor, r, TRANSFER_TAG) for r in others])
        ordered = [wire.as_bytes(outputs[self._local_of_group[g]]) for g in range(self.world_size)]
        return self._queued(self._group.allgather([ordered], [wire.as_bytes(tensor)]))

    @override
    def _gather(self, output: torch.Tensor, counts: Sequence[int], tensor: torch.Tensor, dst: int) -> Work:
        """gloo's all-to-all of uneven parts (one collective, whose parts may differ in size, where
        gloo's gather takes one size) where this communicator numbers its ranks as the group does."""
        if self._backend != "gloo" or not self._in_group_order:
            return Communicator._gather(self, output, counts, tensor, dst)
        nothing = [0] * self.world_size
        sent = list(nothing)
        sent[dst] = tensor.numel()
        received = list(counts) if self._rank == dst else nothing
        return self._queued(self._group.alltoall_base(output, tensor, received, sent, _ALL_TO_ALL))

    def _queued(self, work: Work) -> Work:
        """A collective started on the group: stream-ordered under NCCL (see ``StreamOrdered``)."""
        return StreamOrdered(work) if self._backend == "nccl" else work

    @override
    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        peer = self._group_rank_of[dst]
        return PointToPoint(self._group.send([wire.as_bytes(tensor)], peer, tag), dst, self._cutter(peer))

    @override
    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        peer = self._group_rank_of[src]
        return PointToPoint(self._group.recv([wire.as_bytes(tensor)], peer, tag), src, self._cutter(peer))

    def _cutter(self, group_peer: int) -> Callable[[], None] | None:
        return functools.partial(cut, self._group, group_peer) if self._backend == "gloo" else None

    @override
    def _object_channel(self) -> TorchChannel:
        companion, local_size = self._scope.companion, self._scope.topology.local_size
        return TorchChannel(self._rank, companion, self._group_rank_of, self._start, self._await, local_size)

    @override
    def _control_plane(self) -> Control:
        """Over the rendezvous store, in its own namespace; a subgroup's is a child of its parent's."""
        scope = self._scope
        if scope.parent is None:
            assert scope.store is not None
            return Control.for_world(
                scope.store, self._rank, self.world_size, self._calls, self.config, scope.topology.local_size
            )
        return scope.parent._controlled().child(scope.global_ranks, scope.board, self._rank, self._calls, self.config)

    def _controlled(self) -> Control:
        """The control plane (every TorchComm has one, over the rendezvous store)."""
        control = self._plane()
        assert control is not None
        return control

    # -- subgroups ----------------------------------------------------------------------------

    @override
    def _create_groups(self, groups: list[list[int]]) -> Communicator:
        """From the world communicator every rank creates every group, in the same order (torch's
        rule, so it works across nodes); inside a subgroup only the members of each new group
        create it, since the other ranks of the job never call this."""
        everyone_creates = self._scope.parent is None
        board = self._controlled().board
        number = board.next_child()
        mine: Communicator | None = None
        for index, members in enumerate(groups):
            world_ranks = [self._scope.global_ranks[r] for r in members]
            name = f"sub{number}.{index}/"
            if self._rank not in members:
                board.not_a_member(name)
            if not (everyone_creates or self._rank in members):
                continue
            shared = None if everyone_creates else f"communicator/{self._scope.namespace}{board.name}{name}"
            pair = self._scope.groups.pair(tuple(sorted(world_ranks)), shared)
            if self._rank in members:
                mine = SubgroupComm(self, world_ranks, pair, name)
        return mine if mine is not None else NonMemberComm.outside(self, groups)

    @override
    def _shrunk(self, members: list[int], name: str) -> TorchComm:
        """A world of its own over ``members``: new torch groups created by the members only (the
        others may be dead), a namespace of its own under this one's, and the layout of the
        members' hosts."""
        board = self._controlled().board
        world_ranks = tuple(self._scope.global_ranks[r] for r in members)
        namespace = f"{self._scope.namespace}{board.name}{name}"
        groups = Groups(self._backend, self.config.timeout)
        group, companion = groups.pair(tuple(sorted(world_ranks)), f"communicator/{namespace}")
        where = board.hosts.where([board.members[r] for r in members])
        hosts = [where[board.members[r]][0] for r in members]
        topology = Topology.from_hosts(members.index(self._rank), hosts)
        store = PrefixStore(f"communicator/{namespace}", dist.distributed_c10d._get_default_store())
        scope = GroupScope(group, companion, world_ranks, topology, groups, namespace, store)
        shrunk = TorchComm(self.config, scope)
        shrunk._reason = f"shrink() of {self.world_size} ranks to the {len(members)} that went on"
        return shrunk

    def for_torch_group(self, group: dist.ProcessGroup) -> TorchComm:
        """A communicator over an existing torch group (created elsewhere), e.g. by ``dist.new_group``.

        Ranks are local to that group, as torch numbers them. No collective: members name the
        failure board after the group's own name.
        """
        root = self._root()
        if group is None or group is dist.group.WORLD:
            return root
        if group is dist.GroupMember.NON_GROUP_MEMBER:  # type: ignore[comparison-overlap]
            raise NotMemberError(f"world rank {dist.get_rank()} is not a member of this torch group")
        if not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group must be a torch ProcessGroup, got {type(group).__name__}")
        world_ranks = dist.get_process_group_ranks(group)
        name = f"torch-group-{group.group_name}/"
        pair = root._scope.groups.companion_of(
            group, tuple(sorted(world_ranks)), f"communicator/{root._scope.namespace}{name}"
        )
        return SubgroupComm(root, world_ranks, pair, name)

    def _root(self) -> TorchComm:
        comm = self
        while comm._scope.parent is not None:
            comm = comm._scope.parent
        return comm

    # -- teardown ------------------------------------------------------------------------------

    @override
    def _abandoned(self, cause: BaseException) -> None:
        if self._backend == "nccl":  # gloo's abort releases no blocked worker (see keep_alive)
            with contextlib.suppress(Exception):
                self._group.abort()

    @override
    def _teardown(self, error: BaseException | None) -> None:
        control = self._controlled()
        failed = error is not None or control.broken is not None
        if failed:  # its operations may never finish: their groups must outlive the process
            self._scope.groups.keep_alive(self._group, self._scope.companion)
        if self._owned is not None and dist.is_initialized():
            linger = LINGER_SECONDS if failed or Communicator._exiting else self._limit
            control.board.depart(self._rank, self._owned.hosts_store, linger)
            if failed:
                with contextlib.suppress(Exception):
                    self._group.abort()
            dist.destroy_process_group()
        elif self._scope.parent is None and dist.is_initialized():
            self._scope.groups.destroy()
        if self._owned is not None:
            self._owned.environment.restore()
        if not failed:
            self._release_groups()

    def _release_groups(self) -> None:
        """Let torch free the groups now, while the interpreter runs. A group's destructor joins its
        worker threads; a worker that finishes its last operation only after the interpreter began
        to finalise needs the GIL to release the operation's tensors, cannot take it, and aborts
        the process ("terminate called without an active exception")."""
        vars(self).pop("_group", None)
        self._scope.release()
        if self._scope.parent is None:
            self._scope.groups.forget()


class SubgroupComm(TorchComm):
    """Ranks ``global_ranks`` of a parent communicator, numbered ``0..len-1`` in that order.

    ``rank``, ``world_size`` and every ``src``/``dst``/``peer`` count inside the subgroup;
    ``global_ranks``, ``to_global`` and ``to_local`` translate to and from world ranks; ``parent``
    is the communicator it was split from. A process that is not a member gets a
    :class:`~communicator.transports.nonmember.NonMemberComm` (an instance of this class to ``isinstance``),
    whose ``is_member`` is ``False``, whose ``rank`` is ``-1``, and whose operations raise
    :class:`~communicator.errors.NotMemberError`.

    Subgroups of a user's subclass of ``TorchComm`` are ``SubgroupComm``s too: a subclass's
    constructor takes its own arguments and keeps its own state, which a subgroup cannot be
    given; wrap a subgroup in the subclass's own logic where that is needed.
    """

    def __init__(self, parent: TorchComm, global_ranks: Sequence[int], pair: GroupPair, board: str) -> None:
        group, companion = pair
        shared = parent._scope
        scope = GroupScope(
            group, companion, tuple(global_ranks), shared.topology, shared.groups, shared.namespace, None, board, parent
        )
        super().__init__(parent.config, scope)
        self._reason = f"split from {type(parent).__name__} over world ranks {list(global_ranks)}"

    @classmethod
    def __subclasshook__(cls, subclass: type) -> Any:
        """A non-member is a ``SubgroupComm`` to ``isinstance``, as torch's non-member ranks hold a
        group handle too (for this class only, not its subclasses)."""
        if cls is SubgroupComm and issubclass(subclass, NonMemberComm):
            return True
        return NotImplemented

    @property
    def parent(self) -> TorchComm:
        """The communicator this subgroup was created from."""
        assert self._scope.parent is not None
        return self._scope.parent
