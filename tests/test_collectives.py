"""Tensor collectives: the same checks on NonDistComm (world 1) and real gloo ranks (worlds 2-4)."""

from __future__ import annotations

import pytest
import torch

from communicator import CollectiveMismatchError, Communicator
from communicator.ops import REDUCE_OPS

pytestmark = pytest.mark.world_size(1, 2, 3, 4)

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32, torch.uint8)


def _value(rank: int) -> int:
    return rank + 1


def _expected(op: str, world: int) -> float:
    values = [_value(r) for r in range(world)]
    result: float
    if op == "sum":
        result = sum(values)
    elif op == "mean":
        result = sum(values) / world
    elif op == "product":
        result = 1
        for v in values:
            result *= v
    elif op == "min":
        result = min(values)
    elif op == "max":
        result = max(values)
    else:
        acc = values[0]
        for v in values[1:]:
            acc = {"band": acc & v, "bor": acc | v, "bxor": acc ^ v}[op]
        result = acc
    return result


def all_reduce_every_op(comm: Communicator) -> bool:
    world = comm.world_size
    for op in REDUCE_OPS:
        for dtype in FLOATS + INTS:
            bitwise = op in ("band", "bor", "bxor")
            if (bitwise and dtype in FLOATS) or (op == "mean" and dtype in INTS):
                continue
            tensor = torch.full((3,), _value(comm.rank), dtype=dtype)
            returned = comm.all_reduce(tensor, op=op.upper() if op == "sum" else op)
            assert returned is tensor
            expected = torch.full((3,), _expected(op, world), dtype=torch.float64).to(dtype)
            assert torch.equal(tensor, expected), (op, dtype, tensor, expected)
    flags = torch.tensor([comm.rank == 0, True])
    comm.all_reduce(flags, op="band")
    assert flags.tolist() == [world == 1, True]
    via_torch_op = torch.tensor([float(comm.rank)])
    comm.all_reduce(via_torch_op, op=torch.distributed.ReduceOp.MAX)
    assert via_torch_op.item() == world - 1
    return True


def test_all_reduce_every_op_and_dtype(run) -> None:
    assert all(run(all_reduce_every_op))


def integer_mean_refused(comm: Communicator) -> str:
    with pytest.raises(TypeError, match="integer or bool"):
        comm.all_reduce(torch.tensor([1.0]), op="bxor")
    with pytest.raises(ValueError, match="unknown reduce op"):
        comm.all_reduce(torch.tensor([1.0]), op="median")
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        comm.all_reduce([1.0], op="sum")  # type: ignore[arg-type]
    # still usable afterwards: bad input never reached the group
    t = torch.tensor([1.0])
    comm.all_reduce(t)
    return f"{t.item():g}"


def test_bad_input_is_refused_before_communication(run, world_size: int) -> None:
    assert run(integer_mean_refused) == [f"{world_size:g}"] * world_size


def integer_means(comm: Communicator) -> list[list[int]]:
    seen = []
    for reduce in (comm.all_reduce, lambda t, op: comm.reduce(t, dst=comm.world_size - 1, op=op)):
        counters = torch.tensor([5, 7], dtype=torch.int64)  # identical on every rank: the mean is exact
        assert reduce(counters, op="mean") is counters
        seen.append(counters.tolist())
        if comm.world_size > 1:  # a sum of 1 never divides: every rank refuses, and keeps its values
            uneven = torch.tensor([1 if comm.rank == 0 else 0, 3], dtype=torch.int32)
            with pytest.raises(ValueError, match="does not divide by the world size"):
                reduce(uneven, op="mean")
            seen.append(uneven.tolist())
    params = torch.nn.Parameter(torch.full((3,), float(comm.rank)))
    comm.all_reduce(params, op="mean")  # a leaf that requires grad, written where autograd does not look
    seen.append([round(v * 2) for v in params.tolist()])
    return seen


