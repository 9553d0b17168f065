"""``communicator.launchers.network`` without namespaces: the master checks, the choice of interface,
and the factory's use of them (a ConfigError before any rendezvous; ``GLOO_SOCKET_IFNAME`` set for
the group's lifetime, then restored)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import pytest

from communicator import Communicator, ConfigError
from communicator.launchers import detect_launcher
from communicator.launchers.network import (
    GLOO_IFNAME,
    check_master,
    hosts_reported,
    interface_addresses,
    interface_of,
    is_loopback,
    network_env,
    resolve,
    route_source,
)
from communicator.testing import run_ranks


def torchrun_env(rank: int = 0, nodes: int = 2, master: str = "127.0.0.1") -> dict[str, str]:
    """What torchrun sets on a job of ``nodes`` nodes with one rank each (it says nothing of hosts)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(nodes),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank),
        "GROUP_WORLD_SIZE": str(nodes),
        "MASTER_ADDR": master,
        "MASTER_PORT": "29500",
    }


def openmpi_env(rank: int, master: str, hosts: int = 2) -> dict[str, str]:
    """What Open MPI sets on 2 hosts x 2 ranks (``mpirun -H a:2,b:2``), plus the caller's master."""
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % 2),
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_MCA_orte_num_nodes": str(hosts),
        "MASTER_ADDR": master,
        "MASTER_PORT": "29500",
    }


