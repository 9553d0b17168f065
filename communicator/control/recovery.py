"""Going on after a lost rank: ``revoke``, ``agree`` and ``shrink`` (a mixin of ``Communicator``).

They are not collectives in the guard's sense: they work on a communicator whose operations are
refused (after a lost peer, a failure or a revocation), and they never wait for a member that is
gone. They run through the control plane's store (:mod:`communicator.control.survivors`), so a
transport without one can only do them in a world of one.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from communicator.config import CommConfig, Timeout, seconds
from communicator.control import Control
from communicator.errors import CommError, PeerLostError, RevokedError
from communicator.guard import CallState

__all__ = ["Recoverable", "Recovery", "unusable"]

C = TypeVar("C")  # the communicator class this is mixed into: what ``shrink`` returns


def unusable(what: str, broken: CommError) -> CommError:
    """The refusal of operation ``what`` on a communicator that ``broken`` made unusable."""
    if isinstance(broken, RevokedError):
        return RevokedError(f"{what}: {broken}; call agree() or shrink(), or close it")
    return CommError(
        f"{what}: this communicator is unusable since an earlier operation was abandoned ({broken}); "
        "leave its block and create a new one, or go on with the survivors: shrink()"
    )


class Recoverable(Protocol):
    """What the recovery operations use of the communicator they are mixed into."""

    config: CommConfig
    _calls: CallState
    _children: list[Any]
    _closed: bool
    _shrinks: int

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def _plane(self) -> Control | None: ...

    def _shrunk(self, members: list[int], name: str) -> Any: ...


def _needs_plane(what: str) -> CommError:
    return CommError(
        f"{what} needs the control plane's store: this communicator's transport supplies none "
        "(see _control_store in docs/custom.md)"
    )


class Recovery(Generic[C]):
    """Revoking a communicator, agreeing among its live members, and shrinking it to them; ``C``
    is the class mixed into."""

    def revoke(self: Recoverable) -> None:
        """Make every member's pending and later operations on this communicator raise
        :class:`~communicator.errors.RevokedError`, so ranks stuck in different places all reach
        the recovery code. Not collective: one rank calls it; the others raise at their next look
        at the board (within about a second while they wait; a rank that is not waiting raises
        in its next operation that waits). ``agree``, ``shrink`` and ``close`` still work.

        Example:
            ```python
            # rank 1 calls comm.revoke()        rank 0 waits in comm.all_reduce(t)
            # rank 1: later operations raise    rank 0: RevokedError("... rank 1 revoked ...")
            ```
        """
        if self._closed:
            raise CommError("revoke(): this communicator is closed")
        error = RevokedError(f"rank {self.rank} revoked the communicator")
        control = self._plane()
        if control is not None:
            control.board.post_revoke(control.rank)
            control.broken = control.broken or error
        self._calls.refusal = lambda what: unusable(what, error)

    def agree(self: Recoverable, flag: bool, timeout: Timeout | None = None) -> bool:
        """Whether ``flag`` is true on every live member: the same answer on every rank that
        returns, even when a member dies during the call (whether its flag counted is decided once,
        for everyone). A member that is gone takes no part; one that is alive but does not call
        within ``timeout`` (default: the communicator's) is left out. It works on a revoked or
        broken communicator; every member calls it the same number of times.

        Example:
            ```python
            # rank 0: agree(True)   rank 1: agree(True)   rank 2: killed mid-step
            # rank 0: True          rank 1: True
            # rank 0: agree(True)   rank 1: agree(False)
            # rank 0: False         rank 1: False
            ```
        """
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"agree() takes a bool, got {type(flag).__name__}")
        limit = seconds(timeout) or self.config.timeout.total_seconds()
        if self._closed:
            raise CommError("agree(): this communicator is closed")
        control = self._plane()
        if control is None:
            if self.world_size == 1:
                return bool(flag)
            raise _needs_plane("agree()")
        return control.survivors.agree(bool(flag), limit)

    def shrink(self: Recoverable, timeout: Timeout | None = None) -> C:
        """A new communicator of the live members that call it, ranks renumbered in this one's
        order, with its own groups and its own failure board; this one stays as it is (close it,
        or leave its block, after the new one). Members that are gone are left out at once; one
        that is alive but does not call within ``timeout`` (default: the communicator's) is left
        out too, and raises :class:`~communicator.errors.ExcludedError` when it calls later.
        A member dying during the call is left out as well. Subgroups and ``local_comm()`` are
        derived from the new communicator as from any other.

        Example:
            ```python
            # world of 4; rank 2 is killed          ranks 0, 1, 3 catch PeerLostError
            comm = comm.shrink()                    # ranks 0, 1, 3 -> 0, 1, 2 of 3
            ```
        """
        limit = seconds(timeout) or self.config.timeout.total_seconds()
        if self._closed:
            raise CommError("shrink(): this communicator is closed")
        control = self._plane()
        if control is None:
            if self.world_size != 1:
                raise _needs_plane("shrink()")
            self._shrinks += 1
            number, members = self._shrinks, [0]
        else:
            number, members = control.survivors.shrink(limit, self.config.timeout.total_seconds())
        try:
            shrunk: C = self._shrunk(members, f"shrink{number}/")
        except CommError:
            raise
        except Exception as error:  # a transport's own error (torch's DistError, OSError)
            if control is not None:
                control.survivors.abandon(number)
            raise PeerLostError(
                f"shrink() on rank {self.rank}: forming the communicator of ranks {members} failed, "
                f"a chosen member was probably lost meanwhile ({type(error).__name__}: {error}); call shrink() again"
            ) from error
        self._children.append(shrunk)  # closed before this one, whose teardown may free what it uses
        return shrunk
