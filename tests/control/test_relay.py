"""The host's relay file against what can happen to it: a stopped process holding its lock, damaged
lines, a folder that is a symbolic link, jobs that end or die. Real gloo ranks on 127.0.0.1 (a
world of 3 on one host shares a relay), each test bounded, no timing asserted."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import HashStore

from communicator import CommError, Communicator, RevokedError
from communicator.control.log import EventLog, StoreHandle
from communicator.control.neighbours import Neighbours
from communicator.control.records import TOKEN_VARIABLE, Seal
from communicator.control.relay import Relay
from communicator.testing import run_ranks

CFG = {"backend": "gloo", "timeout": 20}
TIMEOUT = 90


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _relay(comm: Communicator) -> Relay:
    relay = comm._control.world.relay  # type: ignore[attr-defined]
    assert relay is not None
    return relay  # type: ignore[no-any-return]


def _turn(relay: Relay) -> Any:
    """This process's turn on the relay (its lock held), made or waited for."""
    deadline = time.monotonic() + 10
    while (turn := relay.turn()) is None or turn._fd < 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return turn


def hold_the_lock(comm: Communicator, marker: str) -> str:
    comm.barrier()
    if comm.rank == 2:  # takes the host's turn and keeps it, as a stopped process or a debugger would
        with _turn(_relay(comm)):
            deadline = time.monotonic() + 40
            while not os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
        return "held"
    if comm.rank == 1:
        time.sleep(1)
        comm.revoke()
        deadline = time.monotonic() + 40  # its closing would remove the relay: it stays until rank 0 is done
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        return "revoked"
    try:
        comm.all_reduce(torch.ones(1))  # waits for the others, looking at the log
    except CommError as error:
        return type(error).__name__
    finally:
        Path(marker).write_text("done")
    return "no error"


@pytest.mark.timeout(TIMEOUT)
def test_a_process_that_holds_the_relay_does_not_keep_the_hosts_other_ranks_from_the_store(tmp_path) -> None:
    env = {"TMPDIR": str(tmp_path)}  # a folder of relays of its own: no other job's process sweeps it
    results = run_ranks(hold_the_lock, 3, str(tmp_path / "released"), cfg=CFG, env=env, timeout=60)
    assert results == [RevokedError.__name__, "revoked", "held"]  # not a CommTimeoutError after 20 s


def damaged_relay(comm: Communicator) -> dict[str, Any]:
    lines = _Lines()
    logging.getLogger("communicator").addHandler(lines)
    relay = _relay(comm)
    comm.barrier()
    if comm.rank == 0:
        with _turn(relay), open(relay.path, "ab") as file:  # made, and named by its first line
            file.write(b"garbage\n1 {not json\n7 \n12345678901234567890123 {}\n\xff\xfe 1\n")
    comm.barrier()
    sums = []
    for phase in range(2):
        if comm.rank == 0 and phase == 1:  # a relay that lost its first line
            relay.path.write_bytes(b"x" * 60 + b"\n2 {}\n")
        if comm.rank == 1:
            time.sleep(0.6)  # the others wait, and read the relay meanwhile
        sums.append(comm.all_reduce(torch.ones(1)).item())
    return {"sums": sums, "warned": [line for line in lines.lines if "relay" in line]}


@pytest.mark.timeout(TIMEOUT)
def test_damaged_lines_of_a_relay_are_skipped_with_a_warning_not_raised(tmp_path) -> None:
    results = run_ranks(damaged_relay, 3, cfg=CFG, env={"TMPDIR": str(tmp_path)}, timeout=60)
    assert [r["sums"] for r in results] == [[3.0, 3.0]] * 3  # no ValueError, no JSONDecodeError
    assert any(r["warned"] for r in results), results


