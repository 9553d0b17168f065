"""The pickled-object protocol: how every object collective moves Python values.

Every object collective starts with one fixed-size header per rank (:data:`HEADER_BYTES`). A
header carries the encoded object inline when it fits, so a small object needs that one
collective; or the length of its frame and the sender's chunk size, whose exact bytes then go
point to point in chunks (nothing is padded, see :mod:`communicator.objects.frames`); or a failure
report, so that a rank which cannot serialise releases every peer at once instead of leaving them
waiting. The receiver raises the sender's failure as a :class:`~communicator.errors.RemoteError`.

Large frames move point to point: for ``all_gather_object``, to every rank at once when each
is at most 1 MiB, else around a ring (each frame crosses each link once, each chunk forwarded
from the receive buffer as it arrives); into ``gather_object``'s destination from every sender
at once; from ``broadcast_object``'s source to every rank. Within a stream every receive and every chunk sent
in place is posted at once; staged chunks take turns in two buffers (see
:mod:`communicator.objects.frames`).

The bytes travel on a :class:`~communicator.objects.channel.Channel`.
"""

from __future__ import annotations

import dataclasses
import gc
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from communicator.config import DEFAULT_OBJECT_BUFFER_BYTES
from communicator.errors import CollectiveMismatchError, RemoteError, RemoteFailure
from communicator.objects.channel import Channel, gather_answer
from communicator.objects.codec import Codec
from communicator.objects.frames import (
    Chunks,
    Outgoing,
    Pending,
    chunk_size,
    chunks_of,
    post_stream,
    stream,
    unpack_frame,
)
from communicator.objects.safe.rebuild import receive_device
from communicator.observe.events import Event

__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "EMPTY",
    "HEADER_BYTES",
    "Port",
    "Collectives",
    "all_gather_bytes",
    "check_headers",
    "check_scatter_list",
    "empty_header",
    "failure_header",
]

T = TypeVar("T")

HEADER_BYTES = 2048
#: The staging memory an object collective uses on top of the objects (``CommConfig.object_buffer_bytes``).
DEFAULT_BUFFER_BYTES = DEFAULT_OBJECT_BUFFER_BYTES
_HEAD = struct.Struct("<BxxxxxxxQQ")  # kind, length, the sender's chunk size
INLINE_BYTES = HEADER_BYTES - _HEAD.size
#: all_gather_object sends frames up to this size to every rank at once, larger ones around a ring;
AT_ONCE_BYTES = 1024 * 1024
#: and beyond this many ranks, every frame around the ring: N ranks sending to every other at once run
#: N * (N - 1) streams, which overwhelm a host's cores (docs/objects.md has the measurement).
AT_ONCE_RANKS = 8
#: broadcast_object sends frames up to this size in a second broadcast, larger ones point to point.
SMALL_FRAME_BYTES = 1024 * 1024
EMPTY, INLINE, LARGE, FAILED = 0, 1, 2, 3


# -- headers ------------------------------------------------------------------------------------


class Header:
    """A parsed header: what one rank announced."""

    __slots__ = ("chunk", "kind", "length", "raw")

    def __init__(self, raw: np.ndarray) -> None:
        self.kind, self.length, self.chunk = _HEAD.unpack_from(raw.data, 0)
        self.raw = raw

    @property
    def inline(self) -> memoryview:
        return self.raw.data[_HEAD.size : _HEAD.size + self.length]

    @property
    def is_large(self) -> bool:
        return bool(self.kind == LARGE)

    def incoming(self, frame: np.ndarray) -> Chunks:
        """The chunks the sender of this header sends ``frame`` in."""
        return chunks_of(frame, self.chunk)

    def failure(self) -> RemoteFailure | None:
        """The failure this header reports (naming the rank it came from), if it reports one."""
        return RemoteFailure.from_json(bytes(self.inline)) if self.kind == FAILED else None


def empty_header() -> np.ndarray:
    return np.zeros(HEADER_BYTES, dtype=np.uint8)


def _header(kind: int, payload: np.ndarray | bytes) -> np.ndarray:
    out = np.zeros(HEADER_BYTES, dtype=np.uint8)
    data = np.frombuffer(payload, dtype=np.uint8) if isinstance(payload, bytes) else payload
    _HEAD.pack_into(out.data, 0, kind, data.size, 0)
    out[_HEAD.size : _HEAD.size + data.size] = data
    return out


