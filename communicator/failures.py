"""The failure board: how one rank's failure reaches ranks blocked in a collective, within a poll."""

from __future__ import annotations

import json
import time
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from communicator.errors import CommTimeoutError, RemoteError, RemoteFailure

if TYPE_CHECKING:
    from communicator.torch_comm import TorchComm

__all__ = ["FailureBoard"]

_BOARDS_KEY = "communicator/boards"
_POLL = timedelta(milliseconds=50)


class FailureBoard:
    """Keys in the rendezvous store, one namespace per communicator.

    A failing rank writes its error there; a rank blocked in a collective looks at it between
    waits and raises :class:`RemoteError` instead of waiting for the timeout. It also carries the
    barriers that name the ranks which did not arrive.
    """

    def __init__(self, store: dist.Store, world_size: int, name: str) -> None:
        #: The namespace's path in the store; unique in the job.
        self.name = name
        self._store = store
        self._world_size = world_size
        self._barriers = 0
        self._children = 0

    @classmethod
    def for_group(cls, comm: TorchComm) -> FailureBoard:
        """A fresh namespace agreed by every rank of ``comm`` (rank 0 draws it, then broadcasts)."""
        base = dist.distributed_c10d._get_default_store()
        number = torch.zeros(1, dtype=torch.int64)
        if comm.rank == 0:
            number[0] = base.add(_BOARDS_KEY, 1)
        dist.broadcast(number, group=comm._cpu_group, group_src=comm._group_rank_of[0])
        name = f"board{int(number.item())}/"
        return cls(dist.PrefixStore(f"communicator/{name}", base), comm.world_size, name)

    def next_child(self) -> int:
        """A number for the next batch of subgroups; every member asks in the same order, so numbers agree."""
        self._children += 1
        return self._children

    def child(self, world_size: int, name: str) -> FailureBoard:
        """A namespace for a subgroup, inside this one."""
        return FailureBoard(dist.PrefixStore(name, self._store), world_size, self.name + name)

    def post(self, rank: int, error: BaseException, where: str, fatal: bool = True) -> None:
        """Announce that ``rank`` failed with ``error``; never raises (the store may be gone)."""
        info = {
            "type": type(error).__name__,
            "message": str(error)[:2000],
            "where": where,
            "traceback": "".join(traceback.format_exception(error))[-4000:],
        }
        try:
            self._store.set(f"fail/{rank}", json.dumps(info))
            self._store.add("count", 1)
        except Exception:  # noqa: BLE001 - a dead store must not hide the original error
            pass

    def failures(self) -> list[RemoteFailure]:
        """Every failure posted so far."""
        if self._store.add("count", 0) == 0:
            return []
        found = []
        for rank in range(self._world_size):
            key = f"fail/{rank}"
            if self._store.check([key]):
                info = json.loads(self._store.get(key))
                found.append(RemoteFailure(rank, info["type"], info["message"], info["traceback"], info["where"]))
        return found

    def raise_if_failed(self, comm: TorchComm, what: str) -> None:
        """Raise ``RemoteError`` when any rank has posted a failure."""
        try:
            failures = self.failures()
        except Exception:  # noqa: BLE001 - an unreachable store means the job is going down anyway
            return
        if failures:
            raise RemoteError(failures, context=f"{what} on rank {comm.rank} abandoned")

    def barrier(self, comm: TorchComm, timeout: float) -> None:
        """A barrier through the store that names, on every rank, the ranks that did not arrive."""
        self._barriers += 1
        prefix = f"barrier{self._barriers}/"
        self._store.set(f"{prefix}{comm.rank}", "1")
        keys = [f"{prefix}{r}" for r in range(self._world_size)]
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._store.wait(keys, _POLL)
                return
            except dist.DistStoreError:
                pass
            self.raise_if_failed(comm, "barrier")
            if time.monotonic() > deadline:
                missing = [r for r, key in enumerate(keys) if not self._store.check([key])]
                raise CommTimeoutError(
                    f"barrier timed out after {timeout:g} s on rank {comm.rank}: ranks {missing} did not arrive",
                    missing_ranks=missing,
                )
