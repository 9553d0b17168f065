"""The checks of ``communicator check``: every operation, run on every rank and compared with the
value it must have."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from communicator.base import Communicator
from communicator.check.equality import same_value
from communicator.check.values import (
    REDUCE_INPUT,
    Mismatch,
    Skip,
    arrive_late,
    expect,
    expect_same,
    expect_tensor,
    expect_tensors,
    ints,
    item,
    payload,
    ramp,
    reduced,
    short,
)
from communicator.errors import NotMemberError
from communicator.reductions import REDUCE_OPS

__all__ = ["CHECKS", "DEFAULT_SIZES", "SIZES", "Check"]

#: Elements per tensor for each size. Objects carry as many array items, so ``small`` objects
#: travel inline with the size exchange and ``medium`` ones in a second exchange; ``medium``
#: tensors are large enough for the point-to-point paths of the gathers.
SIZES: dict[str, int] = {"small": 8, "medium": 100_000, "large": 4_000_000}
DEFAULT_SIZES: tuple[str, ...] = ("small", "medium")

CheckFn = Callable[[Communicator, int], None]


class Check(NamedTuple):
    """One row of the table: ``run(comm, n)`` raises when the op misbehaves.

    ``n`` is the number of elements of the size being checked; an unsized check (``sized=False``)
    runs once, shown with size ``-``.
    """

    name: str
    run: CheckFn
    sized: bool = True


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
        return REDUCE_INPUT[op](rank, n)

    tensor = values(comm.rank)
    returned = comm.all_reduce(tensor, op=op)
    expect(returned is tensor, "all_reduce did not return its (in-place) tensor")
    expect_tensor(tensor, reduced(op, values, comm.world_size), f"all_reduce(op={op!r})")


def _all_reduce_async(comm: Communicator, n: int) -> None:
    tensor = ramp(comm.rank, n)
    handle = comm.all_reduce(tensor, async_op=True)
    expect_tensor(handle.wait(), reduced("sum", functools.partial(ramp, n=n), comm.world_size), "all_reduce.wait()")


def _all_reduce_inference(comm: Communicator, n: int) -> None:
    with torch.inference_mode():
        tensor = ramp(comm.rank, n)
        comm.all_reduce(tensor, op="max")
    expect_tensor(tensor, ramp(_last(comm), n), "all_reduce(op='max') of an inference tensor")


def _integer_mean(comm: Communicator, n: int) -> None:
    counters = torch.full((2,), 7, dtype=torch.int64)  # identical on every rank: the mean is exact
    comm.all_reduce(counters, op="mean")
    expect_tensor(counters, torch.full((2,), 7, dtype=torch.int64), "all_reduce(op='mean') of equal int64 counters")
    if comm.world_size == 1:
        return
    uneven = torch.tensor([1 if comm.rank == 0 else 0], dtype=torch.int64)  # a sum of 1 never divides
    try:
        comm.all_reduce(uneven, op="mean")
    except ValueError:
        expect_tensor(uneven, torch.tensor([1 if comm.rank == 0 else 0]), "a refused integer mean's tensor")
        return
    raise Mismatch(f"all_reduce(op='mean') of int64 values summing to 1 gave {uneven.tolist()}: it must refuse")


def _broadcast(comm: Communicator, n: int) -> None:
    src = _last(comm)
    tensor = ramp(src, n, torch.float64) if comm.rank == src else torch.zeros(n, dtype=torch.float64)
    comm.broadcast(tensor, src=src)
    expect_tensor(tensor, ramp(src, n, torch.float64), f"broadcast(src={src})")


def _reduce(comm: Communicator, n: int) -> None:
    dst = _last(comm)
    tensor = ramp(comm.rank, n)
    comm.reduce(tensor, dst=dst, op="sum")
    if comm.rank == dst:
        expect_tensor(tensor, reduced("sum", functools.partial(ramp, n=n), comm.world_size), f"reduce(dst={dst})")
    else:
        expect_tensor(tensor, ramp(comm.rank, n), f"reduce(dst={dst}) on a non-destination rank (must be unchanged)")


def _all_gather(comm: Communicator, n: int) -> None:
    got = comm.all_gather(ints(comm.rank, n))
    expect_tensors(got, [ints(r, n) for r in range(comm.world_size)], "all_gather")


def _all_gather_uneven(comm: Communicator, n: int) -> None:
    got = comm.all_gather(ramp(comm.rank, n + comm.rank))
    expect_tensors(got, [ramp(r, n + r) for r in range(comm.world_size)], "all_gather (uneven shapes)")


def _all_gather_async(comm: Communicator, n: int) -> None:
    handle = comm.all_gather(ramp(comm.rank, n + comm.rank), async_op=True)
    expect_tensors(handle.wait(), [ramp(r, n + r) for r in range(comm.world_size)], "all_gather(async_op=True)")


def _gather(comm: Communicator, n: int) -> None:
    dst = _last(comm)
    got = comm.gather(ramp(comm.rank, n + comm.rank), dst=dst)
    if comm.rank == dst:
        expect_tensors(got, [ramp(r, n + r) for r in range(comm.world_size)], f"gather(dst={dst}, uneven shapes)")
    else:
        expect(got is None, f"gather(dst={dst}) returned {short(got)} on a non-destination rank, expected None")


def _scatter(comm: Communicator, n: int) -> None:
    parts = [ints(r, n + r, torch.int32) for r in range(comm.world_size)] if comm.rank == 0 else None
    got = comm.scatter(parts, src=0)
    expect_tensor(got, ints(comm.rank, n + comm.rank, torch.int32), "scatter(src=0, uneven shapes)")


def _reduce_scatter(comm: Communicator, n: int) -> None:
    def part(sender: int, receiver: int) -> torch.Tensor:
        return ramp(sender, n) + 10 * receiver

    got = comm.reduce_scatter([part(comm.rank, r) for r in range(comm.world_size)], op="sum")
    want = reduced("sum", lambda sender: part(sender, comm.rank), comm.world_size)
    expect_tensor(got, want, "reduce_scatter(op='sum')")


def _all_to_all(comm: Communicator, n: int) -> None:
    world = comm.world_size

    def part(sender: int, receiver: int) -> torch.Tensor:
        return ints(sender * world + receiver, n + receiver)

    got = comm.all_to_all([part(comm.rank, r) for r in range(world)])
    expect_tensors(got, [part(r, comm.rank) for r in range(world)], "all_to_all")


def _send_recv(comm: Communicator, n: int) -> None:
    right, left = _ring(comm)
    received = torch.zeros(n)
    if comm.rank % 2 == 0:  # half the ring sends first, so blocking calls cannot all wait on each other
        comm.send(ramp(comm.rank, n), dst=right)
        got = comm.recv(received, src=left)
    else:
        got = comm.recv(received, src=left)
        comm.send(ramp(comm.rank, n), dst=right)
    expect(got is received, "recv did not return its (in-place) tensor")
    expect_tensor(received, ramp(left, n), f"recv(src={left})")


#: How late a rank arrives in the late-peer checks: far below any timeout, far above a scheduling hiccup.
LATE_SECONDS = 0.2


def _all_reduce_late_rank(comm: Communicator, n: int) -> None:
    if comm.rank == _last(comm):
        arrive_late(LATE_SECONDS)
    tensor = comm.all_reduce(ramp(comm.rank, 4))
    expect_tensor(tensor, reduced("sum", functools.partial(ramp, n=4), comm.world_size), "all_reduce (one rank late)")


def _send_recv_late_sender(comm: Communicator, n: int) -> None:
    right, left = _ring(comm)
    received = torch.zeros(4)
    if comm.rank % 2 == 0:  # the even ranks send late; the odd ones wait for them in recv
        arrive_late(LATE_SECONDS)
        comm.send(ramp(comm.rank, 4), dst=right)
        comm.recv(received, src=left)
    else:
        comm.recv(received, src=left)
        comm.send(ramp(comm.rank, 4), dst=right)
    expect_tensor(received, ramp(left, 4), f"recv(src={left}) from a sender {LATE_SECONDS:g} s late")


def _isend_irecv(comm: Communicator, n: int) -> None:
    right, left = _ring(comm)
    received = torch.zeros(n)
    receiving = comm.irecv(received, src=left)
    sending = comm.isend(ramp(comm.rank, n), dst=right)
    sending.wait()
    expect_tensor(receiving.wait(), ramp(left, n), f"irecv(src={left}).wait()")


def _all_gather_object(comm: Communicator, n: int) -> None:
    got = comm.all_gather_object(payload(comm.rank, n))
    expect_same(got, [payload(r, n) for r in range(comm.world_size)], "all_gather_object")


def _gather_object(comm: Communicator, n: int) -> None:
    dst = _last(comm)
    got = comm.gather_object(payload(comm.rank, n), dst=dst)
    want = [payload(r, n) for r in range(comm.world_size)] if comm.rank == dst else None
    expect_same(got, want, f"gather_object(dst={dst})")


def _broadcast_object(comm: Communicator, n: int) -> None:
    src = _last(comm)
    got = comm.broadcast_object(payload(src, n) if comm.rank == src else None, src=src)
    expect_same(got, payload(src, n), f"broadcast_object(src={src})")


def _broadcast_object_list(comm: Communicator, n: int) -> None:
    def sent() -> list[Any]:
        return [payload(0, n), "text", None]

    objects = sent() if comm.rank == 0 else [None, None, None]
    returned = comm.broadcast_object_list(objects, src=0)
    expect(returned is objects, "broadcast_object_list did not return its (in-place) list")
    expect_same(objects, sent(), "broadcast_object_list(src=0)")


def _scatter_object(comm: Communicator, n: int) -> None:
    parts = [payload(r, n) for r in range(comm.world_size)] if comm.rank == 0 else None
    expect_same(comm.scatter_object(parts, src=0), payload(comm.rank, n), "scatter_object(src=0)")


def _send_recv_object(comm: Communicator, n: int) -> None:
    right, left = _ring(comm)
    if comm.rank % 2 == 0:
        comm.send_object(payload(comm.rank, n), dst=right)
        got = comm.recv_object(src=left)
    else:
        got = comm.recv_object(src=left)
        comm.send_object(payload(comm.rank, n), dst=right)
    expect_same(got, payload(left, n), f"recv_object(src={left})")


def _metrics(rank: int, n: int) -> dict[str, Any]:
    return {
        "loss": torch.tensor(float(rank)),
        "hits": torch.tensor(rank, dtype=torch.int64),
        "count": rank + 1,
        "score": 0.5 * rank,
        "nested": {"vector": ramp(rank, n), "ints": ints(rank, n)},
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
            "vector": reduced(op, functools.partial(ramp, n=n), world),
            "ints": (reduced("sum", functools.partial(ints, n=n), world).double() / world)
            if mean
            else reduced("sum", functools.partial(ints, n=n), world),
        },
    }
    expect(isinstance(got, dict) and got.keys() == want.keys(), f"all_reduce_dict: got keys {short(list(got))}")
    for key in ("loss", "hits"):
        expect_tensor(got[key], want[key], f"all_reduce_dict(op={op!r})[{key!r}]")
    for key in ("count", "score"):
        expect(
            type(got[key]) is type(want[key]) and abs(got[key] - want[key]) <= 1e-9 * max(1.0, abs(want[key])),
            f"all_reduce_dict(op={op!r})[{key!r}]: got {got[key]!r}, expected {want[key]!r}",
        )
    for key in ("vector", "ints"):
        expect_tensor(got["nested"][key], want["nested"][key], f"all_reduce_dict(op={op!r})['nested'][{key!r}]")


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
            expect(same, f"all_reduce_dict(op={op!r})[{key!r}]: got {mine_value!r}, expected {value!r}")


def _collect_interleaved(comm: Communicator, n: int) -> None:
    world, per_rank = comm.world_size, 8 if n < 1000 else 50
    width = max(1, n // per_rank)
    size = world * per_rank - (world - 1) // 2  # DistributedSampler pads by repeating the first items
    padded = [i % size for i in range(world * per_rank)]
    part = [item(i, width) for i in padded[comm.rank :: world]]
    got = comm.collect_results(part, size=size)
    want = [item(i, width) for i in range(size)] if comm.rank == 0 else None
    expect_same(got, want, f"collect_results(size={size}) on rank {comm.rank}")


def _collect_contiguous(comm: Communicator, n: int) -> None:
    world, per_rank = comm.world_size, 8 if n < 1000 else 50
    width = max(1, n // per_rank)
    size = world * per_rank - (world - 1) // 2  # the last rank's tail is padding, dropped by size
    part = [item(i, width) for i in range(comm.rank * per_rank, (comm.rank + 1) * per_rank)]
    dst = _last(comm)
    got = comm.collect_results(part, size=size, dst=dst, order="contiguous")
    want = [item(i, width) for i in range(size)] if comm.rank == dst else None
    expect_same(got, want, f"collect_results(size={size}, dst={dst}, order='contiguous') on rank {comm.rank}")


def _rng_states() -> tuple[Any, ...]:
    return random.getstate(), np.random.get_state(legacy=True), torch.get_rng_state()


def _sync_random_seed(comm: Communicator, n: int) -> None:
    before = _rng_states()
    drawn = comm.sync_random_seed()
    given = comm.sync_random_seed(1234 + comm.rank)  # rank 0's seed wins
    after = _rng_states()
    seeds = comm.all_gather_object(drawn)
    expect(len(set(seeds)) == 1, f"sync_random_seed() gave different seeds on different ranks: {seeds}")
    expect(given == 1234, f"sync_random_seed(1234 + rank) gave {given}, expected rank 0's 1234")
    same = before[0] == after[0] and same_value(list(after[1]), list(before[1])) and torch.equal(before[2], after[2])
    expect(same, "sync_random_seed changed the global Python, NumPy or torch RNG state")


def _expect_group(group: Communicator, members: Sequence[int], comm: Communicator, n: int, what: str) -> None:
    """``group`` holds ``members`` (ranks of ``comm``) in that order; its collectives work."""
    expect(
        (group.rank, group.world_size) == (members.index(comm.rank), len(members)),
        f"{what}: rank {group.rank} of {group.world_size}, expected {members.index(comm.rank)} of {len(members)}",
    )
    world_ranks = [comm.to_global(member) for member in members]
    expect(
        list(group.global_ranks) == world_ranks and group.to_local(comm.to_global(comm.rank)) == group.rank,
        f"{what}: global_ranks {list(group.global_ranks)}, expected {world_ranks}",
    )
    expect_same(group.all_gather_object(comm.rank), list(members), f"{what}.all_gather_object(parent rank)")
    total = group.all_reduce(torch.full((n,), float(comm.rank)))
    expect_tensor(total, torch.full((n,), float(sum(members))), f"{what}.all_reduce")
    expect_same(group.broadcast_object(comm.rank if group.rank == 0 else None), members[0], f"{what}.broadcast_object")


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
    expect(
        (local.rank, local.world_size) == (comm.local_rank, comm.local_size),
        f"local_comm: rank {local.rank} of {local.world_size}, "
        f"expected the local rank {comm.local_rank} of {comm.local_size}",
    )
    nodes = local.all_gather_object(comm.node_rank)
    expect(nodes == [comm.node_rank] * local.world_size, f"local_comm holds ranks of nodes {nodes}")


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
