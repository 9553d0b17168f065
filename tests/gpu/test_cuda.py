"""CUDA and NCCL: one GPU, NCCL world size 1, CUDA tensors through every op, objects under NCCL.

Skipped without CUDA; run them where a GPU is available (``pytest tests/gpu``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from communicator import Communicator
from communicator.testing import check_communicator, run_ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def every_op_on_cuda(comm: Communicator) -> dict[str, object]:
    device = torch.device("cuda", 0)
    assert comm.backend == "nccl" and comm.device == device
    out: dict[str, object] = {}
    t = torch.ones(4, device=device)
    comm.all_reduce(t)
    out["all_reduce"] = t.tolist()
    cpu = torch.ones(2)  # a CPU tensor under NCCL goes to the device and back
    comm.all_reduce(cpu, op="mean")
    out["cpu_under_nccl"] = (cpu.device.type, cpu.tolist())
    out["all_gather"] = [g.tolist() for g in comm.all_gather(torch.arange(3, device=device))]
    out["gather"] = [g.tolist() for g in comm.gather(torch.arange(2, device=device), dst=0)]
    b = torch.full((2,), 5.0, device=device)
    comm.broadcast(b, src=0)
    r = torch.ones(2, device=device)
    comm.reduce(r, dst=0)
    out["broadcast_reduce"] = (b.tolist(), r.tolist())
    out["scatter"] = comm.scatter([torch.ones(2, device=device)], src=0).tolist()
    out["reduce_scatter"] = comm.reduce_scatter([torch.ones(2, device=device)]).tolist()
    out["all_to_all"] = [x.tolist() for x in comm.all_to_all([torch.ones(1, device=device)])]
    obj = comm.all_gather_object({"t": torch.ones(2, device=device), "rank": comm.rank})
    out["object_device"] = str(obj[0]["t"].device)
    out["broadcast_object"] = comm.broadcast_object({"x": 1}, src=0)
    out["dict"] = {k: float(v) for k, v in comm.all_reduce_dict({"a": torch.ones((), device=device)}).items()}
    out["collect"] = comm.collect_results([1, 2], size=2)
    out["seed_ok"] = isinstance(comm.sync_random_seed(), int)
    with torch.inference_mode():
        inside = torch.ones(1, device=device)
        comm.all_reduce(inside)
    comm.all_reduce(inside)
    comm.barrier()
    return out


def test_nccl_world_size_one_every_op() -> None:
    (result,) = run_ranks(every_op_on_cuda, 1, cfg={"backend": "nccl"}, timeout=120)
    assert result["all_reduce"] == [1.0] * 4
    assert result["cpu_under_nccl"] == ("cpu", [1.0, 1.0])
    assert result["all_gather"] == [[0, 1, 2]] and result["gather"] == [[0, 1]]
    assert result["broadcast_reduce"] == ([5.0, 5.0], [1.0, 1.0])
    assert result["scatter"] == [1.0, 1.0] and result["reduce_scatter"] == [1.0, 1.0]
    assert result["object_device"] == "cuda:0" and result["broadcast_object"] == {"x": 1}
    assert result["dict"] == {"a": 1.0} and result["collect"] == [1, 2] and result["seed_ok"]


def nccl_ranks(fn: Any, world: int, *args: Any) -> list[Any]:
    return run_ranks(fn, world, *args, cfg={"backend": "nccl", "timeout": 30}, timeout=120)


@pytest.mark.timeout(300)
def test_the_conformance_suite_passes_under_nccl() -> None:
    """Bitwise reductions (NCCL has none) run over point to point; CPU tensors' results come back
    to the CPU; every dtype moves."""
    check_communicator(nccl_ranks, (1,), ("small", "medium"))


def cpu_tensors_under_nccl(comm: Communicator) -> dict[str, object]:
    assert comm.backend == "nccl"
    t = torch.arange(3, dtype=torch.int64)
    out: dict[str, object] = {
        "all_gather": [g.device.type for g in comm.all_gather(t)],
        "same_shape": [g.device.type for g in comm.all_gather(t, same_shape=True)],
        "gather": [g.device.type for g in comm.gather(t, dst=0) or []],
        "scatter": comm.scatter([t], src=0).device.type,
        "reduce_scatter": comm.reduce_scatter([t]).device.type,
        "all_to_all": [g.device.type for g in comm.all_to_all([t])],
    }
    cuda = torch.arange(3, device=comm.device)
    out["cuda_stays"] = [g.device.type for g in comm.all_gather(cuda)]
    bits = torch.tensor([0b1010], device=comm.device)
    out["bor"] = comm.all_reduce(bits, op="bor").tolist()
    return out


def test_results_come_back_to_the_device_of_the_tensor_passed() -> None:
    (result,) = run_ranks(cpu_tensors_under_nccl, 1, cfg={"backend": "nccl"}, timeout=120)
    assert result == {
        "all_gather": ["cpu"],
        "same_shape": ["cpu"],
        "gather": ["cpu"],
        "scatter": "cpu",
        "reduce_scatter": "cpu",
        "all_to_all": ["cpu"],
        "cuda_stays": ["cuda"],
        "bor": [0b1010],
    }


def behind_busy_gpu(comm: Communicator) -> dict[str, object]:
    """Collectives queued behind a kernel that keeps the GPU busy far longer than a first wait's
    slice: each call returns while the kernel runs (torch's stream order), and none times out."""
    device = comm.device
    one = torch.ones(4, device=device)
    rows = torch.ones(2, 3, device=device)
    comm.all_reduce(torch.zeros(4, device=device))  # NCCL's communicator starts on first use
    comm.all_gather(rows, same_shape=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of clock cycles on the GPU's stream
    comm.all_reduce(one)
    comm.broadcast(one, src=0)
    handle = comm.all_reduce(rows, async_op=True)
    handle.wait()
    gathered = comm.all_gather(rows, same_shape=True)
    returned_first = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return {"returned_first": returned_first, "one": one.tolist(), "rows": rows.tolist(), "gathered": len(gathered)}


def test_collectives_behind_queued_gpu_work_are_stream_ordered() -> None:
    (result,) = run_ranks(behind_busy_gpu, 1, cfg={"backend": "nccl"}, timeout=120)
    assert result == {"returned_first": True, "one": [1.0] * 4, "rows": [[1.0] * 3] * 2, "gathered": 1}
