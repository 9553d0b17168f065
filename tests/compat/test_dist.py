"""``communicator.dist``: mmengine.dist's functions on real gloo ranks (worlds 2-4) and in one process.

Each rank function runs many checks at once (``run_ranks`` starts processes) and asserts on its
rank; what must agree across ranks is returned and compared here. ``mmengine`` is imported inside
the functions that compare against it, so the other tests do not pay for its import.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist

import communicator.dist as cdist
from communicator import CollectiveMismatchError, CommError, Communicator, ConfigError, NotMemberError, TorchComm
from communicator.compat.buckets import make_buckets
from communicator.testing import run_ranks
from communicator.testing.spawn import free_port

WORLD_SIZES = [2, 3, 4]
SUBGROUPS = [[2, 3], [1, 3]]


def _plain(value: Any) -> Any:
    """Tensors as ``(dtype, values)``, recursively, so results compare with ``==``."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype).removeprefix("torch."), value.tolist()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    return value


# -- the default group ------------------------------------------------------------------------------


def world_queries_and_collectives(comm: Communicator) -> dict[str, Any]:
    rank, world = comm.rank, comm.world_size
    last = world - 1
    assert cdist.get_dist_info() == (rank, world) == (cdist.get_rank(), cdist.get_world_size())
    assert cdist.is_main_process() == (rank == 0)
    assert cdist.is_distributed() and cdist.get_backend() == "gloo"
    assert cdist.get_default_group() is torch_dist.group.WORLD
    assert cdist.get_comm_device() == torch.device("cpu")
    assert (cdist.get_local_rank(), cdist.get_local_size()) == (rank, world)  # from the launcher
    assert cdist.master_only(lambda x: x + 1)(1) == (2 if rank == 0 else None)
    assert cdist.get_comm() is comm
    cdist.barrier()

    summed = torch.tensor([rank + 1.0, 1.0])
    assert cdist.all_reduce(summed) is None
    assert summed.tolist() == [world * (world + 1) / 2, world]
    averaged = torch.tensor([float(rank)])
    cdist.all_reduce(averaged, op="MEAN")
    assert averaged.item() == pytest.approx((world - 1) / 2)
    largest = torch.tensor([rank])
    cdist.all_reduce(largest, op="max")
    assert largest.item() == last

    uneven = cdist.all_gather(torch.arange(rank + 1))
    assert [t.tolist() for t in uneven] == [list(range(r + 1)) for r in range(world)]
    gathered = cdist.gather(torch.tensor([rank * 10]), dst=last)
    assert [t.item() for t in gathered] == ([r * 10 for r in range(world)] if rank == last else [])
    from_first = cdist.gather(torch.tensor([rank]))
    assert len(from_first) == (world if rank == 0 else 0)
    received = torch.tensor([rank])
    assert cdist.broadcast(received, src=last) is None
    assert received.item() == last

    objects: list[Any] = [f"from {rank}", {"rank": rank}]
    assert cdist.broadcast_object_list(objects, src=last) is None
    assert objects == [f"from {last}", {"rank": last}]
    assert cdist.all_gather_object({"rank": rank}) == [{"rank": r} for r in range(world)]
    assert cdist.gather_object(rank, dst=last) == (list(range(world)) if rank == last else None)

    metrics: dict[str, Any] = {"loss": torch.tensor(float(rank)), "count": torch.tensor(rank + 1)}
    reduced_in_place = metrics
    assert cdist.all_reduce_dict(metrics) is None
    assert metrics is reduced_in_place
    assert _plain(metrics) == {"loss": ("float32", sum(range(world))), "count": ("int64", sum(range(1, world + 1)))}

    dataset_size = 2 * world - 1  # the sampler pads the last rank's part with a repeat of item 0
    part = [r for r in range(dataset_size + 1) if r % world == rank]
    collected = cdist.collect_results(part, dataset_size)
    assert collected == (list(range(dataset_size)) if rank == 0 else None)
    assert cdist.collect_results(part, dataset_size, device="gpu") == collected
    assert cdist.collect_results_gpu(part, dataset_size) == collected
    assert cdist.collect_results_cpu(part, dataset_size) == collected

    params = [torch.nn.Parameter(torch.full((2,), float(rank))), torch.tensor([rank], dtype=torch.int64)]
    cdist.all_reduce_params(params)
    cdist.all_reduce_params(params, coalesce=False, op="max")
    assert _plain(params) == [("float32", [sum(range(world))] * 2), ("int64", [sum(range(world))])]
    return {"seed": cdist.sync_random_seed(), "seed_again": cdist.sync_random_seed()}


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_queries_and_collectives_on_the_default_group(world_size: int) -> None:
    results = run_ranks(world_queries_and_collectives, world_size)
    assert len({r["seed"] for r in results}) == 1
    assert len({r["seed_again"] for r in results}) == 1
    assert 0 <= results[0]["seed"] < 2**31


