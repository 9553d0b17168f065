"""Frames on the wire: streamed in chunks from the codec's pieces, received into exact-size buffers.

A frame is one contiguous byte string: each out-of-band buffer (NumPy arrays, CPU tensors)
aligned to 64 bytes, then the pickle stream, then a small table (the buffers' lengths, then their
count and the stream's length in the frame's last bytes). Receivers unpickle straight from the
received bytes, so arrays and tensors are views of the receive buffer, not copies. The buffers
come first so that a large tensor or array starts a chunk: an object that is one tensor is sent
whole from the tensor's own memory, nothing staged but the few bytes after it.

A sender never builds its whole frame. :class:`Outgoing` lays the frame out (aligned out-of-band
buffers, pickle stream, table) and hands it out chunk by chunk: a chunk that lies inside one buffer
is sent straight from the object's own memory (a large tensor or array is never copied); a chunk
that spans several pieces is copied into one of two staging buffers of ``chunk`` bytes. So a rank
needs at most ``2 * chunk`` bytes on top of its own objects to send, whatever their size.

A receiver knows the frame's length and the sender's chunk size from the sender's record; it
allocates the frame once, at its exact size, and receives every chunk into its place. Decoding
then makes views of that buffer: nothing is copied again.

:func:`stream` drives the transfers of one step: every receive and every chunk sent in place is
posted at once; a staged chunk waits until the chunk that used its buffer before has been sent.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable, Generator, Sequence
from typing import Protocol

import numpy as np

__all__ = [
    "ALIGN",
    "Chunks",
    "Moves",
    "Outgoing",
    "Pending",
    "Poster",
    "chunk_size",
    "chunks_of",
    "frame_layout",
    "frame_table",
    "pack_frame",
    "post_stream",
    "stream",
    "unpack_frame",
]

ALIGN = 64
_TAIL = struct.Struct("<IQ")  # buffer count, pickle stream length: a frame's last bytes
_LENGTH = struct.Struct("<Q")

Pending = Callable[[], None]
Moves = Sequence[tuple[int, np.ndarray]]
#: Chunks in sending order; :func:`stream` sends each one's transfers back into it once posted.
Chunks = Generator[np.ndarray, Pending | None, None]


class Poster(Protocol):
    """What streaming needs of a channel: start sends and receives now, finish them later."""

    def post(self, sends: Moves, recvs: Moves) -> Pending:
        """Start sending ``array`` to ``peer`` for each ``(peer, array)`` of ``sends`` and receiving
        into those of ``recvs`` (messages between two ranks arrive in the order they were posted);
        the returned function waits for all of them."""
        ...


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def frame_layout(pieces: Sequence[memoryview]) -> tuple[int, list[int]]:
    """Total frame length and the offset of each piece in it (``pieces[0]`` is the stream)."""
    offsets = [0] * len(pieces)
    position = 0
    for i in range(1, len(pieces)):
        offsets[i] = _aligned(position)
        position = offsets[i] + pieces[i].nbytes
    offsets[0] = position
    return position + pieces[0].nbytes + _LENGTH.size * (len(pieces) - 1) + _TAIL.size, offsets


def frame_table(pieces: Sequence[memoryview]) -> bytes:
    """The table a frame ends with: each buffer's length, then the buffer count and the stream's length."""
    lengths = b"".join(_LENGTH.pack(piece.nbytes) for piece in pieces[1:])
    return lengths + _TAIL.pack(len(pieces) - 1, pieces[0].nbytes)


def _bytes_of(piece: memoryview) -> np.ndarray:
    return np.frombuffer(piece.cast("B") if piece.format != "B" or piece.ndim != 1 else piece, dtype=np.uint8)


def _in_frame_order(pieces: Sequence[memoryview]) -> tuple[int, list[np.ndarray], list[int]]:
    """Total length, and every part of the frame (buffers, stream, table) as bytes with its offset."""
    total, offsets = frame_layout(pieces)
    parts = [*(_bytes_of(piece) for piece in pieces[1:]), _bytes_of(pieces[0])]
    parts.append(np.frombuffer(frame_table(pieces), dtype=np.uint8))
    return total, parts, [*offsets[1:], offsets[0], offsets[0] + pieces[0].nbytes]


def pack_frame(pieces: Sequence[memoryview], into: np.ndarray | None = None) -> np.ndarray:
    """Concatenate a codec's pieces into one uint8 array (senders stream them instead: see
    :class:`Outgoing`)."""
    total, parts, starts = _in_frame_order(pieces)
    out = np.empty(total, dtype=np.uint8) if into is None else into[:total]
    position = 0
    for part, start in zip(parts, starts, strict=True):
        out[position:start] = 0  # alignment padding
        out[start : start + part.size] = part
        position = start + part.size
    return out


def unpack_frame(frame: memoryview) -> tuple[memoryview, list[memoryview]]:
    """The pickle stream and the buffers of a frame, as views of it; ``ValueError`` when its table
    does not describe exactly its bytes."""
    size = frame.nbytes
    count, stream_length = _TAIL.unpack_from(frame, size - _TAIL.size) if size >= _TAIL.size else (0, -1)
    table = size - _TAIL.size - _LENGTH.size * count
    if stream_length < 0 or table < 0:
        raise ValueError(f"a frame of {size} bytes is too short for its table")
    position, buffers = 0, []
    for (length,) in _LENGTH.iter_unpack(frame[table : size - _TAIL.size]):
        position = _aligned(position)
        buffers.append(frame[position : position + length])
        position += length
    if position + stream_length != table:
        raise ValueError(f"a frame of {size} bytes whose table describes {position + stream_length + size - table}")
    return frame[position:table], buffers


def chunk_size(buffer_bytes: int) -> int:
    """The chunk a sender uses with a staging budget of ``buffer_bytes`` (two chunks in flight)."""
    return max(ALIGN, buffer_bytes // 2 // ALIGN * ALIGN)


def chunks_of(frame: np.ndarray, chunk: int) -> Chunks:
    """``frame`` cut into the chunks its sender sends (views: receiving into them fills the frame)."""
    for start in range(0, frame.size, chunk):
        yield frame[start : start + chunk]


class Outgoing:
    """One rank's frame, as the chunks a sender sends, never built whole (see the module docstring)."""

    __slots__ = ("_ends", "_parts", "_staging", "_starts", "chunk", "nbytes")

    def __init__(self, pieces: Sequence[memoryview], chunk: int) -> None:
        self.nbytes, self._parts, self._starts = _in_frame_order(pieces)
        self._ends = [start + array.size for start, array in zip(self._starts, self._parts, strict=True)]
        self.chunk = chunk
        self._staging: list[np.ndarray] = []

    def build(self) -> np.ndarray:
        """The whole frame in one new array (for frames small enough to travel inline)."""
        out = np.empty(self.nbytes, dtype=np.uint8)
        self._fill(out, 0)
        return out

    def chunks(self) -> Chunks:
        """The frame's chunks in order. A staged chunk reuses the buffer of the staged chunk two
        before it: the generator is sent the transfers each chunk went out in (as :func:`stream`
        does) and finishes those of a buffer before it fills it again."""
        sending: list[Pending | None] = [None, None]  # what each staging buffer is being sent in
        staged_count = 0
        for start in range(0, self.nbytes, self.chunk):
            stop = min(start + self.chunk, self.nbytes)
            part = bisect.bisect_right(self._starts, start) - 1
            array = self._parts[part]
            if stop <= self._ends[part] and array.flags.writeable:  # inside one piece: send it in place
                offset = start - self._starts[part]
                yield array[offset : offset + stop - start]
                continue
            slot = staged_count % 2
            staged_count += 1
            earlier = sending[slot]
            if earlier is not None:
                earlier()
            if len(self._staging) <= slot:
                self._staging.append(np.empty(0, dtype=np.uint8))
            if self._staging[slot].size < stop - start:  # as large as needed: the last chunk is often small
                self._staging[slot] = np.empty(stop - start, dtype=np.uint8)
            staged = self._staging[slot][: stop - start]
            self._fill(staged, start)
            sending[slot] = yield staged

    def _fill(self, out: np.ndarray, start: int) -> None:
        """Copy the frame's bytes ``start .. start + out.size`` into ``out`` (padding as zeros)."""
        stop = start + out.size
        part = bisect.bisect_right(self._starts, start) - 1
        position = start
        while position < stop:
            begin, end = self._starts[part], self._ends[part]
            if position >= end:
                part += 1
                continue
            if position < begin:  # alignment padding before this piece
                count = min(stop, begin) - position
                out[position - start : position - start + count] = 0
            else:
                count = min(stop, end) - position
                source = self._parts[part][position - begin : position - begin + count]
                out[position - start : position - start + count] = source
            position += count


