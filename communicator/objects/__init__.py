"""How Python objects travel: the object protocol and everything under it.

- :mod:`~communicator.objects.protocol`: the object collectives, as records and point-to-point frames;
- :mod:`~communicator.objects.frames`: a frame's layout, and its streaming in chunks;
- :mod:`~communicator.objects.codec`: the codec interface, the pickle codec and a user's serializer;
- :mod:`~communicator.objects.safe.serializer`: the ``"safe"`` codec, a restricted unpickler (the rest of
  :mod:`~communicator.objects.safe` is what it is made of);
- :mod:`~communicator.objects.safe.allowlist`: what its payloads may name and call, and its refusals;
- :mod:`~communicator.objects.safe.unpickler`: its unpickler of streams that are not plain, opcode by opcode;
- :mod:`~communicator.objects.safe.plain_stream`: its fast check of streams of plain data;
- :mod:`~communicator.objects.safe.rebuild`: how arrays, tensors and other values are rebuilt from plain data.
"""

from __future__ import annotations

from collections.abc import Sequence

from communicator.config import Serializer
from communicator.objects.codec import Codec, PickleCodec, UserCodec
from communicator.objects.safe.serializer import DEFAULT_MAX_EXPANSION, SafeCodec

__all__ = ["make_codec"]


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
