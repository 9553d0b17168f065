"""Attacks on the ``"safe"`` serializer. Every hostile payload must end in ``UnsafePayloadError``:
never in code running, memory corruption, a crash or an allocation out of proportion to its size.

Payloads are written opcode by opcode (see ``pickletools``). Most attacks run twice: alone, where
the C unpickler runs them after the plain-stream check, and after a tensor, which only the
opcode-by-opcode unpickler handles. Decodes that could crash the interpreter run in a child process.
"""

from __future__ import annotations

import copyreg
import functools
import importlib
import os
import pathlib
import pickle
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from communicator import Communicator
from communicator.objects.codec import Codec
from communicator.objects.safe import rebuild as rb
from communicator.objects.safe.serializer import CALLABLES, VALUES, SafeCodec, UnsafePayloadError
from communicator.testing import run_ranks

pytestmark = pytest.mark.timeout(300)

REBUILD = rb.__name__
CHILD_TIMEOUT = 240


# -- writing payloads -----------------------------------------------------------------------------


def text(value: str) -> bytes:
    raw = value.encode()
    return b"\x8c" + bytes([len(raw)]) + raw if len(raw) < 256 else b"X" + struct.pack("<I", len(raw)) + raw


def raw_bytes(value: bytes) -> bytes:
    return b"C" + bytes([len(value)]) + value if len(value) < 256 else b"B" + struct.pack("<I", len(value)) + value


def integer(n: int) -> bytes:
    return b"J" + struct.pack("<i", n) if -(2**31) <= n < 2**31 else b"\x8a" + bytes([9]) + n.to_bytes(9, "little")


