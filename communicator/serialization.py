"""Codecs that turn Python objects into byte frames and back.

A frame is one contiguous byte string: a small table, the pickle stream, then each out-of-band
buffer (NumPy arrays, CPU tensors) aligned to 64 bytes. Senders build it with one copy of the data;
receivers unpickle straight from the received bytes, so arrays and tensors are views of the receive
buffer, not copies.
"""

from __future__ import annotations

import abc
import contextvars
import io
import pickle
import struct
import types
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from communicator.config import Serializer
from communicator.ops import WIRE_DTYPES

__all__ = [
    "Codec",
    "PickleCodec",
    "SafeCodec",
    "UnsafePayloadError",
    "UserCodec",
    "make_codec",
    "pack_frame",
    "receive_device",
    "unpack_frame",
]

PROTOCOL = 5
# Buffers smaller than this stay inside the pickle stream: a separate buffer costs more than a copy.
OUT_OF_BAND_MIN_BYTES = 16 * 1024
ALIGN = 64
_TABLE_HEAD = struct.Struct("<IQ")  # buffer count, pickle stream length
_LENGTH = struct.Struct("<Q")

#: The device that CUDA tensors inside received objects are moved to (``None``: stay on the CPU).
receive_device: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar("receive_device", default=None)


class UnsafePayloadError(pickle.UnpicklingError):
    """The ``"safe"`` serializer refused a class or function that it does not trust."""


def _rebuild_tensor(data: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool, was_cuda: bool) -> torch.Tensor:
    torch_dtype = _DTYPES.get(dtype)
    if torch_dtype is None:
        raise pickle.UnpicklingError(f"unknown tensor dtype {dtype!r}")
    view = memoryview(data)
    if view.nbytes == 0:
        tensor = torch.empty(shape, dtype=torch_dtype)
    else:
        with warnings.catch_warnings():
            # Read-only buffers are only read from: the tensor is a view the caller owns.
            warnings.simplefilter("ignore", UserWarning)
            tensor = torch.frombuffer(view, dtype=torch.uint8).view(torch_dtype).reshape(shape)
    device = receive_device.get()
    if was_cuda and device is not None:
        tensor = tensor.to(device)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


_DTYPES: dict[str, torch.dtype] = {str(dt): dt for dt in WIRE_DTYPES}


