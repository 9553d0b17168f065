"""Fixed-size records: the first message of every object collective.

A record carries a frame inline when it fits (so small objects need one collective, not two), or
the frame's length when it does not, or a failure (so a rank that cannot serialise releases every
peer at once instead of leaving them waiting).
"""

from __future__ import annotations

import json
import struct
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np

from communicator.errors import RemoteError, RemoteFailure

__all__ = ["RECORD_BYTES", "Record", "check_records", "failure_record", "forwarded_record", "frame_record"]

RECORD_BYTES = 2048
_HEAD = struct.Struct("<BxxxxxxxQ")  # kind, length
INLINE_BYTES = RECORD_BYTES - _HEAD.size

EMPTY, INLINE, LARGE, FAILED = 0, 1, 2, 3


class Record:
    """A parsed record: what one rank announced."""

    __slots__ = ("kind", "length", "raw")

    def __init__(self, raw: np.ndarray) -> None:
        self.kind, self.length = _HEAD.unpack_from(raw.data, 0)
        self.raw = raw

    @property
    def inline(self) -> memoryview:
        return self.raw.data[_HEAD.size : _HEAD.size + self.length]

    @property
    def is_large(self) -> bool:
        return bool(self.kind == LARGE)

    def failure(self, rank: int) -> RemoteFailure | None:
        if self.kind != FAILED:
            return None
        info = json.loads(bytes(self.inline).decode("utf-8", "replace"))
        # A forwarded failure names the rank it came from; a rank's own record is named by position.
        origin = int(info.get("rank", rank))
        return RemoteFailure(origin, info["type"], info["message"], info.get("traceback", ""), info.get("where", ""))


def empty_record() -> np.ndarray:
    out = np.zeros(RECORD_BYTES, dtype=np.uint8)
    _HEAD.pack_into(out.data, 0, EMPTY, 0)
    return out


def frame_record(frame: np.ndarray) -> np.ndarray:
    """A record announcing ``frame``, inline when it fits."""
    out = np.empty(RECORD_BYTES, dtype=np.uint8)
    if frame.nbytes <= INLINE_BYTES:
        _HEAD.pack_into(out.data, 0, INLINE, frame.nbytes)
        out[_HEAD.size : _HEAD.size + frame.nbytes] = frame
    else:
        _HEAD.pack_into(out.data, 0, LARGE, frame.nbytes)
    return out


def failure_record(error: BaseException, where: str) -> np.ndarray:
    """A record announcing that this rank failed with ``error`` (message and traceback trimmed to fit)."""
    return _failure(type(error).__name__, str(error), where, "".join(traceback.format_exception(error)), {})


def forwarded_record(failure: RemoteFailure) -> np.ndarray:
    """A record passing on another rank's failure, naming that rank."""
    return _failure(failure.error_type, failure.message, failure.where, failure.traceback, {"rank": failure.rank})


def _failure(kind: str, message: str, where: str, trace: str, extra: dict[str, int]) -> np.ndarray:
    data = b""
    for keep in (INLINE_BYTES, 1200, 600, 200, 0):
        info = {
            "type": kind,
            "message": message[: max(keep, 300)],
            "where": where,
            "traceback": trace[-keep:] if keep else "",
        }
        data = json.dumps(info | extra).encode()
        if len(data) <= INLINE_BYTES:
            break
    out = np.zeros(RECORD_BYTES, dtype=np.uint8)
    _HEAD.pack_into(out.data, 0, FAILED, len(data))
    out[_HEAD.size : _HEAD.size + len(data)] = np.frombuffer(data, dtype=np.uint8)
    return out


def check_records(
    rows: Sequence[np.ndarray] | np.ndarray,
    ranks: Sequence[int],
    own_rank: int,
    own_error: BaseException | None,
    where: str,
) -> list[Record]:
    """Parse records; raise this rank's own error, or a ``RemoteError`` naming every failed rank."""
    records = [Record(row) for row in rows]
    if own_error is not None:
        raise own_error
    failures = [f for r, rec in zip(ranks, records, strict=True) if (f := rec.failure(r)) is not None]
    if failures:
        raise RemoteError(failures, context=where)
    return records


def decode_error_context(error: BaseException, rank: int) -> Any:
    """Attach the sending rank to a decoding error without changing its type."""
    error.add_note(f"while decoding the object sent by rank {rank}")
    return error
