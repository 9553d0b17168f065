"""Run under a real launcher: check that ``detect_launcher()`` agrees with the launcher's own variables.

    mpirun -np 2 python tests/launcher_scripts/launcher_probe.py --expect-launcher openmpi
    mpirun.mpich -n 2 python tests/launcher_scripts/launcher_probe.py --expect-launcher mpich
    srun -N1 -n2 python tests/launcher_scripts/launcher_probe.py --expect-launcher slurm
    torchrun --nproc-per-node 2 tests/launcher_scripts/launcher_probe.py --expect-launcher pytorch

Each rank prints ``OK rank=R world=W local_rank=L launcher=NAME`` and exits 0, or prints what
differs and exits 1. ``--rendezvous`` also joins a gloo group at the detected master address and
port and checks an all-reduce, proving the derived address works (torch only, no communicator
internals). Only ``communicator.launchers`` and ``communicator.errors`` are imported.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import types
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The launcher's own variables, read here independently of the library:
# rank, world size, local rank, local size (None: not a plain count for that launcher).
OWN_VARIABLES: dict[str, tuple[str, str, str, str | None]] = {
    "pytorch": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    "openmpi": (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    "mpich": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    "mvapich": (
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_SIZE",
    ),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
}


def import_launchers() -> types.ModuleType:
    """``communicator.launchers``, even while the top-level package fails to import."""
    sys.path.insert(0, str(REPO))
    try:
        return importlib.import_module("communicator.launchers")
    except Exception as error:  # noqa: BLE001 - any failure of communicator/__init__.py
        print(
            f"warning: 'import communicator' failed ({error!r}); loading the subpackage alone",
            file=sys.stderr,
        )
    for name in [m for m in sys.modules if m == "communicator" or m.startswith("communicator.")]:
        del sys.modules[name]
    package = types.ModuleType("communicator")
    package.__path__ = [str(REPO / "communicator")]
    sys.modules["communicator"] = package
    return importlib.import_module("communicator.launchers")


def expected_layout(name: str) -> dict[str, int]:
    """What the launcher's own variables say; a missing local variable (``srun --mpi=pmi2``
    sets only ``PMI_RANK``/``PMI_SIZE``) falls back to srun's ``SLURM_LOCALID``."""
    rank_var, world_var, local_var, local_size_var = OWN_VARIABLES[name]
    expected = {"rank": int(os.environ[rank_var]), "world_size": int(os.environ[world_var])}
    local_rank = os.environ.get(local_var, os.environ.get("SLURM_LOCALID"))
    if local_rank is not None:
        expected["local_rank"] = int(local_rank)
    if local_size_var is not None and local_size_var in os.environ:
        expected["local_size"] = int(os.environ[local_size_var])
    return expected


def rendezvous(rank: int, world_size: int, addr: str, port: int, under_torchrun: bool) -> str:
    """Join a gloo group at ``addr:port`` and all-reduce the ranks; an error text or ''."""
    import torch
    import torch.distributed as dist

    # torchrun's agent already serves a store on MASTER_PORT: env:// connects to it as a client.
    init_method = "env://" if under_torchrun else f"tcp://{addr}:{port}"
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        total = torch.tensor([rank], dtype=torch.int64)
        dist.all_reduce(total)
        want = world_size * (world_size - 1) // 2
        return "" if int(total.item()) == want else f"all_reduce gave {int(total.item())}, want {want}"
    finally:
        dist.destroy_process_group()


def report(line: str) -> None:
    """One write per line: launchers that merge the ranks' output keep each line whole."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expect-launcher", required=True, choices=sorted(OWN_VARIABLES))
    parser.add_argument("--rendezvous", action="store_true", help="also all-reduce over gloo")
    parser.add_argument("--show-env", action="store_true", help="print the launcher's variables")
    args = parser.parse_args()

    launchers = import_launchers()
    errors = importlib.import_module("communicator.errors")
    try:
        env = launchers.detect_launcher()
    except errors.ConfigError as error:
        report(f"FAIL detect_launcher raised ConfigError: {error}")
        return 1
    if env is None:
        report(f"FAIL no launcher detected, expected {args.expect_launcher}")
        return 1
    if args.show_env:
        for line in launchers.describe_environment():
            print(f"[{env.rank}] {line}", file=sys.stderr)
        print(f"[{env.rank}] {env.explain()}", file=sys.stderr)

    problems = []
    if env.name != args.expect_launcher:
        problems.append(f"launcher {env.name!r} != expected {args.expect_launcher!r}")
    else:
        for field, want in expected_layout(env.name).items():
            got = getattr(env, field)
            if got != want:
                problems.append(f"{field}={got} but the launcher says {want}")
    if not problems and args.rendezvous:
        failure = rendezvous(env.rank, env.world_size, env.master_addr, env.master_port, env.name == "pytorch")
        if failure:
            problems.append(failure)
    if problems:
        report(f"FAIL rank={env.rank} launcher={env.name}: " + "; ".join(problems))
        return 1
    report(f"OK rank={env.rank} world={env.world_size} local_rank={env.local_rank} launcher={env.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