def test_integer_mean_is_exact_or_refused_and_the_group_stays_usable(run, world_size: int) -> None:
    mean_of_ranks = world_size - 1  # twice the mean of 0..world-1
    for rank, seen in enumerate(run(integer_means)):
        uneven = [[1 if rank == 0 else 0, 3]] if world_size > 1 else []
        expected = [[5, 7], *uneven, [5, 7], *uneven, [mean_of_ranks] * 3]
        assert seen == expected, (rank, seen)


def gathers(comm: Communicator) -> bool:
    world, rank = comm.world_size, comm.rank
    for dtype in (*FLOATS, *INTS, torch.bool):
        even = comm.all_gather(torch.full((2, 3), rank, dtype=dtype))
        assert [t.shape for t in even] == [torch.Size([2, 3])] * world
        assert all(torch.equal(t, torch.full((2, 3), r, dtype=dtype)) for r, t in enumerate(even))
        uneven = comm.all_gather(torch.full((rank + 1, 2), rank, dtype=dtype))
        assert [tuple(t.shape) for t in uneven] == [(r + 1, 2) for r in range(world)]
        assert all(bool((t == torch.tensor(r).to(dtype)).all()) for r, t in enumerate(uneven))
    big = comm.all_gather(torch.arange(100_000 + rank, dtype=torch.float32))  # point-to-point path
    assert [t.numel() for t in big] == [100_000 + r for r in range(world)]
    assert all(torch.equal(t, torch.arange(100_000 + r, dtype=torch.float32)) for r, t in enumerate(big))
    empty = comm.all_gather(torch.empty(0, 4))
    assert [tuple(t.shape) for t in empty] == [(0, 4)] * world
    for dst in range(world):
        got = comm.gather(torch.arange(rank + 2), dst=dst)
        if rank == dst:
            assert [t.tolist() for t in got] == [list(range(r + 2)) for r in range(world)]
        else:
            assert got is None
    return True


def test_all_gather_and_gather_accept_uneven_shapes(run) -> None:
    assert all(run(gathers))


def mismatched_dtypes(comm: Communicator) -> str:
    dtype = torch.float32 if comm.rank == 0 else torch.int64
    try:
        comm.all_gather(torch.zeros(2, dtype=dtype))
    except CollectiveMismatchError as error:
        return str(error)
    return "no error"


@pytest.mark.world_size(2, 3)
def test_mismatched_dtypes_fail_on_every_rank(run) -> None:
    messages = run(mismatched_dtypes)
    assert all("same dtype" in m and "rank 0: all_gather(torch.float32" in m for m in messages)


def rooted(comm: Communicator) -> bool:
    world, rank = comm.world_size, comm.rank
    for src in range(world):
        t = torch.full((4,), float(rank))
        assert comm.broadcast(t, src=src) is t
        assert t.tolist() == [float(src)] * 4
        for op in ("sum", "max", "mean"):
            r = torch.full((2,), float(rank + 1))
            comm.reduce(r, dst=src, op=op)
            if rank == src:
                assert r.tolist() == [_expected(op, world)] * 2, (op, r)
            else:
                assert r.tolist() == [float(rank + 1)] * 2  # other ranks keep their input
        parts = [torch.full((d + 1,), float(d * 10 + src)) for d in range(world)] if rank == src else None
        mine = comm.scatter(parts, src=src)
        assert mine.tolist() == [float(rank * 10 + src)] * (rank + 1)
    return True


def test_broadcast_reduce_scatter_every_root(run) -> None:
    assert all(run(rooted))