def frame_header(length: int, chunk: int, inline: Callable[[], np.ndarray]) -> np.ndarray:
    """A header announcing a frame of ``length`` bytes: inline (``inline()`` builds it) when it fits."""
    if length <= INLINE_BYTES:
        return _header(INLINE, inline())
    out = np.zeros(HEADER_BYTES, dtype=np.uint8)
    _HEAD.pack_into(out.data, 0, LARGE, length, chunk)
    return out


def failure_header(failure: RemoteFailure) -> np.ndarray:
    """A header reporting ``failure`` (its traceback cut to fit)."""
    return _header(FAILED, failure.to_json(INLINE_BYTES))


def check_headers(rows: Sequence[np.ndarray], own_error: BaseException | None, where: str) -> list[Header]:
    """Parse headers; raise this rank's own error, or a ``RemoteError`` naming every failed rank."""
    headers = [Header(row) for row in rows]
    if own_error is not None:
        raise own_error
    failures = [f for rec in headers if (f := rec.failure()) is not None]
    if failures:
        raise RemoteError(failures, context=where)
    return headers


# -- encoding and the collectives -----------------------------------------------------------------


class Collectives(Protocol):
    """The object collectives a communicator runs after checking their arguments: :class:`Port`'s
    protocol, or the identity of a world of one (``NonDistComm``, which serialises nothing).
    Point-to-point objects are always :class:`Port`'s: a world of one has no peer."""

    def all_gather_object(self, obj: T) -> list[T]: ...

    def gather_object(self, obj: T, dst: int) -> list[T] | None: ...

    def broadcast_object(self, obj: T, src: int) -> T: ...

    def scatter_object(self, objects: Sequence[T] | None, src: int) -> T: ...


