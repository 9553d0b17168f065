"""Frames on the wire: streamed in chunks from the codec's pieces, received into exact-size buffers.

A sender never builds its whole frame. :class:`Outgoing` lays the frame out (table, pickle stream,
aligned out-of-band buffers) and hands it out chunk by chunk: a chunk that lies inside one buffer
is sent straight from the object's own memory (a large tensor or array is never copied); a chunk
that spans several pieces is copied into one of two staging buffers of ``chunk`` bytes. So a rank
needs at most ``2 * chunk`` bytes on top of its own objects to send, whatever their size.

A receiver knows the frame's length and the sender's chunk size from the sender's record; it
allocates the frame once, at its exact size, and receives every chunk into its place. Decoding
then makes views of that buffer: nothing is copied again.

:func:`stream` drives the transfers of one step: every send and receive stream advances one chunk
per round, and at most two rounds are in flight, which is what lets a staging buffer be reused.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np

from communicator.serialization import ALIGN, frame_layout, frame_table

__all__ = ["Moves", "Outgoing", "Pending", "Poster", "chunk_size", "chunks_of", "stream"]

Pending = Callable[[], None]
Moves = Sequence[tuple[int, np.ndarray]]


class Poster(Protocol):
    """What streaming needs of a channel: start sends and receives now, finish them later."""

    def post(self, sends: Moves, recvs: Moves) -> Pending:
        """Start sending ``array`` to ``peer`` for each ``(peer, array)`` of ``sends`` and receiving
        into those of ``recvs`` (messages between two ranks arrive in the order they were posted);
        the returned function waits for all of them."""
        ...

    def settle(self) -> None:
        """Let go of finished transfers (whatever still refers to their buffers)."""
        ...


def chunk_size(buffer_bytes: int) -> int:
    """The chunk a sender uses with a staging budget of ``buffer_bytes`` (two chunks in flight)."""
    return max(ALIGN, buffer_bytes // 2 // ALIGN * ALIGN)


def chunks_of(frame: np.ndarray, chunk: int) -> Iterator[np.ndarray]:
    """``frame`` cut into the chunks its sender sends (views: receiving into them fills the frame)."""
    for start in range(0, frame.size, chunk):
        yield frame[start : start + chunk]


class Outgoing:
    """One rank's frame, as the chunks a sender sends, never built whole (see the module docstring)."""

    __slots__ = ("_ends", "_parts", "_staging", "_starts", "chunk", "nbytes")

    def __init__(self, pieces: Sequence[memoryview], chunk: int) -> None:
        total, offsets = frame_layout(pieces)
        arrays = [np.frombuffer(frame_table(pieces), dtype=np.uint8)]
        arrays += [np.frombuffer(piece.cast("B") if piece.format != "B" else piece, dtype=np.uint8) for piece in pieces]
        self._parts = arrays
        self._starts = [0, *offsets]
        self._ends = [start + array.size for start, array in zip(self._starts, arrays, strict=True)]
        self.nbytes, self.chunk = total, chunk
        self._staging: list[np.ndarray] = []

    def build(self) -> np.ndarray:
        """The whole frame in one new array (for frames small enough to travel inline)."""
        out = np.empty(self.nbytes, dtype=np.uint8)
        self._fill(out, 0)
        return out

    def chunks(self) -> Iterator[np.ndarray]:
        """The frame's chunks in order. A staged chunk reuses the buffer of the chunk two before it:
        take the next chunk only once that one has been sent (as :func:`stream` does)."""
        for index, start in enumerate(range(0, self.nbytes, self.chunk)):
            stop = min(start + self.chunk, self.nbytes)
            part = bisect.bisect_right(self._starts, start) - 1
            array = self._parts[part]
            if stop <= self._ends[part] and array.flags.writeable:  # inside one piece: send it in place
                offset = start - self._starts[part]
                yield array[offset : offset + stop - start]
                continue
            if len(self._staging) <= index % 2:
                self._staging.append(np.empty(min(self.chunk, self.nbytes), dtype=np.uint8))
            staged = self._staging[index % 2][: stop - start]
            self._fill(staged, start)
            yield staged

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
    sends: Sequence[tuple[Sequence[int], Iterator[np.ndarray]]],
    recvs: Sequence[tuple[int, Iterator[np.ndarray]]],
) -> None:
    """Advance every stream one chunk per round, two rounds in flight, until all are done.

    ``sends``: (peers, chunks): each chunk goes to every peer; ``recvs``: (peer, chunks) to fill.
    """
    pending: collections.deque[Pending] = collections.deque()
    while True:
        out = [(peer, chunk) for peers, chunks in sends if (chunk := next(chunks, None)) is not None for peer in peers]
        into = [(peer, chunk) for peer, chunks in recvs if (chunk := next(chunks, None)) is not None]
        if not out and not into:
            break
        pending.append(channel.post(out, into))
        if len(pending) == 2:
            pending.popleft()()
    while pending:
        pending.popleft()()
    channel.settle()  # received frames must not outlive their objects
