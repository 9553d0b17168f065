"""The ``"safe"`` serializer's unpickler for every stream that is not plain: it carries out each
opcode itself, does only what the allow-list (:mod:`communicator.objects.safe.allowlist`) permits, and
charges what it allocates and hashes to the payload's allowance."""

from __future__ import annotations

import pickle
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

import communicator.objects.safe.rebuild as rebuild
from communicator.objects.codec import PROTOCOL
from communicator.objects.safe.allowlist import (
    ALLOWED,
    CALLABLE_BY_ID,
    VALUE_NAMES,
    UnsafePayloadError,
    call_rebuilder,
    is_trusted,
    malformed,
    qualified_name,
    resolve_trusted,
)
from communicator.objects.safe.plain_stream import MAX_DEPTH, OverBudget

__all__ = ["SafeUnpickler"]

# Hashable values whose hash is not cached and visits what they hold (ints are weighed apart).
_HASHED_ITEMS = frozenset({tuple, frozenset, torch.Size})

Handler = Callable[["SafeUnpickler"], "bool | None"]


def _refused_opcode(u: SafeUnpickler) -> None:
    import pickletools  # only to name the opcode

    code = u.data[u.pos - 1]
    name = next((op.name for op in pickletools.opcodes if ord(op.code) == code), hex(code))
    raise UnsafePayloadError(
        f"the 'safe' serializer refused the pickle opcode {name}: a payload may use "
        "only what pickle protocol 5 writes for plain data, allowed calls and trusted classes"
    )


_OPS: list[Handler] = [_refused_opcode] * 256


def _op(*codes: bytes) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for code in codes:
            _OPS[code[0]] = handler
        return handler

    return register