def slurm_env(rank: int, master: str) -> dict[str, str]:
    """What srun sets on 2 nodes x 2 tasks, plus a MASTER_ADDR."""
    return {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": str(rank % 2),
        "SLURM_NODEID": str(rank // 2),
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "node[01-02]",
        "MASTER_ADDR": master,
    }


def network_address() -> tuple[str, str]:
    """An interface of this machine other than loopback, and its IPv4 address."""
    for name, addresses in interface_addresses().items():
        for address in addresses:
            if ":" not in address and not is_loopback(address):
                return name, address
    pytest.skip("this machine has no IPv4 address outside loopback")


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("::1", True),
        ("10.0.0.1", False),
        ("fe80::1%eth0", False),
        ("node01", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_one_node_needs_nothing() -> None:
    env = detect_launcher(environ=torchrun_env(nodes=1, master="localhost"))
    assert env is not None
    assert network_env(env, environ={}) == {}


@pytest.mark.parametrize("launcher", [openmpi_env, slurm_env])
def test_a_loopback_master_is_refused_on_every_rank_when_the_launcher_reports_hosts(
    launcher: Callable[[int, str], dict[str, str]],
) -> None:
    for rank in range(4):
        env = detect_launcher(environ=launcher(rank, "localhost"))
        assert env is not None
        # Even with the interface given: the other hosts cannot reach a store on "localhost".
        with pytest.raises(ConfigError) as raised:
            network_env(env, environ={GLOO_IFNAME: "eth0"})
        message = str(raised.value)
        assert message.startswith("the master host 'localhost' (MASTER_ADDR) resolves only to loopback (")
        where = f"on rank {rank} (node {rank // 2} of 2, host {socket.gethostname()!r})"
        assert f"{where}, but the job spans 2 hosts" in message
        assert "set MASTER_ADDR (or master_addr) to a name or address of rank 0's host" in message


def test_nodes_that_may_share_one_host_can_meet_at_loopback() -> None:
    """Nodes simulated on one machine, or torchrun's agents (which already met at that address)."""
    for rank in (0, 1):
        env = detect_launcher(environ=torchrun_env(rank, master="localhost"))
        assert env is not None and env.num_nodes == 2
        assert network_env(env, environ={}) == {}
    env = detect_launcher(environ=openmpi_env(3, "127.0.0.1", hosts=1))
    assert env is not None and env.num_nodes == 2
    assert network_env(env, environ={}) == {}


def test_hosts_reported() -> None:
    assert hosts_reported(openmpi_env(0, "n1", hosts=3)) == 3
    assert hosts_reported(slurm_env(0, "n1")) == 2
    assert hosts_reported({"SLURM_JOB_NODELIST": "gpu[07-08,11]"}) == 3
    assert hosts_reported({"SLURM_STEP_NODELIST": "node01", "SLURM_JOB_NODELIST": "node[01-02]"}) == 1
    assert hosts_reported(torchrun_env()) is None


def test_a_name_resolving_to_loopback() -> None:
    """/etc/hosts maps rank 0's name to 127.0.1.1: fatal on another host; on rank 0's own host the
    store still works, so it needs only GLOO_SOCKET_IFNAME. Nodes on one host need neither."""
    with pytest.raises(ConfigError, match=r"'node01' resolves only to loopback \(127\.0\.1\.1\) on rank 1, but"):
        check_master("node01", ["127.0.1.1"], hosts=2, node_rank=1, where="on rank 1")
    with pytest.raises(ConfigError, match=r"rank 0's own host.*or set GLOO_SOCKET_IFNAME to the interface"):
        check_master("node01", ["127.0.1.1"], hosts=2, node_rank=0)
    check_master("node01", ["127.0.1.1"], hosts=2, node_rank=0, gloo_ifname="eth0")
    check_master("node01", ["127.0.1.1", "10.1.2.3"], hosts=2, node_rank=0)  # Debian's line and the real one
    check_master("node01", ["127.0.1.1"], hosts=1, node_rank=1)


@pytest.mark.parametrize("host", ["no-such-host.invalid", "a..b"])
def test_an_unresolvable_master_is_a_config_error(host: str) -> None:
    with pytest.raises(ConfigError, match="does not resolve"):
        resolve(host)
    env = detect_launcher(environ=torchrun_env(master=host))
    assert env is not None
    with pytest.raises(ConfigError, match=rf"^the master host '{host}' \(MASTER_ADDR\) on rank 0 .* does not resolve"):
        network_env(env, environ={})


def test_the_interface_is_the_one_routing_to_the_master() -> None:
    interface, address = network_address()
    assert route_source(address) == address  # a local address is reached from itself
    assert interface_of(address, interface_addresses()) == interface
    env = detect_launcher(environ=torchrun_env(master=address))
    assert env is not None
    assert network_env(env, environ={}) == {GLOO_IFNAME: interface}
    assert network_env(env, environ={GLOO_IFNAME: "ib0"}) == {}  # the user's choice is kept
    # The host of a tcp:// init method is the master; a file:// rendezvous has none.
    assert network_env(env, f"tcp://{address}:29500", environ={}) == {GLOO_IFNAME: interface}
    assert network_env(env, "tcp://127.0.0.1:29500", environ={}) == {}  # nodes on this host
    assert network_env(env, "file:///tmp/rendezvous", environ={}) == {}
    on_two_hosts = detect_launcher(environ=openmpi_env(0, address))
    assert on_two_hosts is not None
    with pytest.raises(ConfigError, match=r"^the master host '127\.0\.0\.1' \(init_method\) resolves only to loopback"):
        network_env(on_two_hosts, "tcp://127.0.0.1:29500", environ={})


def test_interface_of() -> None:
    table = {"lo": ["127.0.0.1", "::1"], "eth0": ["10.0.0.5", "fe80::1%eth0"], "ib0": ["192.168.7.5"]}
    assert interface_of("192.168.7.5", table) == "ib0"
    assert interface_of("fe80::1", table) == "eth0"
    assert interface_of("10.9.9.9", table) is None


def test_create_refuses_a_loopback_master_before_any_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    """No group is started (nothing listens on the port; it would wait for the timeout) and the
    environment is left as it was."""
    for name, value in openmpi_env(2, "localhost").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(GLOO_IFNAME, raising=False)
    before = dict(os.environ)
    with pytest.raises(ConfigError, match="resolves only to loopback"):
        Communicator.create({"backend": "gloo", "launcher": "openmpi", "timeout": 600})
    assert dict(os.environ) == before


def _ifname_inside(comm: Communicator) -> tuple[str | None, int, int]:
    local = comm.local_comm  # a group created later reads the variable too
    return os.environ.get(GLOO_IFNAME), comm.num_nodes, local.world_size


def test_gloo_ifname_is_set_while_the_communicator_is_open() -> None:
    """Two ranks that say they are on two nodes, meeting at this machine's network address."""
    interface, address = network_address()

    def env(rank: int) -> dict[str, str]:
        return {"MASTER_ADDR": address, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank)}

    assert run_ranks(_ifname_inside, 2, env=env) == [(interface, 2, 1)] * 2
