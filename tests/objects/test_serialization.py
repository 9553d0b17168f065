"""Codecs: exact round trips, out-of-band buffers without copies, the safe allow-list."""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import json
import os
import pathlib
import uuid

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from communicator.check.equality import same_value as same
from communicator.objects import make_codec
from communicator.objects.codec import PickleCodec, UserCodec
from communicator.objects.frames import pack_frame, unpack_frame
from communicator.objects.safe.serializer import SafeCodec, UnsafePayloadError
from communicator.reductions import WIRE_DTYPES

TORCH_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]
NUMPY_DTYPES = ["float32", "float64", "float16", "int64", "int32", "uint16", "bool", "complex128"]
PLAIN_NUMPY = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
PLAIN_NUMPY += ["float16", "float32", "float64", "complex64", "complex128"]


def round_trip(codec: object, obj: object) -> object:
    frame = pack_frame(codec.encode(obj))  # type: ignore[attr-defined]
    return codec.decode(*unpack_frame(frame.data))  # type: ignore[attr-defined]


arrays = st.builds(
    lambda dtype, shape, seed: np.random.default_rng(seed).integers(0, 100, size=shape).astype(dtype),
    st.sampled_from(NUMPY_DTYPES),
    st.lists(st.integers(0, 40), max_size=3).map(tuple),
    st.integers(0, 9),
)
tensors = st.builds(
    lambda dtype, shape, seed: (torch.randint(0, 100, shape, generator=torch.Generator().manual_seed(seed))).to(dtype),
    st.sampled_from(TORCH_DTYPES),
    st.lists(st.integers(0, 40), max_size=3).map(tuple),
    st.integers(0, 9),
)
leaves = st.one_of(
    st.none(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20), arrays, tensors
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(values)
def test_pickle_and_safe_round_trip_anything_built_from_containers_arrays_and_tensors(value: object) -> None:
    for codec in (PickleCodec(), SafeCodec()):
        assert same(round_trip(codec, value), value)


def test_large_buffers_travel_out_of_band_without_copies() -> None:
    array = np.arange(1_000_000, dtype=np.float64)
    tensor = torch.arange(500_000, dtype=torch.bfloat16)
    pieces = PickleCodec().encode({"a": array, "t": tensor, "small": np.arange(3)})
    assert len(pieces) == 3  # the stream, then the two large buffers
    assert pieces[1].nbytes == array.nbytes and pieces[0].nbytes < 2000
    frame = pack_frame(pieces)
    out = PickleCodec().decode(*unpack_frame(frame.data))
    # the received arrays are views of the frame: nothing was copied after the transfer
    assert np.shares_memory(out["a"], frame) and out["t"].dtype == torch.bfloat16


def test_non_contiguous_requires_grad_and_parameters() -> None:
    base = torch.arange(12.0).reshape(3, 4)
    value = {"view": base.t(), "grad": torch.ones(2, requires_grad=True), "param": torch.nn.Parameter(torch.ones(3))}
    out = round_trip(PickleCodec(), value)
    assert torch.equal(out["view"], base.t()) and out["grad"].requires_grad  # type: ignore[index]
    assert isinstance(out["param"], torch.nn.Parameter)  # type: ignore[index]


def test_safe_accepts_the_documented_types() -> None:
    value = {
        "od": collections.OrderedDict(a=1),
        "dd": collections.defaultdict(list, a=[1]),
        "dd_none": collections.defaultdict(None, b=2),
        "dq": collections.deque([1], maxlen=3),
        "ctr": collections.Counter("aab"),
        "date": datetime.date(2024, 1, 2),
        "td": datetime.timedelta(days=-1, seconds=3, microseconds=4),
        "dt": datetime.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC),
        "naive": datetime.datetime(2024, 1, 2, fold=1),
        "time": datetime.time(1, 2, 3, tzinfo=datetime.timezone(datetime.timedelta(hours=-5), "EST")),
        "set": {1, 2},
        "fs": frozenset({3, (4, 5)}),
        "cx": 1 + 2j,
        "scalars": [np.dtype(name).type(1) for name in PLAIN_NUMPY],
        "dtypes": [np.dtype(name) for name in PLAIN_NUMPY] + [np.dtype(">f8"), np.dtype("<i2")],
        "types": [int, float, str, list, dict, np.float32, np.int64],
        "tdtypes": list(WIRE_DTYPES),
        "device": torch.device("cpu"),
        "cuda": torch.device("cuda", 1),
        "size": torch.Size([2, 3]),
        "paths": [pathlib.PurePosixPath("/a/b"), pathlib.Path("rel/x.txt"), pathlib.PureWindowsPath("C:\\x")],
        "scalar_types": (True, None, b"raw", bytearray(b"ba"), "text", 2**70, -1.5),
    }
    out = round_trip(SafeCodec(), value)
    assert same(out, value)
    assert out["dd"].default_factory is list and out["dq"].maxlen == 3  # type: ignore[index]
    assert out["time"].tzname() == "EST" and out["paths"][1].parts == ("rel", "x.txt")  # type: ignore[index]
    assert [type(s) for s in out["scalars"]] == [type(s) for s in value["scalars"]]  # type: ignore[index]


