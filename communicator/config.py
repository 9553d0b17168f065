"""`CommConfig`: every setting of a communicator, validated once, from a dict, the environment or itself."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from communicator.errors import ConfigError
from communicator.launchers import launcher_names

__all__ = ["BACKENDS", "CommConfig", "ConfigLike", "Serializer", "Timeout", "seconds"]

BACKENDS = ("auto", "gloo", "nccl", "mpi")
SERIALIZERS = ("pickle", "safe")
DEFAULT_TIMEOUT = timedelta(minutes=30)
DEFAULT_SAFE_MAX_EXPANSION = 256
DEFAULT_OBJECT_BUFFER_BYTES = 16 * 1024 * 1024
MIN_OBJECT_BUFFER_BYTES = 64 * 1024

# Keys that other libraries use for the same setting (mmengine's `init_dist(port=...)`).
ALIASES = {"port": "master_port"}
ENV_PREFIX = "COMMUNICATOR_"


@runtime_checkable
class Serializer(Protocol):
    """A user codec: anything with ``dumps(obj) -> bytes`` and ``loads(data) -> obj``."""

    def dumps(self, obj: Any) -> bytes: ...

    def loads(self, data: bytes | memoryview) -> Any: ...


@dataclasses.dataclass(frozen=True)
class CommConfig:
    """Settings of a communicator. Every field is checked when the config is built.

    Example:
        >>> CommConfig.of({"backend": "gloo", "timeout": 60, "port": 29501}).master_port
        29501
    """

    backend: str = "auto"
    """``"auto"`` picks ``nccl`` when CUDA is usable, else ``gloo``."""
    launcher: str = "auto"
    """``"auto"`` detects torchrun, MPI or Slurm; ``"none"`` always gives a single process."""
    timeout: timedelta = DEFAULT_TIMEOUT
    """One timeout for every group the communicator creates (seconds or a ``timedelta``)."""
    init_method: str | None = None
    """A torch ``init_method`` URL (``tcp://``, ``file://``, ``env://``); default: tcp to the master."""
    master_addr: str | None = None
    """The rendezvous host; default: what the launcher says (``MASTER_ADDR``, the first Slurm host)."""
    master_port: int | None = None
    """The rendezvous port (mmengine's ``port`` is accepted); default: what the launcher says."""
    store: str | None = None
    """``host:port`` of a rendezvous store served outside the ranks (``communicator store`` serves
    one): the ranks join it as clients, so the loss of any rank, rank 0 included, leaves it up and
    the survivors can ``shrink()``. Default: world rank 0 serves it (torchrun's agent store under
    torchrun)."""
    device: str | None = None
    """The device tensors are moved to for communication (default: ``cuda:<local_rank>`` under NCCL, else CPU)."""
    serializer: str | Serializer = "pickle"
    """``"pickle"`` (protocol 5, out-of-band buffers), ``"safe"`` (restricted unpickler), or an
    object with ``dumps``/``loads``."""
    trusted: tuple[str, ...] = ()
    """Extra classes or module prefixes the ``"safe"`` serializer accepts (``"mypkg."``, ``"mypkg.Box"``)."""
    safe_max_expansion: int = DEFAULT_SAFE_MAX_EXPANSION
    """The memory the ``"safe"`` serializer lets one received object take while it is decoded: this
    many bytes per byte received, plus 1 MiB; a payload that would need more is refused."""
    object_buffer_bytes: int = DEFAULT_OBJECT_BUFFER_BYTES
    """The memory (bytes, at least 64 KiB) an object collective may use on top of the objects it
    sends: frames go in chunks of half this size, straight from the objects' memory where a chunk
    lies inside one array or tensor, else through one of two staging buffers. Receivers take the
    sender's chunk size from its record, so ranks may differ."""
    debug: bool = False
    """Compare every collective's fingerprint across ranks before running it."""
    stall_seconds: float = 10.0
    """After a wait this long (or half the timeout, if shorter), the waiting ranks compare what
    every rank is doing: ranks in different collectives raise ``CollectiveMismatchError``; ranks
    that are elsewhere are named in a log line, and the wait goes on."""
    stats: bool = False
    """Gather per-operation statistics from the start (``comm.stats()``); ``comm.profile()`` gathers
    them for one block either way."""
    trace_dir: str | None = None
    """Where each rank writes its flight recorder (the last ``trace_events`` operations) when an
    operation times out, finds a peer lost or closed, a mismatch, or another rank's failure."""
    trace_events: int = 256
    """How many operations each communicator's flight recorder keeps."""
    type: str | None = None
    """A registered communicator class (see ``Communicator.register``); ``None`` lets ``create`` choose."""
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Free-form settings for a registered custom communicator."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "backend", _choice("backend", self.backend, BACKENDS))
        set_(self, "launcher", _choice("launcher", self.launcher, launcher_names()))
        set_(self, "timeout", _timeout(self.timeout))
        set_(self, "master_port", _port(self.master_port))
        for name in ("init_method", "master_addr", "store", "device", "type", "trace_dir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name}={value!r} is invalid: expected a non-empty string or None")
        if self.store is not None:
            store_address(self.store)
        if self.device is not None:
            _device(self.device)
        if isinstance(self.serializer, str):
            set_(self, "serializer", _choice("serializer", self.serializer, SERIALIZERS))
        elif not isinstance(self.serializer, Serializer):
            raise ConfigError(
                f"serializer={self.serializer!r} is invalid: expected one of {SERIALIZERS} "
                "or an object with dumps(obj) -> bytes and loads(data) -> obj"
            )
        if isinstance(self.trusted, str) or not all(isinstance(t, str) for t in self.trusted):
            raise ConfigError(
                f"trusted={self.trusted!r} is invalid: expected a sequence of class names or module prefixes"
            )
        set_(self, "trusted", tuple(self.trusted))
        expansion = self.safe_max_expansion
        if isinstance(expansion, bool) or not isinstance(expansion, int) or expansion < 1:
            raise ConfigError(f"safe_max_expansion={expansion!r} is invalid: expected a positive integer")
        buffer = self.object_buffer_bytes
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < MIN_OBJECT_BUFFER_BYTES:
            raise ConfigError(
                f"object_buffer_bytes={buffer!r} is invalid: expected an integer of at least {MIN_OBJECT_BUFFER_BYTES}"
            )
        for flag in ("debug", "stats"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag}={getattr(self, flag)!r} is invalid: expected True or False")
        stall = self.stall_seconds
        if isinstance(stall, bool) or not isinstance(stall, (int, float)) or not stall > 0:
            raise ConfigError(f"stall_seconds={stall!r} is invalid: expected a positive number of seconds")
        set_(self, "stall_seconds", float(stall))
        events = self.trace_events
        if isinstance(events, bool) or not isinstance(events, int) or events < 1:
            raise ConfigError(f"trace_events={events!r} is invalid: expected a positive integer")
        if not isinstance(self.options, Mapping):
            raise ConfigError(f"options={self.options!r} is invalid: expected a mapping")

    @classmethod
    def of(cls, cfg: ConfigLike = None) -> CommConfig:
        """Build a config from ``None`` (the environment), a mapping, or a config (returned as is).

        A mapping that does not name ``store`` takes ``COMMUNICATOR_STORE`` from the environment:
        where the store outside the ranks runs is the deployment's to say, like the launcher's
        variables (``{"store": None}`` asks for none)."""
        if cfg is None:
            return cls.from_env()
        if isinstance(cfg, CommConfig):
            return cfg
        if isinstance(cfg, Mapping):
            store = os.environ.get(ENV_PREFIX + "STORE")
            if store and "store" not in cfg:
                return cls.from_mapping({**cfg, "store": store})
            return cls.from_mapping(cfg)
        raise ConfigError(
            f"cannot build a CommConfig from {type(cfg).__name__}: expected None, a mapping or a CommConfig"
        )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> CommConfig:
        """Build from a mapping; mmengine's ``port`` is accepted as ``master_port``."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            name = ALIASES.get(key, key)
            if name not in known:
                raise ConfigError(f"unknown config key {key!r}: expected one of {sorted(known | set(ALIASES))}")
            if name in kwargs:
                raise ConfigError(f"config key {name!r} given twice (directly and as an alias)")
            kwargs[name] = value
        return cls(**kwargs)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CommConfig:
        """Read ``COMMUNICATOR_<FIELD>`` variables (e.g. ``COMMUNICATOR_DEBUG=1``); defaults otherwise."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + field.name.upper())
            if raw is None or field.name == "options":
                continue
            values[field.name] = _parse_env(field.name, raw)
        return cls(**values)

    def replace(self, **changes: Any) -> CommConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


ConfigLike = CommConfig | Mapping[str, Any] | None


def _parse_env(name: str, raw: str) -> Any:
    if name in ("debug", "stats"):
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r} is invalid: expected 1/0, true/false, yes/no")
    if name in ("timeout", "stall_seconds"):
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r} is invalid: expected seconds") from None
    if name in ("master_port", "safe_max_expansion", "trace_events", "object_buffer_bytes"):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r} is invalid: expected an integer") from None
    if name == "trusted":
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    return raw


