"""One GPU, NCCL at world size 1: what a call through the communicator costs against torch's own.

``python -m benchmarks.gpu [--rounds N] [--json PATH]`` on a machine with CUDA. Each row times the same
operation three ways in interleaved rounds — ``torch.distributed`` on the NCCL default group, the
communicator's method, and ``torch.distributed`` through ``comm.as_process_group()`` — and a DDP
training step (a 16 M-parameter MLP) natively and over the communicator's group. The ratio is the
median of per-round ratios (way ÷ torch, < 1 is faster than torch) with its 90 % interval; times are
per call, the GPU synchronised at the end of each block of calls. One GPU allows one NCCL rank, so
this measures the calling path and the stream handling, not a network.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from benchmarks.spread import spread_of
from communicator import Communicator
from communicator.launchers.local import free_port

Way = Callable[[], object]


def _block(fn: Way, calls: int) -> float:
    """Seconds per call of ``calls`` calls, the GPU's queue drained at both ends."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls


def _compare(ways: dict[str, Way], calls: int, rounds: int) -> dict[str, object]:
    """Each way once per round, in an order rotated every round; ratios to the first way."""
    names = list(ways)
    for fn in ways.values():  # warm-up: NCCL's communicator, caches, the completer thread
        _block(fn, max(1, calls // 4))
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            times[name].append(_block(ways[name], calls))
    base = names[0]
    row: dict[str, object] = {}
    for name in names:
        ratios = spread_of([t / b for t, b in zip(times[name], times[base], strict=True)])
        row[name] = {"median_us": statistics.median(times[name]) * 1e6, "ratio": ratios.text(digits=3)}
    return row


def _mlp(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 2048), nn.ReLU(), nn.Linear(2048, 10)).to(
        device
    )


def _ddp_step(model: nn.Module, x: torch.Tensor) -> Way:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    return step


def run(rounds: int) -> dict[str, object]:
    results: dict[str, object] = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),  # type: ignore[no-untyped-call]
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg()[0],
        "rounds": rounds,
    }
    # torch's own default group, adopted by the communicator: both ways run over one NCCL group
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    with Communicator.create({"timeout": 60}) as comm:
        group = comm.as_process_group()
        device = comm.device
        for label, numel, calls in (("4 B", 1, 200), ("1 MiB", 1 << 18, 100), ("64 MiB", 1 << 24, 10)):
            t = torch.ones(numel, device=device)
            out = torch.empty(numel, device=device)
            results[f"all_reduce {label}"] = _compare(
                {
                    "torch": partial(dist.all_reduce, t),
                    "comm": partial(comm.all_reduce, t),
                    "as_process_group": partial(dist.all_reduce, t, group=group),
                },
                calls,
                rounds,
            )
            results[f"broadcast {label}"] = _compare(
                {
                    "torch": partial(dist.broadcast, t, src=0),
                    "comm": partial(comm.broadcast, t, src=0),
                    "as_process_group": partial(dist.broadcast, t, src=0, group=group),
                },
                calls,
                rounds,
            )
            results[f"all_gather {label}"] = _compare(
                {
                    "torch": partial(dist.all_gather_into_tensor, out, t),
                    "comm": partial(comm.all_gather, t, same_shape=True),
                    "as_process_group": partial(dist.all_gather_into_tensor, out, t, group=group),
                },
                calls,
                rounds,
            )
        x = torch.randn(256, 2048, device=device)
        native = DistributedDataParallel(_mlp(device), device_ids=[device.index])
        ours = DistributedDataParallel(_mlp(device), device_ids=[device.index], process_group=group)
        results["parameters"] = sum(p.numel() for p in native.parameters())
        steps = {"torch": _ddp_step(native, x), "as_process_group": _ddp_step(ours, x)}
        results["ddp step"] = _compare(steps, 5, rounds)
    dist.destroy_process_group()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.gpu: no CUDA device here", file=sys.stderr)
        return 2
    results = run(args.rounds)
    text = json.dumps(results, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
