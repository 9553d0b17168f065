"""The codec interface, and the pickling both pickle codecs share: protocol 5, large buffers out of band."""

from __future__ import annotations

import abc
import io
import pickle
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["OUT_OF_BAND_MIN_BYTES", "PROTOCOL", "Codec", "pickle_pieces"]

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
