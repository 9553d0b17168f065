"""Tensor metadata: what a gather needs to know before the data moves.

Gathers accept different shapes per rank, so receivers learn every rank's dtype and shape first,
in one fixed-size meta per rank. A small CPU tensor travels inside its meta, so gathering it
takes that one collective and nothing else; a larger one follows point to point (or in one
collective when every shape is equal).

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
from communicator.ops.staging import editing
from communicator.reductions import WIRE_DTYPES

__all__ = [
    "GATHER_META_BYTES",
    "META_BYTES",
    "Meta",
    "addressed_to",
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
    meta = np.zeros(size, dtype=np.uint8)
    _HEAD.pack_into(meta.data, 0, code, tensor.dim(), inline, nbytes)
    _DIMS.pack_into(meta.data, _HEAD.size, *tensor.shape, *([0] * (MAX_NDIM - tensor.dim())))
    if inline and nbytes:
        flat = tensor.detach().resolve_conj().resolve_neg().reshape(-1).view(torch.uint8)
        meta[META_BYTES : META_BYTES + nbytes] = flat.numpy()
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


def same_shape(metas: Sequence[Meta], what: str) -> None:
    """Every rank raises the same error when ranks that promised one shape passed different ones."""
    if any(m.shape != metas[0].shape for m in metas):
        sides = {r: f"{what}(shape {m.shape}, same_shape=True)" for r, m in enumerate(metas)}
        raise CollectiveMismatchError(sides, f"{what}: same_shape=True, but the ranks passed different shapes")


def outputs(metas: Sequence[Meta], source: torch.Tensor | None, rank: int, device: torch.device) -> list[torch.Tensor]:
    """A tensor for each meta: inline ones filled, ``rank``'s a copy of ``source``, the others empty."""
    made = []
    for r, meta in enumerate(metas):
        if r == rank and source is not None:
            with editing(source):
                made.append(source.clone())
        elif meta.data is not None:
            made.append(meta.tensor(device))
        else:
            made.append(torch.empty(meta.shape, dtype=meta.dtype, device=device))
    return made


def addressed_to(rows: Sequence[np.ndarray], rank: int, what: str) -> list[Meta]:
    """From every rank's row of per-destination metas (``all_to_all``), the metas addressed to
    ``rank``; every rank checks every meta, so every rank raises the same mismatch."""
    world = len(rows)
    metas = [read(row[j * META_BYTES : (j + 1) * META_BYTES]) for row in rows for j in range(world)]
    check_compatible(metas, what)
    return [metas[r * world + rank] for r in range(world)]
