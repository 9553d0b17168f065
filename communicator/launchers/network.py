"""Multi-node network settings: checked and derived before a group is started.

A job on one node needs nothing here. A job of several nodes needs two things a single host
never shows:

- **gloo must listen on an interface the other nodes reach.** Without ``GLOO_SOCKET_IFNAME``,
  gloo binds to the first address this host's own name resolves to, which on a stock Debian or
  Ubuntu host is ``127.0.1.1``; the other nodes then fail to connect ("Connection refused,
  remote=[127.0.1.1]"). When ``GLOO_SOCKET_IFNAME`` is unset, :func:`network_env` sets it to the
  interface holding the source address of this host's route to the master, which is the network
  the job meets on. A value set by the user is always kept.
- **The master host must be reachable from every host.** A ``MASTER_ADDR`` that resolves only to
  loopback (``localhost``, ``127.0.0.1``, or a name that ``/etc/hosts`` maps to ``127.0.1.1``)
  makes the ranks of other hosts look for rank 0's store on themselves, and wait until the
  timeout. When the launcher reports ranks on several hosts (Slurm's node list, Open MPI's node
  count), :func:`network_env` raises a :class:`~communicator.errors.ConfigError` instead, before
  any rendezvous. Nodes that only say they are nodes (``LOCAL_WORLD_SIZE`` and ``GROUP_RANK`` set
  by hand, or torchrun's agents, which already met at that address) may share one host, where a
  loopback master works, so they are left alone. A master host that does not resolve is an error.

On rank 0's own host, ``/etc/hosts`` may map its name to ``127.0.1.1`` only, and the store still
works there (it listens on every interface). That is accepted when ``GLOO_SOCKET_IFNAME`` says
which interface gloo must use; without it there is no route to learn the interface from, and the
error says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import os
import socket
import urllib.parse
from collections.abc import Mapping

from communicator.errors import ConfigError
from communicator.launchers.base import LauncherEnv, read_int
from communicator.launchers.hostlist import expand_hostlist
from communicator.launchers.slurm import STEP_NODELIST_VARIABLES

__all__ = [
    "GLOO_IFNAME",
    "check_master",
    "describe_network",
    "hosts_reported",
    "interface_addresses",
    "interface_of",
    "is_loopback",
    "network_env",
    "resolve",
    "route_source",
]

#: gloo reads it when a group is created: a comma-separated list of interfaces to bind to.
GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
#: Open MPI's count of the hosts its daemons run on (every rank has it).
_OPENMPI_NODES = "OMPI_MCA_orte_num_nodes"


def network_env(
    env: LauncherEnv, init_method: str | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables this rank's group creation needs on a multi-node job: ``{}`` on one node, when
    ``GLOO_SOCKET_IFNAME`` is already set, or when the master is loopback on nodes that share this
    host; else ``{"GLOO_SOCKET_IFNAME": <interface>}``.

    The master host is the launcher's, or the host of a ``tcp://`` ``init_method``; another
    ``init_method`` (``file://``) has none, and nothing is checked or set.

    Raises:
        ConfigError: the master host does not resolve, resolves only to loopback addresses while
            the launcher reports several hosts, or cannot be routed to from this host.
    """
    environ = os.environ if environ is None else environ
    host: str | None
    if init_method in (None, "env://"):
        host, origin = env._master_addr_with_origin()
    else:
        host, origin = _tcp_host(init_method), "init_method"
    if env.num_nodes <= 1 or host is None:
        return {}
    master = f"the master host {host!r} ({origin})"
    where = f"on rank {env.rank} (node {env.node_rank} of {env.num_nodes}, host {socket.gethostname()!r})"
    addresses = resolve(host, f"{master} {where}")
    chosen = environ.get(GLOO_IFNAME, "").strip()
    check_master(
        host,
        addresses,
        hosts=hosts_reported(env.environ) or 1,
        node_rank=env.node_rank,
        gloo_ifname=chosen,
        origin=origin,
        where=where,
    )
    reachable = [address for address in addresses if not is_loopback(address)]
    if chosen or not reachable:  # the user's choice; or a loopback master of nodes on one host
        return {}
    source = route_source(reachable[0], f"{master} {where}")
    interface = interface_of(source, interface_addresses())
    if interface is None:
        raise ConfigError(
            f"the route to {master} ({reachable[0]}) leaves from {source} {where}, but no interface holds "
            f"that address; set {GLOO_IFNAME} to the interface the job's nodes share"
        )
    return {GLOO_IFNAME: interface}


def hosts_reported(environ: Mapping[str, str]) -> int | None:
    """How many hosts the launcher says the job runs on: Open MPI's node count, else the hosts of
    Slurm's node list (the step's, else the job's); ``None`` when no launcher says."""
    count = read_int(environ, _OPENMPI_NODES, minimum=1)
    if count is not None:
        return count
    nodelist = next((environ[name] for name in STEP_NODELIST_VARIABLES if name in environ), None)
    if nodelist is None:
        return None
    try:
        return len(set(expand_hostlist(nodelist)))
    except ConfigError:  # syntax only scontrol knows: the launcher's own check reports it
        return None


