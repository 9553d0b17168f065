"""The guard every public collective runs through.

It numbers collectives, tells peers about this rank's bad arguments (so ranks already waiting in
the collective are released instead of hanging), and in debug mode compares a fingerprint of the
call across ranks before any data moves.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

if TYPE_CHECKING:
    from communicator.base import Communicator

__all__ = ["call_site", "collective", "describe_arguments", "fingerprint"]

F = TypeVar("F", bound=Callable[..., Any])
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def collective(*match: str, p2p: bool = False) -> Callable[[F], F]:
    """Mark a public method as a collective.

    ``match`` names the arguments that must agree across ranks in debug mode: a plain name
    compares the value (tensors: dtype and shape), ``"name:dtype"`` only a tensor's dtype and
    number of dimensions (shapes may legitimately differ), ``"name:len"`` a sequence's length,
    ``"name:keys"`` a mapping's keys. ``p2p`` methods are not compared (only two ranks take part).
    """

    def decorate(method: F) -> F:
        signature = inspect.signature(method)
        name = method.__name__

        @functools.wraps(method)
        def guarded(self: Communicator, *args: Any, **kwargs: Any) -> Any:
            if self._depth:  # called by another collective: the outer call is the one that counts
                return method(self, *args, **kwargs)
            self._enter(name)
            self._depth += 1
            try:
                if self.config.debug and not p2p:
                    self._compare_fingerprints(name, describe_arguments(signature, self, args, kwargs, match))
                self._launched = False
                return method(self, *args, **kwargs)
            except (TypeError, ValueError) as error:
                if not self._launched:
                    self._announce_bad_arguments(error, name)
                raise
            finally:
                self._depth -= 1

        return cast(F, guarded)

    return decorate


def _summary(value: Any, how: str) -> Any:
    if how == "dtype" and isinstance(value, torch.Tensor):
        return f"{value.dtype} with {value.dim()} dims"
    if how == "len":
        return len(value) if isinstance(value, Sequence) else repr(type(value).__name__)
    if how == "keys":
        return sorted(map(repr, value)) if isinstance(value, Mapping) else repr(type(value).__name__)
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return [_summary(v, how) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)


def describe_arguments(
    signature: inspect.Signature, comm: Any, args: tuple[Any, ...], kwargs: dict[str, Any], match: Sequence[str]
) -> dict[str, Any]:
    """The arguments named in ``match``, summarised so ranks can compare them."""
    bound = signature.bind(comm, *args, **kwargs)
    bound.apply_defaults()
    described = {}
    for spec in match:
        name, _, how = spec.partition(":")
        described[name] = _summary(bound.arguments[name], how)
    return described


def call_site() -> str:
    """The first caller outside this package: where the user called the collective."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
    return "unknown" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def fingerprint(op: str, seq: int, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """What ranks compare in debug mode (the call site is shown, not compared: two branches may
    legitimately make the same call from different lines)."""
    return {"op": op, "seq": seq, "args": json.loads(json.dumps(arguments, default=str)), "site": call_site()}
