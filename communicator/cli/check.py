"""``communicator check``: run every collective once across the ranks of a job and verify each result.

    srun -n 8 communicator check
    mpirun -np 4 python -m communicator check
    torchrun --nproc-per-node 4 -m communicator check
    python -m communicator check --local 4        # starts 4 local gloo ranks itself
    python -m communicator check                  # no launcher: one process (NonDistComm)

Every rank runs each check of :data:`CHECKS` on each size. A check calls the communicator, then
compares what it got with what it must get, computed locally from the rank numbers alone. Each
rank records pass/fail and the time of every (op, size); rank 0 gathers every rank's records and
prints one row per (op, size): ``pass`` when every rank passed, ``FAIL`` (with the first error)
when any rank failed, ``skip`` when the op does not apply (point-to-point in a world of one).
Every rank exits with the same status: 0 when nothing failed anywhere, 1 otherwise.

A failing check does not stop the others. If the communicator itself breaks (another rank failed,
a peer was lost, an op timed out), the run stops: each rank says where it stopped (rank 0 also
prints its table so far) and leaves its ``with`` block with :class:`Aborted`, which releases the
other ranks promptly; every rank exits with status 1.

Other code can run its own table of checks::

    from communicator.cli.check import Check, Mismatch, check_job

    def my_check(comm, n):
        got = comm.all_gather_object(comm.rank)
        if got != list(range(comm.world_size)):
            raise Mismatch(f"got {got}")

    status = check_job(comm, [Check("my op", my_check, sized=False)])
"""

from __future__ import annotations

import argparse
import functools
import itertools
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from communicator.base import Communicator
from communicator.config import CommConfig
from communicator.equality import same_value
from communicator.errors import CommError, CommTimeoutError, ConfigError, NotMemberError, PeerLostError, RemoteError
from communicator.ops import REDUCE_OPS

__all__ = [
    "CHECKS",
    "DEFAULT_SIZES",
    "SIZES",
    "Aborted",
    "Check",
    "Mismatch",
    "Outcome",
    "Skip",
    "add_arguments",
    "check_job",
    "render",
    "run",
    "run_checks",
    "run_local",
]

#: Elements per tensor for each size. Objects carry as many array items, so ``small`` objects
#: travel inline with the size exchange and ``medium`` ones in a second exchange; ``medium``
#: tensors are large enough for the point-to-point paths of the gathers.
SIZES: dict[str, int] = {"small": 8, "medium": 100_000, "large": 4_000_000}
DEFAULT_SIZES: tuple[str, ...] = ("small", "medium")
#: The errors after which the communicator cannot be trusted: the run stops.
FATAL: tuple[type[BaseException], ...] = (RemoteError, PeerLostError, CommTimeoutError)

CheckFn = Callable[[Communicator, int], None]


class Check(NamedTuple):
    """One row of the table: ``run(comm, n)`` raises when the op misbehaves.

    ``n`` is the number of elements of the size being checked; an unsized check (``sized=False``)
    runs once, shown with size ``-``.
    """

    name: str
    run: CheckFn
    sized: bool = True


class Outcome(NamedTuple):
    """What one rank saw for one (op, size): ``status`` is pass, FAIL, skip or not run."""

    op: str
    size: str
    status: str
    seconds: float
    error: str = ""


class Mismatch(Exception):
    """A result differs from the value it must have."""


class Skip(Exception):
    """The op does not apply to this communicator (e.g. point-to-point in a world of one)."""


