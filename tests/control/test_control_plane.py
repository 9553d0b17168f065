"""The control plane is the base class's: a direct subclass of ``Communicator`` that supplies a
store gets bounded waits, failure signalling and stall diagnosis; a silent process is named, never
declared lost; a lost store is a ``CommError``; and a job of 16 oversubscribed ranks goes through
a failure and a stall. Real gloo ranks on 127.0.0.1."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore

from communicator import CollectiveMismatchError, CommError, Communicator, NonMemberComm, RemoteError
from communicator.control.log import Store
from communicator.control.waiting import PointToPoint, StreamOrdered, TransferWaiter, at_once, finished
from communicator.handles import Work
from communicator.testing import run_ranks

PATIENT = {"timeout": 120, "stall_seconds": 2}


_ABANDONED: list[object] = []  # groups with abandoned operations: freeing one would wait for them


class StoreComm(Communicator):
    """A direct subclass: its primitives are torch's gloo calls on a group of its own, its store a
    namespace of the rendezvous store. Nothing of ``TorchComm``'s."""

    def __init__(self, comm: Communicator) -> None:
        super().__init__(comm.config)
        self._rank, self._size = dist.get_rank(), dist.get_world_size()
        self._group = dist.new_group(backend="gloo")

    def _teardown(self, error: BaseException | None) -> None:
        if error is not None or (self._control is not None and self._control.broken is not None):
            _ABANDONED.append(self._group)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    def _control_store(self) -> Store:
        return PrefixStore("store-comm/", dist.distributed_c10d._get_default_store())

    def _barrier(self) -> Work:
        return dist.barrier(group=self._group, async_op=True)  # type: ignore[no-any-return]

    def _all_reduce(self, tensor: torch.Tensor, op: str) -> Work:
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        return dist.all_reduce(tensor, ops[op], group=self._group, async_op=True)  # type: ignore[no-any-return]

    def _broadcast(self, tensor: torch.Tensor, src: int) -> Work:
        return dist.broadcast(tensor, src, group=self._group, async_op=True)  # type: ignore[no-any-return]

    def _all_gather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> Work:
        return dist.all_gather(outputs, tensor, group=self._group, async_op=True)  # type: ignore[no-any-return]

    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        return dist.isend(tensor, dst, group=self._group, tag=tag)  # type: ignore[return-value]

    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        return dist.irecv(tensor, src, group=self._group, tag=tag)  # type: ignore[return-value]

    def _create_groups(self, groups: list[list[int]]) -> Communicator:
        return NonMemberComm.outside(self, groups)


def refusal_reaches_a_waiting_peer(comm: Communicator) -> str:
    mine = StoreComm(comm)
    try:
        if mine.rank == 0:
            time.sleep(0.5)  # rank 1 is waiting in the all_reduce by now
            mine.all_reduce(torch.ones(2), op="no-such-op")
        else:
            mine.all_reduce(torch.ones(2))
    except ValueError:
        return "refused"
    except RemoteError as error:
        return f"released by rank {error.ranks}"
    finally:
        mine.close()
    return "no error"


def test_a_direct_subclass_with_a_store_releases_peers_of_a_refusing_rank() -> None:
    assert run_ranks(refusal_reaches_a_waiting_peer, 2, cfg=PATIENT, timeout=60) == ["refused", "released by rank (0,)"]


def failure_in_fail_together(comm: Communicator) -> str:
    mine = StoreComm(comm)
    try:
        with mine.fail_together("step"):
            if mine.rank == 2:
                raise KeyError("bad batch")
            mine.all_reduce(torch.ones(1))
    except KeyError:
        return "own error"
    except RemoteError as error:
        return f"RemoteError {error.error_type}"
    finally:
        mine.close()
    return "no error"


def test_a_direct_subclass_with_a_store_fails_together() -> None:
    results = run_ranks(failure_in_fail_together, 3, cfg=PATIENT, timeout=60)
    assert results == ["RemoteError KeyError"] * 3  # the failing rank's chained to its own error


def mismatch_on_a_direct_subclass(comm: Communicator) -> str:
    mine = StoreComm(comm)
    try:
        if mine.rank == 0:
            mine.broadcast(torch.ones(3), src=0)
        else:
            mine.all_gather_object("x")
    except CollectiveMismatchError as error:
        return error.sides[0].split(" at ")[0]
    finally:
        mine.close()
    return "no error"


def test_a_direct_subclass_with_a_store_has_its_stalls_diagnosed() -> None:
    results = run_ranks(mismatch_on_a_direct_subclass, 2, cfg=PATIENT, timeout=90)
    assert results == ["in broadcast #1 float32[3]"] * 2


def bounded_without_a_store(comm: Communicator) -> str:
    mine = StoreComm(comm)
    mine._control_store = lambda: None  # type: ignore[method-assign]
    try:
        if mine.rank == 0:
            mine.barrier(timeout=1.0)  # rank 1 never arrives: the call's timeout bounds the wait
        else:
            time.sleep(3)
    except CommError as error:
        return type(error).__name__
    return "arrived"


def test_a_subclass_without_a_store_still_bounds_its_waits() -> None:
    results = run_ranks(bounded_without_a_store, 2, cfg={"timeout": 120}, timeout=60)
    assert results == ["CommTimeoutError", "arrived"]


