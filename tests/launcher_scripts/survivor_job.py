"""Run under a real launcher: the last rank dies (SIGKILL); do the others go on?

    srun -N1 -n3 --kill-on-bad-exit=0 python tests/launcher_scripts/survivor_job.py

Every rank joins with ``Communicator.create()``; the last one kills itself; each survivor catches
the lost peer, calls ``shrink()`` and runs an ``all_reduce`` of its old rank on the new
communicator, then prints ``SURVIVED old=R new=N world=W sum=S``.
"""

from __future__ import annotations

import os
import signal

import torch

from communicator import Communicator, PeerLostError, RemoteError


def main() -> None:
    with Communicator.create({"backend": "gloo", "timeout": 60}) as comm:
        comm.barrier()
        if comm.rank == comm.world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            comm.all_reduce(torch.ones(1))
        except (PeerLostError, RemoteError):
            shrunk = comm.shrink()
            total = shrunk.all_reduce(torch.tensor([float(comm.rank)])).item()
            print(f"SURVIVED old={comm.rank} new={shrunk.rank} world={shrunk.world_size} sum={total:g}", flush=True)


if __name__ == "__main__":
    main()