class Aborted(Exception):
    """The communicator broke during a check: ``outcomes`` ran before, ``error`` is what broke it."""

    def __init__(self, outcomes: Sequence[Outcome], error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.outcomes = list(outcomes)
        self.error = error


# -- the values every rank must see, computed from rank numbers alone ---------------------------


def _ramp(rank: int, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Small whole numbers (exact in float32 sums), different on every rank."""
    return (torch.arange(n, dtype=torch.float64) % 251 + 1000 * rank).to(dtype)


def _ints(rank: int, n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.int64) * 7 + rank).to(dtype)


def _factors(rank: int, n: int) -> torch.Tensor:
    """Ones and twos: any product over ranks is a power of two, exact in float32."""
    return 1 + ((torch.arange(n) + rank) % 2).to(torch.float32)


def _bits(rank: int, n: int) -> torch.Tensor:
    """Low bits shared by every rank, one high bit per rank."""
    return (torch.arange(n, dtype=torch.int64) % 4) | (1 << (2 + rank % 60))


_REDUCE_INPUT: dict[str, Callable[[int, int], torch.Tensor]] = {
    "sum": _ramp,
    "mean": _ramp,
    "product": _factors,
    "min": _ramp,
    "max": _ramp,
    "band": _bits,
    "bor": _bits,
    "bxor": _bits,
}
_COMBINE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add,
    "mean": torch.add,
    "product": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}


def _reduced(op: str, values: Callable[[int], torch.Tensor], world: int) -> torch.Tensor:
    """``op`` applied across ``values(0) ... values(world - 1)``."""
    total = functools.reduce(_COMBINE[op], (values(r) for r in range(world)))
    return total / world if op == "mean" else total


def _payload(rank: int, n: int) -> dict[str, Any]:
    """An object with plain values, None, a NumPy array and a tensor."""
    return {
        "rank": rank,
        "name": f"rank-{rank}",
        "none": None,
        "pair": (rank, -rank),
        "array": np.arange(n, dtype=np.int64) + rank,
        "tensor": _ramp(rank, n),
    }


def _item(index: int, width: int) -> dict[str, Any] | None:
    """Result ``index`` of a data set; every fifth one is a real ``None``."""
    return None if index % 5 == 3 else {"index": index, "values": np.full(width, index, dtype=np.int32)}


# -- comparisons ------------------------------------------------------------------------------------


def _short(value: object, limit: int = 80) -> str:
    text = repr(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise Mismatch(message)


def _expect_tensor(got: object, want: torch.Tensor, what: str) -> None:
    if not isinstance(got, torch.Tensor):
        raise Mismatch(f"{what}: got {type(got).__name__}, expected a tensor")
    if got.dtype != want.dtype or got.shape != want.shape:
        raise Mismatch(f"{what}: got {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}")
    close = torch.isclose(got, want, rtol=1e-5, atol=1e-6) if want.is_floating_point() else got == want
    if not bool(close.all()):
        index = int((~close).flatten().nonzero()[0, 0])
        raise Mismatch(
            f"{what}: element {index} is {got.flatten()[index].item()}, expected {want.flatten()[index].item()}"
        )


def _expect_tensors(got: object, want: Sequence[torch.Tensor], what: str) -> None:
    if not isinstance(got, list) or len(got) != len(want):
        raise Mismatch(f"{what}: got {_short(got)}, expected a list of {len(want)} tensors")
    for index, (mine, theirs) in enumerate(zip(got, want, strict=True)):
        _expect_tensor(mine, theirs, f"{what}[{index}]")


def _expect_same(got: object, want: object, what: str) -> None:
    _expect(same_value(got, want), f"{what}: got {_short(got)}, expected {_short(want)}")


# -- the checks: communicate, then compare with the expected value ------------------------------------


def _last(comm: Communicator) -> int:
    """The highest rank: a source or destination other than 0 wherever there is one."""
    return comm.world_size - 1


def _ring(comm: Communicator) -> tuple[int, int]:
    """(right, left) neighbours; a world of one has none."""
    if comm.world_size < 2:
        raise Skip("a world of one has no peer")
    return (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size


def _barrier(comm: Communicator, n: int) -> None:
    comm.barrier()


def _barrier_timeout(comm: Communicator, n: int) -> None:
    comm.barrier(timeout=comm.config.timeout.total_seconds())


def _all_reduce(op: str, comm: Communicator, n: int) -> None:
    def values(rank: int) -> torch.Tensor:
        return _REDUCE_INPUT[op](rank, n)

    tensor = values(comm.rank)
    returned = comm.all_reduce(tensor, op=op)
    _expect(returned is tensor, "all_reduce did not return its (in-place) tensor")
    _expect_tensor(tensor, _reduced(op, values, comm.world_size), f"all_reduce(op={op!r})")


def _all_reduce_async(comm: Communicator, n: int) -> None:
    tensor = _ramp(comm.rank, n)
    handle = comm.all_reduce(tensor, async_op=True)
    _expect_tensor(handle.wait(), _reduced("sum", functools.partial(_ramp, n=n), comm.world_size), "all_reduce.wait()")


def _all_reduce_inference(comm: Communicator, n: int) -> None:
    with torch.inference_mode():
        tensor = _ramp(comm.rank, n)
        comm.all_reduce(tensor, op="max")
    _expect_tensor(tensor, _ramp(_last(comm), n), "all_reduce(op='max') of an inference tensor")


def _integer_mean(comm: Communicator, n: int) -> None:
    counters = torch.full((2,), 7, dtype=torch.int64)  # identical on every rank: the mean is exact
    comm.all_reduce(counters, op="mean")
    _expect_tensor(counters, torch.full((2,), 7, dtype=torch.int64), "all_reduce(op='mean') of equal int64 counters")
    if comm.world_size == 1:
        return
    uneven = torch.tensor([1 if comm.rank == 0 else 0], dtype=torch.int64)  # a sum of 1 never divides
    try:
        comm.all_reduce(uneven, op="mean")
    except ValueError:
        _expect_tensor(uneven, torch.tensor([1 if comm.rank == 0 else 0]), "a refused integer mean's tensor")
        return
    raise Mismatch(f"all_reduce(op='mean') of int64 values summing to 1 gave {uneven.tolist()}: it must refuse")


def _broadcast(comm: Communicator, n: int) -> None:
    src = _last(comm)
    tensor = _ramp(src, n, torch.float64) if comm.rank == src else torch.zeros(n, dtype=torch.float64)
    comm.broadcast(tensor, src=src)
    _expect_tensor(tensor, _ramp(src, n, torch.float64), f"broadcast(src={src})")


def _reduce(comm: Communicator, n: int) -> None:
    dst = _last(comm)
    tensor = _ramp(comm.rank, n)
    comm.reduce(tensor, dst=dst, op="sum")
    if comm.rank == dst:
        _expect_tensor(tensor, _reduced("sum", functools.partial(_ramp, n=n), comm.world_size), f"reduce(dst={dst})")
    else:
        _expect_tensor(tensor, _ramp(comm.rank, n), f"reduce(dst={dst}) on a non-destination rank (must be unchanged)")


def _all_gather(comm: Communicator, n: int) -> None:
    got = comm.all_gather(_ints(comm.rank, n))
    _expect_tensors(got, [_ints(r, n) for r in range(comm.world_size)], "all_gather")


def _all_gather_uneven(comm: Communicator, n: int) -> None:
    got = comm.all_gather(_ramp(comm.rank, n + comm.rank))
    _expect_tensors(got, [_ramp(r, n + r) for r in range(comm.world_size)], "all_gather (uneven shapes)")


def _all_gather_async(comm: Communicator, n: int) -> None:
    handle = comm.all_gather(_ramp(comm.rank, n + comm.rank), async_op=True)
    _expect_tensors(handle.wait(), [_ramp(r, n + r) for r in range(comm.world_size)], "all_gather(async_op=True)")


def _gather(comm: Communicator, n: int) -> None:
    dst = _last(comm)
    got = comm.gather(_ramp(comm.rank, n + comm.rank), dst=dst)
    if comm.rank == dst:
        _expect_tensors(got, [_ramp(r, n + r) for r in range(comm.world_size)], f"gather(dst={dst}, uneven shapes)")
    else:
        _expect(got is None, f"gather(dst={dst}) returned {_short(got)} on a non-destination rank, expected None")


def _scatter(comm: Communicator, n: int) -> None:
    parts = [_ints(r, n + r, torch.int32) for r in range(comm.world_size)] if comm.rank == 0 else None
    got = comm.scatter(parts, src=0)
    _expect_tensor(got, _ints(comm.rank, n + comm.rank, torch.int32), "scatter(src=0, uneven shapes)")


def _reduce_scatter(comm: Communicator, n: int) -> None:
    def part(sender: int, receiver: int) -> torch.Tensor:
        return _ramp(sender, n) + 10 * receiver

    got = comm.reduce_scatter([part(comm.rank, r) for r in range(comm.world_size)], op="sum")
    want = _reduced("sum", lambda sender: part(sender, comm.rank), comm.world_size)
    _expect_tensor(got, want, "reduce_scatter(op='sum')")


def _all_to_all(comm: Communicator, n: int) -> None:
    world = comm.world_size

    def part(sender: int, receiver: int) -> torch.Tensor:
        return _ints(sender * world + receiver, n + receiver)

    got = comm.all_to_all([part(comm.rank, r) for r in range(world)])
    _expect_tensors(got, [part(r, comm.rank) for r in range(world)], "all_to_all")


def _send_recv(comm: Communicator, n: int) -> None:
    right, left = _ring(comm)
    received = torch.zeros(n)
    if comm.rank % 2 == 0:  # half the ring sends first, so blocking calls cannot all wait on each other
        comm.send(_ramp(comm.rank, n), dst=right)
        got = comm.recv(received, src=left)
    else:
        got = comm.recv(received, src=left)
        comm.send(_ramp(comm.rank, n), dst=right)
    _expect(got is received, "recv did not return its (in-place) tensor")
    _expect_tensor(received, _ramp(left, n), f"recv(src={left})")


#: How late a rank arrives in the late-peer checks: far below any timeout, far above a scheduling hiccup.
LATE_SECONDS = 0.2


def _all_reduce_late_rank(comm: Communicator, n: int) -> None:
    if comm.rank == _last(comm):
        time.sleep(LATE_SECONDS)
    tensor = comm.all_reduce(_ramp(comm.rank, 4))
    _expect_tensor(
        tensor, _reduced("sum", functools.partial(_ramp, n=4), comm.world_size), "all_reduce (one rank late)"
    )


def _send_recv_late_sender(comm: Communicator, n: int) -> None:
    right, left = _ring(comm)
    received = torch.zeros(4)
    if comm.rank % 2 == 0:  # the even ranks send late; the odd ones wait for them in recv
        time.sleep(LATE_SECONDS)
        comm.send(_ramp(comm.rank, 4), dst=right)
        comm.recv(received, src=left)
    else:
        comm.recv(received, src=left)
        comm.send(_ramp(comm.rank, 4), dst=right)
    _expect_tensor(received, _ramp(left, 4), f"recv(src={left}) from a sender {LATE_SECONDS:g} s late")


def _isend_irecv(comm: Communicator, n: int) -> None:
    right, left = _ring(comm)
    received = torch.zeros(n)
    receiving = comm.irecv(received, src=left)
    sending = comm.isend(_ramp(comm.rank, n), dst=right)
    sending.wait()
    _expect_tensor(receiving.wait(), _ramp(left, n), f"irecv(src={left}).wait()")


def _all_gather_object(comm: Communicator, n: int) -> None:
    got = comm.all_gather_object(_payload(comm.rank, n))
    _expect_same(got, [_payload(r, n) for r in range(comm.world_size)], "all_gather_object")


def _gather_object(comm: Communicator, n: int) -> None:
    dst = _last(comm)
    got = comm.gather_object(_payload(comm.rank, n), dst=dst)
    want = [_payload(r, n) for r in range(comm.world_size)] if comm.rank == dst else None
    _expect_same(got, want, f"gather_object(dst={dst})")


def _broadcast_object(comm: Communicator, n: int) -> None:
    src = _last(comm)
    got = comm.broadcast_object(_payload(src, n) if comm.rank == src else None, src=src)
    _expect_same(got, _payload(src, n), f"broadcast_object(src={src})")


def _broadcast_object_list(comm: Communicator, n: int) -> None:
    def sent() -> list[Any]:
        return [_payload(0, n), "text", None]

    objects = sent() if comm.rank == 0 else [None, None, None]
    returned = comm.broadcast_object_list(objects, src=0)
    _expect(returned is objects, "broadcast_object_list did not return its (in-place) list")
    _expect_same(objects, sent(), "broadcast_object_list(src=0)")


def _scatter_object(comm: Communicator, n: int) -> None:
    parts = [_payload(r, n) for r in range(comm.world_size)] if comm.rank == 0 else None
    _expect_same(comm.scatter_object(parts, src=0), _payload(comm.rank, n), "scatter_object(src=0)")


def _send_recv_object(comm: Communicator, n: int) -> None:
    right, left = _ring(comm)
    if comm.rank % 2 == 0:
        comm.send_object(_payload(comm.rank, n), dst=right)
        got = comm.recv_object(src=left)
    else:
        got = comm.recv_object(src=left)
        comm.send_object(_payload(comm.rank, n), dst=right)
    _expect_same(got, _payload(left, n), f"recv_object(src={left})")


def _metrics(rank: int, n: int) -> dict[str, Any]:
    return {
        "loss": torch.tensor(float(rank)),
        "hits": torch.tensor(rank, dtype=torch.int64),
        "count": rank + 1,
        "score": 0.5 * rank,
        "nested": {"vector": _ramp(rank, n), "ints": _ints(rank, n)},
    }


def _all_reduce_dict(op: str, comm: Communicator, n: int) -> None:
    world = comm.world_size
    got = comm.all_reduce_dict(_metrics(comm.rank, n), op=op)
    ranks = sum(range(world))
    mean = op == "mean"
    # An integer mean is a float64 (never truncated); every other value keeps its dtype.
    want: dict[str, Any] = {
        "loss": torch.tensor(ranks / world if mean else float(ranks)),
        "hits": torch.tensor(ranks / world, dtype=torch.float64) if mean else torch.tensor(ranks),
        "count": (ranks + world) / world if mean else ranks + world,
        "score": 0.5 * ranks / world if mean else 0.5 * ranks,
        "nested": {
            "vector": _reduced(op, functools.partial(_ramp, n=n), world),
            "ints": (_reduced("sum", functools.partial(_ints, n=n), world).double() / world)
            if mean
            else _reduced("sum", functools.partial(_ints, n=n), world),
        },
    }
    _expect(isinstance(got, dict) and got.keys() == want.keys(), f"all_reduce_dict: got keys {_short(list(got))}")
    for key in ("loss", "hits"):
        _expect_tensor(got[key], want[key], f"all_reduce_dict(op={op!r})[{key!r}]")
    for key in ("count", "score"):
        _expect(
            type(got[key]) is type(want[key]) and abs(got[key] - want[key]) <= 1e-9 * max(1.0, abs(want[key])),
            f"all_reduce_dict(op={op!r})[{key!r}]: got {got[key]!r}, expected {want[key]!r}",
        )
    for key in ("vector", "ints"):
        _expect_tensor(got["nested"][key], want["nested"][key], f"all_reduce_dict(op={op!r})['nested'][{key!r}]")


def _all_reduce_dict_numpy(comm: Communicator, n: int) -> None:
    world, ranks = comm.world_size, sum(range(comm.world_size))

    def values(total: float, count: Any) -> dict[str, Any]:
        return {"score": np.float32(0.5 * total), "hits": count, "array": np.arange(3.0) * total}

    mine = values(comm.rank, np.int64(comm.rank))
    # NumPy values come back as NumPy values of the same kind; an integer mean as a float64.
    expected = {"sum": values(ranks, np.int64(ranks)), "mean": values(ranks / world, np.float64(ranks / world))}
    for op, want in expected.items():
        got = comm.all_reduce_dict(mine, op=op)
        for key, value in want.items():
            mine_value: Any = got.get(key)
            same = (
                type(mine_value) is type(value)
                and np.shape(mine_value) == np.shape(value)
                and bool(np.allclose(mine_value, value, rtol=1e-6))
            )
            _expect(same, f"all_reduce_dict(op={op!r})[{key!r}]: got {mine_value!r}, expected {value!r}")


def _collect_interleaved(comm: Communicator, n: int) -> None:
    world, per_rank = comm.world_size, 8 if n < 1000 else 50
    width = max(1, n // per_rank)
    size = world * per_rank - (world - 1) // 2  # DistributedSampler pads by repeating the first items
    padded = [i % size for i in range(world * per_rank)]
    part = [_item(i, width) for i in padded[comm.rank :: world]]
    got = comm.collect_results(part, size=size)
    want = [_item(i, width) for i in range(size)] if comm.rank == 0 else None
    _expect_same(got, want, f"collect_results(size={size}) on rank {comm.rank}")


def _collect_contiguous(comm: Communicator, n: int) -> None:
    world, per_rank = comm.world_size, 8 if n < 1000 else 50
    width = max(1, n // per_rank)
    size = world * per_rank - (world - 1) // 2  # the last rank's tail is padding, dropped by size
    part = [_item(i, width) for i in range(comm.rank * per_rank, (comm.rank + 1) * per_rank)]
    dst = _last(comm)
    got = comm.collect_results(part, size=size, dst=dst, order="contiguous")
    want = [_item(i, width) for i in range(size)] if comm.rank == dst else None
    _expect_same(got, want, f"collect_results(size={size}, dst={dst}, order='contiguous') on rank {comm.rank}")


def _rng_states() -> tuple[Any, ...]:
    return random.getstate(), np.random.get_state(legacy=True), torch.get_rng_state()


def _sync_random_seed(comm: Communicator, n: int) -> None:
    before = _rng_states()
    drawn = comm.sync_random_seed()
    given = comm.sync_random_seed(1234 + comm.rank)  # rank 0's seed wins
    after = _rng_states()
    seeds = comm.all_gather_object(drawn)
    _expect(len(set(seeds)) == 1, f"sync_random_seed() gave different seeds on different ranks: {seeds}")
    _expect(given == 1234, f"sync_random_seed(1234 + rank) gave {given}, expected rank 0's 1234")
    same = before[0] == after[0] and same_value(list(after[1]), list(before[1])) and torch.equal(before[2], after[2])
    _expect(same, "sync_random_seed changed the global Python, NumPy or torch RNG state")


def _expect_group(group: Communicator, members: Sequence[int], comm: Communicator, n: int, what: str) -> None:
    """``group`` holds ``members`` (ranks of ``comm``) in that order; its collectives work."""
    _expect(
        (group.rank, group.world_size) == (members.index(comm.rank), len(members)),
        f"{what}: rank {group.rank} of {group.world_size}, expected {members.index(comm.rank)} of {len(members)}",
    )
    world_ranks = [comm.to_global(member) for member in members]
    _expect(
        list(group.global_ranks) == world_ranks and group.to_local(comm.to_global(comm.rank)) == group.rank,
        f"{what}: global_ranks {list(group.global_ranks)}, expected {world_ranks}",
    )
    _expect_same(group.all_gather_object(comm.rank), list(members), f"{what}.all_gather_object(parent rank)")
    total = group.all_reduce(torch.full((n,), float(comm.rank)))
    _expect_tensor(total, torch.full((n,), float(sum(members))), f"{what}.all_reduce")
    _expect_same(group.broadcast_object(comm.rank if group.rank == 0 else None), members[0], f"{what}.broadcast_object")


def _split(comm: Communicator, n: int) -> None:
    color = comm.rank % 2
    group = comm.split(color=color)
    _expect_group(group, [r for r in range(comm.world_size) if r % 2 == color], comm, n, "split(color=rank % 2)")


def _split_key(comm: Communicator, n: int) -> None:
    group = comm.split(color=0, key=-comm.rank)  # ordered by key: reversed
    _expect_group(group, list(reversed(range(comm.world_size))), comm, n, "split(color=0, key=-rank)")


def _new_group(comm: Communicator, n: int) -> None:
    members = [_last(comm), 0] if comm.world_size > 1 else [0]
    group = comm.new_group(members)
    if comm.rank in members:
        _expect_group(group, members, comm, n, f"new_group({members})")
        return
    try:
        group.barrier()
    except NotMemberError:
        return
    raise Mismatch(f"new_group({members}): a collective on rank {comm.rank} (no member) did not raise NotMemberError")


def _local_comm(comm: Communicator, n: int) -> None:
    local = comm.local_comm
    _expect(
        (local.rank, local.world_size) == (comm.local_rank, comm.local_size),
        f"local_comm: rank {local.rank} of {local.world_size}, "
        f"expected the local rank {comm.local_rank} of {comm.local_size}",
    )
    nodes = local.all_gather_object(comm.node_rank)
    _expect(nodes == [comm.node_rank] * local.world_size, f"local_comm holds ranks of nodes {nodes}")


#: Every op the communicator offers, in the order they run. ``sized=False`` runs once.
CHECKS: tuple[Check, ...] = (
    Check("barrier", _barrier, sized=False),
    Check("barrier(timeout)", _barrier_timeout, sized=False),
    *(Check(f"all_reduce[{op}]", functools.partial(_all_reduce, op)) for op in REDUCE_OPS),
    Check("all_reduce(async_op)", _all_reduce_async),
    Check("all_reduce[inference_mode]", _all_reduce_inference),
    Check("all_reduce[int mean exact]", _integer_mean, sized=False),
    Check("all_reduce[late rank]", _all_reduce_late_rank, sized=False),
    Check("broadcast", _broadcast),
    Check("reduce", _reduce),
    Check("all_gather", _all_gather),
    Check("all_gather[uneven]", _all_gather_uneven),
    Check("all_gather(async_op)", _all_gather_async),
    Check("gather[uneven]", _gather),
    Check("scatter[uneven]", _scatter),
    Check("reduce_scatter", _reduce_scatter),
    Check("all_to_all", _all_to_all),
    Check("send/recv", _send_recv),
    Check("isend/irecv", _isend_irecv),
    Check("send/recv[late sender]", _send_recv_late_sender, sized=False),
    Check("all_gather_object", _all_gather_object),
    Check("gather_object", _gather_object),
    Check("broadcast_object", _broadcast_object),
    Check("broadcast_object_list", _broadcast_object_list),
    Check("scatter_object", _scatter_object),
    Check("send_object/recv_object", _send_recv_object),
    Check("all_reduce_dict[sum]", functools.partial(_all_reduce_dict, "sum")),
    Check("all_reduce_dict[mean]", functools.partial(_all_reduce_dict, "mean")),
    Check("all_reduce_dict[numpy]", _all_reduce_dict_numpy, sized=False),
    Check("collect_results[interleave]", _collect_interleaved),
    Check("collect_results[contiguous]", _collect_contiguous),
    Check("sync_random_seed", _sync_random_seed, sized=False),
    Check("split", _split),
    Check("split[key]", _split_key),
    Check("new_group", _new_group),
    Check("local_comm", _local_comm, sized=False),
)


# -- running and reporting --------------------------------------------------------------------------


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def run_checks(
    comm: Communicator, checks: Sequence[Check] = CHECKS, sizes: Sequence[str] = DEFAULT_SIZES
) -> list[Outcome]:
    """Run every check on every size on this rank (every rank calls it); this rank's outcomes.

    A check that raises is a ``FAIL`` and the next one runs. After each check the ranks meet at a
    barrier bounded by the communicator's timeout, so a check that left a rank behind cannot
    pair one rank's next collective with another's previous one.

    Raises:
        Aborted: the communicator broke: a check raised ``RemoteError``, ``PeerLostError`` or
            ``CommTimeoutError``, or the barrier after a check failed.
    """
    unknown = [size for size in sizes if size not in SIZES]
    if unknown:
        raise ConfigError(f"unknown sizes {unknown}: expected some of {', '.join(SIZES)}")
    limit = comm.config.timeout.total_seconds()
    outcomes: list[Outcome] = []
    for check in checks:
        for size in sizes if check.sized else ("-",):
            start = time.perf_counter()
            status, message = "pass", ""
            try:
                check.run(comm, SIZES[size] if check.sized else 0)
            except Skip as skip:
                status, message = "skip", str(skip)
            except FATAL as error:
                outcomes.append(Outcome(check.name, size, "FAIL", time.perf_counter() - start, _first_line(error)))
                raise Aborted(outcomes, error) from error
            except Exception as error:  # noqa: BLE001 - one failing op must not stop the others
                status, message = "FAIL", _first_line(error)
            outcomes.append(Outcome(check.name, size, status, time.perf_counter() - start, message))
            try:
                comm.barrier(timeout=limit)
            except Exception as error:  # ranks that cannot meet cannot go on
                raise Aborted(outcomes, error) from error
    return outcomes


def _ranks_text(ranks: Sequence[int], world: int) -> str:
    if len(ranks) == world:
        return "every rank"
    return ("ranks " if len(ranks) > 1 else "rank ") + ", ".join(map(str, ranks))


def _merge(per_rank: Mapping[int, Sequence[Outcome]], world: int) -> list[tuple[str, str, str, float, str]]:
    """One row per (op, size): FAIL if any rank failed, skip if every rank skipped, the slowest time."""
    ranks = list(per_rank)
    rows = []
    for column in itertools.zip_longest(*per_rank.values()):
        ran = [(rank, outcome) for rank, outcome in zip(ranks, column, strict=True) if outcome is not None]
        first = ran[0][1]
        failed = [(rank, o.error) for rank, o in ran if o.status == "FAIL"]
        if failed:
            status = "FAIL"
            same = [rank for rank, error in failed if error == failed[0][1]]
            others = len(failed) - len(same)
            error = f"{_ranks_text(same, world)}: {failed[0][1]}" + (
                f" (and {others} other rank(s) with other errors)" if others else ""
            )
        elif len(ran) < len(ranks):
            missing = [rank for rank, outcome in zip(ranks, column, strict=True) if outcome is None]
            status, error = "not run", f"{_ranks_text(missing, world)} did not run it"
        elif all(o.status == "skip" for _, o in ran):
            status, error = "skip", first.error
        else:
            status, error = "pass", ""
        rows.append((first.op, first.size, status, max(o.seconds for _, o in ran), error))
    return rows


def render(
    comm: Communicator, per_rank: Mapping[int, Sequence[Outcome]], sizes: Sequence[str], seconds: float
) -> tuple[list[str], int]:
    """The report rank 0 prints and the exit status (1 when any rank failed or missed a check, else 0).

    ``per_rank`` maps ranks to their outcomes: every rank's after a run, only this rank's after
    the run stopped. The report is a header from ``describe()``, one row per op and size, a summary.
    """
    rows = _merge(per_rank, comm.world_size)
    width = max([len("op"), *(len(row[0]) for row in rows)])
    size_names = ", ".join(f"{size} ({SIZES[size]} elements)" for size in sizes)
    whose = "" if len(per_rank) == comm.world_size else f" (as seen by {_ranks_text(list(per_rank), comm.world_size)})"
    lines = [
        f"communicator check: {comm.world_size} rank(s), sizes {size_names}",
        *comm.describe().splitlines(),
        "",
        f"{'op':<{width}}  {'size':<6}  {'result':<7}  {'ms':>9}  error",
    ]
    for op, size, result, elapsed, error in rows:
        lines.append(f"{op:<{width}}  {size:<6}  {result:<7}  {elapsed * 1000:9.2f}  {error}".rstrip())
    counts = {status: sum(row[2] == status for row in rows) for status in ("pass", "FAIL", "skip", "not run")}
    lines.append("")
    lines.append(
        f"{counts['pass']} passed, {counts['FAIL']} failed, {counts['skip']} skipped"
        + (f", {counts['not run']} not run" if counts["not run"] else "")
        + f" on {comm.world_size} rank(s){whose} in {seconds:.2f} s (ms: the slowest rank)"
    )
    status = 1 if counts["FAIL"] or counts["not run"] else 0
    lines.append("check passed" if status == 0 else "check FAILED")
    return lines, status


def _emit(line: str) -> None:
    print(line, flush=True)


def check_job(
    comm: Communicator,
    checks: Sequence[Check] = CHECKS,
    sizes: Sequence[str] = DEFAULT_SIZES,
    emit: Callable[[str], None] = _emit,
) -> int:
    """Run the checks on every rank, ``emit`` the report on rank 0; the exit status, the same on every rank.

    Raises:
        Aborted: the communicator broke (its ``error`` says how), after this rank ``emit``-ted
            where it stopped (rank 0: its table so far). Leaving the ``with`` block with it
            releases the other ranks.
    """
    start = time.perf_counter()
    try:
        outcomes = run_checks(comm, checks, sizes)
    except Aborted as aborted:
        if comm.rank == 0:
            lines, _ = render(comm, {0: aborted.outcomes}, sizes, time.perf_counter() - start)
            for line in lines[:-1]:
                emit(line)
        last = aborted.outcomes[-1] if aborted.outcomes else None
        where = "" if last is None else f" {'at' if last.status == 'FAIL' else 'after'} {last.op} ({last.size})"
        emit(f"check STOPPED on rank {comm.rank}{where}: the communicator broke: {aborted}")
        raise
    records = [tuple(outcome) for outcome in outcomes]  # plain tuples: any serializer carries them
    everyone = comm.gather_object(records, dst=0)
    status = 0
    if everyone is not None:
        per_rank = {rank: [Outcome._make(record) for record in records] for rank, records in enumerate(everyone)}
        lines, status = render(comm, per_rank, sizes, time.perf_counter() - start)
        for line in lines:
            emit(line)
    agreed: int = comm.broadcast_object(status, src=0)
    return agreed


# -- command line -----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes",
        default=",".join(DEFAULT_SIZES),
        help=f"comma-separated sizes to check, of {', '.join(f'{k}={v}' for k, v in SIZES.items())} "
        "elements (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds any one op may take: the communicator's timeout (default: %(default)s)",
    )
    parser.add_argument(
        "--local",
        type=int,
        default=None,
        metavar="N",
        help="start N local gloo ranks instead of joining a launcher's job",
    )
    parser.add_argument(
        "--ops", default=None, help="comma-separated parts of op names: check only the ops whose name contains one"
    )


def _select(ops: str | None) -> list[Check]:
    if ops is None:
        return list(CHECKS)
    wanted = [part.strip() for part in ops.split(",") if part.strip()]
    chosen = [check for check in CHECKS if any(part in check.name for part in wanted)]
    if not chosen:
        raise ConfigError(f"--ops {ops!r} matches no op; the ops are: {', '.join(c.name for c in CHECKS)}")
    return chosen


class _Stopped(Exception):
    """A local rank's report after the run stopped; it reaches the parent as the error message."""


def _local_rank_job(comm: Communicator, checks: Sequence[Check], sizes: Sequence[str]) -> tuple[int, list[str]]:
    lines: list[str] = []
    try:
        status = check_job(comm, checks, sizes, emit=lines.append)
    except Aborted as aborted:
        raise _Stopped("\n".join(lines)) from aborted  # leaving the block with it releases the other ranks
    return status, lines


def run_local(
    nproc: int, checks: Sequence[Check] = CHECKS, sizes: Sequence[str] = DEFAULT_SIZES, timeout: float = 60.0
) -> int:
    """``check --local N``: start ``nproc`` local gloo ranks, run ``checks`` on them, print rank 0's
    report; the exit status. ``timeout`` bounds each op; the ranks are stopped after ``60 + 3 * timeout`` s."""
    from communicator.spawn import launch

    try:
        results = launch(
            _local_rank_job, nproc, {"backend": "gloo", "timeout": timeout}, (checks, sizes), timeout=60 + 3 * timeout
        )
    except RemoteError as error:
        reports = [failure.message for failure in error.failures if failure.error_type == _Stopped.__name__]
        print("\n".join(reports) or f"communicator check: the local ranks failed: {error}", flush=True)
        return 1
    except CommError as error:
        print(f"communicator check: the local ranks failed: {error}", file=sys.stderr, flush=True)
        return 1
    status, lines = results[0]
    print("\n".join(lines), flush=True)
    return int(status)


def run(args: argparse.Namespace) -> int:
    try:
        sizes = [size.strip() for size in args.sizes.split(",") if size.strip()]
        if not sizes or any(size not in SIZES for size in sizes):
            raise ConfigError(f"--sizes {args.sizes!r} is invalid: expected names among {', '.join(SIZES)}")
        if args.timeout <= 0:
            raise ConfigError(f"--timeout {args.timeout} is invalid: expected a positive number of seconds")
        if args.local is not None and args.local < 1:
            raise ConfigError(f"--local {args.local} is invalid: expected a positive number of ranks")
        checks = _select(args.ops)
        config = CommConfig.from_env().replace(timeout=args.timeout)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.local is not None:
        return run_local(args.local, checks, sizes, args.timeout)
    try:
        with Communicator.create(config) as comm:
            return check_job(comm, checks, sizes)
    except Aborted:
        return 1  # already reported
    except Exception as error:  # noqa: BLE001 - a broken job is reported, not a traceback
        print(f"communicator check: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return 1
