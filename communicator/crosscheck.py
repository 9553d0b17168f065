"""Mismatched arguments caught without debug mode, at a cost within a call's budget.

gloo trusts its callers: ranks passing different shapes or dtypes to one collective abort the
process (SIGABRT) or read each other's bytes as the wrong type, and different roots wait until
the timeout. Checking every call would cost a second round trip each; most such bugs are
systematic, so the arguments that must agree (see :func:`key`) are compared across ranks

- on the first call with each set of them on this communicator (a set seen before is not
  checked again: in a correct program every rank sees the same sets in the same order, so every
  rank decides alike), and
- on every ``SAMPLE``-th collective, by its number (the same on every rank), whatever its arguments.

The comparison travels point to point on the library's own tag (``CHECK_TAG``), never as a
collective: a rank that decided otherwise (it has seen its arguments before, the others' are
new: they differ) is then in a different operation, not paired with one in the backend, and the
stall diagnosis names the mismatch (after ``stall_seconds``; the communicator is then unusable).
Rank 0 compares the descriptions and answers each rank with the verdict, so every rank raises
the same :class:`~communicator.errors.CollectiveMismatchError` and the communicator stays usable
(no data moved). Only communicators whose transfers the control plane waits on whole check this
way (``TorchComm`` and its subgroups); other subclasses compare calls in debug mode.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from communicator.arguments import CHECK_TAG
from communicator.errors import CollectiveMismatchError
from communicator.observe.events import OP

__all__ = ["CHECKING", "MAX_KEYS", "SAMPLE", "CheckedArguments", "check_arguments", "key"]

#: Every ``SAMPLE``-th collective is checked, whatever its arguments.
SAMPLE = 1024
#: Argument sets remembered per communicator; past it the memory starts over (on every rank alike).
MAX_KEYS = 4096
_SIDE_BYTES = 512  # one rank's description
_VERDICT_BYTES = 4096  # rank 0's answer: empty when the ranks agree
_NAMED = 6  # ranks a verdict shows besides rank 0
#: What an operation's name says while its arguments are checked (as statuses and events show it).
CHECKING = " (argument check)"


def key(name: str, tensor: torch.Tensor, *rest: Any) -> tuple[Any, ...]:
    """What must agree across ranks: the operation, ``tensor``'s dtype and shape, and ``rest``."""
    return (name, tensor.dtype, tensor.shape, *rest)


def check_arguments(comm: Any, arguments: tuple[Any, ...], labels: Sequence[str]) -> None:
    """Check ``arguments`` (see :func:`key`; ``labels`` name what follows the tensor) across the
    ranks of ``comm`` (a Communicator) when they are due; debug mode compares every call already."""
    calls = comm._calls
    memory = calls.checked_arguments
    if arguments in memory.seen and calls.seq % SAMPLE:  # the common case, at once
        return
    if comm.world_size == 1 or comm.config.debug or not type(comm).whole_transfer_waits:
        memory.checked(arguments)  # nothing to check here: remembered, so the next call returns at once
        return
    record = calls.running
    name = record[OP]
    record[OP] = name + CHECKING  # a rank that skipped the check is in another operation
    try:
        _compare(comm, side_of(arguments, labels), calls.seq)
    finally:
        record[OP] = name
        calls.started = False  # the operation itself has not started
    memory.checked(arguments)


class CheckedArguments:
    """One communicator's memory of the argument sets already checked."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen: set[tuple[Any, ...]] = set()

    def checked(self, arguments: tuple[Any, ...]) -> None:
        """Remember ``arguments`` once every rank agreed on them (a failed check remembers nothing,
        on any rank, so that the next call decides alike everywhere)."""
        if len(self.seen) >= MAX_KEYS:
            self.seen.clear()
        self.seen.add(arguments)


def side_of(arguments: tuple[Any, ...], labels: Sequence[str]) -> str:
    """``all_reduce(torch.float32[4], op=sum, dst=1)``: the arguments as a rank shows them."""
    name, *values = arguments
    shown = []
    if len(values) > len(labels):  # a tensor's dtype and shape come first
        shown.append(f"{values[0]}{list(values[1])}")
        values = values[2:]
    shown += [f"{label}={value}" for label, value in zip(labels, values, strict=True)]
    return f"{name}({', '.join(shown)})"


def _compare(comm: Any, mine: str, seq: int) -> None:
    """Compare ``mine`` with every rank's description through rank 0; raise the same
    ``CollectiveMismatchError`` on every rank when they differ."""
    rank, world = comm.rank, comm.world_size

    def start(row: np.ndarray, peer: int, send: bool) -> Any:
        return comm._start(comm._isend if send else comm._irecv, torch.from_numpy(row), peer, CHECK_TAG)

    if rank == 0:
        rows = [np.zeros(_SIDE_BYTES, dtype=np.uint8) for _ in range(world - 1)]
        comm._await([start(row, r + 1, False) for r, row in enumerate(rows)])
        sides = {0: mine, **{r + 1: _text(row) for r, row in enumerate(rows)}}
        differ = [r for r, side in sides.items() if side != mine]
        verdict = {r: sides[r] for r in [0, *differ[:_NAMED]]} if differ else {}
        answer = _pack(json.dumps(verdict) if verdict else "", _VERDICT_BYTES)
        comm._await([start(answer, r, True) for r in range(1, world)])
    else:
        answer = np.zeros(_VERDICT_BYTES, dtype=np.uint8)
        receive = start(answer, 0, False)
        comm._await([start(_pack(mine, _SIDE_BYTES), 0, True), receive])
        text = _text(answer)
        verdict = {int(r): side for r, side in json.loads(text).items()} if text else {}
    if verdict:
        raise CollectiveMismatchError(verdict, f"#{seq}: ranks passed arguments that must agree, and they differ")


def _pack(text: str, size: int) -> np.ndarray:
    data = text.encode()[:size]
    row = np.zeros(size, dtype=np.uint8)
    row[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return row


def _text(row: np.ndarray) -> str:
    return bytes(row).rstrip(b"\0").decode(errors="replace")
