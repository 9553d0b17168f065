"""The backend and ``as_process_group()`` on one GPU: NCCL under the ``"communicator"`` backend, DDP
and FSDP2 on CUDA tensors, torch's stream semantics kept, and an abandoned NCCL group aborted.

One GPU allows one NCCL rank: these run at world size 1. Skipped without CUDA."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from communicator import Communicator
from communicator.testing import run_ranks
from communicator.transports.process_group import communicator_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device, torch.float64)


def _train(model: nn.Module, device: torch.device, steps: int = 3) -> list[torch.Tensor]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        torch.manual_seed(step)
        x = torch.randn(4, 8, device=device, dtype=torch.float64)
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    return [p.detach().cpu() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, rtol=1e-12, atol=1e-12) for x, y in zip(a, b, strict=True))


def through_the_backend(_: Communicator) -> dict[str, Any]:
    dist.init_process_group(backend="communicator")  # the launcher's variables; a GPU: NCCL under it
    comm = communicator_of(None)
    assert comm is not None
    device = torch.device("cuda", torch.cuda.current_device())
    out: dict[str, Any] = {"backend": dist.get_backend(), "under": comm.backend, "device": comm.device.type}
    t = torch.full((4,), 2.0, device=device)
    dist.all_reduce(t)
    gathered = torch.empty(4, device=device)
    dist.all_gather_into_tensor(gathered, t)
    scattered = torch.empty(4, device=device)
    dist.reduce_scatter_tensor(scattered, gathered)
    dist.broadcast(scattered, src=0)
    cpu = torch.ones(3)
    dist.all_reduce(cpu)
    dist.barrier()
    out["ops"] = (t.tolist(), scattered.tolist(), cpu.device.type, cpu.tolist())
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # the GPU busy for a while: the call must not wait for it
    dist.all_reduce(t)
    out["returned_first"] = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    ddp = DistributedDataParallel(_model(device), device_ids=[device.index])
    out["ddp"] = _same(_train(ddp, device), _train(_model(device), device))
    out["fsdp"] = _fsdp(device)
    dist.destroy_process_group()
    out["closed"] = comm.closed
    return out


def _fsdp(device: torch.device) -> bool:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _model(device)
    fully_shard(model, mesh=init_device_mesh("cuda", (1,)))
    trained = [p.full_tensor().cpu() for p in _trained_params(model, device)]
    return _same(trained, _train(_model(device), device))


def _trained_params(model: nn.Module, device: torch.device) -> list[Any]:
    _train(model, device)
    return list(model.parameters())


def test_the_backend_runs_nccl_ddp_and_fsdp2_on_one_gpu() -> None:
    (result,) = run_ranks(through_the_backend, 1, cfg={"type": "nondist"}, timeout=180)
    assert result == {
        "backend": "communicator",
        "under": "nccl",
        "device": "cuda",
        "ops": ([2.0] * 4, [2.0] * 4, "cpu", [1.0] * 3),
        "returned_first": True,
        "ddp": True,
        "fsdp": True,
        "closed": True,
    }


def nccl_process_group(comm: Communicator) -> dict[str, Any]:
    device = comm.device
    group = comm.as_process_group()
    ddp = DistributedDataParallel(_model(device), device_ids=[device.index], process_group=group)
    out: dict[str, Any] = {"ddp": _same(_train(ddp, device), _train(_model(device), device))}
    t = torch.ones(2, device=device)
    work = dist.all_reduce(t, group=group, async_op=True)
    assert work is not None
    work.wait()
    out["async"] = t.tolist()
    # The control plane gives up on an operation: the NCCL group is aborted, so kernels already
    # queued release their stream, and the communicator's later calls fail instead of hanging.
    comm.all_reduce(torch.ones(1, device=device))
    comm._abandoned(RuntimeError("a peer failed"))
    try:
        comm.all_reduce(torch.ones(1, device=device))
        torch.cuda.synchronize()
        out["after_abort"] = "returned"
    except Exception as error:  # noqa: BLE001 - whatever NCCL raises for an aborted communicator
        out["after_abort"] = type(error).__name__
    return out


def test_as_process_group_of_an_nccl_communicator() -> None:
    (result,) = run_ranks(nccl_process_group, 1, cfg={"backend": "nccl", "timeout": 30}, timeout=180)
    assert result["ddp"] is True and result["async"] == [1.0, 1.0]
    assert result["after_abort"] != "returned", result
