"""The launcher environment interface: what a scheduler tells each process about the job."""

from __future__ import annotations

import abc
import math
import os
import re
from collections.abc import Mapping

from communicator.errors import ConfigError
from communicator.launchers.topology import Topology

__all__ = ["LauncherEnv", "check_host", "check_port", "is_host", "read_int"]

_INTEGER = re.compile(r"-?[0-9]+")
# A DNS name or IPv4 address (letters, digits, '-', '_', dots between labels), or an IPv6 literal.
_HOST_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(?:%[A-Za-z0-9_.-]+)?")


def read_int(environ: Mapping[str, str], name: str, *, minimum: int = 0, launcher: str = "") -> int | None:
    """The integer in ``environ[name]`` (at least ``minimum``), or ``None`` when it is unset."""
    raw = environ.get(name)
    if raw is None:
        return None
    where = f"{launcher}: " if launcher else ""
    expected = f"expected an integer >= {minimum}"
    if _INTEGER.fullmatch(raw.strip()) is None:
        raise ConfigError(f"{where}{name}={raw!r} is not an integer; {expected}")
    value = int(raw)
    if value < minimum:
        raise ConfigError(f"{where}{name}={raw!r} is out of range; {expected}")
    return value


def is_host(text: str) -> bool:
    """Whether ``text`` can be a rendezvous host: a host name, an IPv4 or an IPv6 address."""
    return _HOST_NAME.fullmatch(text) is not None or _IPV6.fullmatch(text) is not None


def check_host(host: str, what: str) -> str:
    """``host`` when it can be a rendezvous host; ``what`` names its origin in the error."""
    if not is_host(host):
        raise ConfigError(f"{what}={host!r} is not a host name or IP address; expected e.g. 'node01' or '10.0.0.1'")
    return host


def check_port(port: int, what: str) -> int:
    """``port`` when it is a usable TCP port; ``what`` names its origin in the error."""
    if not 1 <= port <= 65535:
        raise ConfigError(f"{what}={port} is not a TCP port; expected an integer in 1..65535")
    return port


