"""Multi-node jobs for real: two hosts on a network, under torchrun, Open MPI's mpirun, srun and sbatch.

Each job runs ``multinode_job.py`` (the layout against the real hosts, subgroups, every tensor and
object collective across the hosts) or ``python -m communicator check`` on 2 hosts x 2 ranks. The hosts'
``/etc/hosts`` map their own names to 127.0.1.1 as stock Debian does, so gloo's default interface
is loopback: every job passes only because the library picks the interface (``ifname=eth0``).
Every run is bounded (``RUN_TIMEOUT``) and reports the output of every command when it fails.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest
from hosts import Host, Network
from jobs import JOB, OPENMPI_SETTINGS, REPO, Finished, clean_environ, report, run_on
from slurm_cluster import SlurmCluster

from communicator.cli.check import CHECKS, DEFAULT_SIZES

pytestmark = [pytest.mark.launchers, pytest.mark.timeout(400)]

RUN_TIMEOUT = 200  # seconds for one launcher run; 4 ranks on this machine's cores take far less
RANKS_PER_HOST = 2
PROBE = REPO / "tests" / "launcher_scripts" / "launcher_probe.py"
_ports = itertools.count(29400)  # free inside the hosts, where only this session's jobs run
OK_LINE = re.compile(r"^OK rank=(\d+) host=(\S+) node=(\d+)/(\d+) local=(\d+)/(\d+) ifname=(\S+) launcher=(\S+)$")


def _no_openmpi() -> str | None:
    if shutil.which("mpirun") is None:
        return "Open MPI's mpirun is not installed (setup_openmpi.sh installs it)"
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=30, check=False)
    return None if "Open MPI" in version.stdout + version.stderr else "mpirun is not Open MPI's"


def job_args(network: Network, launcher: str, *options: str) -> list[str]:
    return [str(JOB), "--launcher", launcher, "--hosts", ",".join(host.name for host in network.hosts), *options]


def torchrun(network: Network, script: Sequence[str]) -> list[tuple[Host, list[str]]]:
    """One torchrun agent per host, meeting at a c10d rendezvous on the first host."""
    port = next(_ports)
    head = network.hosts[0]
    return [
        (
            host,
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={len(network.hosts)}",
                f"--nproc-per-node={RANKS_PER_HOST}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={head.name}:{port}",
                f"--rdzv-id=job{port}",
                *script,
            ],
        )
        for host in network.hosts
    ]


def mpirun(
    network: Network, script: Sequence[str], *options: str, master: str | None = None
) -> list[tuple[Host, list[str]]]:
    """mpirun on the first host, with the first host as master unless told; the launch agent starts
    Open MPI's daemon on the other host."""
    reason = _no_openmpi()
    if reason is not None:
        pytest.skip(reason)
    head = network.hosts[0]
    hosts = ",".join(f"{host.name}:{RANKS_PER_HOST}" for host in network.hosts)
    command = ["mpirun", "--mca", "plm_rsh_agent", str(network.mpirun_agent()), "-H", hosts, *options]
    command += ["-x", f"MASTER_ADDR={master or head.name}", "-x", f"MASTER_PORT={next(_ports)}"]
    return [(head, [*command, sys.executable, *script])]


def assert_job_passed(finished: Sequence[Finished], network: Network, launcher: str) -> list[tuple[str, ...]]:
    """Every launcher command exited 0 and every rank printed its OK line; the parsed lines."""
    text = report(finished)
    assert all(item.returncode == 0 for item in finished), text
    output = "\n".join(item.stdout for item in finished)
    assert not re.findall(r"^FAIL .*$", output, flags=re.MULTILINE), text
    found = sorted((m.groups() for m in map(OK_LINE.match, output.splitlines()) if m), key=lambda g: int(g[0]))
    world = RANKS_PER_HOST * len(network.hosts)
    assert [int(line[0]) for line in found] == list(range(world)), text
    assert {line[1] for line in found} == {host.name for host in network.hosts}, text
    # The hosts' own names resolve to 127.0.1.1 first: gloo works because the library chose eth0.
    assert {(line[6], line[7]) for line in found} == {("eth0", launcher)}, text
    return found


def check_rows() -> int:
    return sum(len(DEFAULT_SIZES) if check.sized else 1 for check in CHECKS)


def assert_check_passed(finished: Sequence[Finished], launcher: str, world: int) -> None:
    """``communicator check``'s checks (``--check``): every command exited 0 (so did every rank), rank 0
    printed the pass table."""
    text = report(finished)
    assert all(item.returncode == 0 for item in finished), text
    output = "\n".join(item.stdout for item in finished)
    results = re.findall(r"^\S.*?\s{2}(?:-|\w+)\s+(pass|FAIL|skip|not run)\s+\d+\.\d+", output, flags=re.MULTILINE)
    assert results == ["pass"] * check_rows(), text
    assert f"why: {launcher}: rank 0 of {world}" in output, text
    assert re.search(r"node 0 of 2, master mnode0[12]:", output), text
    assert f"{check_rows()} passed, 0 failed, 0 skipped on {world} rank(s)" in output, text
    assert "check passed" in output, text


