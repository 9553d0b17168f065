"""Run under a real launcher: ``Communicator.create()`` joins the job; check it against the launcher.

    torchrun --nproc-per-node 2 tests/launcher_scripts/comm_job.py --launcher pytorch
    mpirun -np 2 python tests/launcher_scripts/comm_job.py --launcher openmpi
    mpirun.mpich -n 2 python tests/launcher_scripts/comm_job.py --launcher mpich
    srun -N1 -n2 python tests/launcher_scripts/comm_job.py --launcher slurm

Inside ``with Communicator.create() as comm:`` each rank checks that the communicator's rank,
world size, local rank and local size are what the launcher's own variables say, that
``describe()`` names the launcher, that torchrun's names (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ...) are set to the communicator's values, and that a few collectives give the
values they must (all_reduce, all_gather_object, collect_results). After the block, those
variables must be exactly as before (under MPI and Slurm: absent before and after, present
inside) and the default process group must be gone.

With ``--check`` the ranks also run what ``communicator check`` runs (``check_job``: every
collective, verified) inside the same block, and rank 0 prints its table.

Each rank prints ``OK rank=R world=W local_rank=L launcher=NAME`` and exits 0, or prints
``FAIL rank=R ...: what differs`` and exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the repository's package, then launcher_probe

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from launcher_probe import OWN_VARIABLES, expected_layout, report  # noqa: E402

from communicator import Communicator  # noqa: E402
from communicator.check import Aborted, check_job  # noqa: E402

#: The variables the communicator sets while its block is open, under every launcher.
TORCHRUN_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def snapshot() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in TORCHRUN_NAMES}


def collectives(comm: Communicator) -> list[str]:
    """A few collectives whose results follow from the rank numbers; what went wrong."""
    problems = []
    world = comm.world_size
    total = comm.all_reduce(torch.tensor([comm.rank + 1], dtype=torch.int64))
    if int(total.item()) != world * (world + 1) // 2:
        problems.append(f"all_reduce gave {int(total.item())}, expected {world * (world + 1) // 2}")
    gathered = comm.all_gather_object({"rank": comm.rank, "pid": os.getpid()})
    if [item["rank"] for item in gathered] != list(range(world)) or len({item["pid"] for item in gathered}) != world:
        problems.append(f"all_gather_object gave {gathered}")
    size = 5 * world - 1  # DistributedSampler pads the last round by repeating item 0
    part = [f"item{i % size}" for i in range(comm.rank, 5 * world, world)]
    collected = comm.collect_results(part, size=size)
    expected = [f"item{i}" for i in range(size)] if comm.rank == 0 else None
    if collected != expected:
        problems.append(f"collect_results gave {collected}, expected {expected}")
    return problems


def inside_the_block(comm: Communicator, launcher: str, expected: dict[str, int]) -> list[str]:
    """The layout against the launcher's own variables, the variables set, a few collectives."""
    inside = snapshot()
    layout = {
        "rank": comm.rank,
        "world_size": comm.world_size,
        "local_rank": comm.local_rank,
        "local_size": comm.local_size,
    }
    problems = [
        f"{field}={layout[field]} but the launcher says {want}"
        for field, want in expected.items()
        if layout[field] != want
    ]
    if type(comm).__name__ != "TorchComm" or f"{launcher}:" not in comm.describe():
        problems.append(f"describe() does not name a TorchComm from {launcher}: {comm.describe()!r}")
    for name, value in (("RANK", comm.rank), ("WORLD_SIZE", comm.world_size), ("LOCAL_RANK", comm.local_rank)):
        if inside[name] != str(value):
            problems.append(f"inside the block {name}={inside[name]!r}, expected {str(value)!r}")
    return problems + collectives(comm)  # every rank runs them, whatever it found above


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", required=True, choices=sorted(OWN_VARIABLES))
    parser.add_argument("--check", action="store_true", help="also run every collective as `communicator check` does")
    args = parser.parse_args()

    expected = expected_layout(args.launcher)
    before = snapshot()
    problems: list[str] = []
    if args.launcher != "pytorch" and before["LOCAL_RANK"] is not None:
        problems.append(f"LOCAL_RANK={before['LOCAL_RANK']!r} before the block; {args.launcher} does not set it")

    rank = world = local_rank = -1
    try:
        with Communicator.create() as comm:
            rank, world, local_rank = comm.rank, comm.world_size, comm.local_rank
            problems += inside_the_block(comm, args.launcher, expected)
            if args.check and check_job(comm, repeat=0) != 0:
                problems.append("communicator check failed (see rank 0's table)")
    except Aborted as stopped:
        report(f"FAIL rank={rank} launcher={args.launcher}: communicator check stopped: {stopped}")
        return 1

    after = snapshot()
    if after != before:
        changed = {name: (before[name], after[name]) for name in TORCHRUN_NAMES if before[name] != after[name]}
        problems.append(f"not restored after the block (before, after): {changed}")
    if dist.is_initialized():
        problems.append("the default process group is still initialised after the block")
    if problems:
        report(f"FAIL rank={rank} launcher={args.launcher}: " + "; ".join(problems))
        return 1
    report(f"OK rank={rank} world={world} local_rank={local_rank} launcher={args.launcher}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