def exchanges(comm: Communicator) -> bool:
    world, rank = comm.world_size, comm.rank
    pieces = [torch.tensor([float(rank * 100 + i)]) for i in range(world)]
    assert comm.reduce_scatter(pieces).item() == sum(r * 100 + rank for r in range(world))
    assert comm.reduce_scatter(pieces, op="mean").item() == sum(r * 100 + rank for r in range(world)) / world
    received = comm.all_to_all([torch.arange(j + 1) + rank * 10 for j in range(world)])
    assert [t.tolist() for t in received] == [[r * 10 + k for k in range(rank + 1)] for r in range(world)]
    if world > 1:
        right, left = (rank + 1) % world, (rank - 1) % world
        if rank % 2 == 0:
            comm.send(torch.tensor([rank]), dst=right)
            got = comm.recv(torch.zeros(1, dtype=torch.int64), src=left)
        else:
            got = comm.recv(torch.zeros(1, dtype=torch.int64), src=left)
            comm.send(torch.tensor([rank]), dst=right)
        assert got.item() == left
        inbox = torch.zeros(3)
        handles = [comm.irecv(inbox, src=left, tag=7), comm.isend(torch.full((3,), float(rank)), dst=right, tag=7)]
        assert handles[0].wait() is inbox and handles[1].wait() is None
        assert inbox.tolist() == [float(left)] * 3
        with pytest.raises(ValueError, match="this rank"):
            comm.send(torch.zeros(1), dst=rank)
    with pytest.raises(ValueError, match="out of range"):
        comm.send(torch.zeros(1), dst=world)
    return True


def test_reduce_scatter_all_to_all_and_point_to_point(run) -> None:
    assert all(run(exchanges))


def special_tensors(comm: Communicator) -> bool:
    world = comm.world_size
    # non-contiguous: a transposed view is reduced in place, the base sees it
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    view = base.t()
    comm.all_reduce(view)
    assert torch.equal(base, torch.arange(6, dtype=torch.float32).reshape(2, 3) * world)
    # inference tensors, inside and outside inference mode
    with torch.inference_mode():
        inside = torch.ones(2)
        comm.all_reduce(inside)
        gathered = comm.all_gather(torch.ones(1))
    assert inside.tolist() == [float(world)] * 2 and len(gathered) == world
    comm.all_reduce(inside)  # an inference tensor outside inference mode
    assert inside.tolist() == [float(world * world)] * 2
    comm.broadcast(inside, src=0)
    # async handles
    t = torch.ones(2)
    handle = comm.all_reduce(t, op="mean", async_op=True)
    assert handle.wait() is t and t.tolist() == [1.0, 1.0] and handle.is_completed()
    gathered_async = comm.all_gather(torch.tensor([comm.rank]), async_op=True).wait()
    assert [g.item() for g in gathered_async] == list(range(world))
    # a tensor that requires grad is reduced through .data semantics by the caller
    p = torch.ones(2, requires_grad=True)
    with torch.no_grad():
        comm.all_reduce(p)
    assert p.tolist() == [float(world)] * 2
    comm.barrier()
    comm.barrier(timeout=10)
    return True


def test_non_contiguous_inference_and_async(run) -> None:
    assert all(run(special_tensors))


def rank_checks(comm: Communicator) -> bool:
    for bad in (-1, comm.world_size, 10):
        with pytest.raises(ValueError, match="out of range"):
            comm.broadcast(torch.zeros(1), src=bad)
        with pytest.raises(ValueError, match="out of range"):
            comm.gather(torch.zeros(1), dst=bad)
    with pytest.raises(TypeError, match="int rank"):
        comm.reduce(torch.zeros(1), dst="0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="int rank"):
        comm.broadcast(torch.zeros(1), src=True)
    with pytest.raises(ValueError, match="sequence of"):
        comm.reduce_scatter([torch.zeros(1)] * (comm.world_size + 1))
    with pytest.raises(ValueError, match="timeout"):
        comm.barrier(timeout=-1)
    return True


def test_ranks_out_of_range_are_refused(run) -> None:
    assert all(run(rank_checks))


def queries(comm: Communicator) -> tuple[int, int, tuple[int, int], bool, bool, str]:
    return (comm.rank, comm.world_size, comm.dist_info, comm.is_main_process, comm.is_distributed, comm.device.type)


def test_rank_queries(run, world_size: int) -> None:
    results = run(queries)
    assert [r[0] for r in results] == list(range(world_size))
    assert all(r[1] == world_size and r[2] == (r[0], world_size) for r in results)
    assert [r[3] for r in results] == [True] + [False] * (world_size - 1)
    assert all(r[4] == (world_size > 1) and r[5] == "cpu" for r in results)