def relay_in_a_linked_folder(comm: Communicator) -> list[bool]:
    base = os.environ["BASE"]
    target = Path(base) / "elsewhere"
    target.mkdir(mode=0o700)
    link = Path(base) / "link"
    link.mkdir(mode=0o700)
    (link / f"communicator-{os.getuid()}").symlink_to(target)
    loose = Path(base) / "loose"
    loose.mkdir(mode=0o700)
    (loose / f"communicator-{os.getuid()}").mkdir(mode=0o700)
    os.chmod(loose / f"communicator-{os.getuid()}", 0o755)
    found = []
    for where in (link, loose):
        tempfile.tempdir = str(where)
        try:
            found.append(Relay.open("a" * 32, f"h{comm.rank}", comm.local_size) is None)
        finally:
            tempfile.tempdir = None
    return found


@pytest.mark.timeout(TIMEOUT)
def test_a_relay_folder_that_is_a_symbolic_link_or_open_to_others_is_not_used(tmp_path) -> None:
    bases = [tmp_path / "r0", tmp_path / "r1"]
    for base in bases:
        base.mkdir()
    results = run_ranks(relay_in_a_linked_folder, 2, cfg=CFG, env=lambda rank: {"BASE": str(bases[rank])}, timeout=60)
    assert results == [[True, True], [True, True]]


def relay_in_use(comm: Communicator) -> str:
    if comm.rank == 1:
        time.sleep(0.6)  # rank 0 waits, and its look makes the relay
    comm.all_reduce(torch.ones(1))
    return str(_relay(comm).path)


@pytest.mark.timeout(TIMEOUT)
def test_a_job_that_ends_leaves_no_relay_and_one_of_a_dead_job_goes_at_once(tmp_path) -> None:
    folder = tmp_path / f"communicator-{os.getuid()}"
    folder.mkdir(mode=0o700)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = folder / "b0b0-host.relay"  # left by a killed job whose maker's process is gone
    left.write_bytes(b"#%s %010d\n1 {}\n" % (b"0" * 32, int(dead.stdout)))
    host_files = [folder / f"b0b0-host.{kind}" for kind in ("beats", "judge")]  # its host's files too
    for path in host_files:
        path.write_bytes(b"")
    paths = run_ranks(relay_in_use, 2, cfg=CFG, env={"TMPDIR": str(tmp_path)}, timeout=60)
    assert all(Path(path).parent == folder for path in paths), paths
    assert not left.exists() and not any(path.exists() for path in host_files)
    assert not folder.exists()  # nothing left: neither the job's relay nor the folder


def test_a_host_stands_one_candidate_a_term_and_writes_one_heartbeat_for_its_processes(tmp_path) -> None:
    wall = [1_000.0]
    relay = Relay(tmp_path / "w-h0.relay", 0.5)
    first, second = (Neighbours(relay, lambda: wall[0]) for _ in range(2))
    assert first.stand("#3", 7) and not second.stand("#3", 7)  # one candidate for the host
    assert second.stand("#4", 7) and second.stand("#3", 8)  # another operation, the next term
    pid = os.getpid()
    assert first.keep(0, '{"at": 1000}') and second.keep(1, '{"at": 1000}')
    ranks = {0: pid, 1: pid, 2: pid}  # rank 2 kept nothing: not written for it
    assert first.beat(5.0, lambda: ranks) == {}  # made now: its processes wrote their first status
    wall[0] += 5.0
    assert first.keep(0, '{"at": 1005}')  # rank 1 stopped: its status stays as old as it is
    assert first.beat(5.0, lambda: ranks) == {0: '{"at": 1005}', 1: '{"at": 1000}'}
    assert second.beat(5.0, lambda: ranks) == {}  # written for the host already
    first.forget(0)
    second.forget(1)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_record_not_signed_is_counted_in_each_process_that_takes_it_through_the_relay(tmp_path) -> None:
    store = StoreHandle(HashStore())
    logs = [EventLog(store, Relay(tmp_path / "w-h0.relay", 0.5), seal=Seal("s3cret")) for _ in range(2)]
    store.set(f"event/{store.add('events', 1)}", '{"kind": "fail", "board": "", "rank": 1}')  # not signed
    assert logs[0].look()  # read from the store, for the host
    assert logs[1].look()  # read from the relay: it says why the record was skipped
    assert [log.seal.tally.counts for log in logs] == [{f"not signed with {TOKEN_VARIABLE}": 1}] * 2
