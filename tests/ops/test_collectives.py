"""Tensor collectives: the same checks on NonDistComm (world 1) and real gloo ranks (worlds 2-4)."""

from __future__ import annotations

import math

import pytest
import torch

from communicator import CollectiveMismatchError, Communicator
from communicator.check.values import reduced
from communicator.reductions import REDUCE_OPS

pytestmark = pytest.mark.world_size(1, 2, 3, 4)

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32, torch.uint8)


def _value(rank: int) -> int:
    return rank + 1


def _expected(op: str, world: int) -> float:
    """``op`` across every rank's ``_value``, as the conformance suite computes it (one source)."""
    return float(reduced(op, lambda rank: torch.tensor(_value(rank)), world).item())


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
    for large in range(world):  # one rank's tensor too large to travel inline, the others inline; and the reverse
        for sizes in (
            [5000 if r == large else 3 for r in range(world)],
            [3 if r == large else 5000 for r in range(world)],
        ):
            mixed = comm.all_gather(torch.full((sizes[rank],), rank, dtype=torch.int32))
            assert [t.tolist() for t in mixed] == [[r] * sizes[r] for r in range(world)]
            got = comm.gather(torch.full((sizes[rank],), rank, dtype=torch.int32), dst=large)
            assert got is None if rank != large else [t.tolist() for t in got] == [[r] * sizes[r] for r in range(world)]
    for dst in range(world):
        got = comm.gather(torch.arange(rank + 2), dst=dst)
        if rank == dst:
            assert [t.tolist() for t in got] == [list(range(r + 2)) for r in range(world)]
        else:
            assert got is None
    return True


def test_all_gather_and_gather_accept_uneven_shapes(run) -> None:
    assert all(run(gathers))


def gathers_of_changing_sizes(comm: Communicator) -> bool:
    """Records carry as much as the previous gather's largest tensor: sizes that repeat, grow past
    the records, shrink, pass ``MAX_CAPACITY``, and differ between ranks all arrive whole."""
    rank, world = comm.rank, comm.world_size
    for elements in (3, 20_000, 20_000, 30_000, 5, 5, 100_000, 100_000, 70_000, 1):  # int32: 4 bytes each
        for sizes in (
            [elements] * world,
            [elements * (r + 1) for r in range(world)],
            [elements - 1 + r for r in range(world)],
        ):
            got = comm.all_gather(torch.arange(sizes[rank], dtype=torch.int32) + rank)
            assert [t.tolist() for t in got] == [list(range(r, sizes[r] + r)) for r in range(world)]
            for dst in {0, world - 1}:
                got = comm.gather(torch.full((sizes[rank], 2), rank, dtype=torch.float64), dst=dst)
                assert got is None if rank != dst else [t.shape[0] for t in got] == sizes
                assert got is None or all(bool((t == r).all()) for r, t in enumerate(got))
    return True


def test_gathers_of_changing_sizes(run) -> None:
    assert all(run(gathers_of_changing_sizes))


def large_gathers(comm: Communicator) -> bool:
    """Tensors of 4 MiB and more arrive in memory faulted in before the transfer (see ``staging.empty``)."""
    rank, world = comm.rank, comm.world_size
    mine = torch.arange(1_300_000, dtype=torch.float32) * (rank + 1)  # 5.2 MiB
    for got in (comm.all_gather(mine), comm.all_gather(mine, same_shape=True), comm.gather(mine, dst=world - 1)):
        if got is not None:
            assert all(
                torch.equal(t, torch.arange(1_300_000, dtype=torch.float32) * (r + 1)) for r, t in enumerate(got)
            )
    with torch.inference_mode():
        inferred = comm.all_gather(torch.full((2, 700_000), rank, dtype=torch.complex64), same_shape=True)
    assert all(t.is_inference() and bool((t == r).all()) for r, t in enumerate(inferred))
    return True


def test_large_gathers(run) -> None:
    assert all(run(large_gathers))


