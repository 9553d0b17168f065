"""Going on after a lost rank: ``shrink()``, ``agree()`` and ``revoke()`` on real gloo ranks.

Ranks die by SIGKILL (no exception, no goodbye). ``launch(..., on_failure="continue")`` lets the
survivors run on; a dead rank's entry is its ``RemoteFailure``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import TCPStore

import communicator.control.survivors as survivors
from communicator import (
    CommConfig,
    CommError,
    Communicator,
    ConfigError,
    ExcludedError,
    NonDistComm,
    PeerLostError,
    RemoteError,
    RevokedError,
    launch,
)
from communicator.errors import RemoteFailure
from communicator.testing.conformance import catalogue, in_subgroup

CFG = {"backend": "gloo", "timeout": 60}
TIMEOUT = 120


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _after_shrink(comm: Communicator, old_rank: int, reason: str) -> dict[str, Any]:
    """What the tests check on a shrunk communicator: its layout, and every operation's result."""
    return {
        "old": old_rank,
        "rank": comm.rank,
        "size": comm.world_size,
        "class": type(comm).__name__,
        "reason": reason,
        "sum": comm.all_reduce(torch.tensor([float(old_rank)])).item(),
        "wrong": catalogue(comm, ("small",)) + in_subgroup(comm, ("small",)),
        "local": comm.local_comm.world_size,
    }


def lose_in_collective(comm: Communicator, victims: tuple[int, ...]) -> dict[str, Any]:
    comm.barrier()
    if comm.rank in victims:
        _die()
    try:
        comm.all_reduce(torch.ones(1000))
    except (PeerLostError, RemoteError) as error:
        reason = type(error).__name__
    else:
        return {"old": comm.rank, "reason": "no error"}
    with pytest.raises(CommError, match="shrink"):  # the old communicator is unusable: it says what to do
        comm.all_reduce(torch.ones(1))
    return _after_shrink(comm.shrink(), comm.rank, reason)


def _survived(results: list[Any], victims: tuple[int, ...]) -> list[Any]:
    """The survivors' results, in rank order, once the victims are known to have died by SIGKILL."""
    for victim in victims:
        assert isinstance(results[victim], RemoteFailure) and "SIGKILL" in results[victim].message, results[victim]
    alive = [result for rank, result in enumerate(results) if rank not in victims]
    assert not any(isinstance(result, RemoteFailure) for result in alive), results
    return alive


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("victims", [(1,), (1, 2)], ids=["one lost", "two lost at once"])
def test_survivors_of_a_loss_in_a_collective_shrink_and_every_operation_works(victims: tuple[int, ...]) -> None:
    results = launch(lose_in_collective, 4, CFG, (victims,), timeout=TIMEOUT, on_failure="continue")
    alive = _survived(results, victims)
    expected_sum = float(sum(r["old"] for r in alive))
    for new_rank, result in enumerate(alive):
        assert result["reason"] in ("PeerLostError", "RemoteError")
        assert (result["rank"], result["size"], result["class"]) == (new_rank, len(alive), "TorchComm")
        assert result["sum"] == expected_sum and result["wrong"] == []
        assert result["local"] == len(alive)  # one host: the node is every survivor


def lose_between_collectives(comm: Communicator) -> dict[str, Any]:
    comm.barrier()
    if comm.rank == 3:
        _die()
    return _after_shrink(comm.shrink(), comm.rank, "called without an error")  # nothing failed yet here


@pytest.mark.timeout(TIMEOUT)
def test_shrink_without_an_error_leaves_out_a_rank_that_died_between_collectives() -> None:
    results = launch(lose_between_collectives, 4, CFG, timeout=TIMEOUT, on_failure="continue")
    alive = _survived(results, (3,))
    assert [(r["rank"], r["size"], r["sum"], r["wrong"]) for r in alive] == [(r, 3, 3.0, []) for r in range(3)]


def lose_the_store_host(comm: Communicator) -> dict[str, Any]:
    comm.barrier()
    if comm.rank == 0:
        _die()
    try:
        comm.all_gather_object(comm.rank)
    except (PeerLostError, RemoteError) as error:
        return _after_shrink(comm.shrink(), comm.rank, type(error).__name__)
    return {"old": comm.rank, "reason": "no error"}


@pytest.mark.timeout(TIMEOUT)
def test_rank_zero_can_be_lost_when_the_store_runs_outside_the_ranks() -> None:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = launch(
        lose_the_store_host, 3, {**CFG, "store": f"127.0.0.1:{server.port}"}, timeout=TIMEOUT, on_failure="continue"
    )
    alive = _survived(results, (0,))
    assert [(r["rank"], r["size"], r["sum"], r["wrong"]) for r in alive] == [(0, 2, 3.0, []), (1, 2, 3.0, [])]


def die_while_shrinking(comm: Communicator) -> dict[str, Any]:
    comm.barrier()
    if comm.rank == 3:
        _die()
    if comm.rank == 1:  # dies after it was chosen, before it said it was ready: a new round leaves it out
        survivors.Survivors._ready = lambda *args: _die()  # type: ignore[assignment,method-assign]
    try:
        comm.all_reduce(torch.ones(1))
    except (PeerLostError, RemoteError) as error:
        return _after_shrink(comm.shrink(), comm.rank, type(error).__name__)
    return {"old": comm.rank, "reason": "no error"}


@pytest.mark.timeout(TIMEOUT)
def test_a_rank_dying_during_shrink_is_left_out() -> None:
    results = launch(die_while_shrinking, 4, CFG, timeout=TIMEOUT, on_failure="continue")
    alive = _survived(results, (1, 3))
    assert [(r["rank"], r["size"], r["sum"], r["wrong"]) for r in alive] == [(0, 2, 2.0, []), (1, 2, 2.0, [])]