class _Pickler(pickle.Pickler):
    """Pickles plain CPU/CUDA tensors as raw out-of-band bytes instead of torch's storage format."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not torch.Tensor or str(obj.dtype) not in _DTYPES:
            return NotImplemented
        if obj.layout != torch.strided or obj.is_quantized or obj.device.type == "meta":
            return NotImplemented
        was_cuda = obj.device.type != "cpu"
        flat = obj.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, np.uint8)
        return _rebuild_tensor, (
            pickle.PickleBuffer(raw.data),
            str(obj.dtype),
            tuple(obj.shape),
            obj.requires_grad,
            was_cuda,
        )


def _in_band(buffer: pickle.PickleBuffer) -> bool:
    return memoryview(buffer).nbytes < OUT_OF_BAND_MIN_BYTES


class Codec(abc.ABC):
    """Encodes an object into pieces (the first is the stream, the rest are raw buffers) and back."""

    name: str = ""

    @abc.abstractmethod
    def encode(self, obj: Any) -> list[memoryview]: ...

    @abc.abstractmethod
    def decode(self, stream: memoryview, buffers: Sequence[memoryview]) -> Any: ...


class PickleCodec(Codec):
    """Pickle protocol 5; arrays and tensors of 16 KiB or more travel out of band, uncopied."""

    name = "pickle"

    def encode(self, obj: Any) -> list[memoryview]:
        stream = io.BytesIO()
        buffers: list[pickle.PickleBuffer] = []

        def keep(buffer: pickle.PickleBuffer) -> bool:
            if _in_band(buffer):
                return True
            buffers.append(buffer)
            return False

        self._pickler(stream, keep).dump(obj)
        return [stream.getbuffer(), *(b.raw() for b in buffers)]

    def _pickler(self, stream: io.BytesIO, keep: Any) -> pickle.Pickler:
        return _Pickler(stream, protocol=PROTOCOL, buffer_callback=keep)

    def decode(self, stream: memoryview, buffers: Sequence[memoryview]) -> Any:
        return pickle.loads(stream, buffers=buffers)


# Globals a safe payload may name: containers, numbers, NumPy and torch values, nothing that runs code.
_SAFE_GLOBALS = frozenset(
    {
        ("builtins", name)
        for name in (
            "dict",
            "list",
            "tuple",
            "set",
            "frozenset",
            "bytearray",
            "bytes",
            "complex",
            "slice",
            "range",
            "int",
            "float",
            "bool",
            "str",
        )
    }
    | {("collections", name) for name in ("OrderedDict", "defaultdict", "deque", "Counter")}
    | {("datetime", name) for name in ("date", "time", "datetime", "timedelta", "timezone")}
    | {("decimal", "Decimal"), ("fractions", "Fraction"), ("uuid", "UUID")}
    | {("pathlib", name) for name in ("PurePosixPath", "PureWindowsPath", "PosixPath", "WindowsPath", "Path")}
    | {
        (module, name)
        for module in ("numpy._core.multiarray", "numpy.core.multiarray")
        for name in ("_reconstruct", "scalar")
    }
    | {("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer")}
    | {("numpy", "ndarray"), ("numpy", "dtype")}
    | {("torch", "Size"), ("torch", "device"), ("torch._utils", "_rebuild_parameter")}
    | {("torch.nn.parameter", "Parameter")}
    | {("torch", str(dt).split(".", 1)[1]) for dt in _DTYPES.values()}
    | {(__name__, "_rebuild_tensor")}
)


class _SafeUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, trusted: Sequence[str], buffers: Iterable[Any]) -> None:
        super().__init__(file, buffers=buffers)
        self._trusted = trusted

    def find_class(self, module: str, name: str) -> Any:
        qualified = f"{module}.{name}"
        if (module, name) in _SAFE_GLOBALS or _is_trusted(qualified, self._trusted):
            return super().find_class(module, name)
        raise UnsafePayloadError(_refusal(qualified))


def _is_trusted(qualified: str, trusted: Sequence[str]) -> bool:
    return any(qualified == entry or (entry.endswith(".") and qualified.startswith(entry)) for entry in trusted)


def _instance_is_safe(cls: type, trusted: Sequence[str]) -> bool:
    if issubclass(cls, (np.ndarray, np.generic, np.dtype, torch.dtype, torch.Tensor)) or cls is type(None):
        return True
    return (cls.__module__, cls.__qualname__) in _SAFE_GLOBALS or _is_trusted(
        f"{cls.__module__}.{cls.__qualname__}", trusted
    )


class _SafePickler(_Pickler):
    """Refuses, while pickling, what the receiving safe unpickler would refuse: the sender fails,
    every peer hears of it, and nothing untrusted is ever sent."""

    def __init__(self, *args: Any, trusted: Sequence[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trusted = trusted
        self._verdicts: dict[type, bool] = {}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):  # pickled by name
            name = (getattr(obj, "__module__", ""), getattr(obj, "__qualname__", ""))
            if name not in _SAFE_GLOBALS and not _is_trusted(".".join(name), self._trusted):
                raise UnsafePayloadError(_refusal(".".join(name)))
            return NotImplemented
        cls = type(obj)
        verdict = self._verdicts.get(cls)
        if verdict is None:
            verdict = self._verdicts[cls] = _instance_is_safe(cls, self._trusted)
        if not verdict:
            raise UnsafePayloadError(_refusal(f"{cls.__module__}.{cls.__qualname__}"))
        return super().reducer_override(obj)


def _refusal(qualified: str) -> str:
    return (
        f"the 'safe' serializer refused {qualified}: it is not a builtin container, a NumPy or torch "
        f"value, or a trusted name; add it to CommConfig(trusted=[{qualified!r}]) if you trust it"
    )


class SafeCodec(PickleCodec):
    """Pickle protocol 5 with a restricted unpickler: nothing outside an allow-list is ever imported.

    ``trusted`` adds exact names (``"pkg.mod.Class"``) or module prefixes ending in a dot (``"pkg."``).
    Senders check the same list while pickling, so a refused value fails on the rank that sent it.
    """

    name = "safe"

    def __init__(self, trusted: Sequence[str] = ()) -> None:
        self.trusted = tuple(trusted)

    def _pickler(self, stream: io.BytesIO, keep: Any) -> pickle.Pickler:
        return _SafePickler(stream, protocol=PROTOCOL, buffer_callback=keep, trusted=self.trusted)

    def decode(self, stream: memoryview, buffers: Sequence[memoryview]) -> Any:
        return _SafeUnpickler(io.BytesIO(stream), self.trusted, buffers).load()


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


def make_codec(serializer: str | Serializer, trusted: Sequence[str] = ()) -> Codec:
    """The codec for a ``CommConfig.serializer`` value."""
    if serializer == "pickle":
        return PickleCodec()
    if serializer == "safe":
        return SafeCodec(trusted)
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


def pack_frame(pieces: Sequence[memoryview], into: np.ndarray | None = None) -> np.ndarray:
    """Concatenate a codec's pieces into one uint8 array (the only copy a sender makes)."""
    total, offsets = frame_layout(pieces)
    out = np.empty(total, dtype=np.uint8) if into is None else into[:total]
    _TABLE_HEAD.pack_into(out.data, 0, len(pieces) - 1, pieces[0].nbytes)
    for i, piece in enumerate(pieces[1:]):
        _LENGTH.pack_into(out.data, _TABLE_HEAD.size + i * _LENGTH.size, piece.nbytes)
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
