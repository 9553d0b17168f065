"""The default collectives and subgroups of a communicator, over its point-to-point alone.

A subclass that implements ``rank``, ``world_size``, ``_isend`` and ``_irecv`` gets ``_barrier``,
``_broadcast``, ``_all_reduce``, ``_reduce``, ``_all_gather``, ``_gather`` and ``_create_groups`` from here
(the base class's defaults delegate to these functions); ``TorchComm`` overrides every one with
torch's. The algorithms take O(log N) steps where latency counts and move each byte once where
bandwidth counts:

- barrier: dissemination (``ceil(log2 N)`` rounds of one empty message);
- broadcast and reduce: binomial trees rooted at the source or destination;
- all-reduce: a reduce to rank 0, then a broadcast from it, so that every rank holds bitwise the
  same result (the ranks combine in one order, whatever the op and dtype);
- all-gather: a ring (``N - 1`` steps, each rank sends and receives one block per step);
- gather: every rank sends its block to the destination at once.

Each default runs to its end before it returns (it returns ``DONE``): its steps are waited on
through the communicator's ``_await``, so they are bounded by the timeout and released by a
peer's failure like any wait. Messages travel on :data:`COLLECTIVE_TAG`, apart from the users'
tags and the library's transfers; collectives run one at a time and in the same order on every
rank, so one tag keeps them apart.

A subgroup (:class:`~communicator.transports.context_group.ContextGroup`) sends over its parent's
point-to-point, translating ranks and folding its context number and the tag into one tag of the
parent's that no user's tag, no sibling's and no parent's own can take: negative tags, which
``check_tag`` refuses to users.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from communicator.arguments import COLLECTIVE_TAG
from communicator.handles import DONE, Work
from communicator.ops.staging import while_editing


class Peers(Protocol):
    """What the defaults use of a communicator: its rank, size, point-to-point and waits."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work: ...

    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work: ...

    def _await(self, works: Sequence[Work], timeout: float | None = None) -> None: ...


__all__ = ["all_gather", "all_reduce", "barrier", "broadcast", "combine", "fold_tag", "pair", "reduce"]

_SIGN = -(2**63)  # uint64 compares as int64 once its top bit is flipped
_WIDEN = {torch.uint16: torch.int64, torch.uint32: torch.int64}  # torch adds and compares no such tensor
_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_OPS: dict[str, Callable[..., torch.Tensor]] = {
    "sum": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum,
    "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor,
}  # fmt: skip


def combine(op: str, into: torch.Tensor, other: torch.Tensor) -> None:
    """``into = into <op> other`` for every dtype the library moves; integers wrap as the backends'
    do, float8 is combined in float32 and rounded once."""
    fn = _OPS[op]
    if into.dtype == torch.uint64:
        a, b = into.view(torch.int64), other.view(torch.int64)
        if op in ("min", "max"):
            into.view(torch.int64).copy_(fn(a ^ _SIGN, b ^ _SIGN) ^ _SIGN)
        else:  # two's complement: the same bits as unsigned arithmetic modulo 2**64
            fn(a, b, out=a)
    elif into.dtype in _WIDEN or into.dtype in _FLOAT8:
        wide = torch.float32 if into.dtype in _FLOAT8 else _WIDEN[into.dtype]
        into.copy_(fn(into.to(wide), other.to(wide)).to(into.dtype))
    else:
        fn(into, other, out=into)


def _scratch(like: torch.Tensor) -> torch.Tensor:
    """A buffer a transport may fill from any thread: never an inference tensor nor a leaf that requires grad."""
    with torch.inference_mode(False):
        return torch.empty(like.shape, dtype=like.dtype, device=like.device)


def _send(comm: Peers, tensor: torch.Tensor, dst: int) -> Work:
    return comm._isend(tensor.detach(), dst, COLLECTIVE_TAG)


def _recv(comm: Peers, tensor: torch.Tensor, src: int) -> Work:
    return while_editing(comm._irecv(tensor, src, COLLECTIVE_TAG), tensor)


