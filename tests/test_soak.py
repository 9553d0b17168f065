"""A bounded soak: thousands of mixed collectives on 4 ranks with random payloads, every result
checked, memory flat. ``COMMUNICATOR_SOAK_SECONDS`` sets the length (default 10; longer runs find rarer races)."""

from __future__ import annotations

import os
import resource
import time

import numpy as np
import torch

from communicator import Communicator
from communicator.testing import run_ranks

SECONDS = float(os.environ.get("COMMUNICATOR_SOAK_SECONDS", "10"))


def _payload(rng: np.random.Generator, rank: int) -> dict[str, object]:
    size = int(rng.choice([0, 3, 1000, 40_000]))
    return {"rank": rank, "array": np.full(size, rank, dtype=np.float32), "none": None, "text": "r" * (size % 7)}


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def soak(comm: Communicator, seconds: float) -> dict[str, float]:
    world, rank = comm.world_size, comm.rank
    shared = np.random.default_rng(comm.sync_random_seed())  # the same choices on every rank
    own = np.random.default_rng(rank)
    operations = 0
    deadline = time.monotonic() + seconds
    rss_after_warmup = 0.0
    while True:
        # every rank must agree to stop at the same operation
        if operations % 50 == 0 and comm.all_gather_object(time.monotonic() > deadline)[0]:
            break
        kind = int(shared.integers(0, 8))
        root = int(shared.integers(0, world))
        if kind == 0:
            t = torch.full((int(shared.integers(1, 5000)),), float(rank))
            comm.all_reduce(t)
            assert bool((t == sum(range(world))).all())
        elif kind == 1:
            parts = comm.all_gather(torch.full((int(own.integers(0, 3000)),), rank, dtype=torch.int32))
            assert all(bool((p == r).all()) for r, p in enumerate(parts))
        elif kind == 2:
            got = comm.all_gather_object(_payload(own, rank))
            assert [g["rank"] for g in got] == list(range(world))
            assert all(bool((g["array"] == r).all()) for r, g in enumerate(got))
        elif kind == 3:
            got = comm.gather_object(_payload(own, rank), dst=root)
            assert (got is None) == (rank != root)
            assert got is None or [g["rank"] for g in got] == list(range(world))
        elif kind == 4:
            value = comm.broadcast_object(_payload(own, root) if rank == root else None, src=root)
            assert value["rank"] == root
        elif kind == 5:
            n = int(shared.integers(0, 200))
            part = [i for i in range(rank, n, world)]
            collected = comm.collect_results(part, size=n, dst=root)
            assert collected == (list(range(n)) if rank == root else None)
        elif kind == 6:
            reduced = comm.all_reduce_dict({"a": torch.tensor(float(rank)), "b": {"c": rank}})
            assert reduced["a"].item() == sum(range(world)) and reduced["b"]["c"] == sum(range(world))
        else:
            sub = comm.split(color=rank % 2)
            assert sub.all_gather_object(rank) == [r for r in range(world) if r % 2 == rank % 2]
        operations += 1
        if operations == 200:
            rss_after_warmup = _rss_mb()
    return {"operations": operations, "growth_mb": _rss_mb() - rss_after_warmup}


def test_soak_four_ranks() -> None:
    results = run_ranks(soak, 4, SECONDS, timeout=SECONDS + 120)
    counts = {r["operations"] for r in results}
    assert len(counts) == 1 and counts.pop() >= 200
    assert all(r["growth_mb"] < 64 for r in results), results