def store_address(value: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a pair; anything else is a ``ConfigError``."""
    host, _, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"store={value!r} is invalid: expected host:port of a running store")
    return host, int(port)


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value.lower() not in allowed:
        raise ConfigError(f"{name}={value!r} is invalid: expected one of {', '.join(allowed)}")
    return value.lower()


#: A duration as the API accepts it everywhere: seconds, or a ``timedelta``.
Timeout = float | timedelta


def seconds(value: object, name: str = "timeout") -> float | None:
    """``value`` (seconds or a ``timedelta``) in seconds; ``None`` stays ``None``.

    Anything else, or a duration that is not positive, is a ``ValueError`` naming ``name``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise ValueError(f"{name}={value!r} is invalid: expected seconds (int or float) or a timedelta")
    result = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not result > 0:
        raise ValueError(f"{name}={value!r} is invalid: expected a positive duration")
    return result


def _timeout(value: object) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise ConfigError(f"timeout={value!r} is invalid: expected seconds (int or float) or a timedelta")
    result = value if isinstance(value, timedelta) else timedelta(seconds=value)
    if result.total_seconds() <= 0:
        raise ConfigError(f"timeout={value!r} is invalid: expected a positive duration")
    return result


def _port(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ConfigError(f"master_port={value!r} is invalid: expected an integer in 1..65535")
    return value


def _device(value: str) -> None:
    import torch

    try:
        torch.device(value)
    except (RuntimeError, ValueError):
        raise ConfigError(f"device={value!r} is invalid: expected a torch device such as 'cpu' or 'cuda:0'") from None