# -- liveness -------------------------------------------------------------------------------------


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def stopped_peer(comm: Communicator) -> tuple[str, list[str]]:
    handler = Warnings()
    logging.getLogger("communicator").addHandler(handler)
    comm.all_reduce(torch.ones(1))
    helper = 0
    if comm.rank == 1:
        # Another process stops this one for longer than the stall threshold, then lets it go on.
        pid = os.getpid()
        helper = os.fork()
        if helper == 0:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(8)
            os.kill(pid, signal.SIGCONT)
            os._exit(0)
        time.sleep(1)  # stopped in here, before its part of the next collective
    total = comm.all_reduce(torch.ones(1)).item()
    if helper:
        os.waitpid(helper, 0)
    logging.getLogger("communicator").removeHandler(handler)
    return f"total {total}", handler.messages


def test_a_stopped_peer_is_named_but_never_declared_lost() -> None:
    results = run_ranks(stopped_peer, 2, cfg={"timeout": 60, "stall_seconds": 2}, timeout=90)
    assert [total for total, _ in results] == ["total 2.0"] * 2
    assert any("rank 1" in message for message in results[0][1]), results[0][1]


def store_host_dies(comm: Communicator) -> str:
    if comm.rank == 0:
        comm.barrier()
        time.sleep(0.5)
        os._exit(0)  # the store goes with this process, while rank 1 waits in a barrier through it
    comm.barrier()
    try:
        comm.barrier(timeout=30)
    except CommError as error:
        return type(error).__name__
    return "no error"


def test_a_lost_store_is_a_comm_error_never_a_raw_torch_error() -> None:
    with pytest.raises(RemoteError) as caught:
        run_ranks(store_host_dies, 2, cfg={"timeout": 60}, timeout=60)
    assert "PeerLostError" in str(caught.value) or "ProcessDied" in str(caught.value)
    assert "DistNetworkError" not in str(caught.value).split("--- rank")[0]


# -- a job of 16 ----------------------------------------------------------------------------------


def sixteen_in_a_stall(comm: Communicator) -> str:
    comm.barrier()  # every rank has joined
    try:  # ranks in different collectives at the same point
        if comm.rank == 5:  # an object collective: no argument check (see communicator.crosscheck) sees it
            comm.all_gather_object(None)
        else:
            comm.all_reduce(torch.ones(1))
    except CollectiveMismatchError as error:
        return "mismatch " + error.sides[5].split(" at ")[0]
    return "no error"


def sixteen_in_a_failure(comm: Communicator) -> str:
    comm.barrier()  # every rank has joined: none can still be connecting when the others leave
    try:
        with comm.fail_together("step"):
            if comm.rank == 11:
                raise ValueError("bad shard")
            comm.all_reduce(torch.ones(1))
    except ValueError:
        return "own error"
    except RemoteError as error:
        return f"released by {error.ranks}"
    return "no error"


@pytest.mark.timeout(240)
def test_sixteen_oversubscribed_ranks_go_through_a_failure() -> None:
    results = run_ranks(sixteen_in_a_failure, 16, cfg={"timeout": 120}, timeout=200)
    assert results == ["released by (11,)"] * 16  # the failing rank's chained to its own error


@pytest.mark.timeout(240)
def test_sixteen_oversubscribed_ranks_have_a_stall_diagnosed() -> None:
    results = run_ranks(sixteen_in_a_stall, 16, cfg=PATIENT, timeout=200)
    assert results == ["mismatch in all_gather_object #2"] * 16  # after the barrier, #1


class _WaitsRecorded:
    """A started collective that records the timeout of every wait on it."""

    def __init__(self) -> None:
        self.timeouts: list[timedelta | None] = []

    def wait(self, timeout: timedelta | None = None) -> bool:
        self.timeouts.append(timeout)
        return True

    def is_completed(self) -> bool:
        return False  # the GPU is still busy


def test_a_gpu_collective_is_never_waited_on_with_a_timeout() -> None:
    """torch takes the process down when a timed wait on an NCCL collective runs out."""
    work = _WaitsRecorded()
    ordered = StreamOrdered(work)
    assert at_once(ordered) and finished(ordered, 0.001) and ordered.wait(timedelta(seconds=1))
    assert work.timeouts == [None, None, None] and not ordered.is_completed()


class _HeldTransfer:
    """A started transfer whose wait returns (or raises) once it is let go."""

    def __init__(self, error: RuntimeError | None = None) -> None:
        self.go, self.error = threading.Event(), error

    def wait(self, timeout: timedelta | None = None) -> bool:
        self.go.wait()
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return self.go.is_set()


def test_the_transfer_thread_tells_the_caller_when_a_job_is_done() -> None:
    """A job is not done while a transfer of it waits, is done once all finished (and says so
    again when asked again, as closing does), and a failing transfer ends it with its error."""
    waiter = TransferWaiter()
    try:
        first, second = _HeldTransfer(), _HeldTransfer()
        job = waiter.start([PointToPoint(first, 1), PointToPoint(second, 2)], 5.0)
        assert not job.done(0.05)
        first.go.set()
        assert not job.done(0.05)  # the second still waits
        second.go.set()
        assert job.done(5.0) and job.done(0.001) and job.error is None
        failing = _HeldTransfer(RuntimeError("Connection closed by peer"))
        job = waiter.start([PointToPoint(failing, 1)], 5.0)
        failing.go.set()
        assert job.done(5.0) and isinstance(job.error, RuntimeError)
    finally:
        waiter.stop()
