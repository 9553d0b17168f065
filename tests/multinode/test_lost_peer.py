"""A peer on another host that is killed is reported as lost, not waited for until the timeout.

Two hosts, one rank each, started by hand with torchrun's variables (no launcher that would kill
the survivors for us). The peer's process id means nothing on the other host, so only the
heartbeats (or the transport's own errors) can tell: the survivor must raise ``PeerLostError``
long before its 300 s timeout.
"""

from __future__ import annotations

import itertools
import re
import sys

import pytest
from hosts import Network
from jobs import clean_environ, report, run_on

pytestmark = [pytest.mark.launchers, pytest.mark.timeout(300)]

RUN_TIMEOUT = 150  # far less than the job's own collective timeout (300 s)
_ports = itertools.count(29700)

JOB = """
import os, signal, sys, time
import torch
from communicator import Communicator, PeerLostError

case = sys.argv[1]
with Communicator.create({"timeout": 300, "stall_seconds": 2}) as comm:
    comm.all_reduce(torch.ones(1))  # both ranks are up
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1)
    try:
        if case == "barrier":
            comm.barrier(timeout=300)  # through the store: no transport to notice the dead peer
        else:
            comm.all_gather_object(bytes(20_000_000))
    except PeerLostError as error:
        print(f"LOST {error}", flush=True)
        os._exit(0)  # the peer will never close: skip waiting for it
print("NOT LOST", flush=True)
"""


@pytest.mark.parametrize("case", ["barrier", "objects"])
def test_a_peer_killed_on_another_host_is_reported_lost(network: Network, case: str) -> None:
    port = next(_ports)
    head = network.hosts[0]
    commands = []
    for rank, host in enumerate(network.hosts):
        variables = {
            "RANK": rank,
            "WORLD_SIZE": len(network.hosts),
            "LOCAL_RANK": 0,
            "LOCAL_WORLD_SIZE": 1,
            "GROUP_RANK": rank,
            "MASTER_ADDR": head.name,
            "MASTER_PORT": port,
        }
        argv = ["env", *(f"{name}={value}" for name, value in variables.items()), sys.executable, "-c", JOB, case]
        commands.append((host, argv))
    finished = run_on(network, commands, clean_environ(), RUN_TIMEOUT)
    text = report(finished)
    survivor, killed = finished
    assert killed.returncode in (-9, 137), text
    assert survivor.returncode == 0, text
    lost = re.search(r"^LOST (.*)$", survivor.stdout, flags=re.MULTILINE)
    assert lost is not None, text
    assert "rank 1" in lost.group(1) or "peer was lost" in lost.group(1), text