@pytest.mark.parametrize("codec", [PickleCodec(), SafeCodec()], ids=["pickle", "safe"])
def test_every_plain_array_layout_round_trips(codec: object) -> None:
    arrays = [np.arange(24).astype(name).reshape(2, 3, 4) for name in PLAIN_NUMPY]
    arrays += [
        np.array(3.5),  # 0-d
        np.zeros((0, 5), dtype=np.float16),
        np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        np.arange(40)[::3],  # not contiguous
        np.arange(6, dtype=">i4"),  # big-endian
        np.arange(10_000, dtype=np.float64),  # out of band
        np.array([True, False, True]),
    ]
    out = round_trip(codec, arrays)
    assert all(same(a, b) and a.shape == b.shape for a, b in zip(out, arrays, strict=True))  # type: ignore[call-overload]
    assert out[-5].flags.f_contiguous  # type: ignore[index]


@pytest.mark.parametrize("codec", [PickleCodec(), SafeCodec()], ids=["pickle", "safe"])
def test_every_wire_dtype_grad_and_parameters_round_trip(codec: object) -> None:
    tensors = [torch.ones(2, 3, dtype=dtype) for dtype in WIRE_DTYPES]
    floating = [
        torch.ones(2, requires_grad=True),
        torch.nn.Parameter(torch.ones(3)),
        torch.nn.Parameter(torch.ones(3), requires_grad=False),
        torch.arange(12.0).reshape(3, 4).t(),
        torch.zeros(0, 4, dtype=torch.bfloat16),
        torch.tensor(2.5),
    ]
    out = round_trip(codec, tensors + floating)
    assert all(same(a, b) for a, b in zip(out, tensors, strict=False))  # type: ignore[call-overload]
    for got, want in zip(out[len(tensors) :], floating, strict=True):  # type: ignore[index]
        assert type(got) is type(want) and got.requires_grad == want.requires_grad
        assert got.shape == want.shape and torch.equal(got.detach(), want.detach())


class TensorSubclass(torch.Tensor):
    pass


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (np.array([1, "a"], dtype=object), "dtype object"),
        (np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]), "only plain dtypes"),
        (np.array(["2024-01-01"], dtype="datetime64[D]"), "datetime64"),
        (np.ma.masked_array([1, 2]), "MaskedArray (an ndarray subclass)"),
        (np.str_("text"), "NumPy scalar of dtype <U4"),
        (np.dtype([("a", "O")]), "only plain dtypes"),
        (torch.ones(2).to_sparse(), "layout torch.sparse_coo"),
        (torch.ones(2, device="meta"), "on meta"),
        (torch.ones(2).as_subclass(TensorSubclass), "TensorSubclass (a tensor subclass)"),
        (collections.defaultdict(collections.OrderedDict), "factory"),
        (range(3), "builtins.range"),
        (slice(1, 2), "builtins.slice"),
        (decimal.Decimal("1.5"), "decimal.Decimal"),
        (fractions.Fraction(1, 3), "fractions.Fraction"),
        (uuid.UUID(int=5), "uuid.UUID"),
        (os.system, "system"),
    ],
)
def test_safe_refuses_what_it_cannot_rebuild_from_plain_data(value: object, named: str) -> None:
    with pytest.raises(UnsafePayloadError, match=named.replace("(", r"\(").replace(")", r"\)")):
        SafeCodec().encode({"x": value})


class Box:
    def __init__(self, v: int) -> None:
        self.v = v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Box) and other.v == self.v


def test_safe_refuses_untrusted_classes_unless_trusted() -> None:
    with pytest.raises(UnsafePayloadError, match=r"test_serialization\.Box"):
        SafeCodec().encode(Box(1))
    assert round_trip(SafeCodec(trusted=[f"{__name__}.Box"]), Box(2)) == Box(2)
    assert round_trip(SafeCodec(trusted=[f"{__name__}."]), [Box(3)]) == [Box(3)]


