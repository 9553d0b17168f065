"""Codecs that turn Python objects into byte frames and back.

A frame is one contiguous byte string: a small table, the pickle stream, then each out-of-band
buffer (NumPy arrays, CPU tensors) aligned to 64 bytes. Senders build it with one copy of the data;
receivers unpickle straight from the received bytes, so arrays and tensors are views of the receive
buffer, not copies.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from communicator.codec import OUT_OF_BAND_MIN_BYTES, PROTOCOL, BufferCallback, Codec, pickle_pieces
from communicator.config import Serializer
from communicator.rebuild import receive_device, reduce_tensor
from communicator.safe import DEFAULT_MAX_EXPANSION, SafeCodec, UnsafePayloadError

__all__ = [
    "OUT_OF_BAND_MIN_BYTES",
    "PROTOCOL",
    "Codec",
    "PickleCodec",
    "SafeCodec",
    "UnsafePayloadError",
    "UserCodec",
    "frame_layout",
    "frame_table",
    "make_codec",
    "pack_frame",
    "receive_device",
    "unpack_frame",
]

ALIGN = 64
_TABLE_HEAD = struct.Struct("<IQ")  # buffer count, pickle stream length
_LENGTH = struct.Struct("<Q")


class _Pickler(pickle.Pickler):
    """Pickles plain CPU/CUDA tensors as raw out-of-band bytes instead of torch's storage format."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not torch.Tensor:
            return NotImplemented
        reduction = reduce_tensor(obj)
        return NotImplemented if reduction is None else reduction


class PickleCodec(Codec):
    """Pickle protocol 5; arrays and tensors of 16 KiB or more travel out of band, uncopied."""

    name = "pickle"

    def encode(self, obj: Any) -> list[memoryview]:
        return pickle_pieces(self._pickler, obj)

    def _pickler(self, stream: io.BytesIO, keep: BufferCallback) -> pickle.Pickler:
        return _Pickler(stream, protocol=PROTOCOL, buffer_callback=keep)

    def decode(self, stream: memoryview, buffers: Sequence[memoryview]) -> Any:
        return pickle.loads(stream, buffers=buffers)


class UserCodec(Codec):
    """Wraps a user object with ``dumps(obj) -> bytes`` and ``loads(data) -> obj``."""

    def __init__(self, serializer: Serializer) -> None:
        self.serializer = serializer
        self.name = type(serializer).__name__

    def encode(self, obj: Any) -> list[memoryview]:
        data = self.serializer.dumps(obj)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"{self.name}.dumps returned {type(data).__name__}, expected bytes")
        return [memoryview(data)]

    def decode(self, stream: memoryview, buffers: Sequence[memoryview]) -> Any:
        return self.serializer.loads(bytes(stream))


def make_codec(
    serializer: str | Serializer, trusted: Sequence[str] = (), max_expansion: int = DEFAULT_MAX_EXPANSION
) -> Codec:
    """The codec for a ``CommConfig.serializer`` value (``trusted`` and ``max_expansion``: see ``SafeCodec``)."""
    if serializer == "pickle":
        return PickleCodec()
    if serializer == "safe":
        return SafeCodec(trusted, max_expansion)
    if isinstance(serializer, str):
        raise ValueError(f"unknown serializer {serializer!r}: expected 'pickle', 'safe' or a codec object")
    return UserCodec(serializer)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def frame_layout(pieces: Sequence[memoryview]) -> tuple[int, list[int]]:
    """Total frame length and the offset of each piece in it."""
    table = _TABLE_HEAD.size + _LENGTH.size * (len(pieces) - 1)
    offsets = [table]
    position = table + pieces[0].nbytes
    for piece in pieces[1:]:
        position = _aligned(position)
        offsets.append(position)
        position += piece.nbytes
    return position, offsets


def frame_table(pieces: Sequence[memoryview]) -> bytes:
    """The table a frame starts with: the buffer count, the stream's length, each buffer's length."""
    return _TABLE_HEAD.pack(len(pieces) - 1, pieces[0].nbytes) + b"".join(
        _LENGTH.pack(piece.nbytes) for piece in pieces[1:]
    )


def pack_frame(pieces: Sequence[memoryview], into: np.ndarray | None = None) -> np.ndarray:
    """Concatenate a codec's pieces into one uint8 array (senders stream them instead: see
    :mod:`communicator.transfer`)."""
    total, offsets = frame_layout(pieces)
    out = np.empty(total, dtype=np.uint8) if into is None else into[:total]
    table = frame_table(pieces)
    out[: len(table)] = np.frombuffer(table, dtype=np.uint8)
    for piece, offset in zip(pieces, offsets, strict=True):
        out[offset : offset + piece.nbytes] = np.frombuffer(piece.cast("B"), dtype=np.uint8)
    return out


def unpack_frame(frame: memoryview) -> tuple[memoryview, list[memoryview]]:
    """The pickle stream and the buffers of a frame, as views of it."""
    count, stream_length = _TABLE_HEAD.unpack_from(frame, 0)
    lengths = [_LENGTH.unpack_from(frame, _TABLE_HEAD.size + i * _LENGTH.size)[0] for i in range(count)]
    start = _TABLE_HEAD.size + _LENGTH.size * count
    stream = frame[start : start + stream_length]
    position = start + stream_length
    buffers = []
    for length in lengths:
        position = _aligned(position)
        buffers.append(frame[position : position + length])
        position += length
    return stream, buffers