class SafeUnpickler:
    """Carries out a pickle stream opcode by opcode, doing only what the allow-list permits."""

    def __init__(self, stream: memoryview, buffers: Sequence[memoryview], trusted: Sequence[str], budget: int) -> None:
        self.data, self.pos, self.buffers, self.used_buffers = stream, 0, buffers, 0
        self.trusted, self.left, self.hashing_left = trusted, budget, budget
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: list[Any] = []
        self.trusted_names: dict[int, Any] = {}  # globals resolved through `trusted`
        self.trusted_objects: dict[int, Any] = {}  # what they built (kept alive, so ids stay unique)
        self.trusted_types: dict[type, bool] = {}
        self.depths: dict[int, tuple[int, Any]] = {}  # tuples and frozensets holding others: their depth
        self.weights: dict[int, tuple[int, Any]] = {}  # tuples and frozensets hashed: their weight
        self.containers = 0

    def load(self) -> Any:
        data, ops, end = self.data, _OPS, len(self.data)
        while self.pos < end:
            code = data[self.pos]
            self.pos += 1
            if ops[code](self):
                return self.result()
            if self.left < 0:  # handlers charge what they allocate
                raise OverBudget
        raise malformed("it ends before its STOP opcode")

    def result(self) -> Any:
        if self.pos != len(self.data) or self.marks or len(self.stack) != 1:
            raise malformed("STOP must end the payload and leave exactly one value")
        return self.stack[0]

    def spend(self, nbytes: int) -> None:
        self.left -= nbytes
        if self.left < 0:
            raise OverBudget

    def read(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.data):
            raise malformed(f"an opcode needs {n} bytes, the payload has {len(self.data) - self.pos} left")
        chunk, self.pos = self.data[self.pos : end], end
        return chunk

    def size(self, width: int, signed: bool = False) -> int:
        n = int.from_bytes(self.read(width), "little", signed=signed)
        if n < 0 or n > len(self.data) - self.pos:
            raise malformed(f"a length of {n} bytes, the payload has {len(self.data) - self.pos} left")
        return n

    def push(self, value: Any, nbytes: int) -> None:
        self.left -= nbytes
        self.stack.append(value)

    def pop(self, what: str) -> Any:
        if not self.stack:
            raise malformed(f"{what} finds no value on the stack")
        return self.stack.pop()

    def top(self, what: str) -> Any:
        if not self.stack:
            raise malformed(f"{what} finds no value on the stack")
        return self.stack[-1]

    def pop_mark(self, what: str) -> list[Any]:
        if not self.marks:
            raise malformed(f"{what} finds no MARK")
        items, self.stack = self.stack, self.marks.pop()
        return items

    def is_trusted_object(self, value: Any) -> bool:
        """Built by trusted code, and an instance of a trusted class (not, say, an argument returned)."""
        if self.trusted_objects.get(id(value)) is not value:
            return False
        cls = type(value)
        verdict = self.trusted_types.get(cls)
        if verdict is None:
            module, name = cls.__module__, cls.__qualname__
            verdict = self.trusted_types[cls] = name.isidentifier() and is_trusted(module, name, self.trusted, True)
        return verdict

    def refuse_target(self, opcode: str, target: Any, allowed: str) -> UnsafePayloadError:
        return UnsafePayloadError(
            f"the 'safe' serializer refused {opcode} on {qualified_name(target)}: it applies only to "
            f"{allowed} and to instances of trusted classes"
        )

    def depth(self, value: Any) -> int:
        if type(value) not in (tuple, frozenset):
            return 0
        entry = self.depths.get(id(value))
        return entry[0] if entry is not None and entry[1] is value else 1

    def immutable(self, value: tuple[Any, ...] | frozenset[Any], items: list[Any], nbytes: int) -> None:
        """Push a tuple or frozenset, refusing it if nested too deeply to hash safely."""
        self.left -= nbytes
        self.containers += 1
        depth = 1
        for item in items:
            if type(item) in (tuple, frozenset):
                depth = max(depth, 1 + self.depth(item))
        if depth > 1:
            if depth > MAX_DEPTH:
                raise UnsafePayloadError(
                    f"the 'safe' serializer refused tuples nested more than {MAX_DEPTH} levels deep"
                )
            self.spend(256)
            self.depths[id(value)] = (depth, value)
        self.stack.append(value)

    def hashes(self, keys: Sequence[Any]) -> None:
        """Charge hashing ``keys`` (dict keys, set elements) before it happens: a tuple's hash visits
        every item, again each time a tuple shared through the memo is referenced."""
        for key in keys:
            kind = type(key)
            if kind is int:
                self.hashing_left -= key.bit_length() >> 6  # a long integer's hash reads every digit
            elif kind in _HASHED_ITEMS:
                self.hashing_left -= self.weight(key)
        if self.hashing_left < 0:
            raise UnsafePayloadError(
                "the 'safe' serializer refused a payload whose dict keys and set elements hold more tuple "
                "items, counted each time they are reached, than its allowance has bytes: hashing them "
                "could take without end (tuples shared through the memo); raise "
                "CommConfig(safe_max_expansion=...) if it is legitimate"
            )

    def weight(self, root: tuple[Any, ...] | frozenset[Any]) -> int:
        """The items hashing or comparing ``root`` visits, counted with repetition; each distinct
        tuple is walked once (iteratively: keys nest up to ``MAX_DEPTH`` deep)."""
        known, pending = self.weights, [root]
        while pending:
            node = pending[-1]
            entry = known.get(id(node))
            if entry is not None and entry[1] is node:
                pending.pop()
                continue
            inner = [i for i in node if type(i) in _HASHED_ITEMS and known.get(id(i), (0, None))[1] is not i]
            if inner:
                pending.extend(inner)
                continue
            total = 1
            for item in node:
                kind = type(item)
                total += (
                    known[id(item)][0] if kind in _HASHED_ITEMS else 1 + (item.bit_length() >> 6 if kind is int else 0)
                )
            self.spend(128)
            known[id(node)] = (total, node)
            pending.pop()
        return known[id(root)][0]

    def find_class(self, module: Any, name: Any) -> Any:
        if type(module) is not str or type(name) is not str:
            raise malformed("STACK_GLOBAL needs two strings")
        found = ALLOWED.get((module, name))
        if found is None:
            found = resolve_trusted(module, name, self.trusted)
            self.trusted_names[id(found)] = found
        return found

    def call(self, func: Any, args: Any, kwargs: Any, opcode: str) -> Any:
        if type(args) is not tuple or type(kwargs) is not dict:
            raise malformed(f"{opcode} needs a tuple of arguments")
        rebuilder = CALLABLE_BY_ID.get(id(func))
        if rebuilder is not None and rebuilder is func and opcode == "REDUCE":
            self.spend(rebuild.allocation(rebuilder, args))
            if rebuilder is rebuild.ordered_dict and len(args) == 1 and type(args[0]) is dict:
                self.hashes(list(args[0]))  # an OrderedDict hashes its keys again
            return call_rebuilder(rebuilder, args)
        trusted: Any = self.trusted_names.get(id(func))
        if trusted is not None and trusted is func and (opcode == "REDUCE" or isinstance(trusted, type)):
            self.spend(256)
            built = trusted(*args) if opcode == "REDUCE" else trusted.__new__(trusted, *args, **kwargs)
            self.trusted_objects[id(built)] = built
            return built
        value = VALUE_NAMES.get(id(func))
        raise UnsafePayloadError(
            f"the 'safe' serializer refused {opcode} of {value or qualified_name(func)}: it calls only the rebuilders "
            f"of {rebuild.__name__}, trusted classes and functions listed by their exact names"
            + (f" ({value} may be sent as a value, never called)" if value else "")
        )


@_op(pickle.PROTO)
def _proto(u: SafeUnpickler) -> None:
    if u.read(1)[0] > PROTOCOL:
        raise malformed("a pickle protocol above 5")


