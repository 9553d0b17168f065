"""A Slurm cluster of the hosts: its own munged and slurmctld on the first host, one slurmd per host.

Separate from the single-node cluster of ``/work/shared/launchers/setup_slurm.sh``: its own
``slurm.conf`` (``SLURM_CONF``), ports, state, logs and munge socket and key, all under the
network's work directory; the daemons run inside the hosts' namespaces. Node names are the
hosts' names and ``NodeAddr`` their addresses, so Slurm hands the ranks ``mnode[01-02]``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping

from hosts import Host, Network

# Not 6817/6818 (setup_slurm.sh's cluster), although separate namespaces could not collide anyway.
CTLD_PORT = 6917
SLURMD_PORT = 6918
# More CPUs than the machine has, so 4 ranks per node fit (the daemons are told to trust the config).
CPUS_PER_NODE = 4
TOOLS = ("munged", "munge", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "sinfo", "scancel")


def missing() -> str | None:
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    return f"a Slurm cluster needs {', '.join(absent)} (setup_slurm.sh installs them)" if absent else None


class SlurmCluster:
    """Start it with :meth:`start`; :meth:`close` cancels its jobs and stops its daemons."""

    def __init__(self, network: Network) -> None:
        self.network = network
        self.head: Host = network.hosts[0]
        self.dir = network.workdir / "slurm"
        self.conf = self.dir / "slurm.conf"
        self.socket = self.dir / "munge" / "munge.socket"
        self._daemons: list[tuple[str, subprocess.Popen[bytes]]] = []

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        return self.network.environ({**base, "SLURM_CONF": str(self.conf)})

    def start(self, timeout: float = 60) -> None:
        for sub in ("state", "munge", "key", *(f"spool-{host.name}" for host in self.network.hosts)):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir / "munge", 0o755)  # munged wants its socket's directory open to all
        os.chmod(self.dir / "key", 0o700)
        key = self.dir / "key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._spawn(
            self.head,
            "munged",
            ["munged", "-F", "--force", f"--socket={self.socket}", f"--key-file={key}"]
            + [f"--{what}-file={self.dir / 'munge' / f'munged.{what}'}" for what in ("pid", "log", "seed")],
        )
        self._wait(lambda: self.run(["munge", "-n", "-S", str(self.socket)]).returncode == 0, 20, "munged")
        self.conf.write_text(self._config())
        self._spawn(self.head, "slurmctld", ["slurmctld", "-D", "-c"])
        for host in self.network.hosts:
            self._spawn(host, f"slurmd-{host.name}", ["slurmd", "-D", "-N", host.name])
        self._wait(self._all_idle, timeout, "every node idle in sinfo")

    def run(
        self, argv: list[str], timeout: float = 30, base: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command on the head host, in ``base`` (default: this process's environment)."""
        return subprocess.run(
            self.head.command(argv),
            env=self.environ(os.environ if base is None else base),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def close(self) -> None:
        if any(name == "slurmctld" and daemon.poll() is None for name, daemon in self._daemons):
            jobs = self.run(["squeue", "-h", "-o", "%A"]).stdout.split()
            if jobs:
                self.run(["scancel", *jobs])
        for _, daemon in reversed(self._daemons):
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
        for _, daemon in reversed(self._daemons):
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=10)
        self._daemons.clear()

    def logs(self) -> str:
        """The tail of every daemon's log, for failure reports."""
        parts = []
        for log in sorted(self.dir.glob("*.log")):
            parts.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    def _spawn(self, host: Host, name: str, argv: list[str]) -> None:
        with (self.dir / f"{name}.log").open("ab") as log:
            daemon = subprocess.Popen(
                host.command(argv),
                env=self.environ(os.environ),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._daemons.append((name, daemon))

    def _all_idle(self) -> bool:
        states = self.run(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.split("\n")
        idle = {line.split()[0] for line in states if line.strip().endswith("idle")}
        return idle == {host.name for host in self.network.hosts}

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            exited = [name for name, daemon in self._daemons if daemon.poll() is not None]
            if exited or time.monotonic() > deadline:
                why = f"{', '.join(exited)} exited" if exited else f"not within {timeout:g} s"
                raise RuntimeError(f"Slurm cluster: waiting for {what}: {why}\n{self.logs()}")
            time.sleep(0.3)

    def _config(self) -> str:
        nodes = "".join(
            f"NodeName={host.name} NodeAddr={host.address} CPUs={CPUS_PER_NODE} RealMemory=1000 State=UNKNOWN\n"
            for host in self.network.hosts
        )
        return f"""# Written by tests/multinode/slurm_cluster.py for session {self.network.session}
ClusterName=multinode
SlurmctldHost={self.head.name}({self.head.address})
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
StateSaveLocation={self.dir / "state"}
SlurmdSpoolDir={self.dir}/spool-%n
SlurmctldPidFile={self.dir}/slurmctld.pid
SlurmdPidFile={self.dir}/slurmd-%n.pid
SlurmctldLogFile={self.dir}/slurmctld-daemon.log
SlurmdLogFile={self.dir}/slurmd-%n-daemon.log
{nodes}PartitionName=multinode Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""