# -- the hosts themselves ---------------------------------------------------------------------------

HOST_REPORT = """
import json, socket
found = {"hostname": socket.gethostname(), "resolved": {}}
for name in %r:
    found["resolved"][name] = sorted({info[4][0] for info in socket.getaddrinfo(name, None, socket.AF_INET)})
with socket.create_server(("127.0.0.1", 0)) as server:  # loopback is up
    socket.create_connection(server.getsockname(), timeout=5).close()
print(json.dumps(found))
"""


def test_hosts_have_their_own_names_and_network(network: Network) -> None:
    names = [host.name for host in network.hosts]
    script = [sys.executable, "-c", HOST_REPORT % (names,)]
    finished = run_on(network, [(host, script) for host in network.hosts], clean_environ(), 60)
    assert all(item.returncode == 0 for item in finished), report(finished)
    for host, item in zip(network.hosts, finished, strict=True):
        seen = json.loads(item.stdout)
        assert seen["hostname"] == host.name, report(finished)
        for other in network.hosts:
            # Its own name: Debian's 127.0.1.1 and its address; another host's name: that host's address.
            want = sorted({other.address, "127.0.1.1"}) if other is host else [other.address]
            assert seen["resolved"][other.name] == want, report(finished)


def test_plain_gloo_across_hosts_falls_into_the_loopback_trap(network: Network) -> None:
    """Without the library's choice of interface, gloo offers 127.0.1.1 to the other host: the failure
    the library prevents is real on these hosts (the probe uses torch.distributed alone)."""
    finished = run_on(
        network,
        mpirun(network, [str(PROBE), "--expect-launcher", "openmpi", "--rendezvous"]),
        clean_environ(OPENMPI_SETTINGS),
        RUN_TIMEOUT,
    )
    text = report(finished)
    assert finished[0].returncode != 0, text
    assert "remote=[127.0.1.1]" in text, text


# -- torchrun ---------------------------------------------------------------------------------------


def test_torchrun_two_nodes_and_check(network: Network) -> None:
    script = job_args(network, "pytorch", "--check")
    finished = run_on(network, torchrun(network, script), clean_environ(), RUN_TIMEOUT)
    found = assert_job_passed(finished, network, "pytorch")
    # Each agent's ranks are consecutive and on its own host (which host gets node 0 is the rendezvous's choice).
    assert found[0][1] == found[1][1] != found[2][1] == found[3][1], report(finished)
    assert_check_passed(finished, "pytorch", 4)


# -- Open MPI ---------------------------------------------------------------------------------------


def test_openmpi_two_nodes_and_check(network: Network) -> None:
    command = mpirun(network, job_args(network, "openmpi", "--check"))
    finished = run_on(network, command, clean_environ(OPENMPI_SETTINGS), RUN_TIMEOUT)
    found = assert_job_passed(finished, network, "openmpi")
    assert [line[1] for line in found] == ["mnode01", "mnode01", "mnode02", "mnode02"]
    assert_check_passed(finished, "openmpi", 4)


def test_openmpi_round_robin_placement(network: Network) -> None:
    command = mpirun(network, job_args(network, "openmpi"), "--map-by", "node")
    finished = run_on(network, command, clean_environ(OPENMPI_SETTINGS), RUN_TIMEOUT)
    found = assert_job_passed(finished, network, "openmpi")
    assert [line[1] for line in found] == ["mnode01", "mnode02", "mnode01", "mnode02"]


LOOPBACK_JOB = """
import os, sys
from communicator import Communicator, ConfigError
try:
    Communicator.create().close()
except ConfigError as error:
    sys.stdout.write(f"ConfigError on rank {os.environ['OMPI_COMM_WORLD_RANK']}: {error}\\n")  # one write
    sys.stdout.flush()
"""


def test_loopback_master_is_a_config_error_on_every_rank(network: Network) -> None:
    """``MASTER_ADDR=localhost`` across hosts: every rank says why at once, instead of the hosts
    that are not rank 0's waiting for a store on themselves until the timeout."""
    command = mpirun(network, ["-c", LOOPBACK_JOB], master="localhost")
    started = time.monotonic()
    finished = run_on(network, command, clean_environ(OPENMPI_SETTINGS), RUN_TIMEOUT)
    text = report(finished) + f"\n(took {time.monotonic() - started:.1f} s)"
    # mpirun forwards each host's output in its own chunks: one rank's line may end after another's
    # began, so the reports are split at their openings, not at line ends.
    report_re = r"ConfigError on rank (\d+): (.*?)(?=ConfigError on rank \d+: |\Z)"
    reports = re.findall(report_re, finished[0].stdout, re.DOTALL)
    errors = sorted((rank, message.strip()) for rank, message in reports)
    assert [int(rank) for rank, _ in errors] == [0, 1, 2, 3], text
    for rank, message in errors:
        node = int(rank) // RANKS_PER_HOST
        said = (
            rf"the master host 'localhost' \(MASTER_ADDR\) resolves only to loopback \([^)]*127\.0\.0\.1[^)]*\) "
            rf"on rank {rank} \(node {node} of 2, host 'mnode0{node + 1}'\), but the job spans 2 hosts: "
        )
        assert re.match(said, message), text


