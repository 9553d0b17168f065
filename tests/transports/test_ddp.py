"""DistributedDataParallel and fully_shard over a communicator's process group train exactly as over
gloo, and a rank's failure in a step releases the others from DDP's backward with its name; the
"communicator" backend does the same behind torch.distributed's default group."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from communicator import Communicator, RemoteError
from communicator.testing import run_ranks
from communicator.transports.backend import register_backend
from communicator.transports.process_group import communicator_of

STEPS = 10
FEATURES = 6


class TwoHeads(nn.Module):
    """A small model whose second head is used on even steps only (for ``find_unused_parameters``)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh())
        self.head = nn.Linear(8, 1)
        self.extra = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        hidden = self.body(x)
        out = self.head(hidden)
        return out + self.extra(hidden) if step % 2 == 0 else out


def make_model() -> TwoHeads:
    torch.manual_seed(0)
    return TwoHeads().double()


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(4, FEATURES, dtype=torch.float64, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def averaged(group: Any) -> Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]:
    """A comm hook of one's own: the mean of the bucket, chained on the all-reduce's future (DDP
    checks a hook's annotations against its own types, which this module's are strings of)."""

    def hook(state, bucket):  # type: ignore[no-untyped-def]
        size = dist.get_world_size(group)
        work = dist.all_reduce(bucket.buffer().div_(size), group=group, async_op=True)
        assert work is not None
        return work.get_future().then(lambda fut: fut.value()[0])

    return hook


def train_ddp(comm: Communicator, group: Any, variant: str) -> list[torch.Tensor]:
    """``STEPS`` steps of DDP over ``group`` (``None``: torch's default group) in one of the variants."""
    options: dict[str, Any] = {"process_group": group}
    if variant == "small buckets":
        options["bucket_cap_mb"] = 0.0005  # a bucket per parameter or two
    if variant == "unused parameters":
        options["find_unused_parameters"] = True
    model = DistributedDataParallel(make_model(), **options)
    if variant == "comm hook":
        model.register_comm_hook(None, averaged(group))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        optimizer.zero_grad()
        if variant == "no_sync" and step % 3 != 2:  # accumulate two steps' gradients, synchronise on the third
            with model.no_sync():
                x, y = batch(comm.rank, step)
                nn.functional.mse_loss(model(x), y).backward()
            continue
        x, y = batch(comm.rank, step)
        nn.functional.mse_loss(model(x, step if variant == "unused parameters" else 0), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


VARIANTS = ("plain", "small buckets", "no_sync", "comm hook", "unused parameters")


def ddp_as_gloo(comm: Communicator, variants: tuple[str, ...]) -> dict[str, Any]:
    ran: list[str] = []
    comm.add_hook(post=lambda event: ran.append(event.op))
    differ, counted = [], {}
    for variant in variants:
        before = len(ran)
        mine = train_ddp(comm, comm.as_process_group(), variant)
        counted[variant] = ran[before:].count("all_reduce")
        native = train_ddp(comm, None, variant)
        if not all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(mine, native, strict=True)):
            differ.append(variant)
    return {"differ": differ, "all_reduces": counted}