def coalesced_reduction(comm: Communicator) -> list[int]:
    """How many all-reduces each way of reducing parameters runs."""
    calls = []
    reduce = comm.all_reduce

    def counting(tensor: torch.Tensor, op: Any = "sum", async_op: bool = False) -> Any:
        calls.append(tensor.numel())
        return reduce(tensor, op=op, async_op=async_op)

    comm.all_reduce = counting  # type: ignore[method-assign]
    quarter_megabyte = 64 * 1024  # float32 elements
    params = [torch.full((quarter_megabyte,), float(comm.rank)) for _ in range(5)] + [torch.tensor([comm.rank])]
    counts = []
    for options in ({}, {"coalesce": False}, {"bucket_size_mb": 1}):
        calls.clear()
        cdist.all_reduce_params(params, **options)
        counts.append(len(calls))
    after_three_sums = sum(range(comm.world_size)) * comm.world_size**2
    assert all(p.min().item() == p.max().item() == after_three_sums for p in params)
    return counts


def test_all_reduce_params_runs_one_reduction_per_bucket() -> None:
    # default: one float32 bucket and one int64 bucket; per tensor: 6; 1 MB buckets: 4 + 1 + 1
    assert run_ranks(coalesced_reduction, 2) == [[2, 6, 3]] * 2


# -- subgroups: global src/dst, group-local ranks -----------------------------------------------------


def subgroup_collectives(comm: Communicator, members: list[int]) -> dict[str, Any]:
    rank = comm.rank
    group = torch_dist.new_group(members)
    sub = comm.new_group(members)
    if rank not in members:
        assert cdist.get_rank(group) == cdist.get_world_size(group) == -1
        assert not cdist.is_main_process(group)
        for handle in (group, sub):
            with pytest.raises(NotMemberError):
                cdist.all_reduce(torch.ones(1), group=handle)
            with pytest.raises(NotMemberError):
                cdist.sync_random_seed(handle)
        return {}
    first, last = members
    position = members.index(rank)
    assert cdist.get_dist_info(group) == (position, 2)
    assert cdist.is_main_process(group) == (rank == first)
    assert cdist.get_backend(group) == "gloo"

    out: dict[str, Any] = {}
    for kind, handle in (("torch group", group), ("communicator", sub)):
        total = torch.tensor([float(rank)])
        cdist.all_reduce(total, group=handle)
        assert total.item() == first + last
        assert [t.item() for t in cdist.all_gather(torch.tensor([rank]), group=handle)] == members
        to_first = cdist.gather(torch.tensor([rank]), group=handle)
        assert [t.item() for t in to_first] == (members if rank == first else [])
        to_last = cdist.gather(torch.tensor([rank]), dst=last, group=handle)
        assert [t.item() for t in to_last] == (members if rank == last else [])
        with pytest.raises(ValueError, match="not a member"):
            cdist.gather(torch.tensor([rank]), dst=0, group=handle)
        from_first, from_last = torch.tensor([rank]), torch.tensor([rank])
        cdist.broadcast(from_first, group=handle)
        cdist.broadcast(from_last, src=last, group=handle)
        assert (from_first.item(), from_last.item()) == (first, last)
        objects = [rank]
        cdist.broadcast_object_list(objects, src=last, group=handle)
        assert objects == [last]
        assert cdist.all_gather_object(rank, group=handle) == members
        assert cdist.gather_object(rank, group=handle) == (members if rank == first else None)
        assert cdist.gather_object(rank, dst=last, group=handle) == (members if rank == last else None)
        metrics = {"n": torch.tensor(rank)}
        cdist.all_reduce_dict(metrics, group=handle)
        assert metrics["n"].item() == first + last
        params = [torch.tensor([1.0])]
        cdist.all_reduce_params(params, group=handle)
        assert params[0].item() == 2.0
        cdist.barrier(handle)
        out[kind] = cdist.sync_random_seed(handle)
    return out


