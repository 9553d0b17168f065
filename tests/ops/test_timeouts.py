"""Every operation's own ``timeout=``: a short one ends the wait for a rank that never joins with a
``CommTimeoutError`` while the communicator's timeout is long; a bad one is refused on every rank
before anything is sent, the communicator still usable; a world of one takes it everywhere."""

from __future__ import annotations

import inspect
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from communicator import CommTimeoutError, Communicator, ConfigError, Handle, NonDistComm, RemoteError
from communicator.handles import DONE
from communicator.testing import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "examples"))
from thread_comm import run_threads

LONG = {"timeout": 120}  # the communicator's: a wait bounded by it would outlast the runner's bound
SHORT = 1.0  # the call's
RUNNER_SECONDS = 90  # a rank that hangs fails the test here, well before the communicator's timeout
ABSENT_SECONDS = 60  # how long the rank that never joins waits for the others to be done

# -- a rank that never joins ---------------------------------------------------------------------


def _all_reduce(comm: Communicator) -> object:
    return comm.all_reduce(torch.ones(2), timeout=SHORT)


def _all_gather_uneven(comm: Communicator) -> object:
    return comm.all_gather(torch.ones(comm.rank + 1), timeout=timedelta(seconds=SHORT))  # shapes unknown


def _broadcast_object(comm: Communicator) -> object:
    return comm.broadcast_object(None, src=comm.world_size - 1, timeout=SHORT)  # the source never joins


def _recv(comm: Communicator) -> object:
    return comm.recv(torch.zeros(3), src=1, timeout=SHORT)


def _all_reduce_dict(comm: Communicator) -> object:
    return comm.all_reduce_dict({"loss": torch.tensor(1.0), "n": 3}, op="mean", timeout=SHORT)


def _async_all_reduce(comm: Communicator) -> object:
    handle = comm.all_reduce(torch.ones(2), async_op=True, timeout=SHORT)  # wait() keeps to the call's
    return handle.wait()


TIMED_OUT, RELEASED = "CommTimeoutError", "released by another rank's CommTimeoutError"
CASES: dict[str, tuple[Callable[[Communicator], object], int]] = {
    "all_reduce": (_all_reduce, 3),
    "all_gather of unknown shapes": (_all_gather_uneven, 2),
    "broadcast_object": (_broadcast_object, 2),
    "recv": (_recv, 2),
    "all_reduce_dict": (_all_reduce_dict, 2),
    "async all_reduce, its handle's wait": (_async_all_reduce, 2),
}


def one_never_joins(comm: Communicator, case: str, folder: str) -> str:
    """The last rank never calls the operation; the others must raise at the call's timeout. Each
    says in ``folder`` that it is done, and the absent rank stays out of any operation until then,
    so that nothing but the timeout could end the others' wait (the communicator is left unusable
    after an abandoned operation: the block just ends)."""
    operation, _ = CASES[case]
    absent = comm.world_size - 1
    if comm.rank == absent:
        deadline = time.monotonic() + ABSENT_SECONDS
        others = [Path(folder, f"done-{r}") for r in range(comm.world_size) if r != absent]
        while not all(path.exists() for path in others) and time.monotonic() < deadline:
            time.sleep(0.05)
        return "absent"
    within = f"within {SHORT:g} s"  # the call's timeout, not the communicator's
    try:
        operation(comm)
        outcome = "returned"
    except CommTimeoutError as error:
        outcome = TIMED_OUT if within in str(error) else f"another timeout: {error}"
    except RemoteError as error:  # another waiting rank timed out first, and its failure released this one
        timeouts = all(f.error_type == "CommTimeoutError" and within in f.message for f in error.failures)
        outcome = RELEASED if timeouts else f"RemoteError: {error}"
    except Exception as error:  # noqa: BLE001 - reported, so that the test names it
        outcome = f"{type(error).__name__}: {error}"
    Path(folder, f"done-{comm.rank}").touch()
    return outcome


@pytest.mark.timeout(RUNNER_SECONDS + 30)
@pytest.mark.parametrize("case", list(CASES))
def test_a_rank_that_never_joins_ends_the_wait_at_the_calls_timeout(case: str, tmp_path: Path) -> None:
    world = CASES[case][1]
    *waiting, absent = run_ranks(one_never_joins, world, case, str(tmp_path), cfg=LONG, timeout=RUNNER_SECONDS)
    assert absent == "absent"
    assert TIMED_OUT in waiting and set(waiting) <= {TIMED_OUT, RELEASED}, waiting


def without_a_control_plane(comm: Communicator, done: threading.Event) -> str:
    """As above on a communicator without a control plane (ranks as threads, no store)."""
    if comm.rank == 1:
        done.wait(ABSENT_SECONDS)
        return "absent"
    try:
        for operation in (_all_reduce, _all_gather_uneven, _broadcast_object, _recv, _async_all_reduce):
            with pytest.raises(CommTimeoutError, match=f"within {SHORT:g} s"):
                operation(comm)
    finally:
        done.set()
    return TIMED_OUT


def test_a_communicator_without_a_control_plane_keeps_to_the_calls_timeout_too() -> None:
    results = run_threads(without_a_control_plane, 2, threading.Event(), timeout=LONG["timeout"])
    assert results == [TIMED_OUT, "absent"]


# -- a bad value -----------------------------------------------------------------------------------

BAD: list[tuple[object, type[Exception]]] = [
    (-1, ConfigError),
    (0, ConfigError),
    (timedelta(0), ConfigError),
    (float("nan"), ConfigError),
    (float("inf"), ConfigError),
    ("1", TypeError),
    (True, TypeError),
    ([1.0], TypeError),
]


