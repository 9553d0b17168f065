"""Result collection through a directory every rank can see (``collect_results(tmpdir=...)``).

Each rank writes its part to a file of its own, named with a token drawn for this call; rank 0
reads the parts back, in dataset order. Only what the call created is removed afterwards: the
part files, and the directory when the call created it and it is then empty. Files already in the
directory are never touched.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import uuid
from collections.abc import Sequence
from typing import Any

from communicator.base import Communicator
from communicator.ops.results import check_parts, merge_parts

__all__ = ["collect_through_directory"]


def _make_directory(path: str) -> bool:
    """Create ``path`` when it is missing; whether this call created it."""
    if os.path.isdir(path):
        return False
    os.makedirs(path, exist_ok=True)
    return True


def _part_path(directory: str, token: str, rank: int) -> str:
    return os.path.join(directory, f"communicator-results-{token}-rank{rank}.pkl")


def _read_parts(directory: str, token: str, world_size: int) -> list[list[Any]]:
    parts = []
    for rank in range(world_size):
        path = _part_path(directory, token, rank)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{directory} is not a shared directory: rank 0 cannot see the part of rank {rank} "
                f"({os.path.basename(path)}); pass a directory every rank can see, or tmpdir=None"
            )
        with open(path, "rb") as file:
            parts.append(pickle.load(file))
    return parts


def collect_through_directory(comm: Communicator, part: Sequence[Any], size: int, directory: str) -> list[Any] | None:
    """The first ``size`` results of all ranks on rank 0, in interleaved order; ``None`` elsewhere.

    Raises (on every rank):
        FileNotFoundError: rank 0 could not see another rank's part (the directory is not shared).
    """
    check_parts(part, size, "interleave", "cpu")
    created = _make_directory(directory) if comm.rank == 0 else False
    token = comm.broadcast_object(uuid.uuid4().hex if comm.rank == 0 else "")
    if comm.rank != 0:
        created = _make_directory(directory)
    own_path = _part_path(directory, token, comm.rank)
    with open(own_path, "wb") as file:
        pickle.dump(list(part), file, protocol=pickle.HIGHEST_PROTOCOL)
    comm.barrier()
    merged: list[Any] | None = None
    problem: str | None = None
    if comm.rank == 0:
        try:
            merged = merge_parts(_read_parts(directory, token, comm.world_size), size, "interleave")
        except FileNotFoundError as error:
            problem = str(error)
        finally:
            for rank in range(comm.world_size):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(_part_path(directory, token, rank))
    problem = comm.broadcast_object(problem)
    with contextlib.suppress(FileNotFoundError):
        os.remove(own_path)
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(directory)
    if problem is not None:
        raise FileNotFoundError(problem)
    return merged