def stream(
    channel: Poster,
    sends: Sequence[tuple[Sequence[int], Chunks]],
    recvs: Sequence[tuple[int, Chunks]],
) -> None:
    """Send and receive streams of chunks, and wait until all are done.

    ``sends``: (peers, chunks): each chunk goes to every peer; ``recvs``: (peer, chunks) to fill.
    Every receive is posted at once (they fill their frames in place, so the senders never wait
    on this rank's pace); so is every send of a chunk sent in place. A staged chunk waits, inside
    :meth:`Outgoing.chunks`, for the transfers of the chunk that used its buffer before.
    """
    if not sends and not recvs:
        return
    into = [(peer, chunk) for peer, chunks in recvs for chunk in chunks]
    posted = [_once(channel.post([], into))] if into else []
    for peers, chunks in sends:
        posted += post_stream(channel, peers, chunks)
    for done in posted:
        done()


def post_stream(channel: Poster, peers: Sequence[int], chunks: Chunks) -> list[Pending]:
    """Send every chunk of one stream to ``peers``, without waiting for them (a staged chunk still
    waits, inside :meth:`Outgoing.chunks`, for its buffer); what finishes each chunk's sends."""
    posted = []
    chunk = next(chunks, None)
    while chunk is not None:
        done = _once(channel.post([(peer, chunk) for peer in peers], []))
        posted.append(done)
        chunk = _following(chunks, done)
    return posted


def _following(chunks: Chunks, done: Pending) -> np.ndarray | None:
    try:
        return chunks.send(done)
    except StopIteration:
        return None


def _once(pending: Pending) -> Pending:
    """``pending`` that waits the first time it is called and returns at once after."""
    waited = False

    def wait() -> None:
        nonlocal waited
        if not waited:
            waited = True
            pending()

    return wait
