"""Tensor metadata: what a gather needs to know before the data moves.

Gathers accept different shapes per rank, so receivers learn every rank's dtype and shape first,
in one fixed-size record per rank. The record also carries the tensor itself when it is on the CPU
and fits, so gathering it takes that one collective and nothing else; a larger one follows point
to point (or in one collective when every shape is equal). How much a record carries is the same
on every rank, since one collective needs one size everywhere: :func:`capacity_for` derives it from
the records of the communicator's previous gather, which every rank saw alike. A gather that
repeats its sizes (up to ``MAX_CAPACITY``) thus takes one collective, as ``same_shape=True`` does.

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
    "check_compatible",
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
#: What a gather record carries at least, and at most: beyond, copying the tensor in and out of
#: the record costs more than the collective it saves, and a record sent for nothing (the
#: tensors outgrew it) costs too much.
INLINE_BYTES = GATHER_META_BYTES - META_BYTES
MAX_CAPACITY = 256 * 1024
_UNKNOWN = 255
_CODES = {dtype: code for code, dtype in enumerate(WIRE_DTYPES)}


@dataclasses.dataclass(frozen=True)
class Meta:
    """One rank's tensor as its meta describes it; ``data`` holds the bytes when they were inline."""

    code: int
    shape: tuple[int, ...]
    data: np.ndarray | None

    @property
    def dtype(self) -> torch.dtype:
        return WIRE_DTYPES[self.code]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def tensor(self, device: torch.device) -> torch.Tensor:
        """The inline tensor, in memory of its own (the meta's buffer is reused)."""
        assert self.data is not None
        if not self.data.size:
            return torch.empty(self.shape, dtype=self.dtype, device=device)
        flat = torch.from_numpy(self.data.copy()).view(self.dtype)
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


def read(meta: np.ndarray) -> Meta:
    code, ndim, inline, nbytes = _HEAD.unpack_from(meta.data, 0)
    shape = tuple(_DIMS.unpack_from(meta.data, _HEAD.size)[:ndim])
    return Meta(code, shape, meta[META_BYTES : META_BYTES + nbytes] if inline else None)


def check_compatible(metas: Sequence[Meta], what: str) -> None:
    """Every rank raises the same error when the ranks' dtypes or numbers of dimensions differ."""
    first = metas[0]
    if any(m.code != first.code or len(m.shape) != len(first.shape) for m in metas):
        sides = {
            r: f"{what}({WIRE_DTYPES[m.code] if m.code != _UNKNOWN else 'unsupported dtype'}, shape {m.shape})"
            for r, m in enumerate(metas)
        }
        raise CollectiveMismatchError(sides, f"{what}: tensors must have the same dtype and number of dimensions")
    if first.code == _UNKNOWN:
        raise TypeError(f"{what}: unsupported tensor dtype (supported: {', '.join(map(str, WIRE_DTYPES))})")


def capacity_for(metas: Sequence[Meta]) -> int:
    """The bytes the next gather's records carry, from this gather's (checked) records: its
    largest tensor's, rounded up to a power of two (sizes that vary a little still fit), or the
    least when that is over ``MAX_CAPACITY``."""
    largest = max(meta.nbytes for meta in metas)
    if largest > MAX_CAPACITY:
        return INLINE_BYTES
    return max(INLINE_BYTES, 1 << max(largest - 1, 0).bit_length())


def same_shape(metas: Sequence[Meta], what: str) -> None:
    """Every rank raises the same error when ranks that promised one shape passed different ones."""
    if any(m.shape != metas[0].shape for m in metas):
        sides = {r: f"{what}(shape {m.shape}, same_shape=True)" for r, m in enumerate(metas)}
        raise CollectiveMismatchError(sides, f"{what}: same_shape=True, but the ranks passed different shapes")


def outputs(
    metas: Sequence[Meta], source: torch.Tensor | None, rank: int, device: torch.device, fault_in: bool
) -> list[torch.Tensor]:
    """A tensor for each meta: inline ones filled, ``rank``'s a copy of ``source``, the others empty
    (faulted in first with ``fault_in``: see :func:`~communicator.ops.staging.empty`)."""
    made = []
    for r, meta in enumerate(metas):
        if r == rank and source is not None:
            with editing(source):
                made.append(empty(source.shape, source.dtype, source.device).copy_(source))
        elif meta.data is not None:
            made.append(meta.tensor(device))
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
