"""Which communicator serves a :mod:`communicator.dist` call.

In order: the ``group`` argument when it is a :class:`~communicator.base.Communicator`; the
communicator of the innermost open ``with`` block (or the one :func:`communicator.dist.init_dist`
opened); the default ``torch.distributed`` group, adopted once per default group; a
:class:`~communicator.transports.nondist.NonDistComm` when ``torch.distributed`` is not initialised. A torch
``ProcessGroup`` argument selects the communicator over that group, built once per backing
communicator and forgotten when that one closes.

Rank queries never adopt the default group (adopting runs a collective, and a query may run on
one rank only): without an open communicator, torch answers them.
"""

from __future__ import annotations

import dataclasses

import torch.distributed as dist

from communicator.base import Communicator
from communicator.config import CommConfig
from communicator.errors import CommError, NotMemberError
from communicator.transports.nondist import NonDistComm
from communicator.transports.torch_comm import TorchComm

__all__ = [
    "GroupLike",
    "active_comm",
    "comm_for",
    "local_comm",
    "local_rank_of",
    "open_comm",
    "query_comm",
    "set_local_comm",
    "take_opened_comm",
    "torch_initialised",
]

#: What the ``group`` argument of :mod:`communicator.dist` accepts.
GroupLike = dist.ProcessGroup | Communicator | None


@dataclasses.dataclass
class _State:
    """Everything this process remembers between calls."""

    adopted: TorchComm | None = None
    adopted_world: dist.ProcessGroup | None = None
    single: NonDistComm | None = None
    opened: Communicator | None = None
    local: Communicator | None = None
    groups: dict[Communicator, dict[dist.ProcessGroup, TorchComm]] = dataclasses.field(default_factory=dict)


_state = _State()


def torch_initialised() -> bool:
    """Whether ``torch.distributed`` has a default group."""
    return dist.is_available() and dist.is_initialized()


def active_comm() -> Communicator | None:
    """The communicator of the innermost open ``with`` block, unless it was closed inside it."""
    current = Communicator.current()
    return current if current is not None and not current.closed else None


def _single_comm() -> NonDistComm:
    if _state.single is None:
        reason = "communicator.dist: torch.distributed is not initialised"
        _state.single = NonDistComm(CommConfig(launcher="none"), reason=reason)
    return _state.single


def _drop_adopted() -> None:
    stale, _state.adopted, _state.adopted_world = _state.adopted, None, None
    if stale is not None:
        stale.close()


def _adopted_comm() -> TorchComm:
    """The default group's communicator, adopted again when the default group was replaced."""
    world = dist.group.WORLD
    if _state.adopted is None or _state.adopted_world is not world or _state.adopted.closed:
        _drop_adopted()
        _state.adopted = TorchComm.adopt(CommConfig(), reason="communicator.dist adopted the default group")
        _state.adopted_world = world
    return _state.adopted


def _backing_comm() -> Communicator:
    active = active_comm()
    if active is not None:
        return active
    if torch_initialised():
        return _adopted_comm()
    _drop_adopted()
    return _single_comm()


def comm_for(group: GroupLike) -> Communicator:
    """The communicator a collective with this ``group`` argument runs on."""
    if isinstance(group, Communicator):
        return group
    base = _backing_comm()
    if group is None:
        return base
    if not isinstance(group, dist.ProcessGroup):
        if group == dist.GroupMember.NON_GROUP_MEMBER:  # what torch's new_group gives non-members
            raise NotMemberError(f"world rank {dist.get_rank()} is not a member of the process group passed as group=")
        raise TypeError(f"group must be a torch ProcessGroup, a Communicator or None, got {type(group).__name__}")
    if not isinstance(base, TorchComm):
        raise CommError(f"group= names a torch ProcessGroup, but the active communicator is a {type(base).__name__}")
    for closed in [comm for comm in _state.groups if comm.closed]:
        del _state.groups[closed]
    cached = _state.groups.setdefault(base, {})
    comm = cached.get(group)
    if comm is None or comm.closed:
        comm = cached[group] = base.for_torch_group(group)
    return comm


def query_comm(group: GroupLike) -> Communicator | None:
    """The communicator that answers a rank query about ``group``; ``None``: ask torch."""
    if isinstance(group, Communicator):
        return group
    if group is None:
        active = active_comm()
        if active is not None:
            return active
    return None if torch_initialised() else _single_comm()


def local_rank_of(comm: Communicator, global_rank: int | None) -> int:
    """``comm``'s rank for world rank ``global_rank``; ``None`` is the group's first rank."""
    if global_rank is None:
        return 0
    if isinstance(comm, (TorchComm, NonDistComm)):
        return comm.to_local(global_rank)
    return global_rank


def open_comm(comm: Communicator) -> None:
    """Make ``comm`` the active communicator until :func:`take_opened_comm`."""
    _state.opened = comm.__enter__()


def take_opened_comm() -> Communicator | None:
    """Forget the opened communicator and return it (the caller closes it)."""
    opened, _state.opened = _state.opened, None
    return opened


def set_local_comm(comm: Communicator) -> None:
    """Remember the communicator of this node's ranks (see ``init_local_group``)."""
    _state.local = comm


def local_comm() -> Communicator | None:
    """The communicator of this node's ranks, while it is open."""
    return _state.local if _state.local is not None and not _state.local.closed else None
