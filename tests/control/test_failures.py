"""Fault injection with real processes: every failure ends in the documented error on every
surviving rank within a few seconds, and no process is left behind."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time
from collections.abc import Callable

import pytest
import torch

from communicator import (
    CollectiveMismatchError,
    CommError,
    CommTimeoutError,
    Communicator,
    PeerLostError,
    RemoteError,
    launch,
)
from communicator.errors import RemoteFailure
from communicator.objects.codec import PickleCodec
from communicator.objects.safe.serializer import UnsafePayloadError
from communicator.testing import run_ranks

# A released rank must not wait for the collective timeout (30 min by default); these bounds are
# generous for a loaded 2-core machine.
RELEASE_SECONDS = 10.0


def _outcome(error: BaseException) -> str:
    return type(error).__name__


def raise_inside_fail_together(comm: Communicator) -> tuple[str, float, tuple[int, ...]]:
    start = time.monotonic()
    try:
        with comm.fail_together("evaluation"):
            if comm.rank == 1:
                raise ValueError("bad batch")
            comm.all_reduce(torch.ones(1))  # the others block here, waiting for rank 1
    except RemoteError as error:
        return _outcome(error), time.monotonic() - start, error.ranks
    return "no error", time.monotonic() - start, ()


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_fail_together_releases_blocked_ranks(world_size: int) -> None:
    results = run_ranks(raise_inside_fail_together, world_size, timeout=60)
    for outcome, seconds, ranks in results:
        assert outcome == "RemoteError" and 1 in ranks
        assert seconds < RELEASE_SECONDS


class _HeldUntilRead:
    """A started barrier that reports itself unfinished until the flag exists (rank 1 has posted
    its failure, after completing the barrier) and this rank's log has read that far: the wait
    looks at its board with the failure on it before the barrier finishes here."""

    def __init__(self, work: object, comm: Communicator, flag: pathlib.Path) -> None:
        self.work, self.flag, self.control = work, flag, comm._plane()
        self.posted: int | None = None  # the records posted by then
        self.looked = False

    def wait(self, timeout: object = None) -> object:
        assert self.control is not None
        board = self.control.board
        if self.posted is None and self.flag.exists():
            self.posted = board.keys.add("events", 0)
        read = self.posted is not None and not board.log.behind(self.posted)
        if not (read and self.looked):  # and one more look at the board since its log read that far
            self.looked = read
            time.sleep(0.01)
            return False
        return self.work.wait()  # type: ignore[attr-defined]

    def is_completed(self) -> bool:
        return False


def failure_after_a_barrier_everyone_reached(comm: Communicator, folder: str) -> list[str]:
    posted, finished = pathlib.Path(folder, "posted"), pathlib.Path(folder, "finished")
    outcomes = []
    if comm.rank == 0:
        barrier = comm._barrier
        comm._barrier = lambda: _HeldUntilRead(barrier(), comm, posted)  # type: ignore[method-assign]
    try:
        comm.barrier()
        outcomes.append("barrier done")
    except CommError as error:
        outcomes.append(f"barrier: {_outcome(error)}")
    try:
        with comm.fail_together("step"):
            if comm.rank == 1:
                raise ValueError("bad shard")
            comm.all_reduce(torch.ones(1))
    except RemoteError as error:
        outcomes.append(f"released by {error.ranks}")
    except CommError as error:
        outcomes.append(_outcome(error))
    (posted if comm.rank == 1 else finished).touch()
    while comm.rank == 1 and not finished.exists():  # alive and connected until rank 0 is through
        time.sleep(0.01)
    return outcomes


def test_a_failure_posted_after_a_collective_every_rank_reached_does_not_abandon_it(tmp_path) -> None:
    # Rank 1 completes the barrier and fails in the next block; rank 0, still waiting for its own
    # part of the barrier to finish, reads the failure first. The barrier finishes; the next
    # collective is the one abandoned.
    results = run_ranks(failure_after_a_barrier_everyone_reached, 2, str(tmp_path), cfg={"timeout": 60}, timeout=60)
    assert results == [["barrier done", "released by (1,)"]] * 2, results


def fail_together_without_failure(comm: Communicator) -> list[int]:
    with comm.fail_together():
        gathered = comm.all_gather_object(comm.rank)
    return gathered


def test_fail_together_without_failure_is_transparent() -> None:
    assert run_ranks(fail_together_without_failure, 3) == [[0, 1, 2]] * 3


def bad_argument_on_one_rank(comm: Communicator) -> tuple[str, float, str]:
    start = time.monotonic()
    try:
        comm.all_reduce(torch.ones(2), op="median" if comm.rank == comm.world_size - 1 else "sum")
    except (RemoteError, ValueError) as error:
        return _outcome(error), time.monotonic() - start, str(error)
    return "no error", 0.0, ""


@pytest.mark.parametrize("world_size", [2, 4])
def test_bad_argument_on_one_rank_releases_the_others(world_size: int) -> None:
    results = run_ranks(bad_argument_on_one_rank, world_size, timeout=60)
    assert results[-1][0] == "ValueError" and "unknown reduce op" in results[-1][2]
    for outcome, seconds, message in results[:-1]:
        assert outcome == "RemoteError" and f"rank {world_size - 1} raised ValueError" in message
        assert seconds < RELEASE_SECONDS


def refused_then_disconnected(comm: Communicator, folder: str) -> str:
    """Rank 2 refuses its arguments to a gather, then closes its connections. Rank 0, waiting for
    its record point to point, reads the store only when asked to read it directly (as when its
    host's relay has not read it yet), so its transport's lost connection comes first. Every
    rank stays alive until all are through: no process found gone explains anything."""
    if comm.rank == 2:
        try:
            comm.gather_object(comm.rank, dst=comm.world_size)
            outcome = "no error"
        except ValueError:
            outcome = "refused"
        comm.close()
    else:
        control = comm._plane()
        assert control is not None
        if comm.rank == 0:
            look = control.world.log.look
            control.world.log.look = lambda direct=False: look(direct) if direct else False  # type: ignore[method-assign]
        try:
            comm.gather_object(comm.rank, dst=0)
            outcome = "no error"
        except CommError as error:
            outcome = f"{_outcome(error)}: {error}"
    pathlib.Path(folder, str(comm.rank)).touch()
    while not all(pathlib.Path(folder, str(rank)).exists() for rank in range(comm.world_size)):
        time.sleep(0.01)
    return outcome


def test_a_refusal_is_the_cause_when_the_refusing_rank_disconnects_first(tmp_path) -> None:
    *waiting, refuser = run_ranks(refused_then_disconnected, 3, str(tmp_path), cfg={"timeout": 60}, timeout=60)
    assert refuser == "refused"
    for outcome in waiting:
        assert outcome.startswith("RemoteError") and "rank 2 raised ValueError" in outcome, outcome


def _steps(*calls: Callable[[], object]) -> list[tuple[str, str]]:
    """What each call gave on this rank: ``("ok", repr(value))`` or ``(error type, message)``."""
    outcomes = []
    for call in calls:
        try:
            outcomes.append(("ok", repr(call())))
        except (CommError, TypeError, ValueError) as error:
            outcomes.append((_outcome(error), str(error)))
    return outcomes


def refuse_then_go_on(comm: Communicator, kind: str) -> list[tuple[str, str]]:
    refuses = comm.rank == comm.world_size - 1
    if kind == "tensor":  # the next all_reduce has this one's shape: the two would pair
        refused = lambda: comm.all_reduce(torch.full((2,), 10.0), op="median" if refuses else "sum")  # noqa: E731
    else:
        refused = lambda: comm.gather_object(comm.rank, dst=comm.world_size if refuses else 0)  # noqa: E731
    later = lambda: comm.all_reduce(torch.full((2,), float(comm.rank + 1))).tolist()  # noqa: E731
    return _steps(refused, later, lambda: comm.all_gather_object(comm.rank))


@pytest.mark.parametrize("kind", ["tensor", "object"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_rank_that_refused_its_arguments_never_meets_the_others_later(world_size: int, kind: str) -> None:
    # The others started the collective the last rank refused; had that rank gone on to the next
    # one, its data would have completed theirs (the sum of another operation's values, silently).
    # It waits to see what they did instead, and every communicator ends unusable, saying why.
    *others, refuser = run_ranks(refuse_then_go_on, world_size, kind, timeout=60)
    assert [error for error, _ in refuser] == ["ValueError", "CommError", "CommError"], refuser
    assert "started operation #1 (or a later one) without the ranks that refused" in refuser[1][1]
    for outcomes in others:
        assert outcomes[0][0] == "RemoteError" and f"rank {world_size - 1} raised ValueError" in outcomes[0][1]
        assert [error for error, _ in outcomes[1:]] == ["CommError", "CommError"], outcomes
        assert all("unusable" in message for _, message in outcomes[1:])


def refuse_everywhere_then_go_on(comm: Communicator) -> list[tuple[str, str]]:
    return _steps(
        lambda: comm.all_reduce(torch.ones(2), op="median"),
        lambda: comm.gather_object(comm.rank, dst=comm.world_size),
        lambda: comm.all_reduce(torch.full((2,), float(comm.rank + 1))).tolist(),
        lambda: comm.all_gather_object(comm.rank),
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_that_all_refused_their_arguments_go_on(world_size: int) -> None:
    total = float(sum(range(1, world_size + 1)))
    for outcomes in run_ranks(refuse_everywhere_then_go_on, world_size, timeout=60):
        assert [error for error, _ in outcomes[:2]] == ["ValueError", "ValueError"]
        assert outcomes[2:] == [("ok", repr([total, total])), ("ok", repr(list(range(world_size))))]


def sent_past_a_refusal(comm: Communicator) -> list[tuple[str, str]]:
    # From 3 ranks records go point to point: the root's reaches rank 2 whatever rank 1 does.
    sent = lambda: comm.broadcast_object("from 0", src=5 if comm.rank == 1 else 0)  # noqa: E731
    return _steps(sent, lambda: comm.all_reduce(torch.ones(2)).tolist())


def test_a_rank_that_got_through_a_refused_collective_leaves_the_next_one() -> None:
    root, refuser, receiver = run_ranks(sent_past_a_refusal, 3, timeout=60)
    assert [error for error, _ in refuser] == ["ValueError", "CommError"], refuser
    for outcomes in (root, receiver):  # the root's sends may or may not complete without rank 1
        if outcomes[0][0] == "ok":  # went through, with the right object; the next operation is not run
            assert outcomes[0][1] == repr("from 0") and outcomes[1][0] == "RemoteError", outcomes
            assert "ran on this rank without the ranks that refused" in outcomes[1][1]
        else:
            assert [error for error, _ in outcomes] == ["RemoteError", "CommError"], outcomes


def killed_mid_collective(comm: Communicator) -> tuple[str, float]:
    comm.barrier()
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        comm.all_reduce(torch.ones(1000))
        comm.all_gather_object("after")
    except (PeerLostError, RemoteError) as error:
        return _outcome(error), time.monotonic() - start
    return "no error", time.monotonic() - start


@pytest.mark.parametrize("world_size", [2, 4])
def test_killed_peer_is_reported_promptly(world_size: int) -> None:
    with pytest.raises(RemoteError) as caught:
        run_ranks(killed_mid_collective, world_size, timeout=60)
    died = [f for f in caught.value.failures if f.rank == 1]
    assert died and died[0].error_type == "ProcessDied" and "SIGKILL" in died[0].message


def test_survivors_of_a_kill_raise_peer_lost() -> None:
    # on_failure="continue": the survivors run to their end (a loaded machine may take longer than
    # the grace after which "stop" ends them) and return how they were released, and how soon.
    outcomes = launch(killed_mid_collective, 3, {"backend": "gloo"}, timeout=60, on_failure="continue")
    died = outcomes[1]
    assert isinstance(died, RemoteFailure) and died.error_type == "ProcessDied", died
    for rank in (0, 2):
        outcome, seconds = outcomes[rank]
        assert outcome in ("PeerLostError", "RemoteError") and seconds < RELEASE_SECONDS, outcomes[rank]


def skipped_barrier(comm: Communicator) -> tuple[str, tuple[int, ...] | None]:
    if comm.rank == comm.world_size - 1:
        time.sleep(3)  # arrives far too late
        return "late", None
    try:
        comm.barrier(timeout=1)
    except CommTimeoutError as error:
        return _outcome(error), error.missing_ranks
    return "no error", None


def test_barrier_timeout_names_missing_ranks() -> None:
    results = run_ranks(skipped_barrier, 3, timeout=60)
    assert results[:2] == [("CommTimeoutError", (2,))] * 2


def long_main_section(comm: Communicator) -> str:
    with comm.wait_for_main() as main:
        if main:
            time.sleep(5)  # longer than the communicator's 3 s timeout
    comm.barrier()
    return "done"


def test_wait_for_main_outlasts_the_collective_timeout() -> None:
    assert run_ranks(long_main_section, 3, cfg={"backend": "gloo", "timeout": 3}) == ["done"] * 3


def main_fails_in_wait_for_main(comm: Communicator) -> str:
    try:
        with comm.wait_for_main() as main:
            if main:
                raise OSError("disk full")
    except OSError:
        return "own"
    except RemoteError as error:
        return f"remote {error.error_type}"
    return "no error"


def test_wait_for_main_releases_others_when_main_fails() -> None:
    assert run_ranks(main_fails_in_wait_for_main, 3) == ["own", "remote OSError", "remote OSError"]


def mismatched_calls(comm: Communicator, case: str) -> str:
    odd = comm.rank % 2 == 1
    try:
        if case == "ops":
            if odd:
                comm.broadcast(torch.ones(2), src=0)
            else:
                comm.all_reduce(torch.ones(2))
        elif case == "shapes":
            comm.all_reduce(torch.ones(3 if odd else 2))
        elif case == "dtypes":
            comm.all_reduce(torch.ones(2, dtype=torch.float64 if odd else torch.float32))
        elif case == "keys":
            comm.all_reduce_dict({"b" if odd else "a": 1.0})
        elif case == "lengths":
            comm.broadcast_object_list([None] * (3 if odd else 2))
        elif case == "legitimate":
            comm.all_gather(torch.ones(comm.rank + 1))  # uneven shapes are allowed
            comm.all_gather_object("x" * comm.rank)
            comm.collect_results(list(range(comm.rank)), size=10)
            return "ok"
    except CollectiveMismatchError as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize("case", ["ops", "shapes", "dtypes", "keys", "lengths"])
def test_debug_mode_reports_mismatches_on_every_rank(case: str) -> None:
    results = run_ranks(mismatched_calls, 2, case, cfg={"backend": "gloo", "debug": True}, timeout=60)
    for message in results:
        assert "rank 0:" in message and "rank 1:" in message, message
        assert "test_failures.py" in message  # the call site is shown


def test_debug_mode_accepts_legitimate_differences() -> None:
    assert run_ranks(mismatched_calls, 3, "legitimate", cfg={"backend": "gloo", "debug": True}) == ["ok"] * 3


class Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def crafted_payload(comm: Communicator, marker: str) -> str:
    if comm.rank == 0:
        comm._codec = PickleCodec()  # a hostile sender that skips the safe checks
        comm.send_object(Exploit(marker), dst=1)
        return "sent"
    try:
        comm.recv_object(src=0)
    except UnsafePayloadError as error:
        return f"refused: {error}"
    return "executed"


def test_safe_mode_refuses_a_crafted_payload(tmp_path) -> None:
    marker = tmp_path / "pwned"
    results = run_ranks(crafted_payload, 2, str(marker), cfg={"backend": "gloo", "serializer": "safe"})
    assert results[0] == "sent" and results[1].startswith("refused") and "system" in results[1]
    assert not marker.exists()


def repeated_lifecycle(comm: Communicator) -> bool:
    return comm.rank >= 0


def test_create_close_repeats_and_leaks_nothing() -> None:
    import threading

    children_before = set(os.listdir("/proc"))
    for _ in range(3):
        assert run_ranks(repeated_lifecycle, 2) == [True, True]
    assert threading.active_count() <= 2  # the main thread (and at most the fork server's reader)
    leftovers = [
        d
        for d in set(os.listdir("/proc")) - children_before
        if d.isdigit()
        and "communicator-rank" in _read_proc(d, "cmdline").decode(errors="replace")
        and _descends_from_this_process(int(d))  # another job's ranks on the machine are not ours
    ]
    assert leftovers == []


def _read_proc(pid: str, name: str) -> bytes:
    try:
        return pathlib.Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:  # it ended meanwhile
        return b""


def _descends_from_this_process(pid: int) -> bool:
    while pid > 1:
        if pid == os.getpid():
            return True
        stat = _read_proc(str(pid), "stat")
        if not stat:
            return False
        pid = int(stat.rsplit(b")", 1)[1].split()[1])  # the parent's pid
    return False


def in_process_repeat(_: Communicator) -> list[str]:
    import torch.distributed as dist

    seen = []
    for _ in range(3):
        with Communicator.create({"backend": "gloo"}) as inner:
            seen.append(type(inner).__name__)  # adopted: the outer group exists
    assert dist.is_initialized()
    return seen


def test_adopting_repeatedly_in_one_process() -> None:
    assert run_ranks(in_process_repeat, 2) == [["TorchComm"] * 3] * 2


def test_failed_create_restores_everything(monkeypatch) -> None:
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")  # nobody listens; rank 1 cannot reach a store
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    start = time.monotonic()
    with pytest.raises(CommError):
        Communicator.create({"backend": "gloo", "timeout": 2})
    assert time.monotonic() - start < 30
    assert not dist.is_initialized() and "LOCAL_RANK" not in os.environ


def recreate_owned(comm: Communicator) -> list[float]:
    comm.close()  # the same processes and the same MASTER_PORT, three more times
    sums = []
    for _ in range(3):
        with Communicator.create({"backend": "gloo"}) as again:
            t = torch.ones(1)
            again.all_reduce(t)
            again.barrier()
            sums.append(t.item())
    return sums


def test_owned_communicator_can_be_created_again_in_the_same_processes() -> None:
    assert run_ranks(recreate_owned, 3, timeout=60) == [[3.0, 3.0, 3.0]] * 3


def threads_after_close(comm: Communicator) -> tuple[int, int]:
    def threads() -> int:  # the process's threads, torch's native ones included
        return len(os.listdir("/proc/self/task"))

    comm.close()
    before = threads()
    again = Communicator.create({"backend": "gloo"})
    again.all_reduce(torch.ones(3))
    again.all_gather_object(list(range(100_000)))  # large: point-to-point transfers and their helper thread
    again.split(color=again.rank % 2).all_reduce(torch.ones(1))
    again.close()
    return before, threads()


def transfer_thread_after_close(comm: Communicator, flag: str) -> tuple[str, bool]:
    # Rank 1's receive is abandoned when rank 0 fails before sending; rank 0 stays alive (its
    # connections open) until rank 1 has closed, so only closing can end the waiting thread.
    outcome = "no error"
    try:
        with comm.fail_together("step"):
            if comm.rank == 0:
                raise ValueError("no send")
            comm.recv(torch.zeros(4), src=0)
    except RemoteError as error:  # rank 0 too: fail_together raises the same error on every rank
        outcome = _outcome(error)
    comm.close()
    waiting = any(t.name == "communicator-transfers" and t.is_alive() for t in threading.enumerate())
    if comm.rank == 1:
        pathlib.Path(flag).touch()
    else:
        while not pathlib.Path(flag).exists():
            time.sleep(0.05)
    return outcome, waiting


def test_closing_ends_the_wait_on_an_abandoned_transfer(tmp_path: pathlib.Path) -> None:
    # A transfer's wait that returns while the interpreter finalises (its peer's connection closing
    # then) aborts the process: "terminate called without an active exception".
    results = run_ranks(transfer_thread_after_close, 2, str(tmp_path / "closed"), timeout=60)
    assert results == [("RemoteError", False)] * 2


def test_closing_joins_every_thread_it_started() -> None:
    # torch joins a group's worker threads only when it frees the group: a closed communicator must
    # let go of its groups, or a worker still finishing an operation when the interpreter finalises
    # aborts the process ("terminate called without an active exception").
    for before, after in run_ranks(threads_after_close, 2, timeout=60):
        assert after == before
