"""Several hosts on one Linux machine, for multi-node jobs over a real network.

Each host is a network namespace with its own hostname (a UTS namespace per command) and its own
``/etc/hosts``; the hosts are joined by veth pairs on a bridge that lives in a namespace of its
own, so nothing is added to the machine's own network. Addresses come from a /24 of 198.18.0.0/15
(reserved for network tests) that the machine does not use.

Each host's ``/etc/hosts`` is what a stock Debian host has, plus the cluster's entries::

    127.0.0.1    localhost
    127.0.1.1    mnode01        <- the installer's line for the host's own name
    198.18.N.1   mnode01
    198.18.N.2   mnode02

so a host's own name resolves to ``127.0.1.1`` first: the classic reason a gloo job across
hosts fails (gloo offers that address to the other hosts).

A command runs on a host through :meth:`Host.command`: ``nsenter`` into the host's network
namespace, then ``unshare`` a mount and a UTS namespace that bind ``/etc/netns/NS/hosts`` over
``/etc/hosts`` and set the hostname. (``ip netns exec`` does the bind too, but it also mounts a
fresh ``/sys`` without the cgroup file systems ``slurmd`` needs.)

Every name the facility creates starts with its session, ``cmn<pid>x<start time>``: the pytest
process that owns it (then the network's number: ``cmn812x1k2f-1h1``). :func:`sweep_leftovers`
removes what a crashed session left (its owner is gone); :meth:`Network.close` removes
everything of its own, first killing every process inside its namespaces and every process
marked as its own: each one started here carries ``NETWORK_VARIABLE`` (the network's prefix) in
its environment, so :func:`session_processes` also finds any that escaped.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "cmn"
NETWORK_VARIABLE = "COMMUNICATOR_MULTINODE_NETWORK"
JOB_VARIABLE = "COMMUNICATOR_MULTINODE_JOB"
NETNS_ETC = Path("/etc/netns")
TOOLS = ("ip", "nsenter", "unshare", "mount", "hostname")
_networks = itertools.count(1)
_SESSION = re.compile(rf"^({PREFIX}(\d+)x([0-9a-z]+))-")
_HOSTS_TEMPLATE = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{own}\n"
# On a host: bind its hosts file over /etc/hosts, set its name, run the command.
_ENTER = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks after boot, base 36), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    digits = ""
    while True:
        ticks, digit = divmod(ticks, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[digit] + digits
        if ticks == 0:
            return digits


def session_name(pid: int | None = None) -> str:
    """The session of process ``pid`` (default: this one): unique while it lives, and checkable after."""
    pid = os.getpid() if pid is None else pid
    return f"{PREFIX}{pid}x{_start_time(pid)}"


@functools.cache
def missing() -> str | None:
    """Why hosts cannot be made here (no root, a tool missing, namespaces or mounts refused), or None."""
    if os.geteuid() != 0:
        return "multi-node tests need root (network namespaces, mounts)"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"multi-node tests need {', '.join(absent)}"
    probe = Host("mnode-probe", "", f"{session_name()}-probe")
    try:
        made = _ip("netns", "add", probe.netns, check=False)
        if made.returncode != 0:
            return f"cannot create a network namespace: {made.stderr.strip()}"
        probe.hosts_file.parent.mkdir(parents=True, exist_ok=True)
        probe.hosts_file.write_text(_HOSTS_TEMPLATE.format(own=probe.name))
        ran = subprocess.run(probe.command(["hostname"]), capture_output=True, text=True, timeout=30, check=False)
        if ran.returncode != 0 or ran.stdout.strip() != probe.name:
            return f"cannot run a command as a host (mount and UTS namespaces): {ran.stderr.strip()}"
    finally:
        _remove_namespace(probe.netns)
    return None


def root_links() -> dict[str, str]:
    """The interfaces of the machine's own network namespace and their kinds (``veth``, ``bridge``, ...)."""
    listed = json.loads(_ip("-j", "-d", "link", check=False).stdout or "[]")
    return {entry["ifname"]: entry.get("linkinfo", {}).get("info_kind", "") for entry in listed}


def namespaces() -> list[str]:
    """Every network namespace of the machine, by name."""
    listed = _ip("-j", "netns", "list", check=False).stdout.strip()
    return [entry["name"] for entry in json.loads(listed or "[]")]


def netns_pids(netns: str) -> list[int]:
    return [int(pid) for pid in _ip("netns", "pids", netns, check=False).stdout.split()]


def _proc_environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def marked_processes(variable: str, value: str, *, prefix: bool = False) -> list[int]:
    """Processes whose environment holds ``variable=value`` (``value`` and more, with ``prefix``)."""
    marker = f"{variable}={value}".encode()
    pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and int(entry) != os.getpid()]
    return [
        pid
        for pid in pids
        if any(item == marker or (prefix and item.startswith(marker)) for item in _proc_environ(pid).split(b"\0"))
    ]


def session_processes(session: str) -> list[int]:
    """The processes any network of ``session`` started that are still running."""
    return marked_processes(NETWORK_VARIABLE, session, prefix=True)


def kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _remove_namespace(netns: str) -> None:
    """Kill every process inside ``netns``, then delete it and its /etc/netns directory."""
    deadline = time.monotonic() + 20
    while (pids := netns_pids(netns)) and time.monotonic() < deadline:
        kill_all(pids)
        time.sleep(0.1)
    _ip("netns", "del", netns, check=False)
    shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)