def test_ddp_trains_as_over_gloo() -> None:
    for result in run_ranks(ddp_as_gloo, 2, VARIANTS, timeout=90):
        assert result["differ"] == []
        assert all(count >= STEPS // 3 for count in result["all_reduces"].values()), result  # they ran through it


def test_ddp_on_four_ranks() -> None:
    for result in run_ranks(ddp_as_gloo, 4, ("plain", "no_sync"), timeout=90):
        assert result["differ"] == []


def late_peer(comm: Communicator) -> dict[str, Any]:
    """Rank 1 starts its backward 2 s late: rank 0's all-reduces are issued and return at once
    (DDP goes on with its backward), and the step waits for them at its end."""
    durations: list[float] = []
    model = DistributedDataParallel(make_model(), process_group=comm.as_process_group(), bucket_cap_mb=0.0005)
    steps = []
    for step in range(4):
        if step == 2:  # the buckets are rebuilt after the first step, and a first call of each size is
            # checked across ranks (communicator.crosscheck): from here on a call only starts its all-reduce
            comm.add_hook(post=lambda event: durations.append(event.duration) if event.op == "all_reduce" else None)
        x, y = batch(comm.rank, step)
        loss = nn.functional.mse_loss(model(x), y)
        if comm.rank == 1:
            time.sleep(2.0)
        started = time.monotonic()
        loss.backward()
        steps.append(time.monotonic() - started)
    return {"calls": len(durations), "longest call": max(durations), "steps": steps[2:]}


def test_ddp_all_reduces_are_asynchronous() -> None:
    result = run_ranks(late_peer, 2, timeout=90)[0]
    assert result["calls"] >= 2, result  # a bucket a step at least
    assert result["longest call"] < 1.0, result  # each returned before the late rank's all-reduce
    assert min(result["steps"]) > 1.5, result  # and the step waited for them


def train_fsdp(comm: Communicator, group: Any) -> list[torch.Tensor]:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in (model.body[0], model.body[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(4):
        optimizer.zero_grad()
        x, y = batch(comm.rank, step)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]  # type: ignore[attr-defined]


def fsdp_as_gloo(comm: Communicator) -> bool:
    mine = train_fsdp(comm, comm.as_process_group())
    native = train_fsdp(comm, dist.group.WORLD)
    return all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(mine, native, strict=True))


def test_fsdp2_trains_as_over_gloo() -> None:
    assert run_ranks(fsdp_as_gloo, 2, timeout=90) == [True, True]


def failing_step(comm: Communicator) -> dict[str, Any]:
    model = DistributedDataParallel(make_model(), process_group=comm.as_process_group())
    where = "forward"
    try:
        for step in range(STEPS):
            with comm.fail_together(f"step {step}"):
                x, y = batch(comm.rank, step)
                if comm.rank == 1 and step == 3:
                    raise ValueError("a corrupt batch")
                loss = nn.functional.mse_loss(model(x), y)
                where = "backward"
                loss.backward()  # rank 0 waits in DDP's all-reduce for rank 1's gradients
                where = "forward"
    except RemoteError as error:
        return {"step": step, "where": where, "failed": error.ranks, "type": error.error_type}
    return {}


def test_a_rank_failing_in_forward_releases_ddp_backward() -> None:
    results = run_ranks(failing_step, 2, cfg={"timeout": 60}, timeout=90)
    assert results[0] == {"step": 3, "where": "backward", "failed": (1,), "type": "ValueError"}
    assert results[1] == {"step": 3, "where": "forward", "failed": (1,), "type": "ValueError"}


def through_the_backend(_: Communicator) -> dict[str, Any]:
    register_backend()  # importing communicator did; again does nothing
    dist.init_process_group(backend="communicator")  # torchrun's variables, set by the launcher
    comm = communicator_of(None)
    assert comm is not None and comm.as_process_group() is dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    mine, native = train_ddp(comm, None, "plain"), train_ddp(comm, gloo, "plain")
    result: dict[str, Any] = {
        "backend": dist.get_backend(),
        "same": all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(mine, native, strict=True)),
        "comm": (type(comm).__name__, comm.rank, comm.world_size, comm.backend),
    }
    with Communicator.create() as adopted:  # a view of the backend's communicator, closed alone
        result["adopted"] = (adopted.rank, adopted.all_reduce(torch.ones(1)).item(), "view" in adopted.describe())
    result["after"] = dist.all_reduce(torch.ones(1)) is None  # torch's default group still works
    model = DistributedDataParallel(make_model())
    try:
        with comm.fail_together("step"):
            if comm.rank == 1:
                raise ValueError("out of memory")
            model(batch(0, 0)[0]).sum().backward()
    except RemoteError as error:
        result["failed"] = error.ranks
    dist.destroy_process_group()
    result["closed"] = comm.closed
    return result


def test_init_process_group_with_the_communicator_backend() -> None:
    results = run_ranks(through_the_backend, 2, cfg={"type": "nondist"}, timeout=90)
    for rank, result in enumerate(results):
        assert result == {
            "backend": "communicator",
            "same": True,
            "comm": ("TorchComm", rank, 2, "gloo"),
            "failed": (1,),
            "adopted": (rank, 2.0, True),
            "after": True,
            "closed": True,
        }
