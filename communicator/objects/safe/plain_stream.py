"""Pickle streams of plain data, which the C unpickler may run: checked by a regular expression first.

A plain stream uses only the opcodes pickle protocol 5 writes for containers, numbers, strings,
bytes, out-of-band buffers and calls (``STACK_GLOBAL`` then ``REDUCE``); its every length fits in
the stream, and it has at most ``MAX_DEPTH`` tuple opcodes. What it names is then checked by
:class:`PlainUnpickler`: only rebuilders of values that no opcode can change, each charged what it
allocates before it runs. Nothing in such a stream sets state, creates objects of named classes, or
reaches the memo by a forged index; and nothing it hashes (a dict key, a set element) holds a tuple,
frozenset or long integer shared through the memo, whose hash could visit it exponentially often.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import io
import pickle
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

import communicator.objects.safe.rebuild as rebuild
from communicator.objects.codec import PROTOCOL

__all__ = ["MAX_DEPTH", "NotPlain", "OverBudget", "PlainStream", "PlainUnpickler", "check_depth", "check_plain"]

# Values nest at most this deep. A plain stream has at most this many tuple opcodes, since a tuple's
# hash recurses in C without a guard (this depth takes about 0.5 MB of C stack); a value built from
# fewer containers cannot nest deeper, so it is not walked.
MAX_DEPTH = 10_000


class NotPlain(Exception):
    """The stream names something that only the opcode-by-opcode unpickler may handle."""


class OverBudget(Exception):
    """Decoding would allocate more than the payload's allowance."""


def _counted(code: int) -> bytes:
    """An opcode, a one-byte length, then that many bytes."""
    lengths = b"|".join(re.escape(bytes([n])) + b".{%d}" % n for n in range(256))
    return re.escape(bytes([code])) + b"(?:" + lengths + b")"


_TUPLE_OPS = b"\x85\x86\x87t"
_NUMBERS = [rb"G.{8}", rb"K.", rb"J.{4}", rb"M..", rb"\x95.{8}", rb"\x80.", _counted(0x8A)]
_STRINGS = [_counted(0x8C), _counted(ord("C"))]
_GETS = [rb"h.", rb"j.{4}"]
# No argument: constants, marks, appends, pops, buffers; what creates the objects MEMOIZE may follow
# in a stream that reads its memo (lists, dicts, sets, names, call results); what hashes.
_BARE_OPS = b"N\x88\x89ae(01)\x97\x98"
_CREATE_OPS = b"]}\x8f\x93R"
_HASH_OPS = b"su\x90\x91"


def _any(ops: bytes) -> bytes:
    return b"[" + re.escape(ops) + b"]"


# Three kinds of plain stream, so that nothing hashed can hold a value shared through the memo whose
# hash is not cached (a tuple or torch.Size, a frozenset's elements when compared, a long integer):
# "unshared": the memo is never read; "unhashed": no dict item, set or frozenset; "shared": the memo
# is read and values hashed, but it holds only strings, bytes and what _CREATE_OPS make (the only
# kind in which a torch.Size may not be built). Tried in this order; a failing check stops early.
_KINDS: dict[str, list[bytes]] = {
    "unshared": [*_STRINGS, _any(_BARE_OPS + _CREATE_OPS + _HASH_OPS + b"\x94")],
    "unhashed": [*_GETS, *_STRINGS, _any(_BARE_OPS + _CREATE_OPS + b"\x94")],
    "shared": [*_GETS, *(s + b"\x94?" for s in _STRINGS), _any(_CREATE_OPS) + b"\x94?", _any(_BARE_OPS + _HASH_OPS)],
}


@functools.cache
def _run(kind: str, with_tuples: bool) -> re.Pattern[bytes]:
    """Runs of the opcodes a plain stream of ``kind`` may use; without ``with_tuples``, stopping at
    each tuple opcode. Compiled on first use: it takes tens of milliseconds."""
    tokens = [*_KINDS[kind], *_NUMBERS]
    if with_tuples:
        tokens.append(_any(_TUPLE_OPS))
    return re.compile(b"(?:" + b"|".join(tokens) + b")*+", re.DOTALL)


# Opcodes with a 4- or 8-byte length, checked here: the C unpickler allocates some before reading.
# Each but LONG4 makes a string or bytes, which a stream of any kind may memoise.
_LONG_COUNTED = {ord("X"): 4, ord("B"): 4, 0x8B: 4, 0x8D: 8, 0x8E: 8, 0x96: 8}
_CONTAINER_BYTES = b"]}\x8f\x91"
# Upper bounds of what the C unpickler allocates: per stream byte (numbers, strings, memo entries,
# growing lists, dicts and sets), per container it creates (an empty set takes 216 bytes) and per
# call (an array header, a path's parts).
_BYTE_COST, _CONTAINER_COST, _CALL_COST = 48, 256, 512


def _is_plain(stream: memoryview, run: re.Pattern[bytes]) -> bool:
    """Whether ``stream`` is one run of plain opcodes, long strings and at most ``MAX_DEPTH``
    tuple opcodes where ``run`` stops, then STOP."""
    end, pos, tuples = len(stream), 0, 0
    while True:
        pos = run.match(stream, pos).end()  # type: ignore[union-attr]  # *+ always matches
        if pos >= end:
            return False
        code = stream[pos]
        if code in _TUPLE_OPS and tuples < MAX_DEPTH:
            tuples, pos = tuples + 1, pos + 1
        elif code in _LONG_COUNTED:
            start = pos + 1 + _LONG_COUNTED[code]
            size = int.from_bytes(stream[pos + 1 : start], "little", signed=code == 0x8B)
            if start > end or size < 0 or start + size > end:
                return False
            pos = start + size
            if code != 0x8B and pos < end and stream[pos] == pickle.MEMOIZE[0]:
                pos += 1
        else:
            return code == pickle.STOP[0] and pos == end - 1


