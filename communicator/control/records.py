"""What the control plane reads from the store is checked before it is believed.

The store is shared: any process that reaches its port can write any key. So a value read back
is parsed defensively (one JSON object on one line, at most :data:`MAX_RECORD_BYTES`), and with a
shared secret (:data:`TOKEN_VARIABLE`, the same on every rank) every record the ranks write
carries an HMAC-SHA256 over the key it is written to and its text: a record that is not signed
with the secret is ignored, as is one signed for another key (copied from elsewhere). What is
ignored is counted and named in a warning on the ``communicator`` logger, once at first and then
at most every :data:`WARN_SECONDS`, in each process that reads it (from the store or through its
host's relay).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
from typing import Any

__all__ = ["MARK_KEY", "MAX_RECORD_BYTES", "TOKEN_VARIABLE", "Seal", "Tally", "mark", "parse_record", "parse_status"]

#: The environment variable holding the secret that the store's writers share.
TOKEN_VARIABLE = "COMMUNICATOR_STORE_TOKEN"
#: The longest record the control plane reads (a failure's traceback is cut well below it).
MAX_RECORD_BYTES = 1 << 20
#: The key where ``communicator store`` started with a secret leaves its mark (see :func:`mark`).
MARK_KEY = "communicator/token"
#: How often the count of ignored records is warned of, at most.
WARN_SECONDS = 60.0
_DIGEST = 64  # hex digits of an HMAC-SHA256

logger = logging.getLogger("communicator")


class Tally:
    """Values of the store that were ignored, by why: warned of once at first, then at most every
    :data:`WARN_SECONDS` with the count so far."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._warned = -WARN_SECONDS
        self._lock = threading.Lock()

    def note(self, why: str) -> None:
        with self._lock:
            self._counts[why] = self._counts.get(why, 0) + 1
            now = time.monotonic()
            if now - self._warned < WARN_SECONDS:
                return
            self._warned = now
            counts = "; ".join(f"{count} {what}" for what, count in sorted(self._counts.items()))
        logger.warning("communicator: ignored records of the rendezvous store (so far: %s)", counts)

    @property
    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def mark(token: str) -> str:
    """What a store started with secret ``token`` holds under :data:`MARK_KEY`, so that a rank
    with another secret, or none, is told at its start instead of having its records ignored."""
    return hmac.new(token.encode(), b"communicator store", hashlib.sha256).hexdigest()


def parse_record(text: str) -> dict[str, Any] | None:
    """One record as JSON: an object with a string ``kind``, on one line; ``None`` otherwise."""
    if len(text) > MAX_RECORD_BYTES or "\n" in text or "\r" in text:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
        return None
    return record


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) < 1e12


_ENTRY = {"group": str, "op": str, "site": str, "last": str, "sizes": str, "p2p": bool}


def _entry(entry: object) -> bool:
    """Whether one communicator's part of a status has the fields a judge reads, of their types."""
    if not isinstance(entry, dict) or not isinstance(entry.get("op"), str) or not isinstance(entry.get("group"), str):
        return False
    if not (isinstance(entry.get("seq"), int) and not isinstance(entry.get("seq"), bool)):
        return False
    if any(name in entry and not isinstance(entry[name], kind) for name, kind in _ENTRY.items()):
        return False
    if "dtypes" in entry and not (
        isinstance(entry["dtypes"], list) and all(isinstance(d, str) for d in entry["dtypes"])
    ):
        return False
    if entry["op"] or "last" in entry:  # described with where and since when
        return isinstance(entry.get("site"), str) and _number(entry.get("seconds"))
    return "seconds" not in entry or _number(entry["seconds"])


def parse_status(text: str) -> dict[str, Any] | None:
    """A process's status (see :mod:`communicator.control.stalls`): ``at`` (wall time) and
    ``comms`` (name -> what that communicator does), each of the fields a judge reads of its
    type; ``None`` otherwise."""
    if len(text) > MAX_RECORD_BYTES:
        return None
    try:
        status = json.loads(text)
    except ValueError:
        return None
    if not isinstance(status, dict) or not _number(status.get("at")):
        return None
    comms = status.get("comms")
    if not isinstance(comms, dict) or not all(_entry(entry) for entry in comms.values()):
        return None
    return status


class Seal:
    """Signs what this process writes and checks what it reads, under the secret of
    :data:`TOKEN_VARIABLE` (without one, values pass as they are). ``scope`` names the world, so
    that a record signed for one world's key does not pass in another's."""

    def __init__(self, token: str | None = None, scope: str = "", tally: Tally | None = None) -> None:
        if token is None:
            token = os.environ.get(TOKEN_VARIABLE) or None
        self._key = token.encode() if token else None
        self.scope = scope
        self.tally = tally if tally is not None else Tally()

    @property
    def signing(self) -> bool:
        return self._key is not None

    def _mac(self, key: str, text: str) -> str:
        assert self._key is not None
        message = f"{self.scope}\n{key}\n{text}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def seal(self, key: str, text: str) -> str:
        """``text`` as written to ``key``: signed when there is a secret."""
        return text if self._key is None else f"{self._mac(key, text)} {text}"

    def open(self, key: str, value: bytes) -> str | None:
        """The text of a value read from ``key``; ``None`` (counted) when it is not text, or not
        signed with the secret for that key."""
        text, why = self._opened(key, value)
        if text is None:
            self.tally.note(why)
        return text

    def record(self, key: str, value: bytes) -> dict[str, Any] | None:
        """The record a value of ``key`` holds; ``None`` (counted) when it is not a signed record."""
        found = self.checked(key, value)
        if isinstance(found, str):
            self.tally.note(found)
            return None
        return found

    def checked(self, key: str, value: bytes) -> dict[str, Any] | str:
        """The record a value of ``key`` holds, or why it is ignored (not counted here: the
        event log counts it in each process that takes it, see :mod:`communicator.control.log`)."""
        text, why = self._opened(key, value)
        if text is None:
            return why
        record = parse_record(text)
        return "not one JSON record on one line" if record is None else record

    def _opened(self, key: str, value: bytes) -> tuple[str | None, str]:
        """The text of a value read from ``key``, or ``None`` and why."""
        try:
            text = value.decode()
        except UnicodeDecodeError:
            return None, "not text"
        if self._key is None:
            return text, ""
        mac, _, body = text.partition(" ")
        if len(mac) != _DIGEST or not hmac.compare_digest(mac, self._mac(key, body)):
            return None, f"not signed with {TOKEN_VARIABLE}"
        return body, ""