@dataclasses.dataclass
class Port:
    """What the protocol needs from a communicator (its channel, codec and receiving device), and
    the object operations over it."""

    channel: Channel
    codec: Codec
    device: torch.device | None  # where CUDA tensors inside received objects go (None: the CPU)
    buffer_bytes: int = DEFAULT_BUFFER_BYTES  # staging memory for sending (two chunks)

    event: Event | None = None  # the running operation's: serialisation time and bytes go there

    def encode(self, obj: Any, where: str) -> tuple[Outgoing, np.ndarray, BaseException | None]:
        """(frame, header, error): a failing encoder becomes a failure header, not a hang."""
        started = time.perf_counter()
        try:
            frame = Outgoing(self.codec.encode(obj), chunk_size(self.buffer_bytes))
            header = frame_header(frame.nbytes, frame.chunk, frame.build)
        except Exception as error:  # noqa: BLE001 - every encoding failure must reach the peers
            return _NOTHING, failure_header(RemoteFailure.of(self.channel.rank, error, where)), error
        if self.event is not None:
            self.event.serialize += time.perf_counter() - started
            self.event.sent += frame.nbytes
        return frame, header, None

    def decode(self, data: memoryview, sender: int) -> Any:
        if not data.nbytes:  # an encoded object is never empty: the sender is in another collective
            raise CollectiveMismatchError(
                {sender: "sent no object (it is in another collective, such as the end of a fail_together block)"},
                "an object collective met a rank that is not in it",
            )
        started = time.perf_counter()
        token = receive_device.set(self.device)
        collecting = gc.isenabled()
        gc.disable()  # see decode_all
        try:
            stream, buffers = unpack_frame(data)
            return self.codec.decode(stream, buffers)
        except Exception as error:
            error.add_note(f"while decoding the object sent by rank {sender}")
            raise
        finally:
            if collecting:
                gc.enable()
            receive_device.reset(token)
            if self.event is not None:
                self.event.deserialize += time.perf_counter() - started
                self.event.received += data.nbytes

    def receive(self, header: Header, sender: int) -> Any:
        """The object ``header`` announced: inline, or fetched from ``sender`` point to point."""
        if not header.is_large:
            return self.decode(header.inline, sender)
        data = np.empty(header.length, dtype=np.uint8)
        stream(self.channel, [], [(sender, header.incoming(data))])
        return self.decode(data.data, sender)

    def decode_all(self, headers: Sequence[Header], frames: Mapping[int, np.ndarray], own: T) -> list[T]:
        """Every rank's object; this rank's own is the object itself (as in one process), not a copy.

        The garbage collector pauses while an object is decoded: unpickling many small containers
        would otherwise trigger collections that walk every live object of the process, for
        nothing new to free.
        """
        me = self.channel.rank
        return [
            own if r == me else self.decode(frames[r].data if rec.is_large else rec.inline, r)
            for r, rec in enumerate(headers)
        ]

    def all_gather_object(self, obj: T) -> list[T]:
        where, channel = "all_gather_object", self.channel
        frame, header, error = self.encode(obj, where)
        headers = check_headers(channel.all_gather(header), error, where)
        frames = _large_frames(headers, channel.rank)
        _ring(channel, headers, frame.chunks, frames)
        return self.decode_all(headers, frames, own=obj)

    def gather_object(self, obj: T, dst: int) -> list[T] | None:
        where, channel = "gather_object", self.channel
        frame, header, error = self.encode(obj, where)
        mine = Header(header)
        # A frame of one chunk goes before the verdict, overlapping it; it is received (and waited
        # for on both sides) whatever the verdict, so no transfer is ever left behind.
        single = channel.rank != dst and mine.is_large and mine.length <= mine.chunk
        sent = channel.post([(dst, next(frame.chunks()))], []) if single else None
        arrivals = _Arrivals(channel, dst)
        received = Header(gather_answer(channel, header, dst, arrivals.verdict, HEADER_BYTES)[1]).failure()
        for done in (sent, arrivals.early):
            if done is not None:
                done()
        if error is not None:
            raise error
        if received is not None:
            raise RemoteError([received], context=where)
        if channel.rank != dst:
            if mine.is_large and not single:
                stream(channel, [((dst,), frame.chunks())], [])
            return None
        headers, frames = arrivals.headers, arrivals.frames
        rest = [(r, headers[r].incoming(data)) for r, data in frames.items() if data.size > headers[r].chunk]
        stream(channel, [], rest)
        return self.decode_all(headers, frames, own=obj)

    def broadcast_object(self, obj: T, src: int) -> T:
        where, channel = "broadcast_object", self.channel
        frame, header, error = self.encode(obj, where) if channel.rank == src else (_NOTHING, empty_header(), None)
        received = check_headers([channel.broadcast(header, src)], error, where)[0]
        small = received.is_large and received.length <= SMALL_FRAME_BYTES
        if channel.rank == src:
            if small:
                channel.broadcast(frame.build(), src)
            elif received.is_large:
                others = tuple(r for r in range(channel.world_size) if r != src)
                stream(channel, [(others, frame.chunks())], [])
            return obj
        if small:
            return self.decode(channel.broadcast(np.empty(received.length, dtype=np.uint8), src).data, src)  # type: ignore[no-any-return]
        return self.receive(received, src)  # type: ignore[no-any-return]

    def scatter_object(self, objects: Sequence[T] | None, src: int) -> T:
        where, channel = "scatter_object", self.channel
        frames: list[Outgoing] = []
        rows: list[np.ndarray] | None = None
        error: BaseException | None = None
        if channel.rank == src:
            frames, rows, error = _encode_each(self, objects, where)
        received = check_headers([channel.scatter(rows, src, HEADER_BYTES)], error, where)[0]
        if channel.rank == src:
            assert rows is not None and objects is not None
            for peer in range(channel.world_size):
                if peer != src and Header(rows[peer]).is_large:
                    stream(channel, [((peer,), frames[peer].chunks())], [])
            return objects[src]
        return self.receive(received, src)  # type: ignore[no-any-return]

    def send_object(self, obj: Any, dst: int) -> None:
        frame, header, error = self.encode(obj, "send_object")
        self.channel.exchange({dst: header}, {})
        if error is not None:
            raise error
        if Header(header).is_large:
            stream(self.channel, [((dst,), frame.chunks())], [])

    def recv_object(self, src: int) -> Any:
        raw = np.empty(HEADER_BYTES, dtype=np.uint8)
        self.channel.exchange({}, {src: raw})
        return self.receive(check_headers([raw], None, "send_object")[0], src)


_NOTHING = Outgoing([memoryview(b"")], 64)


class _Arrivals:
    """What gather_object's ``dst`` makes of the headers: their frames, the receives of one-chunk
    frames posted at once (they overlap the verdict), and the verdict, which passes the first
    failure on so that every rank raises (only ``dst`` saw every header)."""

    def __init__(self, channel: Channel, dst: int) -> None:
        self.channel, self.dst = channel, dst
        self.headers: list[Header] = []
        self.frames: dict[int, np.ndarray] = {}
        self.early: Pending | None = None

    def verdict(self, rows: list[np.ndarray]) -> np.ndarray:
        headers = self.headers = [Header(row) for row in rows]
        frames = self.frames = _large_frames(headers, self.dst)
        early = [(r, data) for r, data in frames.items() if data.size <= headers[r].chunk]
        self.early = self.channel.post([], early) if early else None
        failures = [f for rec in headers if (f := rec.failure()) is not None]
        return failure_header(failures[0]) if failures else empty_header()