class Exploit:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo unsafe",))


def test_safe_receiver_refuses_a_crafted_stream_without_running_it() -> None:
    frame = pack_frame(PickleCodec().encode(Exploit()))  # a sender that skipped the checks
    with pytest.raises(UnsafePayloadError, match="system"):
        SafeCodec().decode(*unpack_frame(frame.data))
    for hostile in (eval, exec, getattr, __import__):
        with pytest.raises(UnsafePayloadError):
            SafeCodec().encode(hostile)


def test_user_codec() -> None:
    class Json:
        def dumps(self, obj: object) -> bytes:
            return json.dumps(obj).encode()

        def loads(self, data: bytes | memoryview) -> object:
            return json.loads(bytes(data))

    codec = make_codec(Json())
    assert isinstance(codec, UserCodec) and round_trip(codec, {"a": [1, 2]}) == {"a": [1, 2]}
    with pytest.raises(ValueError, match="unknown serializer"):
        make_codec("yaml")


def test_cuda_tensors_arrive_on_the_receivers_device_or_cpu() -> None:
    from communicator.objects.safe.rebuild import receive_device

    frame = pack_frame(PickleCodec().encode(torch.ones(2)))
    token = receive_device.set(None)
    try:
        assert PickleCodec().decode(*unpack_frame(frame.data)).device.type == "cpu"
    finally:
        receive_device.reset(token)


@pytest.mark.parametrize("chunk", [64, 192, 4096, 65536, 1 << 22])
def test_outgoing_chunks_are_the_frame_in_order(chunk: int) -> None:
    from communicator.objects.frames import Outgoing

    readonly = np.frombuffer(bytes(range(256)) * 100, dtype=np.uint8)  # a piece that cannot be sent in place
    obj = {"a": np.arange(100_000, dtype=np.float32), "t": torch.arange(50_000.0), "r": readonly, "s": "x" * 30_000}
    pieces = PickleCodec().encode(obj)
    frame = Outgoing(pieces, chunk)
    chunks = frame.chunks()
    sent = []
    for piece in chunks:  # copied at once: a staged buffer is reused two staged chunks later
        sent.append(piece.copy())
        assert piece.size <= chunk
    whole = np.concatenate(sent)
    assert whole.size == frame.nbytes
    assert np.array_equal(whole, frame.build())
    stream, buffers = unpack_frame(whole.data)
    assert same(PickleCodec().decode(stream, buffers), obj)


def test_outgoing_sends_chunks_inside_an_array_from_its_memory() -> None:
    from communicator.objects.frames import Outgoing

    array = np.arange(1 << 20, dtype=np.float32)  # 4 MiB
    frame = Outgoing(PickleCodec().encode(array), 1 << 16)
    in_place = [piece for piece in frame.chunks() if np.shares_memory(piece, array)]
    assert len(in_place) >= (4 << 20) // (1 << 16) - 2  # all but the chunks at its two ends


@pytest.mark.parametrize("value", [torch.arange(1 << 20, dtype=torch.float32), np.ones((512, 2048))], ids=type)
def test_an_object_that_is_one_tensor_is_sent_from_its_memory(value: object) -> None:
    """The buffers lead the frame: every chunk but the last (the pickle stream and the table) lies in
    the tensor or array, so nothing of it is copied to be sent."""
    from communicator.objects.frames import Outgoing

    frame = Outgoing(PickleCodec().encode(value), 1 << 16)
    chunks = list(frame.chunks())  # one staged chunk: its buffer is not reused
    memory = np.asarray(value)
    assert len(chunks) == frame.nbytes // (1 << 16) + 1
    assert all(np.shares_memory(piece, memory) for piece in chunks[:-1])
    assert not np.shares_memory(chunks[-1], memory) and chunks[-1].size < 1024
    assert same(PickleCodec().decode(*unpack_frame(np.concatenate(chunks).data)), value)


def test_a_frame_whose_table_does_not_describe_it_is_refused() -> None:
    frame = pack_frame(PickleCodec().encode({"a": np.arange(10_000.0), "b": "x"}))
    for hostile in (frame[:-1], frame[:5], np.concatenate([frame, np.zeros(64, np.uint8)]), frame[64:]):
        with pytest.raises(ValueError, match="frame of"):
            unpack_frame(hostile.data)
    lying = frame.copy()
    lying[-12:-8] = np.frombuffer((1 << 30).to_bytes(4, "little"), np.uint8)  # a billion buffers
    with pytest.raises(ValueError, match="too short for its table"):
        unpack_frame(lying.data)
