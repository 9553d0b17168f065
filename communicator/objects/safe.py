"""The ``"safe"`` serializer: pickle protocol 5 restricted to plain data, an allow-list and trusted names.

Whatever bytes arrive, a receiver

- imports and calls nothing outside the allow-list (:data:`CALLABLES`, :data:`VALUES`) and the
  names the user trusts; a name is looked up in its module only, never through attributes; a
  prefix trusts classes only, in modules already imported;
- rebuilds arrays, tensors and the other allowed values from plain data (``communicator.objects.rebuild``),
  never through NumPy's or torch's own reconstruction helpers;
- sets state (``BUILD``) and adds items only to plain containers and to instances of trusted classes;
- allocates at most ``max_expansion`` bytes per received byte plus 1 MiB, every call's result and
  copy included, and refuses values nested deeper than the recursion limit;
- hashes dict keys and set elements whose tuples hold at most as many items, counted each time
  they are reached, as that allowance has bytes (a tuple shared through the memo is counted each
  time it is referenced).

A plain stream (containers, numbers, strings, arrays and other values no opcode can change: see
``communicator.objects.plain_stream``) is unpickled by the C unpickler; any other stream runs in
:class:`_SafeUnpickler`, which carries out each opcode itself. Senders refuse, while pickling, what
receivers would refuse.
"""

from __future__ import annotations

import importlib
import io
import pickle
import struct
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

import communicator.objects.rebuild as rebuild
from communicator.config import DEFAULT_SAFE_MAX_EXPANSION
from communicator.objects.codec import PROTOCOL, BufferCallback, Codec, pickle_pieces
from communicator.objects.plain_stream import MAX_DEPTH, NotPlain, OverBudget, PlainUnpickler, check_depth, check_plain

__all__ = ["CALLABLES", "DEFAULT_MAX_EXPANSION", "VALUES", "SafeCodec", "UnsafePayloadError"]

DEFAULT_MAX_EXPANSION = DEFAULT_SAFE_MAX_EXPANSION
BASE_ALLOWANCE = 1 << 20  # bytes any payload may take, however small


class UnsafePayloadError(pickle.UnpicklingError):
    """The ``"safe"`` serializer refused a payload, or a value that it would not send."""


#: What a payload may call: the functions of ``communicator.objects.rebuild``, which check their arguments.
CALLABLES: dict[tuple[str, str], Callable[..., Any]] = {(rebuild.__name__, f.__name__): f for f in rebuild.REBUILDERS}
#: What a payload may name but never call: builtin types (``defaultdict`` factories), the scalar
#: types of plain NumPy dtypes and the tensor dtypes the library sends.
VALUES: dict[tuple[str, str], object] = {
    **{("builtins", cls.__name__): cls for cls in rebuild.FACTORIES},
    **{(cls.__module__, cls.__qualname__): cls for cls in rebuild.NUMPY_SCALAR_TYPES},
    **{("torch", name.removeprefix("torch.")): kind for name, kind in rebuild.TORCH_DTYPES.items()},
}
_ALLOWED = {**CALLABLES, **VALUES}
_CALLABLE_BY_ID = {id(f): f for f in CALLABLES.values()}
_VALUE_NAMES = {id(value): f"{module}.{name}" for (module, name), value in VALUES.items()}


def _refusal(qualified: str) -> str:
    return (
        f"the 'safe' serializer refused {qualified}: it is not on the allow-list of plain values "
        f"(see the threat model in the objects documentation); add it to CommConfig(trusted=[{qualified!r}]) "
        "if you trust it"
    )


def _listed(module: str, name: str, trusted: Sequence[str]) -> bool:
    """``module.name`` is listed exactly."""
    return f"{module}.{name}" in trusted


def _under_prefix(module: str, trusted: Sequence[str]) -> bool:
    """``module`` is inside a listed prefix (``"pkg."``), and is no ``__main__``: a prefix never
    reaches a script's own module."""
    return "__main__" not in module.split(".") and any(
        entry.endswith(".") and f"{module}.".startswith(entry) for entry in trusted
    )


