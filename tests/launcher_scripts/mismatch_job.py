"""A job in which only rank 0 calls a collective: every rank must raise and the job must end.

Each rank prints the error's first line; then the exception leaves the block (and the process).
"""

from __future__ import annotations

import torch

from communicator import CollectiveMismatchError, Communicator

with Communicator.create({"timeout": 600, "stall_seconds": 2}) as comm:
    try:
        if comm.rank == 0:
            comm.all_gather_object({"loss": 0.25})
        comm.all_reduce(torch.ones(1))
    except CollectiveMismatchError as error:
        print(f"rank {comm.rank}: {type(error).__name__}: {str(error).splitlines()[0]}", flush=True)
        raise