def barrier(comm: Peers, timeout: float | None = None) -> Work:
    """Dissemination: in round ``k`` each rank signals the rank ``2**k`` ahead and hears from the one
    ``2**k`` behind; after the last round every rank has heard, indirectly, from every other. Each
    round may wait ``timeout`` seconds (``None``: the communicator's timeout)."""
    rank, world = comm.rank, comm.world_size
    step = 1
    while step < world:
        token = torch.zeros(1, dtype=torch.uint8)
        heard = torch.zeros(1, dtype=torch.uint8)
        works = [comm._irecv(heard, (rank - step) % world, COLLECTIVE_TAG), _send(comm, token, (rank + step) % world)]
        comm._await(works, timeout)
        step *= 2
    return DONE


def broadcast(comm: Peers, tensor: torch.Tensor, src: int) -> Work:
    """Binomial tree rooted at ``src``: a rank receives once from its parent, then sends to its
    children, largest subtree first."""
    world = comm.world_size
    relative = (comm.rank - src) % world
    mask = 1
    while mask < world:
        if relative & mask:
            comm._await([_recv(comm, tensor, (relative - mask + src) % world)])
            break
        mask *= 2
    mask //= 2
    sends = []
    while mask > 0:
        if relative + mask < world:
            sends.append(_send(comm, tensor, (relative + mask + src) % world))
        mask //= 2
    comm._await(sends)
    return DONE


def reduce(comm: Peers, tensor: torch.Tensor, dst: int, op: str) -> Work:
    """Binomial tree rooted at ``dst``: a rank combines what its children send (the lower rank's
    value on the left), then sends the result to its parent. Other ranks' ``tensor`` is scratch."""
    world = comm.world_size
    relative = (comm.rank - dst) % world
    received = _scratch(tensor) if world > 1 else tensor
    mask = 1
    while mask < world:
        if relative & mask:
            comm._await([_send(comm, tensor, (relative - mask + dst) % world)])
            break
        if relative + mask < world:
            comm._await([comm._irecv(received, (relative + mask + dst) % world, COLLECTIVE_TAG)])
            combine(op, tensor, received)
        mask *= 2
    return DONE


def all_reduce(comm: Peers, tensor: torch.Tensor, op: str) -> Work:
    """A reduce to rank 0 and a broadcast from it: every rank holds bitwise the same result."""
    reduce(comm, tensor, 0, op)
    return broadcast(comm, tensor, 0)


def all_gather(comm: Peers, outputs: list[torch.Tensor], tensor: torch.Tensor) -> Work:
    """Ring: in step ``s`` each rank passes on the block it got in step ``s - 1`` (its own first)."""
    rank, world = comm.rank, comm.world_size
    outputs[rank].copy_(tensor)
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        incoming = outputs[(rank - step - 1) % world]
        comm._await([_recv(comm, incoming, left), _send(comm, outputs[(rank - step) % world], right)])
    return DONE


def gather(comm: Peers, output: torch.Tensor, counts: Sequence[int], tensor: torch.Tensor, dst: int) -> Work:
    """Every rank's 1-D ``tensor`` to ``dst``, at once, into ``output`` in rank order (see
    ``Communicator._gather``)."""
    if comm.rank != dst:
        comm._await([_send(comm, tensor, dst)])
        return DONE
    works, offset = [], 0
    for r, count in enumerate(counts):
        part = output[offset : offset + count]
        offset += count
        if r == dst:
            part.copy_(tensor)
        else:
            works.append(_recv(comm, part, r))
    comm._await(works)
    return DONE


def pair(a: int, b: int) -> int:
    """Cantor's pairing: a different natural number for every pair of naturals."""
    return (a + b) * (a + b + 1) // 2 + b


def fold_tag(context: int, tag: int) -> int:
    """The parent's (negative) tag of a subgroup's ``tag``; subgroups of subgroups fold again, so a
    tag may itself be negative."""
    natural = 2 * tag if tag >= 0 else -2 * tag - 1
    return -1 - pair(context, natural)