@pytest.mark.parametrize("members", SUBGROUPS, ids=lambda m: f"ranks{m[0]}{m[1]}")
def test_subgroups_take_global_src_and_dst(members: list[int]) -> None:
    results = run_ranks(subgroup_collectives, 4, members)
    seeds = [results[r] for r in members]
    assert seeds[0] == seeds[1] and seeds[0].keys() == {"torch group", "communicator"}
    assert all(results[r] == {} for r in range(4) if r not in members)


# -- where mmengine is wrong -------------------------------------------------------------------------


def divergences(comm: Communicator, directory: str) -> None:
    rank = comm.rank
    counts = torch.tensor([rank, rank + 1])
    with pytest.raises(ValueError, match="does not divide"):
        cdist.all_reduce(counts, op="mean")  # mmengine: tensor([0, 1]) on 2 ranks, silently wrong
    assert counts.tolist() == [rank, rank + 1]
    batches = torch.tensor(12)  # BatchNorm's num_batches_tracked: the same counter on every rank
    cdist.all_reduce_params([batches], op="mean")  # mmengine's SyncBuffersHook does this every epoch
    assert batches.item() == 12

    mixed: dict[str, Any] = {"hits": torch.tensor([rank]), "half": torch.tensor([0.5], dtype=torch.float16), "n": rank}
    cdist.all_reduce_dict(mixed)  # mmengine: every value promoted to float16 by one concatenation
    assert _plain(mixed) == {"hits": ("int64", [1]), "half": ("float16", [1.0]), "n": 1}
    means = {"hits": torch.tensor([rank])}
    cdist.all_reduce_dict(means, op="mean")  # mmengine: tensor([0]), truncated
    assert _plain(means) == {"hits": ("float64", [0.5])}
    with pytest.raises(CollectiveMismatchError, match="keys"):
        cdist.all_reduce_dict({"loss": torch.tensor(1.0)} if rank == 0 else {"acc": torch.tensor(1.0)})

    assert cdist.collect_results([None, rank], 4) == ([None, None, 0, 1] if rank == 0 else None)

    shared = Path(directory) / "shared"
    assert cdist.collect_results([rank, None], 4, tmpdir=str(shared)) == ([0, 1, None, None] if rank == 0 else None)
    comm.barrier()
    assert not shared.exists()  # created by the call, removed by it
    kept = Path(directory) / "kept"
    if rank == 0:
        kept.mkdir()
        (kept / "part_0.pkl").write_text("mmengine's part file name, not ours")
    comm.barrier()
    assert cdist.collect_results_cpu([rank], 2, tmpdir=str(kept)) == ([0, 1] if rank == 0 else None)
    comm.barrier()
    assert [p.name for p in kept.iterdir()] == ["part_0.pkl"]
    assert (kept / "part_0.pkl").read_text() == "mmengine's part file name, not ours"

    private = Path(directory) / f"private{rank}"  # not shared: rank 0 cannot see rank 1's part
    with pytest.raises(FileNotFoundError, match="not a shared directory"):
        cdist.collect_results([rank], 2, tmpdir=str(private))
    assert not private.exists()