def every_operation(comm: Communicator, timeout: Any) -> dict[str, Callable[[], object]]:
    """A call of every public operation, each with ``timeout``, by name."""
    t, peer = torch.ones(2), (comm.rank + 1) % comm.world_size
    parts = [torch.ones(2)] * comm.world_size
    return {
        "all_reduce": lambda: comm.all_reduce(t, timeout=timeout),
        "reduce": lambda: comm.reduce(t, timeout=timeout),
        "broadcast": lambda: comm.broadcast(t, timeout=timeout),
        "all_gather": lambda: comm.all_gather(t, timeout=timeout),
        "gather": lambda: comm.gather(t, timeout=timeout),
        "scatter": lambda: comm.scatter(parts if comm.rank == 0 else None, timeout=timeout),
        "reduce_scatter": lambda: comm.reduce_scatter(parts, timeout=timeout),
        "all_to_all": lambda: comm.all_to_all(parts, timeout=timeout),
        "barrier": lambda: comm.barrier(timeout=timeout),
        "isend": lambda: comm.isend(t, peer, timeout=timeout),
        "irecv": lambda: comm.irecv(t, peer, timeout=timeout),
        "send": lambda: comm.send(t, peer, timeout=timeout),
        "recv": lambda: comm.recv(t, peer, timeout=timeout),
        "all_gather_object": lambda: comm.all_gather_object(1, timeout=timeout),
        "gather_object": lambda: comm.gather_object(1, timeout=timeout),
        "broadcast_object": lambda: comm.broadcast_object(1, timeout=timeout),
        "broadcast_object_list": lambda: comm.broadcast_object_list([1], timeout=timeout),
        "scatter_object": lambda: comm.scatter_object([1] * comm.world_size, timeout=timeout),
        "send_object": lambda: comm.send_object(1, peer, timeout=timeout),
        "recv_object": lambda: comm.recv_object(peer, timeout=timeout),
        "all_reduce_dict": lambda: comm.all_reduce_dict({"n": 1}, timeout=timeout),
        "collect_results": lambda: comm.collect_results([1], 1, timeout=timeout),
        "sync_random_seed": lambda: comm.sync_random_seed(timeout=timeout),
        "check_random_states": lambda: comm.check_random_states(timeout=timeout),
        "new_group": lambda: comm.new_group(list(range(comm.world_size)), timeout=timeout),
        "split": lambda: comm.split(0, timeout=timeout),
        "grid": lambda: comm.grid((1, comm.world_size), timeout=timeout),
        "main_process_first": lambda: _block(comm.main_process_first(timeout=timeout)),
        "wait_for_main": lambda: _block(comm.wait_for_main(timeout=timeout)),
        "fail_together": lambda: _block(comm.fail_together(timeout=timeout)),
    }


def _block(manager: AbstractContextManager[object]) -> None:
    with manager:
        pass


def refuse_bad_timeouts(comm: Communicator) -> list[float]:
    for value, error in BAD:
        for name, call in every_operation(comm, value).items():
            with pytest.raises(error, match=rf"{name}: timeout=.* is invalid"):
                call()
    with pytest.raises(ConfigError, match="barrier: timeout=-1 is invalid"):
        comm.barrier(-1)  # barrier's is also positional
    handle = comm.all_reduce(torch.ones(1), async_op=True)
    with pytest.raises(TypeError, match="wait: timeout='1' is invalid"):
        handle.wait(timeout="1")  # type: ignore[arg-type]
    handle.wait()
    # Still usable, and ranks may pass different timeouts (debug mode does not compare them)
    mine: list[Any] = [None, 30, timedelta(seconds=40)]
    total = comm.all_reduce(torch.ones(1), timeout=mine[comm.rank % len(mine)])
    return [total.item(), *comm.all_gather_object(comm.rank, timeout=30 + comm.rank)]


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_a_bad_timeout_is_refused_on_every_rank_before_communicating(debug: bool) -> None:
    results = run_ranks(refuse_bad_timeouts, 2, cfg={**LONG, "debug": debug}, timeout=RUNNER_SECONDS)
    assert results == [[2.0, 0, 1]] * 2


# -- a world of one, the signatures and the handle -------------------------------------------------


def test_a_world_of_one_takes_a_timeout_everywhere() -> None:
    with NonDistComm() as comm:
        for timeout in (5, 2.5, timedelta(seconds=5), None):
            for name, call in every_operation(comm, timeout).items():
                if name in ("isend", "irecv", "send", "recv", "send_object", "recv_object"):
                    with pytest.raises(ValueError, match="this rank"):  # a world of one has no peer
                        call()
                    continue
                call()
            assert comm.all_reduce(torch.ones(1), async_op=True, timeout=timeout).wait().item() == 1.0
            assert comm._calls.timeout is None  # a call's timeout ends with the call
        assert comm.all_reduce(torch.ones(1)).item() == 1.0


def test_every_public_operation_takes_a_keyword_timeout() -> None:
    for name, spec in Communicator._specs.items():
        if name.startswith("_"):
            continue
        parameter = spec.signature.parameters.get("timeout")
        assert parameter is not None and parameter.default is None, name
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY or name == "barrier", name
    for name in ("main_process_first", "wait_for_main", "fail_together"):
        assert "timeout" in inspect.signature(getattr(Communicator, name)).parameters, name


def test_a_handle_waits_with_its_calls_timeout_unless_given_one() -> None:
    limits: list[float | None] = []

    def waiter(works: Sequence[Any], limit: float | None) -> None:
        limits.append(limit)

    Handle([DONE], lambda: 1, waiter, 7.0).wait()
    Handle([DONE], lambda: 1, waiter, 7.0).wait(timeout=timedelta(seconds=2))
    Handle([DONE], lambda: 1, waiter).wait()
    assert limits == [7.0, 2.0, None]