def _is_trusted(module: str, name: str, trusted: Sequence[str], is_class: bool) -> bool:
    """Listed exactly, or a class under a listed prefix: a prefix trusts no function."""
    return _listed(module, name, trusted) or (is_class and _under_prefix(module, trusted))


def _resolve_trusted(module: str, name: str, trusted: Sequence[str]) -> Any:
    if not name.isidentifier() or not all(part.isidentifier() for part in module.split(".")):
        raise UnsafePayloadError(
            f"the 'safe' serializer refused the name {name!r} in module {module!r}: a name is looked up "
            "in its module only, never through attributes (trust classes defined at module level)"
        )
    listed = _listed(module, name, trusted)
    if not listed and not _under_prefix(module, trusted):
        raise UnsafePayloadError(_refusal(f"{module}.{name}"))
    loaded = sys.modules.get(module)
    if loaded is None and not listed:  # importing would run the module's code: a prefix never imports
        raise UnsafePayloadError(
            f"the 'safe' serializer refused {module}.{name}: a trusted prefix looks names up only in modules "
            f"this process has already imported, and {module!r} is not one (import it first, or trust "
            f"the exact name {module}.{name})"
        )
    try:
        found = vars(loaded if loaded is not None else importlib.import_module(module)).get(name)
    except ImportError as error:
        raise UnsafePayloadError(
            f"the 'safe' serializer cannot import the trusted module {module!r}: {error}"
        ) from None
    if getattr(found, "__module__", None) != module or getattr(found, "__qualname__", None) != name:
        raise UnsafePayloadError(
            f"the 'safe' serializer refused {module}.{name}: it is not a class or function defined under "
            "that name in that module"
        )
    if not listed and not isinstance(found, type):
        raise UnsafePayloadError(
            f"the 'safe' serializer refused {module}.{name}: a trusted prefix trusts classes only, never "
            f"functions (trust the exact name {module}.{name} to let payloads call it)"
        )
    return found


def _describe(value: Any) -> str:
    """``module.name`` of a class or function, else ``a <type>``."""
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)) and module and name:
        return f"{module}.{name}"
    cls = type(value)
    return "a " + (cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}")


def _malformed(what: str) -> UnsafePayloadError:
    return UnsafePayloadError(f"the 'safe' serializer refused a malformed payload: {what}")


