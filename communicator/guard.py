"""The guard every public operation runs through, applied in one place.

``@collective`` marks a public method of :class:`~communicator.base.Communicator`, and
``Communicator.__init_subclass__`` applies the same guard to a subclass's overrides, so a subclass
cannot lose it. For each outermost call the guard

- refuses a communicator that is closed, unusable after an abandoned operation, or of which this
  rank is not a member (``CallState.refusal``);
- refuses a second thread while an operation runs (ranks must see operations in one order);
- numbers collectives (``seq``; point-to-point operations take two ranks, so they do not count);
- in debug mode, compares a fingerprint of the call across ranks before any data moves;
- tells the peers when this rank refuses its arguments before communicating, so that ranks
  already waiting in the operation are released.

Operations called by other operations (``sync_random_seed`` broadcasting an object, say) run
unguarded: the outer call is the one that counts.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from communicator.errors import CommError
from communicator.fingerprints import describe_arguments

__all__ = ["CallState", "Spec", "collective", "guarded"]

F = TypeVar("F", bound=Callable[..., Any])


class Spec(NamedTuple):
    """A guarded operation: its name, the arguments debug mode compares, whether it is point-to-point."""

    name: str
    match: tuple[str, ...]
    p2p: bool
    signature: inspect.Signature


class CallState:
    """What the guard keeps for one communicator."""

    __slots__ = ("busy", "launched", "op", "refusal", "seq", "thread")

    def __init__(self) -> None:
        self.busy = threading.Lock()  # held while an operation runs
        self.thread = 0  # the thread running it
        self.op = ""  # the public operation running, or that ran last
        self.seq = 0  # collectives entered so far: the same on every rank of a correct program
        self.launched = False  # whether the running operation has started communicating
        self.refusal: Callable[[str], CommError] | None = None  # why operations are refused, when they are


def collective(*match: str, p2p: bool = False) -> Callable[[F], F]:
    """Mark a public method as an operation every call of which goes through the guard.

    ``match`` names the arguments debug mode compares across ranks (see
    :func:`~communicator.fingerprints.describe_arguments`).
    """

    def decorate(method: F) -> F:
        return guarded(method, Spec(method.__name__, match, p2p, inspect.signature(method)))

    return decorate


def guarded(method: F, spec: Spec) -> F:
    """``method`` behind the guard of ``spec``."""
    name = spec.name

    @functools.wraps(method)
    def guard(self: Any, *args: Any, **kwargs: Any) -> Any:  # self: a Communicator
        calls = self._calls
        if not calls.busy.acquire(False):
            if calls.thread == threading.get_ident():  # called by another operation: the outer call counts
                return method(self, *args, **kwargs)
            raise CommError(
                f"{name}: this communicator is running {calls.op} in another thread; a communicator's "
                "operations must be issued by one thread at a time (ranks must see them in one order)"
            )
        try:
            if calls.refusal is not None:
                raise calls.refusal(name)
            calls.thread, calls.op, calls.launched = threading.get_ident(), name, False
            if not spec.p2p:
                calls.seq += 1
                if self.config.debug:
                    self._compare_fingerprints(name, describe_arguments(spec.signature, self, args, kwargs, spec.match))
            return method(self, *args, **kwargs)
        except (TypeError, ValueError) as error:
            if not calls.launched:  # peers may already wait in this operation: release them
                self._announce_bad_arguments(error, name)
            raise
        finally:
            calls.thread = 0
            calls.busy.release()

    guard.__collective__ = spec  # type: ignore[attr-defined]
    return guard  # type: ignore[return-value]
