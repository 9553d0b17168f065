"""The ``"safe"`` serializer: pickle protocol 5 restricted to plain data, an allow-list and trusted names.

Whatever bytes arrive, a receiver

- imports and calls nothing outside the allow-list (:data:`CALLABLES`, :data:`VALUES`) and the
  names the user trusts; a name is looked up in its module only, never through attributes; a
  prefix trusts classes only, in modules already imported;
- rebuilds arrays, tensors and the other allowed values from plain data (``communicator.objects.safe.rebuild``),
  never through NumPy's or torch's own reconstruction helpers;
- sets state (``BUILD``) and adds items only to plain containers and to instances of trusted classes;
- allocates at most ``max_expansion`` bytes per received byte plus 1 MiB, every call's result and
  copy included, and refuses values nested deeper than the recursion limit;
- hashes dict keys and set elements whose tuples hold at most as many items, counted each time
  they are reached, as that allowance has bytes (a tuple shared through the memo is counted each
  time it is referenced).

A plain stream (containers, numbers, strings, arrays and other values no opcode can change: see
``communicator.objects.safe.plain_stream``) is unpickled by the C unpickler; any other stream runs in
``communicator.objects.safe.unpickler``, which carries out each opcode itself. Senders refuse, while pickling, what
receivers would refuse.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from collections.abc import Sequence
from typing import Any

import torch

import communicator.objects.safe.rebuild as rebuild
from communicator.config import DEFAULT_SAFE_MAX_EXPANSION
from communicator.objects.codec import PROTOCOL, BufferCallback, Codec, pickle_pieces
from communicator.objects.safe.allowlist import (
    ALLOWED,
    CALLABLES,
    VALUES,
    UnsafePayloadError,
    call_rebuilder,
    is_trusted,
    malformed,
    refusal,
)
from communicator.objects.safe.plain_stream import (
    MAX_DEPTH,
    NotPlain,
    OverBudget,
    PlainUnpickler,
    check_depth,
    check_plain,
)
from communicator.objects.safe.unpickler import SafeUnpickler

__all__ = ["CALLABLES", "DEFAULT_MAX_EXPANSION", "VALUES", "SafeCodec", "UnsafePayloadError"]

DEFAULT_MAX_EXPANSION = DEFAULT_SAFE_MAX_EXPANSION
BASE_ALLOWANCE = 1 << 20  # bytes any payload may take, however small

# -- the sending side ---------------------------------------------------------------------------


class _SafePickler(pickle.Pickler):
    """Sends every allowed value as a rebuilder and its plain arguments, and refuses, while pickling,
    what the receiving safe unpickler would refuse: the sender fails, every peer hears of it, and
    nothing untrusted is ever sent."""

    def __init__(self, file: io.BytesIO, buffer_callback: BufferCallback, trusted: Sequence[str]) -> None:
        super().__init__(file, protocol=PROTOCOL, buffer_callback=buffer_callback)
        self._trusted = trusted
        self._verdicts: dict[type, bool] = {}

    def reducer_override(self, obj: Any) -> Any:
        try:
            reduction = rebuild.safe_reduction(obj)
        except rebuild.NotRebuildable as error:
            raise UnsafePayloadError(f"the 'safe' serializer cannot send {error}") from None
        if reduction is not None:
            return reduction
        named = isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType))
        if named or type(obj) is torch.dtype:  # pickled by name
            if not self._sendable_by_name(obj):
                raise UnsafePayloadError(refusal(self._qualified(obj)))
            return NotImplemented
        cls = type(obj)
        verdict = self._verdicts.get(cls)
        if verdict is None:
            verdict = self._verdicts[cls] = self._sendable_by_name(cls)
        if not verdict:
            raise UnsafePayloadError(refusal(self._qualified(cls)))
        return NotImplemented

    @staticmethod
    def _qualified(obj: Any) -> str:
        if type(obj) is torch.dtype:
            return str(obj)
        return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"

    def _sendable_by_name(self, obj: Any) -> bool:
        if type(obj) is torch.dtype:
            return str(obj) in rebuild.TORCH_DTYPES
        module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if type(module) is not str or type(name) is not str:
            return False
        if ALLOWED.get((module, name)) is obj:
            return True
        return name.isidentifier() and is_trusted(module, name, self._trusted, isinstance(obj, type))


class SafeCodec(Codec):
    """Pickle protocol 5 with a restricted unpickler: nothing outside an allow-list is imported or called.

    ``trusted`` adds exact names (``"pkg.mod.Class"``, or a function) or module prefixes ending in a
    dot (``"pkg."``: the classes of the modules under it that are already imported). Decoding may
    allocate ``max_expansion`` bytes per received byte, plus 1 MiB. Senders check the same list
    while pickling, so a refused value fails on the rank that sent it.
    """

    name = "safe"

    def __init__(self, trusted: Sequence[str] = (), max_expansion: int = DEFAULT_MAX_EXPANSION) -> None:
        self.trusted = tuple(trusted)
        self.max_expansion = max_expansion

    def encode(self, obj: Any) -> list[memoryview]:
        return pickle_pieces(lambda stream, keep: _SafePickler(stream, keep, self.trusted), obj)

    def decode(self, stream: memoryview, buffers: Sequence[memoryview]) -> Any:
        stream = memoryview(stream).cast("B") if stream.format != "B" or stream.ndim != 1 else stream
        received = stream.nbytes + sum(buffer.nbytes for buffer in buffers)
        budget = self.max_expansion * received + BASE_ALLOWANCE
        try:
            value, containers = self._decode(stream, buffers, budget)
            check_depth(value, containers)
        except UnsafePayloadError:
            raise
        except OverBudget:
            raise UnsafePayloadError(
                f"the 'safe' serializer refused a payload of {received} bytes: decoding it would allocate more than "
                f"{budget} bytes (safe_max_expansion={self.max_expansion} bytes per byte, plus 1 MiB); raise "
                "CommConfig(safe_max_expansion=...) if it is legitimate"
            ) from None
        except RecursionError:
            raise UnsafePayloadError(
                f"the 'safe' serializer refused a value nested deeper than {MAX_DEPTH} levels, or than the "
                f"recursion limit ({sys.getrecursionlimit()}) for a value of more than {MAX_DEPTH} containers"
            ) from None
        except Exception as error:  # any failure to decode untrusted bytes is a refusal
            raise malformed(f"{type(error).__name__}: {error}") from error
        return value

    def _decode(self, stream: memoryview, buffers: Sequence[memoryview], budget: int) -> tuple[Any, int]:
        plain = check_plain(stream)
        if plain is not None and plain.cost <= budget:
            if not plain.names:  # containers, numbers and strings only: nothing to resolve
                return pickle.loads(stream, buffers=buffers), plain.containers
            try:
                return PlainUnpickler(
                    stream, buffers, call_rebuilder, budget - plain.cost, plain.shared
                ).load(), plain.containers
            except NotPlain:
                pass  # it names something only the opcode-by-opcode unpickler handles
        unpickler = SafeUnpickler(stream, buffers, self.trusted, budget)
        return unpickler.load(), unpickler.containers