def repeated_gather_starts(comm: Communicator) -> list[tuple[int, int]]:
    """How many collectives and transfers each of three equal all_gathers of 64 KiB starts."""
    started: list[str] = []
    gather, transfers = comm._all_gather, comm._transfers

    def counted_gather(outputs: list[torch.Tensor], tensor: torch.Tensor) -> object:
        started.append("collective")
        return gather(outputs, tensor)

    def counted_transfers(sends: dict[int, torch.Tensor], recvs: dict[int, torch.Tensor]) -> object:
        started.extend(["transfer"] * (len(sends) + len(recvs)))
        return transfers(sends, recvs)

    comm._all_gather, comm._transfers = counted_gather, counted_transfers  # type: ignore[method-assign,assignment]
    counts = []
    for _ in range(3):
        got = comm.all_gather(torch.full((16_384,), comm.rank, dtype=torch.float32))
        assert all(bool((t == r).all()) for r, t in enumerate(got))
        counts.append((started.count("collective"), started.count("transfer")))
        started.clear()
    return counts


@pytest.mark.world_size(2, 3)
def test_an_all_gather_that_repeats_its_sizes_is_one_collective(run, world_size: int) -> None:
    # the first call learns the sizes (records, then the data); the next ones carry the data in the records
    assert run(repeated_gather_starts) == [[(2, 0), (1, 0), (1, 0)]] * world_size


def repeated_gather_to_starts(comm: Communicator) -> list[tuple[int, int]]:
    """How many collectives and transfers each of three equal gathers of 64 KiB to the last rank starts."""
    started: list[str] = []
    gather, transfers = comm._gather, comm._transfers

    def counted_gather(*args: object) -> object:
        started.append("collective")
        return gather(*args)  # type: ignore[arg-type]

    def counted_transfers(sends: dict[int, torch.Tensor], recvs: dict[int, torch.Tensor]) -> object:
        started.extend(["transfer"] * (len(sends) + len(recvs)))
        return transfers(sends, recvs)

    comm._gather, comm._transfers = counted_gather, counted_transfers  # type: ignore[method-assign,assignment]
    counts, dst = [], comm.world_size - 1
    for _ in range(3):
        got = comm.gather(torch.full((16_384,), comm.rank, dtype=torch.float32), dst=dst)
        assert got is None if comm.rank != dst else all(bool((t == r).all()) for r, t in enumerate(got))
        counts.append((started.count("collective"), started.count("transfer")))
        started.clear()
    return counts


@pytest.mark.world_size(2, 3)
def test_a_gather_that_repeats_its_sizes_is_one_collective(run, world_size: int) -> None:
    # the first call's records carry no data (it follows point to point); the next ones carry it
    senders = [[(1, 1), (1, 0), (1, 0)]] * (world_size - 1)
    assert run(repeated_gather_to_starts) == [*senders, [(1, world_size - 1), (1, 0), (1, 0)]]


def dtypes_apart_on_the_destination(comm: Communicator) -> tuple[str, float]:
    """Ranks that passed each dtype before (so the arguments are not compared again) pass
    different ones: the destination, which reads every record, raises, and the data that moved
    is received all the same, so the communicator stays usable."""
    for dtype in (torch.float32, torch.int64):
        comm.gather(torch.zeros(300, dtype=dtype), dst=0)
    mine = torch.zeros(300, dtype=(torch.float32, torch.int64)[comm.rank % 2])
    outcome = "none"
    try:
        comm.gather(mine, dst=0)
    except CollectiveMismatchError as error:
        outcome = str(error)
    after = torch.ones(1)
    comm.all_reduce(after)
    return outcome, after.item()


@pytest.mark.world_size(2, 3)
def test_a_mismatch_the_argument_check_let_through_raises_on_the_destination(run, world_size: int) -> None:
    (message, total), *others = run(dtypes_apart_on_the_destination)
    assert "must have the same dtype" in message and "torch.int64" in message
    assert total == world_size and all(after == world_size for _, after in others)


