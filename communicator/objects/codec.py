"""Codecs: the interface, the pickling both pickle codecs share (protocol 5, large buffers out of
band), the plain pickle codec and the wrapper of a user's serializer. The ``"safe"`` codec is in
:mod:`communicator.objects.safe.serializer`."""

from __future__ import annotations

import abc
import io
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import torch

from communicator.config import Serializer
from communicator.objects.safe.rebuild import reduce_tensor

__all__ = ["OUT_OF_BAND_MIN_BYTES", "PROTOCOL", "Codec", "PickleCodec", "UserCodec", "pickle_pieces"]

PROTOCOL = 5
# Buffers smaller than this stay inside the pickle stream: a separate buffer costs more than a copy.
OUT_OF_BAND_MIN_BYTES = 16 * 1024

BufferCallback = Callable[[pickle.PickleBuffer], bool]


class Codec(abc.ABC):
    """Encodes an object into pieces (the first is the stream, the rest are raw buffers) and back."""

    name: str = ""

    @abc.abstractmethod
    def encode(self, obj: Any) -> list[memoryview]: ...

    @abc.abstractmethod
    def decode(self, stream: memoryview, buffers: Sequence[memoryview]) -> Any: ...


def pickle_pieces(make_pickler: Callable[[io.BytesIO, BufferCallback], pickle.Pickler], obj: Any) -> list[memoryview]:
    """Pickle ``obj`` with the pickler ``make_pickler(stream, buffer_callback)`` builds: the stream,
    then every buffer of ``OUT_OF_BAND_MIN_BYTES`` or more, uncopied."""
    stream = io.BytesIO()
    buffers: list[pickle.PickleBuffer] = []

    def keep_in_band(buffer: pickle.PickleBuffer) -> bool:
        if memoryview(buffer).nbytes < OUT_OF_BAND_MIN_BYTES:
            return True
        buffers.append(buffer)
        return False

    make_pickler(stream, keep_in_band).dump(obj)
    return [stream.getbuffer(), *(b.raw() for b in buffers)]


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