# -- Slurm ------------------------------------------------------------------------------------------


def test_srun_two_nodes_and_check(network: Network, slurm: SlurmCluster) -> None:
    command = [(slurm.head, ["srun", "-N2", "-n4", sys.executable, *job_args(network, "slurm", "--check")])]
    finished = run_on(network, command, slurm.environ(clean_environ()), RUN_TIMEOUT)
    assert_job_passed(finished, network, "slurm")
    assert_check_passed(finished, "slurm", 4)


def test_info_says_what_each_node_derives(network: Network, slurm: SlurmCluster) -> None:
    """``communicator info`` on each node (one task per node): master host and port from Slurm, the
    interface from this host's route to the master."""
    command = [
        (slurm.head, ["srun", "-N2", "-n2", "--ntasks-per-node=1", sys.executable, "-m", "communicator", "info"])
    ]
    finished = run_on(network, command, slurm.environ(clean_environ()), RUN_TIMEOUT)
    text = report(finished)
    assert finished[0].returncode == 0, text
    decisions = sorted(re.findall(r"^decision: TorchComm: slurm: (rank \d) of 2, .*$", text, re.M))
    assert decisions == ["rank 0", "rank 1"], text
    assert re.search(r"node 1 of 2, master mnode01:\d+ \(host: first host of SLURM_STEP_NODELIST;", text), text
    networks = re.findall(r"^  network: (.*)$", text, flags=re.MULTILINE)
    assert networks == ["GLOO_SOCKET_IFNAME=eth0 (the interface of this host's route to the master)"] * 2, text


def wait_for_jobs(slurm: SlurmCluster, job_ids: Sequence[str], limit: float) -> bool:
    """Poll ``squeue`` until the jobs have left the queue (cancel them after ``limit`` seconds);
    whether they were all running at the same time at some point."""
    deadline = time.monotonic() + limit
    together = False
    while time.monotonic() < deadline:
        queued = slurm.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T"])
        states = dict(line.split() for line in queued.stdout.splitlines() if line.strip())
        if queued.returncode != 0 or not states:
            return together
        together = together or (len(states) == len(job_ids) and set(states.values()) == {"RUNNING"})
        time.sleep(0.5)
    slurm.run(["scancel", *job_ids])
    pytest.fail(f"sbatch jobs {job_ids} still queued or running after {limit:g} s (cancelled)\n{slurm.logs()}")


def test_two_sbatch_jobs_at_once_run_srun_across_nodes(network: Network, slurm: SlurmCluster) -> None:
    """Two batch scripts on the same 2 nodes at the same time: in each, ``srun`` starts 4 ranks across
    the nodes, and each job meets at its own port (derived from its job id), so they do not collide."""
    script = network.workdir / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --nodes=2\n"
        "#SBATCH --ntasks-per-node=2\n"
        f"#SBATCH --output={network.workdir}/sbatch-%j.out\n"
        f"#SBATCH --chdir={REPO}\n"
        f"srun {sys.executable} {' '.join(job_args(network, 'slurm'))}\n"
        'echo "job exit $?"\n'
    )
    job_ids = []
    for _ in range(2):
        submitted = slurm.run(["sbatch", "--parsable", str(script)], timeout=60, base=clean_environ())
        assert submitted.returncode == 0, submitted.stderr
        job_ids.append(submitted.stdout.strip().split(";")[0])
    assert wait_for_jobs(slurm, job_ids, RUN_TIMEOUT), "the two jobs never ran at the same time"
    ports = set()
    for job_id in job_ids:
        output = network.workdir / f"sbatch-{job_id}.out"
        text = output.read_text() if output.exists() else "(no output file)"
        assert "job exit 0" in text, f"sbatch job {job_id}:\n{text}\n{slurm.logs()}"
        found = assert_job_passed([Finished(slurm.head.name, ["sbatch", str(script)], 0, text, "")], network, "slurm")
        assert [line[1] for line in found] == ["mnode01", "mnode01", "mnode02", "mnode02"], text
        ports.update(re.findall(r"master mnode01:(\d+) \(host: first host of SLURM_STEP_NODELIST", text))
    assert len(ports) == 2, ports
