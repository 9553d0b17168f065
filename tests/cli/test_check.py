"""``communicator check``: every op passes in one process and on local gloo ranks; a broken op is a FAIL."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from communicator import Communicator, NonDistComm, PeerLostError, RemoteError
from communicator.check import CHECKS, DEFAULT_SIZES, Aborted, Check, Mismatch, Outcome, Skip, check_job, run_checks
from communicator.check.report import _merge
from communicator.check.values import arrive_late
from communicator.cli import main
from communicator.cli.check import run_local
from communicator.testing import run_ranks

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^(\S.*?)\s{2,}(-|small|medium|large)\s+(pass|FAIL|skip|not run)\s+\d+\.\d+(?:\s+(.*))?$")
POINT_TO_POINT = {"send/recv", "isend/irecv", "send/recv[late sender]", "send_object/recv_object"}
LATE_NOTE = "ms from when the late rank 0 arrived (0.20 s deliberate delay not counted)"


def _rows(output: str) -> list[tuple[str, str, str, str]]:
    """(op, size, result, error) of every table row in ``output``."""
    return [(m[1].strip(), m[2], m[3], m[4] or "") for m in map(ROW.match, output.splitlines()) if m]


def _expected_rows(sizes: tuple[str, ...] = DEFAULT_SIZES) -> list[tuple[str, str]]:
    return [(check.name, size) for check in CHECKS for size in (sizes if check.sized else ("-",))]


def test_one_process(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMMUNICATOR_LAUNCHER", "none")

    code = main(["check"])

    output = capsys.readouterr().out
    assert code == 0, output
    assert "NonDistComm: rank 0 of 1" in output
    rows = _rows(output)
    assert [(op, size) for op, size, _, _ in rows] == _expected_rows()
    for op, size, result, error in rows:
        # A world of one has no peer: point-to-point is skipped, every other op must pass.
        want = ("skip", "a world of one has no peer") if op in POINT_TO_POINT else ("pass", "")
        if op == "all_reduce[late rank]":  # its own rank is the late one: the sleep is not the op's time
            want = ("pass", LATE_NOTE)
        assert (result, error) == want, (op, size)
    assert output.rstrip().endswith("check passed")


@pytest.mark.parametrize("world_size", [2, 3])
def test_local_ranks(world_size: int, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", "--local", str(world_size)])

    output = capsys.readouterr().out
    assert code == 0, output
    assert f"TorchComm: rank 0 of {world_size}, backend gloo" in output
    rows = _rows(output)
    assert [(op, size) for op, size, _, _ in rows] == _expected_rows()
    assert all(result == "pass" for _, _, result, _ in rows), output
    assert f"{len(rows)} passed, 0 failed, 0 skipped on {world_size} rank(s)" in output


def test_module_entry_point_in_one_process() -> None:
    environ = {
        **os.environ,
        "COMMUNICATOR_LAUNCHER": "none",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-m", "communicator", "check", "--sizes", "small", "--ops", "all_reduce"],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _rows(done.stdout)
    assert rows and all(op.startswith("all_reduce") and result == "pass" for op, _, result, _ in rows), done.stdout


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--sizes", "huge"]) == 2
    assert main(["check", "--ops", "no_such_op"]) == 2
    assert main(["check", "--local", "0"]) == 2
    assert main(["check", "--repeat", "-1"]) == 2
    assert "huge" in capsys.readouterr().err


# -- a deliberately broken op ---------------------------------------------------------------------------


def _wrong_on_rank_1(comm: Communicator, n: int) -> None:
    comm.all_gather_object(comm.rank)  # every rank communicates, then rank 1 finds a wrong value
    if comm.rank == 1:
        raise Mismatch("deliberately wrong on rank 1")


def _raises_everywhere(comm: Communicator, n: int) -> None:
    raise ValueError(f"bad input for n={n}")


BROKEN = [
    Check("barrier", CHECKS[0].run, sized=False),
    Check("wrong on rank 1", _wrong_on_rank_1, sized=False),
    Check("raises everywhere", _raises_everywhere),
    *(check for check in CHECKS if check.name in ("all_reduce[sum]", "all_gather_object")),
]


def _broken_job(comm: Communicator) -> tuple[int, list[str]]:
    lines: list[str] = []
    status = check_job(comm, BROKEN, ("small",), emit=lines.append)
    return status, lines


def test_broken_op_is_a_fail_on_every_rank() -> None:
    results = run_ranks(_broken_job, 2)

    assert [status for status, _ in results] == [1, 1]  # every rank exits with the same status
    assert results[1][1] == []  # only rank 0 reports
    rows = _rows("\n".join(results[0][1]))
    assert rows == [
        ("barrier", "-", "pass", ""),
        ("wrong on rank 1", "-", "FAIL", "rank 1: Mismatch: deliberately wrong on rank 1"),
        ("raises everywhere", "small", "FAIL", "every rank: ValueError: bad input for n=8"),
        ("all_reduce[sum]", "small", "pass", ""),  # the failures did not stop the others
        ("all_gather_object", "small", "pass", ""),
    ]
    assert results[0][1][-1] == "check FAILED"


def test_broken_op_through_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_local(2, BROKEN, ["small"], timeout=30)

    output = capsys.readouterr().out
    assert code == 1
    assert ("wrong on rank 1", "-", "FAIL", "rank 1: Mismatch: deliberately wrong on rank 1") in _rows(output)
    assert "3 passed, 2 failed, 0 skipped on 2 rank(s)" in output


def test_run_checks_in_one_process() -> None:
    def skipped(comm: Communicator, n: int) -> None:
        raise Skip("not here")

    with NonDistComm() as comm:
        outcomes = run_checks(
            comm,
            [Check("wrong", _raises_everywhere), Check("skipped", skipped, sized=False), CHECKS[2]],
            ["small", "medium"],
        )
    assert [(o.op, o.size, o.status, o.error) for o in outcomes] == [
        ("wrong", "small", "FAIL", "ValueError: bad input for n=8"),
        ("wrong", "medium", "FAIL", "ValueError: bad input for n=100000"),
        ("skipped", "-", "skip", "not here"),
        (CHECKS[2].name, "small", "pass", ""),
        (CHECKS[2].name, "medium", "pass", ""),
    ]
    assert all(o.seconds >= 0 for o in outcomes)


# -- the time column: the op's own time --------------------------------------------------------------------


def test_each_check_runs_once_then_its_timed_runs() -> None:
    runs: list[int] = []

    def counted(comm: Communicator, n: int) -> None:
        runs.append(n)
        comm.barrier()

    with NonDistComm() as comm:
        run_checks(comm, [Check("counted", counted)], ["small"], repeat=3)
        assert runs == [8] * 4  # the checked run and 3 timed ones
        runs.clear()
        run_checks(comm, [Check("counted", counted)], ["small"])
        assert runs == [8]  # conformance suites run each check once


def test_a_failure_in_a_timed_run_fails_the_check() -> None:
    runs: list[int] = []

    def flaky(comm: Communicator, n: int) -> None:
        runs.append(n)
        comm.barrier()
        if len(runs) == 3:
            raise Mismatch("wrong the third time")

    with NonDistComm() as comm:
        (outcome,) = run_checks(comm, [Check("flaky", flaky, sized=False)], ["small"], repeat=3)
    assert len(runs) == 4  # the other runs still ran
    assert (outcome.status, outcome.error) == ("FAIL", "Mismatch: wrong the third time (timed run 2 of 3)")


def test_the_time_is_spent_inside_the_communicator_s_calls() -> None:
    def no_call(comm: Communicator, n: int) -> None:
        sum(range(100_000))  # the check of a result: work of this rank, not the op's

    with NonDistComm() as comm:
        outcomes = run_checks(comm, [Check("no call", no_call, sized=False), CHECKS[0]], ["small"], repeat=2)
    assert [(o.op, o.status, o.seconds) for o in outcomes[:1]] == [("no call", "pass", 0.0)]
    assert outcomes[1].seconds > 0  # barrier: a call


def test_the_report_names_its_time_column(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMMUNICATOR_LAUNCHER", "none")
    assert main(["check", "--ops", "barrier"]) == 0
    output = capsys.readouterr().out
    assert "op                size    result   median ms  error" in output
    legend = "ms: time inside the communicator's calls (not the check of the result), the slowest rank's,"
    assert f"median {legend}\nthe median of the 3 runs after the checked one; async_op rows" in output
    assert main(["check", "--ops", "barrier", "--repeat", "0"]) == 0
    output = capsys.readouterr().out
    assert "op                size    result          ms  error" in output
    assert f"\n{legend}\nin its one run; async_op rows" in output


# -- a broken communicator stops the run on every rank ----------------------------------------------------


def _peer_lost_on_rank_1(comm: Communicator, n: int) -> None:
    if comm.rank == 1:
        raise PeerLostError("simulated: a peer of rank 1 died")


def test_broken_communicator_stops_in_one_process() -> None:
    def lost(comm: Communicator, n: int) -> None:
        raise PeerLostError("simulated")

    with NonDistComm() as comm, pytest.raises(Aborted) as stopped:
        run_checks(comm, [CHECKS[0], Check("lost", lost, sized=False), CHECKS[1]])
    assert [(o.op, o.status) for o in stopped.value.outcomes] == [("barrier", "pass"), ("lost", "FAIL")]
    assert isinstance(stopped.value.error, PeerLostError)


def _stopping_job(comm: Communicator) -> int:
    return check_job(
        comm,
        [CHECKS[0], Check("peer lost", _peer_lost_on_rank_1, sized=False), *CHECKS[1:4]],
        ("small",),
        emit=lambda line: None,
    )


def test_broken_communicator_releases_every_rank_promptly() -> None:
    start = time.monotonic()
    with pytest.raises(RemoteError) as failed:
        run_ranks(_stopping_job, 2, cfg={"backend": "gloo", "timeout": 60})
    # Rank 1 stops at the broken op; rank 0, waiting for it after that op, is released well before the timeout.
    assert time.monotonic() - start < 30
    assert failed.value.ranks == (0, 1)
    assert "simulated: a peer of rank 1 died" in str(failed.value)


def test_stopped_run_through_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    start = time.monotonic()
    code = run_local(2, [CHECKS[0], Check("peer lost", _peer_lost_on_rank_1, sized=False), *CHECKS[1:3]], ["small"], 60)

    output = capsys.readouterr().out
    assert code == 1
    assert time.monotonic() - start < 30  # released through the failure board, not by the timeout
    # Rank 0 prints its table so far; every rank says where it stopped and why.
    assert _rows(output) == [("barrier", "-", "pass", ""), ("peer lost", "-", "pass", "")]
    assert "check STOPPED on rank 0 after peer lost (-): the communicator broke: RemoteError" in output
    assert "check STOPPED on rank 1 at peer lost (-): the communicator broke: PeerLostError: simulated" in output


# -- a deliberately late rank ------------------------------------------------------------------------------


def test_a_deliberate_delay_is_recorded_apart_from_the_op_s_time() -> None:
    def late(comm: Communicator, n: int) -> None:
        arrive_late(0.05)
        comm.barrier()

    with NonDistComm() as comm:
        outcomes = run_checks(comm, [Check("late", late, sized=False), CHECKS[0]], ["small"])
    assert [(o.op, o.status) for o in outcomes] == [("late", "pass"), ("barrier", "pass")]
    assert outcomes[0].delay == 0.05  # the delay asked for, however long the sleep took
    assert outcomes[1].delay == 0.0  # counted afresh for each check


def test_a_late_rank_s_row_shows_the_time_from_its_arrival() -> None:
    # Rank 0 waited 0.2 s for rank 1, which slept 0.2 s on purpose and then took 3 ms.
    per_rank = {
        0: [Outcome("all_reduce[late rank]", "-", "pass", 0.203), Outcome("barrier", "-", "pass", 0.004)],
        1: [Outcome("all_reduce[late rank]", "-", "pass", 0.003, "", 0.2), Outcome("barrier", "-", "pass", 0.001)],
    }
    rows = _merge(per_rank, 2)
    assert rows == [
        ("all_reduce[late rank]", "-", "pass", 0.003, LATE_NOTE.replace("rank 0", "rank 1")),
        ("barrier", "-", "pass", 0.004, ""),  # no delay: the slowest rank's time, as before
    ]


def test_a_late_rank_s_failure_keeps_its_error() -> None:
    per_rank = {
        0: [Outcome("late", "-", "FAIL", 0.2, "Mismatch: wrong")],
        1: [Outcome("late", "-", "pass", 0.001, "", 0.2)],
    }
    assert _merge(per_rank, 2) == [("late", "-", "FAIL", 0.001, "rank 0: Mismatch: wrong")]
