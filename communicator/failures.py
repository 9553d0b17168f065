"""The failure board: how one rank's failure reaches ranks blocked in a collective, within a poll."""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from typing import TYPE_CHECKING

import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore, Store

from communicator.errors import CommError, CommTimeoutError, PeerLostError, RemoteError, RemoteFailure

if TYPE_CHECKING:
    from communicator.torch_comm import TorchComm

__all__ = ["FailureBoard"]

_BOARDS_KEY = "communicator/boards"
_POLL_SECONDS = 0.05


class FailureBoard:
    """Keys in the rendezvous store, one namespace per communicator.

    A failing rank writes its error there; a rank blocked in a collective looks at it between
    waits and raises :class:`RemoteError` instead of waiting for the timeout. It also carries the
    barriers that name the ranks which did not arrive.
    """

    _made = 0  # boards made in this process: every rank counts the same way

    def __init__(self, store: Store | _ClosedStore, world_size: int, name: str) -> None:
        #: The namespace's path in the store; unique in the job.
        self.name = name
        self._store = store
        self._world_size = world_size
        self._barriers = 0
        self._children = 0
        self._processes: dict[int, int] | None = None

    @classmethod
    def for_group(cls, comm: TorchComm) -> FailureBoard:
        """A fresh namespace for a communicator over the default group, without communicating:
        ranks create communicators in the same order (as torch requires of groups), so the
        count of boards made so far in this process names the same namespace on every rank."""
        base = dist.distributed_c10d._get_default_store()
        cls._made += 1
        name = f"board{cls._made}/"
        world = dist.distributed_c10d._get_default_group()
        return cls(PrefixStore(f"communicator/{world.group_name}/{name}", base), comm.world_size, name)

    def release(self) -> None:
        """Drop the store: a store still referenced when the interpreter exits is torn down too late
        (rank 0's server thread then aborts the process)."""
        self._store = _ClosedStore()

    def next_child(self) -> int:
        """A number for the next batch of subgroups; every member asks in the same order, so numbers agree."""
        self._children += 1
        return self._children

    def child(self, world_size: int, name: str) -> FailureBoard:
        """A namespace for a subgroup, inside this one."""
        if isinstance(self._store, _ClosedStore):
            raise CommError("the communicator is closed: no new subgroups")
        return FailureBoard(PrefixStore(name, self._store), world_size, self.name + name)

    def post(self, rank: int, error: BaseException, where: str) -> None:
        """Announce that ``rank`` failed for good; never raises (the store may be gone)."""
        self._post(f"fail/{rank}", "count", error, where)

    def post_input(self, rank: int, seq: int, error: BaseException, where: str) -> None:
        """Announce that ``rank`` refused its arguments to collective number ``seq``."""
        self._post(f"input/{seq}/{rank}", f"input/{seq}/count", error, where)

    def _post(self, key: str, counter: str, error: BaseException, where: str) -> None:
        info = {
            "type": type(error).__name__,
            "message": str(error)[:2000],
            "where": where,
            "traceback": "".join(traceback.format_exception(error))[-4000:],
        }
        try:
            if not self._store.check([key]):  # a rank's first failure is the one worth reporting
                self._store.set(key, json.dumps(info))
                self._store.add(counter, 1)
        except Exception:  # noqa: BLE001 - a dead store must not hide the original error
            pass

    def _read(self, prefix: str, counter: str) -> list[RemoteFailure]:
        if self._store.add(counter, 0) == 0:
            return []
        found = []
        for rank in range(self._world_size):
            key = f"{prefix}{rank}"
            if self._store.check([key]):
                info = json.loads(self._store.get(key))
                found.append(RemoteFailure(rank, info["type"], info["message"], info["traceback"], info["where"]))
        return found

    def failures(self, seq: int | None = None) -> list[RemoteFailure]:
        """Failures posted for good, and refused arguments of collective number ``seq``."""
        found = self._read("fail/", "count")
        if seq is not None:
            seen = {f.rank for f in found}
            found += [f for f in self._read(f"input/{seq}/", f"input/{seq}/count") if f.rank not in seen]
        return found

    def raise_if_failed(self, comm: TorchComm, what: str) -> None:
        """Raise ``RemoteError`` when a rank failed, or refused its part of the current collective."""
        try:
            failures = [f for f in self.failures(comm._seq) if f.rank != comm.rank]
        except Exception:  # noqa: BLE001 - the store lives on rank 0: an unreachable one means rank 0 is gone
            raise PeerLostError(
                f"{what} on rank {comm.rank}: the rendezvous store (hosted by world rank 0) is unreachable"
            ) from None
        if failures:
            raise RemoteError(failures, context=f"{what} on rank {comm.rank} abandoned")

    def depart(self, comm: TorchComm, linger: float) -> None:
        """Say this rank is leaving; world rank 0, which hosts the store, waits (at most ``linger``
        seconds) until every other rank has left or died, so that they can still read the board."""
        try:
            self._store.set(f"departed/{comm.rank}", "1")
            if comm.global_ranks[comm.rank] != 0:
                return
            self._processes_on_host(comm)
            deadline = time.monotonic() + linger
            for rank in range(self._world_size):
                key = f"departed/{rank}"
                while not self._store.check([key]) and time.monotonic() < deadline:
                    pid = (self._processes or {}).get(rank)
                    if pid is not None and not _alive(pid):
                        break
                    time.sleep(0.02)
        except Exception:  # noqa: BLE001 - leaving must never fail
            pass

    def _processes_on_host(self, comm: TorchComm) -> dict[int, int]:
        if self._processes is None:
            host = socket.gethostname()
            self._processes = {}
            for rank in range(self._world_size):
                key = f"process/{rank}"
                if rank != comm.rank and self._store.check([key]):
                    peer_host, pid = self._store.get(key).decode().split()
                    if peer_host == host:
                        self._processes[rank] = int(pid)
        return self._processes

    def announce_process(self, rank: int) -> None:
        """Record this rank's host and process id, so peers can tell when it dies."""
        self._store.set(f"process/{rank}", f"{socket.gethostname()} {os.getpid()}")

    def raise_if_peer_died(self, comm: TorchComm, what: str) -> None:
        """Raise ``PeerLostError`` when a rank on this host has exited (other hosts: gloo notices)."""
        for rank, pid in self._processes_on_host(comm).items():
            if not _alive(pid):
                raise PeerLostError(f"{what} on rank {comm.rank}: rank {rank} (pid {pid}) has exited; a peer was lost")

    def barrier(self, comm: TorchComm, timeout: float) -> None:
        """A barrier through the store that names, on every rank, the ranks that did not arrive."""
        self._barriers += 1
        prefix = f"barrier{self._barriers}/"
        self._store.set(f"{prefix}{comm.rank}", "1")
        keys = [f"{prefix}{r}" for r in range(self._world_size)]
        deadline = time.monotonic() + timeout
        while True:
            # check() and a sleep, not wait(): a timed-out wait() logs a warning in c10d every time
            if self._store.check(keys):
                return
            time.sleep(_POLL_SECONDS)
            self.raise_if_failed(comm, "barrier")
            self.raise_if_peer_died(comm, "barrier")
            if time.monotonic() > deadline:
                missing = [r for r, key in enumerate(keys) if not self._store.check([key])]
                raise CommTimeoutError(
                    f"barrier timed out after {timeout:g} s on rank {comm.rank}: ranks {missing} did not arrive",
                    missing_ranks=missing,
                )


def _alive(pid: int) -> bool:
    """Whether process ``pid`` is running (a zombie, dead but not yet reaped, counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class _ClosedStore:
    """Stands in for the store after ``release()``: reads find nothing, writes go nowhere."""

    def check(self, keys: list[str]) -> bool:
        return False

    def add(self, key: str, value: int) -> int:
        return 0

    def set(self, key: str, value: str) -> None:
        return None

    def get(self, key: str) -> bytes:
        raise KeyError(key)