def gathers_of_one_shape(comm: Communicator) -> bool:
    rank, world = comm.rank, comm.world_size
    for dtype in (torch.float32, torch.int16, torch.complex64, torch.bool):
        for shape in ((1,), (3, 2), (0,), (1_100_000,)):  # the last one goes point to point on gloo
            got = comm.all_gather(torch.full(shape, rank + 1).to(dtype), same_shape=True)
            assert [(t.dtype, tuple(t.shape)) for t in got] == [(dtype, shape)] * world
            assert all(torch.equal(t, torch.full(shape, r + 1).to(dtype)) for r, t in enumerate(got))
    handle = comm.all_gather(torch.tensor([rank]), async_op=True, same_shape=True)
    assert [t.item() for t in handle.wait()] == list(range(world))
    return True


def test_all_gather_of_one_shape_is_one_collective(run) -> None:
    assert all(run(gathers_of_one_shape))


def broken_shape_promise(comm: Communicator) -> str:
    with pytest.raises(CollectiveMismatchError) as caught:
        comm.all_gather(torch.ones(comm.rank + 1), same_shape=True)
    return str(caught.value)


@pytest.mark.world_size(2, 3)
def test_debug_mode_checks_the_same_shape_promise(run) -> None:
    for message in run(broken_shape_promise, cfg={"debug": True, "launcher": "auto"}):
        assert "same_shape=True, but the ranks passed different shapes" in message


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
    assert all("must agree" in m and "rank 0: all_gather(dtype=torch.float32" in m for m in messages)


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