def describe_network(env: LauncherEnv, init_method: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """One line saying what :func:`network_env` decides for this rank (for ``communicator info``)."""
    environ = os.environ if environ is None else environ
    try:
        updates = network_env(env, init_method, environ)
    except ConfigError as error:
        return f"create() would raise ConfigError: {error}"
    if updates:
        return f"{GLOO_IFNAME}={updates[GLOO_IFNAME]} (the interface of this host's route to the master)"
    if env.num_nodes <= 1:
        return "one node: gloo's own choice of interface"
    if environ.get(GLOO_IFNAME, "").strip():
        return f"{GLOO_IFNAME}={environ[GLOO_IFNAME].strip()} (set here, kept)"
    return "gloo's own choice of interface (a loopback master of nodes on one host, or no tcp:// master)"


def _tcp_host(init_method: str) -> str | None:
    """The host of a ``tcp://HOST:PORT`` init method (brackets of an IPv6 literal removed)."""
    if not init_method.startswith("tcp://"):
        return None
    return urllib.parse.urlsplit(init_method).hostname or None


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP address, or a loopback name such as ``localhost``) is loopback."""
    if address.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def resolve(host: str, what: str = "") -> list[str]:
    """The addresses ``host`` resolves to on this host, in the resolver's order, without repeats;
    ``what`` describes it in the ConfigError raised when it does not resolve."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:  # UnicodeError: not a valid name (an empty label)
        raise ConfigError(
            f"{what or repr(host)} does not resolve ({error}); set MASTER_ADDR (or master_addr) to a name "
            "or address of rank 0's host that every node resolves"
        ) from None
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def check_master(
    host: str,
    addresses: list[str],
    *,
    hosts: int,
    node_rank: int,
    gloo_ifname: str = "",
    origin: str = "",
    where: str = "",
) -> None:
    """Raise ConfigError when the master ``host`` (resolving to ``addresses`` here) cannot serve a
    job that the launcher reports on ``hosts`` hosts, from this rank's node ``node_rank``;
    ``origin`` says where the host came from and ``where`` names the rank, for the message.

    Loopback only is an error when the job spans hosts: on every rank when ``host`` is a loopback
    name or address (every rank sees the same), and on any node other than the master's (node 0).
    On the master's node a name that resolves to loopback still reaches the local store, so it is
    accepted when ``gloo_ifname`` (``GLOO_SOCKET_IFNAME``) names the interface gloo must use.
    """
    if hosts <= 1 or any(not is_loopback(address) for address in addresses):
        return
    named = f"the master host {host!r}" + (f" ({origin})" if origin else "")
    loopback = f"{named} resolves only to loopback ({', '.join(addresses)}) {where}".rstrip()
    if is_loopback(host) or node_rank != 0:
        raise ConfigError(
            f"{loopback}, but the job spans {hosts} hosts: the ranks on other hosts cannot reach rank 0's "
            "store there; set MASTER_ADDR (or master_addr) to a name or address of rank 0's host that every "
            "host reaches"
        )
    if not gloo_ifname:
        raise ConfigError(
            f"{loopback}, rank 0's own host, and the job spans {hosts} hosts: gloo would offer that address to "
            f"the other hosts; map {host!r} to its network address in /etc/hosts, or set {GLOO_IFNAME} to the "
            "interface the other hosts reach this host on"
        )


def route_source(address: str, what: str = "") -> str:
    """The source address this host uses to reach ``address`` (no packet is sent); ``what``
    describes the destination in the ConfigError raised when there is no route."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))  # a UDP connect only picks the route
        except OSError as error:
            raise ConfigError(f"no route to {what or address} at {address} ({error})") from None
        return str(probe.getsockname()[0])


def interface_of(address: str, interfaces: Mapping[str, list[str]]) -> str | None:
    """The interface of ``interfaces`` (name: addresses) that holds ``address``."""
    wanted = ipaddress.ip_address(address.split("%")[0])
    for name, held in interfaces.items():
        if any(ipaddress.ip_address(item.split("%")[0]) == wanted for item in held):
            return name
    return None


class _SockAddr(ctypes.Structure):
    _fields_ = [("sa_family", ctypes.c_ushort), ("sa_data", ctypes.c_char * 14)]


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [
    ("ifa_next", ctypes.POINTER(_IfAddrs)),
    ("ifa_name", ctypes.c_char_p),
    ("ifa_flags", ctypes.c_uint),
    ("ifa_addr", ctypes.POINTER(_SockAddr)),
    ("ifa_netmask", ctypes.POINTER(_SockAddr)),
    ("ifa_ifu", ctypes.POINTER(_SockAddr)),
    ("ifa_data", ctypes.c_void_p),
]

# Where the address bytes sit in sockaddr_in (after family and port) and sockaddr_in6 (after flow info).
_ADDRESS_AT = {socket.AF_INET: (4, 4), socket.AF_INET6: (8, 16)}


def interface_addresses() -> dict[str, list[str]]:
    """Every interface of this host (in its network namespace) and its IPv4/IPv6 addresses, from
    ``getifaddrs(3)``: the same list gloo searches when ``GLOO_SOCKET_IFNAME`` is set."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    head = ctypes.POINTER(_IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        raise OSError(ctypes.get_errno(), "getifaddrs failed")
    interfaces: dict[str, list[str]] = {}
    try:
        entry = head
        while entry:
            item = entry.contents
            name = (item.ifa_name or b"").decode(errors="replace")
            interfaces.setdefault(name, [])
            if item.ifa_addr and item.ifa_addr.contents.sa_family in _ADDRESS_AT:
                family = item.ifa_addr.contents.sa_family
                offset, length = _ADDRESS_AT[family]
                raw = ctypes.string_at(ctypes.addressof(item.ifa_addr.contents) + offset, length)
                interfaces[name].append(socket.inet_ntop(family, raw))
            entry = item.ifa_next
    finally:
        libc.freeifaddrs(head)
    return interfaces
