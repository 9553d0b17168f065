"""The conformance suite every communicator passes, ours and users': :func:`check_communicator`.

It runs, on worlds of the given sizes:

- every check of ``communicator check``'s catalogue (:data:`communicator.check.CHECKS`: every
  public operation against values computed from rank numbers alone, subgroups included);
- every reduction op on every dtype the library moves, against a reference reduced locally;
- the same catalogue inside a subgroup (the ranks in reverse order, one rank left out where the
  world allows), with the subgroup's and the parent's messages on one tag in flight together;
- a bounded wait: a receive that no rank answers raises ``CommTimeoutError`` at its timeout;
- where the communicator has a control plane (``_control_store``): a rank that raises inside
  ``fail_together`` releases the others with a ``RemoteError`` naming it, and a rank that closes
  releases a peer that waits on it with a ``CommError``.

A check that fails raises ``AssertionError`` here, naming the world size, the check and the rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from communicator.base import Communicator
from communicator.check.catalogue import CHECKS
from communicator.check.runner import run_checks
from communicator.check.values import COMBINE, REDUCE_INPUT, factors
from communicator.errors import CommError, CommTimeoutError, RemoteError
from communicator.reductions import REDUCE_OPS, WIRE_DTYPES, check_op_dtype

__all__ = ["Runner", "check_communicator"]

#: ``run(fn, world_size, *args)``: ``fn(comm, *args)`` on every rank of a new world of the
#: communicator under test (each in its ``with`` block); the results in rank order.
Runner = Callable[..., list[Any]]

_SHORT = 1.0  # seconds of the bounded wait that must run out


#: A subgroup's checks: ``local_comm`` is left out, since a subgroup's ``local_rank`` and
#: ``local_size`` may describe the whole node (``SubgroupComm``'s do) rather than its members on it.
_SUBGROUP_CHECKS = tuple(check for check in CHECKS if check.name != "local_comm")


def catalogue(comm: Communicator, sizes: Sequence[str]) -> list[str]:
    """The checks that did not pass on this rank."""
    subgroup = comm._calls.up is not None  # made by split or new_group
    outcomes = run_checks(comm, _SUBGROUP_CHECKS if subgroup else CHECKS, sizes)
    return [f"{o.op} ({o.size}): {o.error}" for o in outcomes if o.status == "FAIL"]


def _inputs(op: str, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Small values every dtype holds exactly, their sums and products too (float8 included)."""
    values = factors(rank, 4) if op == "product" else REDUCE_INPUT[op](rank, 4) % 2
    if op in ("band", "bor", "bxor"):
        values = REDUCE_INPUT[op](rank, 4) % 128
    kind = torch.bool if dtype == torch.bool else torch.int64
    wide = values.to(torch.complex128 if dtype.is_complex else torch.float64 if dtype.is_floating_point else kind)
    return wide * (1 + 1j) if dtype.is_complex else wide


def every_dtype(comm: Communicator) -> list[str]:
    """Every op on every dtype the library moves, against a reference reduced in a wide dtype."""
    wrong = []
    for dtype in WIRE_DTYPES:
        for op in REDUCE_OPS:
            try:
                check_op_dtype(op, dtype)
            except TypeError:
                continue
            if op == "mean" and not (dtype.is_floating_point or dtype.is_complex):
                continue  # an integer mean is exact or refused: the catalogue checks it
            got = comm.all_reduce(_inputs(op, comm.rank, dtype).to(dtype), op=op)
            reference = _inputs(op, 0, dtype)
            for rank in range(1, comm.world_size):
                reference = COMBINE[op](reference, _inputs(op, rank, dtype))
            want = (reference / comm.world_size if op == "mean" else reference).to(dtype)
            if got.dtype != dtype or not torch.equal(got.to(want.dtype).view(-1), want.view(-1)):
                wrong.append(f"all_reduce(op={op!r}) of {dtype}: got {got.tolist()}, expected {want.tolist()}")
    return wrong


def _members(world: int) -> list[int]:
    """Reversed ranks, rank 0 left out from three ranks on: the subgroup's ranks differ from the parent's."""
    return list(range(world - 1, 0 if world >= 3 else -1, -1))