def _ints(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    return (
        torch.tensor(values, dtype=torch.float32).to(dtype)
        if dtype.is_floating_point
        else torch.tensor(values).to(dtype)
    )


def every_dtype(comm: Communicator) -> list[str]:
    """Every dtype the library moves, through reductions and data movement. gloo refuses some of
    them natively ("Invalid scalar type"); none may fail here, nor leave the communicator unusable."""
    from communicator.reductions import WIRE_DTYPES

    world, rank = comm.world_size, comm.rank
    done = []
    for dtype in WIRE_DTYPES:
        numeric = dtype not in (torch.bool, torch.complex64, torch.complex128)
        if numeric:  # small whole numbers: exact in every dtype, float8 included
            t = _ints([rank + 1, 1], dtype)
            comm.all_reduce(t)
            assert t.tolist() == _ints([world * (world + 1) // 2, world], dtype).tolist(), (dtype, t)
            for op, want in (("max", world), ("min", 1), ("product", math.factorial(world))):
                t = _ints([rank + 1], dtype)
                comm.all_reduce(t, op=op)
                assert t.item() == want, (dtype, op, t)
            r = _ints([rank + 1], dtype)
            comm.reduce(r, dst=world - 1, op="max")
            assert r.item() == (world if rank == world - 1 else rank + 1), (dtype, r)
            mine = comm.reduce_scatter([_ints([1 + (k == rank)], dtype) for k in range(world)], op="sum")
            assert mine.item() == world + 1, (dtype, mine)  # every sum stays representable in float8
        big = torch.zeros(2000, dtype=dtype)  # too large to travel inline: the backend's own collectives
        big[0] = rank + 1 if dtype != torch.bool else rank == 0
        comm.broadcast(big, src=0)
        expected = torch.zeros(2000, dtype=dtype)
        expected[0] = 1 if dtype != torch.bool else True
        assert big.tolist() == expected.tolist(), dtype
        gathered = comm.all_gather(torch.full((2000,), rank, dtype=torch.int64).to(dtype))

        def raw(t: torch.Tensor) -> list[int]:
            return t[:1].view(torch.uint8).tolist()

        assert [raw(g) for g in gathered] == [raw(torch.tensor([r]).to(dtype)) for r in range(world)], dtype
        done.append(str(dtype))
    big_unsigned = torch.tensor([2**63 + rank], dtype=torch.uint64)  # above int64's range: order kept
    comm.all_reduce(big_unsigned, op="max")
    assert big_unsigned.item() == 2**63 + world - 1
    after = torch.ones(1)
    comm.all_reduce(after)  # still usable
    assert after.item() == world
    return done


@pytest.mark.world_size(1, 2, 3)
def test_every_dtype_reduces_and_moves(run, world_size: int) -> None:
    from communicator.reductions import WIRE_DTYPES

    assert run(every_dtype) == [[str(d) for d in WIRE_DTYPES]] * world_size


def meaningless_reductions(comm: Communicator) -> float:
    z = torch.ones(2, dtype=torch.complex64)
    for call in (
        lambda: comm.all_reduce(z, op="max"),
        lambda: comm.reduce(z, dst=0, op="min"),
        lambda: comm.reduce_scatter([z] * comm.world_size, op="min"),
    ):
        with pytest.raises(TypeError, match="not defined for complex"):
            call()
    comm.all_reduce(z)  # a complex sum is defined
    assert z.tolist() == [complex(comm.world_size)] * 2
    w = torch.full((2,), 1 + 1j, dtype=torch.complex64)
    comm.all_reduce(w, op="product")  # and a complex product: (1+i)**world, not a product of parts
    got = comm.reduce_scatter([torch.full((1,), 1j, dtype=torch.complex128)] * comm.world_size, op="product")
    assert w.tolist() == [(1 + 1j) ** comm.world_size] * 2 and got.tolist() == [1j**comm.world_size]
    t = torch.ones(1)
    comm.all_reduce(t)  # refused on every rank before communicating: the group is intact
    return t.item()


def test_refused_operations_leave_the_communicator_usable(run, world_size: int) -> None:
    assert run(meaningless_reductions) == [float(world_size)] * world_size


def parameters_and_views(comm: Communicator) -> bool:
    """Every in-place operation into parameters and into non-contiguous views of them."""
    world, rank = comm.world_size, comm.rank
    last = world - 1
    for make in (
        lambda v: torch.nn.Parameter(torch.full((2, 3), v)),
        lambda v: torch.nn.Parameter(torch.full((3, 2), v)).t(),
    ):
        p = make(float(rank + 1))
        assert comm.all_reduce(p, op="mean") is p and p.tolist() == [[(world + 1) / 2] * 3] * 2
        p = make(float(rank))
        comm.broadcast(p, src=last)
        assert p.tolist() == [[float(last)] * 3] * 2
        p = make(1.0)
        comm.reduce(p, dst=last)  # the other ranks' parameters are untouched
        assert p.tolist() == [[float(world if rank == last else 1)] * 3] * 2
        if world > 1:
            p = make(-1.0)
            right, left = (rank + 1) % world, (rank - 1) % world
            handle = comm.irecv(p, src=left)
            comm.isend(torch.full((2, 3), float(rank)), dst=right).wait()
            assert handle.wait() is p and p.tolist() == [[float(left)] * 3] * 2
            q = make(-1.0)
            if rank % 2 == 0:
                comm.send(torch.full((2, 3), float(rank)), dst=right)
                comm.recv(q, src=left)
            else:
                comm.recv(q, src=left)
                comm.send(torch.full((2, 3), float(rank)), dst=right)
            assert q.tolist() == [[float(left)] * 3] * 2
        assert p.requires_grad  # still a parameter (or a view of one): nothing was replaced
    return True


def test_in_place_operations_write_into_parameters_and_views(run) -> None:
    assert all(run(parameters_and_views))


def timedelta_timeouts(comm: Communicator) -> bool:
    from datetime import timedelta

    comm.barrier(timeout=timedelta(seconds=30))
    comm.barrier(timeout=30)
    assert comm.all_reduce(torch.ones(1), async_op=True).wait(timeout=timedelta(seconds=30)).item() == comm.world_size
    with comm.wait_for_main(timeout=timedelta(seconds=30)):
        pass
    with pytest.raises(ValueError, match="timeout"):
        comm.barrier(timeout=timedelta(seconds=0))
    return True


def test_timeouts_are_seconds_or_timedeltas(run) -> None:
    assert all(run(timedelta_timeouts))