@dataclasses.dataclass(frozen=True)
class PlainStream:
    """What the check of a plain stream found."""

    cost: int  # an upper bound of the bytes unpickling it allocates
    containers: int  # an upper bound of the containers it builds, so of how deep they nest
    names: bool  # it may name rebuilders (it holds a STACK_GLOBAL byte)
    shared: bool  # it may hash values read from its memo


_SMALL = 4096  # below this many bytes, worst cases are cheaper than counting


def check_plain(stream: memoryview) -> PlainStream | None:
    """The bounds of a plain stream; ``None`` for any other stream.

    Bytes are counted first (each opcode is one byte, so this bounds how many there are); when the
    count already bounds the tuple opcodes, the regular expression need not stop at each.
    """
    if len(stream) <= _SMALL:
        raw = stream.tobytes()
        tuple_bytes = sum(raw.count(code) for code in _TUPLE_OPS)
        cost, containers = (_BYTE_COST + _CONTAINER_COST + _CALL_COST) * len(raw), len(raw)
        names = pickle.STACK_GLOBAL in raw
    else:
        data = np.frombuffer(stream, dtype=np.uint8)

        def count(codes: bytes) -> int:
            return sum(int(np.count_nonzero(data == code)) for code in codes)

        tuple_bytes, containers, calls = count(_TUPLE_OPS), count(_CONTAINER_BYTES), count(b"R")
        cost = _BYTE_COST * len(stream) + _CONTAINER_COST * (containers + tuple_bytes) + _CALL_COST * calls
        containers, names = containers + tuple_bytes, bool(count(pickle.STACK_GLOBAL))
    with_tuples = tuple_bytes <= MAX_DEPTH
    kind = next((kind for kind in _KINDS if _is_plain(stream, _run(kind, with_tuples))), None)
    return None if kind is None else PlainStream(cost, containers, names, shared=kind == "shared")


# Rebuilders whose values no opcode can change: a plain stream may call these (torch_size only where
# it hashes nothing read from the memo: a torch.Size is a tuple). Arrays are made read-only while the
# stream runs, so that SETITEM cannot write into them.
_IMMUTABLE_RESULTS: tuple[Callable[..., Any], ...] = (
    *(rebuild.numpy_scalar, rebuild.numpy_dtype, rebuild.torch_size, rebuild.torch_device, rebuild.complex_number),
    *(rebuild.date, rebuild.time, rebuild.datetime, rebuild.timedelta, rebuild.timezone, rebuild.path),
)


class PlainUnpickler(pickle.Unpickler):
    """The C unpickler, for a plain stream: it resolves only the rebuilders of unchangeable values
    and of arrays, and raises :class:`NotPlain` for any other name. Each call is charged what it
    allocates (:func:`communicator.objects.safe.rebuild.allocation`) from ``allowance`` before it runs (its
    arguments may be memo references), and raises :class:`OverBudget` beyond it."""

    _NAMES: ClassVar[dict[tuple[str, str], Callable[..., Any]]] = {
        (rebuild.__name__, f.__name__): f for f in (*_IMMUTABLE_RESULTS, rebuild.ndarray)
    }

    def __init__(
        self, stream: memoryview, buffers: Sequence[memoryview], call: Callable[..., Any], allowance: int, shared: bool
    ) -> None:
        super().__init__(io.BytesIO(stream), buffers=buffers)
        self._call, self._left, self._shared = call, allowance, shared
        self._frozen: list[np.ndarray] = []

    def find_class(self, module: str, name: str) -> Any:
        found = self._NAMES.get((module, name))
        if found is None or (found is rebuild.torch_size and self._shared):
            raise NotPlain
        return self._read_only_array if found is rebuild.ndarray else lambda *args: self._charged(found, args)

    def _charged(self, rebuilder: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        self._left -= rebuild.allocation(rebuilder, args)
        if self._left < 0:
            raise OverBudget
        return self._call(rebuilder, args)

    def _read_only_array(self, *args: Any) -> np.ndarray:
        array: np.ndarray = self._charged(rebuild.ndarray, args)
        if array.flags.writeable:
            array.flags.writeable = False
            self._frozen.append(array)
        return array

    def load(self) -> Any:
        value = super().load()
        for array in self._frozen:
            array.flags.writeable = True
        return value


def _nothing() -> None:
    """What the depth probe reduces leaves to."""


class _Discard:
    __slots__ = ()

    def write(self, data: Any) -> int:
        return len(data)


class _DepthProbe(pickle.Pickler):
    """Pickles a decoded value into nothing, so that the C pickler's recursion guard raises
    ``RecursionError`` for nesting deeper than the recursion limit (the sender could not have
    pickled it either)."""

    _WALKED = frozenset({collections.OrderedDict, collections.defaultdict, collections.Counter, collections.deque})

    def __init__(self) -> None:
        super().__init__(_Discard(), protocol=PROTOCOL)

    def reducer_override(self, obj: Any) -> Any:
        if obj is _nothing or type(obj) in self._WALKED:
            return NotImplemented
        state = getattr(obj, "__dict__", None)  # a trusted instance's attributes came from the payload
        return (_nothing, (), state) if type(state) is dict and state else (_nothing, ())


def check_depth(value: Any, containers: int) -> None:
    """Raise ``RecursionError`` if ``value``, built from ``containers`` containers at most, may nest
    deeper than ``MAX_DEPTH``: it is then walked, and refused beyond the recursion limit."""
    if containers > MAX_DEPTH:
        _DepthProbe().dump(value)
