"""Debug mode's fingerprints: what each rank says about a collective before any data moves.

A fingerprint names the operation, its sequence number and the arguments that must agree across
ranks. Ranks exchange them and any difference raises the same
:class:`~communicator.errors.CollectiveMismatchError` on every rank, showing each rank's call.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from communicator.errors import CollectiveMismatchError

__all__ = ["check_fingerprints", "summarise_arguments", "fingerprint"]


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


def summarise_arguments(
    signature: inspect.Signature, comm: Any, args: tuple[Any, ...], kwargs: dict[str, Any], match: Sequence[str]
) -> dict[str, Any]:
    """The arguments named in ``match``, summarised so that ranks can compare them.

    A plain name compares the value (tensors: dtype and shape); ``"name:dtype"`` only a tensor's
    dtype and number of dimensions (shapes may legitimately differ); ``"name:len"`` a sequence's
    length; ``"name:keys"`` a mapping's keys.
    """
    bound = signature.bind(comm, *args, **kwargs)
    bound.apply_defaults()
    described = {}
    for spec in match:
        name, _, how = spec.partition(":")
        described[name] = _summary(bound.arguments[name], how)
    return described


def fingerprint(op: str, seq: int, arguments: Mapping[str, Any], site: str) -> dict[str, Any]:
    """What ranks compare in debug mode (the call site is shown, not compared: two branches may
    legitimately make the same call from different lines)."""
    return {"op": op, "seq": seq, "args": json.loads(json.dumps(arguments, default=str)), "site": site}


def check_fingerprints(sides: Sequence[Mapping[str, Any]]) -> None:
    """Raise on every rank when the ranks' fingerprints differ in operation, number or arguments."""
    first = sides[0]
    if any(any(side.get(k) != first.get(k) for k in ("op", "seq", "args")) for side in sides):
        raise CollectiveMismatchError(
            {
                r: f"#{side.get('seq')} {side.get('op')}({side.get('args')}) at {side.get('site')}"
                for r, side in enumerate(sides)
            },
            "debug mode: ranks called different collectives",
        )