def sweep_leftovers() -> list[str]:
    """Remove the namespaces, /etc/netns directories and work directories of sessions whose owner
    has died (a crashed or killed run); what was removed."""
    removed = []
    listed = {*namespaces(), *(p.name for p in NETNS_ETC.glob(f"{PREFIX}*"))}
    for name in sorted(listed):
        match = _SESSION.match(name)
        if match is not None and _start_time(int(match[2])) != match[3]:
            _remove_namespace(name)
            removed.append(name)
    for workdir in Path(tempfile.gettempdir()).glob(f"{PREFIX}*work*"):
        match = _SESSION.match(workdir.name)
        if match is not None and _start_time(int(match[2])) != match[3]:
            shutil.rmtree(workdir, ignore_errors=True)
            removed.append(str(workdir))
    return removed


#: The machine's own interfaces when the tests started: the facility must add none.
ROOT_LINKS_AT_START = root_links() if shutil.which("ip") else {}


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 198.18.0.0/15 that no address or route of this machine overlaps."""
    used: list[ipaddress.IPv4Network] = []
    for entry in json.loads(_ip("-j", "addr").stdout or "[]"):
        for info in entry.get("addr_info", []):
            if info.get("family") == "inet":
                used.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(_ip("-j", "route").stdout or "[]"):
        if route.get("dst", "default") != "default":
            used.append(ipaddress.IPv4Network(route["dst"], strict=False))
    pool = ipaddress.IPv4Network("198.18.0.0/15")
    offset = os.getpid() % 256  # concurrent sessions start at different places (they could share one anyway)
    candidates = list(pool.subnets(new_prefix=24))
    for subnet in candidates[offset:] + candidates[:offset]:
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise RuntimeError("every /24 of 198.18.0.0/15 overlaps an address or route of this machine")


@dataclass(frozen=True)
class Host:
    """One host: its name, its address on the cluster network, its namespace."""

    name: str
    address: str
    netns: str

    @property
    def hosts_file(self) -> Path:
        return NETNS_ETC / self.netns / "hosts"

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host (its network, hostname and /etc/hosts)."""
        return [
            "nsenter",
            f"--net=/run/netns/{self.netns}",
            "--",
            "unshare",
            "--mount",
            "--uts",
            "--",
            "sh",
            "-c",
            _ENTER,
            "host",
            str(self.hosts_file),
            self.name,
            *argv,
        ]


@dataclass
class Network:
    """``count`` hosts named ``mnode01``, ``mnode02``, ... on one bridge. Use it as a context
    manager: leaving the block removes everything, whatever happened inside."""

    count: int = 2
    session: str = field(default_factory=session_name)
    prefix: str = field(init=False)  # of every name this network makes
    hosts: list[Host] = field(default_factory=list)
    workdir: Path = field(init=False)
    subnet: ipaddress.IPv4Network = field(init=False)
    _made: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.prefix = f"{self.session}-{next(_networks)}"

    @property
    def switch(self) -> str:
        return f"{self.prefix}sw"

    def __enter__(self) -> Network:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}work"))
        self.subnet = free_subnet()
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        for device in ("br0", "lo"):
            _ip("-n", self.switch, "link", "set", device, "up")
        addresses = list(self.subnet.hosts())
        names = [f"mnode{index:02d}" for index in range(1, self.count + 1)]
        cluster = "".join(f"{addresses[i]}\t{name}\n" for i, name in enumerate(names))
        for index, name in enumerate(names):
            host = Host(name, str(addresses[index]), f"{self.prefix}h{index + 1}")
            self._add_namespace(host.netns)
            port = f"p{index + 1}"
            _ip("link", "add", "eth0", "netns", host.netns, "type", "veth", "peer", "name", port, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
            for device in ("lo", "eth0"):
                _ip("-n", host.netns, "link", "set", device, "up")
            host.hosts_file.parent.mkdir(parents=True, exist_ok=True)
            host.hosts_file.write_text(_HOSTS_TEMPLATE.format(own=name) + cluster)
            self.hosts.append(host)

    def _add_namespace(self, netns: str) -> None:
        self._made.append(netns)  # before creating it: a half-made namespace is removed too
        _ip("netns", "add", netns)

    def close(self) -> None:
        """Kill every process inside the hosts, delete the namespaces (their interfaces go with
        them), the /etc/netns directories and the work directory."""
        for netns in reversed(self._made):
            _remove_namespace(netns)
        self._made.clear()
        kill_all(marked_processes(NETWORK_VARIABLE, self.prefix))
        if hasattr(self, "workdir"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def environ(self, base: Mapping[str, str], job: str = "") -> dict[str, str]:
        """``base`` plus the markers that let the facility find the processes of this session (and job)."""
        return {**base, NETWORK_VARIABLE: self.prefix, **({JOB_VARIABLE: job} if job else {})}

    def mpirun_agent(self) -> Path:
        """A launch agent for Open MPI's ``--mca plm_rsh_agent``: it runs the remote command on the
        named host, as ``ssh HOST COMMAND`` would."""
        agent = self.workdir / "launch-agent.sh"
        cases = "".join(
            f'  {host.name}) exec {shlex.join(host.command(["sh", "-c"]))} "$*" ;;\n' for host in self.hosts
        )
        agent.write_text(
            "#!/bin/sh\n"
            "# Open MPI calls it as: agent HOST COMMAND... (like ssh)\n"
            'target=$1\nshift\ncase "$target" in\n'
            f"{cases}"
            '  *) echo "launch agent: unknown host $target" >&2; exit 1 ;;\n'
            "esac\n"
        )
        agent.chmod(0o755)
        return agent