def agree_while_one_dies(comm: Communicator) -> list[bool]:
    answers = [comm.agree(True), comm.agree(comm.rank != 1)]  # every member alive: AND of the flags
    if comm.rank == 2:  # votes False, then dies before anyone has read the votes
        settle = survivors.Survivors._settle

        def vote_and_die(self: Any, entries: str, *args: Any) -> str:
            self._store.append(entries, f"{self._rank}:0;")
            _die()
            return settle(self, entries, *args)

        survivors.Survivors._settle = vote_and_die  # type: ignore[method-assign]
    answers.append(comm.agree(True))
    answers.append(comm.agree(True))  # the dead member takes no part
    return answers


@pytest.mark.timeout(TIMEOUT)
def test_agree_gives_every_survivor_the_same_answer_when_a_member_dies_in_it() -> None:
    results = launch(agree_while_one_dies, 4, CFG, timeout=TIMEOUT, on_failure="continue")
    alive = _survived(results, (2,))
    assert all(answers[:2] == [True, False] for answers in alive)
    assert len({answers[2] for answers in alive}) == 1  # its False counted for all, or for none
    assert all(answers[3] is True for answers in alive)


def stuck_in_different_places(comm: Communicator) -> dict[str, Any]:
    comm.barrier()
    try:
        if comm.rank == 0:
            time.sleep(0.5)  # the others are waiting by now; either way they must raise
            comm.revoke()
        elif comm.rank == 1:
            comm.all_reduce(torch.ones(1))
        else:
            comm.recv(torch.zeros(1), src=0)
        where = "returned"
    except RevokedError as error:
        where = f"raised: {error}"
    try:
        comm.broadcast(torch.ones(1), src=0)
        later = "returned"
    except RevokedError:
        later = "RevokedError"
    agreed = comm.agree(comm.rank != 2)
    shrunk = comm.shrink()
    return {
        "where": where,
        "later": later,
        "agreed": agreed,
        "size": shrunk.world_size,
        "wrong": catalogue(shrunk, ("small",)),
    }


@pytest.mark.timeout(TIMEOUT)
def test_revoke_releases_every_rank_wherever_it_waits_and_the_group_can_go_on() -> None:
    results = launch(stuck_in_different_places, 3, CFG, timeout=TIMEOUT)
    assert results[0]["where"] == "returned"
    for result in results[1:]:
        assert result["where"].startswith("raised") and "rank 0 revoked" in result["where"], result
    assert [r["later"] for r in results] == ["RevokedError"] * 3
    assert [(r["agreed"], r["size"], r["wrong"]) for r in results] == [(False, 3, [])] * 3


def late_caller(comm: Communicator, marker: str) -> str:
    comm.barrier()
    if comm.rank == 2:  # alive, but calls shrink() only after the others formed theirs without it
        while not Path(marker).exists():
            time.sleep(0.05)
        try:
            comm.shrink()
        except ExcludedError as error:
            return f"excluded: {error}"
        return "joined"
    shrunk = comm.shrink(timeout=1)
    Path(marker).write_text("done")
    return f"{shrunk.rank} of {shrunk.world_size}"


@pytest.mark.timeout(TIMEOUT)
def test_a_live_rank_that_calls_shrink_too_late_is_told_it_was_left_out(tmp_path: Path) -> None:
    results = launch(late_caller, 3, CFG, (str(tmp_path / "shrunk"),), timeout=TIMEOUT)
    assert results[:2] == ["0 of 2", "1 of 2"]
    assert results[2].startswith("excluded: ") and "without this rank" in results[2]


def test_a_world_of_one_shrinks_agrees_and_revokes_alone() -> None:
    with NonDistComm() as comm:
        assert comm.agree(True) is True and comm.agree(False) is False
        with pytest.raises(TypeError, match="bool"):
            comm.agree(1)  # type: ignore[arg-type]
        comm.revoke()
        with pytest.raises(RevokedError, match="rank 0 revoked"):
            comm.all_reduce(torch.ones(1))
        shrunk = comm.shrink()
        assert isinstance(shrunk, NonDistComm) and shrunk.all_reduce(torch.ones(2)).tolist() == [1.0, 1.0]
    assert shrunk.closed  # closed with the communicator it came from


def test_shrink_of_a_closed_communicator_is_refused() -> None:
    comm = Communicator.create({"launcher": "none"})
    comm.close()
    for call in (comm.shrink, comm.revoke, lambda: comm.agree(True)):
        with pytest.raises(CommError, match="closed"):
            call()


@pytest.mark.parametrize("bad", ["storehost", "storehost:", ":29400", "storehost:0", "storehost:70000", "host:port"])
def test_a_malformed_store_address_is_refused_before_anything_starts(bad: str) -> None:
    with pytest.raises(ConfigError, match="expected host:port"):
        CommConfig(store=bad)


def test_the_store_address_comes_from_the_config_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CommConfig(store="[::1]:29400").store == "[::1]:29400"
    monkeypatch.setenv("COMMUNICATOR_STORE", "storehost:29401")
    assert CommConfig.from_env().store == "storehost:29401"


def test_launch_refuses_an_unknown_failure_policy() -> None:
    with pytest.raises(ConfigError, match="on_failure"):
        launch(lose_between_collectives, 2, CFG, on_failure="ignore")  # type: ignore[arg-type]


def test_the_store_command_serves_a_store_until_stopped() -> None:
    command = [sys.executable, "-m", "communicator", "store", "--host", "127.0.0.1", "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as server:
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            port = int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))  # type: ignore[union-attr]
            client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
            client.set("key", "value")
            assert client.get("key") == b"value"
        finally:
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=30) == 0