def _large_frames(headers: Sequence[Header], skip: int) -> dict[int, np.ndarray]:
    return {r: np.empty(rec.length, dtype=np.uint8) for r, rec in enumerate(headers) if rec.is_large and r != skip}


def _ring(
    channel: Channel,
    headers: Sequence[Header],
    own: Callable[[], Chunks],
    frames: Mapping[int, np.ndarray],
) -> None:
    """Every large frame to every rank around a ring: each rank sends its own frame to the next
    rank and passes on, chunk by chunk as each arrives, every frame but the next rank's own. Every
    receive is posted at once, so a frame flows through the ranks without waiting for the others:
    a large frame among small ones takes about one frame's time, not one per step. Each frame
    crosses each link once. Frames of at most ``AT_ONCE_BYTES`` go to every rank at once instead,
    up to ``AT_ONCE_RANKS`` ranks: one step, not ``world - 1``."""
    rank, world = channel.rank, channel.world_size
    if world == 1:  # no other rank: the next one would be this one
        return
    at_once = world <= AT_ONCE_RANKS and all(rec.length <= AT_ONCE_BYTES for rec in headers if rec.is_large)
    if at_once:  # latency over bandwidth
        sends = [(tuple(r for r in range(world) if r != rank), own())] if headers[rank].is_large else []
        stream(channel, sends, [(r, headers[r].incoming(data)) for r, data in frames.items()])
        return
    after, before = (rank + 1) % world, (rank - 1) % world
    # Frames arrive from `before` in the order it sends them: its own, then what it passes on.
    arriving = [(r, headers[r]) for r in ((rank - 1 - step) % world for step in range(world - 1))]
    chunks = [
        (r, chunk, channel.post([], [(before, chunk)]))
        for r, rec in arriving
        if rec.is_large
        for chunk in rec.incoming(frames[r])
    ]
    sent = post_stream(channel, (after,), own()) if headers[rank].is_large else []
    for r, chunk, received in chunks:
        received()
        if r != after:  # the next rank's own frame has been around the ring
            sent.append(channel.post([(after, chunk)], []))
    for done in sent:
        done()


def check_scatter_list(objects: Sequence[T] | None, world_size: int) -> Sequence[T]:
    """``objects`` as ``scatter_object``'s ``src`` must pass it: one object per rank."""
    if objects is None or isinstance(objects, (str, bytes)) or len(objects) != world_size:
        got = "None" if objects is None else f"{type(objects).__name__} of length {len(objects)}"
        raise ValueError(f"scatter_object: src must pass a sequence of {world_size} objects, got {got}")
    return objects


def _encode_each(
    port: Port, objects: Sequence[Any] | None, where: str
) -> tuple[list[Outgoing], list[np.ndarray], BaseException | None]:
    """Frames and headers for a scatter; on any failure, the failure header for every rank."""
    world = port.channel.world_size
    try:
        items = check_scatter_list(objects, world)
    except ValueError as error:
        return [], [failure_header(RemoteFailure.of(port.channel.rank, error, where))] * world, error
    frames, rows = [], []
    for item in items:
        frame, header, item_error = port.encode(item, where)
        if item_error is not None:
            return [], [header] * world, item_error
        frames.append(frame)
        rows.append(header)
    return frames, rows, None


def all_gather_bytes(channel: Channel, data: bytes) -> list[bytes]:
    """Every rank's ``data``, whatever its length: inline in the headers when it fits."""
    frame = np.frombuffer(bytearray(data), dtype=np.uint8)
    chunk = chunk_size(DEFAULT_BUFFER_BYTES)
    headers = [Header(row) for row in channel.all_gather(frame_header(frame.size, chunk, lambda: frame))]
    frames = _large_frames(headers, channel.rank)
    _ring(channel, headers, lambda: chunks_of(frame, chunk), frames)
    return [
        data if r == channel.rank else bytes(frames[r] if rec.is_large else rec.inline) for r, rec in enumerate(headers)
    ]
