"""The checks every communicator applies to its arguments, before any communication.

Each raises ``TypeError`` or ``ValueError`` with a message that says what was expected; the
guard tells peers already waiting in the operation that this rank refused its arguments.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from communicator.reductions import WIRE_DTYPES

__all__ = [
    "COLLECTIVE_TAG",
    "RECORD_TAG",
    "TRANSFER_TAG",
    "check_grid",
    "check_members",
    "check_output",
    "check_peer",
    "check_rank",
    "check_split",
    "check_tag",
    "check_tensor",
    "check_tensors",
]

#: The point-to-point tag of the library's own transfers, apart from the tags users pass to send/recv.
TRANSFER_TAG = 0x7C0DE
#: The tag of the argument checks (see :mod:`communicator.crosscheck`): apart from every transfer.
CHECK_TAG = TRANSFER_TAG + 1
#: The tag of the default collectives over point-to-point (see :mod:`communicator.ops.defaults`).
COLLECTIVE_TAG = TRANSFER_TAG + 2
#: The tag of the receive that closes a connection to end an abandoned transfer (see
#: :mod:`communicator.control.waiting`).
CUT_TAG = TRANSFER_TAG + 3
#: The tag of the object protocol's records when they travel point to point (see
#: :mod:`communicator.transports.torch_channel`): apart from the frames that follow them.
RECORD_TAG = TRANSFER_TAG + 4
_OWN_TAGS = (TRANSFER_TAG, CHECK_TAG, COLLECTIVE_TAG, CUT_TAG, RECORD_TAG)
_DTYPES = frozenset(WIRE_DTYPES)
_OVERLAP = 1  # torch._debug_has_internal_overlap: some elements share memory


def check_rank(name: str, value: object, world_size: int) -> int:
    """``value`` as a rank of a communicator of ``world_size`` ranks."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int rank of this communicator, got {type(value).__name__}")
    if not 0 <= int(value) < world_size:
        raise ValueError(f"{name}={value} is out of range: expected a rank in 0..{world_size - 1} of this communicator")
    return int(value)


def check_peer(name: str, value: object, rank: int, world_size: int) -> int:
    """``value`` as a rank other than ``rank``: point-to-point needs another rank."""
    peer = check_rank(name, value, world_size)
    if peer == rank:
        raise ValueError(f"{name}={peer} is this rank; point-to-point needs another rank")
    return peer


def check_tag(tag: object) -> int:
    """A user's point-to-point tag: a non-negative int other than the library's own."""
    if isinstance(tag, bool) or not isinstance(tag, int) or tag < 0 or tag in _OWN_TAGS:
        raise ValueError(f"tag must be a non-negative int other than {_OWN_TAGS} (the library's own), got {tag!r}")
    return tag


def check_tensor(name: str, value: object) -> torch.Tensor:
    """``value`` when it is a dense tensor with data, of a dtype the library moves; otherwise a
    ``TypeError`` that says what was expected."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {value.layout}")
    if value.dtype not in _DTYPES:
        raise TypeError(f"{name} has dtype {value.dtype}, which no backend moves; supported: {_supported()}")
    if value.is_meta:  # torch raises NotImplementedError late, after peers may have started
        raise TypeError(f"{name} is on the meta device: it has no data to send or receive")
    return value


def check_output(name: str, value: object) -> torch.Tensor:
    """``check_tensor``, for a tensor the operation writes into: each element must have memory of its
    own (an expanded, stride-0 view cannot be written, and torch would only say so afterwards)."""
    tensor = check_tensor(name, value)
    if not tensor.is_contiguous() and torch._debug_has_internal_overlap(tensor) == _OVERLAP:
        raise ValueError(
            f"{name} cannot be written: some of its elements share memory (an expanded or stride-0 view, "
            f"strides {tensor.stride()}); pass a tensor of its own, e.g. {name}.clone()"
        )
    return tensor


def _supported() -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in WIRE_DTYPES)


def check_tensors(name: str, value: object, count: int) -> list[torch.Tensor]:
    """A sequence of ``count`` dense tensors (one per rank) of one dtype."""
    if isinstance(value, torch.Tensor) or not isinstance(value, Sequence) or len(value) != count:
        got = type(value).__name__ if not isinstance(value, Sequence) else f"{len(value)} items"
        raise ValueError(f"{name} needs a sequence of {count} tensors (one per rank), got {got}")
    tensors = [check_tensor(f"{name}[{i}]", t) for i, t in enumerate(value)]
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise TypeError(f"{name} must hold tensors of one dtype, got {sorted(map(str, dtypes))}")
    return tensors


def check_members(ranks: object, world_size: int) -> list[int]:
    """``new_group``'s ranks: a non-empty sequence of distinct ranks in ``0..world_size - 1``."""
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Sequence) or not ranks:
        raise TypeError(f"ranks must be a non-empty sequence of ranks of this communicator, got {ranks!r}")
    for i, rank in enumerate(ranks):
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"ranks[{i}] must be an int rank of this communicator, got {type(rank).__name__}")
        if not 0 <= rank < world_size:
            raise ValueError(f"ranks[{i}]={rank} is out of range: expected a rank in 0..{world_size - 1}")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"ranks {list(ranks)} repeat a rank; each rank may appear once")
    return list(ranks)


def check_split(color: object, key: object) -> None:
    """``split``'s arguments: ints or ``None``, and a colour that is not negative."""
    for name, value in (("color", color), ("key", key)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"split: {name} must be an int or None, got {type(value).__name__}")
    if isinstance(color, int) and color < 0:
        raise ValueError(f"split: color must be >= 0 (or None to join no group), got {color}")


def check_grid(shape: object, world_size: int) -> tuple[int, int]:
    """``grid``'s shape: a ``(rows, cols)`` tuple of positive ints with as many places as ranks."""
    if (
        not isinstance(shape, tuple)
        or len(shape) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
    ):
        raise TypeError(f"grid needs a (rows, cols) tuple of positive ints, got {shape!r}")
    rows, cols = shape
    if rows * cols != world_size:
        raise ValueError(f"grid {rows}x{cols} has {rows * cols} places but the communicator has {world_size} ranks")
    return rows, cols
