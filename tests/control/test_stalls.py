"""Hangs that explain themselves, on real gloo ranks and without debug mode: mismatched collectives,
closed peers, ranks that are only late, and the trace of what each rank did."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from typing import Any

import pytest
import torch

from communicator import CollectiveMismatchError, Communicator, PeerClosedError
from communicator.control.stalls import Report, judge
from communicator.testing import run_ranks

# Long enough that only the diagnosis (after stall_seconds) can end these waits.
PATIENT = {"timeout": 120, "stall_seconds": 2}


def only_rank_zero_gathers_objects(comm: Communicator) -> tuple[str, dict[int, str]]:
    with pytest.raises(CollectiveMismatchError) as caught:
        if comm.rank == 0:
            comm.all_gather_object({"x": 1})
        comm.all_reduce(torch.ones(1))
    return str(caught.value), caught.value.sides


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_a_collective_only_one_rank_calls_is_a_mismatch_on_every_rank(world_size: int) -> None:
    results = run_ranks(only_rank_zero_gathers_objects, world_size, cfg=PATIENT, timeout=90)
    for message, sides in results:
        assert "different collectives at the same point" in message
        assert sides[0].startswith("in all_gather_object #1") and "test_stalls.py" in sides[0]
        # the others' first all_reduce is in its argument check (see communicator.crosscheck)
        assert all(sides[r].startswith("in all_reduce (argument check) #1 float32[1]") for r in range(1, world_size))


def different_collectives_after_a_while(comm: Communicator) -> str:
    comm.all_reduce(torch.ones(1))
    with pytest.raises(CollectiveMismatchError) as caught:
        if comm.rank == comm.world_size - 1:
            time.sleep(3)  # elsewhere for a while: the others are only waiting, then the mismatch shows
            comm.all_gather_object("late")
        else:
            comm.all_reduce(torch.ones(2))
    return caught.value.sides[comm.world_size - 1]


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_late_rank_that_enters_another_collective_is_a_mismatch(world_size: int) -> None:
    sides = run_ranks(different_collectives_after_a_while, world_size, cfg=PATIENT, timeout=90)
    assert all(side.startswith("in all_gather_object #2") for side in sides)


def leaves_early(comm: Communicator) -> str:
    if comm.rank == 1:
        return "left"  # its communicator closes as the function returns
    with pytest.raises(PeerClosedError) as caught:
        comm.all_reduce(torch.ones(1))
    return str(caught.value)


def test_a_peer_that_closed_is_named_with_what_it_completed() -> None:
    message, left = run_ranks(leaves_early, 2, cfg=PATIENT, timeout=60)
    assert left == "left"
    assert "rank 1 closed its communicator after 0 collectives" in message and "all_reduce on rank 0" in message


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def long_section_on_rank_zero(comm: Communicator, seconds: float) -> list[str]:
    handler = Collect()
    logging.getLogger("communicator").addHandler(handler)
    comm.all_reduce(torch.ones(1))
    if comm.rank == 0:
        time.sleep(seconds)
    comm.barrier()
    total = comm.all_reduce(torch.ones(1)).item()
    assert total == comm.world_size
    return handler.messages


def test_a_long_rank_zero_section_completes_and_logs_who_is_awaited() -> None:
    world_size = 3
    # A section far past the stall threshold, within the (default) timeout, is legitimate.
    logs = run_ranks(long_section_on_rank_zero, world_size, 8.0, cfg={"stall_seconds": 2}, timeout=120)
    assert logs[0] == []
    for messages in logs[1:]:
        assert len(messages) == 1  # once, not every second
        message = messages[0]
        assert "in barrier #2" in message and "ranks [0] did not arrive" in message
        assert "rank 0 is outside any collective" in message and "its last: all_reduce #1" in message


def late_sender(comm: Communicator, seconds: float) -> list[str]:
    handler = Collect()
    logging.getLogger("communicator").addHandler(handler)
    if comm.rank == 0:
        time.sleep(seconds)
        comm.send(torch.ones(2), dst=1)
    elif comm.rank == 1:
        received = torch.zeros(2)
        comm.recv(received, src=0)
        assert received.tolist() == [1.0, 1.0]
    comm.barrier()
    return handler.messages


def test_a_long_wait_for_a_transfer_names_its_peer_only() -> None:
    # Rank 2 waits in the barrier meanwhile: it is no part of rank 1's receive, which is judged
    # among its peers (what it costs stays the same however large the group).
    logs = run_ranks(late_sender, 3, 8.0, cfg={"stall_seconds": 2}, timeout=120)
    receive = [m for m in logs[1] if "recv" in m]
    assert len(receive) == 1, logs[1]
    assert "ranks [0] did not arrive" in receive[0] and "rank 0 is outside any collective" in receive[0]
    assert "rank 2" not in receive[0]


def mismatch_with_dumps(comm: Communicator) -> None:
    with pytest.raises(CollectiveMismatchError):
        if comm.rank == 1:
            comm.all_gather(torch.ones(3))
        comm.all_reduce(torch.ones(3))


def test_the_trace_command_names_the_rank_and_the_operation(tmp_path) -> None:
    run_ranks(mismatch_with_dumps, 3, cfg={**PATIENT, "trace_dir": str(tmp_path)}, timeout=90)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"world-rank{r}.json" for r in range(3)]
    out = subprocess.run(
        [sys.executable, "-m", "communicator", "trace", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "world: 3 ranks, dumps from ranks [0, 1, 2]" in out
    assert "diverged at #1: rank 0 all_reduce float32[3] at" in out
    assert "rank 1 all_gather float32[3] at" in out and "test_stalls.py" in out


def test_the_trace_command_on_an_empty_directory(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "communicator", "trace", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1 and "no flight-recorder dumps" in out.stdout  # nothing to merge is a failure


def entry(op: str = "", seq: int = 1, **more: Any) -> Report:
    fields = {"group": "world", "seq": seq, "op": op, "site": "x.py:1", "seconds": 5.0, **more}
    return Report(fields, [], True)


IDLE = Report(
    {"group": "world", "seq": 1, "op": "", "last": "all_reduce #1", "site": "x.py:1", "seconds": 9.0}, [], True
)


@pytest.mark.parametrize(
    ("reports", "kind", "awaited"),
    [
        ([entry("all_reduce"), entry("all_gather_object")], "mismatch", []),
        ([entry("all_reduce", 2), entry("barrier", 3)], "mismatch", []),
        ([entry("all_reduce", 2), IDLE], "waiting", [1]),
        ([entry("all_reduce", 2), entry("all_reduce", 2, p2p=False), IDLE], "waiting", [2]),
        ([entry("all_reduce", 2), entry("broadcast", 2), IDLE], "mismatch", [2]),
        ([entry("all_reduce", 2), entry("recv", 2, p2p=True)], "waiting", [1]),
        ([entry("all_reduce", 2, dtypes=["f32"]), entry("all_reduce", 2, dtypes=["f64"])], "mismatch", []),
        ([entry("all_reduce", sizes="f32[2]"), entry("all_reduce", sizes="f32[3]")], "mismatch", []),
        ([entry("all_gather", sizes="f32[2]"), entry("all_gather", sizes="f32[3]")], "stuck", []),
        ([entry("all_reduce"), entry("all_reduce")], "stuck", []),
        ([entry("all_reduce"), Report(None, [], False)], "waiting", [1]),
    ],
)
def test_the_verdict_on_what_the_members_report(reports: list[Report], kind: str, awaited: list[int]) -> None:
    verdict = judge(0, reports)
    assert (verdict.kind, verdict.awaited) == (kind, awaited)
    assert set(verdict.sides) == set(range(len(reports)))
