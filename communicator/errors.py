"""Every error the library raises. All derive from :class:`CommError`, itself a ``RuntimeError``."""

from __future__ import annotations

import json
import traceback as tracebacks
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "CollectiveMismatchError",
    "CommError",
    "CommTimeoutError",
    "ConfigError",
    "ExcludedError",
    "NotMemberError",
    "PeerClosedError",
    "PeerLostError",
    "RemoteError",
    "RemoteFailure",
    "RevokedError",
]


class CommError(RuntimeError):
    """Base class of the library's errors."""


class ConfigError(CommError, ValueError):
    """A configuration or launcher environment that cannot work; raised before any communication."""


class CommTimeoutError(CommError, TimeoutError):
    """An operation did not finish within its timeout.

    ``missing_ranks`` names the ranks (local to the communicator) that did not arrive, when that is
    knowable (barriers, and any wait whose stall was diagnosed); otherwise it is ``None``.
    """

    def __init__(self, message: str, missing_ranks: Sequence[int] | None = None) -> None:
        super().__init__(message)
        self.missing_ranks: tuple[int, ...] | None = None if missing_ranks is None else tuple(missing_ranks)


class PeerLostError(CommError):
    """A peer process died or closed its connection while this rank was communicating with it."""


class PeerClosedError(PeerLostError):
    """A peer closed its communicator before joining the operation this rank waits in.

    ``peer`` is its rank; ``completed`` the number of collectives it ran before closing.
    """

    def __init__(self, peer: int, completed: int, last: str, waiting: str) -> None:
        super().__init__(
            f"{waiting}: rank {peer} closed its communicator after {completed} collectives (the last: "
            f"{last or 'none'}), so it will never join this one: the ranks called different sequences "
            "of collectives"
        )
        self.peer = peer
        self.completed = completed


class NotMemberError(CommError):
    """A collective was called on a subgroup communicator by a rank that is not a member."""


class RevokedError(CommError):
    """A member revoked the communicator (``revoke()``): every pending and later operation raises
    this, so ranks stuck in different places all reach the recovery code. ``agree()``,
    ``shrink()`` and ``close()`` still work."""


class ExcludedError(CommError):
    """``shrink()`` formed the survivors' communicator without this rank: it called too late (or
    was found gone), so it must leave."""


@dataclass(frozen=True)
class RemoteFailure:
    """What one rank reported when it failed: its rank, error type, message and traceback."""

    rank: int
    error_type: str
    message: str
    traceback: str = ""
    where: str = ""

    def __str__(self) -> str:
        where = f" in {self.where}" if self.where else ""
        return f"rank {self.rank} raised {self.error_type}{where}: {self.message}"

    @classmethod
    def of(cls, rank: int, error: BaseException, where: str = "") -> RemoteFailure:
        """What ``rank`` reports when it fails with ``error`` in ``where``."""
        return cls(rank, type(error).__name__, str(error), "".join(tracebacks.format_exception(error)), where)

    def to_json(self, limit: int = 8192) -> bytes:
        """The report as JSON of at most ``limit`` bytes: the traceback is cut first, then the message."""
        data = b""
        for keep in (len(self.traceback), 4000, 1200, 600, 200, 0):
            info = {
                "rank": self.rank,
                "type": self.error_type,
                "message": self.message[: max(keep, 300)],
                "where": self.where,
                "traceback": self.traceback[-keep:] if keep else "",
            }
            data = json.dumps(info).encode()
            if len(data) <= limit:
                break
        return data[:limit]

    @classmethod
    def from_json(cls, data: bytes | str) -> RemoteFailure:
        info = json.loads(data)
        return cls(int(info["rank"]), info["type"], info["message"], info.get("traceback", ""), info.get("where", ""))


class RemoteError(CommError):
    """Another rank (or several) failed; raised on every rank so none is left waiting.

    ``failures`` holds one :class:`RemoteFailure` per failed rank; ``rank``, ``error_type`` and
    ``message`` describe the first of them.
    """

    def __init__(self, failures: Sequence[RemoteFailure], context: str = "") -> None:
        if not failures:
            raise ValueError("RemoteError needs at least one failure")
        self.failures: tuple[RemoteFailure, ...] = tuple(sorted(failures, key=lambda f: f.rank))
        self.context = context
        first = self.failures[0]
        self.rank: int = first.rank
        self.error_type: str = first.error_type
        self.remote_message: str = first.message
        head = f"{context}: " if context else ""
        lines = "; ".join(str(f) for f in self.failures)
        super().__init__(f"{head}{lines}")

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks that failed, in order."""
        return tuple(f.rank for f in self.failures)

    def remote_tracebacks(self) -> str:
        """Every failed rank's traceback, one after another."""
        return "\n".join(f"--- rank {f.rank} ---\n{f.traceback}" for f in self.failures)


class CollectiveMismatchError(CommError):
    """Ranks called different collectives, or the same one with arguments that must agree.

    Raised on every rank: by debug mode (op, sequence number, arguments), and always where a
    collective already exchanges what it needs to tell (``all_reduce_dict`` keys, ``new_group``
    member lists, gathered tensors' dtypes and dimensions).

    ``sides`` maps each rank to the description of the call it made; ``what`` says what differs.
    """

    def __init__(self, sides: Mapping[int, str], what: str = "collective calls differ") -> None:
        self.sides: dict[int, str] = dict(sides)
        self.what = what
        table = "\n".join(f"  rank {r}: {s}" for r, s in sorted(self.sides.items()))
        super().__init__(f"{what} across ranks:\n{table}")