class LauncherEnv(abc.ABC):
    """What one launcher (torchrun, Slurm, an MPI implementation) says about this process.

    Subclasses read a snapshot of the environment (``environ``, default ``os.environ``) and expose
    the job layout through typed properties. ``detect()`` says whether the launcher's variables are
    present; ``missing()`` lists the variables a forced launcher still needs. Every property raises
    :class:`~communicator.errors.ConfigError` when a variable is malformed (non-numeric, a rank outside
    the world, an unbalanced hostlist).

    ``master_addr`` and ``master_port`` given to the constructor (from the configuration) win over
    whatever the environment says.
    """

    #: The name used in ``CommConfig(launcher=...)`` and shown by ``describe()``.
    name: str = ""
    #: What to do when a forced launcher's variables are missing (added to the error message).
    hint: str = ""
    #: Every variable this launcher reads, in the order ``describe_environment()`` shows them.
    variables: tuple[str, ...] = ()
    #: Variables the launcher gives its processes beyond those it reads (exact names) ...
    extra_variables: tuple[str, ...] = ()
    #: ... and by prefix: with ``variables``, what a process it did not start must not inherit.
    prefixes: tuple[str, ...] = ()

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        master_addr: str | None = None,
        master_port: int | None = None,
    ) -> None:
        self.environ: Mapping[str, str] = dict(os.environ if environ is None else environ)
        if master_addr is not None and not master_addr.strip():
            raise ConfigError(f"master_addr={master_addr!r} is empty; expected a host name or IP")
        self._master_addr = master_addr
        self._master_port = None if master_port is None else check_port(master_port, "master_port")

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Whether this launcher's variables are present in ``environ`` (by default: none is missing)."""
        return not cls.missing(environ)

    @classmethod
    @abc.abstractmethod
    def missing(cls, environ: Mapping[str, str]) -> list[str]:
        """The variables this launcher needs that ``environ`` lacks (empty when complete)."""

    @classmethod
    def sets(cls, name: str) -> bool:
        """Whether variable ``name`` is one this launcher gives the processes it starts."""
        return name in cls.variables or name in cls.extra_variables or name.startswith(cls.prefixes)

    @property
    @abc.abstractmethod
    def rank(self) -> int: ...

    @property
    @abc.abstractmethod
    def world_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def local_rank(self) -> int: ...

    @property
    @abc.abstractmethod
    def local_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def node_rank(self) -> int: ...

    @property
    @abc.abstractmethod
    def num_nodes(self) -> int: ...

    @abc.abstractmethod
    def _master_addr_from_env(self) -> tuple[str, str]:
        """The rendezvous host the environment implies, and where it came from (for ``explain``)."""

    @abc.abstractmethod
    def _master_port_from_env(self) -> tuple[int, str]:
        """The rendezvous port the environment implies, and where it came from (for ``explain``)."""

    @property
    def master_addr(self) -> str:
        """Host of rank 0's rendezvous store: the configured one, else what the environment implies."""
        return self._master_addr_with_origin()[0]

    @property
    def master_port(self) -> int:
        """Port of the rendezvous store: the configured one, else what the environment implies."""
        return self._master_port_with_origin()[0]

    @property
    def places_nodes(self) -> bool:
        """Whether the launcher says which node each rank is on; where it does not, the ranks' host
        names decide, once the group exists (see :func:`communicator.startup.start`)."""
        return True

    def topology(self) -> Topology:
        """Where this process sits in the job, as the launcher says."""
        return Topology(self.local_rank, self.local_size, self.node_rank, self.num_nodes)

    def validate(self) -> None:
        """Read every property once (``explain`` does), so a malformed variable raises here."""
        self.explain()

    def env_updates(self) -> dict[str, str]:
        """Variables the communicator sets while it is open, so that code expecting torchrun's
        names (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ...) finds them under any launcher."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            **self.topology().env_updates(),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    def explain(self, layout: Topology | None = None) -> str:
        """One line saying what this launcher reports (with ``layout`` in place of its own, once the
        ranks' host names decided it) and where the rendezvous address came from."""
        addr, addr_origin = self._master_addr_with_origin()
        port, port_origin = self._master_port_with_origin()
        at = layout or self.topology()
        return (
            f"{self.name}: rank {self.rank} of {self.world_size}, "
            f"local rank {at.local_rank} of {at.local_size}, "
            f"node {at.node_rank} of {at.num_nodes}, "
            f"master {addr}:{port} (host: {addr_origin}; port: {port_origin})"
        )

    def _master_addr_with_origin(self) -> tuple[str, str]:
        if self._master_addr is not None:
            return check_host(self._master_addr, "master_addr"), "configuration"
        addr, origin = self._master_addr_from_env()
        return check_host(addr, f"the master host ({origin})"), origin

    def _master_port_with_origin(self) -> tuple[int, str]:
        if self._master_port is not None:
            return self._master_port, "configuration"
        return self._master_port_from_env()

    # Helpers for subclasses: every variable is parsed and range-checked the same way.

    def _optional_int(self, name: str, *, minimum: int = 0) -> int | None:
        """The integer in variable ``name``, or ``None`` when it is unset."""
        return read_int(self.environ, name, minimum=minimum, launcher=self.name)

    def _int(self, name: str, *, minimum: int = 0) -> int:
        """The integer in variable ``name``, which must be set."""
        value = self._optional_int(name, minimum=minimum)
        if value is None:
            raise ConfigError(f"{self.name}: {name} is not set; expected an integer >= {minimum} from the launcher")
        return value

    def _optional_str(self, name: str) -> str | None:
        """The text of variable ``name``, or ``None`` when unset; set but blank is an error."""
        raw = self.environ.get(name)
        if raw is not None and not raw.strip():
            raise ConfigError(f"{self.name}: {name}={raw!r} is empty; expected a non-empty value")
        return None if raw is None else raw.strip()

    def _str(self, name: str) -> str:
        """The text of variable ``name``, which must be set."""
        value = self._optional_str(name)
        if value is None:
            raise ConfigError(f"{self.name}: {name} is not set; expected a non-empty value")
        return value

    def _optional_port(self, name: str) -> int | None:
        """The TCP port in variable ``name``, or ``None`` when unset."""
        value = self._optional_int(name)
        return None if value is None else check_port(value, name)

    def _first_int(self, *names: str, minimum: int = 0) -> tuple[str, int] | None:
        """The first of ``names`` that is set, with its integer value."""
        for name in names:
            value = self._optional_int(name, minimum=minimum)
            if value is not None:
                return name, value
        return None

    def _below(self, name: str, value: int, bound_name: str, bound: int) -> int:
        """``value`` (read from ``name``) when it is less than ``bound`` (read from ``bound_name``)."""
        if value >= bound:
            raise ConfigError(
                f"{self.name}: {name}={value} is out of range; expected a value below {bound_name} ({bound})"
            )
        return value

    def _local_size_or_world(self, name: str) -> int:
        """``name`` when set, else the whole world: without a per-node count, one node is the
        only layout that needs no further information."""
        value = self._optional_int(name, minimum=1)
        if value is None:
            return self.world_size
        if value > self.world_size:
            raise ConfigError(
                f"{self.name}: {name}={value} is out of range; expected at most the world size ({self.world_size})"
            )
        return value

    def _local_rank_or_derived(self, name: str) -> int:
        """``name`` when set, else ``rank % local_size`` (ranks placed on nodes in blocks)."""
        value = self._optional_int(name)
        if value is None:
            return self.rank % self.local_size
        return self._below(name, value, "the local size", self.local_size)

    def _nodes_from_world(self) -> int:
        """The node count implied by the world and local sizes (the last node may be partial)."""
        return math.ceil(self.world_size / self.local_size)

    def _node_rank_or_derived(self, *names: str) -> int:
        """The first of ``names`` that is set, else ``rank // local_size`` (block placement)."""
        found = self._first_int(*names)
        if found is None:
            return self.rank // self.local_size
        name, value = found
        return self._below(name, value, "the node count", self.num_nodes)
