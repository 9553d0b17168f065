"""A communicator as a torch.distributed process group: every operation through it gives what gloo
gives, on a world communicator, a subgroup and a transport of a user's own; its works behave as
torch's; what it cannot do is refused by name; a rank's failure reaches the others through it."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from communicator import CommError, CommTimeoutError, Communicator, NotMemberError, RemoteError, launch
from communicator.testing import run_ranks
from communicator.transports.process_group import CommProcessGroup, communicator_of

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "examples"))
from socket_comm import SocketComm  # noqa: F401 - registers "socket" for launch

REDUCTIONS = {
    "SUM": ReduceOp.SUM,
    "AVG": ReduceOp.AVG,
    "PRODUCT": ReduceOp.PRODUCT,
    "MIN": ReduceOp.MIN,
    "MAX": ReduceOp.MAX,
    "BAND": ReduceOp.BAND,
    "BOR": ReduceOp.BOR,
    "BXOR": ReduceOp.BXOR,
}


def _values(rank: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.arange(5, dtype=torch.float64) * (rank + 2) + rank).to(dtype)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def every_operation(comm: Communicator) -> list[str]:
    rank, world = comm.rank, comm.world_size
    differ: list[str] = []
    ran: list[str] = []
    comm.add_hook(post=lambda event: ran.append(event.op))

    def check(name: str, op: Any) -> None:
        """``op(group)`` through the communicator's process group, then through gloo's default group."""
        before = len(ran)
        mine = op(comm.as_process_group())
        if len(ran) == before:
            differ.append(f"{name}: no operation of the communicator ran")
        gloo = op(dist.group.WORLD)
        if not _same(mine, gloo):
            differ.append(f"{name}: {mine} != {gloo}")

    for name, op in REDUCTIONS.items():
        for dtype in (torch.float64, torch.int64):
            if (name in ("BAND", "BOR", "BXOR") and dtype.is_floating_point) or (
                name == "AVG" and not dtype.is_floating_point
            ):
                continue

            def reduced(group: Any, op: Any = op, dtype: torch.dtype = dtype) -> torch.Tensor:
                tensor = _values(rank, dtype)
                dist.all_reduce(tensor, op=op, group=group)
                return tensor

            check(f"all_reduce {name} {dtype}", reduced)

    def premul(group: Any) -> torch.Tensor:  # gloo has no PREMUL_SUM: compare with 0.5 * its SUM
        tensor = _values(rank, torch.float64)
        if group is dist.group.WORLD:
            dist.all_reduce(tensor, group=group)
            return tensor * 0.5
        dist.all_reduce(tensor, op=dist._make_nccl_premul_sum(0.5), group=group)
        return tensor

    if hasattr(dist.ReduceOp, "factor"):  # torch 2.13 on: earlier ones hide the factor from Python
        check("all_reduce PREMUL_SUM", premul)

    def coalesced(group: Any) -> list[torch.Tensor]:
        tensors = [_values(rank, torch.float64), _values(rank, torch.float64)[:2] + 1]
        dist.all_reduce_coalesced(tensors, group=group)
        return tensors

    check("all_reduce_coalesced", coalesced)

    def broadcast(group: Any) -> torch.Tensor:
        tensor = _values(rank, torch.int64)
        dist.broadcast(tensor, src=1, group=group)
        return tensor

    check("broadcast", broadcast)

    def reduce(group: Any) -> torch.Tensor:
        tensor = _values(rank, torch.float64)
        dist.reduce(tensor, dst=2, op=ReduceOp.MAX, group=group)
        return tensor if rank == 2 else torch.zeros(())  # other ranks' tensors are scratch

    check("reduce", reduce)

    def all_gather(group: Any) -> list[torch.Tensor]:
        outputs = [torch.zeros(3, 2) for _ in range(world)]
        dist.all_gather(outputs, torch.full((3, 2), float(rank)), group=group)
        return outputs

    check("all_gather", all_gather)

    def into_tensor(group: Any) -> torch.Tensor:
        output = torch.zeros(world * 2, 3, dtype=torch.int32)
        dist.all_gather_into_tensor(output, torch.full((2, 3), rank, dtype=torch.int32), group=group)
        return output

    check("all_gather_into_tensor", into_tensor)

    def objects(group: Any) -> list[Any]:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, {"rank": rank, "text": "x" * rank}, group=group)
        return gathered

    check("all_gather_object", objects)

    def reduce_scatter(group: Any) -> torch.Tensor:
        output = torch.zeros(2)
        dist.reduce_scatter(output, [torch.full((2,), float(rank * 10 + r)) for r in range(world)], group=group)
        return output

    check("reduce_scatter", reduce_scatter)

    def reduce_scatter_tensor(group: Any) -> torch.Tensor:
        output = torch.zeros(2, 2, dtype=torch.float64)
        source = torch.arange(world * 4, dtype=torch.float64).reshape(world * 2, 2) * (rank + 1)
        dist.reduce_scatter_tensor(output, source, op=ReduceOp.MIN, group=group)
        return output

    check("reduce_scatter_tensor", reduce_scatter_tensor)

    def all_to_all(group: Any) -> list[torch.Tensor]:
        outputs = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
        dist.all_to_all(outputs, [torch.full((2,), rank * 10 + r) for r in range(world)], group=group)
        return outputs

    check("all_to_all", all_to_all)

    def all_to_all_single(group: Any) -> torch.Tensor:
        output = torch.zeros(world * 2)
        dist.all_to_all_single(output, torch.arange(world * 2.0) + 100 * rank, group=group)
        return output

    check("all_to_all_single", all_to_all_single)

    def all_to_all_split(group: Any) -> torch.Tensor:
        # rank r sends j + 1 rows to rank j, so it receives r + 1 rows from every rank
        sent = [j + 1 for j in range(world)]
        received = [rank + 1] * world
        output = torch.zeros(sum(received), 2)
        source = torch.arange(sum(sent) * 2.0).reshape(-1, 2) + 1000 * rank
        dist.all_to_all_single(output, source, received, sent, group=group)
        return output

    check("all_to_all_single with split sizes", all_to_all_split)

    def gather(group: Any) -> list[torch.Tensor] | None:
        outputs = [torch.zeros(3) for _ in range(world)] if rank == 0 else None
        dist.gather(torch.full((3,), rank + 0.5), outputs, dst=0, group=group)
        return outputs

    check("gather", gather)

    def scatter(group: Any) -> torch.Tensor:
        output = torch.zeros(2, dtype=torch.int64)
        parts = [torch.full((2,), 7 * r) for r in range(world)] if rank == 1 else None
        dist.scatter(output, parts, src=1, group=group)
        return output

    check("scatter", scatter)

    def ring(group: Any) -> torch.Tensor:
        received = torch.zeros(4)
        works = [
            dist.irecv(received, (rank - 1) % world, group=group, tag=3),
            dist.isend(torch.full((4,), float(rank)), (rank + 1) % world, group=group, tag=3),
        ]
        for work in works:
            work.wait()
        return received

    check("isend/irecv", ring)

    def batched(group: Any) -> torch.Tensor:
        received = torch.zeros(2, dtype=torch.int64)
        ops = [
            dist.P2POp(dist.isend, torch.full((2,), rank), (rank + 1) % world, group),
            dist.P2POp(dist.irecv, received, (rank - 1) % world, group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return received

    check("batch_isend_irecv", batched)

    def blocking(group: Any) -> torch.Tensor:
        tensor = torch.zeros(3)
        if rank == 0:
            dist.send(torch.arange(3.0), 2, group=group)
        elif rank == 2:
            dist.recv(tensor, 0, group=group)
        dist.barrier(group=group)
        return tensor

    check("send/recv/barrier", blocking)

    def functional(group: Any) -> torch.Tensor:
        import torch.distributed._functional_collectives as fc

        return fc.wait_tensor(fc.all_reduce(_values(rank, torch.float64), "sum", group))

    check("functional all_reduce", functional)
    return differ


def test_every_operation_gives_what_gloo_gives() -> None:
    assert run_ranks(every_operation, 3, timeout=60) == [[]] * 3


def works_and_names(comm: Communicator) -> dict[str, Any]:
    pg = comm.as_process_group()
    assert comm.as_process_group() is pg and communicator_of(pg) is comm and communicator_of(None) is None
    assert isinstance(pg, CommProcessGroup) and pg.comm is comm
    work = dist.all_reduce(torch.ones(2), group=pg, async_op=True)
    assert work is not None
    chained = work.get_future().then(lambda fut: fut.value()[0] * 2)
    with dist._coalescing_manager(group=pg):
        coalesced = [torch.ones(1), torch.full((2,), 2.0)]
        for tensor in coalesced:
            dist.all_reduce(tensor, group=pg)
    peer = 1 - comm.rank
    pending = dist.irecv(torch.zeros(1), peer, group=pg)
    assert pending is not None and not pending.is_completed()  # nothing was sent yet
    dist.barrier(group=pg)
    sent = dist.isend(torch.ones(1), peer, group=pg)
    assert sent is not None and sent.wait(timedelta(seconds=20)) and pending.wait(timedelta(seconds=20))
    split = pg.split_group([comm.rank])  # every rank its own group
    assert isinstance(split, CommProcessGroup)
    alone = torch.full((1,), 3.0)
    dist.all_reduce(alone, group=split)
    return {
        "completed": work.is_completed() and work.wait(timedelta(seconds=1)),
        "chained": chained.wait().tolist(),
        "coalesced": [t.tolist() for t in coalesced],
        "names": (pg.name(), dist.get_backend(pg), pg.group_name == dist.distributed_c10d._get_process_group_name(pg)),
        "ranks": (pg.rank(), pg.size(), dist.get_rank(pg), dist.get_process_group_ranks(pg)),
        "received": pending.get_future().value()[0].tolist(),
        "alone": (split.size(), alone.item()),
    }


def test_works_names_and_ranks_are_torchs() -> None:
    results = run_ranks(works_and_names, 2, timeout=60)
    for rank, result in enumerate(results):
        assert result == {
            "completed": True,
            "chained": [4.0, 4.0],
            "coalesced": [[2.0], [4.0, 4.0]],
            "names": ("communicator", "communicator", True),
            "ranks": (rank, 2, rank, [0, 1]),
            "received": [1.0],
            "alone": (1, 3.0),
        }


def in_a_subgroup(comm: Communicator) -> dict[str, Any] | None:
    sub = comm.new_group([3, 1])  # world rank 3 is the subgroup's rank 0
    if not sub.is_member:
        with pytest.raises(NotMemberError):
            sub.as_process_group()
        return None
    pg = sub.as_process_group()
    tensor = torch.tensor([float(comm.rank)])
    dist.broadcast(tensor, group_src=0, group=pg)
    from_world_rank = torch.tensor([float(comm.rank)])
    dist.broadcast(from_world_rank, src=1, group=pg)  # a world rank, as torch takes it
    gathered = [torch.zeros(1) for _ in range(2)]
    dist.all_gather(gathered, torch.tensor([float(comm.rank)]), group=pg)
    return {
        "ranks": (pg.rank(), dist.get_rank(pg), dist.get_process_group_ranks(pg)),
        "broadcast": (tensor.item(), from_world_rank.item()),
        "gathered": [t.item() for t in gathered],
    }


def test_a_subgroup_counts_its_ranks_as_the_communicator_does() -> None:
    results = run_ranks(in_a_subgroup, 4, timeout=60)
    assert results[0] is None and results[2] is None
    assert results[3] == {"ranks": (0, 0, [3, 1]), "broadcast": (3.0, 1.0), "gathered": [3.0, 1.0]}
    assert results[1] == {"ranks": (1, 1, [3, 1]), "broadcast": (3.0, 1.0), "gathered": [3.0, 1.0]}


def over_sockets(comm: Communicator) -> list[Any]:
    pg = comm.as_process_group()
    tensor = torch.tensor([comm.rank + 1.0])
    dist.all_reduce(tensor, op=ReduceOp.PRODUCT, group=pg)
    output = torch.zeros(4)
    dist.all_gather_into_tensor(output, torch.full((2,), float(comm.rank)), group=pg)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1), process_group=pg)
    model(torch.full((2, 3), float(comm.rank + 1))).sum().backward()  # DDP's all-reduce over sockets
    gradient = model.module.weight.grad
    assert gradient is not None
    return [dist.is_initialized(), tensor.item(), output.tolist(), gradient.tolist()]


def test_a_transport_of_ones_own_without_torch_distributed() -> None:
    results = launch(over_sockets, 2, {"type": "socket", "timeout": 30}, timeout=60)
    averaged = [[3.0, 3.0, 3.0]]  # the mean over ranks of each rank's 2 * (rank + 1) per weight
    assert results == [[False, 2.0, [0.0, 0.0, 1.0, 1.0], averaged]] * 2


def refusals_then_a_failure(comm: Communicator) -> list[str]:
    pg = comm.as_process_group()
    seen = []
    for refused in (
        lambda: dist.recv(torch.zeros(1), group=pg),  # from any source
        lambda: pg.allgather([[torch.zeros(1), torch.zeros(1)]], [torch.ones(1), torch.ones(1)]),
        lambda: dist.all_to_all_single(torch.zeros(3), torch.ones(3), group=pg),
        lambda: dist.all_gather_into_tensor(torch.zeros(3), torch.ones(2), group=pg),
    ):
        with pytest.raises(CommError) as error:
            refused()
        seen.append(str(error.value).split(":")[0])
    dist.all_reduce(torch.ones(1), group=pg)  # refused before communicating: still usable
    try:
        with comm.fail_together("step"):
            if comm.rank == 1:
                raise ValueError("bad batch")
            dist.all_reduce(torch.ones(1), group=pg)
    except RemoteError as error:
        seen.append(f"RemoteError from rank {error.rank}")
    return seen


def test_refusals_name_the_operation_and_a_failure_reaches_every_rank() -> None:
    refused = ["recv from any source is not supported by the communicator process group", "allgather",
               "all_to_all_single", "all_gather_into_tensor"]  # fmt: skip
    assert run_ranks(refusals_then_a_failure, 2, timeout=60) == [[*refused, "RemoteError from rank 1"]] * 2


def late_rank(comm: Communicator) -> Any:
    pg = comm.as_process_group()
    if comm.rank == 1:
        time.sleep(2)  # never joins the barrier
        return "late"
    with pytest.raises(CommTimeoutError) as error:
        pg.monitored_barrier(timedelta(seconds=1))
    return error.value.missing_ranks


def test_monitored_barrier_names_the_late_rank() -> None:
    assert run_ranks(late_rank, 2, cfg={"timeout": 20}, timeout=60) == [(1,), "late"]


def _until(done: Any, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(done())


def asynchronous_works(comm: Communicator) -> dict[str, Any]:
    pg, rank, world = comm.as_process_group(), comm.rank, comm.world_size
    result: dict[str, Any] = {}
    dist.all_reduce(torch.ones(3), group=pg)  # the first call of a kind checks the arguments across ranks
    if rank == 1:
        time.sleep(1.0)  # rank 0's all-reduce cannot finish before this rank starts it
    tensor = torch.full((3,), float(rank + 1))
    started = time.monotonic()
    work = dist.all_reduce(tensor, group=pg, async_op=True)
    assert work is not None
    if rank == 0:
        result["returned at once"] = time.monotonic() - started < 0.5 and not work.is_completed()
        result["no exception while pending"] = work.exception() is None
    seen: list[list[float]] = []

    def chained_on(fut: Any) -> float:
        seen.append(tensor.tolist())  # the output is written before the future completes
        return float(fut.value()[0].sum())

    chained = work.get_future().then(chained_on)
    result["completed without wait()"] = _until(chained.done) and work.is_completed() and work.is_success()
    result["chained"] = (seen, chained.wait())

    # Works complete in issue order, each future after its outputs
    order: list[tuple[int, Any]] = []
    gathered = torch.zeros(world * 2)
    works = [dist.all_reduce(torch.ones(n), group=pg, async_op=True) for n in (200_000, 1, 50_000, 3)]
    works.append(dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)), group=pg, async_op=True))
    for index, each in enumerate(works):
        assert each is not None
        each.get_future().add_done_callback(lambda fut, i=index: order.append((i, fut.value()[0][:2].tolist())))
    small = torch.ones(1)
    dist.all_reduce(small, group=pg)  # a blocking call after them: they are complete when it returns
    result["blocking call after them"] = all(each.is_completed() for each in works) and small.item() == world
    result["order"] = order
    result["waited"] = all(each.wait(timedelta(seconds=20)) for each in works)

    # The main thread's own operations wait through the control plane while the completer waits
    if rank == 1:
        time.sleep(0.5)
    pending = dist.all_reduce(torch.ones(100_000), group=pg, async_op=True)
    uneven = comm.all_gather(torch.full((50_000 + rank,), float(rank)))  # point to point, beside it
    objects = comm.all_gather_object({"rank": rank})
    assert pending is not None and pending.wait()
    result["alongside"] = ([t.shape[0] for t in uneven], objects, pending.result()[0][:2].tolist())

    # An operation issued from a future's callback runs there, in the completer, without waiting for itself
    inner = torch.ones(1)

    def follow(fut: Any) -> float:
        issued = dist.all_reduce(inner, group=pg, async_op=True)
        assert issued is not None and issued.wait()
        return inner.item()

    first = dist.all_reduce(torch.ones(1), group=pg, async_op=True)
    assert first is not None
    result["issued from a callback"] = first.get_future().then(follow).wait()
    return result


def test_collectives_are_asynchronous_and_complete_in_order() -> None:
    results = run_ranks(asynchronous_works, 2, timeout=90)
    assert results[0]["returned at once"] and results[0]["no exception while pending"]
    for result in results:
        assert result["completed without wait()"], result
        assert result["chained"] == ([[3.0, 3.0, 3.0]], 9.0)
        assert result["blocking call after them"] and result["waited"]
        assert result["order"] == [(0, [2.0, 2.0]), (1, [2.0]), (2, [2.0, 2.0]), (3, [2.0, 2.0]), (4, [0.0, 0.0])]
        assert result["issued from a callback"] == 2.0
        assert result["alongside"] == ([50_000, 50_001], [{"rank": 0}, {"rank": 1}], [2.0, 2.0])


def failing_while_pending(comm: Communicator) -> dict[str, Any]:
    pg = comm.as_process_group()
    dist.all_reduce(torch.ones(1), group=pg)  # the first call of a kind checks the arguments across ranks
    if comm.rank == 1:
        with pytest.raises(RemoteError), comm.fail_together("step"):
            time.sleep(0.5)  # rank 0's all-reduce is pending meanwhile
            raise ValueError("bad batch")
        return {}
    work = dist.all_reduce(torch.ones(1), group=pg, async_op=True)
    assert work is not None
    future = work.get_future()
    with pytest.raises(RemoteError) as error:
        work.wait()
    with pytest.raises(RuntimeError) as failed:
        future.wait()
    return {
        "wait": (error.value.rank, error.value.error_type),
        "exception": work.exception() is error.value and work.is_completed() and not work.is_success(),
        "future": "RemoteError" in str(failed.value) and "bad batch" in str(failed.value),
    }


def timing_out_while_pending(comm: Communicator) -> Any:
    pg = comm.as_process_group()
    dist.all_reduce(torch.ones(1), group=pg)  # the first call of a kind checks the arguments across ranks
    if comm.rank == 1:
        time.sleep(3)  # never joins the all-reduce
        return "late"
    options = dist.AllreduceOptions()
    options.timeout = timedelta(seconds=1)
    work = pg.allreduce([torch.ones(1)], options)
    with pytest.raises(CommTimeoutError, match=r"did not complete within 0\.1 s"):
        work.wait(timedelta(seconds=0.1))  # this wait runs out; the operation goes on
    with pytest.raises(CommTimeoutError) as error:
        work.wait()
    return type(work.exception()).__name__, "did not finish within 1 s" in str(error.value)


def test_an_error_while_a_work_is_pending_reaches_its_wait_and_future() -> None:
    assert run_ranks(failing_while_pending, 2, timeout=60)[0] == {
        "wait": (1, "ValueError"),
        "exception": True,
        "future": True,
    }
    assert run_ranks(timing_out_while_pending, 2, cfg={"timeout": 20}, timeout=60) == [
        ("CommTimeoutError", True),
        "late",
    ]
