"""A short, correct job: a few collectives, then the process ends.

``--no-close``: the communicator is never closed (the process just ends), as in many scripts.
``--cycles N``: create and close a communicator N times in a row first.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from communicator import Communicator


def work(comm: Communicator) -> None:
    total = comm.all_reduce(torch.ones(3))
    everyone = comm.all_gather_object({"rank": comm.rank, "data": np.full(200_000, comm.rank, dtype=np.float32)})
    parts = comm.collect_results([comm.rank] * 3, size=3 * comm.world_size)
    pair = comm.split(color=comm.rank % 2)
    pair.all_reduce(torch.ones(1))
    assert total.tolist() == [float(comm.world_size)] * 3 and len(everyone) == comm.world_size
    if comm.rank == 0:
        assert parts is not None and len(parts) == 3 * comm.world_size
        print(f"ok on {comm.world_size} ranks", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-close", action="store_true")
    parser.add_argument("--cycles", type=int, default=0)
    args = parser.parse_args()
    for _ in range(args.cycles):
        with Communicator.create({"timeout": 60}) as comm:
            comm.all_reduce(torch.ones(1))
    if args.no_close:
        work(Communicator.create({"timeout": 60}))
        return
    with Communicator.create({"timeout": 60}) as comm:
        work(comm)


if __name__ == "__main__":
    main()