@_op(pickle.FRAME)
def _frame(u: SafeUnpickler) -> None:
    u.size(8)  # a frame may not announce more bytes than the payload holds


@_op(pickle.STOP)
def _stop(u: SafeUnpickler) -> bool:
    return True


@_op(pickle.MARK)
def _mark(u: SafeUnpickler) -> None:
    u.marks.append(u.stack)
    u.stack = []
    u.left -= 16


@_op(pickle.POP)
def _pop(u: SafeUnpickler) -> None:
    u.pop("POP")


@_op(pickle.POP_MARK)
def _pop_mark(u: SafeUnpickler) -> None:
    u.pop_mark("POP_MARK")


_CONSTANTS = {pickle.NONE[0]: None, pickle.NEWTRUE[0]: True, pickle.NEWFALSE[0]: False}


@_op(pickle.NONE, pickle.NEWTRUE, pickle.NEWFALSE)
def _constant(u: SafeUnpickler) -> None:
    u.stack.append(_CONSTANTS[u.data[u.pos - 1]])
    u.left -= 8


# Fixed-size arguments are read in place: past the end, struct.error or IndexError means malformed.
_NUMBERS = {
    pickle.BININT[0]: struct.Struct("<i"),
    pickle.BININT2[0]: struct.Struct("<H"),
    pickle.BINFLOAT[0]: struct.Struct(">d"),
}


@_op(pickle.BININT1)
def _int1(u: SafeUnpickler) -> None:
    u.stack.append(u.data[u.pos])
    u.pos += 1
    u.left -= 8


@_op(pickle.BININT, pickle.BININT2, pickle.BINFLOAT)
def _number(u: SafeUnpickler) -> None:
    form = _NUMBERS[u.data[u.pos - 1]]
    u.stack.append(form.unpack_from(u.data, u.pos)[0])
    u.pos += form.size
    u.left -= 40


@_op(pickle.LONG1, pickle.LONG4)
def _long(u: SafeUnpickler) -> None:
    n = u.size(1) if u.data[u.pos - 1] == pickle.LONG1[0] else u.size(4, signed=True)
    u.push(int.from_bytes(u.read(n), "little", signed=True), 40 + n)


_WIDTHS = {pickle.SHORT_BINUNICODE[0]: 1, pickle.BINUNICODE[0]: 4, pickle.BINUNICODE8[0]: 8}
_WIDTHS |= {pickle.SHORT_BINBYTES[0]: 1, pickle.BINBYTES[0]: 4, pickle.BINBYTES8[0]: 8, pickle.BYTEARRAY8[0]: 8}


@_op(pickle.SHORT_BINUNICODE, pickle.BINUNICODE, pickle.BINUNICODE8)
def _text(u: SafeUnpickler) -> None:
    text = str(u.read(u.size(_WIDTHS[u.data[u.pos - 1]])), "utf-8", "surrogatepass")
    u.push(text, sys.getsizeof(text) + 8)


@_op(pickle.SHORT_BINBYTES, pickle.BINBYTES, pickle.BINBYTES8, pickle.BYTEARRAY8)
def _bytes(u: SafeUnpickler) -> None:
    code = u.data[u.pos - 1]
    raw = u.read(u.size(_WIDTHS[code]))
    u.push(bytearray(raw) if code == pickle.BYTEARRAY8[0] else bytes(raw), len(raw) + 64)


@_op(pickle.NEXT_BUFFER)
def _next_buffer(u: SafeUnpickler) -> None:
    if u.used_buffers >= len(u.buffers):
        raise malformed(f"NEXT_BUFFER asks for buffer #{u.used_buffers}, the frame has {len(u.buffers)}")
    u.push(u.buffers[u.used_buffers], 8)
    u.used_buffers += 1


@_op(pickle.READONLY_BUFFER)
def _readonly_buffer(u: SafeUnpickler) -> None:
    if type(u.top("READONLY_BUFFER")) is not memoryview:
        raise malformed("READONLY_BUFFER applies only to an out-of-band buffer")
    u.stack[-1] = u.stack[-1].toreadonly()
    u.left -= 200  # a new memoryview


@_op(pickle.EMPTY_LIST, pickle.EMPTY_DICT, pickle.EMPTY_SET, pickle.EMPTY_TUPLE)
def _empty(u: SafeUnpickler) -> None:
    code = u.data[u.pos - 1]
    if code == pickle.EMPTY_TUPLE[0]:
        u.push((), 8)
        return
    u.containers += 1
    if code == pickle.EMPTY_SET[0]:
        u.push(set(), 240)
    else:
        u.push([] if code == pickle.EMPTY_LIST[0] else {}, 88)


