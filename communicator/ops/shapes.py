"""Tensor metadata: what a gather needs to know before the data moves.

Gathers accept different shapes per rank, so receivers learn every rank's dtype and shape first,
in one fixed-size record per rank. The record also carries the tensor itself when it is on the CPU
and fits, so gathering it takes that one collective and nothing else; a larger one follows point
to point (or in one collective when every shape is equal). How much a record carries is the same
on every rank, since one collective needs one size everywhere: :func:`capacity_for` derives it from
the records of the communicator's previous all_gather, which every rank saw alike. A ``gather``'s
records go to its destination alone, point to point, so what one carries is known to its sender
and its receiver: :func:`capacity_of` the sender's tensor in their previous gather. A gather that
repeats its sizes (up to ``MAX_CAPACITY``) thus moves its data with its records, in one step, as
``same_shape=True`` does.

Layout (little endian): dtype code, number of dimensions and an inline flag (one byte each), five
bytes of padding, the byte count (8 bytes), ``MAX_NDIM`` dimensions (8 bytes each), then the
inline bytes.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Sequence

import numpy as np
import torch

from communicator.errors import CollectiveMismatchError
from communicator.ops.staging import editing, empty
from communicator.reductions import WIRE_DTYPES

__all__ = [
    "GATHER_META_BYTES",
    "INLINE_BYTES",
    "MAX_CAPACITY",
    "META_BYTES",
    "Meta",
    "addressed_to",
    "capacity_for",
    "capacity_of",
    "check_supported",
    "check_compatible",
    "compatible",
    "described",
    "outputs",
    "pack_meta",
    "read",
]

MAX_NDIM = 32
_HEAD = struct.Struct("<BBBxxxxxQ")
_DIMS = struct.Struct(f"<{MAX_NDIM}q")
#: A meta without inline data: what all_to_all exchanges per destination.
META_BYTES = _HEAD.size + _DIMS.size
#: A gather meta: up to ``GATHER_META_BYTES - META_BYTES`` bytes of data travel inline.
GATHER_META_BYTES = 1024
#: What a gather record carries at least, and at most: beyond, a record sent for nothing (the
#: tensors outgrew it) costs too much, and the data goes point to point, where gloo's collectives
#: copy it more (see ``P2P_MIN_BYTES`` in :mod:`communicator.transports.torch_comm`).
INLINE_BYTES = GATHER_META_BYTES - META_BYTES
MAX_CAPACITY = 1024 * 1024
_UNKNOWN = 255
_CODES = {dtype: code for code, dtype in enumerate(WIRE_DTYPES)}


@dataclasses.dataclass(frozen=True)
class Meta:
    """One rank's tensor as its meta describes it; ``data`` holds the bytes when they were inline,
    ``spare`` the bytes of its record that they left unused."""

    code: int
    shape: tuple[int, ...]
    data: np.ndarray | None
    spare: int = 0
    wire_bytes: int = 0  # the tensor's bytes, as its record says (whatever its dtype)

    @property
    def dtype(self) -> torch.dtype:
        return WIRE_DTYPES[self.code]

    @property
    def supported(self) -> bool:
        """Whether the dtype is one that records describe (else the gather raises on every rank)."""
        return self.code != _UNKNOWN

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def tensor(self, device: torch.device, view: bool = False) -> torch.Tensor:
        """The inline tensor, in memory of its own; with ``view`` (the record's memory is new in
        this call, and nobody else's) a view of the record where the tensor fills at least half
        of it (the data's offset suits any dtype), so that a large record is not kept alive for
        a small tensor."""
        assert self.data is not None
        if not self.data.size:
            return torch.empty(self.shape, dtype=self.dtype, device=device)
        data = self.data if view and self.spare <= self.data.size else self.data.copy()
        flat = torch.from_numpy(data).view(self.dtype)
        return flat.reshape(self.shape).to(device)


def pack_meta(tensor: torch.Tensor, size: int = GATHER_META_BYTES) -> np.ndarray:
    """A ``size``-byte meta of ``tensor``: its data inline when it is on the CPU and fits."""
    if tensor.dim() > MAX_NDIM:
        raise ValueError(f"tensors of more than {MAX_NDIM} dimensions are not supported, got {tensor.dim()}")
    nbytes = tensor.numel() * tensor.element_size()
    code = _CODES.get(tensor.dtype, _UNKNOWN)
    inline = tensor.device.type == "cpu" and code != _UNKNOWN and nbytes <= size - META_BYTES
    meta = np.empty(size, dtype=np.uint8)
    _HEAD.pack_into(meta.data, 0, code, tensor.dim(), inline, nbytes)
    _DIMS.pack_into(meta.data, _HEAD.size, *tensor.shape, *([0] * (MAX_NDIM - tensor.dim())))
    end = META_BYTES
    if inline and nbytes:
        flat = tensor.detach().resolve_conj().resolve_neg().reshape(-1).view(torch.uint8)
        meta[end : end + nbytes] = flat.numpy()
        end += nbytes
    meta[end:] = 0  # none of this process's memory goes out but the tensor
    return meta


def described(tensor: torch.Tensor) -> Meta:
    """``tensor``'s meta without its data (what :func:`read` makes of a record without inline bytes)."""
    nbytes = tensor.numel() * tensor.element_size()
    return Meta(_CODES.get(tensor.dtype, _UNKNOWN), tuple(tensor.shape), None, 0, nbytes)


def read(meta: np.ndarray) -> Meta:
    code, ndim, inline, nbytes = _HEAD.unpack_from(meta.data, 0)
    shape = tuple(_DIMS.unpack_from(meta.data, _HEAD.size)[:ndim])
    if not inline:
        return Meta(code, shape, None, 0, nbytes)
    return Meta(code, shape, meta[META_BYTES : META_BYTES + nbytes], meta.size - META_BYTES - nbytes, nbytes)


def check_compatible(metas: Sequence[Meta], what: str) -> None:
    """Every rank raises the same error when the ranks' dtypes or numbers of dimensions differ."""
    if compatible(metas):
        return
    first = metas[0]
    if any(m.code != first.code or len(m.shape) != len(first.shape) for m in metas):
        sides = {
            r: f"{what}({WIRE_DTYPES[m.code] if m.code != _UNKNOWN else 'unsupported dtype'}, shape {m.shape})"
            for r, m in enumerate(metas)
        }
        raise CollectiveMismatchError(sides, f"{what}: tensors must have the same dtype and number of dimensions")
    raise _unsupported(what)


def compatible(metas: Sequence[Meta]) -> bool:
    """Whether :func:`check_compatible` passes."""
    first = metas[0]
    return first.code != _UNKNOWN and all(m.code == first.code and len(m.shape) == len(first.shape) for m in metas)


def _unsupported(what: str) -> TypeError:
    return TypeError(f"{what}: unsupported tensor dtype (supported: {', '.join(map(str, WIRE_DTYPES))})")


def capacity_for(metas: Sequence[Meta]) -> int:
    """The bytes the next all_gather's records carry, from this one's (checked) records: see
    :func:`capacity_of` its largest tensor."""
    return capacity_of(max(meta.nbytes for meta in metas))


def capacity_of(nbytes: int) -> int:
    """What a record carries after one of a tensor of ``nbytes``: that, rounded up to a power of
    two (sizes that vary a little still fit), or the least when that is over ``MAX_CAPACITY``."""
    if nbytes > MAX_CAPACITY:
        return INLINE_BYTES
    return max(INLINE_BYTES, 1 << max(nbytes - 1, 0).bit_length())


def check_supported(tensor: torch.Tensor, what: str) -> None:
    """Raise ``TypeError`` for a dtype, ``ValueError`` for a number of dimensions, that records
    cannot describe (before any communication)."""
    if tensor.dim() > MAX_NDIM:
        raise ValueError(f"tensors of more than {MAX_NDIM} dimensions are not supported, got {tensor.dim()}")
    if tensor.dtype not in _CODES:
        raise _unsupported(what)


def same_shape(metas: Sequence[Meta], what: str) -> None:
    """Every rank raises the same error when ranks that promised one shape passed different ones."""
    if any(m.shape != metas[0].shape for m in metas):
        sides = {r: f"{what}(shape {m.shape}, same_shape=True)" for r, m in enumerate(metas)}
        raise CollectiveMismatchError(sides, f"{what}: same_shape=True, but the ranks passed different shapes")


def outputs(
    metas: Sequence[Meta],
    source: torch.Tensor | None,
    rank: int,
    device: torch.device,
    fault_in: bool,
    views: bool = False,
) -> list[torch.Tensor]:
    """A tensor for each meta: inline ones filled (views of the records with ``views``: see
    :meth:`Meta.tensor`), ``rank``'s a copy of ``source``, the others empty (faulted in first
    with ``fault_in``: see :func:`~communicator.ops.staging.empty`)."""
    made = []
    for r, meta in enumerate(metas):
        if r == rank and source is not None:
            with editing(source):
                made.append(empty(source.shape, source.dtype, source.device).copy_(source))
        elif meta.data is not None:
            made.append(meta.tensor(device, views))
        else:
            made.append(empty(meta.shape, meta.dtype, device, fault_in))
    return made


def addressed_to(rows: Sequence[np.ndarray], rank: int, what: str) -> list[Meta]:
    """From every rank's row of per-destination metas (``all_to_all``), the metas addressed to
    ``rank``; every rank checks every meta, so every rank raises the same mismatch."""
    world = len(rows)
    metas = [read(row[j * META_BYTES : (j + 1) * META_BYTES]) for row in rows for j in range(world)]
    check_compatible(metas, what)
    return [metas[r * world + rank] for r in range(world)]
