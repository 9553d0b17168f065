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


SHRINK_JOB = """
import os, signal, socket, sys
import torch
from communicator import Communicator, PeerLostError, RemoteError

with Communicator.create({"timeout": 300}) as comm:
    comm.all_reduce(torch.ones(1))  # every rank is up
    if comm.rank == 3:
        print("DYING", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(torch.ones(1))
    except (PeerLostError, RemoteError):
        shrunk = comm.shrink()
        total = shrunk.all_reduce(torch.tensor([float(comm.rank)])).item()
        local = shrunk.local_comm.world_size
        print(f"SHRUNK old={comm.rank} new={shrunk.rank} world={shrunk.world_size} local={local} "
              f"sum={total:g} host={socket.gethostname()}", flush=True)
"""


def test_survivors_on_two_hosts_shrink_when_a_rank_on_the_other_host_dies(network: Network) -> None:
    """Two ranks per host; rank 3 (second host) dies: the three others shrink across both hosts."""
    port = next(_ports)
    head = network.hosts[0]
    commands = []
    for rank in range(4):
        node = rank // 2
        variables = {
            "RANK": rank,
            "WORLD_SIZE": 4,
            "LOCAL_RANK": rank % 2,
            "LOCAL_WORLD_SIZE": 2,
            "GROUP_RANK": node,
            "MASTER_ADDR": head.name,
            "MASTER_PORT": port,
        }
        assignments = [f"{name}={value}" for name, value in variables.items()]
        run = " ".join(["env", *assignments, sys.executable, "-c", '"$0"'])
        # Through a shell that exits 0: the killed rank must not make the runner stop the others.
        commands.append((network.hosts[node], ["sh", "-c", f"{run}; exit 0", SHRINK_JOB]))
    finished = run_on(network, commands, clean_environ(), RUN_TIMEOUT)
    text = report(finished)
    assert "DYING" in finished[3].stdout, text
    lines = sorted(re.findall(r"^SHRUNK .*$", "".join(f.stdout for f in finished[:3]), flags=re.MULTILINE))
    hosts = [network.hosts[0].name] * 2 + [network.hosts[1].name]
    expected = [
        f"SHRUNK old={old} new={old} world=3 local={2 if old < 2 else 1} sum=3 host={host}"
        for old, host in zip(range(3), hosts, strict=True)
    ]
    assert lines == expected, text