@_op(pickle.APPEND, pickle.APPENDS)
def _append(u: SafeUnpickler) -> None:
    items = [u.pop("APPEND")] if u.data[u.pos - 1] == pickle.APPEND[0] else u.pop_mark("APPENDS")
    target = u.top("APPENDS")
    u.left -= 16 * len(items)
    if type(target) is list:
        target.extend(items)
    elif u.is_trusted_object(target):
        extend = getattr(target, "extend", None)
        if extend is not None:
            extend(items)
        else:
            for item in items:
                target.append(item)
    else:
        raise u.refuse_target("APPENDS", target, "lists")


@_op(pickle.SETITEM, pickle.SETITEMS)
def _setitems(u: SafeUnpickler) -> None:
    if u.data[u.pos - 1] == pickle.SETITEM[0]:
        value = u.pop("SETITEM")
        items = [u.pop("SETITEM"), value]
    else:
        items = u.pop_mark("SETITEMS")
        if len(items) % 2:
            raise malformed("SETITEMS with a key and no value")
    target = u.top("SETITEMS")
    u.left -= 136 * len(items) // 2
    if type(target) is not dict and not u.is_trusted_object(target):
        raise u.refuse_target("SETITEMS", target, "dicts")
    u.hashes(items[::2])
    for i in range(0, len(items), 2):
        target[items[i]] = items[i + 1]


@_op(pickle.ADDITEMS)
def _additems(u: SafeUnpickler) -> None:
    items = u.pop_mark("ADDITEMS")
    target = u.top("ADDITEMS")
    u.spend(136 * len(items))
    u.hashes(items)
    if type(target) is set:
        target.update(items)
    elif u.is_trusted_object(target):
        for item in items:
            target.add(item)
    else:
        raise u.refuse_target("ADDITEMS", target, "sets")


@_op(pickle.FROZENSET)
def _frozenset(u: SafeUnpickler) -> None:
    items = u.pop_mark("FROZENSET")
    u.hashes(items)
    u.immutable(frozenset(items), items, 232 + 136 * len(items))


@_op(pickle.TUPLE, pickle.TUPLE1, pickle.TUPLE2, pickle.TUPLE3)
def _tuple(u: SafeUnpickler) -> None:
    code = u.data[u.pos - 1]
    if code == pickle.TUPLE[0]:
        items = u.pop_mark("TUPLE")
    else:
        n = code - pickle.TUPLE1[0] + 1
        if len(u.stack) < n:
            raise malformed(f"TUPLE{n} finds fewer than {n} values on the stack")
        items, u.stack[-n:] = u.stack[-n:], []
    u.immutable(tuple(items), items, 64 + 8 * len(items))


@_op(pickle.MEMOIZE)
def _memoize(u: SafeUnpickler) -> None:
    u.memo.append(u.stack[-1])
    u.left -= 16


@_op(pickle.BINGET, pickle.LONG_BINGET)
def _get(u: SafeUnpickler) -> None:
    index = int.from_bytes(u.read(1 if u.data[u.pos - 1] == pickle.BINGET[0] else 4), "little")
    if index >= len(u.memo):
        raise malformed(f"it gets memo entry {index}, which was never stored")
    u.stack.append(u.memo[index])
    u.left -= 8


@_op(pickle.STACK_GLOBAL)
def _stack_global(u: SafeUnpickler) -> None:
    name = u.pop("STACK_GLOBAL")
    u.push(u.find_class(u.pop("STACK_GLOBAL"), name), 8)


@_op(pickle.REDUCE)
def _reduce(u: SafeUnpickler) -> None:
    args = u.pop("REDUCE")
    u.stack[-1] = u.call(u.top("REDUCE"), args, {}, "REDUCE")


@_op(pickle.NEWOBJ, pickle.NEWOBJ_EX)
def _newobj(u: SafeUnpickler) -> None:
    kwargs = u.pop("NEWOBJ_EX") if u.data[u.pos - 1] == pickle.NEWOBJ_EX[0] else {}
    args = u.pop("NEWOBJ")
    u.push(u.call(u.pop("NEWOBJ"), args, kwargs, "NEWOBJ"), 8)


@_op(pickle.BUILD)
def _build(u: SafeUnpickler) -> None:
    state = u.pop("BUILD")
    target = u.top("BUILD")
    if not u.is_trusted_object(target):
        raise u.refuse_target("BUILD (setting state)", target, "nothing else")
    setstate = getattr(target, "__setstate__", None)
    if setstate is not None:
        setstate(state)
        return
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    for part in (state, slots):  # copied into the instance, keys hashed again: a memo may share them
        if type(part) is dict:
            u.spend(136 * len(part))
            u.hashes(list(part))
    if state:
        target.__dict__.update({sys.intern(k) if type(k) is str else k: v for k, v in state.items()})
    for key, value in (slots or {}).items():
        setattr(target, key, value)