def in_subgroup(comm: Communicator, sizes: Sequence[str]) -> list[str]:
    """The catalogue on a subgroup, after messages of the parent and of the subgroup on one tag
    crossed (each must reach its own communicator)."""
    members = _members(comm.world_size)
    group = comm.new_group(members)
    if comm.rank not in members:
        return []
    wrong = []
    if group.world_size > 1:
        right, left = (group.rank + 1) % group.world_size, (group.rank - 1) % group.world_size
        parent_right, parent_left = members[right], members[left]
        mine = [torch.full((2,), float(comm.rank)), torch.full((2,), -float(comm.rank))]
        received = [torch.zeros(2), torch.zeros(2)]
        handles = [comm.irecv(received[0], parent_left, tag=5), group.irecv(received[1], left, tag=5)]
        group.isend(mine[1], right, tag=5).wait()
        comm.isend(mine[0], parent_right, tag=5).wait()
        for handle in handles:
            handle.wait()
        if [r.tolist() for r in received] != [[float(parent_left)] * 2, [-float(parent_left)] * 2]:
            wrong.append(f"messages of the parent and the subgroup on one tag mixed: {received}")
    return wrong + catalogue(group, sizes)


def bounded_wait(comm: Communicator) -> str:
    """Rank 0 waits for a message that never comes; it must time out, not hang. With a control
    plane the others stay until rank 0 gives up (it posts its failure), in a barrier through the
    store, so none of them closing or failing could explain rank 0's error instead."""
    if comm.rank == 0:
        try:
            comm.irecv(torch.zeros(1), src=1, tag=7).wait(timeout=_SHORT)
        except CommTimeoutError:
            return "timed out"
        return "returned"
    if comm._plane() is not None:  # through the store: a transport may fail a transfer whose wait ran out
        try:
            comm.barrier(timeout=comm.config.timeout)
        except CommError:
            return "released"
    return "silent"


def failure_released(comm: Communicator) -> str:
    """The last rank raises inside ``fail_together`` while the others wait in a collective."""
    if comm._plane() is None:
        return "no control plane"
    last = comm.world_size - 1
    try:
        with comm.fail_together("conformance"):
            if comm.rank == last:
                raise ValueError("conformance failure")
            comm.all_reduce(torch.ones(1))
    except RemoteError as error:
        return "released" if last in error.ranks else f"RemoteError naming {error.ranks}"
    return "not released"


def closed_peer(comm: Communicator) -> str:
    """The last rank closes; rank 0, waiting for a message from it, must be released."""
    if comm._plane() is None:
        return "no control plane"
    if comm.rank == comm.world_size - 1:
        comm.close()
        return "closed"
    if comm.rank != 0:
        return "bystander"
    try:
        comm.recv(torch.zeros(1), src=comm.world_size - 1)
    except CommError as error:
        return "released" if not isinstance(error, CommTimeoutError) else f"timed out: {error}"
    return "received"


def check_communicator(
    run: Runner, world_sizes: Sequence[int] = (1, 2, 3, 4), sizes: Sequence[str] = ("small",)
) -> None:
    """Run the conformance suite (see the module docstring) through ``run`` on each world size.

    ``sizes`` are the catalogue's (``small``, ``medium``, ``large``). Raises ``AssertionError``
    naming what failed.
    """
    for world in world_sizes:
        for name, fn, args in (
            ("catalogue", catalogue, (tuple(sizes),)),
            ("every dtype", every_dtype, ()),
            ("subgroup", in_subgroup, (tuple(sizes),)),
        ):
            for rank, wrong in enumerate(run(fn, world, *args)):
                assert not wrong, f"world of {world}, {name}, rank {rank}: " + "; ".join(wrong)
        if world < 2:
            continue
        assert run(bounded_wait, world)[0] == "timed out", f"world of {world}: a wait past its timeout did not raise"
        failed = run(failure_released, world)
        if failed[0] != "no control plane":
            assert failed == ["released"] * world, f"world of {world}, fail_together: {failed}"
            closed = run(closed_peer, world)
            assert closed[0] == "released", f"world of {world}, a closed peer: {closed}"