def test_divergences_from_mmengine(tmp_path: Path) -> None:
    run_ranks(divergences, 2, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


# -- the same calls through mmengine.dist and communicator.dist --------------------------------------


def _same_calls(module: Any, rank: int, world: int) -> dict[str, Any]:
    """Calls whose answers mmengine gets right, through ``module``."""
    last = world - 1
    out: dict[str, Any] = {
        "info": module.get_dist_info(),
        "main": module.is_main_process(),
        "backend": module.get_backend(),
        "device": str(module.get_comm_device()),
        "distributed": module.is_distributed(),
        "master_only": module.master_only(lambda: "ran")(),
    }
    module.barrier()
    for op in ("sum", "max", "min", "product", "mean"):
        value = torch.tensor([rank + 1.0, 2.0 * rank])
        out[f"all_reduce {op}"] = (module.all_reduce(value, op=op), value)
    out["all_gather"] = module.all_gather(torch.tensor([rank, -rank]))
    out["gather"] = module.gather(torch.tensor([rank]), dst=0)
    value = torch.tensor([float(rank)])
    out["broadcast"] = (module.broadcast(value, src=last), value)
    objects: list[Any] = [rank, {"r": rank}]
    out["broadcast_object_list"] = (module.broadcast_object_list(objects, src=last), objects)
    floats = {"a": torch.tensor([rank + 0.5]), "b": torch.ones(2, 2) * rank}
    out["all_reduce_dict"] = (module.all_reduce_dict(floats, op="mean"), floats)
    out["all_gather_object"] = module.all_gather_object(("rank", rank))
    out["gather_object"] = module.gather_object({"rank": rank}, dst=0)
    out["collect_results"] = module.collect_results([f"item {rank + world * i}" for i in range(3)], 3 * world - 1)
    params = [torch.ones(3) * rank, torch.ones(1, dtype=torch.float64)]
    out["all_reduce_params"] = (module.all_reduce_params(params, op="sum"), params)
    seed = module.sync_random_seed()
    out["seed agrees"] = len(set(module.all_gather_object(seed))) == 1
    return _plain(out)


def compare_with_mmengine(comm: Communicator) -> None:
    import mmengine.dist

    theirs = _same_calls(mmengine.dist, comm.rank, comm.world_size)
    ours = _same_calls(cdist, comm.rank, comm.world_size)
    assert ours == theirs, {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]}


@pytest.mark.parametrize("world_size", [2, 3])
def test_same_answers_as_mmengine_on_ranks(world_size: int) -> None:
    pytest.importorskip("mmengine")
    run_ranks(compare_with_mmengine, world_size)


def test_same_answers_as_mmengine_in_one_process() -> None:
    mmengine_dist = pytest.importorskip("mmengine.dist")
    assert _same_calls(cdist, 0, 1) == _same_calls(mmengine_dist, 0, 1)
    for name in ("get_world_size", "get_rank", "get_local_size", "get_local_rank", "get_local_group", "infer_launcher"):
        assert getattr(cdist, name)() == getattr(mmengine_dist, name)(), name
    assert cdist.all_gather_object("x") == mmengine_dist.all_gather_object("x") == ["x"]
    assert cdist.collect_results([1, None, 3], 2) == mmengine_dist.collect_results([1, None, 3], 2) == [1, None]


def test_signatures_match_mmengine() -> None:
    mmengine_dist = pytest.importorskip("mmengine.dist")
    assert set(mmengine_dist.__all__) <= set(cdist.__all__)
    for name in mmengine_dist.__all__:
        theirs = inspect.signature(getattr(mmengine_dist, name)).parameters
        ours = inspect.signature(getattr(cdist, name)).parameters
        assert [(p.name, p.kind) for p in ours.values()] == [(p.name, p.kind) for p in theirs.values()], name
        for parameter in theirs.values():
            expected = None if parameter.name in ("src", "dst") else parameter.default
            assert ours[parameter.name].default == expected, (name, parameter.name)