def tup(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def name(module: str, qualname: str) -> bytes:
    return text(module) + text(qualname) + b"\x93"


def call(module: str, qualname: str, *args: bytes) -> bytes:
    return name(module, qualname) + tup(*args) + b"R"


FALSE, TRUE, NONE = b"\x89", b"\x88", b"N"
ARRAY = call(REBUILD, "ndarray", raw_bytes(b"\x01\x00\x00\x00" * 2), text("<i4"), tup(integer(2)), FALSE)
TENSOR = call(
    REBUILD, "tensor", raw_bytes(b"\x00\x00\x80?"), text("torch.float32"), tup(integer(1)), FALSE, FALSE, FALSE
)


def stream(*values: bytes) -> bytes:
    """A payload of one value, or of a list of several."""
    body = values[0] if len(values) == 1 else b"](" + b"".join(values) + b"e"
    return b"\x80\x05" + body + b"."


PATHS = {
    "plain": lambda value: stream(value),
    "strict": lambda value: stream(TENSOR, value),  # the tensor sends the whole stream opcode by opcode
}


@pytest.fixture(params=list(PATHS))
def wrap(request: pytest.FixtureRequest) -> Callable[[bytes], bytes]:
    return PATHS[request.param]  # type: ignore[no-any-return]


def decode(payload: bytes, buffers: tuple[bytes, ...] = (), **codec: Any) -> Any:
    return SafeCodec(**codec).decode(memoryview(payload), [memoryview(bytearray(b)) for b in buffers])


def refused(payload: bytes, match: str | None = None, **kwargs: Any) -> str:
    with pytest.raises(UnsafePayloadError, match=match) as caught:
        decode(payload, **kwargs)
    return str(caught.value)


CHILD = textwrap.dedent(
    """
    import pickle, sys
    from communicator.objects.safe.serializer import SafeCodec, UnsafePayloadError
    payloads, trusted = pickle.loads(sys.stdin.buffer.read())
    for payload in payloads:
        try:
            value = SafeCodec(trusted).decode(memoryview(payload), [])
        except UnsafePayloadError as error:
            print("refused:", str(error).replace(chr(10), " "), flush=True)
        else:
            print("accepted:", type(value).__name__, flush=True)
    """
)


def decode_in_child(payloads: list[bytes], trusted: tuple[str, ...] = (), timeout: float = CHILD_TIMEOUT) -> list[str]:
    """Decode in a fresh interpreter: a crash (or a decode that never ends) fails the test instead
    of killing (or holding) pytest."""
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=pickle.dumps((payloads, trusted)),
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"the decoding process died ({result.returncode}): {result.stderr[-3000:]!r}"
    lines = result.stdout.decode().splitlines()
    assert len(lines) == len(payloads), result.stderr[-3000:]
    return lines


# -- the three reported attacks -------------------------------------------------------------------


class ForgedDtype:
    def __reduce__(self) -> Any:
        state = list(np.dtype([("a", "O")]).__reduce__()[2])
        state[-1] = 0
        return (np.dtype, ("V8", False, True), tuple(state))


class ForgedArray:
    def __reduce__(self) -> Any:
        return (np._core.numeric._frombuffer, (b"A" * 8, ForgedDtype(), (1,), "C"))  # type: ignore[attr-defined]


def test_forged_numpy_dtype_is_refused_in_a_child_that_survives() -> None:
    """Unpickled with pickle, this payload reads b"AAAAAAAA" as an object pointer: SIGSEGV."""
    [line] = decode_in_child([pickle.dumps(ForgedArray(), protocol=5)])
    assert line.startswith("refused:") and "numpy._core.numeric._frombuffer" in line


def test_every_numpy_and_torch_reconstruction_helper_is_refused(wrap: Callable[[bytes], bytes]) -> None:
    helpers = [
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_parameter"),
        ("torch.nn.parameter", "Parameter"),
        ("torch.storage", "_load_from_bytes"),
        ("torch", "Size"),
        ("torch", "device"),
    ]
    for module, qualname in helpers:
        assert f"{module}.{qualname}" in refused(wrap(call(module, qualname, integer(1))))


DOTTED = b"\x80\x04\x8c\x0bmypkg.types\x8c\x0ftorch.os.system\x93\x8c\x0aecho PWNED\x85R."


@pytest.fixture
def mypkg(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """A real trusted package, imported, whose module imports torch and os.system; beside it a
    ``__main__`` and a module not imported yet, each of which writes a file when it runs."""
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "types.py").write_text(
        "import torch\nfrom os import system\n\n\nclass Box:\n    def __init__(self, v):\n        self.v = v\n\n\n"
        "def identity(value):\n    return value\n"
    )
    for module in ("__main__", "lazy"):
        ran = tmp_path / f"{module}-ran"
        (package / f"{module}.py").write_text(f"open({str(ran)!r}, 'w').close()\n\n\nclass Box:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("mypkg.types")  # a prefix looks names up only in modules already imported
    yield tmp_path / "pwned"
    for module in ("mypkg.types", "mypkg.lazy", "mypkg.__main__", "mypkg"):
        sys.modules.pop(module, None)


def test_a_trusted_prefix_never_reaches_through_attributes(mypkg: pathlib.Path) -> None:
    assert "'torch.os.system' in module 'mypkg.types'" in refused(DOTTED, trusted=["mypkg."])
    touch = text(f"touch {mypkg}") + b"\x85R"
    for module, qualname in [("mypkg.types", "torch.os.system"), ("mypkg", "types.system"), ("mypkg.types", "Box.v")]:
        refused(b"\x80\x05" + name(module, qualname) + touch + b".", "never through attributes", trusted=["mypkg."])
    # names that exist in the module but are not defined there: imported functions and modules
    for qualname in ("system", "torch"):
        payload = b"\x80\x05" + name("mypkg.types", qualname) + touch + b"."
        refused(payload, "not a class or function defined under that name", trusted=["mypkg."])
    assert not mypkg.exists()
    box = decode(stream(name("mypkg.types", "Box") + tup(integer(3)) + b"R"), trusted=["mypkg."])
    assert type(box).__name__ == "Box" and box.v == 3


def test_state_goes_only_to_instances_of_trusted_classes(mypkg: pathlib.Path) -> None:
    box = name("mypkg.types", "Box") + tup(integer(3)) + b"R"
    got = decode(stream(box + b"}(" + text("v") + integer(4) + text("w") + integer(5) + b"ub"), trusted=["mypkg."])
    assert (got.v, got.w) == (4, 5)
    # a trusted function that returns its argument does not make that argument a target
    dtype = call(REBUILD, "numpy_dtype", text("<f8"))
    forged = tup(integer(3), text("<"), NONE, NONE, NONE, integer(8), integer(8), integer(0))
    for target in (dtype, ARRAY, b"}"):
        payload = stream(name("mypkg.types", "identity") + tup(target) + b"R" + forged + b"b")
        refused(payload, "refused BUILD", trusted=["mypkg.", "mypkg.types.identity"])
    assert np.dtype("<f8").fields is None and np.dtype("<f8").itemsize == 8


def test_a_prefix_trusts_classes_and_never_functions(mypkg: pathlib.Path) -> None:
    identity = stream(call("mypkg.types", "identity", integer(3)))
    assert "a trusted prefix trusts classes only, never functions" in refused(identity, trusted=["mypkg."])
    assert decode(identity, trusted=["mypkg.", "mypkg.types.identity"]) == 3  # an exact name may be a function
    module = sys.modules["mypkg.types"]
    with pytest.raises(UnsafePayloadError, match=r"mypkg\.types\.identity"):  # the sender refuses it too
        SafeCodec(trusted=["mypkg."]).encode([module.identity])
    assert decode(bytes(SafeCodec(trusted=["mypkg."]).encode(module.Box(2))[0]), trusted=["mypkg."]).v == 2


def test_a_prefix_never_imports_a_module(mypkg: pathlib.Path) -> None:
    """Importing runs a module's code: a prefix reaches only modules already imported, never a __main__."""
    for module in ("mypkg.lazy", "mypkg.__main__"):
        message = refused(stream(call(module, "Box")), trusted=["mypkg."])
        assert "already imported" in message or "mypkg.__main__.Box: it is not on the allow-list" in message
        assert module not in sys.modules and not (mypkg.parent / f"{module.split('.')[1]}-ran").exists()
    importlib.import_module("mypkg.__main__")  # even imported, a prefix never reaches a __main__
    refused(stream(call("mypkg.__main__", "Box")), "mypkg.__main__.Box", trusted=["mypkg."])
    refused(stream(call("__main__", "Box")), "__main__.Box", trusted=["__main__."])
    # an exact name is what the user asked for: its module is imported
    assert type(decode(stream(call("mypkg.lazy", "Box")), trusted=["mypkg.lazy.Box"])).__name__ == "Box"


def test_a_module_outside_the_trusted_prefix_is_refused(mypkg: pathlib.Path) -> None:
    for trusted in (["mypkg.types.Box"], ["mypk."], ["mypkg.typ"]):
        refused(stream(call("mypkg.types", "system", text("true"))), "trusted", trusted=trusted)
    refused(stream(call("mypkgx.types", "Box", integer(1))), "mypkgx.types.Box", trusted=["mypkg."])


class Bomb:
    def __reduce__(self) -> Any:
        return (bytearray, (1_500_000_000,))


BYTEARRAY_BOMB = pickle.dumps(Bomb(), protocol=4)


def test_allocation_by_integer_argument_is_refused_without_allocating() -> None:
    assert len(BYTEARRAY_BOMB) < 64  # for 1.5 GB once unpickled
    tracemalloc.start()
    try:
        message = refused(BYTEARRAY_BOMB, "builtins.bytearray may be sent as a value, never called")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, message
    for qualname in ("bytes", "list", "range", "str", "int"):
        refused(stream(call("builtins", qualname, integer(10**9))), f"builtins.{qualname}")


@pytest.mark.parametrize(
    "global_name",
    [("pathlib", "PosixPath"), ("fractions", "Fraction"), ("uuid", "UUID"), ("decimal", "Decimal")],
)
def test_classes_whose_state_can_be_forged_are_not_on_the_allow_list(global_name: tuple[str, str]) -> None:
    state = b"}" + text("_raw_paths") + b"](" + text("/data") + b"eu"
    payload = stream(name(*global_name) + b")\x81" + state + b"b")  # NEWOBJ, then BUILD with forged state
    refused(payload, ".".join(global_name))


def test_paths_are_rebuilt_from_their_string_alone() -> None:
    path = decode(stream(call(REBUILD, "path", text("PosixPath"), text("/data/x"))))
    assert path == pathlib.PosixPath("/data/x") and path.parts == ("/", "data", "x")


# -- every opcode that names, calls or mutates ------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "opcode"),
    [
        (b"\x80\x02cos\nsystem\n(S'echo unsafe'\ntR.", "GLOBAL"),
        (b"\x80\x02c" + REBUILD.encode() + b"\npath\n.", "GLOBAL"),  # even an allowed name
        (b"\x80\x05(" + name(REBUILD, "path") + text("PosixPath") + text("/x") + b"o.", "OBJ"),
        (b"\x80\x02(S'echo unsafe'\nios\nsystem\n.", "STRING"),  # INST, after protocol 0's STRING
        (b"\x80\x02(\x8c\x02os\x8c\x06systemi.", "INST"),
        (b"\x80\x05P0\n.", "PERSID"),
        (b"\x80\x05K\x01Q.", "BINPERSID"),
        (b"\x80\x05\x82\x01.", "EXT1"),
        (b"\x80\x05\x83\x01\x00.", "EXT2"),
        (b"\x80\x05\x84\x01\x00\x00\x00.", "EXT4"),
        (b"\x80\x05N2.", "DUP"),
        (b"\x80\x05Np0\n.", "PUT"),
        (b"\x80\x05Nq\x00.", "BINPUT"),
        (b"\x80\x05Nr\xff\xff\xff\x7f.", "LONG_BINPUT"),  # the C unpickler would size its memo by this
        (b"\x80\x05I1\n.", "INT"),
        (b"\x80\x05(l.", "LIST"),
    ],
)
def test_opcodes_outside_protocol_5s_plain_data_are_refused(payload: bytes, opcode: str) -> None:
    assert f"opcode {opcode}:" in refused(payload)


def test_copyreg_extensions_cannot_bypass_the_allow_list() -> None:
    code = 0xF0
    copyreg.add_extension("os", "system", code)
    try:
        assert pickle.loads(b"\x80\x02\x82\xf0.") is os.system  # now in copyreg's cache, past find_class
        for ext in (b"\x82\xf0", b"\x83\xf0\x00", b"\x84\xf0\x00\x00\x00"):
            refused(stream(ext + text("echo unsafe") + b"\x85R"), "opcode EXT")
    finally:
        copyreg.remove_extension("os", "system", code)


@pytest.mark.parametrize(
    ("module", "qualname"),
    [
        ("os", "system"),
        ("builtins", "eval"),
        ("builtins", "getattr"),
        ("builtins", "__import__"),
        ("builtins", "type"),
        ("copyreg", "_reconstructor"),
        ("copyreg", "__newobj__"),
        ("collections", "OrderedDict"),
        ("functools", "partial"),
        ("communicator.objects.frames", "pack_frame"),
        (REBUILD, "safe_reduction"),
        (REBUILD, "_raw"),
        (REBUILD, "np"),
        (REBUILD, "torch"),
        ("communicator.objects", "rebuild"),
    ],
)
def test_stack_global_resolves_only_the_allow_list(module: str, qualname: str, wrap: Callable[[bytes], bytes]) -> None:
    refused(wrap(name(module, qualname)), f"{module}.{qualname}")


def test_stack_global_needs_strings(wrap: Callable[[bytes], bytes]) -> None:
    refused(wrap(integer(1) + text("path") + b"\x93"))
    refused(wrap(text(REBUILD) + integer(1) + b"\x93"))


@pytest.mark.parametrize("value", [name(*key) for key in list(VALUES)[:: max(1, len(VALUES) // 8)]])
def test_values_on_the_allow_list_are_never_called(value: bytes, wrap: Callable[[bytes], bytes]) -> None:
    refused(wrap(value + tup(integer(10**6)) + b"R"), "may be sent as a value, never called")
    refused(wrap(value + tup(integer(10**6)) + b"\x81"), "refused NEWOBJ")  # NEWOBJ: cls.__new__(cls, ...)
    refused(wrap(value + tup() + b"}\x92"), "refused NEWOBJ")  # NEWOBJ_EX


@pytest.mark.parametrize(
    "callee",
    [NONE, integer(3), text("os.system"), ARRAY, b"](e", name(REBUILD, "path") + tup() + b"R"],
    ids=["none", "int", "str", "array", "list", "failed-call"],
)
def test_reduce_calls_nothing_but_rebuilders(callee: bytes, wrap: Callable[[bytes], bytes]) -> None:
    refused(wrap(callee + tup(text("x")) + b"R"))


def test_reduce_and_newobj_need_a_tuple_of_arguments(wrap: Callable[[bytes], bytes]) -> None:
    refused(wrap(name(REBUILD, "timedelta") + b"](K\x01K\x02K\x03eR"))
    refused(wrap(name(REBUILD, "timedelta") + integer(1) + b"R"))
    refused(wrap(name(REBUILD, "date") + tup() + b"\x81"), "refused NEWOBJ")  # a rebuilder is not a class


@pytest.mark.parametrize(
    "target",
    [
        b"}",
        b"]",
        ARRAY,
        TENSOR,
        call(REBUILD, "numpy_dtype", text("<f8")),
        name(REBUILD, "ndarray"),
        name("builtins", "int"),
        name("torch", "float32"),
        call(REBUILD, "ordered_dict", b"}"),
    ],
    ids=["dict", "list", "array", "tensor", "dtype", "rebuilder", "type", "torch-dtype", "ordereddict"],
)
def test_build_sets_state_on_nothing_but_trusted_instances(target: bytes, wrap: Callable[[bytes], bytes]) -> None:
    states = [
        b"}(" + text("__dict__") + b"}u",
        b"}" + text("__defaults__") + tup(integer(1)) + b"s",
        b"N}" + text("__class__") + name(REBUILD, "path") + b"s\x86",  # slot state: setattr
        tup(integer(1), tup(integer(64)), call(REBUILD, "numpy_dtype", text("<f8")), FALSE, raw_bytes(b"A" * 8)),
    ]
    for state in states:
        refused(wrap(target + state + b"b"), "refused BUILD|Error")
    assert rb.ndarray.__defaults__ is None and not rb.ndarray.__dict__  # nothing was set on the function
    assert np.dtype("<f8").fields is None


@pytest.mark.parametrize(
    "target",
    [ARRAY, TENSOR, call(REBUILD, "deque", b"]", NONE), call(REBUILD, "ordered_dict", b"}"), name("builtins", "dict")],
    ids=["array", "tensor", "deque", "ordereddict", "type"],
)
def test_items_are_added_only_to_plain_containers(target: bytes, wrap: Callable[[bytes], bytes]) -> None:
    for ops in (integer(0) + integer(7) + b"s", b"(" + integer(0) + integer(7) + b"u", integer(7) + b"a"):
        refused(wrap(target + ops))
    refused(wrap(target + b"(" + TENSOR + b"\x90"))  # ADDITEMS: tensor.add(tensor) would broadcast


def test_a_tensor_never_writes_into_read_only_bytes() -> None:
    data = b"\x00\x00\x80?"
    got = decode(stream(call(REBUILD, "tensor", raw_bytes(data), text("torch.float32"), tup(integer(1)), *[FALSE] * 3)))
    got += 1
    assert got.item() == 2.0 and data == b"\x00\x00\x80?"


def test_an_array_received_out_of_band_is_not_written_to() -> None:
    data = bytearray(np.arange(4, dtype=np.int32).tobytes())
    array = b"\x80\x05" + call(REBUILD, "ndarray", b"\x97", text("<i4"), tup(integer(4)), FALSE)
    with pytest.raises(UnsafePayloadError, match="read-only"):
        SafeCodec().decode(memoryview(array + b"(" + integer(0) + integer(99) + b"u."), [memoryview(data)])
    assert data == bytearray(np.arange(4, dtype=np.int32).tobytes())
    got = SafeCodec().decode(memoryview(array + b"."), [memoryview(data)])
    assert got.flags.writeable and np.shares_memory(got, np.frombuffer(data, np.int32))


@pytest.mark.parametrize(
    "target", [text("abc"), integer(5), NONE, b"\x8f", b")"], ids=["str", "int", "none", "set", "tuple"]
)
def test_items_on_scalars_fail_cleanly(target: bytes, wrap: Callable[[bytes], bytes]) -> None:
    refused(wrap(target + integer(0) + integer(1) + b"s"))
    refused(wrap(target + integer(1) + b"a"))


# -- out-of-band buffers, memo and frames ---------------------------------------------------------


def test_out_of_band_buffers_are_checked() -> None:
    array = call(REBUILD, "ndarray", b"\x97", text("<f8"), tup(integer(2)), FALSE)
    refused(stream(array), "NEXT_BUFFER|not enough")  # no buffer at all
    refused(stream(array), "needs 16 bytes", buffers=(b"\x00" * 8,))  # shorter than its shape
    refused(stream(b"](" + array + array + b"e"), "NEXT_BUFFER|not enough", buffers=(b"\x00" * 16,))
    wrong_type = call(REBUILD, "ndarray", raw_bytes(b"\x00" * 8), b"\x97", tup(integer(1)), FALSE)
    refused(stream(wrong_type), "dtype", buffers=(b"<f8",))  # a buffer where the dtype goes
    refused(stream(call(REBUILD, "path", text("PosixPath"), b"\x97")), "path must be a str", buffers=(b"/etc",))
    refused(stream(integer(3) + b"\x98"))  # READONLY_BUFFER on an int
    refused(stream(TENSOR, b"\x97"), "NEXT_BUFFER|not enough")


def test_memo_indices_are_checked(wrap: Callable[[bytes], bytes]) -> None:
    refused(wrap(b"h\x05"), "memo|Memo")
    refused(wrap(b"j\xff\xff\xff\xff"), "memo|Memo")
    refused(b"\x80\x05\x94N.", "stack|index")
    # a memoized rebuilder fetched again is still only called
    twice = (
        name(REBUILD, "complex_number") + b"\x94" + tup(b"G" + struct.pack(">d", 1.0), b"G" + struct.pack(">d", 2.0))
    )
    assert decode(stream(twice + b"R", b"h\x00" + tup(b"G" + bytes(8), b"G" + bytes(8)) + b"R")) == [1 + 2j, 0j]


@pytest.mark.parametrize("length", [2**63 - 1, 2**40, 1000])
def test_lying_lengths_are_refused_without_allocating(length: int, wrap: Callable[[bytes], bytes]) -> None:
    tracemalloc.start()
    try:
        for op, width in ((b"\x8e", 8), (b"\x96", 8), (b"\x8d", 8), (b"B", 4), (b"X", 4), (b"\x8b", 4)):
            size = min(length, 2 ** (8 * width - 1) - 1)
            refused(wrap(op + size.to_bytes(width, "little") + b"AAAA"))
        refused(b"\x80\x05\x95" + length.to_bytes(8, "little") + b"N.")  # FRAME
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_truncated_and_trailing_payloads_are_refused(wrap: Callable[[bytes], bytes]) -> None:
    whole = wrap(ARRAY)
    for cut in range(1, len(whole) - 1, 7):
        refused(whole[:cut])
    refused(whole + b"N.", "STOP|after|malformed")
    refused(b"", "malformed")


# -- every rebuilder called with hostile arguments --------------------------------------------------

F = b"G" + struct.pack(">d", 1.0)
TD = call(REBUILD, "timedelta", integer(0), integer(3600), integer(0))
HOSTILE: dict[str, list[tuple[bytes, ...]]] = {
    "ndarray": [
        (raw_bytes(b"A" * 8), text("|O8"), tup(integer(1)), FALSE),
        (raw_bytes(b"A" * 8), text("|V8"), tup(integer(1)), FALSE),
        (raw_bytes(b"A" * 8), text("<M8[ns]"), tup(integer(1)), FALSE),
        (raw_bytes(b"A" * 8), text("float64"), tup(integer(1)), FALSE),
        (raw_bytes(b"A" * 8), raw_bytes(b"<f8"), tup(integer(1)), FALSE),
        (raw_bytes(b"A" * 8), text("<f8"), tup(integer(-1)), FALSE),
        (raw_bytes(b"A" * 8), text("<f8"), tup(integer(2)), FALSE),
        (raw_bytes(b"A" * 8), text("<f8"), tup(integer(2**40), integer(2**40), integer(0)), FALSE),
        (raw_bytes(b""), text("<f8"), tup(integer(0), integer(2**62)), FALSE),
        (raw_bytes(b"A" * 8), text("<f8"), tup(integer(2**32), integer(2**32), integer(2**32)), FALSE),
        (raw_bytes(b"A" * 8), text("<f8"), b"](K\x01e", FALSE),
        (raw_bytes(b"A" * 8), text("<f8"), tup(TRUE), FALSE),
        (raw_bytes(b"A" * 8), text("<f8"), tup(*[integer(1)] * 40), FALSE),
        (raw_bytes(b"A" * 8), text("<f8"), tup(integer(1)), integer(1)),
        (text("AAAAAAAA"), text("<f8"), tup(integer(1)), FALSE),
        (raw_bytes(b"\x02"), text("|b1"), tup(integer(1)), FALSE),
        (raw_bytes(b"A" * 8), text("<f8"), tup(integer(1))),
    ],
    "numpy_scalar": [
        (text("<f8"), raw_bytes(b"A" * 4)),
        (text("|O8"), raw_bytes(b"A" * 8)),
        (text("|b1"), raw_bytes(b"\x07")),
    ],
    "numpy_dtype": [(text("|O8"),), (text("[('a', 'O')]"),), (integer(5),), (text("<U4"),)],
    "tensor": [
        (raw_bytes(b"A" * 4), text("torch.qint8"), tup(integer(4)), FALSE, FALSE, FALSE),
        (raw_bytes(b"A" * 4), text("torch.float32"), tup(integer(2)), FALSE, FALSE, FALSE),
        (raw_bytes(b"A" * 4), text("torch.int32"), tup(integer(1)), TRUE, FALSE, FALSE),
        (raw_bytes(b"A" * 4), text("torch.float32"), tup(integer(1)), integer(1), FALSE, FALSE),
        (raw_bytes(b"\x05"), text("torch.bool"), tup(integer(1)), FALSE, FALSE, FALSE),
        (raw_bytes(b"A" * 4), text("torch.float32"), tup(integer(-4)), FALSE, FALSE, FALSE),
        (raw_bytes(b"A" * 4), text("torch.float32"), tup(integer(1)), FALSE, integer(1), TRUE),
    ],
    "torch_size": [(tup(text("a")),), (b"](K\x01e",), (tup(F),)],
    "torch_device": [(text("nonsense"), NONE), (text("cpu"), text("0")), (integer(0), NONE)],
    "complex_number": [(text("1"), F), (integer(1), integer(2))],
    "date": [
        (integer(2024), integer(13), integer(1)),
        (integer(2**31 - 1), integer(1), integer(1)),
        (text("2024"), integer(1), integer(1)),
    ],
    "time": [
        (integer(25), integer(0), integer(0), integer(0), NONE, integer(0)),
        (*[integer(0)] * 4, text("UTC"), integer(0)),
        (*[integer(0)] * 4, NONE, integer(2)),
    ],
    "datetime": [
        (integer(2024), integer(2), integer(30), *[integer(0)] * 4, NONE, integer(0)),
        (integer(2024), integer(1), integer(1), *[integer(0)] * 4, ARRAY, integer(0)),
    ],
    "timedelta": [(integer(2**31 - 1), integer(0), integer(0)), (F, integer(0), integer(0))],
    "timezone": [
        (call(REBUILD, "timedelta", integer(2), integer(0), integer(0)), NONE),
        (integer(3600), NONE),
        (TD, integer(5)),
    ],
    "path": [
        (text("PosixPath"), raw_bytes(b"/etc")),
        (text("Path"), text("x")),
        (text("WindowsPath"), text("x")),
        (text("os.PathLike"), text("x")),
    ],
    "ordered_dict": [(b"](" + tup(text("a"), integer(1)) + b"e",), (integer(1),)],
    "default_dict": [(name(REBUILD, "path"), b"}"), (name("numpy", "float32"), b"}"), (NONE, b"]")],
    "counter": [(integer(5),), (text("aab"),)],
    "deque": [(b"]", integer(-1)), (tup(integer(1)), NONE), (b"]", text("3"))],
}


@pytest.mark.parametrize(("rebuilder", "args"), [(r, a) for r, cases in HOSTILE.items() for a in cases])
def test_every_rebuilder_refuses_hostile_arguments(
    rebuilder: str, args: tuple[bytes, ...], wrap: Callable[[bytes], bytes]
) -> None:
    refused(wrap(call(REBUILD, rebuilder, *args)), f"{REBUILD}.{rebuilder}")


def test_hostile_arguments_cover_every_rebuilder() -> None:
    assert {qualname for _, qualname in CALLABLES} == set(HOSTILE)


# -- nesting and allocation -------------------------------------------------------------------------


def nested_tuples_as_key(depth: int) -> bytes:
    return b"\x80\x05}" + b")" + b"\x85" * depth + b"Ns."


def test_deep_nesting_is_refused_cleanly_in_a_child() -> None:
    depth = 300_000
    payloads = [
        nested_tuples_as_key(depth),  # pickle.loads: a C stack overflow while hashing the key
        b"\x80\x05(" + b")" + b"\x85" * depth + b"\x91.",  # the same, as a frozenset element
        b"\x80\x05" + b"]" * depth + b"a" * (depth - 1) + b".",  # lists in lists
        b"\x80\x05" + b"}" + b"N}" * depth + b"s" * depth + b".",  # dicts in dicts
        # lists nested through the memo, each appended to the one before: the stack stays short
        b"\x80\x05]\x94"
        + b"".join(b"j" + struct.pack("<I", i) + b"]\x94a0" for i in range(depth))
        + b"j\x00\x00\x00\x00.",
        b"\x80\x05](" + TENSOR + b"]" * depth + b"a" * (depth - 1) + b"e.",  # opcode by opcode
        b"\x80\x05}(" + b")" + b"\x85" * depth + TENSOR + b"u.",  # opcode by opcode, hashed
    ]
    lines = decode_in_child(payloads)
    assert all(line.startswith("refused:") and ("nested" in line) for line in lines), lines


def test_nesting_within_the_recursion_limit_is_accepted(wrap: Callable[[bytes], bytes]) -> None:
    depth = 200
    assert len(str(decode(wrap(b"]" * depth + b"a" * (depth - 1))))) > depth
    assert decode(nested_tuples_as_key(depth))


def amplifiers(n: int) -> dict[str, bytes]:
    """Payloads that make many objects from few bytes."""
    return {
        "empty lists": b"\x80\x05](" + b"]" * n + b"e.",
        "empty dicts": b"\x80\x05](" + b"}" * n + b"e.",
        "empty sets": b"\x80\x05](" + b"\x8f" * n + b"e.",
        "memoized lists": b"\x80\x05](" + b"]\x94" * n + b"e.",
        "marks": b"\x80\x05" + b"(" * n + b"N.",
        "2-char strings": b"\x80\x05](" + b"\x8c\x02\xc4\x80" * n + b"e.",
        "distinct ints as keys": b"\x80\x05}(" + b"".join(b"J" + struct.pack("<i", i) + b"N" for i in range(n)) + b"u.",
        "tuples of one": b"\x80\x05](" + b"N\x85" * n + b"e.",
        "one-item tuples, strict": b"\x80\x05](" + TENSOR + b"N\x85" * n + b"e.",
        "empty sets, strict": b"\x80\x05](" + TENSOR + b"\x8f" * n + b"e.",
    }


@pytest.mark.parametrize("kind", list(amplifiers(1)))
def test_decoding_allocates_at_most_the_configured_expansion(kind: str) -> None:
    payload = amplifiers(20_000)[kind]
    for expansion in (256, 16):
        tracemalloc.start()
        try:
            try:
                decode(payload, max_expansion=expansion)
            except UnsafePayloadError as error:
                assert "safe_max_expansion" in str(error) or "malformed" in str(error), error
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak <= expansion * len(payload) + (1 << 20), (kind, expansion, peak)
    refused(amplifiers(100_000)[kind], "safe_max_expansion=1 |malformed", max_expansion=1)


def memo(index: int) -> bytes:
    return b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)


def memo_copies(memoised: bytes, copy: Callable[[bytes], bytes], n: int, strict: bool) -> bytes:
    """A list of ``n`` values, each ``copy`` of memo entry 0, which holds ``memoised``."""
    body = memoised + b"\x940" + b"".join(copy(memo(0)) for _ in range(n))
    return b"\x80\x05](" + (TENSOR if strict else b"") + body + b"e."


# Rebuilders copying what a memo reference points to, each call to the same entry: the payloads.
COPIES = {
    "torch_size": (tup(*[integer(i) for i in range(20_000)]), lambda ref: name(REBUILD, "torch_size") + ref + b"\x85R"),
    "tensor": (
        raw_bytes(bytes(64 << 10)),
        lambda ref: call(REBUILD, "tensor", ref, text("torch.uint8"), tup(integer(64 << 10)), FALSE, FALSE, FALSE),
    ),
    "path": (text("a/" * 10_000), lambda ref: call(REBUILD, "path", text("PurePosixPath"), ref)),
    "ordered_dict": (
        b"}(" + b"".join(integer(i) + NONE for i in range(5000)) + b"u",
        lambda ref: call(REBUILD, "ordered_dict", ref),
    ),
}


@pytest.mark.parametrize("strict", [False, True], ids=["plain", "strict"])
@pytest.mark.parametrize("kind", list(COPIES))
def test_every_copy_of_a_memoised_value_is_charged(kind: str, strict: bool) -> None:
    memoised, copy = COPIES[kind]
    payload = memo_copies(memoised, copy, 400, strict)  # unbounded, 400 copies took 30 to 260 times the payload
    assert decode(memo_copies(memoised, copy, 2, strict))  # a few copies are legitimate (and the checks compiled)
    expansion = 16
    tracemalloc.start()
    try:
        refused(payload, "safe_max_expansion=16 ", max_expansion=expansion)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= expansion * len(payload) + (1 << 20), (kind, peak, len(payload))


def doubling_tuples(levels: int) -> bytes:
    """t0 = (), t(i+1) = (t(i), t(i)) through the memo, leaving t(levels) on the stack: 2**levels
    tuples for hashing to visit, in about 6 bytes a level."""
    return b")\x940" + b"".join(memo(i) + memo(i) + b"\x86\x940" for i in range(levels)) + memo(levels)


@pytest.mark.parametrize("strict", [False, True], ids=["plain", "strict"])
def test_hashing_tuples_shared_through_the_memo_is_bounded(strict: bool) -> None:
    prefix = b"\x80\x05](" + TENSOR + b"e0" if strict else b"\x80\x05"  # the tensor, popped, forces the strict path
    shared = doubling_tuples(64)
    payloads = [
        prefix + b"}" + shared + b"K\x01s.",  # a dict key
        prefix + b"}(" + shared + b"K\x01u.",  # SETITEMS
        prefix + b"\x8f(" + shared + b"\x90.",  # a set element
        prefix + b"(" + shared + b"\x91.",  # a frozenset element
        prefix + b"\x8a\x09" + bytes(8) + b"\x01\x940}((" + memo(0) * 250 + b"tK\x01u.",  # a long int, shared
        prefix + call(REBUILD, "ordered_dict", b"}" + doubling_tuples(12) + b"K\x01s") + b".",
    ]
    assert all(len(payload) < 600 for payload in payloads[:4])
    lines = decode_in_child(payloads, timeout=120)  # unbounded, these decodes never ended, the GIL held
    assert all(line.startswith("refused:") and "hold more tuple items" in line for line in lines[:4]), lines
    assert lines[4].startswith("accepted") and lines[5].startswith("accepted"), lines  # within the allowance
    tracemalloc.start()
    try:
        refused(prefix + b"}" + shared + b"K\x01s.", "counted each time they are reached")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_tuples_shared_within_the_allowance_are_hashed() -> None:
    value = {(i, ("shared", "key")): i for i in range(1000)}
    assert decode(bytes(SafeCodec().encode(value)[0])) == value
    assert decode(stream(b"}" + doubling_tuples(8) + b"K\x01s")) == {
        functools.reduce(lambda t, _: (t, t), range(8), ()): 1
    }


def test_the_limit_refuses_legitimate_looking_payloads_only_beyond_it() -> None:
    value = [[] for _ in range(50_000)]
    frame = SafeCodec().encode(value)
    assert decode(bytes(frame[0])) == value
    refused(bytes(frame[0]), "raise CommConfig\\(safe_max_expansion=...\\)", max_expansion=8)


# -- through real ranks -----------------------------------------------------------------------------


class CraftedCodec(Codec):
    """A hostile sender: its "encoding" is the attack, whatever it is asked to send."""

    name = "crafted"

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def encode(self, obj: Any) -> list[memoryview]:
        return [memoryview(self.payload)]

    def decode(self, stream: memoryview, buffers: Any) -> Any:
        return SafeCodec().decode(stream, buffers)


def hostile_rank_zero(comm: Communicator, payload: bytes) -> tuple[str, float]:
    if comm.rank == 0:
        comm._codec = CraftedCodec(payload)
    try:
        gathered = comm.all_gather_object(f"rank {comm.rank}")
        outcome = f"accepted {gathered!r}"  # printing a forged array is what crashed before
    except UnsafePayloadError as error:
        outcome = f"refused: {error}"
    total = comm.all_reduce(torch.ones(1)).item()  # the group is still usable
    return outcome, total


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        (pickle.dumps(ForgedArray(), protocol=5), "numpy._core.numeric._frombuffer"),
        (DOTTED, "'torch.os.system' in module 'mypkg.types'"),
        (BYTEARRAY_BOMB, "builtins.bytearray"),
    ],
    ids=["forged-dtype", "dotted-name", "bytearray"],
)
def test_a_rank_refuses_a_crafted_payload_and_the_group_survives(payload: bytes, named: str) -> None:
    cfg = {"backend": "gloo", "serializer": "safe", "trusted": ["mypkg."]}
    (own, total0), (outcome, total1) = run_ranks(hostile_rank_zero, 2, payload, cfg=cfg, timeout=120)
    assert own.startswith("accepted") and outcome.startswith("refused: ") and named in outcome
    assert "trusted" in outcome or "never through attributes" in outcome or "never called" in outcome
    assert total0 == total1 == 2.0