def _rebuild(rebuilder: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Call a rebuilder; its complaint about an argument becomes a refusal naming it."""
    try:
        return rebuilder(*args)
    except (pickle.UnpicklingError, ValueError, TypeError, OverflowError, RuntimeError, NotImplementedError) as error:
        raise UnsafePayloadError(
            f"the 'safe' serializer refused {rebuild.__name__}.{rebuilder.__name__}: {error}"
        ) from None


# -- every other stream: one opcode at a time ---------------------------------------------------

# Hashable values whose hash is not cached and visits what they hold (ints are weighed apart).
_HASHED_ITEMS = frozenset({tuple, frozenset, torch.Size})

Handler = Callable[["_SafeUnpickler"], "bool | None"]


def _refused_opcode(u: _SafeUnpickler) -> None:
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


class _SafeUnpickler:
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
        raise _malformed("it ends before its STOP opcode")

    def result(self) -> Any:
        if self.pos != len(self.data) or self.marks or len(self.stack) != 1:
            raise _malformed("STOP must end the payload and leave exactly one value")
        return self.stack[0]

    def spend(self, nbytes: int) -> None:
        self.left -= nbytes
        if self.left < 0:
            raise OverBudget

    def read(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.data):
            raise _malformed(f"an opcode needs {n} bytes, the payload has {len(self.data) - self.pos} left")
        chunk, self.pos = self.data[self.pos : end], end
        return chunk

    def size(self, width: int, signed: bool = False) -> int:
        n = int.from_bytes(self.read(width), "little", signed=signed)
        if n < 0 or n > len(self.data) - self.pos:
            raise _malformed(f"a length of {n} bytes, the payload has {len(self.data) - self.pos} left")
        return n

    def push(self, value: Any, nbytes: int) -> None:
        self.left -= nbytes
        self.stack.append(value)

    def pop(self, what: str) -> Any:
        if not self.stack:
            raise _malformed(f"{what} finds no value on the stack")
        return self.stack.pop()

    def top(self, what: str) -> Any:
        if not self.stack:
            raise _malformed(f"{what} finds no value on the stack")
        return self.stack[-1]

    def pop_mark(self, what: str) -> list[Any]:
        if not self.marks:
            raise _malformed(f"{what} finds no MARK")
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
            verdict = self.trusted_types[cls] = name.isidentifier() and _is_trusted(module, name, self.trusted, True)
        return verdict

    def refuse_target(self, opcode: str, target: Any, allowed: str) -> UnsafePayloadError:
        return UnsafePayloadError(
            f"the 'safe' serializer refused {opcode} on {_describe(target)}: it applies only to "
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
            raise _malformed("STACK_GLOBAL needs two strings")
        found = _ALLOWED.get((module, name))
        if found is None:
            found = _resolve_trusted(module, name, self.trusted)
            self.trusted_names[id(found)] = found
        return found

    def call(self, func: Any, args: Any, kwargs: Any, opcode: str) -> Any:
        if type(args) is not tuple or type(kwargs) is not dict:
            raise _malformed(f"{opcode} needs a tuple of arguments")
        rebuilder = _CALLABLE_BY_ID.get(id(func))
        if rebuilder is not None and rebuilder is func and opcode == "REDUCE":
            self.spend(rebuild.allocation(rebuilder, args))
            if rebuilder is rebuild.ordered_dict and len(args) == 1 and type(args[0]) is dict:
                self.hashes(list(args[0]))  # an OrderedDict hashes its keys again
            return _rebuild(rebuilder, args)
        trusted: Any = self.trusted_names.get(id(func))
        if trusted is not None and trusted is func and (opcode == "REDUCE" or isinstance(trusted, type)):
            self.spend(256)
            built = trusted(*args) if opcode == "REDUCE" else trusted.__new__(trusted, *args, **kwargs)
            self.trusted_objects[id(built)] = built
            return built
        value = _VALUE_NAMES.get(id(func))
        raise UnsafePayloadError(
            f"the 'safe' serializer refused {opcode} of {value or _describe(func)}: it calls only the rebuilders "
            f"of {rebuild.__name__}, trusted classes and functions listed by their exact names"
            + (f" ({value} may be sent as a value, never called)" if value else "")
        )


@_op(pickle.PROTO)
def _proto(u: _SafeUnpickler) -> None:
    if u.read(1)[0] > PROTOCOL:
        raise _malformed("a pickle protocol above 5")


@_op(pickle.FRAME)
def _frame(u: _SafeUnpickler) -> None:
    u.size(8)  # a frame may not announce more bytes than the payload holds


@_op(pickle.STOP)
def _stop(u: _SafeUnpickler) -> bool:
    return True


@_op(pickle.MARK)
def _mark(u: _SafeUnpickler) -> None:
    u.marks.append(u.stack)
    u.stack = []
    u.left -= 16


@_op(pickle.POP)
def _pop(u: _SafeUnpickler) -> None:
    u.pop("POP")


@_op(pickle.POP_MARK)
def _pop_mark(u: _SafeUnpickler) -> None:
    u.pop_mark("POP_MARK")


_CONSTANTS = {pickle.NONE[0]: None, pickle.NEWTRUE[0]: True, pickle.NEWFALSE[0]: False}


@_op(pickle.NONE, pickle.NEWTRUE, pickle.NEWFALSE)
def _constant(u: _SafeUnpickler) -> None:
    u.stack.append(_CONSTANTS[u.data[u.pos - 1]])
    u.left -= 8


# Fixed-size arguments are read in place: past the end, struct.error or IndexError means malformed.
_NUMBERS = {
    pickle.BININT[0]: struct.Struct("<i"),
    pickle.BININT2[0]: struct.Struct("<H"),
    pickle.BINFLOAT[0]: struct.Struct(">d"),
}


@_op(pickle.BININT1)
def _int1(u: _SafeUnpickler) -> None:
    u.stack.append(u.data[u.pos])
    u.pos += 1
    u.left -= 8


@_op(pickle.BININT, pickle.BININT2, pickle.BINFLOAT)
def _number(u: _SafeUnpickler) -> None:
    form = _NUMBERS[u.data[u.pos - 1]]
    u.stack.append(form.unpack_from(u.data, u.pos)[0])
    u.pos += form.size
    u.left -= 40


@_op(pickle.LONG1, pickle.LONG4)
def _long(u: _SafeUnpickler) -> None:
    n = u.size(1) if u.data[u.pos - 1] == pickle.LONG1[0] else u.size(4, signed=True)
    u.push(int.from_bytes(u.read(n), "little", signed=True), 40 + n)


_WIDTHS = {pickle.SHORT_BINUNICODE[0]: 1, pickle.BINUNICODE[0]: 4, pickle.BINUNICODE8[0]: 8}
_WIDTHS |= {pickle.SHORT_BINBYTES[0]: 1, pickle.BINBYTES[0]: 4, pickle.BINBYTES8[0]: 8, pickle.BYTEARRAY8[0]: 8}


@_op(pickle.SHORT_BINUNICODE, pickle.BINUNICODE, pickle.BINUNICODE8)
def _text(u: _SafeUnpickler) -> None:
    text = str(u.read(u.size(_WIDTHS[u.data[u.pos - 1]])), "utf-8", "surrogatepass")
    u.push(text, sys.getsizeof(text) + 8)


@_op(pickle.SHORT_BINBYTES, pickle.BINBYTES, pickle.BINBYTES8, pickle.BYTEARRAY8)
def _bytes(u: _SafeUnpickler) -> None:
    code = u.data[u.pos - 1]
    raw = u.read(u.size(_WIDTHS[code]))
    u.push(bytearray(raw) if code == pickle.BYTEARRAY8[0] else bytes(raw), len(raw) + 64)


@_op(pickle.NEXT_BUFFER)
def _next_buffer(u: _SafeUnpickler) -> None:
    if u.used_buffers >= len(u.buffers):
        raise _malformed(f"NEXT_BUFFER asks for buffer #{u.used_buffers}, the frame has {len(u.buffers)}")
    u.push(u.buffers[u.used_buffers], 8)
    u.used_buffers += 1


@_op(pickle.READONLY_BUFFER)
def _readonly_buffer(u: _SafeUnpickler) -> None:
    if type(u.top("READONLY_BUFFER")) is not memoryview:
        raise _malformed("READONLY_BUFFER applies only to an out-of-band buffer")
    u.stack[-1] = u.stack[-1].toreadonly()
    u.left -= 200  # a new memoryview


@_op(pickle.EMPTY_LIST, pickle.EMPTY_DICT, pickle.EMPTY_SET, pickle.EMPTY_TUPLE)
def _empty(u: _SafeUnpickler) -> None:
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
def _append(u: _SafeUnpickler) -> None:
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
def _setitems(u: _SafeUnpickler) -> None:
    if u.data[u.pos - 1] == pickle.SETITEM[0]:
        value = u.pop("SETITEM")
        items = [u.pop("SETITEM"), value]
    else:
        items = u.pop_mark("SETITEMS")
        if len(items) % 2:
            raise _malformed("SETITEMS with a key and no value")
    target = u.top("SETITEMS")
    u.left -= 136 * len(items) // 2
    if type(target) is not dict and not u.is_trusted_object(target):
        raise u.refuse_target("SETITEMS", target, "dicts")
    u.hashes(items[::2])
    for i in range(0, len(items), 2):
        target[items[i]] = items[i + 1]


@_op(pickle.ADDITEMS)
def _additems(u: _SafeUnpickler) -> None:
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
def _frozenset(u: _SafeUnpickler) -> None:
    items = u.pop_mark("FROZENSET")
    u.hashes(items)
    u.immutable(frozenset(items), items, 232 + 136 * len(items))


@_op(pickle.TUPLE, pickle.TUPLE1, pickle.TUPLE2, pickle.TUPLE3)
def _tuple(u: _SafeUnpickler) -> None:
    code = u.data[u.pos - 1]
    if code == pickle.TUPLE[0]:
        items = u.pop_mark("TUPLE")
    else:
        n = code - pickle.TUPLE1[0] + 1
        if len(u.stack) < n:
            raise _malformed(f"TUPLE{n} finds fewer than {n} values on the stack")
        items, u.stack[-n:] = u.stack[-n:], []
    u.immutable(tuple(items), items, 64 + 8 * len(items))


@_op(pickle.MEMOIZE)
def _memoize(u: _SafeUnpickler) -> None:
    u.memo.append(u.stack[-1])
    u.left -= 16


@_op(pickle.BINGET, pickle.LONG_BINGET)
def _get(u: _SafeUnpickler) -> None:
    index = int.from_bytes(u.read(1 if u.data[u.pos - 1] == pickle.BINGET[0] else 4), "little")
    if index >= len(u.memo):
        raise _malformed(f"it gets memo entry {index}, which was never stored")
    u.stack.append(u.memo[index])
    u.left -= 8


@_op(pickle.STACK_GLOBAL)
def _stack_global(u: _SafeUnpickler) -> None:
    name = u.pop("STACK_GLOBAL")
    u.push(u.find_class(u.pop("STACK_GLOBAL"), name), 8)


@_op(pickle.REDUCE)
def _reduce(u: _SafeUnpickler) -> None:
    args = u.pop("REDUCE")
    u.stack[-1] = u.call(u.top("REDUCE"), args, {}, "REDUCE")


@_op(pickle.NEWOBJ, pickle.NEWOBJ_EX)
def _newobj(u: _SafeUnpickler) -> None:
    kwargs = u.pop("NEWOBJ_EX") if u.data[u.pos - 1] == pickle.NEWOBJ_EX[0] else {}
    args = u.pop("NEWOBJ")
    u.push(u.call(u.pop("NEWOBJ"), args, kwargs, "NEWOBJ"), 8)


@_op(pickle.BUILD)
def _build(u: _SafeUnpickler) -> None:
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
                raise UnsafePayloadError(_refusal(self._qualified(obj)))
            return NotImplemented
        cls = type(obj)
        verdict = self._verdicts.get(cls)
        if verdict is None:
            verdict = self._verdicts[cls] = self._sendable_by_name(cls)
        if not verdict:
            raise UnsafePayloadError(_refusal(self._qualified(cls)))
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
        if _ALLOWED.get((module, name)) is obj:
            return True
        return name.isidentifier() and _is_trusted(module, name, self._trusted, isinstance(obj, type))


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
            raise _malformed(f"{type(error).__name__}: {error}") from error
        return value

    def _decode(self, stream: memoryview, buffers: Sequence[memoryview], budget: int) -> tuple[Any, int]:
        plain = check_plain(stream)
        if plain is not None and plain.cost <= budget:
            if not plain.names:  # containers, numbers and strings only: nothing to resolve
                return pickle.loads(stream, buffers=buffers), plain.containers
            try:
                return PlainUnpickler(
                    stream, buffers, _rebuild, budget - plain.cost, plain.shared
                ).load(), plain.containers
            except NotPlain:
                pass  # it names something only the opcode-by-opcode unpickler handles
        unpickler = _SafeUnpickler(stream, buffers, self.trusted, budget)
        return unpickler.load(), unpickler.containers