# -- one process, no torch.distributed ---------------------------------------------------------------


def test_single_process_answers() -> None:
    assert not torch_dist.is_initialized()
    assert (cdist.get_dist_info(), cdist.get_backend(), cdist.get_default_group()) == ((0, 1), None, None)
    assert (cdist.get_local_rank(), cdist.get_local_size(), cdist.get_local_group()) == (0, 1, None)
    assert not cdist.is_distributed() and cdist.is_main_process()
    assert cdist.init_local_group(0, 8) is None and cdist.get_local_group() is None
    data = torch.arange(3)
    assert [t.tolist() for t in cdist.all_gather(data)] == [[0, 1, 2]]
    assert [t.tolist() for t in cdist.gather(data)] == [[0, 1, 2]]
    assert cdist.all_reduce(data) is None and cdist.broadcast(data) is None and data.tolist() == [0, 1, 2]
    cdist.all_reduce(data, op="mean")  # one process: every sum divides by a world of one
    assert data.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="out of range"):
        cdist.gather(data, dst=1)
    assert cdist.gather_object("x") == ["x"] and cdist.all_gather_object("x") == ["x"]
    objects = [1, "a"]
    assert cdist.broadcast_object_list(objects) is None and objects == [1, "a"]
    counts: dict[str, Any] = {"n": torch.tensor([3])}
    cdist.all_reduce_dict(counts, op="mean")
    assert _plain(counts) == {"n": ("float64", [3.0])}
    assert cdist.collect_results([1, None, 2], 2, tmpdir="/nonexistent/never/created") == [1, None]
    params = [torch.ones(2)]
    assert cdist.all_reduce_params(params) is None and params[0].tolist() == [1.0, 1.0]
    assert isinstance(cdist.get_comm(), Communicator) and not cdist.get_comm().is_distributed


def test_sync_random_seed_leaves_numpy_alone() -> None:
    np.random.seed(7)
    expected = np.random.random()
    np.random.seed(7)
    seeds = {cdist.sync_random_seed() for _ in range(5)}
    assert np.random.random() == expected
    assert len(seeds) > 1 and all(0 <= s < 2**31 for s in seeds)


def test_argument_errors_match_mmengine() -> None:
    with pytest.raises(NotImplementedError, match="device must be"):
        cdist.collect_results([1], 1, device="tpu")
    with pytest.raises(ValueError, match="tmpdir should be None"):
        cdist.collect_results([1], 1, device="gpu", tmpdir="somewhere")
    with pytest.raises(TypeError, match="needs a list"):
        cdist.broadcast_object_list((1, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a dict"):
        cdist.all_reduce_dict([("a", torch.ones(1))])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown reduce op"):
        cdist.all_reduce(torch.ones(1), op="median")
    with pytest.raises(TypeError, match="ProcessGroup"):
        cdist.all_reduce(torch.ones(1), group="world")  # type: ignore[arg-type]


def _described(value: Any) -> Any:
    """Containers and tensors by type, device, dtype and shape (meta tensors have no values)."""
    if isinstance(value, torch.Tensor):
        return "Tensor", str(value.device), value.dtype, tuple(value.shape)
    if isinstance(value, dict):
        return {key: _described(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_described(item) for item in value)
    return value


def _outcome(call: Callable[[Any], Any], module: Any) -> Any:
    try:
        return _described(call(module))
    except (TypeError, ValueError) as error:
        return type(error)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: d.get_data_device({"a": torch.ones(1), "b": [torch.zeros(2)]}),
        lambda d: d.get_data_device([]),
        lambda d: d.get_data_device("text"),
        lambda d: d.get_data_device(torch.ones(1, device="meta")),
        lambda d: d.get_data_device([torch.ones(1), torch.ones(1, device="meta")]),
        lambda d: d.cast_data_device({"a": [torch.ones(1)], "b": (torch.zeros(2),)}, torch.device("meta")),
        lambda d: d.cast_data_device({}, torch.device("cpu")),
        lambda d: d.cast_data_device(np.ones(2), torch.device("cpu")),
        lambda d: d.cast_data_device([torch.ones(1)], torch.device("cpu"), out=(torch.zeros(1),)),
        lambda d: d.cast_data_device({torch.ones(1)}, torch.device("cpu"), out={torch.zeros(1)}),
        lambda d: d.cast_data_device({"a": torch.ones(1)}, torch.device("cpu"), out={"a": 1, "b": 2}),
    ],
)
def test_data_device_helpers_match_mmengine(call: Callable[[Any], Any]) -> None:
    mmengine_dist = pytest.importorskip("mmengine.dist")
    assert _outcome(call, cdist) == _outcome(call, mmengine_dist)


def test_cast_data_device_fills_out() -> None:
    source = {"a": [torch.ones(2)], "b": torch.full((1,), 3.0)}
    out = {"a": [torch.zeros(2)], "b": torch.zeros(1)}
    moved = cdist.cast_data_device(source, torch.device("cpu"), out=out)
    assert _plain(moved) == _plain(source) == _plain(out)
    assert moved["b"] is source["b"]  # already on the device: not copied


def test_make_buckets_groups_by_dtype_and_size() -> None:
    floats = [torch.zeros(64 * 1024) for _ in range(3)]  # 0.25 MB each
    ints = [torch.zeros(1, dtype=torch.int64)]
    doubles = [torch.zeros(1, dtype=torch.float64)]
    tensors = [floats[0], ints[0], floats[1], doubles[0], floats[2]]
    assert make_buckets(tensors, -1) == [[floats[0], floats[1], floats[2]], ints, doubles]
    halves = [torch.zeros(128 * 1024) for _ in range(3)]  # 0.5 MB each
    assert [len(b) for b in make_buckets(halves, 1)] == [2, 1]
    assert [len(b) for b in make_buckets([torch.zeros(512 * 1024), *halves[:1]], 1)] == [1, 1]


# -- the node's ranks ---------------------------------------------------------------------------------


def local_groups(comm: Communicator) -> dict[str, Any]:
    rank = comm.rank
    with pytest.raises(ConfigError, match="blocks"):
        cdist.init_local_group(node_rank=0 if rank == 3 else rank // 2, num_gpus_per_node=2)
    cdist.init_local_group(node_rank=rank // 2, num_gpus_per_node=2)
    with pytest.raises(CommError, match="already"):
        cdist.init_local_group(node_rank=rank // 2, num_gpus_per_node=2)
    group = cdist.get_local_group()
    assert group is not None
    node_total = torch.tensor([rank])
    cdist.all_reduce(node_total, group=group)
    return {
        "local": (cdist.get_local_rank(), cdist.get_local_size()),
        "members": torch_dist.get_process_group_ranks(group),
        "node_total": node_total.item(),
    }


def test_init_local_group_creates_every_node_group() -> None:
    results = run_ranks(local_groups, 4)
    assert [r["local"] for r in results] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert [r["members"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["node_total"] for r in results] == [1, 1, 5, 5]


# -- initialisation and the default group ------------------------------------------------------------


def _fresh_ports(comm: Communicator, count: int) -> list[int]:
    ports: list[int] = comm.broadcast_object([free_port() for _ in range(count)] if comm.rank == 0 else None)
    return ports


def adopted_default_group(comm: Communicator) -> dict[str, Any]:
    rank, world = comm.rank, comm.world_size
    first_port, second_port = _fresh_ports(comm, 2)
    comm.close()  # as if the script had called torch.distributed.init_process_group itself
    assert not cdist.is_distributed() and cdist.get_world_size() == 1
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{first_port}", rank=rank, world_size=world)
    assert cdist.get_dist_info() == (rank, world)
    with pytest.raises(RuntimeError, match="init_local_group"):
        cdist.get_local_rank()
    adopted = cdist.get_comm()
    assert isinstance(adopted, TorchComm) and cdist.get_comm() is adopted
    total = torch.tensor([1])
    cdist.all_reduce(total)
    assert total.item() == world
    torch_dist.destroy_process_group()
    assert not cdist.is_distributed() and cdist.all_gather_object(rank) == [rank]
    assert adopted.closed
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{second_port}", rank=rank, world_size=world)
    readopted = cdist.get_comm()
    assert readopted is not adopted and cdist.all_gather_object(rank) == list(range(world))
    seed = cdist.sync_random_seed()
    torch_dist.destroy_process_group()
    return {"seed": seed}


def test_default_group_adopted_and_replaced() -> None:
    results = run_ranks(adopted_default_group, 2)
    assert results[0] == results[1]


def init_dist_pytorch(comm: Communicator) -> dict[str, Any]:
    rank, world = comm.rank, comm.world_size
    ports = _fresh_ports(comm, 2)
    comm.close()
    start_method = multiprocessing.get_start_method(allow_none=True)
    observed = []
    for port, timeout in zip(ports, (timedelta(seconds=60), 60), strict=True):
        cdist.init_dist("pytorch", backend="gloo", port=port, timeout=timeout)
        opened = cdist.get_comm()
        assert isinstance(opened, TorchComm) and opened.config.timeout == timedelta(seconds=60)
        with pytest.raises(CommError, match="already initialised"):
            cdist.init_dist("pytorch", backend="gloo")
        total = torch.tensor([rank])
        cdist.all_reduce(total)
        observed.append((cdist.get_dist_info(), cdist.get_local_rank(), cdist.get_local_size(), total.item()))
        cdist.close_dist()
        assert not torch_dist.is_initialized() and cdist.get_world_size() == 1
    assert multiprocessing.get_start_method(allow_none=True) == start_method
    assert observed == [((rank, world), rank, world, sum(range(world)))] * 2
    return {"launcher": cdist.infer_launcher()}


def test_init_dist_under_torchrun_variables() -> None:
    assert run_ranks(init_dist_pytorch, 2) == [{"launcher": "pytorch"}] * 2


def _open_mpi_variables(rank: int) -> dict[str, str]:
    """Two ranks on two nodes, as mpirun would describe them."""
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    }


def init_dist_mpi(comm: Communicator) -> dict[str, Any]:
    (port,) = _fresh_ports(comm, 1)
    comm.close()
    launcher_local_rank = os.environ["LOCAL_RANK"]
    cdist.init_dist("mpi", backend="gloo", port=port)
    seen = {
        "env": (os.environ["LOCAL_RANK"], os.environ["RANK"]),
        "local": (cdist.get_local_rank(), cdist.get_local_size()),
        "gathered": cdist.all_gather_object(os.environ["OMPI_COMM_WORLD_RANK"]),
    }
    cdist.close_dist()
    assert os.environ["LOCAL_RANK"] == launcher_local_rank
    return seen


def test_init_dist_under_mpi_sets_local_rank() -> None:
    results = run_ranks(init_dist_mpi, 2, env=_open_mpi_variables)
    assert [r["env"] for r in results] == [("0", "0"), ("0", "1")]
    assert [r["local"] for r in results] == [(0, 1), (0, 1)]
    assert results[0]["gathered"] == ["0", "1"]


def test_init_dist_refuses_bad_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="Invalid launcher type"):
        cdist.init_dist("torchrun")
    with pytest.raises(ConfigError, match="init_backend"):
        cdist.init_dist("pytorch", backend="gloo", init_backend="deepspeed")
    with pytest.raises(ConfigError, match="unknown config key"):
        cdist.init_dist("pytorch", backend="gloo", world_size=2)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="nccl"):
            cdist.init_dist("pytorch")  # mmengine's default backend, on a machine without CUDA
    assert not torch_dist.is_initialized()
